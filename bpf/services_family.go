package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/tracker"
)

// famMaps is the service driver's state for one address family's maps: the desired and
// actual entries of each (trackers), the backend lists and which frontends hold them. The
// rules are the family's own; what both share (service identities, endpoint sets, problems)
// is the Services' that owns it.
type famMaps[FK, BV, IK, SK, CK comparable] struct {
	s   *Services
	fam family[FK, BV, IK, SK, CK]
	t   famTables[FK, BV, IK, SK, CK]

	fe *tracker.Tracker[FK, FrontendValue]
	// be tracks backend lists, not single entries: a list's identity is a hash of its
	// content, so it is written and removed whole (a cold start handles 10,000 lists where it
	// would handle 100,000 entries). An actual list read with a gap holds a zero entry there.
	be      *tracker.Tracker[uint64, []BV]
	beCount [2]int       // backend entries desired and programmed
	strays  []BackendKey // backend entries read that no list can hold, to delete
	// idxStrays are backend-index entries read that no list's entry names, to delete. The
	// index is part of a list: an entry whose index entry reads wrong is rewritten with it.
	idxStrays []IK
	src       *tracker.Tracker[SK, uint32]
	cnet      *tracker.Tracker[CK, ClusterNetVal]
	fronts    map[FK]wanted // by the frontend's map key (calc's key, encoded: hashed faster)
	// sources are the source-range keys of the frontends that have any.
	sources  map[FK][]SK
	idx      int // the family's index, in idOwner.last
	lists    map[uint64]*list[BV]
	addrOnly map[netip.Addr][]addrHolder // cluster IPs: their frontends and service identities
	beBuf    []BV
	// heldLists counts the frontends in the map (as written or read) pointing at each list:
	// a list is not deleted while one does.
	heldLists map[uint64]int
}

// list is one backend list in the maps, shared by the frontends with the same endpoints.
type list[BV any] struct {
	entries []BV
	refs    int
}

// wanted is what one calc frontend became in the maps (its service's name is its identity
// owner's, in Services.svcIDs).
type wanted struct {
	svcID    uint64
	list     uint64
	live     *liveSet // endpoints named or in use
	addrOnly bool
}

func newFamMaps[FK, BV, IK, SK, CK comparable](s *Services, fam family[FK, BV, IK, SK, CK], t famTables[FK, BV, IK, SK, CK], idx int) *famMaps[FK, BV, IK, SK, CK] {
	m := &famMaps[FK, BV, IK, SK, CK]{s: s, fam: fam, t: t, idx: idx}
	m.reset()
	return m
}

// usable says whether the family's maps are there (a driver over tables without IPv6's, as
// some tests build, programs IPv4 only).
func (m *famMaps[FK, BV, IK, SK, CK]) usable() bool {
	return m.t.Frontends != nil && m.t.Backends != nil && m.t.BackendIndex != nil && m.t.SourceRanges != nil &&
		m.t.ClusterNets != nil
}

func (m *famMaps[FK, BV, IK, SK, CK]) reset() {
	m.fe = tracker.New[FK, FrontendValue](func(a, b FrontendValue) bool { return a == b })
	m.be = tracker.New[uint64, []BV](slices.Equal[[]BV])
	m.beCount = [2]int{}
	m.src = tracker.New[SK, uint32](func(a, b uint32) bool { return a == b })
	m.cnet = tracker.New[CK, ClusterNetVal](func(a, b ClusterNetVal) bool { return a == b })
	m.fronts = map[FK]wanted{}
	m.sources = map[FK][]SK{}
	m.lists = map[uint64]*list[BV]{}
	m.addrOnly = map[netip.Addr][]addrHolder{}
	m.heldLists = map[uint64]int{}
	// A reset is always followed by a fresh read of the maps, which compares every key.
	for _, t := range []interface{ DirtyAll() }{m.fe, m.be, m.src, m.cnet} {
		t.DirtyAll()
	}
}

// expect sizes the empty tables of a reset for nFront frontends and nList lists.
func (m *famMaps[FK, BV, IK, SK, CK]) expect(nFront, nList int) {
	m.fronts = make(map[FK]wanted, nFront)
	m.fe.Expect(nFront + nList) // and the cluster IPs' address-only entries
	m.be.Expect(nList)
	m.lists = make(map[uint64]*list[BV], nList)
	m.addrOnly = make(map[netip.Addr][]addrHolder, nList)
}

