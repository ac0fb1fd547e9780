package bpf

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The socket tests make real sockets connect and send to a cluster IP with the socket
// programs attached, in a fresh network namespace whose cookie is the one in sl_cfg, and
// check where the connections and datagrams arrive and what the application is shown.
//
// Where the programs are attached: the root of the cgroup v2 hierarchy, as the agent attaches
// them (SocketHooks). This is the simplest correct option:
//   - the programs act only on sockets of the namespace whose cookie sl_cfg holds, and the
//     test's namespace is new, so no other process on the machine is touched; that is the
//     very property the other-namespace check below tests, and its control shows that the
//     programs do run there;
//   - no process has to move: a cgroup v2 holds whole processes, so with a child cgroup
//     either the test process itself or a helper child process would have to be moved into it
//     and out again;
//   - a read-only cgroup mount (containers) still allows attaching, not making a directory;
//   - the links are held by file descriptors only, so the kernel detaches them when the test
//     process ends, even if it is killed before its cleanup runs.
//
// Everything runs on the test goroutine, locked to its OS thread, which is switched between
// the namespaces (no subtests: t.Run would start a goroutine on another thread).

// The socket counters, after those the program tests know.
const (
	skCSockNat    = tpCSockNat
	skCRejectSock = tpCRejectSock
)

var (
	skVIP   = netip.MustParseAddr("10.96.0.30") // frontends on port 80, address-only entry
	skEmpty = netip.MustParseAddr("10.96.0.31") // a frontend without endpoints
)

// skCgroupRoot returns the cgroup v2 hierarchy's root directory: where it is mounted, or a
// mount of its own (unmounted at the end) when none is.
func skCgroupRoot(t *testing.T) string {
	t.Helper()
	if root, err := CgroupV2Root(); err == nil {
		return root
	}
	dir := t.TempDir()
	if err := unix.Mount("cgroup2", dir, "cgroup2", 0, ""); err != nil {
		t.Skipf("no cgroup v2 hierarchy is mounted and mounting one failed: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting the cgroup2 hierarchy at %s: %v", dir, err)
		}
	})
	return dir
}

// skCookie is the socket cookie of c (SO_COOKIE), the first word of sl_sock_v4's keys.
func skCookie(t *testing.T, c syscall.Conn) uint64 {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v uint64
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatalf("reading the socket cookie: %v", gerr)
	}
	return v
}

func skCounter(t *testing.T, o *Objects, c int) uint64 {
	t.Helper()
	var per []uint64
	if err := o.SlCounters.Lookup(uint32(c), &per); err != nil {
		t.Fatalf("counter %s: %v", tpCounterNames[c], err)
	}
	var sum uint64
	for _, v := range per {
		sum += v
	}
	return sum
}

