package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/store/etcdtest"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The lab's network tools run inside the namespaces (`ip netns exec NS sluice-lab TOOL ...`),
// so the lab needs nothing beyond iproute2: no ping, nc or tcpdump.

// toolEtcd serves an embedded etcd on host:port until stdin closes or a signal arrives.
func toolEtcd(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: etcd HOST:PORT DIR")
	}
	host, port, err := net.SplitHostPort(args[0])
	if err != nil {
		return err
	}
	p, _ := strconv.Atoi(port)
	srv, err := etcdtest.Start(etcdtest.Options{Dir: args[1], ClientHost: host, ClientPort: p})
	if err != nil {
		return err
	}
	defer srv.Close()
	fmt.Println("READY", srv.Endpoint())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}

// toolTCPServe echoes every TCP connection on addr until killed.
func toolTCPServe(args []string) error {
	return serveTCP(args, "usage: tcp-serve IP:PORT", func(c net.Conn) {
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	})
}

// serveTCP listens on args' one address, says READY, and hands every connection to handle
// until killed.
func serveTCP(args []string, usage string, handle func(net.Conn)) error {
	if len(args) != 1 {
		return errors.New(usage)
	}
	ln, err := net.Listen("tcp", args[0])
	if err != nil {
		return err
	}
	fmt.Println("READY")
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		handle(c)
	}
}

// toolTCPCheck connects, sends a line and expects it back.
func toolTCPCheck(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: tcp-check IP:PORT")
	}
	return tcpCheck(args[0], 2*time.Second)
}

// tcpCheck connects to addr within timeout and has "hello sluice" echoed within it.
func tcpCheck(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("hello sluice\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "hello sluice\n" {
		return fmt.Errorf("echo: %q, %v", line, err)
	}
	return nil
}

// toolStream keeps one TCP connection busy (a byte every 20 ms, echoed) until stdin closes;
// then it prints how many round trips it made and fails if any went wrong.
func toolStream(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: stream IP:PORT")
	}
	c, err := net.DialTimeout("tcp", args[0], 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	fmt.Println("READY")
	buf := make([]byte, 1)
	n := 0
	for {
		select {
		case <-stop:
			fmt.Println("round trips", n)
			return nil
		case <-time.After(20 * time.Millisecond):
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte{byte(n)}); err != nil {
			return fmt.Errorf("after %d round trips: %w", n, err)
		}
		if _, err := io.ReadFull(c, buf); err != nil || buf[0] != byte(n) {
			return fmt.Errorf("after %d round trips: %v", n, err)
		}
		n++
	}
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// toolPing sends ICMP echo requests until one is answered (at most count, a second apart).
func toolPing(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: ping IP")
	}
	dst, err := netip.ParseAddr(args[0])
	if err != nil || !dst.Is4() {
		return fmt.Errorf("ping: want an IPv4 address, got %q", args[0])
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_ICMP)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	tv := syscall.NsecToTimeval(int64(time.Second))
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	id := uint16(os.Getpid())
	for seq := uint16(1); seq <= 3; seq++ {
		msg := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 's', 'l', 'u', 'i', 'c', 'e'}
		binary.BigEndian.PutUint16(msg[2:], checksum(msg))
		if err := syscall.Sendto(fd, msg, 0, &syscall.SockaddrInet4{Addr: dst.As4()}); err != nil {
			return err
		}
		deadline := time.Now().Add(time.Second)
		buf := make([]byte, 1500)
		for time.Now().Before(deadline) {
			n, from, err := syscall.Recvfrom(fd, buf, 0)
			if err != nil {
				break
			}
			sa, ok := from.(*syscall.SockaddrInet4)
			if !ok || netip.AddrFrom4(sa.Addr) != dst || n < 28 {
				continue
			}
			icmp := buf[int(buf[0]&0x0f)*4 : n]
			if icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id && binary.BigEndian.Uint16(icmp[6:]) == seq {
				return nil
			}
		}
	}
	return fmt.Errorf("no echo reply from %s", dst)
}