func (m *famMaps[FK, BV, IK, SK, CK]) setFrontend(f calc.Frontend) {
	s, pkey := m.s, f.Key
	owner := s.svcIDs[f.ServiceID]
	if owner != nil && owner.service != f.Service {
		s.problems[pkey] = fmt.Sprintf("service identity %016x is already %s's; %s is not programmed", f.ServiceID, owner.service, f.Service)
		s.refused[f.Key] = f
		return
	}
	if owner == nil {
		owner = &idOwner{service: f.Service}
		s.svcIDs[f.ServiceID] = owner
	}
	owner.n++
	w := wanted{svcID: f.ServiceID}
	last := &owner.last
	l, same := last.list.(*list[BV])
	same = same && last.family == m.idx && l.refs > 0 && last.live.refs > 0 && sameList(f.Backends, last.backends) &&
		sameList(f.Present, last.present)
	if same {
		w.list = last.id
	} else {
		w.list, l = m.listFor(f)
	}
	l.refs++
	n := len(l.entries)
	v := FrontendValue{ListId: w.list, SvcId: f.ServiceID, Count: uint32(n), Local: uint32(min(f.LocalBackends, n)),
		ClusterStart: uint32(min(f.ClusterStart, n)), AffinitySec: uint32(f.AffinityTimeout)}
	if f.ExternalLocal {
		v.Flags |= FrontendExternalLocal
	}
	if f.InternalLocal {
		v.Flags |= FrontendInternalLocal
	}
	if f.Kind == calc.FrontendNodePort {
		v.Flags |= FrontendNodePort
	}
	key := m.fam.frontendKey(f.Key)
	if len(f.SourceRanges) > 0 {
		var sources []SK
		for _, p := range f.SourceRanges {
			if !m.fam.is(p.Addr()) {
				continue
			}
			sk := m.fam.srcKey(key, p)
			sources = append(sources, sk)
			m.src.SetDesired(sk, 1)
		}
		if sources != nil {
			m.sources[key] = sources
		}
		// A load balancer limited to the other family's ranges admits no client of this
		// one: the flag stays.
		v.Flags |= FrontendSourceRanges
	}
	m.fe.SetDesired(key, v)
	if f.Kind == calc.FrontendClusterIP {
		w.addrOnly = true
		m.addrOnly[f.Key.Addr] = append(m.addrOnly[f.Key.Addr], addrHolder{key: f.Key, id: f.ServiceID})
		m.setAddrOnly(f.Key.Addr)
	}
	if same {
		last.live.refs++
		w.live = last.live
	} else {
		w.live = s.holdLiveLocked(f)
		*last = lastEndpoints{}
		if _, problem := s.problems[pkey]; !problem {
			*last = lastEndpoints{backends: f.Backends, present: f.Present, id: w.list, list: l, live: w.live, family: m.idx}
		}
	}
	m.fronts[key] = w
}

// listFor returns the backend list f's endpoints make in this family's map, and its
// identity, adding it to the desired lists when no frontend holds it yet. An endpoint that
// cannot be reached is left out, and named in f's problem.
func (m *famMaps[FK, BV, IK, SK, CK]) listFor(f calc.Frontend) (uint64, *list[BV]) {
	s := m.s
	bes := m.beBuf[:0] // cloned only for a new list
	for _, b := range f.Backends {
		if !m.fam.is(b.Addr) {
			continue
		}
		var flags uint16
		node := b.NodeAddr // a remote endpoint's node: the tunnel's far end
		switch {
		case b.Node == s.cfg.NodeName:
			flags, node = BackendLocal, netip.Addr{}
		case b.Node == "":
			// An endpoint on no node (a slice written by hand for an address outside the
			// cluster, as kube-proxy allows) is reached by routing, never by the tunnel.
			flags, node = BackendRouted, netip.Addr{}
		case m.fam.is(b.NodeAddr):
			// A remote endpoint: reached through the tunnel of its family, over its node's
			// underlay address of that family.
		default:
			// A remote endpoint whose node has no address to tunnel to cannot be reached
			// from outside; remote endpoints come last, so dropping it shortens the cluster
			// set only.
			s.problems[f.Key] = fmt.Sprintf("endpoint %s is on node %q, which has no %s address; not used", b.Addr, b.Node, m.fam.name())
			continue
		}
		bes = append(bes, m.fam.backend(b.Addr, b.Port, flags, node))
	}
	m.beBuf = bes
	id := m.fam.listID(bes)
	l := m.lists[id]
	if l == nil {
		bes = slices.Clone(bes)
		l = &list[BV]{entries: bes}
		m.lists[id] = l
		m.be.SetDesired(id, bes)
		m.beCount[0] += len(bes)
	}
	return id, l
}

