package calc

import (
	"fmt"
	"net/netip"

	"github.com/sluice-net/sluice/store"
)

// blockFor returns the most specific known block holding a, or nil.
func (g *Graph) blockFor(a netip.Addr) *store.Block {
	best := -1
	var found *store.Block
	for bits := range g.blockBits {
		if bits <= best || bits > a.BitLen() {
			continue
		}
		p, _ := a.Prefix(bits)
		if b := g.blocks[p]; b != nil {
			best, found = bits, b
		}
	}
	return found
}

// poolFor returns the most specific pool holding p, or nil. Pools are few.
func (g *Graph) poolFor(p netip.Prefix) *store.IPPool {
	var found *store.IPPool
	for _, pool := range g.pools {
		if pool.CIDR.Bits() <= p.Bits() && pool.CIDR.Contains(p.Addr()) {
			if found == nil || pool.CIDR.Bits() > found.CIDR.Bits() || (pool.CIDR.Bits() == found.CIDR.Bits() && pool.Name < found.Name) {
				found = pool
			}
		}
	}
	return found
}

// underlay returns a node's underlay address (with its subnet) for the family of a.
func underlay(n *store.Node, a netip.Addr) netip.Prefix {
	if a.Is4() {
		return n.IPv4Address
	}
	return n.IPv6Address()
}

func tunnelAddr(n *store.Node, a netip.Addr) netip.Addr {
	if a.Is4() {
		return n.IPv4VXLANTunnelAddr
	}
	return n.IPv6VXLANTunnelAddr()
}

// remoteRoute is the route for dst, held by remote node, in pool (nil: no pool, no
// encapsulation): through VXLAN when the pool says so, else directly to the node's underlay
// address over the parent interface.
func (g *Graph) remoteRoute(dst netip.Prefix, node string, pool *store.IPPool, reason RouteReason) (Route, bool) {
	r, why := g.remoteRouteWhy(dst, node, pool, reason)
	return r, why == ""
}

// remoteRouteWhy is remoteRoute, saying why there is no route: the node is unknown, or lacks
// the address or tunnel address the route needs, or the route needs VXLAN and it is off ("":
// there is one; "-": none, and none is due, as for an IPIP pool, reported per pool).
func (g *Graph) remoteRouteWhy(dst netip.Prefix, node string, pool *store.IPPool, reason RouteReason) (Route, string) {
	n := g.nodes[node]
	if n == nil {
		return Route{}, fmt.Sprintf("node %s is not in etcd (no %s%s)", node, store.NodePrefix, node)
	}
	family, addrField, tunnelField := "IPv4", "spec.bgp.ipv4Address or spec.addresses", "spec.ipv4VXLANTunnelAddr"
	if dst.Addr().Is6() {
		family, addrField, tunnelField = "IPv6", "spec.bgp.ipv6Address or spec.addresses", "spec.ipv6VXLANTunnelAddr"
	}
	mode := store.EncapNever
	if pool != nil {
		if pool.IPIPMode != store.EncapNever {
			return Route{}, "-" // unsupported; reported once per pool
		}
		mode = pool.VXLANMode
	}
	them := underlay(n, dst.Addr())
	vxlan := mode == store.EncapAlways
	if mode == store.EncapCrossSubnet {
		var us netip.Prefix
		if self := g.nodes[g.cfg.NodeName]; self != nil {
			us = underlay(self, dst.Addr())
		}
		vxlan = !us.IsValid() || !them.IsValid() || !us.Masked().Contains(them.Addr())
	}
	// (The reasons are built only when there is no route: this runs for every remote block.)
	noAddr := func() string { return fmt.Sprintf("node %s has no %s address (%s)", node, family, addrField) }
	if vxlan {
		t := tunnelAddr(n, dst.Addr())
		switch {
		case !g.cfg.VXLAN:
			return Route{}, fmt.Sprintf("it needs VXLAN (pool %s) and VXLAN is off (option vxlan)", poolName(pool))
		case !t.IsValid():
			return Route{}, fmt.Sprintf("node %s has no %s VXLAN tunnel address (%s)", node, family, tunnelField)
		case !them.IsValid():
			return Route{}, noAddr()
		}
		return Route{Dst: dst, Type: RouteUnicast, Device: g.vxlanDevice(t), Gateway: t, OnLink: true, Reason: reason, Node: node}, ""
	}
	if !them.IsValid() {
		return Route{}, noAddr()
	}
	return Route{Dst: dst, Type: RouteUnicast, Device: ParentDevice, Gateway: them.Addr(), OnLink: true, Reason: reason, Node: node}, ""
}

