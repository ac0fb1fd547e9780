package calc

import (
	"cmp"
	"fmt"
	"iter"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/store"
)

type set[K comparable] map[K]struct{}

func (s set[K]) add(k K) { s[k] = struct{}{} }

// multi maps a key to a small sorted list of values. Most keys have one: it sits in one, and
// only the others in more (a map of slices costs a slice for every key; BenchmarkDataplane in
// cmd/sluiced reports the settled agent's memory at 20,000 nodes).
type multi[K comparable, V cmp.Ordered] struct {
	one  map[K]V   // each key's smallest value
	more map[K][]V // the other values, sorted, of the keys that have several
}

func newMulti[K comparable, V cmp.Ordered]() multi[K, V] {
	return multi[K, V]{one: map[K]V{}, more: map[K][]V{}}
}

func (m multi[K, V]) add(k K, v V) {
	f, ok := m.one[k]
	switch {
	case !ok:
		m.one[k] = v
	case v == f:
	case v < f:
		m.one[k] = v
		m.addMore(k, f)
	default:
		m.addMore(k, v)
	}
}

func (m multi[K, V]) addMore(k K, v V) {
	vs := m.more[k]
	if i, found := slices.BinarySearch(vs, v); !found {
		m.more[k] = slices.Insert(vs, i, v)
	}
}

func (m multi[K, V]) remove(k K, v V) {
	f, ok := m.one[k]
	if !ok {
		return
	}
	vs := m.more[k]
	if v == f {
		switch len(vs) {
		case 0:
			delete(m.one, k)
		case 1:
			m.one[k] = vs[0]
			delete(m.more, k)
		default:
			m.one[k] = vs[0]
			m.more[k] = slices.Delete(vs, 0, 1)
		}
		return
	}
	if i, found := slices.BinarySearch(vs, v); found {
		if len(vs) == 1 {
			delete(m.more, k)
			return
		}
		m.more[k] = slices.Delete(vs, i, i+1)
	}
}

// all yields k's values in order, allocating nothing (for the hot path: a route's
// computation).
func (m multi[K, V]) all(k K) iter.Seq[V] {
	return func(yield func(V) bool) {
		f, ok := m.one[k]
		if !ok || !yield(f) {
			return
		}
		for _, v := range m.more[k] {
			if !yield(v) {
				return
			}
		}
	}
}

// get returns k's values in order (nil: none), in a new slice.
func (m multi[K, V]) get(k K) []V {
	f, ok := m.one[k]
	if !ok {
		return nil
	}
	return append([]V{f}, m.more[k]...)
}

// first returns k's smallest value.
func (m multi[K, V]) first(k K) (V, bool) {
	f, ok := m.one[k]
	return f, ok
}

// count is how many values k has.
func (m multi[K, V]) count(k K) int {
	if _, ok := m.one[k]; !ok {
		return 0
	}
	return 1 + len(m.more[k])
}

// prefixLists maps a key to a small sorted list of prefixes (a node's blocks: most nodes have
// one or two, and a map per node costs far more than a slice; BenchmarkDataplane in
// cmd/sluiced reports the settled agent's memory at 20,000 nodes).
type prefixLists map[string][]netip.Prefix

func (m prefixLists) add(k string, p netip.Prefix) {
	ps := m[k]
	if i, found := slices.BinarySearchFunc(ps, p, cmpPrefix); !found {
		m[k] = slices.Insert(ps, i, p)
	}
}

func (m prefixLists) remove(k string, p netip.Prefix) {
	ps := m[k]
	if i, found := slices.BinarySearchFunc(ps, p, cmpPrefix); found {
		if len(ps) == 1 {
			delete(m, k)
			return
		}
		m[k] = slices.Delete(ps, i, i+1)
	}
}

// reset empties a dirty map that held n keys; one that grew large (the first full
// computation) is replaced, since clearing a map costs its capacity, not its length.
func reset[M ~map[K]V, K comparable, V any](m *M, n int) {
	if n > 256 {
		*m = M{}
		return
	}
	clear(*m)
}

// addTo adds v to the set at m[k], creating it.
func addTo[K, V comparable](m map[K]set[V], k K, v V) {
	s := m[k]
	if s == nil {
		s = set[V]{}
		m[k] = s
	}
	s[v] = struct{}{}
}

// removeFrom removes v from the set at m[k], dropping an empty set.
func removeFrom[K, V comparable](m map[K]set[V], k K, v V) {
	if s := m[k]; s != nil {
		delete(s, v)
		if len(s) == 0 {
			delete(m, k)
		}
	}
}