// setAddrOnly wants the address-only entry of cluster IP a while a cluster-IP frontend
// holds it, naming the service of the lowest such frontend (not the first to come, so the
// entry does not depend on the order of updates).
func (m *famMaps[FK, BV, IK, SK, CK]) setAddrOnly(a netip.Addr) {
	ak := m.fam.addrKey(a)
	holders := m.addrOnly[a]
	if len(holders) == 0 {
		delete(m.addrOnly, a)
		m.fe.DeleteDesired(ak)
		return
	}
	first := holders[0]
	for _, h := range holders[1:] {
		if cmpFrontendKey(h.key, first.key) < 0 {
			first = h
		}
	}
	m.fe.SetDesired(ak, FrontendValue{SvcId: first.id, Flags: FrontendAddrOnly})
}

func (m *famMaps[FK, BV, IK, SK, CK]) removeFrontend(k calc.FrontendKey) {
	key := m.fam.frontendKey(k)
	w, ok := m.fronts[key]
	if !ok {
		return
	}
	s := m.s
	delete(m.fronts, key)
	s.releaseLiveLocked(w.live)
	m.fe.DeleteDesired(key)
	if owner := s.svcIDs[w.svcID]; owner.n > 1 {
		owner.n--
	} else {
		delete(s.svcIDs, w.svcID)
	}
	if l := m.lists[w.list]; l != nil {
		if l.refs--; l.refs == 0 {
			m.be.DeleteDesired(w.list)
			m.beCount[0] -= len(l.entries)
			delete(m.lists, w.list)
		}
	}
	if sources, ok := m.sources[key]; ok {
		delete(m.sources, key)
		for _, sk := range sources {
			m.src.DeleteDesired(sk)
		}
	}
	if w.addrOnly {
		m.addrOnly[k.Addr] = slices.DeleteFunc(m.addrOnly[k.Addr], func(h addrHolder) bool { return h.key == k })
		m.setAddrOnly(k.Addr)
	}
}

func (m *famMaps[FK, BV, IK, SK, CK]) setClusterNet(n calc.ClusterNet, remove bool) {
	k := m.fam.cnetKey(n.Prefix)
	if remove {
		m.cnet.DeleteDesired(k)
		return
	}
	v := ClusterNetVal{Flags: ClusterNetPool}
	if n.Host {
		v.Flags = ClusterNetHost
		if n.Node == m.s.cfg.NodeName {
			v.Flags |= ClusterNetSelf
		}
	}
	m.cnet.SetDesired(k, v)
}

// apply writes the difference between the desired and the actual maps of the family:
// cluster networks, frontends no longer wanted, backend lists, frontends, then the lists and
// source ranges no longer wanted. A failed entry stays pending and the rest goes on.
func (m *famMaps[FK, BV, IK, SK, CK]) apply(fail func(string, error), wrote func()) {
	m.applyClusterNets(fail, wrote)
	// Backend lists and frontends are written in batches: collected from the trackers (as
	// clean), written, then marked (a failed one dirty again). A list with an entry refused
	// is not written whole, and no frontend is pointed at it in this apply.
	lw := &listWriter[FK, BV, IK, SK, CK]{m: m, fail: fail, wrote: wrote, failed: map[uint64]bool{}}
	// Frontends no longer wanted go first, making room in a full map for the new ones.
	m.fe.Pending(func(FK, FrontendValue) tracker.Outcome { return tracker.Later }, m.delFrontend(fail, wrote))
	// Adds first: lists and source ranges exist before the frontends that use them.
	n := min(max(0, m.beCount[0]-m.beCount[1]), writeChunk)
	lw.keys, lw.vals = make([]BackendKey, 0, n), make([]BV, 0, n)
	// Index entries are for long lists only: not sized ahead (100,000 IPv6 index keys zeroed
	// for nothing were a twentieth of a cold start's apply).
	m.be.Pending(lw.collect, func(uint64, []BV) tracker.Outcome { return tracker.Later })
	lw.write()
	setSrc, delSrc := m.srcWriters(fail, wrote)
	m.src.Pending(setSrc, func(SK, uint32) tracker.Outcome { return tracker.Later })
	m.applyFrontends(lw.failed, fail, wrote)
	m.be.Pending(lw.collect, lw.del)
	lw.write()
	m.deleteStrays(fail, wrote)
	m.src.Pending(setSrc, delSrc)
	m.fe.Settle()
	m.be.Settle()
	m.src.Settle()
	m.cnet.Settle()
}