// toolSendUDP sends a few datagrams to IP:9 (discard).
func toolSendUDP(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: send-udp IP")
	}
	c, err := net.Dial("udp", net.JoinHostPort(args[0], "9"))
	if err != nil {
		return err
	}
	defer c.Close()
	for range 5 {
		_, _ = c.Write([]byte("sluice lab probe"))
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// toolSniff counts IPv4 or IPv6 packets for dst seen on iface for a while (an AF_PACKET socket), and
// prints the count.
func toolSniff(args []string) error {
	if len(args) != 3 {
		return errors.New("usage: sniff IFACE DST-IP SECONDS")
	}
	ifi, err := net.InterfaceByName(args[0])
	if err != nil {
		return err
	}
	dst, err := netip.ParseAddr(args[1])
	if err != nil {
		return err
	}
	secs, _ := strconv.ParseFloat(args[2], 64)
	const ethPIP, ethPIPv6 = 0x0800, 0x86dd
	// ETH_P_ALL: a socket bound to one protocol sees only packets received, never sent.
	const ethPAll = 0x0003
	fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_DGRAM, int(htons(ethPAll)))
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons(ethPAll), Ifindex: ifi.Index}); err != nil {
		return err
	}
	tv := syscall.NsecToTimeval(int64(100 * time.Millisecond))
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	fmt.Println("READY")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs*float64(time.Second)))
	defer cancel()
	buf := make([]byte, 2048)
	count := 0
	for ctx.Err() == nil {
		n, from, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil || n < 20 {
			continue
		}
		ll, ok := from.(*syscall.SockaddrLinklayer)
		if !ok {
			continue
		}
		switch {
		case ll.Protocol == htons(ethPIP) && dst.Is4() && netip.AddrFrom4([4]byte(buf[16:20])) == dst:
			count++
		case ll.Protocol == htons(ethPIPv6) && dst.Is6() && n >= 40 && netip.AddrFrom16([16]byte(buf[24:40])) == dst:
			count++
		}
	}
	fmt.Println("packets", count)
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// toolTCPWhoami answers every TCP connection on addr with the client's address as it sees
// it, one line, then closes: an endpoint that reports whether the client's address was kept.
func toolTCPWhoami(args []string) error {
	return serveTCP(args, "usage: tcp-whoami IP:PORT", func(c net.Conn) {
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		_, _ = c.Write([]byte(host + "\n"))
		_ = c.Close()
	})
}

// toolTCPAsk makes n connections to addr, one after another, each reading one line; it
// prints how many failed and each distinct answer with its count, and fails if any failed.
func toolTCPAsk(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: tcp-ask IP:PORT N")
	}
	return askMany(args[0], args[1], &net.Dialer{Timeout: 2 * time.Second})
}

// toolTCPAskMapped is tcp-ask from a dual-stack IPv6 socket (IPV6_V6ONLY off) to the
// IPv4-mapped form of an IPv4 address, as Java and .NET clients connect (Go's own dialer
// would open an IPv4 socket).
func toolTCPAskMapped(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: tcp-ask-mapped IPV4:PORT N")
	}
	return askMany(args[0], args[1], dialMapped{})
}

type dialMapped struct{}

func (dialMapped) Dial(_, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("%q is not an IPv4 address and port", addr)
	}
	fd, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	sa := &syscall.SockaddrInet6{Port: int(ap.Port()), Addr: netip.AddrFrom16(ap.Addr().As16()).As16()}
	// SO_SNDTIMEO bounds a blocking connect, as the other tools' 2-second dial timeout.
	tv := syscall.Timeval{Sec: 2}
	if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &tv); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Connect(fd, sa); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "mapped")
	defer f.Close()
	return net.FileConn(f)
}

// dialer dials one connection (a *net.Dialer, or dialMapped).
type dialer interface {
	Dial(network, addr string) (net.Conn, error)
}

// askMany makes n connections to addr with d, reads each one's line and prints how many
// failed and how many gave each answer.
func askMany(addr, count string, d dialer) error {
	n, _ := strconv.Atoi(count)
	answers := map[string]int{}
	failed := 0
	var last error
	for i := 0; i < n; i++ {
		line, err := func() (string, error) {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return "", err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			return bufio.NewReader(c).ReadString('\n')
		}()
		if err != nil {
			failed++
			last = err
			continue
		}
		answers[strings.TrimSpace(line)]++
	}
	fmt.Println("failed", failed)
	for a, c := range answers {
		fmt.Println("answer", a, c)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d connections failed, last: %v", failed, n, last)
	}
	return nil
}

