package dataplane

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-net/sluice/calc"
	"golang.org/x/sys/unix"
)

// Routes to two remote nodes as calc emits them: node-b behind the VXLAN tunnel (two blocks
// and its tunnel address), node-c on the same subnet.
var (
	nbBlock1 = calc.Route{Dst: pfx("10.65.0.64/26"), Type: calc.RouteUnicast, Device: "vxlan.sluice", Gateway: ip("10.65.0.64"), OnLink: true, Node: "node-b"}
	nbBlock2 = calc.Route{Dst: pfx("10.65.1.0/26"), Type: calc.RouteUnicast, Device: "vxlan.sluice", Gateway: ip("10.65.0.64"), OnLink: true, Node: "node-b"}
	ncBlock  = calc.Route{Dst: pfx("10.66.0.64/26"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.12"), OnLink: true, Node: "node-c"}
)

// moved is r through gateway gw.
func moved(r calc.Route, gw string) calc.Route {
	r.Gateway = ip(gw)
	return r
}

func nexthopTable(f *FakeKernel) *RouteTable {
	return NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr, Nexthops: true})
}

// id is sluice's nth nexthop ID.
func id(n uint32) uint32 { return DefaultRouteProtocol<<24 | n }

var nhidRE = regexp.MustCompile(`nhid \d+|id \d+`)

// anyIDs hides the IDs of a rendering: states reached in different orders may number their
// objects differently.
func anyIDs(s string) string {
	return nhidRE.ReplaceAllStringFunc(s, func(m string) string { return m[:strings.LastIndex(m, " ")] + " N" })
}

func TestNexthopTransitions(t *testing.T) {
	states := []struct {
		routes             []calc.Route
		routesWant, nhWant string
	}{
		{[]calc.Route{rBlackhole, rLocal, nbBlock1, nbBlock2, ncBlock}, fmt.Sprintf(`10.65.0.1/32 dev cali-web-1 proto 83 scope link
10.65.0.64/26 nhid %[1]d via 10.65.0.64 dev vxlan.sluice proto 83 onlink
10.65.1.0/26 nhid %[1]d via 10.65.0.64 dev vxlan.sluice proto 83 onlink
10.66.0.64/26 nhid %[2]d via 192.0.2.12 dev eth0 proto 83 onlink
blackhole 10.65.0.0/26 proto 83 metric 1024`, id(1), id(2)), fmt.Sprintf(`id %d via 10.65.0.64 dev vxlan.sluice proto 83 onlink
id %d via 192.0.2.12 dev eth0 proto 83 onlink`, id(1), id(2))},
		// node-b's tunnel address changes: its object keeps its ID and moves both routes.
		{[]calc.Route{rBlackhole, rLocal, moved(nbBlock1, "10.65.0.99"), moved(nbBlock2, "10.65.0.99"), ncBlock}, fmt.Sprintf(`10.65.0.1/32 dev cali-web-1 proto 83 scope link
10.65.0.64/26 nhid %[1]d via 10.65.0.99 dev vxlan.sluice proto 83 onlink
10.65.1.0/26 nhid %[1]d via 10.65.0.99 dev vxlan.sluice proto 83 onlink
10.66.0.64/26 nhid %[2]d via 192.0.2.12 dev eth0 proto 83 onlink
blackhole 10.65.0.0/26 proto 83 metric 1024`, id(1), id(2)), fmt.Sprintf(`id %d via 10.65.0.99 dev vxlan.sluice proto 83 onlink
id %d via 192.0.2.12 dev eth0 proto 83 onlink`, id(1), id(2))},
		// node-c goes: its route, then its object.
		{[]calc.Route{rBlackhole, moved(nbBlock1, "10.65.0.99")}, fmt.Sprintf(`10.65.0.64/26 nhid %d via 10.65.0.99 dev vxlan.sluice proto 83 onlink
blackhole 10.65.0.0/26 proto 83 metric 1024`, id(1)), fmt.Sprintf(`id %d via 10.65.0.99 dev vxlan.sluice proto 83 onlink`, id(1))},
		// node-b's block now reached directly: another object (node-b on eth0).
		{[]calc.Route{rBlackhole, {Dst: nbBlock1.Dst, Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: ip("192.0.2.13"), OnLink: true, Node: "node-b"}}, fmt.Sprintf(`10.65.0.64/26 nhid %d via 192.0.2.13 dev eth0 proto 83 onlink
blackhole 10.65.0.0/26 proto 83 metric 1024`, id(3)), fmt.Sprintf(`id %d via 192.0.2.13 dev eth0 proto 83 onlink`, id(3))},
		{nil, ``, ``},
	}
	f := fakeNode()
	rt := nexthopTable(f)
	writes := []int{7, 1, 4, 3, 3} // objects and routes written or deleted by each step
	for i, s := range states {
		before := f.Writes
		apply(t, rt, s.routes...)
		if got := f.Render(main); got != s.routesWant {
			t.Fatalf("state %d routes:\n%s\nwant:\n%s", i, got, s.routesWant)
		}
		if got := f.RenderNexthops(); got != s.nhWant {
			t.Fatalf("state %d nexthop objects:\n%s\nwant:\n%s", i, got, s.nhWant)
		}
		if got := f.Writes - before; got != writes[i] {
			t.Fatalf("state %d took %d writes, want %d", i, got, writes[i])
		}
	}
	// Other orders end the same (objects numbered as they came).
	for _, order := range [][]int{{4, 3, 2, 1, 0}, {0, 0, 1, 1, 2, 3, 3, 0}, {3, 1, 2}} {
		f := fakeNode()
		rt := nexthopTable(f)
		for _, i := range order {
			apply(t, rt, states[i].routes...)
		}
		last := states[order[len(order)-1]]
		if got := anyIDs(f.Render(main)); got != anyIDs(last.routesWant) {
			t.Fatalf("order %v:\n%s\nwant:\n%s", order, got, last.routesWant)
		}
		if got := anyIDs(f.RenderNexthops()); got != anyIDs(last.nhWant) {
			t.Fatalf("order %v objects:\n%s\nwant:\n%s", order, got, last.nhWant)
		}
	}
}

