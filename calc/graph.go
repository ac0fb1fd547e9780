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
	if i, found := slices.BinarySearchFunc(ps, p, ComparePrefix); !found {
		m[k] = slices.Insert(ps, i, p)
	}
}

func (m prefixLists) remove(k string, p netip.Prefix) {
	ps := m[k]
	if i, found := slices.BinarySearchFunc(ps, p, ComparePrefix); found {
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

// inputs are the graph's inputs by ID, written only by the dispatcher (Graph.apply) and read
// by the calculators: several compute from the same ones (routes, VTEPs and services from the
// nodes; routes and cluster nets from the pools).
type inputs struct {
	cfg        Config
	pools      map[string]*store.IPPool
	nodes      map[string]*store.Node
	blocks     map[netip.Prefix]*store.Block
	affinities map[string]*store.BlockAffinity
	weps       map[string]*store.WorkloadEndpoint
	// BGP: the configurations and what the speaker learned (both empty with BGP off).
	bgpConfigs map[string]*store.BGPConfiguration
	learned    map[netip.Prefix]learnedRoute
	// inSync is set at the first in-sync: the inputs are then etcd's whole state.
	inSync bool
}

func (in *inputs) isLocal(node string) bool { return node == in.cfg.NodeName }

// Graph is calc's dispatcher: it keeps the inputs, hands each event to the calculators that
// compute from its kind, has each recompute what the batch made dirty, and turns what they
// queued into one update. A calculator owns its indexes (which outputs an input touches), its
// dirty sets and, where it cannot compute them again from the inputs, its outputs as last
// emitted; it hears a kind of input by having that kind's method (nodeListener, ...), so a new
// output is a new calculator and one line in New.
//
// Hazards that shaped it: a block and its affinity arrive in separate transactions (a block
// without a confirmed affinity is not ours to blackhole); an address can be borrowed across
// nodes both ways; a node's own address moving subnet flips every CrossSubnet route, so it is
// the one change allowed to touch everything.
type Graph struct {
	inputs
	emitter
	// The calculators, in the order they recompute (the apply order of their outputs is the
	// update's own: see Update).
	vteps  *vtepCalc    // VTEPs
	nets   *netCalc     // cluster nets
	routes *routeCalc   // routes (floating IPs' too) and blackholes
	fips   *fipCalc     // the floating IPs of this node's workloads
	svc    *serviceCalc // service frontends and health checks
	bgp    *bgpCalc     // the BGP speaker, its sessions and announcements (after routes and services)
	calcs  []calculator
	// The calculators that hear each kind of input, from calcs.
	poolLs     []poolListener
	nodeLs     []nodeListener
	blockLs    []blockListener
	affinityLs []affinityListener
	wepLs      []wepListener
	serviceLs  []serviceListener
	sliceLs    []sliceListener
	bgpCfgLs   []bgpConfigListener
	bgpPeerLs  []bgpPeerListener
	selfKey    string // this agent's own Node's problem key, made once
}

// A calculator computes one part of the desired state: recompute computes again what the
// events it heard made dirty, and queues the differences into the graph's emitter.
type calculator interface{ recompute() }

// The listeners: old is the input as it was (nil: absent), the new value is already in the
// graph's inputs (nil: deleted).
type (
	poolListener interface {
		onPool(id string, old, p *store.IPPool)
	}
	nodeListener interface {
		onNode(id string, old, n *store.Node)
	}
	blockListener interface {
		onBlock(cidr netip.Prefix, old, b *store.Block)
	}
	affinityListener interface {
		onAffinity(id string, old, a *store.BlockAffinity)
	}
	wepListener interface {
		onWEP(id string, old, w *store.WorkloadEndpoint)
	}
	serviceListener interface {
		onService(id string, s *store.Service)
	}
	sliceListener interface {
		onSlice(id string, e *store.EndpointSlice)
	}
	bgpConfigListener interface {
		onBGPConfig(id string, c *store.BGPConfiguration)
	}
	bgpPeerListener interface {
		onBGPPeer(id string, p *store.BGPPeer)
	}
	// A sizer makes room in its dirty sets for a large batch (a page of a cold start), and
	// gives it back after.
	sizer interface {
		expect(b batchCount)
		shrink()
	}
)

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
		inputs: inputs{cfg: cfg, pools: map[string]*store.IPPool{}, nodes: map[string]*store.Node{},
			blocks: map[netip.Prefix]*store.Block{}, affinities: map[string]*store.BlockAffinity{}, weps: map[string]*store.WorkloadEndpoint{},
			bgpConfigs: map[string]*store.BGPConfiguration{}, learned: map[netip.Prefix]learnedRoute{}},
		emitter: emitter{problems: map[string]string{}},
		selfKey: "node/" + cfg.NodeName,
	}
	g.vteps = newVTEPCalc(&g.inputs, &g.emitter)
	g.nets = newNetCalc(&g.inputs, &g.emitter)
	g.fips = newFIPCalc(&g.inputs, &g.emitter)
	g.routes = newRouteCalc(&g.inputs, &g.emitter, g.fips)
	g.svc = newServiceCalc(&g.inputs, &g.emitter)
	g.bgp = newBGPCalc(&g.inputs, &g.emitter, g.routes, g.svc)
	g.register(g.vteps, g.nets, g.routes, g.fips, g.svc, g.bgp)
	return g, nil
}