func (m *famMaps[FK, BV, IK, SK, CK]) applyClusterNets(fail func(string, error), wrote func()) {
	m.cnet.Pending(func(k CK, v ClusterNetVal) tracker.Outcome {
		if err := m.t.ClusterNets.Put(k, v); err != nil {
			fail("cluster network "+m.fam.cnetString(k, v), m.s.full1(err, "cluster-nets", m.t.ClusterNets.Max()))
			return tracker.Failed
		}
		m.cnet.SetActual(k, v)
		wrote()
		return tracker.Done
	}, func(k CK, v ClusterNetVal) tracker.Outcome {
		if err := m.t.ClusterNets.Delete(k); err != nil {
			fail("deleting cluster network "+m.fam.cnetString(k, v), err)
			return tracker.Failed
		}
		m.cnet.DeleteActual(k)
		wrote()
		return tracker.Done
	})
}

func (m *famMaps[FK, BV, IK, SK, CK]) srcWriters(fail func(string, error), wrote func()) (set, del func(SK, uint32) tracker.Outcome) {
	set = func(k SK, v uint32) tracker.Outcome {
		if err := m.t.SourceRanges.Put(k, v); err != nil {
			fail("source range "+m.fam.srcString(k), m.s.full1(err, "source-ranges", m.t.SourceRanges.Max()))
			return tracker.Failed
		}
		m.src.SetActual(k, v)
		wrote()
		return tracker.Done
	}
	del = func(k SK, v uint32) tracker.Outcome {
		if err := m.t.SourceRanges.Delete(k); err != nil {
			fail("deleting source range "+m.fam.srcString(k), err)
			return tracker.Failed
		}
		m.src.DeleteActual(k)
		wrote()
		return tracker.Done
	}
	return set, del
}

func (m *famMaps[FK, BV, IK, SK, CK]) delFrontend(fail func(string, error), wrote func()) func(FK, FrontendValue) tracker.Outcome {
	return func(k FK, v FrontendValue) tracker.Outcome {
		if err := m.t.Frontends.Delete(k); err != nil {
			fail("deleting frontend "+m.fam.feString(k, v), err)
			return tracker.Failed
		}
		m.hold(k, v, false)
		m.fe.DeleteActual(k)
		wrote()
		return tracker.Done
	}
}

// applyFrontends writes the frontends wanted, in one batch; none is pointed at a list whose
// writing failed.
func (m *famMaps[FK, BV, IK, SK, CK]) applyFrontends(failedLists map[uint64]bool, fail func(string, error), wrote func()) {
	// Cold: nothing in the map and every wanted frontend about to be written. The tracker then
	// adopts the desired state in one step rather than a SetActual per frontend, and the
	// frontends are written a chunk at a time as they are collected (the tracker, all dirty,
	// is not touched until the end).
	cold := m.fe.ActualLen() == 0
	n := m.fe.DirtyLen()
	if cold {
		n = min(n, writeChunk)
	}
	feKeys, feVals := make([]FK, 0, n), make([]FrontendValue, 0, n)
	var unwritten []FK // a cold start's frontends not written: refused, or their list was
	flush := func() {
		putAll(m.t.Frontends, feKeys, feVals, func(i int) {
			k, v := feKeys[i], feVals[i]
			if cold {
				if v.Flags&FrontendAddrOnly == 0 {
					m.heldLists[v.ListId]++
				}
			} else {
				m.hold(k, v, true)
				m.fe.SetActual(k, v)
			}
			wrote()
		}, func(i int, err error) {
			k, v := feKeys[i], feVals[i]
			if cold {
				unwritten = append(unwritten, k)
			} else {
				m.fe.MarkDirty(k)
			}
			fail(fmt.Sprintf("frontend %s of %s", m.fam.feString(k, v), m.serviceOf(k)), m.s.full1(err, "frontends", m.t.Frontends.Max()))
		})
		feKeys, feVals = feKeys[:0], feVals[:0]
	}
	collect := func(k FK, v FrontendValue) tracker.Outcome {
		if v.Flags&FrontendAddrOnly == 0 && failedLists[v.ListId] {
			fail(fmt.Sprintf("frontend %s", m.fam.feString(k, v)), errors.New("its backend list is not written yet"))
			if cold {
				unwritten = append(unwritten, k)
			}
			return tracker.Failed
		}
		if cold && len(feKeys) == writeChunk {
			flush()
		}
		feKeys, feVals = append(feKeys, k), append(feVals, v)
		return tracker.Assumed // flush marks a refused one dirty again
	}
	m.fe.Pending(collect, m.delFrontend(fail, wrote))
	flush()
	if cold {
		m.fe.AdoptDesired(unwritten...)
	}
}