// Graph holds calc's inputs, the indexes that say which outputs an input touches, and the
// desired state as last emitted where it cannot be computed again from the inputs (routes,
// services, floating IPs; VTEPs and cluster nets can: see recomputeVTEPs and markNet).
//
// Hazards that shaped it: a block and its affinity arrive in separate transactions (a block
// without a confirmed affinity is not ours to blackhole); an address can be borrowed across
// nodes both ways; a node's own address moving subnet flips every CrossSubnet route, so it is
// the one change allowed to touch everything.
type Graph struct {
	cfg Config

	// Inputs, by ID.
	pools      map[string]*store.IPPool
	nodes      map[string]*store.Node
	blocks     map[netip.Prefix]*store.Block
	affinities map[string]*store.BlockAffinity
	weps       map[string]*store.WorkloadEndpoint

	// Indexes from an input to what it touches.
	blocksByNode  prefixLists
	wepsByNet     multi[netip.Prefix, string]
	wepsByNode    map[string]set[string]
	tunnelsByAddr multi[netip.Addr, string]
	// singles holds every single address a workload network or a tunnel names, by the /24 (or
	// IPv6 /120) around it: a block finds the addresses inside it with one lookup per 256
	// addresses instead of one per address.
	singles map[netip.Prefix]set[netip.Addr]
	// hostNets holds the nodes claiming each underlay address, as a /32 or /128.
	hostNets  multi[netip.Prefix, string]
	blockBits map[int]int // prefix lengths of known blocks, with counts, for longest match

	// What needs recomputing.
	dirtyDst set[netip.Prefix]
	// dirtyVTEP maps each node whose VTEPs may have changed to the Node they were last
	// computed from (nil: none).
	dirtyVTEP map[string]*store.Node
	// dirtyNet maps each cluster net that may have changed to its value as last computed
	// (markNet).
	dirtyNet map[netip.Prefix]netWas
	// fipsByAddr holds the workloads naming each floating IP (ipNATs' externalIP); fips the
	// floating IPs of this node's workloads as emitted; dirtyFIP those to recompute.
	fipsByAddr multi[netip.Addr, string]
	fips       map[netip.Addr]FloatingIP
	dirtyFIP   set[netip.Addr]

	// Desired state as last computed (but VTEPs and cluster nets, computed again).
	// routes holds each route as emitted: a route is never changed once made (a new one
	// replaces it), so the dataplane keeps the same pointer rather than a copy.
	routes map[netip.Prefix]*Route
	// svc computes the services' frontends and health checks from services and slices (its
	// own inputs) and the nodes (the graph's, read only).
	svc *serviceCalc
	// routeProblems holds the problem key of each destination that gets no route though due.
	routeProblems map[netip.Prefix]string
	selfKey       string // this agent's own Node's problem key, made once

	inSync bool
	// unsure holds the destinations left without a route before the first in-sync, whose
	// problems (if any) are said at in-sync.
	unsure set[netip.Prefix]
	emitter
}

// emitter is where every calculator puts what it computed: the changes of the batch and the
// problems. The graph's is shared by its calculators.
type emitter struct {
	// emitted is set once the first (full) update has gone: changes are queued from then on.
	emitted  bool
	pending  pendingOps
	problems map[string]string
}

// problem records something calc cannot act on; it is reported once, in the next update.
func (e *emitter) problem(key, reason string) {
	if e.problems[key] == reason {
		return
	}
	e.problems[key] = reason
	e.pending.problems = append(e.pending.problems, Problem{Key: key, Reason: reason})
}

// New returns an empty graph for cfg.
func New(cfg Config) (*Graph, error) {
	if err := cfg.normalise(); err != nil {
		return nil, err
	}
	g := &Graph{
		cfg:           cfg,
		selfKey:       "node/" + cfg.NodeName,
		pools:         map[string]*store.IPPool{},
		nodes:         map[string]*store.Node{},
		blocks:        map[netip.Prefix]*store.Block{},
		affinities:    map[string]*store.BlockAffinity{},
		weps:          map[string]*store.WorkloadEndpoint{},
		blocksByNode:  prefixLists{},
		wepsByNet:     newMulti[netip.Prefix, string](),
		wepsByNode:    map[string]set[string]{},
		tunnelsByAddr: newMulti[netip.Addr, string](),
		singles:       map[netip.Prefix]set[netip.Addr]{},
		hostNets:      newMulti[netip.Prefix, string](),
		fipsByAddr:    newMulti[netip.Addr, string](),
		fips:          map[netip.Addr]FloatingIP{},
		dirtyFIP:      set[netip.Addr]{},
		blockBits:     map[int]int{},
		dirtyDst:      set[netip.Prefix]{},
		dirtyVTEP:     map[string]*store.Node{},
		dirtyNet:      map[netip.Prefix]netWas{},
		routes:        map[netip.Prefix]*Route{},
		routeProblems: map[netip.Prefix]string{},
		emitter:       emitter{problems: map[string]string{}},
	}
	g.svc = newServiceCalc(cfg.NodeName, g.nodes, &g.emitter)
	return g, nil
}

