package dataplane

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// batchRoutes is n routes /26 apart via gateways on eth0; the routes at the indexes in bad go
// through an interface index that does not exist, so the kernel refuses them.
func batchRoutes(n, eth0 int, bad map[int]bool) []*Route {
	rs := make([]*Route, n)
	for i := range rs {
		a := i * 64
		link := eth0
		if bad[i] {
			link = 999_999
		}
		rs[i] = &Route{Route: netlink.Route{
			Dst: &net.IPNet{IP: net.IPv4(10, byte(64+a>>16), byte(a>>8), byte(a)).To4(), Mask: net.CIDRMask(26, 32)},
			Gw:  net.IPv4(192, 0, 2, byte(100+i%100)).To4(), Type: unix.RTN_UNICAST,
			LinkIndex: link, Table: unix.RT_TABLE_MAIN, Protocol: DefaultRouteProtocol, Flags: int(netlink.FLAG_ONLINK),
		}}
	}
	return rs
}

// TestRouteBatcherRealKernel writes routes spread over many packets, with refused routes at a
// packet's start, middle and end, and checks that exactly those fail, with the kernel's own
// error, and every other route is in the kernel.
func TestRouteBatcherRealKernel(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	const total = 2000 // about five packets
	bad := map[int]bool{0: true, 1: true, 777: true, total - 1: true}
	rs := batchRoutes(total, n.link("eth0").Attrs().Index, bad)
	errs := n.kernel().RouteReplaceMany(rs)
	if len(errs) != total {
		t.Fatalf("%d errors for %d routes", len(errs), total)
	}
	for i, err := range errs {
		if bad[i] != (err != nil) {
			t.Errorf("route %d (%s): error %v, want one: %v", i, rs[i].Dst, err, bad[i])
		}
		if bad[i] && err != syscall.ENODEV {
			t.Errorf("route %d: error %v, want the kernel's ENODEV", i, err)
		}
	}
	got := strings.Count(n.routes(DefaultRouteProtocol), "\n") + 1
	if got != total-len(bad) {
		t.Fatalf("%d routes in the kernel, want %d", got, total-len(bad))
	}
	// The same socket goes on working after the failures, and replacing is idempotent.
	k := n.kernel()
	if errs := k.RouteReplaceMany(rs[2:5]); errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("second batch: %v", errs)
	}
	// Deleting in bulk: the refused routes were never there, which is not an error.
	for i, err := range k.RouteDelMany(rs) {
		if err != nil {
			t.Errorf("deleting route %d (%s): %v", i, rs[i].Dst, err)
		}
	}
	if got := n.routes(DefaultRouteProtocol); got != "" {
		t.Fatalf("routes left after deleting them all:\n%s", got)
	}
}

