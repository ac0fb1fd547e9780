package calc

import (
	"fmt"
	"net/netip"

	"github.com/sluice-net/sluice/store"
)

// routeCalc is the routes' calculator: routes to local workloads, remote blocks, borrowed
// addresses, tunnel addresses and floating IPs, blackholes for local blocks (and pools), and
// the floating IPs of this node's workloads. It computes from pools, nodes, blocks, their
// affinities and workload endpoints (the graph's inputs), through indexes of its own that say
// which destinations an input touches; routes and floating IPs are kept as emitted.
type routeCalc struct {
	*inputs
	*emitter

	// Indexes from an input to what it touches.
	blocksByNode  prefixLists
	wepsByNet     multi[netip.Prefix, string]
	wepsByNode    map[string]set[string]
	tunnelsByAddr multi[netip.Addr, string]
	// singles holds every single address a workload network or a tunnel names, by the /24 (or
	// IPv6 /120) around it: a block finds the addresses inside it with one lookup per 256
	// addresses instead of one per address.
	singles   map[netip.Prefix]set[netip.Addr]
	blockBits map[int]int // prefix lengths of known blocks, with counts, for longest match

	dirtyDst set[netip.Prefix] // destinations to recompute
	// fips knows the workloads naming each floating IP (read only here): a floating IP is
	// routed where its workload is.
	fips *fipCalc

	// routes holds each route as emitted: a route is never changed once made (a new one
	// replaces it), so the dataplane keeps the same pointer rather than a copy.
	routes map[netip.Prefix]*Route
	// routeProblems holds the problem key of each destination that gets no route though due.
	routeProblems map[netip.Prefix]string
	// unsure holds the destinations left without a route before the first in-sync, whose
	// problems (if any) are said at in-sync.
	unsure set[netip.Prefix]
	// recursive holds the learned prefixes whose next hop is off this node's subnet: their
	// routes follow the learned routes that lead to those next hops.
	recursive set[netip.Prefix]
	// routeChanged, when set (BGP on), hears each destination whose route changed: the old
	// route and the new (nil: none).
	routeChanged func(dst netip.Prefix, old, r *Route)
}

func newRouteCalc(in *inputs, e *emitter, fips *fipCalc) *routeCalc {
	return &routeCalc{inputs: in, emitter: e, blocksByNode: prefixLists{}, wepsByNet: newMulti[netip.Prefix, string](),
		wepsByNode: map[string]set[string]{}, tunnelsByAddr: newMulti[netip.Addr, string](), singles: map[netip.Prefix]set[netip.Addr]{},
		blockBits: map[int]int{}, dirtyDst: set[netip.Prefix]{}, fips: fips, routes: map[netip.Prefix]*Route{},
		routeProblems: map[netip.Prefix]string{}}
}

// expect sizes the empty dirty set for a large batch: two destinations an input, as a rule
// (a block and the tunnel address inside it).
func (rc *routeCalc) expect(b batchCount) {
	if len(rc.dirtyDst) == 0 {
		rc.dirtyDst = make(set[netip.Prefix], 2*b.events)
	}
}

func (rc *routeCalc) shrink() { rc.dirtyDst = set[netip.Prefix]{} }

// markBlockContents marks every address of a block whose route may depend on the block:
// workload addresses (borrowed or not) and tunnel addresses.
func (rc *routeCalc) markBlockContents(cidr netip.Prefix) {
	start := cidr.Masked().Addr()
	for i := 0; i < store.BlockSlots(cidr); i += bucketSize {
		for s := range rc.singles[bucketOf(addrPlus(start, uint64(i)))] {
			if cidr.Contains(s) {
				rc.dirtyDst.add(netip.PrefixFrom(s, s.BitLen()))
			}
		}
	}
}

// addrPlus is a+n (n small: within a block), carrying across the address's bytes.
func addrPlus(a netip.Addr, n uint64) netip.Addr {
	b := a.As16()
	for i := 15; i >= 0 && n > 0; i-- {
		sum := uint64(b[i]) + n&0xff
		b[i] = byte(sum)
		n = n>>8 + sum>>8
	}
	out := netip.AddrFrom16(b)
	if a.Is4() {
		return out.Unmap()
	}
	return out
}