func (m *famMaps[FK, BV, IK, SK, CK]) deleteStrays(fail func(string, error), wrote func()) {
	for len(m.strays) > 0 {
		k := m.strays[len(m.strays)-1]
		if err := m.t.Backends.Delete(k); err != nil {
			fail(fmt.Sprintf("deleting stray backend %016x #%d", k.ListId, k.Ordinal), err)
			break
		}
		m.strays = m.strays[:len(m.strays)-1]
		wrote()
	}
	for len(m.idxStrays) > 0 {
		k := m.idxStrays[len(m.idxStrays)-1]
		if err := m.t.BackendIndex.Delete(k); err != nil {
			fail("deleting stray backend index "+m.fam.indexString(k), err)
			break
		}
		m.idxStrays = m.idxStrays[:len(m.idxStrays)-1]
		wrote()
	}
}

// listWriter collects the backend entries (and index entries) of the lists pending, writes
// them in batches and marks the lists written or failed.
type listWriter[FK, BV, IK, SK, CK comparable] struct {
	m       *famMaps[FK, BV, IK, SK, CK]
	fail    func(string, error)
	wrote   func()
	failed  map[uint64]bool
	ids     []uint64
	keys    []BackendKey
	vals    []BV
	idxKeys []IK
	idxVals []uint32
}

// writeChunk is how many entries the writers collect before writing them: a buffer that is
// written and refilled stays in the cache, where one of a cold start's 100,000 entries is
// fresh memory, faulted in page by page.
const writeChunk = 1 << 14

func (lw *listWriter[FK, BV, IK, SK, CK]) collect(id uint64, want []BV) tracker.Outcome {
	m, fam := lw.m, lw.m.fam
	if len(lw.keys) > 0 && len(lw.keys)+len(want) > writeChunk {
		lw.flush() // lists are never split between writes
	}
	lw.ids = append(lw.ids, id)
	// Only the entries that differ from the map's are written (a list read back with one
	// wrong entry is mended by one write), each with its index entry.
	have, _ := m.be.Actual(id)
	var index map[IK]uint32 // nil: a short list, not indexed
	if len(want) > AffinityScan {
		index = indexOfFam(fam, id, want)
	}
	if len(have) == 0 && index == nil { // a new short list: every entry, no index
		for i, v := range want {
			lw.keys, lw.vals = append(lw.keys, BackendKey{ListId: id, Ordinal: uint32(i)}), append(lw.vals, v)
		}
		return tracker.Assumed // write marks a refused list dirty again
	}
	var zero BV
	for i, v := range want {
		if i < len(have) && have[i] == v {
			continue
		}
		lw.keys, lw.vals = append(lw.keys, BackendKey{ListId: id, Ordinal: uint32(i)}), append(lw.vals, v)
		// The index entry goes with a new address at i (a gap read is one whose index
		// entry was wrong); a value corrected in place keeps its own.
		moved := i >= len(have) || have[i] == zero || fam.indexKey(id, have[i]) != fam.indexKey(id, v)
		if o, ok := index[fam.indexKey(id, v)]; ok && o == uint32(i) && moved {
			lw.idxKeys, lw.idxVals = append(lw.idxKeys, fam.indexKey(id, v)), append(lw.idxVals, uint32(i))
		}
	}
	return tracker.Assumed
}