func TestSockNAT(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	nstest.NeedRoot(t, "attaching cgroup socket programs")
	if tpCounterNames[skCSockNat] != "C_SOCK_NAT" || tpCounterNames[skCRejectSock] != "C_REJECT_SOCK" {
		t.Fatalf("counter names %q %q", tpCounterNames[skCSockNat], tpCounterNames[skCRejectSock])
	}
	root := skCgroupRoot(t)

	ns := nstest.Enter(t)
	cookie, err := NetnsCookie()
	if errors.Is(err, unix.ENOPROTOOPT) {
		t.Skip("no SO_NETNS_COOKIE (before Linux 5.14): sluiced leaves the socket programs off there (TestStageWithoutNetnsCookie)")
	}
	if err != nil {
		t.Fatal(err)
	}

	// The backends: a TCP server that greets, a UDP server that echoes, on lo.
	accepted := make(chan net.Addr, 16)
	tcpLn := skHello(t, "tcp4", "127.0.0.1:0", accepted)
	udpLn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(tpAP("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { udpLn.Close() })
	received := make(chan netip.AddrPort, 16)
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := udpLn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			received <- from
			udpLn.WriteToUDPAddrPort(append([]byte("re:"), buf[:n]...), from)
		}
	}()
	tcpBackend := tcpLn.Addr().(*net.TCPAddr).AddrPort()
	udpBackend := udpLn.LocalAddr().(*net.UDPAddr).AddrPort()

	o, err := Load("", MapSizes{Frontends: 64, Backends: 64, SourceRanges: 64, ClusterNets: 64, Affinity: 64, Conntrack: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	putCfg := func(c uint64) {
		t.Helper()
		if err := o.SlCfg.Put(uint32(0), sluiceCfg{NetnsCookie: c}); err != nil {
			t.Fatal(err)
		}
	}
	putCfg(cookie)
	put := func(m *ebpf.Map, k, v any) {
		t.Helper()
		if err := m.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	fe := func(addr netip.Addr, port uint16, proto uint8, v sluiceFeVal) {
		t.Helper()
		put(o.SlFeV4, sluiceFeKeyV4{Addr: tpA(addr), Port: tpP(port), Proto: proto}, v)
	}
	fe(skVIP, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
	fe(skVIP, 80, tpProtoUDP, sluiceFeVal{ListId: 2, SvcId: 1, Count: 1, Local: 1})
	fe(skVIP, 0, 0, sluiceFeVal{SvcId: 1, Flags: tpFeAddrOnly})
	fe(skEmpty, 80, tpProtoTCP, sluiceFeVal{ListId: 3, SvcId: 2})
	fe(skEmpty, 80, tpProtoUDP, sluiceFeVal{ListId: 3, SvcId: 2})
	fe(skEmpty, 0, 0, sluiceFeVal{SvcId: 2, Flags: tpFeAddrOnly})
	put(o.SlBeV4, sluiceBeKey{ListId: 1}, tpBackend(tcpBackend, tpNodeA, true))
	put(o.SlBeV4, sluiceBeKey{ListId: 2}, tpBackend(udpBackend, tpNodeA, true))

	for _, h := range []struct {
		attach ebpf.AttachType
		prog   *ebpf.Program
	}{{ebpf.AttachCGroupInet4Connect, o.SlSockConnect4}, {ebpf.AttachCGroupUDP4Sendmsg, o.SlSockSendmsg4},
		{ebpf.AttachCGroupUDP4Recvmsg, o.SlSockRecvmsg4}} {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: root, Attach: h.attach, Program: h.prog})
		if err != nil {
			t.Fatalf("attaching %v to %s: %v", h.prog, root, err)
		}
		t.Cleanup(func() {
			if err := l.Close(); err != nil {
				t.Errorf("detaching %v: %v", h.prog, err)
			}
		})
	}

	front := netip.AddrPortFrom(skVIP, 80)
	dialer := &net.Dialer{Timeout: 2 * time.Second}

	// TCP: the connection to the frontend is made to the backend.
	c, err := dialer.Dial("tcp4", front.String())
	if err != nil {
		t.Fatalf("connecting to %v: %v", front, err)
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Errorf("read %q, %v from the connection to %v; want the backend's greeting", buf[:n], err, front)
	}
	select {
	case from := <-accepted:
		if from.String() != c.LocalAddr().String() {
			t.Errorf("the backend accepted %v, the client is %v", from, c.LocalAddr())
		}
	case <-time.After(2 * time.Second):
		t.Error("the backend accepted no connection")
	}
	c.Close()

	// UDP, unconnected: the datagram reaches the backend, the answer is shown as coming from
	// the frontend.
	u, err := net.ListenUDP("udp4", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.WriteToUDPAddrPort([]byte("ping"), front); err != nil {
		t.Fatalf("sending to %v: %v", front, err)
	}
	u.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, from, err := u.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "re:ping" {
		t.Errorf("received %q, %v; want the backend's echo", buf[:n], err)
	}
	if from != front {
		t.Errorf("the answer is shown from %v, want the frontend %v", from, front)
	}
	select {
	case got := <-received:
		if got.Port() != u.LocalAddr().(*net.UDPAddr).AddrPort().Port() {
			t.Errorf("the backend got a datagram from %v, the client is %v", got, u.LocalAddr())
		}
	case <-time.After(2 * time.Second):
		t.Error("the backend got no datagram")
	}
	var sv sluiceSockValV4
	sk := sluiceSockKeyV4{Cookie: skCookie(t, u), Addr: tpA(udpBackend.Addr()), Port: tpP(udpBackend.Port())}
	if err := o.SlSockV4.Lookup(&sk, &sv); err != nil {
		t.Errorf("no sl_sock_v4 entry %+v: %v", sk, err)
	} else if sv.FeAddr != tpA(skVIP) || sv.FePort != tpP(80) {
		t.Errorf("sl_sock_v4 %+v = %+v, want the frontend %v", sk, sv, front)
	}

	// UDP, connected: the same through connect.
	uc, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(front))
	if err != nil {
		t.Fatalf("connecting a UDP socket to %v: %v", front, err)
	}
	defer uc.Close()
	if _, err := uc.Write([]byte("pong")); err != nil {
		t.Fatalf("sending on the connected socket: %v", err)
	}
	uc.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, from, err = uc.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "re:pong" || from != front {
		t.Errorf("received %q from %v, %v; want the backend's echo from %v", buf[:n], from, err, front)
	}
	<-received

	// A port the cluster IP does not have, and a frontend without endpoints: refused at once,
	// as kube-proxy's reject refuses them: a connection gets ECONNREFUSED; an unconnected
	// datagram is sent, and the port unreachable it meets reaches a socket that asked for
	// errors as ECONNREFUSED.
	for _, a := range []netip.AddrPort{netip.AddrPortFrom(skVIP, 81), netip.AddrPortFrom(skEmpty, 80)} {
		if c, err := dialer.Dial("tcp4", a.String()); !errors.Is(err, syscall.ECONNREFUSED) {
			if c != nil {
				c.Close()
			}
			t.Errorf("connecting to %v: %v, want ECONNREFUSED", a, err)
		}
		skRefusedDatagram(t, "udp4", a)
	}
	// A connected UDP socket: its send succeeds, its next read is ECONNREFUSED.
	if c, err := dialer.Dial("udp4", netip.AddrPortFrom(skEmpty, 80).String()); err != nil {
		t.Errorf("connecting a UDP socket to %v: %v", netip.AddrPortFrom(skEmpty, 80), err)
	} else {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			t.Errorf("sending from a UDP socket connected to %v: %v, want it sent", netip.AddrPortFrom(skEmpty, 80), err)
		}
		if _, err := c.Read(make([]byte, 8)); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("reading a UDP socket connected to %v: %v, want ECONNREFUSED", netip.AddrPortFrom(skEmpty, 80), err)
		}
		c.Close()
	}
	// Something of the node listening on the loopback's discard port: the datagram would
	// reach it, so the send is refused (EPERM) and the listener gets nothing.
	if ln, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:9"))); err != nil {
		t.Errorf("listening on 127.0.0.1:9: %v", err)
	} else {
		if _, err := u.WriteToUDPAddrPort([]byte("x"), netip.AddrPortFrom(skEmpty, 80)); !errors.Is(err, syscall.EPERM) {
			t.Errorf("sending to %v with 127.0.0.1:9 taken: %v, want EPERM", netip.AddrPortFrom(skEmpty, 80), err)
		}
		ln.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, from, err := ln.ReadFromUDPAddrPort(make([]byte, 8)); err == nil {
			t.Errorf("the listener on 127.0.0.1:9 got %d bytes from %v", n, from)
		}
		ln.Close()
	}
	// An address that is no frontend is left alone (no route here).
	if _, err := dialer.Dial("tcp4", "10.96.0.99:80"); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("connecting to 10.96.0.99:80 (no service): %v, want ENETUNREACH", err)
	}

	// Another network namespace, with a route to the frontend's address by a veth pair (the
	// address's neighbour entry set, so that the first packet sent is the SYN) and a server
	// where the backend would be: its connection goes to the real address, which never
	// answers.
	nstest.Another(t) // the thread is now there
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "up0p"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("adding a veth pair: %v", err)
	}
	dl, err := netlink.LinkByName("up0")
	if err != nil {
		t.Fatal(err)
	}
	peer, err := netlink.LinkByName("up0p")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("192.0.2.99/24")
	for _, err := range []error{netlink.AddrAdd(dl, addr), netlink.LinkSetUp(peer), netlink.LinkSetUp(dl),
		netlink.RouteAdd(&netlink.Route{LinkIndex: dl.Attrs().Index, Dst: &net.IPNet{IP: net.IP{10, 96, 0, 0}, Mask: net.CIDRMask(16, 32)}}),
		netlink.NeighSet(&netlink.Neigh{LinkIndex: dl.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.IP(skVIP.AsSlice()), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0x96, 0x30}})} {
		if err != nil {
			t.Fatalf("setting up the other namespace: %v", err)
		}
	}
	trap, err := net.Listen("tcp4", tcpBackend.String())
	if err != nil {
		t.Fatalf("listening at %v in the other namespace: %v", tcpBackend, err)
	}
	defer trap.Close()
	otherCookie, err := NetnsCookie()
	if err != nil {
		t.Fatal(err)
	}
	if otherCookie == cookie {
		t.Fatalf("both namespaces have cookie %d", cookie)
	}
	txBefore := dl.Attrs().Statistics.TxPackets
	short := &net.Dialer{Timeout: 500 * time.Millisecond}
	c, err = short.Dial("tcp4", front.String())
	if err == nil {
		c.Close()
		t.Errorf("a socket of another namespace reached %v (at %v): translated", front, c.RemoteAddr())
	} else if ne := net.Error(nil); !(errors.As(err, &ne) && ne.Timeout()) && !errors.Is(err, syscall.EHOSTUNREACH) && !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("connecting to %v from another namespace: %v, want a timeout or unreachable", front, err)
	}
	if dl, err := netlink.LinkByName("up0"); err != nil {
		t.Fatal(err)
	} else if dl.Attrs().Statistics.TxPackets <= txBefore {
		t.Errorf("no packet left by the route to %v (%d, was %d)", skVIP, dl.Attrs().Statistics.TxPackets, txBefore)
	}
	// The control: with that namespace's cookie in the settings, the programs do act there.
	putCfg(otherCookie)
	if c, err := short.Dial("tcp4", netip.AddrPortFrom(skVIP, 81).String()); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Errorf("with the other namespace's cookie, connecting to %v:81 there: %v, want ECONNREFUSED", skVIP, err)
	}
	putCfg(cookie)
	nstest.Set(t, ns)

	if got := skCounter(t, o, skCSockNat); got != 3 {
		t.Errorf("C_SOCK_NAT = %d, want 3", got)
	}
	// The 5 refusals counted before, a connected UDP socket's send and the send refused while
	// the discard port was taken.
	if got := skCounter(t, o, skCRejectSock); got != 7 {
		t.Errorf("C_REJECT_SOCK = %d, want 7", got)
	}
	for c := 0; c < tpCNum; c++ {
		if c == skCSockNat || c == skCRejectSock {
			continue
		}
		if got := skCounter(t, o, c); got != 0 {
			t.Errorf("counter %s = %d, want 0", tpCounterNames[c], got)
		}
	}
}

// skRefusedDatagram sends a datagram to a refused frontend a from an unconnected socket that
// asked for errors (IP_RECVERR, IPV6_RECVERR): the send succeeds, and the port unreachable
// that comes back is ECONNREFUSED at the next read, as from kube-proxy's reject. The socket
// is made on the calling goroutine (in its namespace and cgroup).
func skRefusedDatagram(t *testing.T, network string, a netip.AddrPort) {
	t.Helper()
	u, err := net.ListenUDP(network, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	rc, err := u.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if network == "udp4" {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
		}
	}); err != nil || serr != nil {
		t.Fatalf("asking for errors: %v %v", err, serr)
	}
	if _, err := u.WriteToUDPAddrPort([]byte("x"), a); err != nil {
		t.Errorf("sending to %v: %v, want it sent", a, err)
		return
	}
	u.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	if n, from, err := u.ReadFromUDPAddrPort(buf); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after sending to %v: read %q from %v, %v; want ECONNREFUSED", a, buf[:n], from, err)
	}
}

// skHello listens on addr and greets each connection with "hello" (nstest.Greet).
func skHello(t testing.TB, network, addr string, accepted chan<- net.Addr) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	nstest.Greet(t, ln, "hello", accepted)
	return ln
}
