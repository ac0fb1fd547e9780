package dataplane

import (
	"context"
	"errors"
	"fmt"
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

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

var (
	vLocal = calc.VTEP{Node: "node-a", TunnelAddr: ip("10.65.0.0"), MAC: mac("66:c1:a0:00:00:0a"), Underlay: nodeAddr, Local: true}
	vB     = calc.VTEP{Node: "node-b", TunnelAddr: ip("10.65.0.64"), MAC: mac("66:89:3a:22:7a:ac"), Underlay: ip("192.0.2.12")}
	vC     = calc.VTEP{Node: "node-c", TunnelAddr: ip("10.65.0.128"), MAC: mac("66:c1:a0:00:00:0c"), Underlay: ip("198.51.100.13")}
)

func TestVXLANFake(t *testing.T) {
	f := NewFakeKernel()
	f.AddLink("eth0")
	f.AddAddr("eth0", nodeAddr)
	f.SetMTU("eth0", 9000)
	x := NewVXLAN(f, VXLANConfig{ParentAddr: nodeAddr})
	for _, v := range []calc.VTEP{vLocal, vB, vC} {
		x.SetVTEP(v)
	}
	if err := x.Apply(); err != nil {
		t.Fatal(err)
	}
	want := `vxlan.sluice mtu 8950 up true mac 66:c1:a0:00:00:0a vxlan id 4096 port 4789 learning false local 192.0.2.11 dev 2
addr 10.65.0.0
fdb 66:89:3a:22:7a:ac dst 192.0.2.12
fdb 66:c1:a0:00:00:0c dst 198.51.100.13
neigh 10.65.0.128 lladdr 66:c1:a0:00:00:0c
neigh 10.65.0.64 lladdr 66:89:3a:22:7a:ac`
	if got := f.RenderLink("vxlan.sluice"); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	// node-c moves to another underlay address; node-b goes.
	moved := vC
	moved.Underlay = ip("198.51.100.99")
	x.DeleteVTEP(vB)
	x.SetVTEP(moved)
	boom := errors.New("injected")
	f.FailWith(func(op, subject string) error {
		if op == "neigh-del" && subject == "10.65.0.64" {
			return boom
		}
		return nil
	})
	if err := x.Apply(); !errors.Is(err, boom) {
		t.Fatalf("Apply = %v, want the injected failure", err)
	}
	f.FailWith(nil)
	if err := x.Apply(); err != nil {
		t.Fatal(err)
	}
	want = `vxlan.sluice mtu 8950 up true mac 66:c1:a0:00:00:0a vxlan id 4096 port 4789 learning false local 192.0.2.11 dev 2
addr 10.65.0.0
fdb 66:c1:a0:00:00:0c dst 198.51.100.99
neigh 10.65.0.128 lladdr 66:c1:a0:00:00:0c`
	if got := f.RenderLink("vxlan.sluice"); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	// A restart with the same desired state writes nothing.
	before := f.Writes
	y := NewVXLAN(f, VXLANConfig{ParentAddr: nodeAddr})
	y.SetVTEP(vLocal)
	y.SetVTEP(moved)
	if err := y.Apply(); err != nil || f.Writes != before {
		t.Fatalf("restart: %v, %d writes", err, f.Writes-before)
	}
	// VXLAN off: the device goes.
	y.DeleteVTEP(vLocal)
	if err := y.Apply(); err != nil || f.RenderLink("vxlan.sluice") != "vxlan.sluice absent" {
		t.Fatalf("after withdrawing the local VTEP: %v\n%s", err, f.RenderLink("vxlan.sluice"))
	}
}

// renderVXLAN reads the real device and its entries like `ip -d link`, `ip neigh`, `bridge fdb`.
func (n *testNode) renderVXLAN(name string) string {
	n.t.Helper()
	l, err := n.h.LinkByName(name)
	if err != nil {
		return name + " absent"
	}
	vx := l.(*netlink.Vxlan)
	parent := ""
	if pl, err := n.h.LinkByIndex(vx.VtepDevIndex); err == nil {
		parent = pl.Attrs().Name
	}
	lines := []string{fmt.Sprintf("%s mtu %d up %t mac %s vxlan id %d port %d learning %t local %s dev %s", name, l.Attrs().MTU,
		l.Attrs().Flags&net.FlagUp != 0, l.Attrs().HardwareAddr, vx.VxlanId, vx.Port, vx.Learning, vx.SrcAddr, parent)}
	var rest []string
	addrs, _ := n.h.AddrList(l, netlink.FAMILY_V4)
	for _, a := range addrs {
		rest = append(rest, "addr "+a.IPNet.String())
	}
	ns, _ := n.h.NeighList(l.Attrs().Index, unix.AF_INET)
	for _, e := range ns {
		if e.State&netlink.NUD_PERMANENT != 0 {
			rest = append(rest, fmt.Sprintf("neigh %s lladdr %s permanent", e.IP, e.HardwareAddr))
		}
	}
	fs, _ := n.h.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
	for _, e := range fs {
		if e.IP != nil && e.HardwareAddr.String() != "00:00:00:00:00:00" {
			rest = append(rest, fmt.Sprintf("fdb %s dst %s", e.HardwareAddr, e.IP))
		}
	}
	slices.Sort(rest)
	return strings.Join(append(lines, rest...), "\n")
}

// TestVXLANRealKernel checks the device against what Calico's Felix programs for the same
// data: VNI 4096, port 4789, the node's MAC, learning off, MTU parent-50, the tunnel address,
// a permanent neighbour and an FDB entry per remote VTEP. Then restart, drift and a wrong
// device left behind.
func TestVXLANRealKernel(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	// A stale device on sluice's name with another VNI and learning on, left by earlier software.
	if err := n.h.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan.sluice"}, VxlanId: 1, Port: 8472, Learning: true}); err != nil {
		t.Fatal(err)
	}
	x := NewVXLAN(n.kernel(), VXLANConfig{ParentAddr: nodeAddr})
	for _, v := range []calc.VTEP{vLocal, vB, vC} {
		x.SetVTEP(v)
	}
	if err := x.Apply(); err != nil {
		t.Fatal(err)
	}
	want := `vxlan.sluice mtu 1450 up true mac 66:c1:a0:00:00:0a vxlan id 4096 port 4789 learning false local 192.0.2.11 dev eth0
addr 10.65.0.0/32
fdb 66:89:3a:22:7a:ac dst 192.0.2.12
fdb 66:c1:a0:00:00:0c dst 198.51.100.13
neigh 10.65.0.128 lladdr 66:c1:a0:00:00:0c permanent
neigh 10.65.0.64 lladdr 66:89:3a:22:7a:ac permanent`
	if got := n.renderVXLAN("vxlan.sluice"); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if x.Recreated != 1 {
		t.Fatalf("the stale device was recreated %d times, want 1", x.Recreated)
	}

	restarted := NewVXLAN(n.kernel(), VXLANConfig{ParentAddr: nodeAddr})
	for _, v := range []calc.VTEP{vLocal, vB, vC} {
		restarted.SetVTEP(v)
	}
	if err := restarted.Apply(); err != nil || restarted.Writes() != 0 {
		t.Fatalf("restart: %v, %d writes", err, restarted.Writes())
	}

	// Someone deletes a neighbour and an FDB entry: a resync puts them back.
	l := n.link("vxlan.sluice")
	if err := n.h.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_INET, IP: net.ParseIP("10.65.0.64")}); err != nil {
		t.Fatal(err)
	}
	if err := n.h.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, IP: net.ParseIP("198.51.100.13"), HardwareAddr: vC.MAC}); err != nil {
		t.Fatal(err)
	}
	restarted.QueueResync()
	if err := restarted.Apply(); err != nil || restarted.Writes() != 2 {
		t.Fatalf("repair: %v, %d writes, want 2", err, restarted.Writes())
	}
	if got := n.renderVXLAN("vxlan.sluice"); got != want {
		t.Fatalf("after repair:\n%s", got)
	}
	// Someone deletes the device: it comes back whole.
	if err := n.h.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	restarted.QueueResync()
	if err := restarted.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := n.renderVXLAN("vxlan.sluice"); got != want {
		t.Fatalf("after the device was deleted:\n%s", got)
	}
}