func (lw *listWriter[FK, BV, IK, SK, CK]) refused(id uint64, err error) {
	m := lw.m
	if !lw.failed[id] {
		lw.failed[id] = true
		lw.fail(fmt.Sprintf("backend list %016x of %s", id, m.serviceOfList(id)), m.s.full1(err, "backends", m.t.Backends.Max()))
	}
}

// flush writes the entries collected so far.
func (lw *listWriter[FK, BV, IK, SK, CK]) flush() {
	m, fam := lw.m, lw.m.fam
	putAll(m.t.Backends, lw.keys, lw.vals, func(int) { lw.wrote() }, func(i int, err error) { lw.refused(lw.keys[i].ListId, err) })
	putAll(m.t.BackendIndex, lw.idxKeys, lw.idxVals, func(int) { lw.wrote() }, func(i int, err error) { lw.refused(fam.indexList(lw.idxKeys[i]), err) })
	lw.keys, lw.vals, lw.idxKeys, lw.idxVals = lw.keys[:0], lw.vals[:0], lw.idxKeys[:0], lw.idxVals[:0]
}

// write writes what is collected and marks the lists collected written or failed.
func (lw *listWriter[FK, BV, IK, SK, CK]) write() {
	m, fam := lw.m, lw.m.fam
	lw.flush()
	var zero BV
	m.be.ReserveActual(len(lw.ids)) // a cold start's lists, recorded without regrowing the map
	for _, id := range lw.ids {
		if lw.failed[id] {
			m.be.MarkDirty(id)
			continue
		}
		want, _ := m.be.Desired(id)
		have, _ := m.be.Actual(id)
		// A list read longer than wanted (drift) loses its extra entries.
		for i := len(want); i < len(have); i++ {
			if err := m.t.Backends.Delete(BackendKey{ListId: id, Ordinal: uint32(i)}); err != nil {
				lw.fail(fmt.Sprintf("deleting backend %016x #%d", id, i), err)
			}
			if v := have[i]; v != zero && len(have) > AffinityScan && !slices.ContainsFunc(want, func(w BV) bool { return fam.indexKey(id, w) == fam.indexKey(id, v) }) {
				if err := m.t.BackendIndex.Delete(fam.indexKey(id, v)); err != nil {
					lw.fail(fmt.Sprintf("deleting backend index %016x %s", id, fam.beString(BackendKey{ListId: id, Ordinal: uint32(i)}, v)), err)
				}
			}
		}
		m.beCount[1] += len(want) - realEntries(have)
		m.be.SetActual(id, want)
	}
	lw.ids = lw.ids[:0]
}

func (lw *listWriter[FK, BV, IK, SK, CK]) del(id uint64, have []BV) tracker.Outcome {
	m, fam := lw.m, lw.m.fam
	if m.heldLists[id] > 0 {
		return tracker.Later // a frontend in the map still points at it (moving it failed)
	}
	var zero BV
	for i, v := range have {
		if v != zero && len(have) > AffinityScan {
			// The index entry first: one left behind by a failure is a stray the next read
			// deletes, never a pointer into a list half gone.
			if err := m.t.BackendIndex.Delete(fam.indexKey(id, v)); err != nil {
				lw.fail(fmt.Sprintf("deleting backend list %016x", id), err)
				return tracker.Failed
			}
		}
		if err := m.t.Backends.Delete(BackendKey{ListId: id, Ordinal: uint32(i)}); err != nil {
			lw.fail(fmt.Sprintf("deleting backend list %016x", id), err)
			return tracker.Failed
		}
		lw.wrote()
	}
	m.beCount[1] -= realEntries(have)
	m.be.DeleteActual(id)
	return tracker.Done
}

// indexOfFam is the index a list of more than AffinityScan entries wants: each address:port
// at its first ordinal (an endpoint listed twice is found at the first). Gaps have no entry.
func indexOfFam[FK, BV, IK, SK, CK comparable](fam family[FK, BV, IK, SK, CK], id uint64, l []BV) map[IK]uint32 {
	out := make(map[IK]uint32, len(l))
	var zero BV
	for i, v := range l {
		if k := fam.indexKey(id, v); v != zero {
			if _, ok := out[k]; !ok {
				out[k] = uint32(i)
			}
		}
	}
	return out
}