// toolTCPIdle connects, echoes a line, stays idle for the given seconds, and echoes again on
// the same connection.
func toolTCPIdle(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: tcp-idle IP:PORT SECONDS")
	}
	secs, _ := strconv.ParseFloat(args[1], 64)
	c, err := net.DialTimeout("tcp", args[0], 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	r := bufio.NewReader(c)
	echo := func(what string) error {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte(what + "\n")); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err != nil || line != what+"\n" {
			return fmt.Errorf("echo of %q: %q, %v", what, line, err)
		}
		return nil
	}
	if err := echo("before"); err != nil {
		return err
	}
	fmt.Println("READY")
	time.Sleep(time.Duration(secs * float64(time.Second)))
	if err := echo("after"); err != nil {
		return fmt.Errorf("after %.0f s idle: %w", secs, err)
	}
	fmt.Println("survived")
	return nil
}

// toolTCPLoop makes connections to addr (each one echo) until stdin closes; it prints how
// many it made and how many failed.
func toolTCPLoop(args []string) error {
	if len(args) != 1 && len(args) != 2 {
		return errors.New("usage: tcp-loop IP:PORT [TIMEOUT]")
	}
	timeout := 2 * time.Second
	if len(args) == 2 {
		d, err := time.ParseDuration(args[1])
		if err != nil {
			return err
		}
		timeout = d
	}
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	fmt.Println("READY")
	made, failed, slow := 0, 0, 0
	var slowest time.Duration
	for {
		select {
		case <-stop:
			fmt.Println("connections", made, "failed", failed, "over 1s", slow, "slowest", slowest.Round(time.Millisecond))
			if failed > 0 {
				return fmt.Errorf("%d of %d failed", failed, made)
			}
			return nil
		default:
		}
		made++
		start := time.Now()
		if err := tcpCheck(args[0], timeout); err != nil {
			failed++
			fmt.Println("failure", err)
		}
		took := time.Since(start)
		slowest = max(slowest, took)
		if took > time.Second {
			slow++
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// toolHTTPGet prints the status code and body of a GET.
func toolHTTPGet(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: http-get URL")
	}
	cl := &http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(args[0])
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("status %d %s\n", resp.StatusCode, strings.TrimSpace(string(b)))
	return nil
}

// toolNftTable says whether the inet nftables table NAME is "present" or "absent", and with
// "delete" deletes it first (the fault suite's damage: there is no nft binary here).
func toolNftTable(args []string) error {
	if len(args) < 1 || len(args) > 2 || (len(args) == 2 && args[1] != "delete") {
		return errors.New("usage: nft-table NAME [delete]")
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	if len(args) == 2 {
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: args[0]})
		if err := c.Flush(); err != nil {
			return err
		}
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return err
	}
	for _, t := range tables {
		if t.Name == args[0] {
			fmt.Println("present")
			return nil
		}
	}
	fmt.Println("absent")
	return nil
}

// toolTCPReuse connects from one source port to FIRST, reads its line and closes (with a FIN
// or an RST), then two seconds later connects from the same port to SECOND and reads its
// line: a client reusing a port towards two addresses, one a service's and one an endpoint's
// own (issue #25).
func toolTCPReuse(args []string) error {
	if len(args) != 4 || (args[2] != "fin" && args[2] != "rst") {
		return errors.New("usage: tcp-reuse FIRST SECOND fin|rst SOURCE-PORT")
	}
	port, err := strconv.Atoi(args[3])
	if err != nil {
		return fmt.Errorf("source port %q: %v", args[3], err)
	}
	ask := func(addr string, close string) (string, error) {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: port},
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				_ = rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
				})
				return serr
			}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return "", err
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if close == "rst" {
			_ = c.(*net.TCPConn).SetLinger(0)
		}
		_ = c.Close()
		return strings.TrimSpace(line), err
	}
	first, err := ask(args[0], args[2])
	if err != nil {
		return fmt.Errorf("first connection, to %s: %v", args[0], err)
	}
	fmt.Println("first", first)
	time.Sleep(2 * time.Second)
	second, err := ask(args[1], "fin")
	if err != nil {
		return fmt.Errorf("second connection, from the same port %d to %s: %v", port, args[1], err)
	}
	fmt.Println("second", second)
	return nil
}

// toolUDPWho answers every datagram on addr with name, until killed.
func toolUDPWho(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: udp-who IP:PORT NAME")
	}
	return serveUDP(args[0], func([]byte) []byte { return []byte(args[1]) })
}

