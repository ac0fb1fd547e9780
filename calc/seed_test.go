package calc_test

import (
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/calc"
)

// lookup is the kernel's longest-prefix match over the desired routes.
func lookup(routes []calc.Route, a netip.Addr) (calc.Route, bool) {
	var best calc.Route
	found := false
	for _, r := range routes {
		if r.Dst.Contains(a) && (!found || r.Dst.Bits() > best.Dst.Bits()) {
			best, found = r, true
		}
	}
	return best, found
}

// TestSeed003NothingLeaks: on node-a, every address of its own block either reaches a local
// workload or hits the blackhole: no address of the block falls through to the default route.
func TestSeed003NothingLeaks(t *testing.T) {
	batches := readBatches(t, "../testdata/calc/seed003-blackholes/events.jsonl")
	g, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range batches {
		g.OnEvents(b)
	}
	routes := g.State().Routes
	block := netip.MustParsePrefix("10.65.0.0/26")
	a := block.Addr()
	for range 64 {
		r, ok := lookup(routes, a)
		switch {
		case !ok:
			t.Fatalf("%s has no route: it would leave by the default gateway", a)
		case a == netip.MustParseAddr("10.65.0.1"):
			if r.Device != "cali-web-1" {
				t.Fatalf("%s goes to %v, want the local workload", a, r)
			}
		case r.Type != calc.RouteBlackhole || r.Dst != block:
			t.Fatalf("unassigned %s goes to %v, want the block's blackhole", a, r)
		}
		a = a.Next()
	}
	// Outside the node's blocks but inside the pool, other nodes' blocks are routed; what is
	// in no block is left alone unless pool blackholes are on (the operator's choice).
	if _, ok := lookup(routes, netip.MustParseAddr("10.65.200.1")); ok {
		t.Fatal("an address in no block got a route without pool blackholes")
	}
	cfg := calc.DefaultConfig("node-a")
	cfg.PoolBlackholes = true
	g2, _ := calc.New(cfg)
	for _, b := range batches {
		g2.OnEvents(b)
	}
	r, ok := lookup(g2.State().Routes, netip.MustParseAddr("10.65.200.1"))
	if !ok || r.Type != calc.RouteBlackhole || r.Metric <= cfg.BlackholeMetric {
		t.Fatalf("with pool blackholes, 10.65.200.1 -> %v, want a low-priority blackhole", r)
	}
}
