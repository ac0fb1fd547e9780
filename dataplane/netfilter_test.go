package dataplane

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/vishvananda/netlink"
)

// nfWorld is a node forwarding between a workload on cali-w1 (client: 10.65.0.5) and a
// server on eth1 (198.51.100.2:8080), with what kube-proxy and Calico leave in iptables-nft
// after a migration, beside an operator's own chain.
type nfWorld struct {
	node, client, server *testNode
}

func newNFWorld(t *testing.T) *nfWorld {
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("planting the leftovers as kube-proxy and Calico do needs iptables (apt-get install iptables)")
	}
	w := &nfWorld{node: newTestNode(t), client: newTestNode(t), server: newTestNode(t)}
	pair := func(local string, peer *testNode, addr, peerAddr, gw string) {
		t.Helper()
		ns := peer.handle()
		if err := w.node.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: local}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}); err != nil {
			t.Fatal(err)
		}
		for _, c := range [][]string{
			{"-n", w.node.name, "addr", "add", addr, "dev", local}, {"-n", w.node.name, "link", "set", local, "up"},
			{"-n", peer.name, "addr", "add", peerAddr, "dev", "eth0"}, {"-n", peer.name, "link", "set", "eth0", "up"},
			{"-n", peer.name, "route", "add", "default", "via", gw},
		} {
			if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v: %s", c, err, out)
			}
		}
	}
	pair("cali-w1", w.client, "10.65.0.1/24", "10.65.0.5/24", "10.65.0.1")
	pair("eth1", w.server, "198.51.100.1/24", "198.51.100.2/24", "198.51.100.1")
	w.node.ipt("-w", "-P", "FORWARD", "ACCEPT")
	if out, err := exec.Command("ip", "netns", "exec", w.node.name, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("forwarding: %v: %s", err, out)
	}
	var ln net.Listener
	w.server.do(func() {
		var err error
		if ln, err = net.Listen("tcp", "198.51.100.2:8080"); err != nil {
			t.Fatal(err)
		}
	})
	nstest.Greet(t, ln, "", nil)
	return w
}

// ipt runs iptables in the node's namespace.
func (n *testNode) ipt(args ...string) string {
	n.t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.name, "iptables"}, args...)...).CombinedOutput()
	if err != nil {
		n.t.Fatalf("iptables %v: %v: %s", args, err, out)
	}
	return string(out)
}

// reach says whether the workload reaches the server through the node.
func (w *nfWorld) reach() error {
	var err error
	w.client.do(func() {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", "198.51.100.2:8080", 500*time.Millisecond); err == nil {
			c.Close()
		}
	})
	return err
}

func (w *nfWorld) find(t *testing.T, view NetfilterView) ([]NetfilterLeftover, *nftables.Conn) {
	t.Helper()
	ns := w.node.handle()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	found, err := FindNetfilter(c, view)
	if err != nil {
		t.Fatal(err)
	}
	return found, c
}