// serveUDP listens on addr, says READY, and answers every datagram with what answer makes
// of it, until killed.
func serveUDP(addr string, answer func([]byte) []byte) error {
	c, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return err
	}
	return serveUDPOn(c, answer)
}

// serveUDPOn is serveUDP on a socket already open.
func serveUDPOn(c net.PacketConn, answer func([]byte) []byte) error {
	fmt.Println("READY")
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		_, _ = c.WriteTo(answer(buf[:n]), from)
	}
}

// toolUDPResolver sends a datagram to addr every 50 ms from one source port, as a DNS
// resolver does, and prints "answer NAME" each time the answering server changes, until
// stdin closes; then the count of datagrams sent and answered.
func toolUDPResolver(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: udp-resolver IP:PORT SOURCE-PORT")
	}
	sport, err := strconv.Atoi(args[1])
	if err != nil {
		return fmt.Errorf("source port %q: %v", args[1], err)
	}
	raddr, err := net.ResolveUDPAddr("udp", args[0])
	if err != nil {
		return err
	}
	c, err := net.DialUDP("udp", &net.UDPAddr{Port: sport}, raddr)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	fmt.Println("READY")
	sent, answered, last := 0, 0, ""
	buf := make([]byte, 1500)
	for {
		select {
		case <-stop:
			fmt.Println("sent", sent, "answered", answered)
			return nil
		default:
		}
		sent++
		_, _ = c.Write([]byte("query"))
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := c.Read(buf)
		if err != nil {
			continue
		}
		answered++
		if name := string(buf[:n]); name != last {
			fmt.Println("answer", name)
			last = name
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// toolTCPBulk sends BYTES bytes to an echo server and reads them back, within 20 s, and
// prints how long it took: a bulk transfer both ways, with full-size segments.
func toolTCPBulk(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: tcp-bulk IP:PORT BYTES")
	}
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return fmt.Errorf("bytes %q: %v", args[1], err)
	}
	start := time.Now()
	c, err := net.DialTimeout("tcp", args[0], 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	sent := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for left := n; left > 0; {
			k, err := c.Write(buf[:min(left, len(buf))])
			if err != nil {
				sent <- err
				return
			}
			left -= k
		}
		sent <- c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.Copy(io.Discard, c)
	if serr := <-sent; serr != nil && err == nil {
		err = serr
	}
	fmt.Println("bulk", got, "of", n, "bytes back in", time.Since(start).Round(time.Millisecond))
	if err != nil {
		return err
	}
	if int(got) != n {
		return fmt.Errorf("%d of %d bytes came back", got, n)
	}
	return nil
}

// toolTCPAskOpts is tcp-ask with the IPv4 Record Route option on the client's socket: every
// packet carries 40 bytes of options, and the server's replies carry them back (Linux
// answers a connection that came with Record Route with the option reversed).
func toolTCPAskOpts(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: tcp-ask-opts IP:PORT N")
	}
	rr := make([]byte, 40)
	rr[0], rr[1], rr[2] = 7, 39, 4 // Record Route, 39 bytes, first slot; then End of options
	return askMany(args[0], args[1], &net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		_ = rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptString(int(fd), syscall.IPPROTO_IP, syscall.IP_OPTIONS, string(rr))
		})
		return serr
	}})
}

// toolUDPEcho sends every datagram on addr back to its sender, until killed. With nodf (IPv4
// or IPv6) path MTU discovery is off (noPMTUD): an echo too large for the path goes out with
// DF clear, as RADIUS, SNMP and NFS servers send, and is fragmented on the way.
func toolUDPEcho(args []string) error {
	echo := func(b []byte) []byte { return b }
	if len(args) == 2 && args[1] == "nodf" {
		c, err := net.ListenPacket("udp", args[0])
		if err != nil {
			return err
		}
		if err := noPMTUD(c.(*net.UDPConn)); err != nil {
			return err
		}
		return serveUDPOn(c, echo)
	}
	if len(args) != 1 {
		return errors.New("usage: udp-echo IP:PORT [nodf]")
	}
	return serveUDP(args[0], echo)
}

