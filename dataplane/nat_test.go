package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/sluice-net/sluice/calc"
	"github.com/vishvananda/netns"
)

func setNet(n *OutgoingNAT, c calc.ClusterNet) { n.OnOp(calc.Op{ClusterNet: &c}) }
func deleteNet(n *OutgoingNAT, p netip.Prefix) {
	n.OnOp(calc.Op{Remove: true, ClusterNet: &calc.ClusterNet{Prefix: p}})
}
func setFIP(n *OutgoingNAT, f calc.FloatingIP) { n.OnOp(calc.Op{FloatingIP: &f}) }
func deleteFIP(n *OutgoingNAT, ext netip.Addr) {
	n.OnOp(calc.Op{Remove: true, FloatingIP: &calc.FloatingIP{External: ext}})
}

func pool(cidr string, masq bool) calc.ClusterNet {
	return calc.ClusterNet{Prefix: netip.MustParsePrefix(cidr), Masquerade: masq, KeepSource: true}
}

// TestOutgoingNATTransitions: the table appears with the first natOutgoing pool, is written
// once per change and not again when nothing changed, goes with the last such pool, is
// adopted as it is after a restart, repaired when someone changed it, and a refused write is
// tried again.
func TestOutgoingNATTransitions(t *testing.T) {
	k := NewFakeKernel()
	n := newOutgoingNAT(k, NATConfig{})
	apply := func(wantWrites int, want string) {
		t.Helper()
		before := k.Writes
		if err := n.Apply(); err != nil {
			t.Fatal(err)
		}
		if got := k.NAT(); k.Writes-before != wantWrites || got != want {
			t.Fatalf("apply: %d writes, table %q; want %d and %q", k.Writes-before, got, wantWrites, want)
		}
	}
	// Pools without natOutgoing: no table.
	setNet(n, pool("10.66.0.0/16", false))
	setNet(n, calc.ClusterNet{Prefix: netip.MustParsePrefix("192.0.2.11/32"), Host: true, Node: "node-a"})
	apply(0, "")
	// One with: the table, pools kept, the node address not (IPPoolsOnly).
	setNet(n, pool("10.65.0.0/16", true))
	apply(1, "masq4 {10.65.0.0/16} keep4 {10.65.0.0/16, 10.66.0.0/16} masq6 {} keep6 {} masquerade from port 32768")
	apply(0, "masq4 {10.65.0.0/16} keep4 {10.65.0.0/16, 10.66.0.0/16} masq6 {} keep6 {} masquerade from port 32768")
	// The same net again: nothing.
	setNet(n, pool("10.65.0.0/16", true))
	apply(0, "masq4 {10.65.0.0/16} keep4 {10.65.0.0/16, 10.66.0.0/16} masq6 {} keep6 {} masquerade from port 32768")
	// IPv6 pool and a host address kept (IPPoolsAndHostIPs): one write.
	setNet(n, pool("fd00:65::/48", true))
	setNet(n, calc.ClusterNet{Prefix: netip.MustParsePrefix("192.0.2.11/32"), Host: true, Node: "node-a", KeepSource: true})
	full := "masq4 {10.65.0.0/16} keep4 {10.65.0.0/16, 10.66.0.0/16, 192.0.2.11/32} masq6 {fd00:65::/48} keep6 {fd00:65::/48} masquerade from port 32768"
	apply(1, full)

	// A restart: a new driver adopts the table with no write.
	n = newOutgoingNAT(k, NATConfig{})
	for _, c := range []calc.ClusterNet{pool("10.65.0.0/16", true), pool("10.66.0.0/16", false), pool("fd00:65::/48", true),
		{Prefix: netip.MustParsePrefix("192.0.2.11/32"), Host: true, Node: "node-a", KeepSource: true}} {
		setNet(n, c)
	}
	apply(0, full)

	// Drift: someone emptied a set; the resync puts it back.
	k.nat.masq4 = nil
	n.QueueResync()
	apply(1, full)

	// A refused write fails the apply, and the next one writes.
	deleteNet(n, netip.MustParsePrefix("fd00:65::/48"))
	k.FailWith(func(op, _ string) error {
		if op == "nat-write" {
			return errors.New("no room")
		}
		return nil
	})
	if err := n.Apply(); err == nil || !strings.Contains(err.Error(), NATTable) {
		t.Fatalf("refused write: %v; want an error naming the table", err)
	}
	k.FailWith(nil)
	apply(1, "masq4 {10.65.0.0/16} keep4 {10.65.0.0/16, 10.66.0.0/16, 192.0.2.11/32} masq6 {} keep6 {} masquerade from port 32768")

	// natOutgoing off on the last pool: the table goes.
	setNet(n, pool("10.65.0.0/16", false))
	apply(1, "")
	apply(0, "")
}

