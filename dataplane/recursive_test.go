package dataplane

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/calc"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A route BGP learned whose next hop is on no link of the node (another rack's node, passed on
// by a route reflector that keeps next hops): the kernel's own routes lead there.
var bgpFar = calc.Route{Dst: pfx("10.80.1.0/26"), Type: calc.RouteUnicast, Gateway: ip("198.51.100.9"), Recursive: true, Reason: calc.ReasonBGP}

// putDefault puts another program's default route via gw on eth0 into the fake kernel.
func putDefault(f *FakeKernel, gw string) {
	f.PutRoute(netlink.Route{Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: net.ParseIP(gw).To4(),
		LinkIndex: f.links["eth0"], Table: main, Type: unix.RTN_UNICAST, Protocol: unix.RTPROT_BOOT})
}

// TestRecursiveThroughKernelRoutes: a recursive route takes the gateway and device of the
// kernel's longest route to its next hop (the default route, a connected subnet, a route
// over several paths), in both layouts; it follows that route when it changes (at the next
// read) and goes, explained by the diff, when none leads there.
func TestRecursiveThroughKernelRoutes(t *testing.T) {
	for _, nexthops := range []bool{true, false} {
		f := fakeNode()
		f.AddLink("eth1")
		rt := NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr, Nexthops: nexthops})
		putDefault(f, "192.0.2.1")
		apply(t, rt, bgpFar, nbBlock1)
		if got := f.Render(main); !hasLine(got, "10.80.1.0/26 via 192.0.2.1 dev eth0 proto 83") {
			t.Fatalf("nexthops %v: through the default route:\n%s", nexthops, got)
		}
		if !rt.HasRecursive() {
			t.Fatal("HasRecursive is false")
		}

		// The default route moves: at the next read, so does the route.
		putDefault(f, "192.0.2.254")
		rt.QueueResync()
		apply(t, rt, bgpFar, nbBlock1)
		if got := f.Render(main); !hasLine(got, "10.80.1.0/26 via 192.0.2.254 dev eth0 proto 83") {
			t.Fatalf("nexthops %v: after the default route moved:\n%s", nexthops, got)
		}

		// A longer route wins: a static route over two paths on eth1.
		f.PutRoute(netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("198.51.100.0").To4(), Mask: net.CIDRMask(24, 32)}, Table: main, Type: unix.RTN_UNICAST,
			Protocol: unix.RTPROT_STATIC, MultiPath: []*netlink.NexthopInfo{{Gw: net.ParseIP("203.0.113.2").To4(), LinkIndex: f.links["eth1"]},
				{Gw: net.ParseIP("203.0.113.1").To4(), LinkIndex: f.links["eth1"]}}})
		rt.QueueResync()
		apply(t, rt, bgpFar, nbBlock1)
		if got := f.Render(main); !hasLine(got, "10.80.1.0/26 proto 83 nexthop via 203.0.113.1 dev eth1 nexthop via 203.0.113.2 dev eth1") {
			t.Fatalf("nexthops %v: through the static route's two paths:\n%s", nexthops, got)
		}
		f.DeleteRoute(main, "198.51.100.0/24", 0)

		// A longer blackhole holds the next hop: the kernel's lookup ends there, so does the
		// route.
		f.PutRoute(netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("198.51.100.0").To4(), Mask: net.CIDRMask(24, 32)}, Table: main,
			Type: unix.RTN_BLACKHOLE, Protocol: unix.RTPROT_STATIC})
		rt.QueueResync()
		apply(t, rt, bgpFar, nbBlock1)
		if got := f.Render(main); strings.Contains(got, "10.80.1.0/26") {
			t.Fatalf("nexthops %v: a route through a blackhole:\n%s", nexthops, got)
		}
		f.DeleteRoute(main, "198.51.100.0/24", 0)

		// Nothing leads there: the route goes, and the diff says why.
		f.DeleteRoute(main, "0.0.0.0/0", 0)
		rt.QueueResync()
		apply(t, rt, bgpFar, nbBlock1)
		if got := f.Render(main); strings.Contains(got, "10.80.1.0/26") {
			t.Fatalf("nexthops %v: a route left with nothing leading to its next hop:\n%s", nexthops, got)
		}
		missing, _, err := rt.Diff()
		if err != nil || len(missing) != 1 || !strings.Contains(missing[0], "no route of the kernel's leads to its next hop 198.51.100.9") {
			t.Fatalf("nexthops %v: diff %q %v", nexthops, missing, err)
		}

		// A connected subnet of eth1 holds the next hop: straight there.
		f.PutRoute(netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("198.51.100.0").To4(), Mask: net.CIDRMask(24, 32)}, LinkIndex: f.links["eth1"],
			Table: main, Type: unix.RTN_UNICAST, Protocol: unix.RTPROT_KERNEL, Scope: netlink.SCOPE_LINK})
		rt.QueueResync()
		apply(t, rt, bgpFar, nbBlock1)
		if got := f.Render(main); !hasLine(got, "10.80.1.0/26 via 198.51.100.9 dev eth1 proto 83") {
			t.Fatalf("nexthops %v: through the connected subnet:\n%s", nexthops, got)
		}
		apply(t, rt, nbBlock1)
		if rt.HasRecursive() {
			t.Fatal("HasRecursive after the route went")
		}
	}
}