// TestNexthopRestartWritesNothing: a new table over a kernel that holds its state adopts the
// objects by gateway and device, whatever their IDs, and writes nothing.
func TestNexthopRestartWritesNothing(t *testing.T) {
	f := fakeNode()
	all := []calc.Route{rBlackhole, rLocal, nbBlock1, nbBlock2, ncBlock}
	// An earlier run numbered them otherwise (node-c first).
	apply(t, nexthopTable(f), rBlackhole, ncBlock)
	apply(t, nexthopTable(f), all...) // a restart that adds node-b
	restartWritesNothing(t, f, all...)
}

// restartWritesNothing starts a new nexthop-layout table over f, whose kernel holds routes
// already, and checks that applying them writes nothing and renumbers no object.
func restartWritesNothing(t *testing.T, f *FakeKernel, routes ...calc.Route) {
	t.Helper()
	before, objects := f.Writes, f.RenderNexthops()
	restarted := nexthopTable(f)
	apply(t, restarted, routes...)
	if f.Writes != before || restarted.Writes() != 0 {
		t.Fatalf("a restart with unchanged desired state wrote %d objects and routes:\n%s\nwere:\n%s", f.Writes-before, f.RenderNexthops(), objects)
	}
	if f.RenderNexthops() != objects {
		t.Fatalf("objects renumbered:\n%s\nwere:\n%s", f.RenderNexthops(), objects)
	}
}