func TestMergePrefixesAndRanges(t *testing.T) {
	got := mergePrefixes([]netip.Prefix{netip.MustParsePrefix("10.65.1.0/24"), netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("10.65.0.0/16")})
	if fmt.Sprint(got) != "[10.0.0.0/8 192.0.2.1/32]" {
		t.Fatalf("merged %v", got)
	}
	for _, c := range []struct{ p, first, after string }{
		{"10.65.0.0/16", "10.65.0.0", "10.66.0.0"},
		{"192.0.2.1/32", "192.0.2.1", "192.0.2.2"},
		{"fd00:65::/48", "fd00:65::", "fd00:65:1::"},
		{"255.255.255.0/24", "255.255.255.0", "invalid IP"},
	} {
		f, a := prefixRange(netip.MustParsePrefix(c.p))
		if f.String() != c.first || a.String() != c.after {
			t.Fatalf("range of %s: %v %v", c.p, f, a)
		}
		if p, ok := prefixOfRange(f, a); !ok || p.String() != c.p {
			t.Fatalf("prefix of [%v, %v): %v %v", f, a, p, ok)
		}
	}
}

// TestOutgoingNATRealKernel: a workload in a natOutgoing pool reaches an address outside
// every pool with the node's address as its source, while traffic to another pool's
// workload keeps the workload's address; SNAT to a chosen address works the same; the table
// reads back as written (a restart writes nothing), and deleting it is repaired at a resync.
//
//	work (10.65.0.5) ── node (10.65.0.1 side; 192.0.2.11 uplink) ── outside (192.0.2.1)
//	peer (10.66.0.9) ──┘
func TestOutgoingNATRealKernel(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (6 s): make test runs it")
	}
	tp := newNATTopology(t)
	node, work, peer, k := tp.node, tp.work, tp.peer, tp.k
	ip := tp.ip
	listen, sourceSeen := tp.listen, tp.sourceSeen
	out := tp.out
	outside := listen(out, "192.0.2.1")
	toPeer := listen(peer, "10.66.0.9")

	// Another program's table, which sluice must never touch.
	foreign, err := nftables.New(nftables.WithNetNSFd(k.netnsFd))
	if err != nil {
		t.Fatal(err)
	}
	foreign.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "operator"})
	if err := foreign.Flush(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		tables, err := foreign.ListTablesOfFamily(nftables.TableFamilyINet)
		if err != nil || !slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == "operator" }) {
			t.Errorf("another program's table is gone (%v)", err)
		}
	}()

	// Without sluice's table the outside cannot answer a workload's own address.
	if got := sourceSeen(work, outside); got != "" {
		t.Fatalf("before NAT the outside answered %q; the test topology leaks", got)
	}
	n := newOutgoingNAT(k, NATConfig{})
	setNet(n, pool("10.65.0.0/16", true))
	setNet(n, pool("10.66.0.0/16", false))
	setNet(n, calc.ClusterNet{Prefix: netip.MustParsePrefix("192.0.2.11/32"), Host: true, Node: "node-a"})
	if err := n.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := sourceSeen(work, outside); got != "192.0.2.11" {
		t.Fatalf("outside saw %q; want the node's address 192.0.2.11", got)
	}
	if got := sourceSeen(work, toPeer); got != "10.65.0.5" {
		t.Fatalf("the other pool's workload saw %q; want the workload's own 10.65.0.5", got)
	}
	// The peer's pool has no natOutgoing: its traffic out is not translated (and so gets no
	// answer here).
	if got := sourceSeen(peer, outside); got != "" {
		t.Fatalf("a workload of a pool without natOutgoing reached the outside as %q", got)
	}

	// Read back: what was written; a restarted driver writes nothing.
	r, ok, err := k.readNAT()
	if err != nil || !ok || !r.equal(n.desired()) {
		t.Fatalf("read back %v %v %v; want %s", r, ok, err, n.desired())
	}
	// Deleted behind sluice's back: repaired at the next resync.
	if err := k.writeNAT(nil); err != nil {
		t.Fatal(err)
	}
	n.QueueResync()
	if err := n.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := sourceSeen(work, outside); got != "192.0.2.11" {
		t.Fatalf("after repair the outside saw %q", got)
	}

	// SNAT to a chosen address (natOutgoingAddress) instead of masquerade.
	ip(node.name, "addr", "add", "192.0.2.99/24", "dev", "up0")
	n2 := newOutgoingNAT(k, NATConfig{Address4: netip.MustParseAddr("192.0.2.99")})
	setNet(n2, pool("10.65.0.0/16", true))
	if err := n2.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := sourceSeen(work, outside); got != "192.0.2.99" {
		t.Fatalf("with SNAT the outside saw %q; want 192.0.2.99", got)
	}
	if r, ok, err := k.readNAT(); err != nil || !ok || r.addr4 != netip.MustParseAddr("192.0.2.99") {
		t.Fatalf("read back %v %v %v", r, ok, err)
	}

	// A floating IP, 192.0.2.50 for the workload's 10.65.0.5 (the route to it, calc's, by
	// hand here; the outside routes it to the node).
	ip(node.name, "route", "add", "192.0.2.50/32", "dev", "w0")
	ip(out.name, "route", "add", "192.0.2.50/32", "via", "192.0.2.11")
	atWork := listen(work, "10.65.0.5")
	_, port, _ := net.SplitHostPort(atWork.Addr().String())
	n3 := newOutgoingNAT(k, NATConfig{})
	setNet(n3, pool("10.65.0.0/16", true))
	setNet(n3, pool("10.66.0.0/16", false))
	setFIP(n3, calc.FloatingIP{External: netip.MustParseAddr("192.0.2.50"), Internal: netip.MustParseAddr("10.65.0.5"), Workload: "ns/vm1"})
	if err := n3.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := tp.sourceAt(out, "192.0.2.50:"+port); got != "192.0.2.1" {
		t.Fatalf("the outside through the floating IP: the workload saw %q; want the client's own 192.0.2.1", got)
	}
	if got := sourceSeen(work, outside); got != "192.0.2.50" {
		t.Fatalf("the workload's own traffic out: the outside saw %q; want the floating IP 192.0.2.50", got)
	}
	if got := sourceSeen(work, toPeer); got != "10.65.0.5" {
		t.Fatalf("to another pool the workload kept %q; want 10.65.0.5", got)
	}
	if got := tp.sourceAt(node, "192.0.2.50:"+port); got == "" {
		t.Fatal("the node itself cannot reach the floating IP")
	}
	if got := tp.sourceAt(work, "192.0.2.50:"+port); got != "192.0.2.50" {
		t.Fatalf("the workload through its own floating IP (hairpin) was seen as %q; want 192.0.2.50", got)
	}
	r3, ok3, err := k.readNAT()
	if err != nil || !ok3 || !r3.equal(n3.desired()) {
		t.Fatalf("read back with a floating IP: %v %v %v; want %s", r3, ok3, err, n3.desired())
	}
	// Gone (the workload moved away): the floating IP no longer leads here.
	deleteFIP(n3, netip.MustParseAddr("192.0.2.50"))
	if err := n3.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := tp.sourceAt(out, "192.0.2.50:"+port); got != "" {
		t.Fatalf("after the floating IP went, the outside still reached the workload (seen as %q)", got)
	}
}