// noPMTUD turns path MTU discovery off on c: IP_PMTUDISC_DONT (IPv4: DF clear, as Windows,
// NFS, RADIUS, SNMP and many appliances send) or IPV6_PMTUDISC_DONT (IPv6: the stack
// fragments to the path MTU it learnt from Packet Too Big instead of refusing the send).
func noPMTUD(c *net.UDPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	v4 := c.LocalAddr().(*net.UDPAddr).IP.To4() != nil
	var serr error
	if err := raw.Control(func(fd uintptr) {
		if v4 {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_MTU_DISCOVER, syscall.IP_PMTUDISC_DONT)
		} else {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_MTU_DISCOVER, syscall.IPV6_PMTUDISC_DONT)
		}
	}); err != nil {
		return err
	}
	return serr
}

// toolUDPBig sends N datagrams of SIZE bytes to an echo server, one at a time, and counts
// those that come back whole: larger than the MTU, they travel as IP fragments both ways.
// With nodf, path MTU discovery is off (noPMTUD: IPv4 DF clear) and a datagram not echoed
// within a second is sent again, twice at most, as such clients do (IPv6: the first send of
// one too large for the path gets Packet Too Big, and the stack fragments the next); it
// prints how many sends it took.
func toolUDPBig(args []string) error {
	nodf := len(args) == 4 && args[3] == "nodf"
	if len(args) != 3 && !nodf {
		return errors.New("usage: udp-big IP:PORT SIZE N [nodf]")
	}
	size, err1 := strconv.Atoi(args[1])
	n, err2 := strconv.Atoi(args[2])
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	c, err := net.Dial("udp", args[0])
	if err != nil {
		return err
	}
	defer c.Close()
	tries := 1
	if nodf {
		if err := noPMTUD(c.(*net.UDPConn)); err != nil {
			return err
		}
		tries = 3
	}
	out, in := make([]byte, size), make([]byte, 65536)
	echoed, sends := 0, 0
	for i := range n {
		for j := range out {
			out[j] = byte(i + j)
		}
	try:
		for range tries {
			sends++
			_, _ = c.Write(out)
			deadline := time.Now().Add(time.Second)
			for {
				_ = c.SetReadDeadline(deadline)
				k, err := c.Read(in)
				if err == nil && k == size && string(in[:k]) == string(out) {
					echoed++
					break try
				}
				if !nodf || errors.Is(err, os.ErrDeadlineExceeded) {
					break // not echoed (with nodf: send it again)
				}
				// With nodf, an error ICMP queued or an echo of an earlier send: wait on.
			}
		}
	}
	if nodf {
		fmt.Println("echoed", echoed, "of", n, "in", sends, "sends")
	} else {
		fmt.Println("echoed", echoed, "of", n)
	}
	if echoed != n {
		return fmt.Errorf("%d of %d datagrams of %d bytes came back whole", echoed, n, size)
	}
	return nil
}

// toolNftDropInvalid adds (add) a table "lab-firewall" that drops conntrack-INVALID packets in
// the forward, input and output hooks, as kube-proxy's KUBE-FORWARD and most host firewalls
// do, or prints (count) how many packets it dropped.
func toolNftDropInvalid(args []string) error {
	if len(args) != 1 || (args[0] != "add" && args[0] != "count") {
		return errors.New("usage: nft-drop-invalid add|count")
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: "lab-firewall"}
	hooks := map[string]*nftables.ChainHook{"forward": nftables.ChainHookForward, "input": nftables.ChainHookInput, "output": nftables.ChainHookOutput}
	if args[0] == "count" {
		total := uint64(0)
		for name := range hooks {
			rules, err := c.GetRules(table, &nftables.Chain{Name: name, Table: table})
			if err != nil {
				return err
			}
			for _, r := range rules {
				for _, e := range r.Exprs {
					if ctr, ok := e.(*expr.Counter); ok {
						total += ctr.Packets
					}
				}
			}
		}
		fmt.Println("dropped", total)
		return nil
	}
	c.AddTable(table)
	accept := nftables.ChainPolicyAccept
	for name, hook := range hooks {
		ch := c.AddChain(&nftables.Chain{Name: name, Table: table, Type: nftables.ChainTypeFilter, Hooknum: hook,
			Priority: nftables.ChainPriorityFilter, Policy: &accept})
		c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitINVALID), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	return c.Flush()
}