// TestNexthopOwnership: other programs' objects are never replaced or deleted (nor is an ID
// they hold given to sluice's); sluice's objects nothing needs are deleted.
func TestNexthopOwnership(t *testing.T) {
	f := fakeNode()
	eth0 := f.links["eth0"]
	f.PutNexthop(Nexthop{ID: id(1), Gw: ip("192.0.2.1"), Link: eth0, Protocol: unix.RTPROT_STATIC})           // at the ID sluice would take first
	f.PutNexthop(Nexthop{ID: 7, Gw: ip("192.0.2.12"), Link: eth0, OnLink: true, Protocol: unix.RTPROT_ZEBRA}) // node-c's gateway, another program's
	f.PutNexthop(Nexthop{ID: id(40), Gw: ip("192.0.2.99"), Link: eth0, OnLink: true, Protocol: DefaultRouteProtocol})
	apply(t, nexthopTable(f), rBlackhole, nbBlock1, ncBlock)
	want := fmt.Sprintf(`id 7 via 192.0.2.12 dev eth0 proto 11 onlink
id %d via 192.0.2.1 dev eth0 proto 4
id %d via 10.65.0.64 dev vxlan.sluice proto 83 onlink
id %d via 192.0.2.12 dev eth0 proto 83 onlink`, id(1), id(2), id(3))
	if got := f.RenderNexthops(); got != want {
		t.Fatalf("objects:\n%s\nwant:\n%s", got, want)
	}
}

// TestNexthopIDTakenMeanwhile: another program creates an object at the ID sluice picked
// between sluice's read and its write: sluice's create fails (never replaces it), and the next
// apply gives sluice's object another ID.
func TestNexthopIDTakenMeanwhile(t *testing.T) {
	f := fakeNode()
	c := &conflicts{}
	rt := NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr, Nexthops: true, Reporter: c})
	rt.SetRoute(&nbBlock1)
	if err := rt.prepare(); err != nil {
		t.Fatal(err)
	}
	f.PutNexthop(Nexthop{ID: id(1), Gw: ip("192.0.2.1"), Link: f.links["eth0"], Protocol: unix.RTPROT_STATIC})
	if err := rt.write(); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("write = %v, want EEXIST", err)
	}
	if got := f.Render(main); got != "" {
		t.Fatalf("a route went through the other program's object:\n%s", got)
	}
	if err := rt.Apply(); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("id %d via 192.0.2.1 dev eth0 proto 4\nid %d via 10.65.0.64 dev vxlan.sluice proto 83 onlink", id(1), id(2))
	if got := f.RenderNexthops(); got != want {
		t.Fatalf("objects:\n%s\nwant:\n%s", got, want)
	}
	if got := f.Render(main); got != fmt.Sprintf("10.65.0.64/26 nhid %d via 10.65.0.64 dev vxlan.sluice proto 83 onlink", id(2)) {
		t.Fatalf("route: %s", got)
	}
	if want := fmt.Sprintf("nexthop %d proto 4", id(1)); strings.Join(c.got, ",") != want {
		t.Fatalf("conflicts reported: %v, want %s", c.got, want)
	}
}

// TestNexthopGoneRepair: an object deleted by someone takes its routes with it (the kernel
// tells of the object only); told of it, the next apply reads the kernel and puts back the
// object and its routes, and nothing else.
func TestNexthopGoneRepair(t *testing.T) {
	f := fakeNode()
	rt := nexthopTable(f)
	all := []calc.Route{rBlackhole, nbBlock1, nbBlock2, ncBlock}
	apply(t, rt, all...)
	want, objects := f.Render(main), f.RenderNexthops()
	f.DeleteNexthop(id(1))
	if strings.Contains(f.Render(main), "10.65.1.0/26") {
		t.Fatal("the fake kept routes through a deleted object")
	}
	if !rt.NexthopGone(id(1)) {
		t.Fatal("NexthopGone: sluice's object not recognised")
	}
	before := f.Writes
	if err := rt.Apply(); err != nil {
		t.Fatal(err)
	}
	if f.Render(main) != want || f.RenderNexthops() != objects {
		t.Fatalf("after the repair:\n%s\n%s\nwant:\n%s\n%s", f.Render(main), f.RenderNexthops(), want, objects)
	}
	if got := f.Writes - before; got != 3 {
		t.Fatalf("the repair took %d writes, want 3 (the object and its two routes)", got)
	}
	// A stale event (the object already back): the read finds it, nothing is written.
	if !rt.NexthopGone(id(1)) {
		t.Fatal("NexthopGone: sluice's object not recognised")
	}
	if err := rt.Apply(); err != nil || f.Writes != before+3 {
		t.Fatalf("after a stale event: %v, %d more writes", err, f.Writes-before-3)
	}
	if rt.NexthopGone(id(99)) {
		t.Fatal("NexthopGone: an object sluice never wanted")
	}
}