// TestDataplaneOutgoingNAT: cluster nets from calc's updates reach the NAT table through the
// dataplane: a full update, a delta, a full update that drops a net, and the table deleted
// behind sluice's back put back by a resync.
func TestDataplaneOutgoingNAT(t *testing.T) {
	fk := NewFakeKernel()
	fk.AddLink("eth0")
	fk.AddAddr("eth0", netip.MustParseAddr("192.0.2.11"))
	d := New(fk, Config{ParentAddr: netip.MustParseAddr("192.0.2.11")})
	net := func(c calc.ClusterNet) calc.Op { return calc.Op{ClusterNet: &c} }
	// Nothing before the first full update (in-sync).
	early := pool("10.65.0.0/16", true)
	d.OnUpdate(&calc.Update{Ops: []calc.Op{{ClusterNet: &early}}})
	if err := d.Apply(); err != nil || fk.NAT() != "" {
		t.Fatalf("before in-sync: %v, table %q; want nothing written", err, fk.NAT())
	}
	d.OnUpdate(&calc.Update{Full: true, Ops: []calc.Op{net(pool("10.65.0.0/16", true)), net(pool("10.66.0.0/16", false))}})
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	want := "masq4 {10.65.0.0/16} keep4 {10.65.0.0/16, 10.66.0.0/16} masq6 {} keep6 {} masquerade from port 32768"
	if got := fk.NAT(); got != want || d.Stats().NAT != want {
		t.Fatalf("after the full update: %q (stats %q); want %q", got, d.Stats().NAT, want)
	}
	c := pool("10.67.0.0/16", true)
	d.OnUpdate(&calc.Update{Ops: []calc.Op{{ClusterNet: &c}}})
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := fk.NAT(); !strings.Contains(got, "masq4 {10.65.0.0/16, 10.67.0.0/16}") {
		t.Fatalf("after a delta: %q", got)
	}
	d.OnUpdate(&calc.Update{Full: true, Ops: []calc.Op{net(pool("10.66.0.0/16", false))}})
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := fk.NAT(); got != "" {
		t.Fatalf("no natOutgoing pool left, the table is %q; want none", got)
	}
	d.OnUpdate(&calc.Update{Full: true, Ops: []calc.Op{net(pool("10.65.0.0/16", true))}})
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	fk.DeleteNAT()
	d.mu.Lock()
	d.resyncAllLocked()
	d.mu.Unlock()
	if err := d.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := fk.NAT(); !strings.Contains(got, "masq4 {10.65.0.0/16}") {
		t.Fatalf("after a resync the table is %q", got)
	}
	// A floating IP comes and goes with calc's ops; a full update without it removes it.
	f := calc.FloatingIP{External: netip.MustParseAddr("192.0.2.50"), Internal: netip.MustParseAddr("10.65.0.5"), Workload: "ns/vm1"}
	d.OnUpdate(&calc.Update{Ops: []calc.Op{{FloatingIP: &f}}})
	if err := d.Apply(); err != nil || !strings.Contains(fk.NAT(), "fip 192.0.2.50->10.65.0.5") {
		t.Fatalf("with a floating IP: %v, %q", err, fk.NAT())
	}
	d.OnUpdate(&calc.Update{Full: true, Ops: []calc.Op{net(pool("10.65.0.0/16", false))}})
	if err := d.Apply(); err != nil || fk.NAT() != "" {
		t.Fatalf("nothing to translate any more: %v, table %q", err, fk.NAT())
	}
}