func poolName(p *store.IPPool) string {
	if p == nil {
		return "none"
	}
	return p.Name
}

// unrouted is the problem key of a destination that gets no route though due, and what it is:
// a workload's address, or a node's block.
func (g *Graph) unrouted(dst netip.Prefix) (key, what string) {
	if id, ok := g.wepsByNet.first(dst); ok && dst.IsSingleIP() {
		return "workload/" + dst.String(), fmt.Sprintf("workload %s (address %s) on node %s", id, dst.Addr(), g.weps[id].Node)
	}
	return "block/" + dst.String(), "block of node " + g.blocks[dst].AffinityNode
}

// whyNoRoute says why a remote workload's address (routes from workloads, or an address
// borrowed from another node's block) or a live remote block affine to another node gets no
// route though it needs one, or "" when no route is due (no such workload or block, a local or
// deleted one, an IPIP pool: that is reported per pool). The decisions are the routes' own.
func (g *Graph) whyNoRoute(dst netip.Prefix) string {
	if dst.IsSingleIP() {
		if _, why := g.workloadRouteWhy(dst); why != "-" && why != "" {
			return why
		}
	}
	if b := g.blocks[dst]; b != nil && g.cfg.RouteSource == SourceCalicoIPAM {
		if _, why := g.blockRouteWhy(b); why != "-" && why != "" {
			return why
		}
	}
	return ""
}

// computeRoute decides the route for one destination from scratch, from current inputs only.
func (g *Graph) computeRoute(dst netip.Prefix) (Route, bool) {
	single := dst.IsSingleIP()
	if single {
		if r, ok := g.workloadRoute(dst); ok {
			return r, true
		}
		if r, ok := g.tunnelRoute(dst); ok {
			return r, true
		}
		if r, ok := g.floatingRoute(dst); ok {
			return r, true
		}
	}
	if b := g.blocks[dst]; b != nil && g.cfg.RouteSource == SourceCalicoIPAM {
		if r, ok := g.blockRoute(b); ok {
			return r, true
		}
	}
	if g.cfg.PoolBlackholes {
		for _, p := range g.pools {
			if p.CIDR == dst {
				return Route{Dst: dst, Type: g.cfg.BlackholeType, Metric: g.cfg.PoolBlackholeMetric, Reason: ReasonPool}, true
			}
		}
	}
	return Route{}, false
}

// workloadRoute: a local workload's address goes to its interface; a remote one gets its own
// route when it is borrowed (or always, when routes come from workloads).
func (g *Graph) workloadRoute(dst netip.Prefix) (Route, bool) {
	r, why := g.workloadRouteWhy(dst)
	return r, why == ""
}

