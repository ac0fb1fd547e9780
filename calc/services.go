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

// serviceCalc is the services' calculator: from the services and their endpoint slices (its
// own inputs) and the nodes (the graph's, read only: a backend's NodeAddr is its node's
// underlay address, and this node's addresses are its node ports), it computes the frontends
// and health checks this node programs, as deltas into the graph's emitter.
type serviceCalc struct {
	*inputs // the nodes, read only
	*emitter

	// Inputs, by ID, and the indexes from them to the services they touch.
	services        map[string]*store.Service
	slices          map[string]*store.EndpointSlice
	slicesByService multi[string, string]
	// slicesByNode holds the slices naming each node in an endpoint: a node's underlay
	// address is its backends' NodeAddr, so its change recomputes these slices' services.
	slicesByNode multi[string, string]
	dirty        set[string] // services to recompute

	// Desired state as last computed.
	svcFronts map[string][]Frontend      // frontends each service wants, sorted by key
	svcHealth map[string]uint16          // health-check port each service claims
	claims    multi[FrontendKey, string] // services wanting each frontend
	frontends map[FrontendKey]*Frontend  // each points into its service's svcFronts
	hcClaims  map[uint16]map[string]HealthCheck
	health    map[uint16]HealthCheck
	clashes   set[FrontendKey] // frontends claimed by several services, a problem each
}

func newServiceCalc(in *inputs, e *emitter) *serviceCalc {
	return &serviceCalc{inputs: in, emitter: e,
		services: map[string]*store.Service{}, slices: map[string]*store.EndpointSlice{},
		slicesByService: newMulti[string, string](), slicesByNode: newMulti[string, string](), dirty: set[string]{},
		svcFronts: map[string][]Frontend{}, svcHealth: map[string]uint16{}, claims: newMulti[FrontendKey, string](),
		frontends: map[FrontendKey]*Frontend{}, hcClaims: map[uint16]map[string]HealthCheck{}, health: map[uint16]HealthCheck{},
		clashes: set[FrontendKey]{}}
}

func (c *serviceCalc) onService(id string, s *store.Service) {
	if s == nil {
		delete(c.services, id)
	} else {
		c.services[id] = s
	}
	c.dirty.add(id)
}

func (c *serviceCalc) onSlice(id string, e *store.EndpointSlice) {
	if old := c.slices[id]; old != nil {
		c.slicesByService.remove(old.ServiceID(), id)
		for _, ep := range old.Endpoints {
			if ep.NodeName != "" {
				c.slicesByNode.remove(ep.NodeName, id)
			}
		}
		c.dirty.add(old.ServiceID())
	}
	if e == nil {
		delete(c.slices, id)
		return
	}
	c.slices[id] = e
	c.slicesByService.add(e.ServiceID(), id)
	for _, ep := range e.Endpoints {
		if ep.NodeName != "" {
			c.slicesByNode.add(ep.NodeName, id)
		}
	}
	c.dirty.add(e.ServiceID())
}

