package dataplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
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

type leftoverLog struct {
	mu  sync.Mutex
	got []Leftover
}

func (l *leftoverLog) add(x Leftover) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, x)
}

func (l *leftoverLog) keys(removed bool) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, x := range l.got {
		if x.Removed == removed {
			out = append(out, x.Key)
		}
	}
	return out
}

// leftoverNode is a namespace after a Flannel-then-Calico history: cni0 still holds an
// address in the pool (its connected route covers sluice's blocks), and Calico's vxlan.calico
// still sits on VNI 4096, port 4789.
func leftoverNode(t *testing.T) *testNode {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	if err := n.h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0"}}); err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr("10.65.0.129/25")
	if err := n.h.AddrAdd(n.link("cni0"), a); err != nil {
		t.Fatal(err)
	}
	if err := n.h.LinkSetUp(n.link("cni0")); err != nil {
		t.Fatal(err)
	}
	if err := n.h.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan.calico"}, VxlanId: 4096, Port: 4789}); err != nil {
		t.Fatal(err)
	}
	return n
}

func runDataplane(t *testing.T, n *testNode, clean bool) (*Dataplane, *leftoverLog) {
	log := &leftoverLog{}
	return runDataplaneWith(t, n, Config{CleanConflicts: clean, OnLeftover: log.add}), log
}

// runDataplaneWith runs a dataplane configured by cfg (sysctls recorded, not written) in n,
// with its kernel watch, until the test ends, and hands it the leftover tests' desired state:
// node-c's block 10.65.0.128/26 through vxlan.sluice.
func runDataplaneWith(t *testing.T, n *testNode, cfg Config) *Dataplane {
	ns := n.handle()
	cfg.Sysctl = (&sysctlLog{writes: map[string]string{}}).write
	d := New(n.kernel(), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); d.Run(ctx) }()
	go func() { defer wg.Done(); _ = d.Watch(ctx, ns) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	d.OnUpdate(fullUpdate([]calc.Route{rBlackhole, rLocal, {Dst: pfx("10.65.0.128/26"), Type: calc.RouteUnicast, Device: "vxlan.sluice", Gateway: ip("10.65.0.128"), OnLink: true}}, []calc.VTEP{vLocal, vC}))
	return d
}

func TestLeftoversReportedNotTouched(t *testing.T) {
	n := leftoverNode(t)
	_, log := runDataplane(t, n, false)
	waitFor(t, "both leftovers reported", func() bool { return len(log.keys(false)) >= 2 })
	time.Sleep(100 * time.Millisecond)
	got := strings.Join(log.keys(false), "|")
	if !strings.Contains(got, "route 10.65.0.128/25 metric 0 dev cni0") || !strings.Contains(got, "device vxlan.calico") {
		t.Fatalf("reported %q", got)
	}
	if c := strings.Count(got, "|") + 1; c != 2 {
		t.Fatalf("reported %d times, want each once: %q", c, got)
	}
	for _, x := range log.got {
		if !strings.Contains(x.Fix, "--clean-conflicts") {
			t.Fatalf("no advice in %+v", x)
		}
	}
	if out := n.routes(-1); !strings.Contains(out, "10.65.0.128/25 dev cni0") {
		t.Fatalf("the leftover route was removed without --clean-conflicts:\n%s", out)
	}
	if _, err := n.h.LinkByName("vxlan.calico"); err != nil {
		t.Fatal("the leftover device was removed without --clean-conflicts")
	}
	// Removed by hand: reported once more, as gone, at the next read.
	if err := n.h.LinkDel(n.link("vxlan.calico")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the device reported gone", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, x := range log.got {
			if x.Key == "device vxlan.calico" && x.Gone && x.Kind == "device" && x.Owner == "calico" {
				return true
			}
		}
		return false
	})
}