// Config returns the graph's configuration.
func (g *Graph) Config() Config { return g.cfg }

// OnEvents takes a batch of store events and returns what changed in the desired state: nil
// before the first in-sync and whenever nothing changed, a full state at the first in-sync,
// deltas after.
func (g *Graph) OnEvents(batch []store.Event) *Update {
	sized := g.expect(batch)
	for i := range batch {
		g.apply(&batch[i])
	}
	// Computed as the data arrives, before the first in-sync too, so that on a cold start the
	// work overlaps the reading of etcd (which reads pools and nodes before blocks); nothing is
	// emitted before it.
	g.recompute()
	if sized {
		// Emptied by recompute but still the size of the batch (a page that dirtied few
		// destinations keeps a set cleared, not replaced): give the room back.
		g.dirtyDst, g.dirtyNet, g.dirtyVTEP = set[netip.Prefix]{}, map[netip.Prefix]netWas{}, map[string]*store.Node{}
	}
	g.checkSelf()
	if !g.inSync {
		g.pending = pendingOps{}
		return nil
	}
	if !g.emitted {
		g.emitted = true
		g.pending = pendingOps{}
		return g.fullUpdate()
	}
	return g.pending.take()
}

// expect sizes the empty dirty sets for a large batch (a page of a cold start): grown one key
// at a time, a set of 20,000 copies itself a dozen times, which at a large cold start is a
// good part of the CPU (BenchmarkColdStartBatches in calc measures it).
func (g *Graph) expect(batch []store.Event) (sized bool) {
	n := len(batch)
	if n < 1024 {
		return false
	}
	if len(g.dirtyDst) == 0 {
		// Two destinations an input, as a rule: a block and the tunnel address inside it.
		g.dirtyDst = make(set[netip.Prefix], 2*n)
	}
	// Only nodes and pools touch VTEPs and cluster nets (a page of blocks, none).
	nodes := 0
	for i := range batch {
		if k := batch[i].Kind; k == store.KindNode || k == store.KindIPPool {
			nodes++
		}
	}
	if nodes >= 1024 {
		if len(g.dirtyNet) == 0 {
			g.dirtyNet = make(map[netip.Prefix]netWas, nodes)
		}
		if len(g.dirtyVTEP) == 0 {
			g.dirtyVTEP = make(map[string]*store.Node, nodes)
		}
	}
	return true
}

// sized returns m, or an empty map with room for n when m is empty and n is large: the
// desired state's first computation.
func sized[K comparable, V any](m map[K]V, n int) map[K]V {
	if len(m) == 0 && n > 1024 {
		return make(map[K]V, n)
	}
	return m
}

func (g *Graph) apply(ev *store.Event) {
	if ev.Type == store.EventInSync {
		g.inSync = true
		return
	}
	var obj store.Object
	if ev.Type == store.EventUpsert {
		obj = ev.Object
	}
	switch ev.Kind {
	case store.KindIPPool:
		g.onPool(ev.ID, asType[*store.IPPool](obj))
	case store.KindNode:
		g.onNode(ev.ID, asType[*store.Node](obj))
	case store.KindBlock:
		p, err := netip.ParsePrefix(ev.ID)
		if err == nil {
			g.onBlock(p, asType[*store.Block](obj))
		}
	case store.KindBlockAffinity:
		g.onAffinity(ev.ID, asType[*store.BlockAffinity](obj))
	case store.KindWorkloadEndpoint:
		g.onWEP(ev.ID, asType[*store.WorkloadEndpoint](obj))
	case store.KindService:
		g.svc.onService(ev.ID, asType[*store.Service](obj))
	case store.KindEndpointSlice:
		g.svc.onSlice(ev.ID, asType[*store.EndpointSlice](obj))
	}
}

func asType[T store.Object](o store.Object) T {
	t, _ := o.(T)
	return t
}

func (g *Graph) isLocal(node string) bool { return node == g.cfg.NodeName }