// register adds calculators, in recompute order, to the listeners of the kinds they hear.
func (g *Graph) register(cs ...calculator) {
	for _, c := range cs {
		g.calcs = append(g.calcs, c)
		listen(c, &g.poolLs)
		listen(c, &g.nodeLs)
		listen(c, &g.blockLs)
		listen(c, &g.affinityLs)
		listen(c, &g.wepLs)
		listen(c, &g.serviceLs)
		listen(c, &g.sliceLs)
		listen(c, &g.bgpCfgLs)
		listen(c, &g.bgpPeerLs)
	}
}

// listen adds c to ls when it is a listener of ls's kind.
func listen[L any](c calculator, ls *[]L) {
	if l, ok := c.(L); ok {
		*ls = append(*ls, l)
	}
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
	return g.compute(sized)
}

// compute has every calculator recompute what the inputs made dirty and returns the update
// (nil before the first in-sync and when nothing changed; the whole state at the first).
func (g *Graph) compute(sized bool) *Update {
	// Computed as the data arrives, before the first in-sync too, so that on a cold start the
	// work overlaps the reading of etcd (which reads pools and nodes before blocks); nothing is
	// emitted before it.
	for _, c := range g.calcs {
		c.recompute()
	}
	if sized {
		// Emptied by recompute but still the size of the batch (a page that dirtied few
		// destinations keeps a set cleared, not replaced): give the room back.
		for _, c := range g.calcs {
			if sz, ok := c.(sizer); ok {
				sz.shrink()
			}
		}
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
	if len(batch) < 1024 {
		return false
	}
	b := batchCount{events: len(batch)}
	for i := range batch {
		if k := int(batch[i].Kind); k < len(b.kinds) {
			b.kinds[k]++
		}
	}
	for _, c := range g.calcs {
		if sz, ok := c.(sizer); ok {
			sz.expect(b)
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
		hand(g.pools, ev.ID, asType[*store.IPPool](obj), g.poolLs, poolListener.onPool)
	case store.KindNode:
		hand(g.nodes, ev.ID, asType[*store.Node](obj), g.nodeLs, nodeListener.onNode)
	case store.KindBlock:
		if cidr, err := netip.ParsePrefix(ev.ID); err == nil {
			hand(g.blocks, cidr, asType[*store.Block](obj), g.blockLs, blockListener.onBlock)
		}
	case store.KindBlockAffinity:
		hand(g.affinities, ev.ID, asType[*store.BlockAffinity](obj), g.affinityLs, affinityListener.onAffinity)
	case store.KindWorkloadEndpoint:
		hand(g.weps, ev.ID, asType[*store.WorkloadEndpoint](obj), g.wepLs, wepListener.onWEP)
	case store.KindService:
		for _, l := range g.serviceLs {
			l.onService(ev.ID, asType[*store.Service](obj))
		}
	case store.KindEndpointSlice:
		for _, l := range g.sliceLs {
			l.onSlice(ev.ID, asType[*store.EndpointSlice](obj))
		}
	case store.KindBGPConfiguration:
		if !g.cfg.BGP {
			return
		}
		c := asType[*store.BGPConfiguration](obj)
		put(g.bgpConfigs, ev.ID, c)
		for _, l := range g.bgpCfgLs {
			l.onBGPConfig(ev.ID, c)
		}
	case store.KindBGPPeer:
		for _, l := range g.bgpPeerLs {
			l.onBGPPeer(ev.ID, asType[*store.BGPPeer](obj))
		}
	}
}

// hand puts v in the inputs at k and hands the change (as it was, as it is) to ls.
func hand[K comparable, V any, L any](m map[K]*V, k K, v *V, ls []L, on func(L, K, *V, *V)) {
	old := m[k]
	put(m, k, v)
	for _, l := range ls {
		on(l, k, old, v)
	}
}

// put sets m[k] to v, or deletes k when v is nil.
func put[K comparable, V any](m map[K]*V, k K, v *V) {
	if v == nil {
		delete(m, k)
		return
	}
	m[k] = v
}

func asType[T store.Object](o store.Object) T {
	t, _ := o.(T)
	return t
}

// Vacant says whether a is an address of the pools that no workload and no node's tunnel
// holds, once the graph is in sync: nothing there answers (the node whose block holds it
// drops what is sent to it). False for any other address, which may answer.
func (g *Graph) Vacant(a netip.Addr) bool { return g.routes.vacant(a) }

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

// batchCount is how many events a large batch holds, in all and by kind: what the
// calculators size their dirty sets by. A count, not the batch: handed to an interface, the
// batch would escape to the heap at every call of OnEvents.
type batchCount struct {
	events int
	kinds  [store.KindSlots]int
}

// of is how many of the batch's events are of the kinds given.
func (b batchCount) of(kinds ...store.Kind) int {
	n := 0
	for _, k := range kinds {
		n += b.kinds[k]
	}
	return n
}
