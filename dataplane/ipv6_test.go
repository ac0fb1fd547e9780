package dataplane

import (
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/calc"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNS runs f on a thread switched into ns (sockets it opens stay in ns).
func inNS(t testing.TB, ns netns.NsHandle, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err) // this thread must not go back to the pool in the wrong namespace
		}
	}()
	f()
}

// TestIPv6VXLANRealKernel: two nodes (namespaces) joined by a link with IPv6 addresses only,
// each running the dataplane with the other as its one remote IPv6 VTEP. Each makes
// vxlan-v6.sluice (VNI 4096, port 4789, learning off, MTU parent-70, bound to its IPv6
// address), the neighbour and FDB entries for the other, and the route to the other's block
// through it; a UDP datagram from node-a's tunnel address reaches node-b's across the tunnel.
func TestIPv6VXLANRealKernel(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	nsA, nsB := a.handle(), b.handle()
	if err := a.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(nsB))}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		node *testNode
		addr string
	}{{a, "2001:db8::11/64"}, {b, "2001:db8::12/64"}} {
		l := n.node.link("eth0")
		addr, err := netlink.ParseAddr(n.addr)
		if err != nil {
			t.Fatal(err)
		}
		addr.Flags = unix.IFA_F_NODAD
		if err := n.node.h.AddrAdd(l, addr); err != nil {
			t.Fatal(err)
		}
		if err := n.node.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	vA := calc.VTEP{Node: "node-a", TunnelAddr: ip("fd00:65::"), MAC: mac("66:c1:a6:00:00:0a"), Underlay: ip("2001:db8::11")}
	vB := calc.VTEP{Node: "node-b", TunnelAddr: ip("fd00:65::40"), MAC: mac("66:c1:a6:00:00:0b"), Underlay: ip("2001:db8::12")}
	program := func(n *testNode, local, remote calc.VTEP, remoteBlock string) {
		local.Local = true
		d := New(n.kernel(), Config{Sysctl: func(string, string) error { return nil }})
		r := calc.Route{Dst: pfx(remoteBlock), Type: calc.RouteUnicast, Device: "vxlan-v6.sluice", Gateway: remote.TunnelAddr, OnLink: true, Reason: calc.ReasonRemoteBlock, Node: remote.Node}
		d.OnUpdate(fullUpdate([]calc.Route{r}, []calc.VTEP{local, remote}))
		if err := d.Apply(); err != nil {
			t.Fatalf("%s: %v", n.name, err)
		}
	}
	program(a, vA, vB, "fd00:65::40/122")
	program(b, vB, vA, "fd00:65::/122")

	l, ok := a.link("vxlan-v6.sluice").(*netlink.Vxlan)
	if !ok || l.VxlanId != 4096 || l.Port != 4789 || l.Learning || l.MTU != 1430 || !l.SrcAddr.Equal(net.ParseIP("2001:db8::11")) ||
		l.VtepDevIndex != a.link("eth0").Attrs().Index || l.HardwareAddr.String() != "66:c1:a6:00:00:0a" {
		t.Fatalf("node-a's vxlan-v6.sluice: %+v", l)
	}
	if got := a.routes6(); got != "fd00:65::40/122 via fd00:65::40 dev vxlan-v6.sluice proto 83 metric 1024 onlink" {
		t.Fatalf("node-a's IPv6 routes: %q", got)
	}
	neighs, err := a.h.NeighList(l.Index, unix.AF_INET6)
	if err != nil {
		t.Fatal(err)
	}
	var perm []string
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 {
			perm = append(perm, n.IP.String()+" "+n.HardwareAddr.String())
		}
	}
	if strings.Join(perm, ",") != "fd00:65::40 66:c1:a6:00:00:0b" {
		t.Fatalf("node-a's permanent IPv6 neighbours: %v", perm)
	}

	var conn *net.UDPConn
	inNS(t, nsB, func() {
		c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.ParseIP("fd00:65::40"), Port: 9999})
		if err != nil {
			t.Fatal(err)
		}
		conn = c
	})
	defer conn.Close()
	var out *net.UDPConn
	inNS(t, nsA, func() {
		c, err := net.DialUDP("udp6", &net.UDPAddr{IP: net.ParseIP("fd00:65::")}, &net.UDPAddr{IP: net.ParseIP("fd00:65::40"), Port: 9999})
		if err != nil {
			t.Fatal(err)
		}
		out = c
	})
	defer out.Close()
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 64)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, from, err := conn.ReadFromUDP(buf)
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- from.IP.String() + " " + string(buf[:n])
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := out.Write([]byte("hello over vxlan-v6")); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-got:
			if g != "fd00:65:: hello over vxlan-v6" {
				t.Fatalf("node-b got %q", g)
			}
			return
		case <-tick.C:
		}
	}
}

// routes6 renders the main table's IPv6 routes of sluice's protocol like `ip -6 route`.
func (n *testNode) routes6() string {
	n.t.Helper()
	return n.render(netlink.FAMILY_V6, func(r Route) bool { return int(r.Protocol) == DefaultRouteProtocol })
}
