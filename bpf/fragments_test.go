package bpf

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/sluice-net/sluice/store"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Fragments through real kernels (the prog.Run tests of the cutting are prog_frag_test.go):
// the traffic world's client sends UDP datagrams that must be fragmented on the way (DF clear,
// or too large for the client's own link) to node ports on node A whose one endpoint is an
// echo server on node B (through the node-port tunnel) or on node A, and counts the echoes
// that come back whole. The echo is as large, so both directions are cut.

const (
	fxEchoPort   = 9000  // the echo servers' port on server A and server B
	fxRemotePort = 30100 // UDP node port (wildcard, both families) → server B's echo
	fxLocalPort  = 30101 // UDP node port (wildcard, both families) → server A's echo
)

// fxFrontends is the update that adds the echo node ports to node self's stage, as calc
// would hand it: endpoints on this node first.
func fxFrontends(self int) *calc.Update {
	u := &calc.Update{}
	for _, f := range []struct {
		port uint16
		pod  int
		addr [2]netip.Addr // IPv4, IPv6
	}{{fxRemotePort, 1, [2]netip.Addr{benchPodB, benchPodB6}}, {fxLocalPort, 0, [2]netip.Addr{benchPodA, benchPodA6}}} {
		name := fmt.Sprintf("echo-%d", f.port)
		id := calc.ServiceID(&store.Service{Namespace: "frag", Name: name, UID: "uid-" + name})
		for fam, wildcard := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
			nodeAddr := benchNodeAddr(f.pod)
			if fam == 1 {
				nodeAddr = benchNodeAddr6(f.pod)
			}
			ep := netip.AddrPortFrom(f.addr[fam], fxEchoPort)
			local := 0
			if f.pod == self {
				local = 1
			}
			u.Ops = append(u.Ops, calc.Op{Frontend: &calc.Frontend{
				Key:  calc.FrontendKey{Addr: wildcard, Port: f.port, Protocol: store.ProtocolUDP},
				Kind: calc.FrontendNodePort, Service: "frag/" + name, ServiceID: id, PortName: "echo",
				Backends:      []calc.Backend{{Addr: ep.Addr(), Port: ep.Port(), Node: benchNodeName(f.pod), NodeAddr: nodeAddr}},
				LocalBackends: local, Present: []netip.AddrPort{ep},
			}})
		}
	}
	return u
}

// fxEcho answers every datagram to addr in ns with the same bytes, until the test ends, with
// path MTU discovery off (as the client: IPv4 echoes go with DF clear).
func fxEcho(t *testing.T, ns netns.NsHandle, addr netip.AddrPort) {
	t.Helper()
	var pc net.PacketConn
	if err := nstest.Run(ns, func() (err error) {
		pc, err = net.ListenPacket("udp", addr.String())
		if err != nil {
			return err
		}
		return fxNoPMTUD(pc.(*net.UDPConn), addr.Addr().Is4())
	}); err != nil {
		t.Fatalf("echo server on %v: %v", addr, err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() {
		pc.Close()
		wg.Wait()
	})
}

// fxNoPMTUD turns path MTU discovery off on c: IP_PMTUDISC_DONT (IPv4: DF clear, as Windows,
// NFS, RADIUS, SNMP and many appliances send) or IPV6_PMTUDISC_DONT (IPv6: the stack
// fragments to the path MTU it learnt, never refusing a send).
func fxNoPMTUD(c *net.UDPConn, v4 bool) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		if v4 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DONT)
		}
	}); err != nil || serr != nil {
		return fmt.Errorf("setting path MTU discovery off: %w", errors.Join(err, serr))
	}
	return nil
}

