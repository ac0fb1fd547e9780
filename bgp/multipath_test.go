package bgp

import (
	"net/netip"
	"slices"
	"testing"
)

// TestMultipathSets: a prefix's set follows GoBGP's per-path changes (joined, next hop
// changed, left), up to any number of paths, and this node's own path in it withdraws it.
func TestMultipathSets(t *testing.T) {
	a, b, c, d := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.4")
	p := netip.MustParsePrefix("10.80.0.0/26")
	m := newMultipaths()
	steps := []struct {
		what      string
		peer, nh  netip.Addr
		withdrawn bool
		want      []netip.Addr
	}{
		{"a path", a, a, false, []netip.Addr{a}},
		{"an equal path", b, b, false, []netip.Addr{a, b}},
		{"a third and a fourth (beyond the two in place)", c, c, false, []netip.Addr{a, b, c}},
		{"the fourth", d, d, false, []netip.Addr{a, b, c, d}},
		{"the first leaves", a, a, true, []netip.Addr{b, c, d}},
		{"a path changes its next hop", c, a, false, []netip.Addr{a, b, d}},
		{"two leave", b, b, true, []netip.Addr{a, d}},
		{"", d, d, true, []netip.Addr{a}},
		{"this node's own joins", netip.Addr{}, netip.Addr{}, false, nil},
		{"and leaves", netip.Addr{}, netip.Addr{}, true, []netip.Addr{a}},
		{"the last leaves", c, a, true, nil},
		{"a withdrawal of what is not there", a, a, true, nil},
	}
	for _, s := range steps {
		m.set(p, s.peer, s.nh, s.withdrawn)
		if got := m.hops(p); !slices.Equal(got, s.want) {
			t.Fatalf("%s: %v, want %v", s.what, got, s.want)
		}
	}
	if len(m.sets) != 0 {
		t.Fatalf("an empty set stays: %v", m.sets)
	}
	if len(m.paths) != 6 {
		t.Fatalf("%d paths numbered, want 6 (four peers, a changed next hop, this node's own)", len(m.paths))
	}
}
