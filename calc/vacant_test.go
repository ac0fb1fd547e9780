package calc_test

import (
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// TestVacant: an address of the pools that no workload (by its own address or a wider
// network of its) and no node's tunnel holds is vacant, and only once the graph is in sync;
// an address outside the pools (a node's, a host-network endpoint's, one outside the cluster)
// never is. The service stage ends connections to a removed endpoint at a vacant address
// (#36).
func TestVacant(t *testing.T) {
	g, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	ev := func(o store.Object, id string) store.Event {
		return store.Event{Type: store.EventUpsert, Kind: o.Kind(), ID: id, Object: o}
	}
	wep := func(name string, nets ...string) *store.WorkloadEndpoint {
		w := &store.WorkloadEndpoint{Namespace: "ns", Name: name, Node: "node-b", InterfaceName: "cali" + name}
		for _, n := range nets {
			w.IPNetworks = append(w.IPNetworks, netip.MustParsePrefix(n))
		}
		return w
	}
	pool := &store.IPPool{Name: "pool", CIDR: netip.MustParsePrefix("10.65.0.0/16"), VXLANMode: store.EncapAlways, BlockSize: 26}
	node := &store.Node{Name: "node-b", IPv4Address: netip.MustParsePrefix("192.0.2.12/24"), IPv4VXLANTunnelAddr: netip.MustParseAddr("10.65.0.1")}
	a := netip.MustParseAddr
	g.OnEvents([]store.Event{ev(pool, "pool"), ev(node, "node-b"), ev(wep("web", "10.65.0.5/32"), "ns/node--b-k8s-web-eth0"),
		ev(wep("wide", "10.65.1.0/30"), "ns/node--b-k8s-wide-eth0")})
	if g.Vacant(a("10.65.0.9")) {
		t.Error("vacant before the graph is in sync")
	}
	g.OnEvents([]store.Event{{Type: store.EventInSync}})
	for addr, want := range map[string]bool{
		"10.65.0.5":   false, // a workload's
		"10.65.0.9":   true,  // nobody's
		"10.65.1.2":   false, // inside a workload's wider network
		"10.65.1.4":   true,
		"10.65.0.1":   false, // a node's tunnel address
		"192.0.2.12":  false, // a node's own, outside the pools
		"203.0.113.9": false, // outside the cluster
	} {
		if got := g.Vacant(a(addr)); got != want {
			t.Errorf("Vacant(%s) = %v; want %v", addr, got, want)
		}
	}
	// The workload deleted: its address is vacant.
	g.OnEvents([]store.Event{{Type: store.EventDelete, Kind: store.KindWorkloadEndpoint, ID: "ns/node--b-k8s-web-eth0"}})
	if !g.Vacant(a("10.65.0.5")) {
		t.Error("a deleted workload's address is not vacant")
	}
}