// TestRecursiveRealKernel: in a namespace, the dataplane's watch sees the default route
// replaced by hand and moves the recursive route after it.
func TestRecursiveRealKernel(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", n.name}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("route", "add", "default", "via", "192.0.2.1", "dev", "eth0")
	d := New(n.kernel(), Config{Sysctl: func(string, string) error { return nil }, Routes: RouteTableConfig{ParentAddr: nodeAddr, Nexthops: true},
		OnApply: func(err error, _ int, _ time.Duration) {
			if err != nil {
				t.Errorf("apply: %v", err)
			}
		}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); d.Run(ctx) }()
	go func() { defer wg.Done(); _ = d.Watch(ctx, n.handle()) }()
	defer func() { cancel(); wg.Wait() }()
	d.OnUpdate(fullUpdate([]calc.Route{bgpFar}, nil))
	waitFor(t, "the route through the default route", func() bool {
		return n.routes(DefaultRouteProtocol) == "10.80.1.0/26 via 192.0.2.1 dev eth0 proto 83"
	})
	ip("route", "replace", "default", "via", "192.0.2.254", "dev", "eth0")
	took := waitFor(t, "the route to follow the default route", func() bool {
		return n.routes(DefaultRouteProtocol) == "10.80.1.0/26 via 192.0.2.254 dev eth0 proto 83"
	})
	t.Logf("followed the default route in %v", took)
	ip("route", "del", "default")
	waitFor(t, "the route to go with the default route", func() bool { return n.routes(DefaultRouteProtocol) == "" })
	out, err := exec.Command("ip", "-n", n.name, "route", "get", "10.80.1.1").CombinedOutput()
	if err == nil {
		t.Fatalf("10.80.1.1 still routed: %s", out)
	}
}

// hasLine says whether one of text's lines is line.
func hasLine(text, line string) bool { return slices.Contains(strings.Split(text, "\n"), line) }

// TestLearnedDefaultRouteBesideNodes: a default route BGP learned, asked for at a metric of its
// own, sits beside the node's own default route and goes without taking it along.
func TestLearnedDefaultRouteBesideNodes(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	if out, err := exec.Command("ip", "-n", n.name, "route", "add", "default", "via", "192.0.2.1", "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	learned := calc.Route{Dst: pfx("0.0.0.0/0"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.254"), OnLink: true, Metric: 200, Reason: calc.ReasonBGP}
	rt := NewRouteTable(n.kernel(), RouteTableConfig{ParentAddr: nodeAddr, Nexthops: true})
	apply(t, rt, learned)
	if got, want := n.routes(-1), "0.0.0.0/0 nhid 1392508929 via 192.0.2.254 dev eth0 proto 83 metric 200 onlink\n0.0.0.0/0 via 192.0.2.1 dev eth0 proto 3\n192.0.2.0/24 dev eth0 proto 2 scope link"; got != want {
		t.Fatalf("routes:\n%s\nwant:\n%s", got, want)
	}
	restarted := NewRouteTable(n.kernel(), RouteTableConfig{ParentAddr: nodeAddr, Nexthops: true})
	apply(t, restarted, learned)
	if restarted.Writes() != 0 {
		t.Fatalf("a restart wrote %d", restarted.Writes())
	}
	apply(t, restarted)
	if got, want := n.routes(-1), "0.0.0.0/0 via 192.0.2.1 dev eth0 proto 3\n192.0.2.0/24 dev eth0 proto 2 scope link"; got != want {
		t.Fatalf("after the learned default went:\n%s\nwant:\n%s", got, want)
	}
}

// TestLearnedDefaultNeverReplacesNodes: a learned default route at the node's own default
// route's metric is not programmed (a withdrawal would leave the node without one): the
// node's stays, and the diff says why.
func TestLearnedDefaultNeverReplacesNodes(t *testing.T) {
	f := fakeNode()
	f.PutRoute(netlink.Route{Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: net.ParseIP("192.0.2.1").To4(),
		LinkIndex: f.links["eth0"], Table: main, Type: unix.RTN_UNICAST, Protocol: unix.RTPROT_DHCP, Priority: 100})
	rt := NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr, Nexthops: true})
	learned := calc.Route{Dst: pfx("0.0.0.0/0"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.254"), OnLink: true, Metric: 100, Reason: calc.ReasonBGP}
	apply(t, rt, learned, nbBlock1)
	if got := f.Render(main); !hasLine(got, "0.0.0.0/0 via 192.0.2.1 dev eth0 proto 16 metric 100") || strings.Contains(got, "192.0.2.254") {
		t.Fatalf("routes:\n%s", got)
	}
	missing, _, err := rt.Diff()
	if err != nil || len(missing) != 1 || !strings.Contains(missing[0], "the node's own default route is at this metric") {
		t.Fatalf("diff %q %v", missing, err)
	}
}

// TestLearnedDefaultMakesNoLeftovers: with a learned default route wanted, the node's other
// routes are not "inside a sluice route" (every route is inside a default route).
func TestLearnedDefaultMakesNoLeftovers(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	if out, err := exec.Command("ip", "-n", n.name, "route", "add", "10.0.0.0/8", "via", "192.0.2.254", "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	d, log := runDataplane(t, n, false)
	learned := calc.Route{Dst: pfx("0.0.0.0/0"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.1"), OnLink: true, Metric: 200, Reason: calc.ReasonBGP}
	d.OnUpdate(fullUpdate([]calc.Route{rBlackhole, rLocal, learned}, []calc.VTEP{vLocal}))
	waitFor(t, "the learned default route", func() bool { return strings.Contains(n.routes(DefaultRouteProtocol), "0.0.0.0/0") })
	d.QueueResync() // the leftover scan runs after a read
	d.Kick()
	waitFor(t, "a resync", func() bool { return d.Stats().Resyncs > 1 })
	time.Sleep(100 * time.Millisecond)
	if got := log.keys(false); len(got) != 0 {
		t.Fatalf("reported as leftovers under a learned default route: %v", got)
	}
}