// workloadRouteWhy is workloadRoute, saying why there is none as remoteRouteWhy does ("-":
// none is due).
func (g *Graph) workloadRouteWhy(dst netip.Prefix) (Route, string) {
	first, ok := g.wepsByNet.first(dst)
	if !ok {
		return Route{}, "-"
	}
	for id := range g.wepsByNet.all(dst) {
		if w := g.weps[id]; g.isLocal(w.Node) {
			return Route{Dst: dst, Type: RouteUnicast, Device: w.InterfaceName, Reason: ReasonLocalWorkload}, ""
		}
	}
	w := g.weps[first]
	if g.cfg.RouteSource == SourceWorkloadIPs {
		return g.remoteRouteWhy(dst, w.Node, g.poolFor(dst), ReasonRemoteWorkload)
	}
	if b := g.blockFor(dst.Addr()); b == nil || b.AffinityNode != w.Node {
		return g.remoteRouteWhy(dst, w.Node, g.poolFor(dst), ReasonBorrowed)
	}
	return Route{}, "-" // its block's route covers it
}

// floatingRoute: a floating IP goes where its workload's internal address goes: to the
// workload's interface on its node, through the path to that node (VXLAN or direct, as the
// internal address's pool says) from the others. The workload whose name sorts first wins
// when several claim one floating IP.
func (g *Graph) floatingRoute(dst netip.Prefix) (Route, bool) {
	id, ok := g.fipsByAddr.first(dst.Addr())
	if !ok {
		return Route{}, false
	}
	w := g.weps[id]
	if g.isLocal(w.Node) {
		return Route{Dst: dst, Type: RouteUnicast, Device: w.InterfaceName, Reason: ReasonFloatingIP}, true
	}
	if in, ok := internalOf(w, dst.Addr()); ok {
		return g.remoteRoute(dst, w.Node, g.poolFor(netip.PrefixFrom(in, in.BitLen())), ReasonFloatingIP)
	}
	return Route{}, false
}

// internalOf is the internal address a workload's floating IP ext leads to: its first ipNATs
// entry of that external address.
func internalOf(w *store.WorkloadEndpoint, ext netip.Addr) (netip.Addr, bool) {
	for _, n := range w.IPNATs {
		if n.ExternalIP == ext {
			return n.InternalIP, true
		}
	}
	return netip.Addr{}, false
}

// recomputeFIPs recomputes the dirty floating IPs of this node's workloads.
func (g *Graph) recomputeFIPs() {
	for ext := range g.dirtyFIP {
		var f FloatingIP
		id, ok := g.fipsByAddr.first(ext)
		if ok {
			w := g.weps[id]
			var in netip.Addr
			in, ok = internalOf(w, ext)
			ok = ok && g.isLocal(w.Node)
			f = FloatingIP{External: ext, Internal: in, Workload: id}
		}
		settle(g.fips, ext, f, ok, same[FloatingIP], g.emitted, &g.pending.fipSets, &g.pending.fipDels)
	}
	clear(g.dirtyFIP)
}

// tunnelRoute: a remote node's tunnel address that is not inside its own block needs a
// route of its own through VXLAN.
func (g *Graph) tunnelRoute(dst netip.Prefix) (Route, bool) {
	node, ok := g.tunnelsByAddr.first(dst.Addr())
	if !ok || !g.cfg.VXLAN {
		return Route{}, false
	}
	if g.isLocal(node) {
		return Route{}, false
	}
	if b := g.blockFor(dst.Addr()); b != nil && b.AffinityNode == node && g.cfg.RouteSource == SourceCalicoIPAM {
		return Route{}, false // the block route covers it
	}
	n := g.nodes[node]
	if !underlay(n, dst.Addr()).IsValid() {
		return Route{}, false
	}
	return Route{Dst: dst, Type: RouteUnicast, Device: g.vxlanDevice(dst.Addr()), Gateway: dst.Addr(), OnLink: true, Reason: ReasonRemoteTunnel, Node: node}, true
}

// blockRoute: a local block with a confirmed affinity is blackholed (but not a single-address
// block: its workload's own route is the whole block); a remote block in a pool is routed to
// its node. A disabled pool still routes: in Calico "disabled" only stops new allocations,
// and disabling the old pool is the first step of migrating to a new one, while its
// workloads still carry traffic.
func (g *Graph) blockRoute(b *store.Block) (Route, bool) {
	r, why := g.blockRouteWhy(b)
	return r, why == ""
}