// TestLeftoversCleaned: --clean-conflicts removes the route through cni0 over sluice's pool
// and Calico's vxlan.calico on sluice's VNI and port; the decoys of the same kinds stay byte
// for byte: Flannel's VXLAN device on another VNI and port, and an operator's ip rule.
func TestLeftoversCleaned(t *testing.T) {
	n := leftoverNode(t)
	if err := n.h.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "flannel.1"}, VxlanId: 1, Port: 8472}); err != nil {
		t.Fatal(err)
	}
	ip := func(args ...string) string {
		out, err := exec.Command("ip", append([]string{"-n", n.name}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	ip("rule", "add", "priority", "200", "from", "198.51.100.0/24", "lookup", "300")
	decoys := func() string { return ip("-d", "link", "show", "flannel.1") + ip("rule", "show") }
	before := decoys()
	d, log := runDataplane(t, n, true)
	waitFor(t, "the leftovers removed and sluice's dataplane complete", func() bool {
		out := n.routes(-1)
		_, calico := n.h.LinkByName("vxlan.calico")
		return !strings.Contains(out, "cni0") && calico != nil &&
			strings.Contains(out, "10.65.0.128/26 via 10.65.0.128 dev vxlan.sluice") && d.Synced()
	})
	if got := strings.Join(log.keys(true), "|"); !strings.Contains(got, "cni0") || !strings.Contains(got, "vxlan.calico") {
		t.Fatalf("removals reported: %q", got)
	}
	// Calico's old device removed; sluice's own on the same VNI and port works.
	vx := n.link("vxlan.sluice").(*netlink.Vxlan)
	if vx.VxlanId != 4096 || vx.Port != 4789 {
		t.Fatalf("vxlan.sluice: %+v", vx)
	}
	_, dst, _ := net.ParseCIDR("10.65.0.0/26")
	rs, _ := n.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: dst, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if len(rs) != 1 || rs[0].Type != unix.RTN_BLACKHOLE {
		t.Fatalf("the blackhole: %+v", rs)
	}
	if after := decoys(); after != before {
		t.Errorf("the decoys changed:\n%s\nwere\n%s", after, before)
	}
}

// TestNormalRoutesAreNotLeftovers: the default route and a wider route out of the uplink are
// how networks are built, not leftovers.
func TestNormalRoutesAreNotLeftovers(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	for _, r := range []string{"default via 192.0.2.1 dev eth0", "10.0.0.0/8 via 192.0.2.254 dev eth0"} {
		if _, err := exec.Command("ip", append([]string{"-n", n.name, "route", "add"}, strings.Fields(r)...)...).CombinedOutput(); err != nil {
			t.Fatal(err)
		}
	}
	d, log := runDataplane(t, n, true)
	waitFor(t, "sync", d.Synced)
	time.Sleep(100 * time.Millisecond)
	if got := log.keys(false); len(got) != 0 || len(log.keys(true)) != 0 {
		t.Fatalf("normal routes reported as leftovers: %v %v", got, log.keys(true))
	}
	if out := n.routes(0); !strings.Contains(out, "0.0.0.0/0 via 192.0.2.1") || !strings.Contains(out, "10.0.0.0/8 via 192.0.2.254") {
		t.Fatalf("normal routes touched:\n%s", out)
	}
	// Flannel's device on another VNI shares sluice's port: it coexists, and is no leftover.
	if err := n.h.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "flannel.1"}, VxlanId: 1, Port: 4789}); err != nil {
		t.Fatal(err)
	}
	if err := n.h.LinkSetUp(n.link("flannel.1")); err != nil {
		t.Fatalf("flannel.1 on sluice's port with another VNI cannot come up: %v", err)
	}
	// A flow-based device on sluice's port does not coexist (it would need the port to
	// itself: it cannot come up beside sluice's): Cilium's is found when it appears and, opted
	// in, removed; an unknown one is reported and left.
	// (The kernel holds one flow-based device per port: one after the other.)
	flow := func(name string) {
		if err := n.h.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, FlowBased: true, Port: 4789}); err != nil {
			t.Fatal(err)
		}
	}
	flow("cilium_vxlan")
	waitFor(t, "Cilium's flow-based device removed", func() bool {
		_, err := n.h.LinkByName("cilium_vxlan")
		return err != nil && strings.Contains(strings.Join(log.keys(true), "|"), "device cilium_vxlan")
	})
	flow("ext-vx0")
	if err := n.h.LinkSetUp(n.link("ext-vx0")); err == nil {
		t.Error("a flow-based device came up on sluice's port beside sluice's device: then it is no leftover")
	}
	waitFor(t, "the unknown flow-based device reported", func() bool {
		return strings.Contains(strings.Join(log.keys(false), "|"), "device ext-vx0")
	})
	time.Sleep(100 * time.Millisecond)
	for _, name := range []string{"flannel.1", "ext-vx0"} {
		if _, err := n.h.LinkByName(name); err != nil {
			t.Errorf("%s removed: %v", name, err)
		}
	}
	for _, x := range log.got {
		if strings.Contains(x.Key, "flannel.1") {
			t.Errorf("reported %+v", x)
		}
		if x.Key == "device ext-vx0" && (!strings.Contains(x.What, "flow-based") || strings.Contains(x.Fix, "--clean-conflicts")) {
			t.Errorf("the unknown flow-based device: %+v; want it named flow-based, with no --clean-conflicts advice", x)
		}
	}
}

