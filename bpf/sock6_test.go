package bpf

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/internal/nstest"
	"golang.org/x/sys/unix"
)

// The IPv6 socket tests, as sock_test.go's: real sockets of a fresh namespace with every
// socket program attached to the cgroup root. They show an IPv6 service reached by TCP and
// UDP, an IPv4 service reached from a dual-stack IPv6 socket through its IPv4-mapped address,
// getpeername showing the frontend on both families, one backend per unconnected UDP socket
// and frontend (until it leaves the set), and refusals as a client expects them.

var (
	sk6VIP   = netip.MustParseAddr("fd00:96::30")
	sk6Empty = netip.MustParseAddr("fd00:96::31")
)

// sk6Servers are a TCP server greeting with its own port and a UDP server echoing with its
// own port, on addr (port chosen by the kernel).
type sk6Server struct {
	tcp netip.AddrPort
	udp netip.AddrPort
}

func sk6Serve(t *testing.T, network string, addr string) sk6Server {
	t.Helper()
	ln := skHello(t, "tcp"+network, net.JoinHostPort(addr, "0"), nil)
	u, err := net.ListenUDP("udp"+network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(addr), 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	me := u.LocalAddr().(*net.UDPAddr).AddrPort()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := u.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			u.WriteToUDPAddrPort(append([]byte(me.String()+":"), buf[:n]...), from)
		}
	}()
	return sk6Server{tcp: ln.Addr().(*net.TCPAddr).AddrPort(), udp: me}
}

