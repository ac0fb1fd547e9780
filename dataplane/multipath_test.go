package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"golang.org/x/sys/unix"
)

// Routes BGP learned over two equal paths (two top-of-rack routers) and over one, as calc
// emits them.
var (
	bgpBoth1 = calc.Route{Dst: pfx("10.67.0.0/26"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.1"),
		Multipath: []netip.Addr{ip("192.0.2.2")}, OnLink: true, Reason: calc.ReasonBGP}
	bgpBoth2 = calc.Route{Dst: pfx("10.67.1.0/26"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.1"),
		Multipath: []netip.Addr{ip("192.0.2.2")}, OnLink: true, Reason: calc.ReasonBGP}
	bgpOne = calc.Route{Dst: pfx("10.67.2.0/26"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.1"), OnLink: true, Reason: calc.ReasonBGP}
)

// single is r through its first gateway alone (the other path withdrawn).
func single(r calc.Route) calc.Route {
	r.Multipath = nil
	return r
}

// TestNexthopGroupTransitions: in the nexthop layout, routes over two equal paths go through
// one group object whose members are the single objects of the two gateways, shared with a
// route over one of them; a path withdrawn moves a route onto the member; the group and the
// member nobody needs go after the routes left them.
func TestNexthopGroupTransitions(t *testing.T) {
	states := []struct {
		routes             []calc.Route
		routesWant, nhWant string
		writes             int
	}{
		{[]calc.Route{bgpBoth1, bgpBoth2, bgpOne}, fmt.Sprintf(`10.67.0.0/26 nhid %[3]d proto 83
10.67.1.0/26 nhid %[3]d proto 83
10.67.2.0/26 nhid %[1]d via 192.0.2.1 dev eth0 proto 83 onlink`, id(1), id(2), id(3)), fmt.Sprintf(`id %[1]d via 192.0.2.1 dev eth0 proto 83 onlink
id %[2]d via 192.0.2.2 dev eth0 proto 83 onlink
id %[3]d group %[1]d/%[2]d proto 83`, id(1), id(2), id(3)), 6},
		// One route loses its second path: onto the member, the group stays for the other.
		{[]calc.Route{single(bgpBoth1), bgpBoth2, bgpOne}, fmt.Sprintf(`10.67.0.0/26 nhid %[1]d via 192.0.2.1 dev eth0 proto 83 onlink
10.67.1.0/26 nhid %[3]d proto 83
10.67.2.0/26 nhid %[1]d via 192.0.2.1 dev eth0 proto 83 onlink`, id(1), id(2), id(3)), fmt.Sprintf(`id %[1]d via 192.0.2.1 dev eth0 proto 83 onlink
id %[2]d via 192.0.2.2 dev eth0 proto 83 onlink
id %[3]d group %[1]d/%[2]d proto 83`, id(1), id(2), id(3)), 1},
		// The other too: the group, then its member through 192.0.2.2, are deleted.
		{[]calc.Route{single(bgpBoth1), single(bgpBoth2), bgpOne}, fmt.Sprintf(`10.67.0.0/26 nhid %[1]d via 192.0.2.1 dev eth0 proto 83 onlink
10.67.1.0/26 nhid %[1]d via 192.0.2.1 dev eth0 proto 83 onlink
10.67.2.0/26 nhid %[1]d via 192.0.2.1 dev eth0 proto 83 onlink`, id(1)), fmt.Sprintf(`id %d via 192.0.2.1 dev eth0 proto 83 onlink`, id(1)), 3},
		// The second path is back for both.
		{[]calc.Route{bgpBoth1, bgpBoth2, bgpOne}, fmt.Sprintf(`10.67.0.0/26 nhid %[3]d proto 83
10.67.1.0/26 nhid %[3]d proto 83
10.67.2.0/26 nhid %[1]d via 192.0.2.1 dev eth0 proto 83 onlink`, id(1), id(4), id(5)), fmt.Sprintf(`id %[1]d via 192.0.2.1 dev eth0 proto 83 onlink
id %[2]d via 192.0.2.2 dev eth0 proto 83 onlink
id %[3]d group %[1]d/%[2]d proto 83`, id(1), id(4), id(5)), 4},
		{nil, ``, ``, 6},
	}
	f := fakeNode()
	rt := nexthopTable(f)
	for i, s := range states {
		before := f.Writes
		apply(t, rt, s.routes...)
		if got := f.Render(main); got != s.routesWant {
			t.Fatalf("state %d routes:\n%s\nwant:\n%s", i, got, s.routesWant)
		}
		if got := f.RenderNexthops(); got != s.nhWant {
			t.Fatalf("state %d nexthop objects:\n%s\nwant:\n%s", i, got, s.nhWant)
		}
		if got := f.Writes - before; got != s.writes {
			t.Fatalf("state %d took %d writes, want %d", i, got, s.writes)
		}
	}
	// Other orders end the same.
	for _, order := range [][]int{{4, 3, 2, 1, 0}, {0, 2, 0, 1}, {2, 0, 4, 1}} {
		f := fakeNode()
		rt := nexthopTable(f)
		for _, i := range order {
			apply(t, rt, states[i].routes...)
		}
		last := states[order[len(order)-1]]
		if got := anyIDs(f.Render(main)); got != anyIDs(last.routesWant) {
			t.Fatalf("order %v:\n%s\nwant:\n%s", order, got, last.routesWant)
		}
		if got := f.RenderNexthops(); strings.Count(got, "\n") != strings.Count(last.nhWant, "\n") || strings.Count(got, "group") != strings.Count(last.nhWant, "group") {
			t.Fatalf("order %v objects:\n%s\nwant:\n%s", order, got, last.nhWant)
		}
	}
}

// TestNexthopGroupRestartWritesNothing: a restarted table adopts the members by gateway and
// the group by its members, and writes nothing.
func TestNexthopGroupRestartWritesNothing(t *testing.T) {
	f := fakeNode()
	all := []calc.Route{bgpBoth1, bgpBoth2, bgpOne, nbBlock1}
	apply(t, nexthopTable(f), bgpOne, nbBlock1) // an earlier run numbered them otherwise
	apply(t, nexthopTable(f), all...)
	restartWritesNothing(t, f, all...)
}

// TestNexthopGroupMemberGone: a member deleted by hand (the kernel drops it from the group)
// is put back, and the group with it.
func TestNexthopGroupMemberGone(t *testing.T) {
	f := fakeNode()
	rt := nexthopTable(f)
	apply(t, rt, bgpBoth1, bgpBoth2)
	want, objects := f.Render(main), f.RenderNexthops()
	f.DeleteNexthop(id(2))
	if !strings.Contains(f.RenderNexthops(), fmt.Sprintf("group %d proto", id(1))) {
		t.Fatalf("the fake kernel kept the member in the group:\n%s", f.RenderNexthops())
	}
	rt.QueueResync()
	apply(t, rt, bgpBoth1, bgpBoth2)
	if f.Render(main) != want || f.RenderNexthops() != objects {
		t.Fatalf("after the repair:\n%s\n%s\nwant:\n%s\n%s", f.Render(main), f.RenderNexthops(), want, objects)
	}
}

// TestMultipathGatewaysLayout: in Felix's layout a route over equal paths carries them
// itself (RTA_MULTIPATH); a restart adopts it, a path withdrawn rewrites it.
func TestMultipathGatewaysLayout(t *testing.T) {
	f := fakeNode()
	table := func() *RouteTable { return NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr}) }
	rt := table()
	apply(t, rt, bgpBoth1, bgpOne)
	want := `10.67.0.0/26 proto 83 nexthop via 192.0.2.1 dev eth0 onlink nexthop via 192.0.2.2 dev eth0 onlink
10.67.2.0/26 via 192.0.2.1 dev eth0 proto 83 onlink`
	if got := f.Render(main); got != want {
		t.Fatalf("routes:\n%s\nwant:\n%s", got, want)
	}
	before := f.Writes
	restarted := table()
	apply(t, restarted, bgpBoth1, bgpOne)
	if f.Writes != before {
		t.Fatalf("a restart wrote %d", f.Writes-before)
	}
	apply(t, restarted, single(bgpBoth1), bgpOne)
	if got := f.Render(main); !strings.HasPrefix(got, "10.67.0.0/26 via 192.0.2.1 dev eth0 proto 83 onlink\n") || f.Writes != before+1 {
		t.Fatalf("after a path went (%d writes):\n%s", f.Writes-before, got)
	}
}

// TestMultipathRealKernel: both layouts in a fresh namespace, as iproute2 shows them: a group
// object over two gateways, or a route carrying both; a restart writes nothing; a path
// withdrawn and back.
func TestMultipathRealKernel(t *testing.T) {
	for _, layout := range []struct {
		name     string
		nexthops bool
		routes   string
		objects  string
	}{
		{"nexthops", true, "10.67.0.0/26 nhid %[3]d proto 83\n10.67.1.0/26 nhid %[3]d proto 83\n10.67.2.0/26 nhid %[1]d via 192.0.2.1 dev eth0 proto 83 onlink",
			"id %[1]d via 192.0.2.1 dev eth0 scope link proto 83 onlink \nid %[2]d via 192.0.2.2 dev eth0 scope link proto 83 onlink \nid %[3]d group %[1]d/%[2]d proto 83"},
		{"gateways", false, "10.67.0.0/26 proto 83 nexthop via 192.0.2.1 dev eth0 onlink nexthop via 192.0.2.2 dev eth0 onlink\n" +
			"10.67.1.0/26 proto 83 nexthop via 192.0.2.1 dev eth0 onlink nexthop via 192.0.2.2 dev eth0 onlink\n10.67.2.0/26 via 192.0.2.1 dev eth0 proto 83 onlink", ""},
	} {
		t.Run(layout.name, func(t *testing.T) {
			n := newTestNode(t)
			n.iface("eth0", "192.0.2.11/24")
			k := n.kernel()
			table := func() *RouteTable {
				return NewRouteTable(k, RouteTableConfig{ParentAddr: nodeAddr, Nexthops: layout.nexthops})
			}
			rt := table()
			apply(t, rt, bgpBoth1, bgpBoth2, bgpOne)
			wantRoutes, wantObjects := layout.routes, layout.objects
			if layout.nexthops {
				wantRoutes, wantObjects = fmt.Sprintf(wantRoutes, id(1), id(2), id(3)), fmt.Sprintf(wantObjects, id(1), id(2), id(3))
			}
			if got := n.routes(DefaultRouteProtocol); got != wantRoutes {
				t.Fatalf("routes:\n%s\nwant:\n%s", got, wantRoutes)
			}
			if n.ipNexthops() != wantObjects {
				t.Fatalf("ip nexthop show:\n%q\nwant:\n%q", n.ipNexthops(), wantObjects)
			}
			// iproute2's own view of a multipath route.
			out, err := exec.Command("ip", "-n", n.name, "route", "show", "10.67.0.0/26").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "nexthop via 192.0.2.1 dev eth0 weight 1 onlink") ||
				!strings.Contains(string(out), "nexthop via 192.0.2.2 dev eth0 weight 1 onlink") {
				t.Fatalf("ip route show 10.67.0.0/26: %v\n%s", err, out)
			}
			restarted := table()
			apply(t, restarted, bgpBoth1, bgpBoth2, bgpOne)
			if w := restarted.Writes(); w != 0 {
				t.Fatalf("a restart wrote %d", w)
			}
			apply(t, restarted, single(bgpBoth1), single(bgpBoth2), bgpOne)
			if got := n.routes(DefaultRouteProtocol); strings.Contains(got, "192.0.2.2") || strings.Count(got, "via 192.0.2.1") != 3 {
				t.Fatalf("after the second path went:\n%s", got)
			}
			if layout.nexthops && n.ipNexthops() != fmt.Sprintf("id %d via 192.0.2.1 dev eth0 scope link proto 83 onlink", id(1)) {
				t.Fatalf("objects after the second path went:\n%s", n.ipNexthops())
			}
			apply(t, restarted, bgpBoth1, bgpBoth2, bgpOne)
			back := n.routes(DefaultRouteProtocol)
			if layout.nexthops && (strings.Count(back, "nhid") != 3 || strings.Count(n.ipNexthops(), " group ") != 1) ||
				!layout.nexthops && strings.Count(back, "nexthop via 192.0.2.2") != 2 {
				t.Fatalf("after the second path came back:\n%s\n%s", back, n.ipNexthops())
			}
			apply(t, restarted)
			if got := n.routes(DefaultRouteProtocol); got != "" || (layout.nexthops && n.ipNexthops() != "") {
				t.Fatalf("left behind:\n%s\n%s", got, n.ipNexthops())
			}
		})
	}
}

// TestNexthopGroupMemberIDTakenMeanwhile: a member's ID taken by another program between the
// read and the write: the group is not made over the other program's object, its routes wait,
// and the next apply makes the member elsewhere and the group over it.
func TestNexthopGroupMemberIDTakenMeanwhile(t *testing.T) {
	f := fakeNode()
	rt := nexthopTable(f)
	rt.SetRoute(&bgpBoth1)
	if err := rt.prepare(); err != nil {
		t.Fatal(err)
	}
	f.PutNexthop(Nexthop{ID: id(2), Gw: ip("192.0.2.99"), Link: f.links["eth0"], Protocol: unix.RTPROT_STATIC})
	if err := rt.write(); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("write = %v, want EEXIST", err)
	}
	if got := f.RenderNexthops(); strings.Contains(got, "group") {
		t.Fatalf("a group made over the other program's object:\n%s", got)
	}
	if got := f.Render(main); got != "" {
		t.Fatalf("a route went through it:\n%s", got)
	}
	if err := rt.Apply(); err != nil {
		t.Fatal(err)
	}
	objects := f.RenderNexthops()
	if !strings.Contains(objects, fmt.Sprintf("id %d via 192.0.2.99 dev eth0 proto 4", id(2))) || strings.Count(objects, " group ") != 1 ||
		strings.Contains(objects, fmt.Sprintf("/%d ", id(2))) || strings.Contains(objects, fmt.Sprintf(" %d/", id(2))) {
		t.Fatalf("objects after the retry:\n%s", objects)
	}
	if got := f.Render(main); !strings.HasPrefix(got, "10.67.0.0/26 nhid ") {
		t.Fatalf("route after the retry: %s", got)
	}
}

// TestNexthopGroupRestartWithTwinObjects: a node's object and a group's member with the same
// gateway and device are two kernel objects of one value; a restart adopts both, the member
// the one its group names, and writes nothing.
func TestNexthopGroupRestartWithTwinObjects(t *testing.T) {
	node := calc.Route{Dst: pfx("10.66.0.64/26"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.2"), OnLink: true, Node: "node-c"}
	for _, order := range [][]calc.Route{{node, bgpBoth1}, {bgpBoth1, node}} {
		f := fakeNode()
		apply(t, nexthopTable(f), order[0])
		apply(t, nexthopTable(f), order...)
		if objects := f.RenderNexthops(); strings.Count(objects, "via 192.0.2.2 ") != 2 {
			t.Fatalf("want twin objects:\n%s", objects)
		}
		restartWritesNothing(t, f, order...)
	}
}