// fxExchange sends count datagrams of size bytes from one connected socket in ns to dst, with
// path MTU discovery off (IP_PMTUDISC_DONT: IPv4 DF clear; IPv6 the host fragments to the
// path MTU it learnt), each sent up to tries times until its echo comes back whole. It
// returns how many were answered and how many sends that took.
func fxExchange(ns netns.NsHandle, dst netip.AddrPort, size, count, tries int) (answered, sends int, err error) {
	err = nstest.Run(ns, func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		if err := fxNoPMTUD(c, dst.Addr().Is4()); err != nil {
			return err
		}
		buf := make([]byte, size+1)
		for i := range count {
			msg := make([]byte, size)
			for j := range msg {
				msg[j] = byte(i*31 + j*7)
			}
		try:
			for range tries {
				sends++
				if _, err := c.Write(msg); err != nil && !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, unix.EMSGSIZE) {
					return err
				}
				deadline := time.Now().Add(time.Second)
				for {
					_ = c.SetReadDeadline(deadline)
					n, err := c.Read(buf)
					if errors.Is(err, os.ErrDeadlineExceeded) {
						break // not answered: send it again
					}
					if err == nil && bytes.Equal(buf[:n], msg) {
						answered++
						break try
					}
					// An error queued by ICMP (Packet Too Big, an unreachable) or an echo
					// of an earlier send: keep waiting for this one's.
				}
			}
		}
		return nil
	})
	return answered, sends, err
}

// TestNodePortFragmentTraffic sends datagrams that must be fragmented through node ports of
// the traffic world, both families, and wants every one echoed whole. Server B's link has the
// MTU of the client's, 1,500 (the cluster), so its echoes are as large as the requests
// and are cut on node B as the requests are on node A; the tunnel carries 1,450 (IPv6: 1,430).
//   - IPv4, DF clear (IP_PMTUDISC_DONT: Windows, NFS, RADIUS, SNMP and many appliances send
//     so; the echo server too), 1,460 bytes of payload: too large for the tunnel, so node A
//     cuts each request as a router would, and node B each echo. Both are sent by a stack
//     on the same host as a veth (CHECKSUM_PARTIAL, their checksum still to be finished):
//     before frag_csum none was answered (the endpoint dropped each datagram as corrupt);
//   - both families, 3,000 bytes: the client's stack fragments each datagram itself to its
//     link's 1,500, and those fragments must cross (cut again on IPv4; on IPv6 the tunnel
//     carried no later fragment before tunnel_in6 gave them their first's ports);
//   - IPv6, 1,440 bytes (1,488 on the wire, one packet on the client's link): Packet Too Big
//     comes back with the tunnel's MTU, and the client's stack fragments the resend, which
//     crosses; the echo server learns the tunnel's MTU the same way, so the first datagram
//     takes three sends.
//
// Each case also goes to a node port whose endpoint is on node A (no tunnel).
func TestNodePortFragmentTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (6 s): make test runs it")
	}
	nstest.NeedRoot(t, "network namespaces, bpffs, eBPF programs")
	w := benchTrafficWorldN(t, 10, false)
	t.Logf("programs attached by %s", w.stages[0].Mode())
	for i, st := range w.stages {
		if err := nstest.Run(w.nodes[i], func() error {
			st.OnUpdate(fxFrontends(i))
			_, err := st.Apply()
			return err
		}); err != nil {
			t.Fatalf("%s: adding the echo node ports: %v", benchNodeName(i), err)
		}
	}
	for _, l := range []struct {
		ns  netns.NsHandle
		dev string
	}{{w.nodes[1], "wep-b"}, {w.pods[1], "eth0"}} {
		if err := nstest.Run(l.ns, func() error {
			link, err := netlink.LinkByName(l.dev)
			if err != nil {
				return err
			}
			return netlink.LinkSetMTU(link, 1500)
		}); err != nil {
			t.Fatalf("server B's link %s to MTU 1500: %v", l.dev, err)
		}
	}
	for i, pod := range [][2]netip.Addr{{benchPodA, benchPodA6}, {benchPodB, benchPodB6}} {
		for _, a := range pod {
			fxEcho(t, w.pods[i], netip.AddrPortFrom(a, fxEchoPort))
		}
	}
	const n = 3
	for _, c := range []struct {
		name  string
		node  netip.Addr
		size  int
		tries int // sends allowed per datagram: IPv6 learns the MTU from Packet Too Big first
		// grow are counters that must grow on node A and on node B when the endpoint is
		// remote: the traffic took the path the case is about.
		grow [2]string
	}{
		{"ipv4 no DF 1460", benchNodeAddr(0), 1460, 1, [2]string{"fragment_split", "fragment_split"}},
		{"ipv4 host fragments 3000", benchNodeAddr(0), 3000, 1, [2]string{"fragment_split", "tunnel_in"}},
		{"ipv6 too big 1440", benchNodeAddr6(0), 1440, 4, [2]string{"icmp_too_big_sent", "icmp_too_big_sent"}},
		{"ipv6 host fragments 3000", benchNodeAddr6(0), 3000, 4, [2]string{"tunnel_in", "tunnel_in"}},
	} {
		for _, to := range []struct {
			where string
			port  uint16
		}{{"remote", fxRemotePort}, {"local", fxLocalPort}} {
			t.Run(c.name+" "+to.where, func(t *testing.T) {
				dst := netip.AddrPortFrom(c.node, to.port)
				var before [2]uint64
				for i := range before {
					before[i] = fxCounter(w, i, c.grow[i])
				}
				got, sends, err := fxExchange(w.client, dst, c.size, n, c.tries)
				if err != nil {
					t.Fatalf("%v: %v", dst, err)
				}
				t.Logf("%v: %d of %d datagrams of %d bytes answered, %d sends", dst, got, n, c.size, sends)
				if got != n {
					t.Errorf("%v: %d of %d datagrams of %d bytes answered (%d sends); counters %s; %s", dst, got, n, c.size, sends,
						w.counters(), fxDrops(w))
				}
				for i := range before {
					if after := fxCounter(w, i, c.grow[i]); to.port == fxRemotePort && after == before[i] {
						t.Errorf("%s's counter %s did not grow: the traffic did not take the path the case is about", benchNodeName(i), c.grow[i])
					}
				}
			})
		}
	}
}

