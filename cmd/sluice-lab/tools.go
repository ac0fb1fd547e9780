package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/sluice-net/sluice/store/etcdtest"
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
	if len(args) != 1 {
		return errors.New("usage: tcp-serve IP:PORT")
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
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// toolTCPCheck connects, sends a line and expects it back.
func toolTCPCheck(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: tcp-check IP:PORT")
	}
	c, err := net.DialTimeout("tcp", args[0], 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
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

// toolSniff counts IPv4 packets for dst seen on iface for a while (an AF_PACKET socket), and
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
	const ethPIP = 0x0800
	fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_DGRAM, int(htons(ethPIP)))
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons(ethPIP), Ifindex: ifi.Index}); err != nil {
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
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil || n < 20 {
			continue
		}
		if netip.AddrFrom4([4]byte(buf[16:20])) == dst {
			count++
		}
	}
	fmt.Println("packets", count)
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