// TestNetfilterLeftovers: kube-proxy's and Calico's iptables-nft chains are found and judged
// rule by rule; Calico's "Unknown interface" drop is shown to cut the workload off; the
// cleanup removes exactly the breaking owners' chains and jumps, and the workload's traffic
// flows again, while kube-proxy's dormant service chains and the operator's chain stay.
func TestNetfilterLeftovers(t *testing.T) {
	w := newNFWorld(t)
	n := w.node
	if err := w.reach(); err != nil {
		t.Fatalf("the workload reaches the server before any leftover: %v", err)
	}
	for _, r := range [][]string{
		// kube-proxy (iptables mode): the forward chain's INVALID drop, a service's DNAT.
		{"-N", "KUBE-FORWARD"},
		{"-A", "FORWARD", "-m", "comment", "--comment", "kubernetes forwarding rules", "-j", "KUBE-FORWARD"},
		{"-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"},
		{"-t", "nat", "-N", "KUBE-SERVICES"}, {"-t", "nat", "-N", "KUBE-SVC-DNS"},
		{"-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"},
		{"-t", "nat", "-A", "OUTPUT", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"},
		{"-t", "nat", "-A", "KUBE-SERVICES", "-d", "10.96.0.10/32", "-p", "tcp", "--dport", "53", "-j", "KUBE-SVC-DNS"},
		{"-t", "nat", "-A", "KUBE-SVC-DNS", "-p", "tcp", "-j", "DNAT", "--to-destination", "10.65.9.9:53"},
		// Calico (iptables mode): interfaces it does not know are dropped.
		{"-N", "cali-FORWARD"}, {"-N", "cali-from-wl-dispatch"},
		{"-A", "FORWARD", "-j", "cali-FORWARD"},
		{"-A", "cali-FORWARD", "-i", "cali+", "-j", "cali-from-wl-dispatch"},
		{"-A", "cali-from-wl-dispatch", "-m", "comment", "--comment", "Unknown interface", "-j", "DROP"},
		// The operator's own.
		{"-N", "MY-FW"}, {"-A", "INPUT", "-j", "MY-FW"}, {"-A", "MY-FW", "-s", "203.0.113.0/24", "-j", "DROP"},
	} {
		n.ipt(append([]string{"-w"}, r...)...)
	}
	if err := w.reach(); err == nil {
		t.Fatal("the workload on cali-w1 reaches the server through Calico's \"Unknown interface\" drop")
	}
	mine := n.ipt("-S", "MY-FW") + n.ipt("-S", "INPUT")

	// With the socket programs off, kube-proxy's DNAT in nat OUTPUT takes the node's own
	// connections to services: breaking then, and only then.
	off, _ := w.find(t, NetfilterView{SocketProgramsOff: true})
	for _, f := range off {
		if f.Owner == "kube-proxy" && f.Table == "nat" && (!f.Breaking || !strings.Contains(strings.Join(f.Breaks, ";"), "nat OUTPUT")) {
			t.Errorf("with the socket programs off, kube-proxy's nat chains: %s %q", f.Effect(), f.Breaks)
		}
	}
	found, c := w.find(t, NetfilterView{})
	got := map[string]NetfilterLeftover{}
	for _, f := range found {
		got[f.Owner+" "+f.Family+" "+f.Table] = f
	}
	for key, want := range map[string]struct {
		effect, breaks, hooks string
	}{
		// sluice's service paths pass an INVALID drop (make demo runs them behind one).
		"kube-proxy ip filter": {"dormant", "act only on packets sluice's programs leave untranslated", "FORWARD"},
		"kube-proxy ip nat":    {"dormant", "act only on packets sluice's programs leave untranslated", "nat PREROUTING,nat OUTPUT"},
		"calico ip filter":     {"breaking", "cali-from-wl-dispatch drops packets of interfaces named cali*", "FORWARD"},
	} {
		f, ok := got[key]
		if !ok {
			t.Errorf("%s not found in %v", key, found)
			continue
		}
		if f.Effect() != want.effect || !strings.Contains(strings.Join(f.Breaks, "; "), want.breaks) || strings.Join(f.Hooks, ",") != want.hooks || f.Fix == "" {
			t.Errorf("%s: %s %q hooks %v fix %q; want %s, %q, %s", key, f.Effect(), f.Breaks, f.Hooks, f.Fix, want.effect, want.breaks, want.hooks)
		}
	}
	if len(got) != 3 {
		t.Errorf("found %d leftovers, want 3 (the operator's chain is none): %v", len(got), found)
	}

	for _, f := range found {
		if f.Removable() {
			if err := f.Remove(c); err != nil {
				t.Fatalf("removing %s: %v", f, err)
			}
		}
	}
	if err := w.reach(); err != nil {
		t.Fatalf("the workload after the cleanup: %v", err)
	}
	after := n.ipt("-S")
	if strings.Contains(after, "cali-") || !strings.Contains(after, "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP") {
		t.Errorf("after the cleanup Calico's chains should be gone and kube-proxy's dormant forward chain kept:\n%s", after)
	}
	if nat := n.ipt("-t", "nat", "-S"); !strings.Contains(nat, "-A KUBE-SVC-DNS -p tcp -j DNAT --to-destination 10.65.9.9:53") ||
		!strings.Contains(nat, "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES") {
		t.Errorf("kube-proxy's dormant service chains went:\n%s", nat)
	}
	if now := n.ipt("-S", "MY-FW") + n.ipt("-S", "INPUT"); now != mine {
		t.Errorf("the operator's chain changed:\n%s\nwas\n%s", now, mine)
	}
	if found, _ := w.find(t, NetfilterView{}); len(found) != 2 || found[0].Owner != "kube-proxy" || found[1].Owner != "kube-proxy" {
		t.Errorf("after the cleanup found %v; want kube-proxy's dormant chains only", found)
	}
}

// TestNetfilterLeftoversAgent: the dataplane's leftover pass reads netfilter too: Calico's
// breaking chains are removed (--clean-conflicts) and reported removed, kube-proxy's dormant
// service chains reported present, and reported gone once someone removes them.
func TestNetfilterLeftoversAgent(t *testing.T) {
	w := newNFWorld(t)
	n := w.node
	for _, r := range [][]string{
		{"-N", "cali-FORWARD"}, {"-A", "FORWARD", "-j", "cali-FORWARD"},
		{"-A", "cali-FORWARD", "-i", "cali+", "-m", "comment", "--comment", "Unknown interface", "-j", "DROP"},
		{"-t", "nat", "-N", "KUBE-SERVICES"}, {"-t", "nat", "-A", "OUTPUT", "-j", "KUBE-SERVICES"},
		{"-t", "nat", "-A", "KUBE-SERVICES", "-d", "10.96.0.10/32", "-p", "udp", "--dport", "53", "-j", "DNAT", "--to-destination", "10.65.9.9:53"},
	} {
		n.ipt(append([]string{"-w"}, r...)...)
	}
	var mu sync.Mutex
	var heard []string
	sys := &sysctlLog{writes: map[string]string{}}
	d := New(n.kernel(), Config{Sysctl: sys.write, CleanConflicts: true, OnNetfilter: func(l NetfilterLeftover) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, fmt.Sprintf("%s %s %s removed=%v gone=%v", l.Owner, l.Table, l.Effect(), l.Removed, l.Gone))
	}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	d.OnUpdate(fullUpdate(nil, nil)) // no routes of its own: the world's own addresses are in the test pool
	has := func(s string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(heard, s)
	}
	waitFor(t, "Calico's chains removed and kube-proxy's reported", func() bool {
		return has("calico filter breaking removed=true gone=false") && has("kube-proxy nat dormant removed=false gone=false")
	})
	if err := w.reach(); err != nil {
		t.Fatalf("the workload after Calico's chains went: %v", err)
	}
	n.ipt("-w", "-t", "nat", "-D", "OUTPUT", "-j", "KUBE-SERVICES")
	n.ipt("-w", "-t", "nat", "-F", "KUBE-SERVICES")
	n.ipt("-w", "-t", "nat", "-X", "KUBE-SERVICES")
	d.QueueResync()
	waitFor(t, "kube-proxy's chains reported gone", func() bool { return has("kube-proxy nat dormant removed=false gone=true") })
	mu.Lock()
	defer mu.Unlock()
	if len(heard) != 3 {
		t.Errorf("heard %q; want each once", heard)
	}
}
