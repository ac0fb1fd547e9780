package calc

import (
	"cmp"
	"hash/fnv"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/store"
)

// ServiceID is a service's identity for the NAT tables: a 64-bit FNV-1a hash of its namespace,
// name and uid. It is the same for the life of the service (a re-created service has a new
// uid) and after any restart, with no state kept, and at 64 bits two services do not collide
// in practice.
func ServiceID(s *store.Service) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s.Namespace + "/" + s.Name + "/" + s.UID))
	return h.Sum64()
}

// endpointSets holds a service port's endpoints, split as kube-proxy splits them: the set for
// cluster-wide traffic and the set for node-local traffic, each with the terminating fallback.
type endpointSets struct {
	cluster, local []Backend
	// present is every endpoint the slices still list, whatever its conditions: flows to
	// it are kept (a terminating endpoint drains), flows to anything else are stale.
	present []netip.AddrPort
}

// backendsFor picks the endpoints of one service port across all the service's slices.
func (g *Graph) backendsFor(svcID string, sp store.ServicePortSpec) endpointSets {
	ids := g.slicesByService.all(svcID)
	type cand struct {
		b     Backend
		ready bool
		// usable only as a fallback: serving and terminating
		fallback bool
	}
	var all []cand
	var present []netip.AddrPort
	seen := map[netip.AddrPort]int{}
	for id := range ids {
		es := g.slices[id]
		var port uint16
		for _, p := range es.Ports {
			if p.Name == sp.Name && p.Protocol == sp.Protocol {
				port = p.Port
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range es.Endpoints {
			for _, a := range ep.Addresses {
				present = append(present, netip.AddrPortFrom(a, port))
			}
			if !ep.Ready && !(ep.Serving && ep.Terminating) {
				continue
			}
			for _, a := range ep.Addresses {
				ap := netip.AddrPortFrom(a, port)
				c := cand{b: Backend{Addr: a, Port: port, Node: ep.NodeName, NodeAddr: g.nodeAddr(ep.NodeName, a), Terminating: !ep.Ready},
					ready: ep.Ready, fallback: !ep.Ready}
				if i, dup := seen[ap]; dup {
					if c.ready && !all[i].ready {
						all[i] = c // the same endpoint in two slices: a ready copy wins
					}
					continue
				}
				seen[ap] = len(all)
				all = append(all, c)
			}
		}
	}
	pick := func(local bool) []Backend {
		var ready, fallback []Backend
		for _, c := range all {
			if local && !g.isLocal(c.b.Node) {
				continue
			}
			if c.ready {
				ready = append(ready, c.b)
			} else {
				fallback = append(fallback, c.b)
			}
		}
		out := ready
		if len(out) == 0 {
			out = fallback
		}
		slices.SortFunc(out, func(a, b Backend) int {
			if c := a.Addr.Compare(b.Addr); c != 0 {
				return c
			}
			return cmp.Compare(a.Port, b.Port)
		})
		return out
	}
	slices.SortFunc(present, netip.AddrPort.Compare)
	return endpointSets{cluster: pick(false), local: pick(true), present: slices.Compact(present)}
}

// nodeAddr is node's underlay address in the family of a backend address a; invalid when the
// node is unknown or has none.
func (g *Graph) nodeAddr(node string, a netip.Addr) netip.Addr {
	n := g.nodes[node]
	if n == nil {
		return netip.Addr{}
	}
	return underlay(n, a).Addr()
}

// ordered returns the backends of one family as a Frontend holds them (see Frontend): the
// local set, then the rest of the cluster set, the local count and where the cluster set starts.
// With localPolicy false the local set is just the local part of the cluster set.
func (e endpointSets) ordered(is4, localPolicy bool) (out []Backend, nLocal, clusterStart int) {
	inCluster := map[netip.AddrPort]bool{}
	for _, b := range e.cluster {
		inCluster[netip.AddrPortFrom(b.Addr, b.Port)] = true
	}
	var localOnly, localShared, remote []Backend
	isLocal := map[netip.AddrPort]bool{}
	if localPolicy {
		for _, b := range e.local {
			if b.Addr.Is4() != is4 {
				continue
			}
			ap := netip.AddrPortFrom(b.Addr, b.Port)
			isLocal[ap] = true
			if inCluster[ap] {
				localShared = append(localShared, b)
			} else {
				localOnly = append(localOnly, b)
			}
		}
	} else {
		for _, b := range e.local {
			if ap := netip.AddrPortFrom(b.Addr, b.Port); b.Addr.Is4() == is4 && inCluster[ap] {
				isLocal[ap] = true
				localShared = append(localShared, b)
			}
		}
	}
	for _, b := range e.cluster {
		if b.Addr.Is4() == is4 && !isLocal[netip.AddrPortFrom(b.Addr, b.Port)] {
			remote = append(remote, b)
		}
	}
	out = append(append(append(out, localOnly...), localShared...), remote...)
	return out, len(localOnly) + len(localShared), len(localOnly)
}

// kindRank orders frontends of one service that share a key: a load-balancer address keeps
// its source ranges over the same address listed as an external IP.
var kindRank = map[FrontendKind]int{FrontendLoadBalancer: 0, FrontendExternalIP: 1, FrontendNodePort: 2, FrontendClusterIP: 3}

// computeService returns the frontends and health check a service wants on this node.
func (g *Graph) computeService(id string) ([]Frontend, *HealthCheck) {
	s := g.services[id]
	if s == nil {
		return nil, nil
	}
	sid := ServiceID(s)
	extLocal := s.ExternalTrafficPolicy == store.PolicyLocal
	var nodeAddrs []netip.Addr
	if self := g.nodes[g.cfg.NodeName]; self != nil && s.Type != store.ServiceClusterIP {
		for _, p := range []netip.Prefix{self.IPv4Address, self.IPv6Address()} {
			if p.IsValid() {
				nodeAddrs = append(nodeAddrs, p.Addr())
			}
		}
	}
	var out []Frontend
	// Local ready endpoints, by address, for the health check; only the families the
	// load balancer reaches this node on count, so the check agrees with what it forwards.
	localReady := map[netip.Addr]bool{}
	byFamily := map[netip.Addr]bool{} // every local ready endpoint, for the per-family counts
	lbFamilies := map[bool]bool{}
	for _, a := range s.LoadBalancerIPs {
		lbFamilies[a.Is4()] = true
	}
	for _, sp := range s.Ports {
		sets := g.backendsFor(id, sp)
		// The port's frontends of one family and policy share one ordered list, and those of
		// one family one present list (read-only, as every Frontend's slices are): the
		// service stage then knows them for the same endpoints without comparing them, and
		// a cluster holds one copy of each list, not one per frontend.
		type ordering struct {
			backends            []Backend
			local, clusterStart int
			done                bool
		}
		var orders [2][2]ordering // by family (IPv4 first), then by local policy
		var presents [2][]netip.AddrPort
		var presentDone [2]bool
		fam := func(is4 bool) int {
			if is4 {
				return 0
			}
			return 1
		}
		for _, b := range sets.local {
			if !b.Terminating {
				byFamily[b.Addr] = true
			}
			if !b.Terminating && (len(lbFamilies) == 0 || lbFamilies[b.Addr.Is4()]) {
				localReady[b.Addr] = true
			}
		}
		add := func(a netip.Addr, kind FrontendKind, port uint16) {
			f := Frontend{Key: FrontendKey{Addr: a, Port: port, Protocol: sp.Protocol}, Kind: kind, Service: id, ServiceID: sid,
				PortName: sp.Name, AffinityTimeout: s.AffinityTimeout}
			switch kind {
			case FrontendClusterIP:
				f.InternalLocal = s.InternalTrafficPolicy == store.PolicyLocal
			case FrontendLoadBalancer:
				f.ExternalLocal = extLocal
				f.SourceRanges = s.LoadBalancerSourceRanges
			default:
				f.ExternalLocal = extLocal
			}
			localPolicy := 0
			if f.ExternalLocal || f.InternalLocal {
				localPolicy = 1
			}
			o := &orders[fam(a.Is4())][localPolicy]
			if !o.done {
				o.backends, o.local, o.clusterStart = sets.ordered(a.Is4(), localPolicy == 1)
				o.done = true
			}
			f.Backends, f.LocalBackends, f.ClusterStart = o.backends, o.local, o.clusterStart
			if i := fam(a.Is4()); !presentDone[i] {
				for _, ap := range sets.present {
					if ap.Addr().Is4() == a.Is4() {
						presents[i] = append(presents[i], ap)
					}
				}
				presentDone[i] = true
			}
			f.Present = presents[fam(a.Is4())]
			out = append(out, f)
		}
		for _, a := range s.ClusterIPs {
			add(a, FrontendClusterIP, sp.Port)
		}
		for _, a := range s.ExternalIPs {
			add(a, FrontendExternalIP, sp.Port)
		}
		for _, a := range s.LoadBalancerIPs {
			add(a, FrontendLoadBalancer, sp.Port)
		}
		if sp.NodePort != 0 && s.Type != store.ServiceClusterIP {
			families := map[bool]bool{}
			for _, a := range nodeAddrs {
				add(a, FrontendNodePort, sp.NodePort)
				families[a.Is4()] = true
			}
			if families[true] || len(nodeAddrs) == 0 {
				add(netip.IPv4Unspecified(), FrontendNodePort, sp.NodePort)
			}
			if families[false] {
				add(netip.IPv6Unspecified(), FrontendNodePort, sp.NodePort)
			}
		}
	}
	// One frontend per key within a service: the load-balancer kind wins over the same
	// address listed as an external IP, so its source ranges are never bypassed.
	slices.SortStableFunc(out, func(a, b Frontend) int {
		return cmp.Or(cmpFrontendKey(a.Key, b.Key), cmp.Compare(kindRank[a.Kind], kindRank[b.Kind]))
	})
	out = slices.CompactFunc(out, func(a, b Frontend) bool { return a.Key == b.Key })
	var hc *HealthCheck
	if s.Type == store.ServiceLoadBalancer && extLocal && s.HealthCheckNodePort != 0 {
		hc = &HealthCheck{Port: s.HealthCheckNodePort, Service: id, LocalEndpoints: len(localReady)}
		for a := range byFamily {
			if a.Is4() {
				hc.LocalIPv4++
			} else {
				hc.LocalIPv6++
			}
		}
	}
	return out, hc
}

// frontendEqual compares every field; Backends (NodeAddr included) with slices.Equal, so a
// Backend field must stay comparable.
func frontendEqual(a, b Frontend) bool {
	return a.Key == b.Key && a.Kind == b.Kind && a.Service == b.Service && a.ServiceID == b.ServiceID && a.PortName == b.PortName &&
		a.ExternalLocal == b.ExternalLocal && a.InternalLocal == b.InternalLocal && a.AffinityTimeout == b.AffinityTimeout &&
		slices.Equal(a.SourceRanges, b.SourceRanges) && slices.Equal(a.Backends, b.Backends) && a.LocalBackends == b.LocalBackends && a.ClusterStart == b.ClusterStart && slices.Equal(a.Present, b.Present)
}

// recomputeServices recomputes dirty services; where two services claim one frontend or
// health-check port, the one whose "namespace/name" sorts first wins and the clash is reported.
func (g *Graph) recomputeServices() {
	dirtyKeys := set[FrontendKey]{}
	dirtyHC := set[uint16]{}
	n := len(g.dirtySvc)
	for id := range g.dirtySvc {
		for _, f := range g.svcFronts[id] {
			g.claims.remove(f.Key, id)
			dirtyKeys.add(f.Key)
		}
		delete(g.svcFronts, id)
		if p, ok := g.svcHealth[id]; ok {
			if c := g.hcClaims[p]; c != nil {
				delete(c, id)
				if len(c) == 0 {
					delete(g.hcClaims, p)
				}
			}
			dirtyHC.add(p)
			delete(g.svcHealth, id)
		}
		fes, hc := g.computeService(id)
		for _, f := range fes {
			g.claims.add(f.Key, id)
			dirtyKeys.add(f.Key)
		}
		if len(fes) > 0 {
			sortFrontends(fes)
			g.svcFronts[id] = slices.Clip(fes)
		}
		if hc != nil {
			c := g.hcClaims[hc.Port]
			if c == nil {
				c = map[string]HealthCheck{}
				g.hcClaims[hc.Port] = c
			}
			c[id] = *hc
			g.svcHealth[id] = hc.Port
			dirtyHC.add(hc.Port)
		}
	}
	reset(&g.dirtySvc, n)
	for k := range dirtyKeys {
		f, ok := g.claimed(k)
		if g.claims.count(k) > 1 {
			g.problem("frontend/"+k.String(), "claimed by several services; "+f.Service+" wins")
		} else {
			delete(g.problems, "frontend/"+k.String())
		}
		settle(g.frontends, k, f, ok, frontendEqual, g.emitted, &g.pending.frontendSets, &g.pending.frontendDels)
	}
	for p := range dirtyHC {
		h, ok := winner(g.hcClaims[p])
		settle(g.health, p, h, ok, same[HealthCheck], g.emitted, &g.pending.healthSets, &g.pending.healthDels)
	}
}

// claimed returns the frontend at k of the service whose "namespace/name" sorts first.
func (g *Graph) claimed(k FrontendKey) (Frontend, bool) {
	id, ok := g.claims.first(k)
	if !ok {
		return Frontend{}, false
	}
	fes := g.svcFronts[id]
	i, found := slices.BinarySearchFunc(fes, k, func(f Frontend, k FrontendKey) int { return cmpFrontendKey(f.Key, k) })
	if !found {
		return Frontend{}, false
	}
	return fes[i], true
}

func winner[T any](claims map[string]T) (T, bool) {
	var best string
	var v T
	for id, c := range claims {
		if best == "" || id < best {
			best, v = id, c
		}
	}
	return v, best != ""
}
