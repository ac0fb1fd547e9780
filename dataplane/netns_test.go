package dataplane

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var nsCounter atomic.Int32

// testNode is a fresh network namespace with a netlink handle into it; it is deleted when
// the test ends, pass or fail.
type testNode struct {
	t    testing.TB
	name string
	h    *netlink.Handle
}

func newTestNode(t testing.TB) *testNode {
	t.Helper()
	nstest.NeedRoot(t, "a real-kernel test (create network namespaces)")
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("real-kernel test: needs iproute2's ip")
	}
	name := fmt.Sprintf("sluice-dp-%d-%d", os.Getpid(), nsCounter.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	n := &testNode{t: t, name: name, h: h}
	if err := h.LinkSetUp(n.link("lo")); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *testNode) link(name string) netlink.Link {
	n.t.Helper()
	l, err := n.h.LinkByName(name)
	if err != nil {
		n.t.Fatalf("link %s: %v", name, err)
	}
	return l
}

// iface adds an up interface (one end of a veth pair: the kernels sluice targets may lack the
// dummy driver), with an address when addr is not "".
func (n *testNode) iface(name, addr string) {
	n.t.Helper()
	peer := "p" + name
	if len(peer) > 15 {
		peer = peer[:15]
	}
	if err := n.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		n.t.Fatalf("adding %s: %v", name, err)
	}
	if err := n.h.LinkSetUp(n.link(peer)); err != nil {
		n.t.Fatal(err)
	}
	l := n.link(name)
	if addr != "" {
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			n.t.Fatal(err)
		}
		if err := n.h.AddrAdd(l, a); err != nil {
			n.t.Fatal(err)
		}
	}
	if err := n.h.LinkSetUp(l); err != nil {
		n.t.Fatal(err)
	}
}

// routes renders the main table's routes of protocol proto (every protocol but the kernel's
// when proto is 0, every route when it is -1) like `ip route`.
func (n *testNode) routes(proto int) string {
	n.t.Helper()
	return n.render(netlink.FAMILY_V4, func(r Route) bool {
		return !(proto > 0 && int(r.Protocol) != proto) && !(proto == 0 && r.Protocol == unix.RTPROT_KERNEL)
	})
}

// render lists the main table's routes of one family that keep accepts, sorted, like `ip route`.
// Routes through a nexthop object show its ID and, as the kernel reports them, its gateway and
// device.
func (n *testNode) render(family int, keep func(Route) bool) string {
	n.t.Helper()
	rs, err := n.kernel().RouteList(unix.RT_TABLE_MAIN)
	if err != nil {
		n.t.Fatal(err)
	}
	rs = slices.DeleteFunc(rs, func(r Route) bool { return (r.Family == unix.AF_INET6) != (family == netlink.FAMILY_V6) })
	links, _ := n.h.LinkList()
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var lines []string
	for _, r := range rs {
		if !keep(r) {
			continue
		}
		if r.Type != unix.RTN_UNICAST {
			r.LinkIndex = 0
		}
		lines = append(lines, RenderRoute(r, names))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// handle opens the namespace; the handle is closed when the test ends.
func (n *testNode) handle() netns.NsHandle {
	n.t.Helper()
	ns, err := netns.GetFromName(n.name)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { ns.Close() })
	return ns
}

// do runs f on this goroutine's thread moved into the node's namespace (and back).
func (n *testNode) do(f func()) {
	n.t.Helper()
	ns, err := netns.GetFromName(n.name)
	if err != nil {
		n.t.Fatal(err)
	}
	defer ns.Close()
	inNS(n.t, ns, f)
}

func (n *testNode) kernel() Kernel {
	n.t.Helper()
	k, err := NewKernel(n.handle())
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(k.Close)
	return k
}

// TestRoutesRealKernel programs node-a's routes into a fresh namespace, restarts with the same
// desired state (no writes), repairs a route deleted by hand, and leaves other routes alone.
func TestRoutesRealKernel(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("vxlan.sluice", "")
	n.iface("cali-web-1", "")
	_, opDst, _ := net.ParseCIDR("10.99.0.0/16")
	if err := n.h.RouteAdd(&netlink.Route{Dst: opDst, Gw: net.ParseIP("192.0.2.1"), LinkIndex: n.link("eth0").Attrs().Index, Protocol: unix.RTPROT_STATIC}); err != nil {
		t.Fatal(err)
	}
	_, squat, _ := net.ParseCIDR("10.65.0.64/26")
	if err := n.h.RouteAdd(&netlink.Route{Dst: squat, Gw: net.ParseIP("192.0.2.99"), LinkIndex: n.link("eth0").Attrs().Index, Protocol: unix.RTPROT_BOOT}); err != nil {
		t.Fatal(err)
	}

	c := &conflicts{}
	rt := NewRouteTable(n.kernel(), RouteTableConfig{ParentAddr: nodeAddr, Reporter: c})
	apply(t, rt, rBlackhole, rLocal, rVXLAN, rDirect)
	if got := n.routes(DefaultRouteProtocol); got != allFour {
		t.Fatalf("kernel routes:\n%s\nwant:\n%s", got, allFour)
	}
	if strings.Join(c.got, ",") != "10.65.0.64/26" {
		t.Fatalf("conflicts %v, want the squatting route at 10.65.0.64/26", c.got)
	}
	if got := n.routes(unix.RTPROT_STATIC); got != "10.99.0.0/16 via 192.0.2.1 dev eth0 proto 4" {
		t.Fatalf("the operator's route was touched: %q", got)
	}

	restarted := NewRouteTable(n.kernel(), RouteTableConfig{ParentAddr: nodeAddr})
	apply(t, restarted, rBlackhole, rLocal, rVXLAN, rDirect)
	if restarted.Writes() != 0 {
		t.Fatalf("a restart with unchanged routes wrote %d", restarted.Writes())
	}

	if err := n.h.RouteDel(&netlink.Route{Dst: squat, Table: unix.RT_TABLE_MAIN, Protocol: DefaultRouteProtocol}); err != nil {
		t.Fatal(err)
	}
	restarted.QueueResync()
	if err := restarted.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := n.routes(DefaultRouteProtocol); got != allFour || restarted.Writes() != 1 {
		t.Fatalf("after repair (%d writes):\n%s", restarted.Writes(), got)
	}

	// Everything withdrawn: sluice's routes go, the operator's stays.
	apply(t, restarted)
	if got := n.routes(0); got != "10.99.0.0/16 via 192.0.2.1 dev eth0 proto 4" {
		t.Fatalf("after withdrawing everything:\n%s", got)
	}
}

// TestKernelOpensOnlyTheRouteFamily: the kernel handle holds a NETLINK_ROUTE socket and no
// other family, so a host that lacks a family's module (xfrm_user on many hosts) still starts
// the agent. The netlink library opens every family it knows when asked for none.
func TestKernelOpensOnlyTheRouteFamily(t *testing.T) {
	n := newTestNode(t)
	k, err := NewKernel(n.handle())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if !k.h.SupportsNetlinkFamily(unix.NETLINK_ROUTE) {
		t.Fatal("the kernel handle has no NETLINK_ROUTE socket")
	}
	for _, f := range []int{unix.NETLINK_XFRM, unix.NETLINK_NETFILTER} {
		if k.h.SupportsNetlinkFamily(f) {
			t.Errorf("the kernel handle opened netlink family %d, which sluice does not use through it", f)
		}
	}
}