// natTopology is TestOutgoingNATRealKernel's network (and BenchmarkOutgoingNAT's): a node
// namespace between two workloads (pools 10.65/16 and 10.66/16) and an outside host.
type natTopology struct {
	tb                    testing.TB
	node, work, peer, out *testNode
	k                     nftNAT
}

func newNATTopology(tb testing.TB) *natTopology {
	tp := &natTopology{tb: tb, node: newTestNode(tb), work: newTestNode(tb), peer: newTestNode(tb), out: newTestNode(tb)}
	wire := func(a *testNode, aName, aAddr string, b *testNode, bName, bAddr string) {
		tb.Helper()
		tp.ip(a.name, "link", "add", aName, "type", "veth", "peer", "name", bName, "netns", b.name)
		tp.ip(a.name, "addr", "add", aAddr, "dev", aName)
		tp.ip(b.name, "addr", "add", bAddr, "dev", bName)
		tp.ip(a.name, "link", "set", aName, "up")
		tp.ip(b.name, "link", "set", bName, "up")
	}
	wire(tp.node, "w0", "10.65.0.1/32", tp.work, "eth0", "10.65.0.5/32")
	wire(tp.node, "w1", "10.66.0.1/32", tp.peer, "eth0", "10.66.0.9/32")
	wire(tp.node, "up0", "192.0.2.11/24", tp.out, "eth0", "192.0.2.1/24")
	tp.ip(tp.node.name, "route", "add", "10.65.0.5/32", "dev", "w0")
	tp.ip(tp.node.name, "route", "add", "10.66.0.9/32", "dev", "w1")
	for _, w := range []*testNode{tp.work, tp.peer} {
		tp.ip(w.name, "route", "add", "10.65.0.1/32", "dev", "eth0")
		tp.ip(w.name, "route", "add", "10.66.0.1/32", "dev", "eth0")
		tp.ip(w.name, "route", "add", "default", "via", "10.65.0.1", "dev", "eth0", "onlink")
	}
	tp.routeOn("net.ipv4.ip_forward=1")
	return tp
}