// toolSynFlood sends TCP SYNs to addr for the given seconds, as fast as one sender can, each
// from another address of 198.18.0.0/15 (the benchmarking range) and port: a spoofed flood,
// which nothing ever answers. It prints how many it sent and the rate.
func toolSynFlood(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: syn-flood IP:PORT SECONDS")
	}
	dst, err := netip.ParseAddrPort(args[0])
	if err != nil || !dst.Addr().Is4() {
		return fmt.Errorf("syn-flood: want IPv4:PORT, got %q", args[0])
	}
	secs, _ := strconv.ParseFloat(args[1], 64)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	to := &syscall.SockaddrInet4{Addr: dst.Addr().As4()}
	var pkt [40]byte
	pkt[0], pkt[8], pkt[9] = 0x45, 64, syscall.IPPROTO_TCP
	binary.BigEndian.PutUint16(pkt[2:], 40)
	d := dst.Addr().As4()
	copy(pkt[16:20], d[:])
	binary.BigEndian.PutUint16(pkt[22:], dst.Port())
	pkt[32], pkt[33] = 5<<4, 0x02 // header length, SYN
	binary.BigEndian.PutUint16(pkt[34:], 64240)
	start := time.Now()
	end := start.Add(time.Duration(secs * float64(time.Second)))
	sent := 0
	for i := uint32(0); ; i++ {
		if i%256 == 0 && time.Now().After(end) {
			break
		}
		src := [4]byte{198, 18 | byte(i>>24)&1, byte(i >> 16), byte(i >> 8)}
		src[3] ^= byte(i)
		copy(pkt[12:16], src[:])
		binary.BigEndian.PutUint16(pkt[4:], uint16(i))             // IP ID
		binary.BigEndian.PutUint16(pkt[20:], 1024+uint16(i%60000)) // source port
		binary.BigEndian.PutUint32(pkt[24:], i*2654435761)         // sequence
		pkt[10], pkt[11], pkt[36], pkt[37] = 0, 0, 0, 0
		binary.BigEndian.PutUint16(pkt[10:], checksum(pkt[:20]))
		pseudo := make([]byte, 0, 32)
		pseudo = append(append(append(pseudo, pkt[12:20]...), 0, syscall.IPPROTO_TCP, 0, 20), pkt[20:40]...)
		binary.BigEndian.PutUint16(pkt[36:], checksum(pseudo))
		if err := syscall.Sendto(fd, pkt[:], 0, to); err != nil {
			if errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.EAGAIN) {
				continue
			}
			return err
		}
		sent++
	}
	took := time.Since(start)
	fmt.Printf("sent %d SYNs in %.1f s (%.0f/s)\n", sent, took.Seconds(), float64(sent)/took.Seconds())
	return nil
}

// toolPlantLeftovers plants on the namespace's node what a node migrated from Cilium and
// kube-proxy keeps: Cilium's TCX program at the head of IFACE's ingress, passing every packet
// up (sluice's program never sees them: node ports through the node break), its link pinned at
// PIN so it outlives this process; and kube-proxy's iptables-nft service chain (a DNAT of a
// cluster IP to an endpoint long gone, hooked into nat PREROUTING: dormant behind sluice).
func toolPlantLeftovers(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: plant-leftovers IFACE PIN")
	}
	l, err := netlink.LinkByName(args[0])
	if err != nil {
		return err
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "cil_from_netdev", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0 /* TC_ACT_OK */), asm.Return()}})
	if err != nil {
		return fmt.Errorf("loading Cilium's program: %w", err)
	}
	defer p.Close()
	tl, err := link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: p, Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
	if err != nil {
		return fmt.Errorf("attaching Cilium's program: %w", err)
	}
	defer tl.Close()
	if err := tl.Pin(args[1]); err != nil {
		return fmt.Errorf("pinning its link: %w", err)
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	nat := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "nat"})
	pre := c.AddChain(&nftables.Chain{Name: "PREROUTING", Table: nat, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting,
		Priority: nftables.ChainPriorityNATDest})
	svc := c.AddChain(&nftables.Chain{Name: "KUBE-SERVICES", Table: nat})
	c.AddRule(&nftables.Rule{Table: nat, Chain: pre, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "KUBE-SERVICES"}}})
	c.AddRule(&nftables.Rule{Table: nat, Chain: svc, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{10, 96, 0, 10}},
		&expr.Immediate{Register: 1, Data: []byte{10, 65, 9, 9}},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}})
	return c.Flush()
}
