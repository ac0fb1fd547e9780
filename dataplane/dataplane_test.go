package dataplane

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/calc"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// sysctlLog records sysctl writes instead of touching the machine's.
type sysctlLog struct {
	mu     sync.Mutex
	writes map[string]string
}

func (s *sysctlLog) write(path, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes[path] = value
	return nil
}

func fullUpdate(routes []calc.Route, vteps []calc.VTEP) *calc.Update {
	u := &calc.Update{Full: true}
	for i := range vteps {
		u.Ops = append(u.Ops, calc.Op{VTEP: &vteps[i]})
	}
	for i := range routes {
		u.Ops = append(u.Ops, calc.Op{Route: &routes[i]})
	}
	return u
}

func waitFor(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// TestDataplaneRepairsDrift runs the whole dataplane in a fresh namespace: nothing is written
// before the full update, then everything; a route, a neighbour and the VXLAN device deleted
// by hand come back by themselves; a workload route appears when its interface does.
func TestDataplaneRepairsDrift(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	ns := n.handle()
	sys := &sysctlLog{writes: map[string]string{}}
	var repairsMu sync.Mutex
	var repairs []string
	d := New(n.kernel(), Config{Sysctl: sys.write, OnRepair: func(kind, what string) {
		repairsMu.Lock()
		repairs = append(repairs, kind+": "+what)
		repairsMu.Unlock()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); d.Run(ctx) }()
	go func() {
		defer wg.Done()
		if err := d.Watch(ctx, ns); err != nil {
			t.Errorf("watch ended: %v", err)
		}
	}()
	defer func() { cancel(); wg.Wait() }()

	rLocal2 := calc.Route{Dst: pfx("10.65.0.2/32"), Type: calc.RouteUnicast, Device: "cali-web-2", Reason: calc.ReasonLocalWorkload}
	// Partial updates before the full one write nothing.
	d.OnUpdate(&calc.Update{Ops: []calc.Op{{Route: &rBlackhole}}})
	time.Sleep(50 * time.Millisecond)
	if got := n.routes(DefaultRouteProtocol); got != "" {
		t.Fatalf("written before the first full update:\n%s", got)
	}
	d.OnUpdate(fullUpdate([]calc.Route{rBlackhole, rLocal, rLocal2, rVXLAN, rDirect}, []calc.VTEP{vLocal, vB, vC}))
	waitFor(t, "the first apply", func() bool { return n.routes(DefaultRouteProtocol) == allFour })
	sys.mu.Lock()
	forward, proxyARP := sys.writes["net/ipv4/ip_forward"], sys.writes["net/ipv4/conf/cali-web-1/proxy_arp"]
	sys.mu.Unlock()
	if forward != "1" || proxyARP != "1" {
		t.Fatalf("sysctls: ip_forward %q, proxy_arp on cali-web-1 %q", forward, proxyARP)
	}

	// A route deleted by hand.
	_, dst, _ := net.ParseCIDR("10.65.0.64/26")
	if err := n.h.RouteDel(&netlink.Route{Dst: dst, Table: unix.RT_TABLE_MAIN, Protocol: DefaultRouteProtocol}); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, "the route to come back", func() bool { return n.routes(DefaultRouteProtocol) == allFour })
	t.Logf("route repaired in %v", took)
	// Told once the apply that put it back is over (the route is visible before that).
	waitFor(t, "the route repair to be told", func() bool {
		repairsMu.Lock()
		defer repairsMu.Unlock()
		return slices.Contains(repairs, "route: route to 10.65.0.64/26 metric 0")
	})

	// The VXLAN device deleted by hand: device, neighbours and the routes through it return.
	wantVX := n.renderVXLAN("vxlan.sluice")
	if err := n.h.LinkDel(n.link("vxlan.sluice")); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, "the VXLAN device to come back", func() bool {
		return n.renderVXLAN("vxlan.sluice") == wantVX && n.routes(DefaultRouteProtocol) == allFour
	})
	t.Logf("VXLAN device and its routes repaired in %v", took)

	// Someone changes the device's MTU: it is put back.
	if err := n.h.LinkSetMTU(n.link("vxlan.sluice"), 1300); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, "the VXLAN MTU to be put back", func() bool { return n.link("vxlan.sluice").Attrs().MTU == 1450 })
	t.Logf("VXLAN MTU repaired in %v", took)

	// The second workload's interface appears.
	n.iface("cali-web-2", "")
	waitFor(t, "the second workload's route", func() bool {
		return strings.Contains(n.routes(DefaultRouteProtocol), "10.65.0.2/32 dev cali-web-2")
	})
	if !d.Synced() {
		t.Fatalf("not synced: %+v", d.Stats())
	}

	// Outgoing NAT: the table appears with a natOutgoing pool; deleted by hand, it is back at
	// once (nftables' deletion events), not at the next periodic resync.
	masq := calc.ClusterNet{Prefix: pfx("10.65.0.0/16"), Masquerade: true, KeepSource: true}
	d.OnUpdate(&calc.Update{Ops: []calc.Op{{ClusterNet: &masq}}})
	other := nftNAT{netnsFd: int(ns)}
	waitFor(t, "the NAT table", func() bool { _, ok, _ := other.readNAT(); return ok })
	if err := other.writeNAT(nil); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, "the NAT table to come back", func() bool { _, ok, _ := other.readNAT(); return ok })
	t.Logf("NAT table repaired in %v", took)
	// Told once the apply that put it back is over (the table is visible before that).
	waitFor(t, "the NAT repair to be told", func() bool {
		repairsMu.Lock()
		defer repairsMu.Unlock()
		return slices.Contains(repairs, "nat: nftables table sluice-nat")
	})
	if s := d.Stats(); s.NATRepairs != 1 {
		t.Errorf("NAT repairs counted: %d; want 1 (sluice's own writes are not repairs)", s.NATRepairs)
	}
}