// fxCounter reads node i's counter name, summed over the CPUs.
func fxCounter(w *benchTraffic, i int, name string) uint64 {
	for c, cn := range CounterNames {
		if cn != name {
			continue
		}
		var per []uint64
		if err := w.stages[i].Objs.SlCounters.Lookup(uint32(c), &per); err != nil {
			return 0
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		return sum
	}
	panic("no counter " + name)
}

// fxDrops names the IP and UDP counters of the world's namespaces that say a packet was lost
// or cut (reassembly failures, fragments made, checksum errors, buffer errors), for failure
// messages.
func fxDrops(w *benchTraffic) string {
	var s []string
	for _, ns := range []struct {
		name string
		h    netns.NsHandle
	}{{"client", w.client}, {"node-a", w.nodes[0]}, {"node-b", w.nodes[1]}, {"server-a", w.pods[0]}, {"server-b", w.pods[1]}} {
		_ = nstest.Run(ns.h, func() error {
			for _, f := range []string{"/proc/thread-self/net/snmp", "/proc/thread-self/net/snmp6"} {
				raw, err := os.ReadFile(f)
				if err != nil {
					continue
				}
				s = append(s, fxNonZero(ns.name, string(raw))...)
			}
			return nil
		})
	}
	return strings.Join(s, " ")
}

// fxNonZero picks the interesting counters that are not zero out of /proc/net/snmp (pairs of
// lines: names, values) or snmp6 (name value per line).
func fxNonZero(ns, raw string) []string {
	want := func(name string) bool {
		for _, k := range []string{"Reasm", "Frag", "Csum", "Discard", "Errors", "NoPorts", "TooBig", "PktTooBig", "DestUnreach"} {
			if strings.Contains(name, k) {
				return true
			}
		}
		return false
	}
	var out []string
	lines := strings.Split(strings.TrimSpace(raw), "\n")
	if len(lines) > 0 && strings.HasSuffix(strings.Fields(lines[0])[0], ":") {
		for i := 0; i+1 < len(lines); i += 2 {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for j := 1; j < len(names) && j < len(vals); j++ {
				if want(names[j]) && vals[j] != "0" {
					out = append(out, fmt.Sprintf("%s:%s%s=%s", ns, strings.TrimSuffix(names[0], ":"), names[j], vals[j]))
				}
			}
		}
		return out
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 2 && want(f[0]) && f[1] != "0" {
			out = append(out, fmt.Sprintf("%s:%s=%s", ns, f[0], f[1]))
		}
	}
	return out
}