// blockRouteWhy is blockRoute, saying why there is none as remoteRouteWhy does ("-": none is
// due).
func (g *Graph) blockRouteWhy(b *store.Block) (Route, string) {
	if b.AffinityNode == "" || b.Deleted {
		return Route{}, "-"
	}
	if g.isLocal(b.AffinityNode) {
		a := g.affinities[b.AffinityNode+"/"+b.CIDR.String()]
		if a == nil || a.Deleted || a.State != store.AffinityConfirmed || b.CIDR.IsSingleIP() {
			return Route{}, "-"
		}
		return Route{Dst: b.CIDR, Type: g.cfg.BlackholeType, Metric: g.cfg.BlackholeMetric, Reason: ReasonLocalBlock}, ""
	}
	pool := g.poolFor(b.CIDR)
	if pool == nil {
		return Route{}, "it is in no IP pool"
	}
	return g.remoteRouteWhy(b.CIDR, b.AffinityNode, pool, ReasonRemoteBlock)
}

// recomputeRoutes recomputes every dirty destination and records what changed.
func (g *Graph) recomputeRoutes() {
	n := len(g.dirtyDst)
	g.routes = sized(g.routes, n)
	for dst := range g.dirtyDst {
		r, ok := g.computeRoute(dst)
		old, had := g.routes[dst]
		switch {
		case ok && (!had || *old != r):
			p := new(Route) // a copy: taking &r would put every pass's r on the heap
			*p = r
			g.routes[dst] = p
			if g.emitted {
				g.pending.routeSets = append(g.pending.routeSets, p)
			}
		case !ok && had:
			delete(g.routes, dst)
			if g.emitted {
				g.pending.routeDels = append(g.pending.routeDels, old)
			}
		}
		switch {
		case !g.inSync:
			// Before the first in-sync the inputs are partial (etcd's blocks are read before
			// its nodes): a block with no route yet is looked at once, at in-sync. Said and
			// taken back here, such problems were a large part of a cold start's work
			// (BenchmarkColdStartBatches in calc measures it).
			if !ok {
				if g.unsure == nil {
					g.unsure = set[netip.Prefix]{}
				}
				g.unsure.add(dst)
			}
		case !ok:
			g.routeProblem(dst)
		default:
			g.routed(dst)
		}
	}
	reset(&g.dirtyDst, n)
	if g.inSync && g.unsure != nil {
		for dst := range g.unsure {
			if _, ok := g.routes[dst]; !ok {
				g.routeProblem(dst)
			}
		}
		g.unsure = nil
	}
}

// routeProblem says, for a destination that got no route, why it needs one and has none
// (a remote block, a workload's address), or forgets what was said of it: otherwise traffic
// to it only follows the default route.
func (g *Graph) routeProblem(dst netip.Prefix) {
	why := g.whyNoRoute(dst)
	if why == "" {
		g.routed(dst)
		return
	}
	key, what := g.unrouted(dst)
	if old, had := g.routeProblems[dst]; had && old != key {
		delete(g.problems, old)
	}
	g.routeProblems[dst] = key
	g.problem(key, what+" gets no route: "+why)
}

// routed forgets any problem said of dst. (Looked up by destination: building the problem's
// key for every destination recomputed allocated for each one; BenchmarkFullComputation in
// calc counts the allocations.)
func (g *Graph) routed(dst netip.Prefix) {
	if key, had := g.routeProblems[dst]; had {
		delete(g.problems, key)
		delete(g.routeProblems, dst)
	}
}

// vxlanDevice is the device for a route via the tunnel address t: the IPv6 device for IPv6.
func (g *Graph) vxlanDevice(t netip.Addr) string {
	if t.Is6() {
		return g.cfg.VXLANDeviceV6
	}
	return g.cfg.VXLANDevice
}