var (
	node6   = ip("2001:db8::11")
	v6Local = calc.VTEP{Node: "node-a", TunnelAddr: ip("fd00:65::"), MAC: mac("66:c1:a6:00:00:0a"), Underlay: node6, Local: true}
	v6B     = calc.VTEP{Node: "node-b", TunnelAddr: ip("fd00:65::40"), MAC: mac("66:c1:a6:00:00:0b"), Underlay: ip("2001:db8::12")}
)

// TestVXLANFakeIPv6: the IPv6 device takes the IPv6 VTEPs only (and the IPv4 device only the
// IPv4 ones): bound to the link holding the node's IPv6 address, MTU parent-70, the tunnel
// address as a /128, IPv6 neighbours and FDB entries to IPv6 underlay addresses.
func TestVXLANFakeIPv6(t *testing.T) {
	f := NewFakeKernel()
	f.AddLink("eth0")
	f.AddAddr("eth0", nodeAddr)
	f.AddAddr("eth0", node6)
	f.SetMTU("eth0", 9000)
	x4 := NewVXLAN(f, VXLANConfig{ParentAddr: nodeAddr})
	x6 := NewVXLAN(f, VXLANConfig{IPv6: true, ParentAddr: node6})
	for _, v := range []calc.VTEP{vLocal, vB, v6Local, v6B} {
		x4.SetVTEP(v)
		x6.SetVTEP(v)
	}
	for _, x := range []*VXLAN{x4, x6} {
		if err := x.Apply(); err != nil {
			t.Fatal(err)
		}
	}
	want6 := `vxlan-v6.sluice mtu 8930 up true mac 66:c1:a6:00:00:0a vxlan id 4096 port 4789 learning false local 2001:db8::11 dev 2
addr fd00:65::
fdb 66:c1:a6:00:00:0b dst 2001:db8::12
neigh fd00:65::40 lladdr 66:c1:a6:00:00:0b`
	if got := f.RenderLink("vxlan-v6.sluice"); got != want6 {
		t.Fatalf("IPv6 device:\n%s\nwant:\n%s", got, want6)
	}
	want4 := `vxlan.sluice mtu 8950 up true mac 66:c1:a0:00:00:0a vxlan id 4096 port 4789 learning false local 192.0.2.11 dev 2
addr 10.65.0.0
fdb 66:89:3a:22:7a:ac dst 192.0.2.12
neigh 10.65.0.64 lladdr 66:89:3a:22:7a:ac`
	if got := f.RenderLink("vxlan.sluice"); got != want4 {
		t.Fatalf("IPv4 device:\n%s\nwant:\n%s", got, want4)
	}
	x6.DeleteVTEP(v6B)
	x6.DeleteVTEP(vB) // the other family's: ignored
	if err := x6.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := f.RenderLink("vxlan-v6.sluice"); got != "vxlan-v6.sluice mtu 8930 up true mac 66:c1:a6:00:00:0a vxlan id 4096 port 4789 learning false local 2001:db8::11 dev 2\naddr fd00:65::" {
		t.Fatalf("after node-b went:\n%s", got)
	}
}