// onNode hears that node id changed from old to n (nil: absent). Its underlay addresses are
// the NodeAddr of its backends: the services with an endpoint on it (through the slice index,
// not every service) are recomputed when it comes, goes or changes address. This node's
// addresses are its node ports: every service with node ports is recomputed.
func (c *serviceCalc) onNode(id string, old, n *store.Node) {
	if old == nil || n == nil || old.IPv4Address.Addr() != n.IPv4Address.Addr() || old.IPv6Address().Addr() != n.IPv6Address().Addr() {
		for sl := range c.slicesByNode.all(id) {
			c.dirty.add(c.slices[sl].ServiceID())
		}
	}
	if c.isLocal(id) {
		for sid, s := range c.services {
			if s.Type != store.ServiceClusterIP {
				c.dirty.add(sid)
			}
		}
	}
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
// (Without a map or a second sort per call: a service is recomputed at every change of it or
// of its slices, and while thousands of services arrive those allocations were a fifth of
// calc's work; BenchmarkServicesArriving in calc.)
func (c *serviceCalc) backendsFor(svcID string, sp store.ServicePortSpec) endpointSets {
	type cand struct {
		b     Backend
		ready bool
	}
	self := c.cfg.NodeName
	var all []cand
	var present []netip.AddrPort
	for id := range c.slicesByService.all(svcID) {
		es := c.slices[id]
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
		if present == nil {
			present = make([]netip.AddrPort, 0, len(es.Endpoints))
			all = make([]cand, 0, len(es.Endpoints))
		}
		for _, ep := range es.Endpoints {
			usable := ep.Ready || (ep.Serving && ep.Terminating) // not ready: only a fallback
			for _, a := range ep.Addresses {
				present = append(present, netip.AddrPortFrom(a, port))
				if usable {
					all = append(all, cand{b: Backend{Addr: a, Port: port, Node: ep.NodeName, NodeAddr: c.nodeAddr(ep.NodeName, a), Terminating: !ep.Ready},
						ready: ep.Ready})
				}
			}
		}
	}
	// By address and port, and of one endpoint listed twice (in two slices) the first ready
	// copy, else the first: a ready copy wins.
	readyFirst := func(c cand) int {
		if c.ready {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(all, func(x, y cand) int {
		return cmp.Or(cmpBackendAddrPort(x.b, y.b), cmp.Compare(readyFirst(x), readyFirst(y)))
	})
	all = slices.CompactFunc(all, func(x, y cand) bool { return cmpBackendAddrPort(x.b, y.b) == 0 })
	// Each set keeps the sorted order: its ready endpoints, or when it has none its fallback.
	pick := func(local bool) []Backend {
		var nReady, nFallback int
		for _, c := range all {
			if local && c.b.Node != self {
				continue
			}
			if c.ready {
				nReady++
			} else {
				nFallback++
			}
		}
		n, want := nReady, true
		if n == 0 {
			n, want = nFallback, false
		}
		if n == 0 {
			return nil
		}
		out := make([]Backend, 0, n)
		for _, c := range all {
			if c.ready == want && (!local || c.b.Node == self) {
				out = append(out, c.b)
			}
		}
		return out
	}
	slices.SortFunc(present, netip.AddrPort.Compare)
	return endpointSets{cluster: pick(false), local: pick(true), present: slices.Compact(present)}
}

// nodeAddr is node's underlay address in the family of a backend address a; invalid when the
// node is unknown or has none.
func (c *serviceCalc) nodeAddr(node string, a netip.Addr) netip.Addr {
	n := c.nodes[node]
	if n == nil {
		return netip.Addr{}
	}
	return underlay(n, a).Addr()
}

// ordered returns the backends of one family as a Frontend holds them (see Frontend): the
// local set, then the rest of the cluster set, the local count and where the cluster set starts.
// With localPolicy false the local set is just the local part of the cluster set. Both sets
// are sorted by address and port (backendsFor), so membership is a binary search; a cluster
// set of one family with nothing local is returned as it is (a Frontend's slices are
// read-only), which is the common case.
func (e endpointSets) ordered(is4, localPolicy bool) (out []Backend, nLocal, clusterStart int) {
	if len(e.local) == 0 && allOfFamily(e.cluster, is4) {
		return e.cluster, 0, 0
	}
	in := func(set []Backend, b Backend) bool {
		_, found := slices.BinarySearchFunc(set, b, cmpBackendAddrPort)
		return found
	}
	out = make([]Backend, 0, len(e.cluster)+len(e.local))
	var shared []Backend // local endpoints also in the cluster set
	for _, b := range e.local {
		if b.Addr.Is4() != is4 {
			continue
		}
		switch {
		case in(e.cluster, b):
			shared = append(shared, b)
		case localPolicy:
			out = append(out, b) // local only: the local set's terminating fallback
		}
	}
	localOnly := len(out)
	out = append(out, shared...)
	for _, b := range e.cluster {
		if b.Addr.Is4() == is4 && !in(shared, b) {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		out = nil
	}
	return out, localOnly + len(shared), localOnly
}

func cmpBackendAddrPort(a, b Backend) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	return cmp.Compare(a.Port, b.Port)
}

func allOfFamily(bs []Backend, is4 bool) bool {
	for _, b := range bs {
		if b.Addr.Is4() != is4 {
			return false
		}
	}
	return true
}

// kindRank orders frontends of one service that share a key: a load-balancer address keeps
// its source ranges over the same address listed as an external IP.
func kindRank(k FrontendKind) int {
	switch k {
	case FrontendLoadBalancer:
		return 0
	case FrontendExternalIP:
		return 1
	case FrontendNodePort:
		return 2
	}
	return 3
}

// computeService returns the frontends and health check a service wants on this node.
func (c *serviceCalc) computeService(id string) ([]Frontend, *HealthCheck) {
	s := c.services[id]
	if s == nil {
		return nil, nil
	}
	sid := ServiceID(s)
	extLocal := s.ExternalTrafficPolicy == store.PolicyLocal
	var nodeAddrs []netip.Addr
	if self := c.nodes[c.cfg.NodeName]; self != nil && s.Type != store.ServiceClusterIP {
		for _, p := range []netip.Prefix{self.IPv4Address, self.IPv6Address()} {
			if p.IsValid() {
				nodeAddrs = append(nodeAddrs, p.Addr())
			}
		}
	}
	perPort := len(s.ClusterIPs) + len(s.ExternalIPs) + len(s.LoadBalancerIPs)
	if s.Type != store.ServiceClusterIP {
		perPort += len(nodeAddrs) + 2
	}
	out := make([]Frontend, 0, perPort*len(s.Ports))
	var hc *HealthCheck
	if s.Type == store.ServiceLoadBalancer && extLocal && s.HealthCheckNodePort != 0 {
		hc = &HealthCheck{Port: s.HealthCheckNodePort, Service: id}
	}
	// Local ready endpoints, by address, for the health check (made only for a service that
	// has one); only the families the load balancer reaches this node on count, so the check
	// agrees with what it forwards. byFamily is every local ready endpoint, for the
	// per-family counts.
	var localReady, byFamily set[netip.Addr]
	var lbFamilies map[bool]bool
	if hc != nil {
		localReady, byFamily, lbFamilies = set[netip.Addr]{}, set[netip.Addr]{}, map[bool]bool{}
		for _, a := range s.LoadBalancerIPs {
			lbFamilies[a.Is4()] = true
		}
	}
	fam := func(is4 bool) int {
		if is4 {
			return 0
		}
		return 1
	}
	for _, sp := range s.Ports {
		sets := c.backendsFor(id, sp)
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
		if hc != nil {
			for _, b := range sets.local {
				if b.Terminating {
					continue
				}
				byFamily.add(b.Addr)
				if len(lbFamilies) == 0 || lbFamilies[b.Addr.Is4()] {
					localReady.add(b.Addr)
				}
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
				presents[i] = presentOfFamily(sets.present, a.Is4())
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
			has4, has6 := false, false
			for _, a := range nodeAddrs {
				add(a, FrontendNodePort, sp.NodePort)
				has4, has6 = has4 || a.Is4(), has6 || !a.Is4()
			}
			if has4 || len(nodeAddrs) == 0 {
				add(netip.IPv4Unspecified(), FrontendNodePort, sp.NodePort)
			}
			if has6 {
				add(netip.IPv6Unspecified(), FrontendNodePort, sp.NodePort)
			}
		}
	}
	// One frontend per key within a service: the load-balancer kind wins over the same
	// address listed as an external IP, so its source ranges are never bypassed.
	slices.SortStableFunc(out, func(a, b Frontend) int {
		return cmp.Or(cmpFrontendKey(a.Key, b.Key), cmp.Compare(kindRank(a.Kind), kindRank(b.Kind)))
	})
	out = slices.CompactFunc(out, func(a, b Frontend) bool { return a.Key == b.Key })
	if hc != nil {
		hc.LocalEndpoints = len(localReady)
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

// presentOfFamily is the part of present (sorted: IPv4 before IPv6) of one family, without a
// copy.
func presentOfFamily(present []netip.AddrPort, is4 bool) []netip.AddrPort {
	i := 0
	for i < len(present) && present[i].Addr().Is4() {
		i++
	}
	var part []netip.AddrPort
	if is4 {
		part = slices.Clip(present[:i])
	} else {
		part = present[i:]
	}
	if len(part) == 0 {
		return nil
	}
	return part
}

// frontendEqual compares every field; Backends (NodeAddr included) with slices.Equal, so a
// Backend field must stay comparable.
func frontendEqual(a, b Frontend) bool {
	return a.Key == b.Key && a.Kind == b.Kind && a.Service == b.Service && a.ServiceID == b.ServiceID && a.PortName == b.PortName &&
		a.ExternalLocal == b.ExternalLocal && a.InternalLocal == b.InternalLocal && a.AffinityTimeout == b.AffinityTimeout &&
		slices.Equal(a.SourceRanges, b.SourceRanges) && slices.Equal(a.Backends, b.Backends) && a.LocalBackends == b.LocalBackends && a.ClusterStart == b.ClusterStart && slices.Equal(a.Present, b.Present)
}

func frontendPointerEqual(a, b *Frontend) bool { return a == b || frontendEqual(*a, *b) }

// recompute recomputes dirty services; where two services claim one frontend or health-check
// port, the one whose "namespace/name" sorts first wins and the clash is reported.
func (c *serviceCalc) recompute() {
	dirtyKeys := set[FrontendKey]{}
	dirtyHC := set[uint16]{}
	n := len(c.dirty)
	for id := range c.dirty {
		old := c.svcFronts[id]
		for _, f := range old {
			dirtyKeys.add(f.Key)
		}
		delete(c.svcFronts, id)
		if p, ok := c.svcHealth[id]; ok {
			if hcs := c.hcClaims[p]; hcs != nil {
				delete(hcs, id)
				if len(hcs) == 0 {
					delete(c.hcClaims, p)
				}
			}
			dirtyHC.add(p)
			delete(c.svcHealth, id)
		}
		fes, hc := c.computeService(id)
		sortFrontends(fes)
		// A service whose frontends keep their keys (its endpoints changed, the common
		// change) keeps its claims as they are.
		if !slices.EqualFunc(old, fes, func(a, b Frontend) bool { return a.Key == b.Key }) {
			for _, f := range old {
				c.claims.remove(f.Key, id)
			}
			for _, f := range fes {
				c.claims.add(f.Key, id)
			}
		}
		for _, f := range fes {
			dirtyKeys.add(f.Key)
		}
		if len(fes) > 0 {
			c.svcFronts[id] = slices.Clip(fes)
		}
		if hc != nil {
			hcs := c.hcClaims[hc.Port]
			if hcs == nil {
				hcs = map[string]HealthCheck{}
				c.hcClaims[hc.Port] = hcs
			}
			hcs[id] = *hc
			c.svcHealth[id] = hc.Port
			dirtyHC.add(hc.Port)
		}
	}
	reset(&c.dirty, n)
	for k := range dirtyKeys {
		f, ok := c.claimed(k)
		// The problem's key is made only for a clash, said or taken back: made for every
		// dirty frontend it was a tenth of calc's work while services arrive.
		if c.claims.count(k) > 1 {
			c.problem("frontend/"+k.String(), "claimed by several services; "+f.Service+" wins")
			c.clashes.add(k)
		} else if _, had := c.clashes[k]; had {
			delete(c.problems, "frontend/"+k.String())
			delete(c.clashes, k)
		}
		settle(c.frontends, k, f, ok, frontendPointerEqual, c.emitted, &c.pending.frontendSets, &c.pending.frontendDels)
		if ok {
			c.frontends[k] = f // the newest even when equal, so the service's older list is freed
		}
	}
	for p := range dirtyHC {
		h, ok := winner(c.hcClaims[p])
		settle(c.health, p, h, ok, same[HealthCheck], c.emitted, &c.pending.healthSets, &c.pending.healthDels)
	}
}

// claimed returns the frontend at k of the service whose "namespace/name" sorts first: its
// element of that service's svcFronts, which is never changed (a recomputed service gets a
// new list), so the emitted state and the updates share it rather than copy it.
func (c *serviceCalc) claimed(k FrontendKey) (*Frontend, bool) {
	id, ok := c.claims.first(k)
	if !ok {
		return nil, false
	}
	fes := c.svcFronts[id]
	i, found := slices.BinarySearchFunc(fes, k, func(f Frontend, k FrontendKey) int { return cmpFrontendKey(f.Key, k) })
	if !found {
		return nil, false
	}
	return &fes[i], true
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