// markBlockContents marks every address of a block whose route may depend on the block:
// workload addresses (borrowed or not) and tunnel addresses.
func (g *Graph) markBlockContents(cidr netip.Prefix) {
	start := cidr.Masked().Addr()
	for i := 0; i < store.BlockSlots(cidr); i += bucketSize {
		for s := range g.singles[bucketOf(addrPlus(start, uint64(i)))] {
			if cidr.Contains(s) {
				g.dirtyDst.add(netip.PrefixFrom(s, s.BitLen()))
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
func (g *Graph) indexSingle(a netip.Addr) { addTo(g.singles, bucketOf(a), a) }

// unindexSingle forgets a once neither a workload network nor a tunnel names it.
func (g *Graph) unindexSingle(a netip.Addr) {
	if g.tunnelsByAddr.count(a) == 0 && g.wepsByNet.count(netip.PrefixFrom(a, a.BitLen())) == 0 {
		removeFrom(g.singles, bucketOf(a), a)
	}
}

func (g *Graph) onPool(id string, p *store.IPPool) {
	old := g.pools[id]
	for _, q := range []*store.IPPool{old, p} {
		if q != nil {
			g.markNet(q.CIDR)
		}
	}
	if p == nil {
		delete(g.pools, id)
	} else {
		g.pools[id] = p
	}
	// A pool decides the route of every block inside it, and of borrowed addresses there.
	for _, q := range []*store.IPPool{old, p} {
		if q == nil {
			continue
		}
		g.dirtyDst.add(q.CIDR)
		for cidr := range g.blocks {
			if q.CIDR.Overlaps(cidr) {
				g.dirtyDst.add(cidr)
				g.markBlockContents(cidr)
			}
		}
		for net := range g.wepsByNet.one {
			if q.CIDR.Contains(net.Addr()) {
				g.dirtyDst.add(net)
			}
		}
		g.markFloatingIPs() // routed by their internal address's pool
	}
	if p != nil && p.IPIPMode != store.EncapNever {
		g.problem("pool/"+id, "IPIP encapsulation is not supported: remote blocks in this pool get no route; local blocks are still blackholed")
	} else {
		delete(g.problems, "pool/"+id)
	}
}

func (g *Graph) onNode(id string, n *store.Node) {
	old := g.nodes[id]
	if n == nil {
		delete(g.nodes, id)
	} else {
		g.nodes[id] = n
	}
	for _, m := range []*store.Node{old, n} {
		if m == nil {
			continue
		}
		for _, a := range []netip.Addr{m.IPv4VXLANTunnelAddr, m.IPv6VXLANTunnelAddr()} {
			if a.IsValid() {
				g.dirtyDst.add(netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	if old != nil {
		for _, a := range []netip.Addr{old.IPv4VXLANTunnelAddr, old.IPv6VXLANTunnelAddr()} {
			if a.IsValid() {
				g.tunnelsByAddr.remove(a, id)
				g.unindexSingle(a)
			}
		}
		for _, p := range hostNets(old) {
			g.markNet(p)
			g.hostNets.remove(p, id)
		}
	}
	if n != nil {
		for _, a := range []netip.Addr{n.IPv4VXLANTunnelAddr, n.IPv6VXLANTunnelAddr()} {
			if a.IsValid() {
				g.tunnelsByAddr.add(a, id)
				g.indexSingle(a)
			}
		}
		for _, p := range hostNets(n) {
			g.markNet(p)
			g.hostNets.add(p, id)
		}
	}
	if _, ok := g.dirtyVTEP[id]; !ok {
		g.dirtyVTEP[id] = old
	}
	g.svc.onNode(id, old, n)
	if g.isLocal(id) {
		// This node's addresses decide CrossSubnet routes everywhere and its node ports.
		for cidr := range g.blocks {
			g.dirtyDst.add(cidr)
		}
		for net := range g.wepsByNet.one {
			g.dirtyDst.add(net)
		}
		for a := range g.tunnelsByAddr.one {
			g.dirtyDst.add(netip.PrefixFrom(a, a.BitLen()))
		}
		g.markFloatingIPs()
		return
	}
	for _, cidr := range g.blocksByNode[id] {
		g.dirtyDst.add(cidr)
	}
	for wid := range g.wepsByNode[id] {
		w := g.weps[wid]
		for _, net := range w.IPNetworks {
			g.dirtyDst.add(net)
		}
		for _, n := range w.IPNATs { // routed to the node like the workload's own address
			g.dirtyDst.add(netip.PrefixFrom(n.ExternalIP, n.ExternalIP.BitLen()))
		}
	}
}

// markFloatingIPs makes every floating IP's route be computed again (there are few).
func (g *Graph) markFloatingIPs() {
	for ext := range g.fipsByAddr.one {
		g.dirtyDst.add(netip.PrefixFrom(ext, ext.BitLen()))
	}
}

// hostNets returns a node's underlay addresses as single-address prefixes.
func hostNets(n *store.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []netip.Prefix{n.IPv4Address, n.IPv6Address()} {
		if p.IsValid() {
			out = append(out, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
		}
	}
	return out
}

func (g *Graph) onBlock(cidr netip.Prefix, b *store.Block) {
	old := g.blocks[cidr]
	if old != nil {
		g.blocksByNode.remove(old.AffinityNode, cidr)
		if g.blockBits[cidr.Bits()]--; g.blockBits[cidr.Bits()] == 0 {
			delete(g.blockBits, cidr.Bits())
		}
	}
	if b == nil {
		delete(g.blocks, cidr)
	} else {
		g.blocks[cidr] = b
		g.blocksByNode.add(b.AffinityNode, cidr)
		g.blockBits[cidr.Bits()]++
	}
	g.dirtyDst.add(cidr)
	// Which node a block is affine to decides whether the addresses in it are borrowed.
	if old == nil || b == nil || old.AffinityNode != b.AffinityNode {
		g.markBlockContents(cidr)
	}
}

func (g *Graph) onAffinity(id string, a *store.BlockAffinity) {
	old := g.affinities[id]
	if a == nil {
		delete(g.affinities, id)
	} else {
		g.affinities[id] = a
	}
	for _, x := range []*store.BlockAffinity{old, a} {
		if x != nil {
			g.dirtyDst.add(x.CIDR)
		}
	}
}

func (g *Graph) onWEP(id string, w *store.WorkloadEndpoint) {
	if old := g.weps[id]; old != nil {
		for _, net := range old.IPNetworks {
			g.wepsByNet.remove(net, id)
			g.dirtyDst.add(net)
			if net.IsSingleIP() {
				g.unindexSingle(net.Addr())
			}
		}
		for _, n := range old.IPNATs {
			g.fipsByAddr.remove(n.ExternalIP, id)
			g.dirtyDst.add(netip.PrefixFrom(n.ExternalIP, n.ExternalIP.BitLen()))
			g.dirtyFIP.add(n.ExternalIP)
		}
		removeFrom(g.wepsByNode, old.Node, id)
	}
	if w == nil {
		delete(g.weps, id)
		return
	}
	for _, n := range w.IPNATs {
		g.fipsByAddr.add(n.ExternalIP, id)
		g.dirtyDst.add(netip.PrefixFrom(n.ExternalIP, n.ExternalIP.BitLen()))
		g.dirtyFIP.add(n.ExternalIP)
	}
	g.weps[id] = w
	for _, net := range w.IPNetworks {
		g.wepsByNet.add(net, id)
		g.dirtyDst.add(net)
		if net.IsSingleIP() {
			g.indexSingle(net.Addr())
		}
	}
	addTo(g.wepsByNode, w.Node, id)
}

// Vacant says whether a is an address of the pools that no workload and no node's tunnel
// holds, once the graph is in sync: nothing there answers (the node whose block holds it
// drops what is sent to it). False for any other address, which may answer.
func (g *Graph) Vacant(a netip.Addr) bool {
	pool := g.poolFor(netip.PrefixFrom(a, a.BitLen()))
	if !g.inSync || pool == nil || g.tunnelsByAddr.count(a) > 0 {
		return false
	}
	// A workload's network holding a: its own address, or a wider network of its.
	for bits := a.BitLen(); bits >= pool.CIDR.Bits(); bits-- {
		if p, err := a.Prefix(bits); err == nil && g.wepsByNet.count(p) > 0 {
			return false
		}
	}
	return true
}

// InSync reports whether the graph has had its first in-sync: State is then the desired state
// of etcd as of the last batch.
func (g *Graph) InSync() bool { return g.inSync }

// SelfMissing reports whether, in sync with etcd, this agent's own Node is not there: an agent
// started with the wrong node name programs nothing for it.
func (g *Graph) SelfMissing() bool { return g.inSync && g.nodes[g.cfg.NodeName] == nil }

// checkSelf makes this agent's own Node missing a problem (and forgets it once it is there).
func (g *Graph) checkSelf() {
	if g.SelfMissing() {
		g.problem(g.selfKey, fmt.Sprintf("this agent's node %s is not in etcd (no %s%s): it programs no route, VTEP or blackhole for it; check the node name (option node-name; Calico names nodes by the lower-cased hostname)",
			g.cfg.NodeName, store.NodePrefix, g.cfg.NodeName))
		return
	}
	delete(g.problems, g.selfKey)
}

// ProblemCount is how many inputs calc cannot act on now (State().Problems lists them).
func (g *Graph) ProblemCount() int { return len(g.problems) }