// TestVXLANAbsentIsNotLookedUpAgain: without a local VTEP of its family (an IPv4-only cluster,
// for the IPv6 device) the device is looked for once, not at every apply; a link event
// (CheckDevice) makes the next apply look again and remove one someone made.
func TestVXLANAbsentIsNotLookedUpAgain(t *testing.T) {
	f := NewFakeKernel()
	f.AddLink("eth0")
	gets := 0
	f.FailWith(func(op, subject string) error {
		if op == "link-get" && subject == DefaultVXLANNameV6 {
			gets++
		}
		return nil
	})
	x := NewVXLAN(f, VXLANConfig{IPv6: true})
	for range 3 {
		if err := x.Apply(); err != nil {
			t.Fatal(err)
		}
	}
	if gets != 1 {
		t.Fatalf("looked for the absent device %d times in 3 applies, want 1", gets)
	}
	f.AddLink(DefaultVXLANNameV6)
	x.CheckDevice()
	if err := x.Apply(); err != nil {
		t.Fatal(err)
	}
	if l, _ := f.Link(DefaultVXLANNameV6); l != nil || x.Writes() != 1 {
		t.Fatalf("after a link event: device %v, writes %d; want it removed", l, x.Writes())
	}
}

// TestOwnDeviceEventsReadNothingAgain: the link events of the VXLAN device sluice makes at a
// cold start (created down, then set up) make no read of every route and entry; the device
// going down, and another program's VXLAN device appearing, do.
func TestOwnDeviceEventsReadNothingAgain(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	d := New(n.kernel(), Config{Sysctl: func(string, string) error { return nil }, Routes: RouteTableConfig{Nexthops: true}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); d.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	watch := func() (stop func()) {
		wctx, wcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = d.Watch(wctx, n.handle()) }()
		return func() { wcancel(); <-done }
	}
	stopWatch := watch()
	defer func() { stopWatch() }()
	// The watch's own first read, before the update: one resync, and no other.
	waitFor(t, "the watch", func() bool { return d.Stats().Resyncs == 1 })
	d.OnUpdate(fullUpdate([]calc.Route{rBlackhole, rLocal, nbBlock1, ncBlock}, []calc.VTEP{vLocal, vB, vC}))
	waitFor(t, "the first apply", func() bool { return strings.Contains(n.routes(DefaultRouteProtocol), "10.65.0.64/26 nhid") })
	// The device's creation events come within milliseconds; give them ample time.
	time.Sleep(500 * time.Millisecond)
	if s := d.Stats(); s.Resyncs != 1 {
		t.Fatalf("sluice's own new device read everything again: %d resyncs, want 1", s.Resyncs)
	}
	want := n.routes(DefaultRouteProtocol)
	if out, err := exec.Command("ip", "-n", n.name, "link", "set", "vxlan.sluice", "down").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitFor(t, "the device back up with its routes", func() bool {
		return d.Stats().Resyncs == 2 && n.routes(DefaultRouteProtocol) == want
	})
	if out, err := exec.Command("ip", "-n", n.name, "link", "add", "flannel.1", "type", "vxlan", "id", "1", "dstport", "8472").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitFor(t, "another program's VXLAN device to be looked at", func() bool { return d.Stats().Resyncs >= 3 })

	// A new subscription (the agent makes one when a watch is lost) knows no link yet: sluice's
	// device going down is still news, not taken for its creation.
	stopWatch()
	before := d.Stats().Resyncs
	stopWatch = watch()
	waitFor(t, "the new watch's own read", func() bool { return d.Stats().Resyncs == before+1 })
	if out, err := exec.Command("ip", "-n", n.name, "link", "set", "vxlan.sluice", "down").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitFor(t, "the device back up with its routes after a new subscription", func() bool {
		return d.Stats().Resyncs >= before+2 && n.routes(DefaultRouteProtocol) == want
	})
}
