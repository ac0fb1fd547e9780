package calc_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// TestNodeAddressClash: node-b and node-c claim 192.0.2.12 (node-c written first); node-b wins
// and the clash is reported in the full update. Once node-b moves away the problem is gone
// from the state; when it comes back the clash is reported again.
func TestNodeAddressClash(t *testing.T) {
	batches := readBatches(t, "../testdata/calc/node-address-clash/events.jsonl")
	if len(batches) != 4 {
		t.Fatalf("%d batches, want 4", len(batches))
	}
	g, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	clash := calc.Problem{Key: "node-address/192.0.2.12/32", Reason: "claimed by nodes node-b, node-c; node-b wins"}
	var updates []*calc.Update
	for _, b := range batches {
		updates = append(updates, g.OnEvents(b))
		if has := slices.Contains(g.State().Problems, clash); has != (len(updates) != 2 && len(updates) != 3) {
			t.Fatalf("after batch %d the state's problems are %v", len(updates), g.State().Problems)
		}
	}
	if !slices.Contains(updates[0].Problems, clash) {
		t.Fatalf("the full update reports %v, want the clash", updates[0].Problems)
	}
	if slices.Contains(updates[1].Problems, clash) || slices.Contains(updates[2].Problems, clash) {
		t.Fatal("the clash is reported while only one node claims the address")
	}
	if !slices.Contains(updates[3].Problems, clash) {
		t.Fatalf("the clash is not reported again: %v", updates[3].Problems)
	}
}

// TestClusterNetOps: a node moving address removes its old cluster net and sets the new one
// in one update, with the new one set after the VTEP and the old one removed last; a frontend
// whose backend is on that node is set again with the new NodeAddr.
func TestClusterNetOps(t *testing.T) {
	batches := readBatches(t, "../testdata/calc/node-address-moved/events.jsonl")
	g, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	g.OnEvents(batches[0])
	u := g.OnEvents(batches[1])
	if u == nil || u.Full {
		t.Fatalf("moving node-b gave %+v, want a delta", u)
	}
	var got []string
	moved := netip.MustParseAddr("198.51.100.12")
	backendMoved := false
	for _, op := range u.Ops {
		switch {
		case op.VTEP != nil:
			got = append(got, "vtep")
		case op.ClusterNet != nil && op.Remove:
			got = append(got, "-net "+op.ClusterNet.String())
		case op.ClusterNet != nil:
			got = append(got, "+net "+op.ClusterNet.String())
		case op.Frontend != nil && !op.Remove:
			got = append(got, "frontend")
			for _, b := range op.Frontend.Backends {
				backendMoved = backendMoved || (b.Node == "node-b" && b.NodeAddr == moved)
			}
		default:
			t.Fatalf("unexpected op %+v", op)
		}
	}
	want := []string{"vtep", "+net 198.51.100.12/32 node node-b", "frontend", "frontend", "frontend", "frontend", "-net 192.0.2.12/32 node node-b"}
	if !slices.Equal(got, want) {
		t.Fatalf("ops %q, want %q", got, want)
	}
	if !backendMoved {
		t.Fatal("no frontend carries node-b's new address")
	}
	// Node-c's change of MAC alone touches no service and no cluster net.
	n := &store.Node{Name: "node-c", IPv4Address: netip.MustParsePrefix("198.51.100.13/24"), IPv4VXLANTunnelAddr: netip.MustParseAddr("10.65.0.128"),
		VXLANTunnelMAC: []byte{0x66, 0, 0, 0, 0, 0x0c}}
	u = g.OnEvents([]store.Event{up(n)})
	if u == nil || len(u.Ops) != 1 || u.Ops[0].VTEP == nil {
		t.Fatalf("a new MAC gave %+v, want only the VTEP", u)
	}
}

// TestConfigChoices: an empty choice takes its default; an unknown one is refused, naming
// the setting, the value and what is wanted.
func TestConfigChoices(t *testing.T) {
	g, err := calc.New(calc.Config{NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	if c := g.Config(); c.RouteSource != calc.SourceCalicoIPAM || c.NATOutgoingExclusions != calc.NATExcludePools || c.BlackholeType != calc.RouteBlackhole {
		t.Fatalf("defaults: %+v", c)
	}
	for _, c := range []struct {
		cfg  calc.Config
		want string
	}{
		{calc.Config{NodeName: "node-a", RouteSource: "BGP"}, `calc: route source "BGP": want CalicoIPAM or WorkloadIPs`},
		{calc.Config{NodeName: "node-a", NATOutgoingExclusions: "All"}, `calc: natOutgoingExclusions "All": want IPPoolsOnly or IPPoolsAndHostIPs`},
		{calc.Config{NodeName: "node-a", BlackholeType: "drop"}, `calc: blackhole type "drop": want blackhole, unreachable or prohibit`},
	} {
		if _, err := calc.New(c.cfg); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %s", c.cfg, err, c.want)
		}
	}
}