// TestOnApplyAfterRestart: the agent hears of the first apply after each full update even
// when a restart finds the kernel right and writes nothing (it releases the cold start's
// garbage on the news of the first after etcd's), and then only of applies that write or
// fail.
func TestOnApplyAfterRestart(t *testing.T) {
	f := fakeNode()
	type call struct{ writes int }
	run := func(again bool) []call {
		var mu sync.Mutex
		var calls []call
		d := New(f, Config{Sysctl: func(string, string) error { return nil }, OnApply: func(err error, writes int, _ time.Duration) {
			if err != nil {
				t.Errorf("apply: %v", err)
			}
			mu.Lock()
			calls = append(calls, call{writes})
			mu.Unlock()
		}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); d.Run(ctx) }()
		d.OnUpdate(fullUpdate([]calc.Route{rBlackhole, rVXLAN}, []calc.VTEP{vLocal, vB}))
		waitFor(t, "the first apply", d.AppliedOnce)
		d.Kick() // an apply with nothing to do: not told
		time.Sleep(50 * time.Millisecond)
		if again {
			// The same state again, in full (a restart's kept state, then etcd's): told.
			mu.Lock()
			n := len(calls)
			mu.Unlock()
			d.OnUpdate(fullUpdate([]calc.Route{rBlackhole, rVXLAN}, []calc.VTEP{vLocal, vB}))
			waitFor(t, "the apply after the second full update", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) > n })
			d.Kick()
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return calls
	}
	if first := run(false); len(first) != 1 || first[0].writes == 0 {
		t.Fatalf("cold start: OnApply calls %v, want one with writes", first)
	}
	if again := run(false); len(again) != 1 || again[0].writes != 0 {
		t.Fatalf("restart: OnApply calls %v, want exactly one, with no writes", again)
	}
	if twice := run(true); len(twice) != 2 || twice[0].writes != 0 || twice[1].writes != 0 {
		t.Fatalf("restart with two full updates: OnApply calls %v, want two, with no writes", twice)
	}
}