func TestSockNAT6(t *testing.T) {
	nstest.NeedRoot(t, "attaching cgroup socket programs")
	root := skCgroupRoot(t)
	nstest.Enter(t)
	cookie, err := NetnsCookie()
	if errors.Is(err, unix.ENOPROTOOPT) {
		t.Skip("no SO_NETNS_COOKIE (before Linux 5.14): sluiced leaves the socket programs off there")
	}
	if err != nil {
		t.Fatal(err)
	}
	a6, b6 := sk6Serve(t, "6", "::1"), sk6Serve(t, "6", "::1")
	v4 := sk6Serve(t, "4", "127.0.0.1")

	o, err := Load("", MapSizes{Frontends: 64, Backends: 64, SourceRanges: 64, ClusterNets: 64, Affinity: 64, Conntrack: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	put := func(m *ebpf.Map, k, v any) {
		t.Helper()
		if err := m.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	put(o.SlCfg, uint32(0), sluiceCfg{NetnsCookie: cookie})
	fe6 := func(addr netip.Addr, port uint16, proto uint8, v sluiceFeVal) {
		put(o.SlFeV6, sluiceFeKeyV6{Addr: tp6A(addr), Port: tpP(port), Proto: proto}, v)
	}
	be6 := func(list uint64, bs ...netip.AddrPort) {
		for i, b := range bs {
			put(o.SlBeV6, sluiceBeKey{ListId: list, Ordinal: uint32(i)}, tp6Backend(b, tpBeLocal))
		}
	}
	fe6(sk6VIP, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
	fe6(sk6VIP, 53, tpProtoUDP, sluiceFeVal{ListId: 2, SvcId: 1, Count: 2, Local: 2})
	fe6(sk6VIP, 0, 0, sluiceFeVal{SvcId: 1, Flags: tpFeAddrOnly})
	fe6(sk6Empty, 80, tpProtoTCP, sluiceFeVal{ListId: 3, SvcId: 2})
	fe6(sk6Empty, 0, 0, sluiceFeVal{SvcId: 2, Flags: tpFeAddrOnly})
	be6(1, a6.tcp)
	be6(2, a6.udp, b6.udp)
	put(o.SlFeV4, sluiceFeKeyV4{Addr: tpA(skVIP), Port: tpP(80), Proto: tpProtoTCP}, sluiceFeVal{ListId: 4, SvcId: 3, Count: 1, Local: 1})
	put(o.SlFeV4, sluiceFeKeyV4{Addr: tpA(skVIP), Port: tpP(53), Proto: tpProtoUDP}, sluiceFeVal{ListId: 5, SvcId: 3, Count: 1, Local: 1})
	put(o.SlFeV4, sluiceFeKeyV4{Addr: tpA(skVIP)}, sluiceFeVal{SvcId: 3, Flags: tpFeAddrOnly})
	put(o.SlBeV4, sluiceBeKey{ListId: 4}, tpBackend(v4.tcp, tpNodeA, true))
	put(o.SlBeV4, sluiceBeKey{ListId: 5}, tpBackend(v4.udp, tpNodeA, true))

	for _, h := range []struct {
		attach ebpf.AttachType
		prog   *ebpf.Program
	}{{ebpf.AttachCGroupInet4Connect, o.SlSockConnect4}, {ebpf.AttachCGroupUDP4Sendmsg, o.SlSockSendmsg4},
		{ebpf.AttachCGroupUDP4Recvmsg, o.SlSockRecvmsg4}, {ebpf.AttachCgroupInet4GetPeername, o.SlSockGetpeername4},
		{ebpf.AttachCGroupInet6Connect, o.SlSockConnect6}, {ebpf.AttachCGroupUDP6Sendmsg, o.SlSockSendmsg6},
		{ebpf.AttachCGroupUDP6Recvmsg, o.SlSockRecvmsg6}, {ebpf.AttachCgroupInet6GetPeername, o.SlSockGetpeername6}} {
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
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	buf := make([]byte, 128)

	// TCP to an IPv6 cluster IP, from an IPv6 socket and (IPv4 service) a dual-stack one
	// through the mapped address: connected to the backend, the peer shown is the frontend.
	for _, c := range []struct {
		front netip.AddrPort
		net   string
	}{{netip.AddrPortFrom(sk6VIP, 80), "tcp6"}, {netip.AddrPortFrom(skVIP, 80), "tcp4"},
		{netip.AddrPortFrom(netip.AddrFrom16(skVIP.As16()), 80), "mapped"}} {
		var conn net.Conn
		var err error
		if c.net == "mapped" {
			conn, err = sk6DialMapped(c.front)
		} else {
			conn, err = dialer.Dial(c.net, c.front.String())
		}
		if err != nil {
			t.Errorf("connecting to %v (%s): %v", c.front, c.net, err)
			continue
		}
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		n, err := conn.Read(buf)
		if err != nil || string(buf[:n]) != "hello" {
			t.Errorf("%v: read %q, %v; want the backend's greeting", c.front, buf[:n], err)
		}
		if got := conn.RemoteAddr().(*net.TCPAddr).AddrPort(); got != c.front {
			t.Errorf("connected to %v: getpeername shows %v, want the frontend", c.front, got)
		}
		conn.Close()
	}

	// UDP, unconnected, to the IPv6 service with two endpoints: every datagram of a socket
	// goes to one endpoint, shown as coming from the frontend; across sockets both are used.
	front := netip.AddrPortFrom(sk6VIP, 53)
	seen := map[string]int{}
	for s := 0; s < 20; s++ {
		u, err := net.ListenUDP("udp6", nil)
		if err != nil {
			t.Fatal(err)
		}
		var first string
		for i := 0; i < 5; i++ {
			if _, err := u.WriteToUDPAddrPort([]byte("q"), front); err != nil {
				t.Fatalf("sending to %v: %v", front, err)
			}
			u.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, from, err := u.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("socket %d datagram %d: %v", s, i, err)
			}
			if from != front {
				t.Errorf("the answer is shown from %v, want %v", from, front)
			}
			server := string(buf[:n-2])
			if i == 0 {
				first = server
				seen[server]++
			} else if server != first {
				t.Errorf("socket %d: datagram %d reached %s, the first reached %s", s, i, server, first)
			}
		}
		u.Close()
	}
	if len(seen) != 2 {
		t.Errorf("20 sockets reached %v; want both endpoints", seen)
	}

	// The socket's endpoint leaves the frontend's set: its next datagram goes to the other.
	// (A dual-stack socket: IPV6_V6ONLY off, as Go's "udp" on the unspecified address.)
	u, err := net.ListenUDP("udp", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ask := func() string {
		t.Helper()
		if _, err := u.WriteToUDPAddrPort([]byte("q"), front); err != nil {
			t.Fatalf("sending to %v: %v", front, err)
		}
		u.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _, err := u.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n-2])
	}
	had := ask()
	other := a6.udp
	if had == a6.udp.String() {
		other = b6.udp
	}
	be6(6, other)
	fe6(sk6VIP, 53, tpProtoUDP, sluiceFeVal{ListId: 6, SvcId: 1, Count: 1, Local: 1})
	if got := ask(); got != other.String() {
		t.Errorf("after %s left the set the datagram reached %s, want %s", had, got, other)
	}

	// The IPv4 service by UDP from a dual-stack socket, through the mapped address.
	mapped := netip.AddrPortFrom(netip.AddrFrom16(skVIP.As16()), 53)
	if _, err := u.WriteToUDPAddrPort([]byte("q"), mapped); err != nil {
		t.Fatalf("sending to %v: %v", mapped, err)
	}
	u.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, from, err := u.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n-2]) != v4.udp.String() || from != mapped {
		t.Errorf("to %v: %q from %v, %v; want %v's echo from the frontend", mapped, buf[:n], from, err, v4.udp)
	}

	// Refused as a client expects: a connection to a port the cluster IP does not have or to
	// a frontend without endpoints gets ECONNREFUSED; an unconnected datagram is sent, and a
	// socket that asked for errors gets ECONNREFUSED.
	for _, a := range []netip.AddrPort{netip.AddrPortFrom(sk6VIP, 81), netip.AddrPortFrom(sk6Empty, 80)} {
		if c, err := dialer.Dial("tcp6", a.String()); !errors.Is(err, syscall.ECONNREFUSED) {
			if c != nil {
				c.Close()
			}
			t.Errorf("connecting to %v: %v, want ECONNREFUSED", a, err)
		}
		skRefusedDatagram(t, "udp6", a)
	}
	// A dual-stack UDP socket connected to a port the IPv4 cluster IP does not have, through
	// the mapped address (its sends go by the IPv4 path, which refuses port 0): its send
	// succeeds and its next read is ECONNREFUSED.
	if err := sk6MappedUDPRefused(netip.AddrPortFrom(netip.AddrFrom16(skVIP.As16()), 81)); err != nil {
		t.Error(err)
	}
	if got := skCounter(t, o, skCRejectSock); got != 5 {
		t.Errorf("C_REJECT_SOCK = %d, want 5", got)
	}
}

// sk6DialMapped connects a dual-stack IPv6 TCP socket (IPV6_V6ONLY off) to an IPv4-mapped
// address, as a Java or .NET client does (Go's dialer would open an IPv4 socket instead).
// sk6MappedUDPRefused connects a dual-stack IPv6 UDP socket to the mapped address to, sends
// a datagram and wants ECONNREFUSED at the next read.
func sk6MappedUDPRefused(to netip.AddrPort) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
		return err
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		return err
	}
	if err := unix.Connect(fd, &unix.SockaddrInet6{Port: int(to.Port()), Addr: to.Addr().As16()}); err != nil {
		return fmt.Errorf("connecting a dual-stack UDP socket to %v: %w", to, err)
	}
	if _, err := unix.Write(fd, []byte("x")); err != nil {
		return fmt.Errorf("sending to %v from a connected dual-stack UDP socket: %w, want it sent", to, err)
	}
	buf := make([]byte, 64)
	if n, err := unix.Read(fd, buf); !errors.Is(err, unix.ECONNREFUSED) {
		return fmt.Errorf("after sending to %v: read %d bytes, %v; want ECONNREFUSED", to, n, err)
	}
	return nil
}

func sk6DialMapped(to netip.AddrPort) (net.Conn, error) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Connect(fd, &unix.SockaddrInet6{Port: int(to.Port()), Addr: to.Addr().As16()}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "mapped")
	defer f.Close()
	return net.FileConn(f)
}