// TestNexthopLayoutSwitch: a restart in the other layout rewrites the routes in place and
// deletes sluice's objects, and back; another program's object stays.
func TestNexthopLayoutSwitch(t *testing.T) {
	f := fakeNode()
	f.PutNexthop(Nexthop{ID: 7, Gw: ip("192.0.2.1"), Link: f.links["eth0"], Protocol: unix.RTPROT_STATIC})
	all := []calc.Route{rBlackhole, rLocal, nbBlock1, ncBlock}
	apply(t, nexthopTable(f), all...)
	apply(t, NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr}), all...)
	if got := f.Render(main); got != allFour {
		t.Fatalf("gateway layout:\n%s", got)
	}
	if got := f.RenderNexthops(); got != "id 7 via 192.0.2.1 dev eth0 proto 4" {
		t.Fatalf("objects left in the gateway layout:\n%s", got)
	}
	apply(t, nexthopTable(f), all...)
	if got := f.Render(main); !strings.Contains(got, "10.65.0.64/26 nhid") || !strings.Contains(got, "10.66.0.64/26 nhid") {
		t.Fatalf("nexthop layout again:\n%s", got)
	}
}

// TestNexthopPartialFailure: an object the kernel refuses fails its routes alone; the retry
// completes them.
func TestNexthopPartialFailure(t *testing.T) {
	f := fakeNode()
	boom := errors.New("injected")
	f.FailWith(func(op, subject string) error {
		if op == "nexthop-set" && subject == fmt.Sprint(id(1)) {
			return boom
		}
		return nil
	})
	rt := nexthopTable(f)
	for _, r := range []calc.Route{rBlackhole, nbBlock1, nbBlock2, ncBlock} {
		rt.SetRoute(&r)
	}
	err := rt.Apply()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "10.65.0.64") {
		t.Fatalf("Apply = %v, want the injected error naming the gateway", err)
	}
	if got := f.Render(main); strings.Contains(got, "10.65.0.64/26") || strings.Contains(got, "10.65.1.0/26") || !strings.Contains(got, "10.66.0.64/26 nhid") {
		t.Fatalf("node-c's route must be in, node-b's not:\n%s", got)
	}
	f.FailWith(nil)
	if err := rt.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := f.Render(main); strings.Count(got, "nhid") != 3 {
		t.Fatalf("after the retry:\n%s", got)
	}
}