// TestIPv6ForwardingFollowsIPv6Routes: IPv6 forwarding is switched on once an IPv6 route is
// desired, and never for IPv4 routes alone.
func TestIPv6ForwardingFollowsIPv6Routes(t *testing.T) {
	sys := &sysctlLog{writes: map[string]string{}}
	d := New(fakeNode(), Config{Sysctl: sys.write})
	written := func() (v4, v6 string) {
		sys.mu.Lock()
		defer sys.mu.Unlock()
		return sys.writes["net/ipv4/ip_forward"], sys.writes["net/ipv6/conf/all/forwarding"]
	}
	d.OnUpdate(fullUpdate([]calc.Route{rBlackhole, rVXLAN}, []calc.VTEP{vLocal, vB}))
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	if v4, v6 := written(); v4 != "1" || v6 != "" {
		t.Fatalf("IPv4 routes only: ip_forward %q, IPv6 forwarding %q; want 1 and untouched", v4, v6)
	}
	r6 := calc.Route{Dst: pfx("fd00:65::/122"), Type: calc.RouteBlackhole, Metric: 1024, Reason: calc.ReasonLocalBlock}
	d.OnUpdate(&calc.Update{Ops: []calc.Op{{Route: &r6}}})
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	if _, v6 := written(); v6 != "1" {
		t.Fatalf("with an IPv6 route: IPv6 forwarding %q, want 1", v6)
	}
}

// TestParentPerFamily: a route "via the parent" goes out of the link holding the node's
// address of its own family (IPv6 on eth1 here), and, when only the other family's is known,
// out of that link rather than nowhere.
func TestParentPerFamily(t *testing.T) {
	f := fakeNode()
	f.AddLink("eth1")
	f.AddAddr("eth1", node6)
	d := New(f, Config{Sysctl: func(string, string) error { return nil }})
	v6Only := v6Local
	direct4 := calc.Route{Dst: pfx("10.66.0.64/26"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.12"), OnLink: true, Reason: calc.ReasonRemoteBlock}
	direct6 := calc.Route{Dst: pfx("fd00:66::40/122"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("2001:db8::12"), OnLink: true, Reason: calc.ReasonRemoteBlock}
	// Only the IPv6 VTEP: both routes leave through eth1, the only parent known.
	d.OnUpdate(fullUpdate([]calc.Route{direct4, direct6}, []calc.VTEP{v6Only}))
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	rendered := f.Render(254)
	for _, want := range []string{"10.66.0.64/26 via 192.0.2.12 dev eth1", "fd00:66::40/122 via 2001:db8::12 dev eth1"} {
		if !strings.Contains(rendered, want) {
			t.Fatalf("with only an IPv6 VTEP, want %q in:\n%s", want, rendered)
		}
	}
	// The IPv4 VTEP arrives: IPv4 routes move to eth0, IPv6 stay on eth1.
	d.OnUpdate(&calc.Update{Ops: []calc.Op{{VTEP: &vLocal}}})
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	rendered = f.Render(254)
	for _, want := range []string{"10.66.0.64/26 via 192.0.2.12 dev eth0", "fd00:66::40/122 via 2001:db8::12 dev eth1"} {
		if !strings.Contains(rendered, want) {
			t.Fatalf("with both VTEPs, want %q in:\n%s", want, rendered)
		}
	}
}

// TestVTEPChangeDropsOldEntries: a remote VTEP whose MAC changes leaves no entries for the
// old MAC behind.
func TestVTEPChangeDropsOldEntries(t *testing.T) {
	f := fakeNode()
	d := New(f, Config{Sysctl: func(string, string) error { return nil }})
	d.OnUpdate(fullUpdate(nil, []calc.VTEP{vLocal, vB}))
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	moved := vB
	moved.MAC = mac("66:89:3a:22:7a:ff")
	d.OnUpdate(&calc.Update{Ops: []calc.Op{{VTEP: &moved}}})
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	got := f.RenderLink("vxlan.sluice")
	if strings.Contains(got, "66:89:3a:22:7a:ac") || !strings.Contains(got, "fdb 66:89:3a:22:7a:ff dst 192.0.2.12") ||
		!strings.Contains(got, "neigh 10.65.0.64 lladdr 66:89:3a:22:7a:ff") {
		t.Fatalf("after node-b's MAC changed:\n%s", got)
	}
}