// bucketSize is how many addresses one entry of Graph.singles covers.
const bucketSize = 256

// bucketOf is the /24 (IPv4) or /120 (IPv6) around a: its key in Graph.singles.
func bucketOf(a netip.Addr) netip.Prefix {
	p, _ := a.Prefix(a.BitLen() - 8)
	return p
}

// indexSingle notes that a workload network or a tunnel now names the single address a.
func (rc *routeCalc) indexSingle(a netip.Addr) { addTo(rc.singles, bucketOf(a), a) }

// unindexSingle forgets a once neither a workload network nor a tunnel names it.
func (rc *routeCalc) unindexSingle(a netip.Addr) {
	if rc.tunnelsByAddr.count(a) == 0 && rc.wepsByNet.count(netip.PrefixFrom(a, a.BitLen())) == 0 {
		removeFrom(rc.singles, bucketOf(a), a)
	}
}

func (rc *routeCalc) onPool(id string, old, p *store.IPPool) {
	// A pool decides the route of every block inside it, and of borrowed addresses there.
	for _, q := range []*store.IPPool{old, p} {
		if q == nil {
			continue
		}
		rc.dirtyDst.add(q.CIDR)
		for cidr := range rc.blocks {
			if q.CIDR.Overlaps(cidr) {
				rc.dirtyDst.add(cidr)
				rc.markBlockContents(cidr)
			}
		}
		for net := range rc.wepsByNet.one {
			if q.CIDR.Contains(net.Addr()) {
				rc.dirtyDst.add(net)
			}
		}
		rc.markFloatingIPs() // routed by their internal address's pool
	}
	rc.markLearned()
	if p != nil && p.IPIPMode != store.EncapNever {
		rc.problem("pool/"+id, "IPIP encapsulation is not supported: remote blocks in this pool get no route; local blocks are still blackholed")
	} else {
		delete(rc.problems, "pool/"+id)
	}
}

