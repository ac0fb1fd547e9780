package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	nodeAddr = netip.MustParseAddr("192.0.2.11")
	main     = unix.RT_TABLE_MAIN
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

// sample desired routes, as calc emits them for node-a.
var (
	rBlackhole = calc.Route{Dst: pfx("10.65.0.0/26"), Type: calc.RouteBlackhole, Metric: 1024}
	rLocal     = calc.Route{Dst: pfx("10.65.0.1/32"), Type: calc.RouteUnicast, Device: "cali-web-1", Reason: calc.ReasonLocalWorkload}
	rVXLAN     = calc.Route{Dst: pfx("10.65.0.64/26"), Type: calc.RouteUnicast, Device: "vxlan.sluice", Gateway: ip("10.65.0.64"), OnLink: true}
	rDirect    = calc.Route{Dst: pfx("10.66.0.64/26"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.12"), OnLink: true}
)

type conflicts struct{ got []string }

func (c *conflicts) Conflict(dst netip.Prefix, metric, proto int) {
	c.got = append(c.got, dst.String())
}

func (c *conflicts) NexthopConflict(id uint32, proto int) {
	c.got = append(c.got, fmt.Sprintf("nexthop %d proto %d", id, proto))
}

func fakeNode() *FakeKernel {
	f := NewFakeKernel()
	f.AddLink("eth0")
	f.AddLink("vxlan.sluice")
	f.AddLink("cali-web-1")
	f.AddAddr("eth0", nodeAddr)
	return f
}

func apply(t *testing.T, rt *RouteTable, routes ...calc.Route) {
	t.Helper()
	want := map[netip.Prefix]bool{}
	for _, r := range routes {
		rt.SetRoute(&r)
		want[r.Dst] = true
	}
	for _, r := range rt.Routes() {
		if !want[r.Dst] {
			rt.DeleteRoute(r.Dst)
		}
	}
	if err := rt.Apply(); err != nil {
		t.Fatal(err)
	}
}

const allFour = `10.65.0.1/32 dev cali-web-1 proto 83 scope link
10.65.0.64/26 via 10.65.0.64 dev vxlan.sluice proto 83 onlink
10.66.0.64/26 via 192.0.2.12 dev eth0 proto 83 onlink
blackhole 10.65.0.0/26 proto 83 metric 1024`

// TestRouteTransitions pushes a sequence of desired states through and compares the fake
// kernel after each; the same states in other orders end the same.
func TestRouteTransitions(t *testing.T) {
	states := []struct {
		routes []calc.Route
		want   string
	}{
		{[]calc.Route{rBlackhole, rLocal, rVXLAN, rDirect}, allFour},
		{[]calc.Route{rBlackhole, rVXLAN}, `10.65.0.64/26 via 10.65.0.64 dev vxlan.sluice proto 83 onlink
blackhole 10.65.0.0/26 proto 83 metric 1024`},
		{[]calc.Route{rBlackhole, {Dst: rVXLAN.Dst, Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.12"), OnLink: true}}, `10.65.0.64/26 via 192.0.2.12 dev eth0 proto 83 onlink
blackhole 10.65.0.0/26 proto 83 metric 1024`},
		{[]calc.Route{{Dst: rBlackhole.Dst, Type: calc.RouteUnreachable, Metric: 4000}}, `unreachable 10.65.0.0/26 proto 83 metric 4000`},
		{nil, ``},
	}
	f := fakeNode()
	rt := NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr})
	for i, s := range states {
		apply(t, rt, s.routes...)
		if got := f.Render(main); got != s.want {
			t.Fatalf("state %d:\n%s\nwant:\n%s", i, got, s.want)
		}
	}
	// Reversed and duplicated: the end state is the last one's.
	for _, order := range [][]int{{4, 3, 2, 1, 0}, {0, 0, 1, 1, 2, 3, 3, 0}} {
		f := fakeNode()
		rt := NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr})
		for _, i := range order {
			apply(t, rt, states[i].routes...)
		}
		last := order[len(order)-1]
		if got := f.Render(main); got != states[last].want {
			t.Fatalf("order %v:\n%s\nwant:\n%s", order, got, states[last].want)
		}
	}
}

func TestRouteRestartWritesNothing(t *testing.T) {
	f := fakeNode()
	apply(t, NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr}), rBlackhole, rLocal, rVXLAN, rDirect)
	before := f.Writes
	restarted := NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr})
	apply(t, restarted, rBlackhole, rLocal, rVXLAN, rDirect)
	if f.Writes != before || restarted.Writes() != 0 {
		t.Fatalf("a restart with unchanged desired state wrote %d routes", f.Writes-before)
	}
}

func TestRouteOwnership(t *testing.T) {
	f := fakeNode()
	mk := func(dst string, proto, metric int) netlink.Route {
		_, n, _ := net.ParseCIDR(dst)
		return netlink.Route{Dst: n, Table: main, Protocol: netlink.RouteProtocol(proto), Priority: metric, Type: unix.RTN_UNICAST, LinkIndex: f.links["eth0"]}
	}
	f.PutRoute(mk("10.99.0.0/16", unix.RTPROT_STATIC, 0))   // an operator's route: untouched
	f.PutRoute(mk("10.65.0.64/26", unix.RTPROT_BOOT, 0))    // exactly where sluice's must go: replaced
	f.PutRoute(mk("10.65.0.64/26", unix.RTPROT_STATIC, 10)) // same destination, other metric: untouched
	f.PutRoute(mk("10.77.0.0/26", DefaultRouteProtocol, 0)) // sluice's own, no longer wanted: deleted
	f.PutRoute(mk("10.65.0.0/26", unix.RTPROT_STATIC, 100)) // an operator's override of a blackhole: untouched
	c := &conflicts{}
	rt := NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr, Reporter: c})
	apply(t, rt, rBlackhole, rVXLAN)
	want := `10.65.0.0/26 dev eth0 proto 4 metric 100
10.65.0.64/26 dev eth0 proto 4 metric 10
10.65.0.64/26 via 10.65.0.64 dev vxlan.sluice proto 83 onlink
10.99.0.0/16 dev eth0 proto 4
blackhole 10.65.0.0/26 proto 83 metric 1024`
	if got := f.Render(main); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if strings.Join(c.got, ",") != "10.65.0.64/26" {
		t.Fatalf("conflicts reported: %v, want 10.65.0.64/26 once", c.got)
	}
	rt.QueueResync()
	apply(t, rt, rBlackhole, rVXLAN)
	if len(c.got) != 1 {
		t.Fatalf("the conflict was reported again: %v", c.got)
	}
}

func TestRoutePartialFailure(t *testing.T) {
	f := fakeNode()
	boom := errors.New("injected")
	f.FailWith(func(op, subject string) error {
		if op == "route-replace" && subject == "10.65.0.64/26" {
			return boom
		}
		return nil
	})
	rt := NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr})
	for _, r := range []calc.Route{rBlackhole, rLocal, rVXLAN, rDirect} {
		rt.SetRoute(&r)
	}
	err := rt.Apply()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "10.65.0.64/26") {
		t.Fatalf("Apply = %v, want the injected error naming the route", err)
	}
	if got := f.Render(main); strings.Contains(got, "10.65.0.64/26") || strings.Count(got, "\n") != 2 {
		t.Fatalf("the other routes must be in despite the failure:\n%s", got)
	}
	f.FailWith(nil)
	if err := rt.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := f.Render(main); got != allFour {
		t.Fatalf("after the retry:\n%s\nwant:\n%s", got, allFour)
	}
	// A failing kernel read is an error, and the next Apply reads again.
	f.FailWith(func(op, _ string) error {
		if op == "route-list" {
			return boom
		}
		return nil
	})
	rt.QueueResync()
	if err := rt.Apply(); !errors.Is(err, boom) {
		t.Fatalf("Apply with a failing read = %v", err)
	}
	f.FailWith(nil)
	f.DeleteRoute(main, "10.65.0.1/32", 0)
	if err := rt.Apply(); err != nil || f.Render(main) != allFour {
		t.Fatalf("Apply after the failed read = %v:\n%s", err, f.Render(main))
	}
}

func TestRouteWaitsForItsDevice(t *testing.T) {
	f := NewFakeKernel()
	f.AddLink("eth0")
	f.AddAddr("eth0", nodeAddr)
	rt := NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr})
	apply(t, rt, rBlackhole, rLocal)
	if rt.Unresolved() != 1 || f.Render(main) != "blackhole 10.65.0.0/26 proto 83 metric 1024" {
		t.Fatalf("unresolved %d, kernel:\n%s", rt.Unresolved(), f.Render(main))
	}
	f.AddLink("cali-web-1")
	rt.LinksChanged() // what the link watch says
	if err := rt.Apply(); err != nil {
		t.Fatal(err)
	}
	if rt.Unresolved() != 0 || !strings.Contains(f.Render(main), "10.65.0.1/32 dev cali-web-1") {
		t.Fatalf("the workload route did not follow its interface:\n%s", f.Render(main))
	}
	// The interface goes: the kernel drops the route, and sluice does not fight it.
	f.DelLink("cali-web-1")
	rt.LinksChanged()
	if err := rt.Apply(); err != nil || rt.Unresolved() != 1 {
		t.Fatalf("Apply = %v, unresolved %d", err, rt.Unresolved())
	}
}

// TestJoinErrorsCaps: an apply's errors are spelled out up to maxErrors and counted past that.
func TestJoinErrorsCaps(t *testing.T) {
	var errs []error
	for i := range 25 {
		errs = append(errs, fmt.Errorf("route %d refused", i))
	}
	got := joinErrors(errs).Error()
	if !strings.Contains(got, "route 9 refused") || strings.Contains(got, "route 10 refused") || !strings.HasSuffix(got, "and 15 more") {
		t.Fatalf("joined: %q", got)
	}
	if got := joinErrors(errs[:3]).Error(); strings.Count(got, "refused") != 3 {
		t.Fatalf("three errors joined: %q", got)
	}
}

// TestRouteParentFromOwnAddress: a node without VXLAN (routed by BGP alone) has no VTEP to
// give its underlay address; its own host address among calc's cluster nets does, so routes
// through the parent device resolve.
func TestRouteParentFromOwnAddress(t *testing.T) {
	f := fakeNode()
	rt := NewRouteTable(f, RouteTableConfig{NodeName: "node-a"})
	learned := calc.Route{Dst: pfx("10.80.0.64/26"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.1"), OnLink: true, Reason: calc.ReasonBGP}
	rt.Full(&calc.Update{Full: true, Ops: []calc.Op{
		{ClusterNet: &calc.ClusterNet{Prefix: pfx("192.0.2.99/32"), Host: true, Node: "node-b"}}, // another node's: not the parent
		{Route: &learned},
	}})
	if err := rt.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := f.Render(254); got != "" || rt.Unresolved() != 1 {
		t.Fatalf("without this node's address: %q, %d unresolved", got, rt.Unresolved())
	}
	rt.OnOp(calc.Op{ClusterNet: &calc.ClusterNet{Prefix: netip.PrefixFrom(nodeAddr, 32), Host: true, Node: "node-a"}})
	if err := rt.Apply(); err != nil {
		t.Fatal(err)
	}
	if got, want := f.Render(254), "10.80.0.64/26 via 192.0.2.1 dev eth0 proto 83 onlink"; got != want || rt.Unresolved() != 0 {
		t.Fatalf("with it: %q (%d unresolved), want %q", got, rt.Unresolved(), want)
	}
}