// routeOn makes the node forward (sysctl) and gives the test its NAT kernel there, whose
// table goes before the namespace does.
func (tp *natTopology) routeOn(sysctl string) {
	tp.tb.Helper()
	if b, err := exec.Command("ip", "netns", "exec", tp.node.name, "sysctl", "-qw", sysctl).CombinedOutput(); err != nil {
		tp.tb.Fatalf("sysctl: %v %s", err, b)
	}
	// The handle's cleanup, registered first, runs after the table's.
	tp.k = nftNAT{netnsFd: int(tp.node.handle())}
	tp.tb.Cleanup(func() { _ = tp.k.writeNAT(nil) })
}

func (tp *natTopology) ip(ns string, args ...string) {
	tp.tb.Helper()
	if b, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
		tp.tb.Fatalf("ip -n %s %v: %v: %s", ns, args, err, b)
	}
}

// listen serves, in n, TCP on addr (any port): each connection is answered with the
// client's address as seen, one line.
func (tp *natTopology) listen(n *testNode, addr string) net.Listener {
	tp.tb.Helper()
	var l net.Listener
	var err error
	n.do(func() { l, err = net.Listen("tcp", net.JoinHostPort(addr, "0")) })
	if err != nil {
		tp.tb.Fatal(err)
	}
	tp.tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			_, _ = io.WriteString(c, host+"\n")
			// The client closes first (and keeps the TIME-WAIT): a server that closed first
			// would hold one per connection, and a client picking a port again would see
			// its SYN ignored for a second.
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return l
}

// sourceSeen connects from w to l and returns the source address l saw ("" when the
// connection failed).
func (tp *natTopology) sourceSeen(w *testNode, l net.Listener) string {
	tp.tb.Helper()
	return tp.sourceAt(w, l.Addr().String())
}