// BenchmarkRouteWrite adds 20,000 routes to a fresh namespace's kernel, packed into packets
// (sluice's way), beside the same routes sent one request at a time, each waiting for its
// acknowledgement (the way `ip -batch` and netlink.RouteReplace send them), and `ip -batch`
// itself. Run as root: make bench-dataplane.
func BenchmarkRouteWrite(b *testing.B) {
	nstest.NeedRoot(b, "programs a kernel")
	const total = 20_000
	name, ns, ip := benchNamespace(b, "rw")
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		b.Fatal(err)
	}
	rs := batchRoutes(total, eth0.Attrs().Index, nil)
	k, err := NewKernel(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	var script strings.Builder
	for _, r := range rs {
		script.WriteString("route replace " + r.Dst.String() + " via " + r.Gw.String() + " dev eth0 onlink proto 83\n")
	}
	flush := func() {
		b.StopTimer()
		ip("route", "flush", "proto", "83")
		b.StartTimer()
	}
	b.Run("packed", func(b *testing.B) {
		for range b.N {
			flush()
			for _, err := range k.RouteReplaceMany(rs) {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	shuffled := append([]*Route(nil), rs...)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	b.Run("packed-shuffled", func(b *testing.B) {
		for range b.N {
			flush()
			for _, err := range k.RouteReplaceMany(shuffled) {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	// The same with a route subscription open, as sluiced always has: netlink's own, which
	// hears every route, and sluice's, whose socket filter drops sluice's own new routes.
	listened := func(subscribe func(chan netlink.RouteUpdate, chan struct{}) error) func(b *testing.B) {
		return func(b *testing.B) {
			ch := make(chan netlink.RouteUpdate, 4096)
			done := make(chan struct{})
			defer close(done)
			if err := subscribe(ch, done); err != nil {
				b.Fatal(err)
			}
			go func() {
				for range ch {
				}
			}()
			for range b.N {
				flush()
				for _, err := range k.RouteReplaceMany(rs) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		}
	}
	b.Run("packed-netlink-subscribed", listened(func(ch chan netlink.RouteUpdate, done chan struct{}) error {
		return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{Namespace: &ns,
			ReceiveBufferSize: subscriptionBuffer, ReceiveBufferForceSize: true})
	}))
	b.Run("packed-sluice-subscribed", listened(func(ch chan netlink.RouteUpdate, done chan struct{}) error {
		return subscribeRoutes(&ns, DefaultRouteProtocol, ch, done, subscriptionBuffer, func(error) {})
	}))
	b.Run("one-ack-each", func(b *testing.B) {
		for range b.N {
			flush()
			for _, r := range rs {
				if err := h.RouteReplace(&r.Route); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("ip-batch", func(b *testing.B) {
		for range b.N {
			flush()
			cmd := exec.Command("ip", "-n", name, "-batch", "-")
			cmd.Stdin = strings.NewReader(script.String())
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%v %s", err, out)
			}
		}
	})
}

// TestRouteSubscriptionFilter: the route subscription hears another program's new route and
// the deletion of one of sluice's, but not sluice's own new routes, which its socket filter
// drops in the kernel.
func TestRouteSubscriptionFilter(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	ns := n.handle()
	ch := make(chan netlink.RouteUpdate, 100)
	done := make(chan struct{})
	defer close(done)
	if err := subscribeRoutes(&ns, DefaultRouteProtocol, ch, done, 1<<20, func(err error) { t.Error(err) }); err != nil {
		t.Fatal(err)
	}
	eth0 := n.link("eth0").Attrs().Index
	ours := batchRoutes(3, eth0, nil)
	for _, err := range n.kernel().RouteReplaceMany(ours) {
		if err != nil {
			t.Fatal(err)
		}
	}
	foreign := batchRoutes(4, eth0, nil)[3]
	foreign.Protocol = unix.RTPROT_STATIC
	foreign.Priority = 7
	if err := n.h.RouteAdd(&foreign.Route); err != nil {
		t.Fatal(err)
	}
	if err := n.h.RouteDel(&ours[1].Route); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		select {
		case u := <-ch:
			if !strings.HasPrefix(u.Dst.String(), "10.64.") {
				continue // the kernel's own IPv6 link-local routes as eth0 comes up
			}
			got = append(got, fmt.Sprintf("type=%d %s table=%d proto=%d metric=%d", u.Type, u.Dst, u.Table, u.Protocol, u.Priority))
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d events: %v", len(got), got)
		}
	}
	want := []string{
		fmt.Sprintf("type=%d 10.64.0.192/26 table=254 proto=4 metric=7", unix.RTM_NEWROUTE),
		fmt.Sprintf("type=%d 10.64.0.64/26 table=254 proto=83 metric=0", unix.RTM_DELROUTE),
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for {
		select {
		case u := <-ch:
			if strings.HasPrefix(u.Dst.String(), "10.64.") {
				t.Fatalf("an event too many: type=%d %s proto=%d", u.Type, u.Dst, u.Protocol)
			}
		case <-time.After(100 * time.Millisecond):
			return
		}
	}
}

// TestRouteBatcherSurvivesLostAnswers: with a receive buffer too small for the errors a
// packet brings back, the kernel drops answers. The packet whose answers were lost counts as
// failed where no error came (its routes are written again later), the batch goes on with
// the next packets, and the socket works at once for the next batch (drained, not left
// congested until a timeout).
func TestRouteBatcherSurvivesLostAnswers(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	k, err := NewKernel(n.handle())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	b := k.batch
	if err := b.sock.SetReceiveBufferSize(4096, false); err != nil {
		t.Fatal(err)
	}
	b.perPacket = 1 << 20 // cut by bytes only: far more errors per packet than the buffer holds
	const total = 3000
	bad := map[int]bool{}
	for i := range 1000 {
		bad[i] = true
	}
	rs := batchRoutes(total, n.link("eth0").Attrs().Index, bad)
	errs := b.replace(rs)
	lost := 0
	for i, err := range errs {
		switch {
		case bad[i] && err == nil:
			t.Fatalf("route %d was refused by the kernel but reported written", i)
		case errors.Is(err, unix.ENOBUFS):
			lost++
		case !bad[i] && err != nil:
			t.Fatalf("route %d: %v", i, err)
		}
	}
	if lost == 0 {
		t.Fatal("no answers were lost: the test did not overflow the buffer")
	}
	in := n.routes(DefaultRouteProtocol)
	for i, r := range rs {
		if errs[i] == nil && !strings.Contains(in, r.Dst.String()+" ") {
			t.Fatalf("route %d (%s) reported written but not in the kernel", i, r.Dst)
		}
	}
	if errs[total-1] != nil {
		t.Fatalf("the batch did not go on after the lost answers: last route %v", errs[total-1])
	}
	// The next batch is answered normally.
	for i, err := range b.replace(batchRoutes(total+10, n.link("eth0").Attrs().Index, nil)[total:]) {
		if err != nil {
			t.Fatalf("next batch, route %d: %v", i, err)
		}
	}
}

// benchNamespace makes a network namespace for a benchmark, removed when it ends, with eth0
// (192.0.2.11/24, a veth whose peer is up) in it; it returns the name, a handle (closed at
// the end) and a function running `ip -n <name> ARGS`.
func benchNamespace(b *testing.B, tag string) (string, netns.NsHandle, func(args ...string)) {
	name := "sluice-bench-" + tag + "-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ns.Close() })
	ip := func(args ...string) {
		if out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput(); err != nil {
			b.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	ip("link", "add", "eth0", "type", "veth", "peer", "name", "peth0")
	ip("addr", "add", "192.0.2.11/24", "dev", "eth0")
	ip("link", "set", "eth0", "up")
	ip("link", "set", "peth0", "up")
	return name, ns, ip
}