func (rc *routeCalc) onNode(id string, old, n *store.Node) {
	for _, m := range []*store.Node{old, n} {
		if m == nil {
			continue
		}
		for _, a := range []netip.Addr{m.IPv4VXLANTunnelAddr, m.IPv6VXLANTunnelAddr()} {
			if a.IsValid() {
				rc.dirtyDst.add(netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	if old != nil {
		for _, a := range []netip.Addr{old.IPv4VXLANTunnelAddr, old.IPv6VXLANTunnelAddr()} {
			if a.IsValid() {
				rc.tunnelsByAddr.remove(a, id)
				rc.unindexSingle(a)
			}
		}
	}
	if n != nil {
		for _, a := range []netip.Addr{n.IPv4VXLANTunnelAddr, n.IPv6VXLANTunnelAddr()} {
			if a.IsValid() {
				rc.tunnelsByAddr.add(a, id)
				rc.indexSingle(a)
			}
		}
	}
	if rc.isLocal(id) {
		// This node's addresses decide CrossSubnet routes everywhere and its node ports.
		for cidr := range rc.blocks {
			rc.dirtyDst.add(cidr)
		}
		for net := range rc.wepsByNet.one {
			rc.dirtyDst.add(net)
		}
		for a := range rc.tunnelsByAddr.one {
			rc.dirtyDst.add(netip.PrefixFrom(a, a.BitLen()))
		}
		rc.markFloatingIPs()
		rc.markLearned()
		return
	}
	for _, cidr := range rc.blocksByNode[id] {
		rc.dirtyDst.add(cidr)
	}
	for wid := range rc.wepsByNode[id] {
		w := rc.weps[wid]
		for _, net := range w.IPNetworks {
			rc.dirtyDst.add(net)
		}
		for _, n := range w.IPNATs { // routed to the node like the workload's own address
			rc.dirtyDst.add(netip.PrefixFrom(n.ExternalIP, n.ExternalIP.BitLen()))
		}
	}
}

// markFloatingIPs makes every floating IP's route be computed again (there are few).
func (rc *routeCalc) markFloatingIPs() {
	for ext := range rc.fips.byAddr.one {
		rc.dirtyDst.add(netip.PrefixFrom(ext, ext.BitLen()))
	}
}

func (rc *routeCalc) onBlock(cidr netip.Prefix, old, b *store.Block) {
	if old != nil {
		rc.blocksByNode.remove(old.AffinityNode, cidr)
		if rc.blockBits[cidr.Bits()]--; rc.blockBits[cidr.Bits()] == 0 {
			delete(rc.blockBits, cidr.Bits())
		}
	}
	if b != nil {
		rc.blocksByNode.add(b.AffinityNode, cidr)
		rc.blockBits[cidr.Bits()]++
	}
	rc.dirtyDst.add(cidr)
	// Which node a block is affine to decides whether the addresses in it are borrowed.
	if old == nil || b == nil || old.AffinityNode != b.AffinityNode {
		rc.markBlockContents(cidr)
	}
	// A block of this node's keeps learned routes inside it out.
	if len(rc.learned) > 0 && ((old != nil && rc.isLocal(old.AffinityNode)) || (b != nil && rc.isLocal(b.AffinityNode))) {
		rc.markLearned()
	}
}

func (rc *routeCalc) onAffinity(id string, old, a *store.BlockAffinity) {
	for _, x := range []*store.BlockAffinity{old, a} {
		if x != nil {
			rc.dirtyDst.add(x.CIDR)
		}
	}
}

func (rc *routeCalc) onWEP(id string, old, w *store.WorkloadEndpoint) {
	if old != nil {
		for _, net := range old.IPNetworks {
			rc.wepsByNet.remove(net, id)
			rc.dirtyDst.add(net)
			if net.IsSingleIP() {
				rc.unindexSingle(net.Addr())
			}
		}
		for _, n := range old.IPNATs {
			rc.dirtyDst.add(netip.PrefixFrom(n.ExternalIP, n.ExternalIP.BitLen()))
		}
		removeFrom(rc.wepsByNode, old.Node, id)
	}
	if w == nil {
		return
	}
	for _, n := range w.IPNATs {
		rc.dirtyDst.add(netip.PrefixFrom(n.ExternalIP, n.ExternalIP.BitLen()))
	}
	for _, net := range w.IPNetworks {
		rc.wepsByNet.add(net, id)
		rc.dirtyDst.add(net)
		if net.IsSingleIP() {
			rc.indexSingle(net.Addr())
		}
	}
	addTo(rc.wepsByNode, w.Node, id)
}

func (rc *routeCalc) vacant(a netip.Addr) bool {
	pool := rc.poolFor(netip.PrefixFrom(a, a.BitLen()))
	if !rc.inSync || pool == nil || rc.tunnelsByAddr.count(a) > 0 {
		return false
	}
	// A workload's network holding a: its own address, or a wider network of its.
	for bits := a.BitLen(); bits >= pool.CIDR.Bits(); bits-- {
		if p, err := a.Prefix(bits); err == nil && rc.wepsByNet.count(p) > 0 {
			return false
		}
	}
	return true
}

// blockFor returns the most specific known block holding a, or nil.
func (rc *routeCalc) blockFor(a netip.Addr) *store.Block {
	best := -1
	var found *store.Block
	for bits := range rc.blockBits {
		if bits <= best || bits > a.BitLen() {
			continue
		}
		p, _ := a.Prefix(bits)
		if b := rc.blocks[p]; b != nil {
			best, found = bits, b
		}
	}
	return found
}

// poolFor returns the most specific pool holding p, or nil. Pools are few.
func (rc *routeCalc) poolFor(p netip.Prefix) *store.IPPool {
	var found *store.IPPool
	for _, pool := range rc.pools {
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
func (rc *routeCalc) remoteRoute(dst netip.Prefix, node string, pool *store.IPPool, reason RouteReason) (Route, bool) {
	r, why := rc.remoteRouteWhy(dst, node, pool, reason)
	return r, why == ""
}

// remoteRouteWhy is remoteRoute, saying why there is no route: the node is unknown, or lacks
// the address or tunnel address the route needs, or the route needs VXLAN and it is off ("":
// there is one; "-": none, and none is due, as for an IPIP pool, reported per pool).
func (rc *routeCalc) remoteRouteWhy(dst netip.Prefix, node string, pool *store.IPPool, reason RouteReason) (Route, string) {
	n := rc.nodes[node]
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
		if mode == store.EncapNever && rc.speaksBGP() {
			return Route{}, "-" // BGP routes pools without encapsulation, as calico/node does
		}
	}
	them := underlay(n, dst.Addr())
	vxlan := mode == store.EncapAlways
	if mode == store.EncapCrossSubnet {
		var us netip.Prefix
		if self := rc.nodes[rc.cfg.NodeName]; self != nil {
			us = underlay(self, dst.Addr())
		}
		vxlan = !us.IsValid() || !them.IsValid() || !us.Masked().Contains(them.Addr())
	}
	// (The reasons are built only when there is no route: this runs for every remote block.)
	noAddr := func() string { return fmt.Sprintf("node %s has no %s address (%s)", node, family, addrField) }
	if vxlan {
		t := tunnelAddr(n, dst.Addr())
		switch {
		case !rc.cfg.VXLAN:
			return Route{}, fmt.Sprintf("it needs VXLAN (pool %s) and VXLAN is off (option vxlan)", poolName(pool))
		case !t.IsValid():
			return Route{}, fmt.Sprintf("node %s has no %s VXLAN tunnel address (%s)", node, family, tunnelField)
		case !them.IsValid():
			return Route{}, noAddr()
		}
		return Route{Dst: dst, Type: RouteUnicast, Device: rc.vxlanDevice(t), Gateway: t, OnLink: true, Reason: reason, Node: node}, ""
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
func (rc *routeCalc) unrouted(dst netip.Prefix) (key, what string) {
	if id, ok := rc.wepsByNet.first(dst); ok && dst.IsSingleIP() {
		return "workload/" + dst.String(), fmt.Sprintf("workload %s (address %s) on node %s", id, dst.Addr(), rc.weps[id].Node)
	}
	if rc.blocks[dst] == nil {
		return "bgp/route/" + dst.String(), "route " + dst.String() + " learned by BGP"
	}
	return "block/" + dst.String(), "block of node " + rc.blocks[dst].AffinityNode
}

// whyNoRoute says why a remote workload's address (routes from workloads, or an address
// borrowed from another node's block) or a live remote block affine to another node gets no
// route though it needs one, or "" when no route is due (no such workload or block, a local or
// deleted one, an IPIP pool: that is reported per pool). The decisions are the routes' own.
func (rc *routeCalc) whyNoRoute(dst netip.Prefix) string {
	if dst.IsSingleIP() {
		if _, why := rc.workloadRouteWhy(dst); why != "-" && why != "" {
			return why
		}
	}
	if b := rc.blocks[dst]; b != nil && rc.cfg.RouteSource == SourceCalicoIPAM {
		if _, why := rc.blockRouteWhy(b); why != "-" && why != "" {
			return why
		}
	}
	if _, why := rc.learnedRouteWhy(dst); why != "-" && why != "" {
		return why
	}
	return ""
}

// speaksBGP: this agent runs BGP and its node has spec.bgp.
func (rc *routeCalc) speaksBGP() bool {
	if !rc.cfg.BGP {
		return false
	}
	self := rc.nodes[rc.cfg.NodeName]
	return self != nil && self.BGP != nil
}

// computeRoute decides the route for one destination from scratch, from current inputs only.
func (rc *routeCalc) computeRoute(dst netip.Prefix) (Route, bool) {
	single := dst.IsSingleIP()
	if single {
		if r, ok := rc.workloadRoute(dst); ok {
			return r, true
		}
		if r, ok := rc.tunnelRoute(dst); ok {
			return r, true
		}
		if r, ok := rc.floatingRoute(dst); ok {
			return r, true
		}
	}
	if b := rc.blocks[dst]; b != nil && rc.cfg.RouteSource == SourceCalicoIPAM {
		if r, ok := rc.blockRoute(b); ok {
			return r, true
		}
	}
	if r, why := rc.learnedRouteWhy(dst); why == "" {
		return r, true
	}
	if rc.cfg.PoolBlackholes {
		for _, p := range rc.pools {
			if p.CIDR == dst {
				return Route{Dst: dst, Type: rc.cfg.BlackholeType, Metric: rc.cfg.PoolBlackholeMetric, Reason: ReasonPool}, true
			}
		}
	}
	return Route{}, false
}

// workloadRoute: a local workload's address goes to its interface; a remote one gets its own
// route when it is borrowed (or always, when routes come from workloads).
func (rc *routeCalc) workloadRoute(dst netip.Prefix) (Route, bool) {
	r, why := rc.workloadRouteWhy(dst)
	return r, why == ""
}

// workloadRouteWhy is workloadRoute, saying why there is none as remoteRouteWhy does ("-":
// none is due).
func (rc *routeCalc) workloadRouteWhy(dst netip.Prefix) (Route, string) {
	first, ok := rc.wepsByNet.first(dst)
	if !ok {
		return Route{}, "-"
	}
	for id := range rc.wepsByNet.all(dst) {
		if w := rc.weps[id]; rc.isLocal(w.Node) {
			return Route{Dst: dst, Type: RouteUnicast, Device: w.InterfaceName, Reason: ReasonLocalWorkload}, ""
		}
	}
	w := rc.weps[first]
	if rc.cfg.RouteSource == SourceWorkloadIPs {
		return rc.remoteRouteWhy(dst, w.Node, rc.poolFor(dst), ReasonRemoteWorkload)
	}
	if b := rc.blockFor(dst.Addr()); b == nil || b.AffinityNode != w.Node {
		return rc.remoteRouteWhy(dst, w.Node, rc.poolFor(dst), ReasonBorrowed)
	}
	return Route{}, "-" // its block's route covers it
}

// floatingRoute: a floating IP goes where its workload's internal address goes: to the
// workload's interface on its node, through the path to that node (VXLAN or direct, as the
// internal address's pool says) from the others. The workload whose name sorts first wins
// when several claim one floating IP.
func (rc *routeCalc) floatingRoute(dst netip.Prefix) (Route, bool) {
	id, ok := rc.fips.byAddr.first(dst.Addr())
	if !ok {
		return Route{}, false
	}
	w := rc.weps[id]
	if rc.isLocal(w.Node) {
		return Route{Dst: dst, Type: RouteUnicast, Device: w.InterfaceName, Reason: ReasonFloatingIP}, true
	}
	if in, ok := internalOf(w, dst.Addr()); ok {
		return rc.remoteRoute(dst, w.Node, rc.poolFor(netip.PrefixFrom(in, in.BitLen())), ReasonFloatingIP)
	}
	return Route{}, false
}

// tunnelRoute: a remote node's tunnel address that is not inside its own block needs a
// route of its own through VXLAN.
func (rc *routeCalc) tunnelRoute(dst netip.Prefix) (Route, bool) {
	node, ok := rc.tunnelsByAddr.first(dst.Addr())
	if !ok || !rc.cfg.VXLAN {
		return Route{}, false
	}
	if rc.isLocal(node) {
		return Route{}, false
	}
	if b := rc.blockFor(dst.Addr()); b != nil && b.AffinityNode == node && rc.cfg.RouteSource == SourceCalicoIPAM {
		return Route{}, false // the block route covers it
	}
	n := rc.nodes[node]
	if !underlay(n, dst.Addr()).IsValid() {
		return Route{}, false
	}
	return Route{Dst: dst, Type: RouteUnicast, Device: rc.vxlanDevice(dst.Addr()), Gateway: dst.Addr(), OnLink: true, Reason: ReasonRemoteTunnel, Node: node}, true
}

// blockRoute: a local block with a confirmed affinity is blackholed (but not a single-address
// block: its workload's own route is the whole block); a remote block in a pool is routed to
// its node. A disabled pool still routes: in Calico "disabled" only stops new allocations,
// and disabling the old pool is the first step of migrating to a new one, while its
// workloads still carry traffic.
func (rc *routeCalc) blockRoute(b *store.Block) (Route, bool) {
	r, why := rc.blockRouteWhy(b)
	return r, why == ""
}

// blockRouteWhy is blockRoute, saying why there is none as remoteRouteWhy does ("-": none is
// due).
func (rc *routeCalc) blockRouteWhy(b *store.Block) (Route, string) {
	if b.AffinityNode == "" || b.Deleted {
		return Route{}, "-"
	}
	if rc.isLocal(b.AffinityNode) {
		a := rc.affinities[b.AffinityNode+"/"+b.CIDR.String()]
		if a == nil || a.Deleted || a.State != store.AffinityConfirmed || b.CIDR.IsSingleIP() {
			return Route{}, "-"
		}
		return Route{Dst: b.CIDR, Type: rc.cfg.BlackholeType, Metric: rc.cfg.BlackholeMetric, Reason: ReasonLocalBlock}, ""
	}
	pool := rc.poolFor(b.CIDR)
	if pool == nil {
		return Route{}, "it is in no IP pool"
	}
	return rc.remoteRouteWhy(b.CIDR, b.AffinityNode, pool, ReasonRemoteBlock)
}

// recompute recomputes every dirty destination and records what changed.
func (rc *routeCalc) recompute() {
	n := len(rc.dirtyDst)
	rc.routes = sized(rc.routes, n)
	for dst := range rc.dirtyDst {
		r, ok := rc.computeRoute(dst)
		old, had := rc.routes[dst]
		switch {
		case ok && (!had || !old.Equal(r)):
			p := new(Route) // a copy: taking &r would put every pass's r on the heap
			*p = r
			rc.routes[dst] = p
			if rc.emitted {
				rc.pending.routeSets = append(rc.pending.routeSets, p)
			}
			if rc.routeChanged != nil {
				rc.routeChanged(dst, old, p)
			}
		case !ok && had:
			delete(rc.routes, dst)
			if rc.emitted {
				rc.pending.routeDels = append(rc.pending.routeDels, old)
			}
			if rc.routeChanged != nil {
				rc.routeChanged(dst, old, nil)
			}
		}
		switch {
		case !rc.inSync:
			// Before the first in-sync the inputs are partial (etcd's blocks are read before
			// its nodes): a block with no route yet is looked at once, at in-sync. Said and
			// taken back here, such problems were a large part of a cold start's work
			// (BenchmarkColdStartBatches in calc measures it).
			if !ok {
				if rc.unsure == nil {
					rc.unsure = set[netip.Prefix]{}
				}
				rc.unsure.add(dst)
			}
		case !ok:
			rc.routeProblem(dst)
		default:
			rc.routed(dst)
		}
	}
	reset(&rc.dirtyDst, n)
	if rc.inSync && rc.unsure != nil {
		for dst := range rc.unsure {
			if _, ok := rc.routes[dst]; !ok {
				rc.routeProblem(dst)
			}
		}
		rc.unsure = nil
	}
}

// routeProblem says, for a destination that got no route, why it needs one and has none
// (a remote block, a workload's address), or forgets what was said of it: otherwise traffic
// to it only follows the default route.
func (rc *routeCalc) routeProblem(dst netip.Prefix) {
	why := rc.whyNoRoute(dst)
	if why == "" {
		rc.routed(dst)
		return
	}
	key, what := rc.unrouted(dst)
	if old, had := rc.routeProblems[dst]; had && old != key {
		delete(rc.problems, old)
	}
	rc.routeProblems[dst] = key
	rc.problem(key, what+" gets no route: "+why)
}

// routed forgets any problem said of dst. (Looked up by destination: building the problem's
// key for every destination recomputed allocated for each one; BenchmarkFullComputation in
// calc counts the allocations.)
func (rc *routeCalc) routed(dst netip.Prefix) {
	if key, had := rc.routeProblems[dst]; had {
		delete(rc.problems, key)
		delete(rc.routeProblems, dst)
	}
}

// vxlanDevice is the device for a route via the tunnel address t: the IPv6 device for IPv6.
func (rc *routeCalc) vxlanDevice(t netip.Addr) string {
	if t.Is6() {
		return rc.cfg.VXLANDeviceV6
	}
	return rc.cfg.VXLANDevice
}