// ipNexthops is `ip nexthop show` in the node's namespace: iproute2's view, not sluice's.
func (n *testNode) ipNexthops() string {
	n.t.Helper()
	out, err := exec.Command("ip", "-n", n.name, "nexthop", "show").CombinedOutput()
	if err != nil {
		n.t.Fatalf("ip nexthop show: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestNexthopsRealKernel runs the dataplane in the nexthop layout in a fresh namespace: the
// objects and the routes through them as iproute2 shows them; a restart that writes nothing;
// an object deleted by hand (the kernel silently takes its routes) put back with its routes;
// a node's new tunnel address moving both its routes in one write; the VXLAN device taken
// down and up (the kernel flushes its objects without a word) put back.
func TestNexthopsRealKernel(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	ns := n.handle()
	var writes atomic.Int64
	var repairsMu sync.Mutex
	var repairs []string
	run := func() (*Dataplane, func()) {
		d := New(n.kernel(), Config{Sysctl: func(string, string) error { return nil }, Routes: RouteTableConfig{Nexthops: true},
			OnRepair: func(kind, what string) {
				repairsMu.Lock()
				repairs = append(repairs, kind+": "+what)
				repairsMu.Unlock()
			},
			OnApply: func(err error, w int, _ time.Duration) {
				if err != nil {
					t.Errorf("apply: %v", err)
				}
				writes.Add(int64(w))
			}})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); d.Run(ctx) }()
		go func() { defer wg.Done(); _ = d.Watch(ctx, ns) }()
		return d, func() { cancel(); wg.Wait() }
	}
	d, stop := run()
	defer func() { stop() }()
	all := []calc.Route{rBlackhole, rLocal, nbBlock1, nbBlock2, ncBlock}
	d.OnUpdate(fullUpdate(all, []calc.VTEP{vLocal, vB, vC}))
	wantRoutes := fmt.Sprintf(`10.65.0.1/32 dev cali-web-1 proto 83 scope link
10.65.0.64/26 nhid %[1]d via 10.65.0.64 dev vxlan.sluice proto 83 onlink
10.65.1.0/26 nhid %[1]d via 10.65.0.64 dev vxlan.sluice proto 83 onlink
10.66.0.64/26 nhid %[2]d via 192.0.2.12 dev eth0 proto 83 onlink
blackhole 10.65.0.0/26 proto 83 metric 1024`, id(1), id(2))
	wantIP := fmt.Sprintf("id %d via 10.65.0.64 dev vxlan.sluice scope link proto 83 onlink \nid %d via 192.0.2.12 dev eth0 scope link proto 83 onlink", id(1), id(2))
	waitFor(t, "the first apply", func() bool { return n.routes(DefaultRouteProtocol) == wantRoutes })
	if got := n.ipNexthops(); got != wantIP {
		t.Fatalf("ip nexthop show:\n%q\nwant:\n%q", got, wantIP)
	}
	if s := d.Stats(); s.DesiredNexthops != 2 || s.ProgrammedNexthops != 2 {
		t.Fatalf("stats: %+v", s)
	}

	// Restart: the objects and routes are adopted, nothing written.
	stop()
	writes.Store(0)
	d, stop = run()
	d.OnUpdate(fullUpdate(all, []calc.VTEP{vLocal, vB, vC}))
	// The watch subscribed (its first act is a resync) and the apply after it ran.
	waitFor(t, "the restart's first apply", func() bool { return d.Stats().Resyncs > 0 && d.Synced() })
	if w := writes.Load(); w != 0 || n.routes(DefaultRouteProtocol) != wantRoutes {
		t.Fatalf("restart wrote %d:\n%s", w, n.routes(DefaultRouteProtocol))
	}

	// An object deleted by hand: the kernel drops node-b's two routes without telling.
	if out, err := exec.Command("ip", "-n", n.name, "nexthop", "del", "id", fmt.Sprint(id(1))).CombinedOutput(); err != nil {
		t.Fatalf("ip nexthop del: %v: %s", err, out)
	}
	took := waitFor(t, "the object and its routes to come back", func() bool {
		return n.routes(DefaultRouteProtocol) == wantRoutes && n.ipNexthops() == wantIP
	})
	t.Logf("object and its 2 routes repaired in %v", took)
	if s := d.Stats(); s.NexthopRepairs != 1 {
		t.Fatalf("nexthop repairs: %d", s.NexthopRepairs)
	}
	repairsMu.Lock()
	if want := fmt.Sprintf("nexthop: nexthop object %d (and the routes through it)", id(1)); len(repairs) != 1 || repairs[0] != want {
		t.Errorf("repairs told: %q, want %q", repairs, want)
	}
	repairsMu.Unlock()

	// node-b's tunnel address changes: one write moves both its routes.
	waitFor(t, "quiet", func() bool { return d.Synced() })
	routeTableWrites := func() int { d.mu.Lock(); defer d.mu.Unlock(); return d.routes.Writes() }
	before := routeTableWrites()
	vB2 := vB
	vB2.TunnelAddr = ip("10.65.0.99")
	d.OnUpdate(&calc.Update{Ops: []calc.Op{{VTEP: &vB2}, {Route: ptr(moved(nbBlock1, "10.65.0.99"))}, {Route: ptr(moved(nbBlock2, "10.65.0.99"))}}})
	waitFor(t, "node-b's routes to move", func() bool {
		return strings.Count(n.routes(DefaultRouteProtocol), "via 10.65.0.99") == 2
	})
	if got := n.ipNexthops(); !strings.Contains(got, fmt.Sprintf("id %d via 10.65.0.99 dev vxlan.sluice", id(1))) {
		t.Fatalf("the object did not keep its ID:\n%s", got)
	}
	time.Sleep(50 * time.Millisecond)
	// The neighbour and FDB entry of the new address and the old ones' removal are the VXLAN
	// device's; of the routes and objects, one write: the object replaced in place.
	if s := d.Stats(); s.ProgrammedRoutes != 5 {
		t.Fatalf("stats after the move: %+v", s)
	}
	if w := routeTableWrites() - before; w != 1 {
		t.Errorf("the move took %d route and object writes, want 1", w)
	}

	// The VXLAN device down and up: the kernel flushed its objects and their routes.
	want := n.routes(DefaultRouteProtocol)
	if out, err := exec.Command("ip", "-n", n.name, "link", "set", "vxlan.sluice", "down").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := exec.Command("ip", "-n", n.name, "link", "set", "vxlan.sluice", "up").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	took = waitFor(t, "the device's objects and routes to come back", func() bool {
		return n.routes(DefaultRouteProtocol) == want && strings.Count(n.ipNexthops(), "proto 83") == 2
	})
	t.Logf("VXLAN device down and up: objects and routes back in %v", took)
}

func ptr[T any](v T) *T { return &v }

// TestNexthopDiff: the diff lists a missing object and the routes it took, shown with the
// object's gateway and device, and an object of sluice's nothing needs as extra; it writes
// nothing.
func TestNexthopDiff(t *testing.T) {
	f := fakeNode()
	cfg := Config{ParentAddr: nodeAddr, Routes: RouteTableConfig{Nexthops: true}}
	all := []calc.Route{rBlackhole, nbBlock1, nbBlock2, ncBlock}
	apply(t, NewRouteTable(f, RouteTableConfig{ParentAddr: nodeAddr, Nexthops: true}), all...)
	u := fullUpdate(all, nil)
	// The route table's lines only: the fake's vxlan.sluice is a bare link, not a device
	// this test programs.
	diffNoDevice := func(k Kernel, cfg Config, u *calc.Update) (missing, extra []string, err error) {
		missing, extra, err = Diff(k, cfg, u)
		isDevice := func(l string) bool { return strings.HasPrefix(l, "device ") }
		return slices.DeleteFunc(missing, isDevice), slices.DeleteFunc(extra, isDevice), err
	}
	if missing, extra, err := diffNoDevice(f, cfg, u); err != nil || len(missing)+len(extra) != 0 {
		t.Fatalf("diff of a matching kernel: %v %v %v", missing, extra, err)
	}
	f.DeleteNexthop(id(1))
	f.PutNexthop(Nexthop{ID: id(9), Gw: ip("10.65.9.9"), Link: f.links["vxlan.sluice"], OnLink: true, Protocol: DefaultRouteProtocol})
	before := f.Writes
	missing, extra, err := diffNoDevice(f, cfg, u)
	if err != nil {
		t.Fatal(err)
	}
	wantMissing := []string{
		fmt.Sprintf("10.65.0.64/26 nhid %d via 10.65.0.64 dev vxlan.sluice proto 83 onlink", id(1)),
		fmt.Sprintf("10.65.1.0/26 nhid %d via 10.65.0.64 dev vxlan.sluice proto 83 onlink", id(1)),
		fmt.Sprintf("nexthop id %d via 10.65.0.64 dev vxlan.sluice proto 83 onlink", id(1)),
	}
	wantExtra := []string{fmt.Sprintf("nexthop id %d via 10.65.9.9 dev vxlan.sluice proto 83 onlink", id(9))}
	if strings.Join(missing, "\n") != strings.Join(wantMissing, "\n") || strings.Join(extra, "\n") != strings.Join(wantExtra, "\n") {
		t.Fatalf("diff:\nmissing %q\nextra %q\nwant\nmissing %q\nextra %q", missing, extra, wantMissing, wantExtra)
	}
	if f.Writes != before {
		t.Fatal("the diff wrote")
	}
}