// TestVXLANLeftover: which other VXLAN devices keep sluice's from working: one on its VNI and
// port (of the same family), or a flow-based one on its port; not one on another VNI or port.
func TestVXLANLeftover(t *testing.T) {
	v4 := VXLANConfig{Name: "vxlan.sluice", VNI: 4096, Port: 4789}
	v6 := VXLANConfig{IPv6: true, Name: "vxlan-v6.sluice", VNI: 4096, Port: 4789}
	dev := func(name string, vni, port int, flow bool, src string) *netlink.Vxlan {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, VxlanId: vni, Port: port, FlowBased: flow}
		if src != "" {
			vx.SrcAddr = net.ParseIP(src)
		}
		return vx
	}
	for _, c := range []struct {
		vx    *netlink.Vxlan
		want  string // what it says, "" when no leftover
		owner string
	}{
		{dev("vxlan.calico", 4096, 4789, false, ""), "uses VNI 4096 on UDP port 4789, which sluice's vxlan.sluice needs", "calico"},
		{dev("vxlan-v6.calico", 4096, 4789, false, "2001:db8::1"), "which sluice's vxlan-v6.sluice needs", "calico"},
		{dev("flannel.1", 1, 4789, false, ""), "", ""},
		{dev("vxlan.other", 4096, 8472, false, ""), "", ""},
		{dev("cilium_vxlan", 0, 4789, true, ""), "flow-based (external) VXLAN device cilium_vxlan takes UDP port 4789", "cilium"},
		{dev("cilium_vxlan", 0, 8472, true, ""), "", ""},
		{dev("vx0", 4096, 4789, false, "192.0.2.1"), "uses VNI 4096", ""},
	} {
		lo, ok := vxlanLeftover(c.vx, v4, v6)
		if ok != (c.want != "") || ok && (!strings.Contains(lo.What, c.want) || lo.Owner != c.owner) {
			t.Errorf("%s VNI %d port %d flow %v: %v %+v; want %q by %q", c.vx.Name, c.vx.VxlanId, c.vx.Port, c.vx.FlowBased, ok, lo, c.want, c.owner)
		}
		if ok && strings.Contains(lo.Fix, "--clean-conflicts") != (c.owner != "") {
			t.Errorf("%s: fix %q; --clean-conflicts is advised for known owners only", c.vx.Name, lo.Fix)
		}
	}
}

// TestRuleLeftovers: an ip rule ahead of the main table sending packets to a table with a
// route over sluice's pool is reported (and, its owner unknown, never removed); a rule that
// selects by firewall mark, and one whose table routes nothing of sluice's, are not.
func TestRuleLeftovers(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	for _, c := range [][]string{
		{"route", "add", "10.65.0.0/16", "dev", "eth0", "table", "200"},
		{"rule", "add", "priority", "100", "to", "10.65.0.0/16", "lookup", "200"},
		{"route", "add", "10.65.0.0/16", "dev", "eth0", "table", "201"},
		{"rule", "add", "priority", "101", "fwmark", "0x200/0xf00", "lookup", "201"},
		{"route", "add", "198.18.0.0/16", "dev", "eth0", "table", "202"},
		{"rule", "add", "priority", "102", "lookup", "202"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", n.name}, c...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	d, log := runDataplane(t, n, true)
	waitFor(t, "sync", d.Synced)
	waitFor(t, "the rule reported", func() bool { return strings.Contains(strings.Join(log.keys(false), "|"), "rule 100 table 200") })
	time.Sleep(100 * time.Millisecond)
	for _, x := range log.got {
		if strings.Contains(x.Key, "rule 101") || strings.Contains(x.Key, "rule 102") || x.Removed {
			t.Errorf("reported %+v", x)
		}
		if x.Key == "rule 100 table 200" && (!strings.Contains(x.What, "overlaps sluice's route to 10.65.0.") || !strings.Contains(x.Fix, "ip rule del priority 100")) {
			t.Errorf("the rule's report: %+v", x)
		}
	}
	if out, _ := exec.Command("ip", "-n", n.name, "rule", "show", "priority", "100").CombinedOutput(); !strings.Contains(string(out), "lookup 200") {
		t.Errorf("the rule of an unknown owner was removed: %s", out)
	}
}

// TestDormantDevices: other agents' own devices left behind (Cilium's cilium_host, Calico's
// bpfin.cali) are reported dormant, with their owner, and never removed.
func TestDormantDevices(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	for _, name := range []string{"cilium_host", "bpfin.cali"} {
		if err := n.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name[:6] + "-p"}); err != nil {
			t.Fatal(err)
		}
	}
	d, log := runDataplane(t, n, true)
	waitFor(t, "sync", d.Synced)
	waitFor(t, "both reported", func() bool {
		got := strings.Join(log.keys(false), "|")
		return strings.Contains(got, "device cilium_host") && strings.Contains(got, "device bpfin.cali")
	})
	log.mu.Lock()
	for _, x := range log.got {
		if !x.Dormant || x.Removed || (x.Owner != "cilium" && x.Owner != "calico") {
			t.Errorf("reported %+v; want dormant, kept, its owner named", x)
		}
	}
	log.mu.Unlock()
	for _, name := range []string{"cilium_host", "bpfin.cali"} {
		if _, err := n.h.LinkByName(name); err != nil {
			t.Errorf("%s removed: %v", name, err)
		}
	}
}