// realEntries counts the entries of an actual list that the map holds (not its gaps).
func realEntries[BV comparable](l []BV) int {
	n := 0
	var zero BV
	for _, v := range l {
		if v != zero {
			n++
		}
	}
	return n
}

// hold records that the frontend map now holds v at k (held) or nothing, before the
// tracker's actual value changes: the lists that frontends in the map point at are counted.
func (m *famMaps[FK, BV, IK, SK, CK]) hold(k FK, v FrontendValue, held bool) {
	if old, ok := m.fe.Actual(k); ok && old.Flags&FrontendAddrOnly == 0 {
		if m.heldLists[old.ListId]--; m.heldLists[old.ListId] <= 0 {
			delete(m.heldLists, old.ListId)
		}
	}
	if held && v.Flags&FrontendAddrOnly == 0 {
		m.heldLists[v.ListId]++
	}
}

func (m *famMaps[FK, BV, IK, SK, CK]) serviceOf(k FK) string {
	if w, ok := m.fronts[k]; ok {
		return "service " + m.s.svcIDs[w.svcID].service
	}
	for a, holders := range m.addrOnly {
		if len(holders) > 0 && k == m.fam.addrKey(a) {
			return "service " + m.s.svcIDs[holders[0].id].service
		}
	}
	return "no service"
}

func (m *famMaps[FK, BV, IK, SK, CK]) serviceOfList(id uint64) string {
	for _, w := range m.fronts {
		if w.list == id {
			return "service " + m.s.svcIDs[w.svcID].service
		}
	}
	return "no service"
}

// read reads the family's maps into the trackers: adoption after a restart (what matches is
// kept, only the difference is written) and drift repair.
func (m *famMaps[FK, BV, IK, SK, CK]) read() error {
	name := m.fam.name()
	known := m.fe.Knows() // not a restart's first read, nor the first after a full update
	fe, err := m.t.Frontends.Dump()
	if err != nil {
		return fmt.Errorf("reading the %s frontend map: %w", name, err)
	}
	be, err := m.t.Backends.Dump()
	if err != nil {
		return fmt.Errorf("reading the %s backend map: %w", name, err)
	}
	src, err := m.t.SourceRanges.Dump()
	if err != nil {
		return fmt.Errorf("reading the %s source-range map: %w", name, err)
	}
	cn, err := m.t.ClusterNets.Dump()
	if err != nil {
		return fmt.Errorf("reading the %s cluster-network map: %w", name, err)
	}
	clear(m.heldLists)
	for _, v := range fe {
		if v.Flags&FrontendAddrOnly == 0 {
			m.heldLists[v.ListId]++
		}
	}
	drift := map[string]int{"frontends": m.fe.ReplaceActual(fe)}
	lists := map[uint64][]BV{}
	m.strays = m.strays[:0]
	var zero BV
	for k, v := range be {
		if want := m.lists[k.ListId]; k.Ordinal >= uint32(len(be)) && (want == nil || int(k.Ordinal) >= len(want.entries)) {
			// No list written by a driver has an entry this far (the map holds fewer entries
			// than the ordinal, and no wanted list is that long): removed at the next apply.
			// A wanted list's entry is kept however few entries were read (a list that lost
			// some still holds its last).
			m.strays = append(m.strays, k)
			continue
		}
		l := lists[k.ListId]
		for uint32(len(l)) <= k.Ordinal {
			l = append(l, zero)
		}
		l[k.Ordinal] = v
		lists[k.ListId] = l
	}
	// A list's entry counts as written only with its index entry right (the first ordinal
	// of its address); one that is not is read as a gap, and rewritten with its index.
	idx, err := m.t.BackendIndex.Dump()
	if err != nil {
		return fmt.Errorf("reading the %s backend index map: %w", name, err)
	}
	// Index entries in use: those of the lists read and of the lists wanted (a list read with
	// gaps or short still owns its entries: the apply rewrites them, and must not then delete
	// them as strays).
	named := make(map[IK]bool, len(idx))
	for id, l := range m.lists {
		if len(l.entries) > AffinityScan {
			for k := range indexOfFam(m.fam, id, l.entries) {
				named[k] = true
			}
		}
	}
	blanked := 0
	for id, l := range lists {
		length := len(l)
		if want := m.lists[id]; want != nil {
			length = len(want.entries) // drift may have cut the list read short
		}
		if length <= AffinityScan {
			continue
		}
		for k, o := range indexOfFam(m.fam, id, l) {
			named[k] = true
			if got, ok := idx[k]; !ok || got != o {
				l[o] = zero
				blanked++
			}
		}
	}
	m.idxStrays = m.idxStrays[:0]
	for k := range idx {
		if !named[k] {
			m.idxStrays = append(m.idxStrays, k)
		}
	}
	// Lists are compared whole (a list with an entry or its index entry changed is one), and
	// every stray entry is one: none was written by a driver. What a tracker did not know
	// (a restart's first read) is none.
	// An empty list (a service without endpoints yet, a node port of the family its endpoints
	// lack) is no entry in the map: the map holds every wanted one.
	for id, l := range m.lists {
		if _, read := lists[id]; !read && len(l.entries) == 0 {
			lists[id] = nil
		}
	}
	drift["backends"] = m.be.ReplaceActual(lists)
	drift["source_ranges"] = m.src.ReplaceActual(src)
	drift["cluster_nets"] = m.cnet.ReplaceActual(cn)
	if known {
		drift["backends"] += len(m.strays)
		drift["backend_index"] = len(m.idxStrays)
	}
	for table, n := range drift {
		if n > 0 {
			m.s.stats.Drift += int64(n)
			m.s.driftBy[name+" "+table] += n
		}
	}
	m.beCount[1] = len(be) - len(m.strays) - blanked
	return nil
}