// sourceAt connects from w to addr (host:port) and returns the source address the listener
// there saw ("" when the connection failed).
func (tp *natTopology) sourceAt(w *testNode, addr string) string {
	tp.tb.Helper()
	var c net.Conn
	var err error
	w.do(func() { c, err = net.DialTimeout("tcp", addr, 2*time.Second) })
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

// BenchmarkOutgoingNAT: connections per second through sluice's translations beside the same
// connections without them, in the same run: from a workload to a host outside every pool,
// masqueraded vs routed back (the outside then routes the pool to the node); and from that
// host to a workload's floating IP vs to its own address.
func BenchmarkOutgoingNAT(b *testing.B) {
	tp := newNATTopology(b)
	atOut := tp.listen(tp.out, "192.0.2.1")
	atWork := tp.listen(tp.work, "10.65.0.5")
	_, port, _ := net.SplitHostPort(atWork.Addr().String())
	work, out := tp.work.handle(), tp.out.handle()
	const conns = 2000
	rate := func(ns netns.NsHandle, addr string) float64 {
		var n int
		var took time.Duration
		inNS(b, ns, func() {
			start := time.Now()
			for range conns {
				c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
				if err != nil {
					continue
				}
				buf := make([]byte, 16)
				if _, err := c.Read(buf); err == nil {
					n++
				}
				c.Close()
			}
			took = time.Since(start)
		})
		if n != conns {
			b.Fatalf("%s: %d of %d connections answered", addr, n, conns)
		}
		return float64(conns) / took.Seconds()
	}
	tp.ip(tp.node.name, "route", "add", "192.0.2.50/32", "dev", "w0")
	tp.ip(tp.out.name, "route", "add", "192.0.2.50/32", "via", "192.0.2.11")
	nat := newOutgoingNAT(tp.k, NATConfig{})
	setNet(nat, pool("10.65.0.0/16", true))
	setFIP(nat, calc.FloatingIP{External: netip.MustParseAddr("192.0.2.50"), Internal: netip.MustParseAddr("10.65.0.5")})
	var direct, masq, in, fip []float64
	for range 3 {
		tp.ip(tp.out.name, "route", "add", "10.65.0.0/16", "via", "192.0.2.11")
		direct = append(direct, rate(work, atOut.Addr().String()))
		in = append(in, rate(out, "10.65.0.5:"+port))
		tp.ip(tp.out.name, "route", "del", "10.65.0.0/16", "via", "192.0.2.11")
		nat.QueueResync()
		if err := nat.Apply(); err != nil {
			b.Fatal(err)
		}
		// Masquerade measured without the floating IP's own SNAT in the way: a second
		// workload address would do; here the floating IP's rules are dropped for it.
		deleteFIP(nat, netip.MustParseAddr("192.0.2.50"))
		if err := nat.Apply(); err != nil {
			b.Fatal(err)
		}
		if got := tp.sourceSeen(tp.work, atOut); got != "192.0.2.11" {
			b.Fatalf("through NAT the outside saw %q", got)
		}
		masq = append(masq, rate(work, atOut.Addr().String()))
		setFIP(nat, calc.FloatingIP{External: netip.MustParseAddr("192.0.2.50"), Internal: netip.MustParseAddr("10.65.0.5")})
		if err := nat.Apply(); err != nil {
			b.Fatal(err)
		}
		fip = append(fip, rate(out, "192.0.2.50:"+port))
		if err := tp.k.writeNAT(nil); err != nil {
			b.Fatal(err)
		}
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	d, m, i, f := median(direct), median(masq), median(in), median(fip)
	b.ReportMetric(d, "direct-out-conn/s")
	b.ReportMetric(m, "masq-conn/s")
	b.ReportMetric(m/d, "masq-ratio")
	b.ReportMetric(i, "direct-in-conn/s")
	b.ReportMetric(f, "fip-conn/s")
	b.ReportMetric(f/i, "fip-ratio")
}

// TestOutgoingNATRealKernelIPv6: the same for IPv6: a workload of an IPv6 pool with
// natOutgoing reaches the outside as the node; the outside reaches it through its IPv6
// floating IP, its own address kept, and its traffic out then leaves from the floating IP.
func TestOutgoingNATRealKernelIPv6(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	node, work, out := newTestNode(t), newTestNode(t), newTestNode(t)
	tp := &natTopology{tb: t, node: node, work: work, out: out}
	ip := tp.ip
	ip(node.name, "link", "add", "w0", "type", "veth", "peer", "name", "eth0", "netns", work.name)
	ip(node.name, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", out.name)
	ip(node.name, "addr", "add", "fd00:65::1/128", "dev", "w0", "nodad")
	ip(work.name, "addr", "add", "fd00:65::5/128", "dev", "eth0", "nodad")
	ip(node.name, "addr", "add", "2001:db8::11/64", "dev", "up0", "nodad")
	ip(out.name, "addr", "add", "2001:db8::1/64", "dev", "eth0", "nodad")
	for _, l := range [][2]string{{node.name, "w0"}, {node.name, "up0"}, {work.name, "eth0"}, {out.name, "eth0"}} {
		ip(l[0], "link", "set", l[1], "up")
	}
	ip(node.name, "-6", "route", "add", "fd00:65::5/128", "dev", "w0")
	ip(work.name, "-6", "route", "add", "fd00:65::1/128", "dev", "eth0")
	ip(work.name, "-6", "route", "add", "default", "via", "fd00:65::1", "dev", "eth0", "onlink")
	tp.routeOn("net.ipv6.conf.all.forwarding=1")

	port := func(l net.Listener) string { _, p, _ := net.SplitHostPort(l.Addr().String()); return p }
	at := func(from *testNode, addr, port string) string {
		t.Helper()
		return tp.sourceAt(from, net.JoinHostPort(addr, port))
	}
	outPort := port(tp.listen(out, "2001:db8::1"))
	workPort := port(tp.listen(work, "fd00:65::5"))
	// The outside knows no route to the pool: nothing gets back before NAT.
	if got := at(work, "2001:db8::1", outPort); got != "" {
		t.Fatalf("before NAT the outside answered %q", got)
	}
	n := newOutgoingNAT(tp.k, NATConfig{})
	setNet(n, pool("fd00:65::/48", true))
	if err := n.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := at(work, "2001:db8::1", outPort); got != "2001:db8::11" {
		t.Fatalf("through IPv6 masquerade the outside saw %q; want the node's 2001:db8::11", got)
	}
	ip(node.name, "-6", "route", "add", "2001:db8::50/128", "dev", "w0")
	ip(out.name, "-6", "route", "add", "2001:db8::50/128", "via", "2001:db8::11")
	setFIP(n, calc.FloatingIP{External: netip.MustParseAddr("2001:db8::50"), Internal: netip.MustParseAddr("fd00:65::5"), Workload: "ns/vm6"})
	if err := n.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := at(out, "2001:db8::50", workPort); got != "2001:db8::1" {
		t.Fatalf("through the IPv6 floating IP the workload saw %q; want the client's 2001:db8::1", got)
	}
	if got := at(work, "2001:db8::1", outPort); got != "2001:db8::50" {
		t.Fatalf("the workload's traffic out: the outside saw %q; want the floating IP 2001:db8::50", got)
	}
	if r, ok, err := tp.k.readNAT(); err != nil || !ok || !r.equal(n.desired()) {
		t.Fatalf("read back %v %v %v; want %s", r, ok, err, n.desired())
	}
}

// TestNATFailureIsContained: nftables failing makes applies fail (and retry) without making
// the routes be read again, and leaves them working; NAT disabled touches nftables not at all.
func TestNATFailureIsContained(t *testing.T) {
	fk := NewFakeKernel()
	fk.AddLink("eth0")
	fk.AddAddr("eth0", netip.MustParseAddr("192.0.2.11"))
	d := New(fk, Config{ParentAddr: netip.MustParseAddr("192.0.2.11"), Sysctl: func(string, string) error { return nil }})
	c := pool("10.65.0.0/16", true)
	r := calc.Route{Dst: netip.MustParsePrefix("10.65.0.0/26"), Type: calc.RouteBlackhole, Metric: 1024, Reason: calc.ReasonLocalBlock}
	d.OnUpdate(&calc.Update{Full: true, Ops: []calc.Op{{ClusterNet: &c}, {Route: &r}}})
	fk.FailWith(func(op, _ string) error {
		if strings.HasPrefix(op, "nat-") {
			return errors.New("nf_tables missing")
		}
		return nil
	})
	if err := d.Apply(); err == nil || !strings.Contains(err.Error(), "nf_tables missing") {
		t.Fatalf("apply with nftables failing: %v; want its error", err)
	}
	if s := d.Stats(); s.ProgrammedRoutes != 1 {
		t.Fatalf("routes programmed with nftables failing: %d; want 1", s.ProgrammedRoutes)
	}
	d.mu.Lock()
	reread := d.routes.needRead
	d.mu.Unlock()
	if reread {
		t.Fatal("a NAT failure makes the routes be read again")
	}
	fk.FailWith(nil)
	if err := d.Apply(); err != nil || fk.NAT() == "" {
		t.Fatalf("after nftables came back: %v, table %q", err, fk.NAT())
	}

	off := NewFakeKernel()
	off.FailWith(func(op, _ string) error {
		if strings.HasPrefix(op, "nat-") {
			t.Errorf("NAT disabled, yet nftables was asked: %s", op)
		}
		return nil
	})
	d2 := New(off, Config{NAT: NATConfig{Disabled: true}, Sysctl: func(string, string) error { return nil }})
	d2.OnUpdate(&calc.Update{Full: true, Ops: []calc.Op{{ClusterNet: &c}}})
	_ = d2.Apply()
}
