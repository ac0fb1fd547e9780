package calc_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// TestUnroutableBlocksAreProblems: a remote block that gets no route is a problem naming the
// block and why (node unknown, no address, no tunnel address, VXLAN off, no pool), reported
// once when it appears, and gone from the state once the block is routed or deleted.
func TestUnroutableBlocksAreProblems(t *testing.T) {
	pool := func(name, cidr, vxlan string) store.Event {
		return upsert(t, store.IPPoolPrefix+name, fmt.Sprintf(`{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"cidr":%q,"vxlanMode":%q,"ipipMode":"Never"}}`, name, cidr, vxlan))
	}
	node := func(name, spec string) store.Event {
		return upsert(t, store.NodePrefix+name, fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":%s}`, name, spec))
	}
	block := func(cidr, node string) store.Event {
		key := store.BlockKey(netip.MustParsePrefix(cidr))
		return upsert(t, key, fmt.Sprintf(`{"cidr":%q,"affinity":"host:%s","allocations":[%s],"unallocated":[],"attributes":[],"deleted":false}`,
			cidr, node, strings.TrimSuffix(strings.Repeat("null,", 64), ",")))
	}
	del := func(e store.Event) store.Event {
		return store.Event{Type: store.EventDelete, Kind: e.Kind, ID: e.ID, Key: e.Key}
	}
	const (
		full   = `{"bgp":{"ipv4Address":"192.0.2.12/24"},"ipv4VXLANTunnelAddr":"10.65.0.64"}`
		noTun  = `{"bgp":{"ipv4Address":"192.0.2.13/24"}}`
		noAddr = `{"ipv4VXLANTunnelAddr":"10.65.0.192"}`
	)
	g, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	problems := func() string {
		var out []string
		for _, p := range g.State().Problems {
			if strings.HasPrefix(p.Key, "block/") {
				out = append(out, p.Key+": "+p.Reason)
			}
		}
		return strings.Join(out, "\n")
	}
	u := g.OnEvents([]store.Event{
		pool("vx", "10.65.0.0/16", "Always"),
		node("node-a", `{"bgp":{"ipv4Address":"192.0.2.11/24"},"ipv4VXLANTunnelAddr":"10.65.0.1"}`),
		node("node-b", full), node("node-c", noTun), node("node-d", noAddr),
		block("10.65.0.64/26", "node-b"), block("10.65.0.128/26", "node-c"), block("10.65.0.192/26", "node-d"),
		block("10.65.1.0/26", "node-gone"), block("10.99.0.0/26", "node-b"),
		{Type: store.EventInSync},
	})
	want := `block/10.65.0.128/26: block of node node-c gets no route: node node-c has no IPv4 VXLAN tunnel address (spec.ipv4VXLANTunnelAddr)
block/10.65.0.192/26: block of node node-d gets no route: node node-d has no IPv4 address (spec.bgp.ipv4Address or spec.addresses)
block/10.65.1.0/26: block of node node-gone gets no route: node node-gone is not in etcd (no /calico/resources/v3/projectcalico.org/nodes/node-gone)
block/10.99.0.0/26: block of node node-b gets no route: it is in no IP pool`
	if got := problems(); got != want {
		t.Fatalf("problems:\n%s\nwant:\n%s", got, want)
	}
	if n := countBlockProblems(u.Problems); n != 4 {
		t.Fatalf("the full update reports %d block problems, want 4: %v", n, u.Problems)
	}
	// node-c gets its tunnel address, node-gone's block goes: both problems go, nothing new is
	// reported, the others stay.
	u = g.OnEvents([]store.Event{node("node-c", `{"bgp":{"ipv4Address":"192.0.2.13/24"},"ipv4VXLANTunnelAddr":"10.65.0.128"}`), del(block("10.65.1.0/26", "node-gone"))})
	want = `block/10.65.0.192/26: block of node node-d gets no route: node node-d has no IPv4 address (spec.bgp.ipv4Address or spec.addresses)
block/10.99.0.0/26: block of node node-b gets no route: it is in no IP pool`
	if got := problems(); got != want {
		t.Fatalf("problems after the fixes:\n%s\nwant:\n%s", got, want)
	}
	if countBlockProblems(u.Problems) != 0 {
		t.Fatalf("fixes reported as problems: %v", u.Problems)
	}
	// node-b loses its tunnel address: its block is a problem now, reported once.
	u = g.OnEvents([]store.Event{node("node-b", `{"bgp":{"ipv4Address":"192.0.2.12/24"}}`)})
	if n := countBlockProblems(u.Problems); n != 1 || !strings.Contains(u.Problems[0].Reason, "node node-b has no IPv4 VXLAN tunnel address") {
		t.Fatalf("update after node-b lost its tunnel address: %v", u.Problems)
	}
	u = g.OnEvents([]store.Event{node("node-b", `{"bgp":{"ipv4Address":"192.0.2.12/24"}}`)})
	if u != nil && countBlockProblems(u.Problems) != 0 {
		t.Fatalf("the same problem reported again: %v", u.Problems)
	}
	// With VXLAN off, VXLAN pools' remote blocks say so.
	cfg := calc.DefaultConfig("node-a")
	cfg.VXLAN = false
	g2, _ := calc.New(cfg)
	g2.OnEvents([]store.Event{pool("vx", "10.65.0.0/16", "Always"), node("node-b", full), block("10.65.0.64/26", "node-b"), {Type: store.EventInSync}})
	if ps := g2.State().Problems; !slices.ContainsFunc(ps, func(p calc.Problem) bool {
		return p.Key == "block/10.65.0.64/26" && strings.HasSuffix(p.Reason, "it needs VXLAN (pool vx) and VXLAN is off (option vxlan)")
	}) {
		t.Fatalf("VXLAN off: %v", ps)
	}
}

func countBlockProblems(ps []calc.Problem) int {
	n := 0
	for _, p := range ps {
		if strings.HasPrefix(p.Key, "block/") {
			n++
		}
	}
	return n
}

// TestUnroutableWorkloadsAreProblems: a remote workload's address that needs a route of its own
// (borrowed from another node's block, or with routes from workloads as in OpenStack) and
// cannot get one is a problem naming the workload and why; it goes once the node is fixed.
func TestUnroutableWorkloadsAreProblems(t *testing.T) {
	wep := func(name, node, addr string) store.Event {
		return upsert(t, store.WorkloadEndpointPrefix+"openstack/"+name, fmt.Sprintf(`{"kind":"WorkloadEndpoint","apiVersion":"projectcalico.org/v3","metadata":{"name":%q,"namespace":"openstack"},"spec":{"orchestrator":"openstack","node":%q,"interfaceName":"tap%s","ipNetworks":[%q]}}`, name, node, name, addr+"/32"))
	}
	nodeEv := func(name, spec string) store.Event {
		return upsert(t, store.NodePrefix+name, fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":%s}`, name, spec))
	}
	cfg := calc.DefaultConfig("compute-1")
	cfg.RouteSource = calc.SourceWorkloadIPs
	g, err := calc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.OnEvents([]store.Event{
		upsert(t, store.IPPoolPrefix+"os", `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"os"},"spec":{"cidr":"10.70.0.0/16","vxlanMode":"Always","ipipMode":"Never"}}`),
		nodeEv("compute-1", `{"bgp":{"ipv4Address":"192.0.2.21/24"},"ipv4VXLANTunnelAddr":"10.70.0.1"}`),
		nodeEv("compute-2", `{"bgp":{"ipv4Address":"192.0.2.22/24"}}`),
		wep("vm1", "compute-2", "10.70.0.5"),
		{Type: store.EventInSync},
	})
	want := calc.Problem{Key: "workload/10.70.0.5/32", Reason: "workload openstack/vm1 (address 10.70.0.5) on node compute-2 gets no route: node compute-2 has no IPv4 VXLAN tunnel address (spec.ipv4VXLANTunnelAddr)"}
	if ps := g.State().Problems; !slices.Contains(ps, want) {
		t.Fatalf("problems %v, want %v", ps, want)
	}
	g.OnEvents([]store.Event{nodeEv("compute-2", `{"bgp":{"ipv4Address":"192.0.2.22/24"},"ipv4VXLANTunnelAddr":"10.70.0.2"}`)})
	if ps := g.State().Problems; len(ps) != 0 {
		t.Fatalf("problems once compute-2 has its tunnel address: %v", ps)
	}
}

// TestUnroutableBeforeInSync: a block read before its node (etcd's order) is not a problem
// while the read goes on; at in-sync, the blocks still without a route are, and only those.
func TestUnroutableBeforeInSync(t *testing.T) {
	blockEv := func(cidr, node string) store.Event {
		return upsert(t, store.BlockKey(netip.MustParsePrefix(cidr)), fmt.Sprintf(`{"cidr":%q,"affinity":"host:%s","allocations":[%s],"unallocated":[],"attributes":[],"deleted":false}`,
			cidr, node, strings.TrimSuffix(strings.Repeat("null,", 64), ",")))
	}
	nodeEv := func(name, spec string) store.Event {
		return upsert(t, store.NodePrefix+name, fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":%s}`, name, spec))
	}
	g, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	g.OnEvents([]store.Event{
		upsert(t, store.IPPoolPrefix+"vx", `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"vx"},"spec":{"cidr":"10.65.0.0/16","vxlanMode":"Always","ipipMode":"Never"}}`),
		blockEv("10.65.0.64/26", "node-b"), blockEv("10.65.1.0/26", "node-gone"),
	})
	if n := g.ProblemCount(); n != 0 {
		t.Fatalf("%d problems before in-sync, with the nodes not read yet; want none", n)
	}
	g.OnEvents([]store.Event{
		nodeEv("node-a", `{"bgp":{"ipv4Address":"192.0.2.11/24"},"ipv4VXLANTunnelAddr":"10.65.0.1"}`),
		nodeEv("node-b", `{"bgp":{"ipv4Address":"192.0.2.12/24"},"ipv4VXLANTunnelAddr":"10.65.0.64"}`),
	})
	u := g.OnEvents([]store.Event{{Type: store.EventInSync}})
	var got []string
	for _, p := range u.Problems {
		got = append(got, p.Key)
	}
	if !slices.Equal(got, []string{"block/10.65.1.0/26"}) || g.ProblemCount() != 1 {
		t.Fatalf("problems at in-sync %v (%d in all); want only block/10.65.1.0/26", got, g.ProblemCount())
	}
}