// counts adds the family's desired and programmed entries to c (named as in TableNames).
// diff lists what the family's trackers hold as different after a read: frontends (and
// address-only entries), backend lists, source ranges and cluster nets.
func (m *famMaps[FK, BV, IK, SK, CK]) diff(missing, extra *[]string) {
	name := m.fam.name()
	m.fe.Differences(func(k FK, want, have FrontendValue, held bool) {
		line := name + " frontend " + m.fam.feString(k, want)
		if held {
			line += " (has " + m.fam.feString(k, have) + ")"
		}
		*missing = append(*missing, line)
	}, func(k FK, have FrontendValue) { *extra = append(*extra, name+" frontend "+m.fam.feString(k, have)) })
	m.be.Differences(func(id uint64, want, have []BV, held bool) {
		line := fmt.Sprintf("%s backend list %016x (%d backends)", name, id, len(want))
		if held {
			line += fmt.Sprintf(" (has %d, other)", len(have))
		}
		*missing = append(*missing, line)
	}, func(id uint64, have []BV) {
		*extra = append(*extra, fmt.Sprintf("%s backend list %016x (%d backends)", name, id, len(have)))
	})
	m.src.Differences(func(k SK, _, _ uint32, _ bool) { *missing = append(*missing, name+" source range "+m.fam.srcString(k)) },
		func(k SK, _ uint32) { *extra = append(*extra, name+" source range "+m.fam.srcString(k)) })
	m.cnet.Differences(func(k CK, want, have ClusterNetVal, held bool) {
		line := name + " cluster net " + m.fam.cnetString(k, want)
		if held {
			line += " (has " + m.fam.cnetString(k, have) + ")"
		}
		*missing = append(*missing, line)
	}, func(k CK, have ClusterNetVal) {
		*extra = append(*extra, name+" cluster net "+m.fam.cnetString(k, have))
	})
}

func (m *famMaps[FK, BV, IK, SK, CK]) counts(c map[string][2]int) {
	add := func(name string, d, a int) {
		v := c[name]
		c[name] = [2]int{v[0] + d, v[1] + a}
	}
	add("frontends", m.fe.DesiredLen(), m.fe.ActualLen())
	add("backends", m.beCount[0], m.beCount[1])
	add("source_ranges", m.src.DesiredLen(), m.src.ActualLen())
	add("cluster_nets", m.cnet.DesiredLen(), m.cnet.ActualLen())
}

// sameList says whether a and b hold the same elements: at once when they are one slice (calc
// gives a port's frontends of one family and policy the same lists), else compared.
func sameList[T comparable](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0] || slices.Equal(a, b))
}
