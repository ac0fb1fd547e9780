package bgp

import (
	"net/netip"
	"slices"
)

// multipaths holds each learned prefix's multipath set (its best path and those equal to it)
// as GoBGP reports it, path by path: calc takes the set's next hops.
//
// A set holds numbers, not addresses: a fleet's paths are few distinct (peer, next hop)
// pairs, numbered once, and a set of one or two paths (one or two top-of-rack routers) fits
// in the map's slot without an allocation of its own: 20,000 prefixes cost about 1 MiB, not
// the 2.6 MiB of a slice of addresses each (BenchmarkBGPLearned's heap profile).
type multipaths struct {
	sets  map[netip.Prefix]pathSet
	paths []mpPath           // by pathRef-1
	refs  map[mpPath]pathRef // and back
}

// mpPath is one path: the peer it came from (an invalid address: this node's own) and its
// next hop.
type mpPath struct {
	peer, nextHop netip.Addr
}

// pathRef numbers an mpPath (0: none).
type pathRef uint32

// pathSet is a prefix's set: up to two paths in place, the others beyond.
type pathSet struct {
	a, b pathRef
	more *[]pathRef
}

func newMultipaths() *multipaths {
	return &multipaths{sets: map[netip.Prefix]pathSet{}, refs: map[mpPath]pathRef{}}
}

// list appends the set's paths to buf.
func (ps pathSet) list(buf []pathRef) []pathRef {
	for _, r := range [2]pathRef{ps.a, ps.b} {
		if r != 0 {
			buf = append(buf, r)
		}
	}
	if ps.more != nil {
		buf = append(buf, *ps.more...)
	}
	return buf
}

// setOf is the set of refs.
func setOf(refs []pathRef) pathSet {
	var ps pathSet
	if len(refs) > 0 {
		ps.a = refs[0]
	}
	if len(refs) > 1 {
		ps.b = refs[1]
	}
	if len(refs) > 2 {
		more := slices.Clone(refs[2:])
		ps.more = &more
	}
	return ps
}

func (m *multipaths) ref(p mpPath) pathRef {
	r, ok := m.refs[p]
	if !ok {
		m.paths = append(m.paths, p)
		r = pathRef(len(m.paths))
		m.refs[p] = r
	}
	return r
}

// set records prefix's path from peer (a path joined the set, or changed its next hop);
// with withdrawn, the path left the set.
func (m *multipaths) set(prefix netip.Prefix, peer, nextHop netip.Addr, withdrawn bool) {
	var buf [4]pathRef
	refs := m.sets[prefix].list(buf[:0])
	refs = slices.DeleteFunc(refs, func(r pathRef) bool { return m.paths[r-1].peer == peer })
	if !withdrawn {
		refs = append(refs, m.ref(mpPath{peer: peer, nextHop: nextHop}))
	}
	if len(refs) == 0 {
		delete(m.sets, prefix)
		return
	}
	m.sets[prefix] = setOf(refs)
}

// hops is what calc learns of prefix: its set's next hops, sorted, or none when it has no
// path or this node's own is in it (then the prefix is this node's to announce, not to
// route).
func (m *multipaths) hops(prefix netip.Prefix) []netip.Addr {
	if m == nil {
		return nil
	}
	var buf [4]pathRef
	var out []netip.Addr
	for _, r := range m.sets[prefix].list(buf[:0]) {
		p := m.paths[r-1]
		if !p.peer.IsValid() {
			return nil
		}
		if p.nextHop.IsValid() {
			out = append(out, p.nextHop)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