// replacedLog hears the route table's replacements (a RouteReporter), from the dataplane's
// goroutine.
type replacedLog struct {
	mu  sync.Mutex
	got []string
}

func (r *replacedLog) Conflict(dst netip.Prefix, metric, proto int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, fmt.Sprintf("%s metric %d proto %d", dst, metric, proto))
}

func (r *replacedLog) NexthopConflict(uint32, int) {}

func (r *replacedLog) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// TestCalicoBlockNowRemote: a node that ran Calico keeps Felix's blackhole for a block that is
// now another node's, and vxlan.calico on sluice's VNI and port, so sluice's VXLAN device and
// its route to that block cannot be made. The blackhole is a breaking leftover, owned by
// Calico, never said to be replaced while it stays (before, "replaced another program's
// route" was logged at once), and never removed by --clean-conflicts on its own. Once the
// device is gone, sluice's route replaces it, which is reported once, and the leftover is
// reported gone.
func TestCalicoBlockNowRemote(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	if err := n.h.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan.calico"}, VxlanId: 4096, Port: 4789}); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "-n", n.name, "route", "add", "blackhole", "10.65.0.128/26", "proto", "80").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	log, replaced := &leftoverLog{}, &replacedLog{}
	runDataplaneWith(t, n, Config{OnLeftover: log.add, Routes: RouteTableConfig{Reporter: replaced}})

	const key = "route 10.65.0.128/26 metric 0 at sluice's"
	find := func(gone bool) *Leftover {
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, x := range log.got {
			if x.Key == key && x.Gone == gone {
				return &x
			}
		}
		return nil
	}
	waitFor(t, "the blackhole reported", func() bool { return find(false) != nil })
	lo := find(false)
	if lo.Dormant || lo.Owner != "calico" || lo.Kind != "route" || !strings.Contains(lo.What, "blackhole route 10.65.0.128/26 (protocol 80") ||
		!strings.Contains(lo.What, "cannot be written yet") {
		t.Fatalf("reported %+v", lo)
	}
	time.Sleep(300 * time.Millisecond) // a few applies
	if got := replaced.list(); len(got) != 0 {
		t.Fatalf("reported as replaced while it stays: %q", got)
	}
	if out := n.routes(-1); !strings.Contains(out, "blackhole 10.65.0.128/26 proto 80") {
		t.Fatalf("the blackhole:\n%s", out)
	}

	// The device in the way removed by hand: sluice's device and route follow.
	if err := n.h.LinkDel(n.link("vxlan.calico")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sluice's route in place", func() bool {
		return strings.Contains(n.routes(-1), "10.65.0.128/26 via 10.65.0.128 dev vxlan.sluice")
	})
	waitFor(t, "the blackhole reported gone", func() bool { return find(true) != nil })
	if got := replaced.list(); len(got) != 1 || got[0] != "10.65.0.128/26 metric 0 proto 80" {
		t.Fatalf("replacements reported %q; want Calico's blackhole, once", got)
	}
}

// TestOrdinaryRoutesAreNotLeftovers: a second card's connected subnet, a VPN's split default
// route and an operator's override at the same destination are left alone, even with
// --clean-conflicts.
func TestOrdinaryRoutesAreNotLeftovers(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("eth1", "10.0.0.1/8")
	n.iface("tun0", "")
	n.iface("cali-web-1", "")
	for _, r := range []string{"0.0.0.0/1 dev tun0", "10.65.0.0/26 via 192.0.2.254 dev eth0 metric 10"} {
		if out, err := exec.Command("ip", append([]string{"-n", n.name, "route", "add"}, strings.Fields(r)...)...).CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
	}
	d, log := runDataplane(t, n, true)
	waitFor(t, "sync", d.Synced)
	if got := append(log.keys(false), log.keys(true)...); len(got) != 0 {
		t.Fatalf("ordinary routes taken for leftovers: %v", got)
	}
	out := n.routes(-1)
	for _, want := range []string{"10.0.0.0/8 dev eth1", "0.0.0.0/1 dev tun0", "10.65.0.0/26 via 192.0.2.254 dev eth0 proto 3 metric 10"} {
		if !strings.Contains(out, want) {
			t.Fatalf("%q was removed:\n%s", want, out)
		}
	}
}
