package bpf

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The IPv6 program tests: sluice's IPv6 programs run through BPF_PROG_TEST_RUN as the
// IPv4 ones are (prog_test.go), each reached from its hook's IPv4 program by the tail call
// that carries every IPv6 packet there: what runs is what a hook runs.
//
// The topology is prog_test.go's in IPv6: node A's nic0 on the node network 2001:db8::/64
// (default route via the router ::fe), nic1 an uplink 2001:db8:100::/64 by which outside
// clients come, pods of the pool fd00:65::/48 behind wep0, wep1 and wep2; node B at
// 2001:db8::2.

var (
	tp6NodeA   = netip.MustParseAddr("2001:db8::1")
	tp6NodeB   = netip.MustParseAddr("2001:db8::2")
	tp6Router  = netip.MustParseAddr("2001:db8::fe")
	tp6EdgeA   = netip.MustParseAddr("2001:db8:100::1") // node A's address on nic1
	tp6EdgeRtr = netip.MustParseAddr("2001:db8:100::fe")
	tp6Client  = netip.MustParseAddr("2001:db8:113::10") // outside the cluster
	tp6PodA5   = netip.MustParseAddr("fd00:65::5")       // wep0
	tp6PodA6   = netip.MustParseAddr("fd00:65::6")       // wep2
	tp6PodA7   = netip.MustParseAddr("fd00:65::7")       // wep1: the workload client
	tp6PodB5   = netip.MustParseAddr("fd00:65:1::5")     // on node B
	tp6Cluster = netip.MustParseAddr("fd00:96::10")      // a cluster IP
	tp6LB      = netip.MustParseAddr("2001:db8:200::10") // a load-balancer address
	tp6Hairpin = netip.MustParseAddr("100::5c1c")        // HAIRPIN6 of c/sluice.h
)

func tp6NodeASpec() []tpIfaceSpec {
	return []tpIfaceSpec{
		{name: "nic0", mac: tpMACA0, peerMAC: tpMACRouter, addrs: []string{"2001:db8::1/64"}, gateway6: tp6Router,
			neigh: map[netip.Addr]tpMAC{tp6NodeB: tpMACB0, tp6Router: tpMACRouter}},
		{name: "nic1", mac: tpMACA1, peerMAC: tpMACEdge, addrs: []string{"2001:db8:100::1/64"},
			routes: []string{"2001:db8:113::/64"}, neigh: map[netip.Addr]tpMAC{tp6EdgeRtr: tpMACEdge, tp6Client: tpMACEdge}},
		{name: "wep0", mac: tpMACWepA0, peerMAC: tpMACPodA5, routes: []string{"fd00:65::5/128"},
			neigh: map[netip.Addr]tpMAC{tp6PodA5: tpMACPodA5}},
		{name: "wep1", mac: tpMACWepA1, peerMAC: tpMACPodA7, routes: []string{"fd00:65::7/128"},
			neigh: map[netip.Addr]tpMAC{tp6PodA7: tpMACPodA7}},
		{name: "wep2", mac: tpMACWepA2, peerMAC: tpMACPodA6, routes: []string{"fd00:65::6/128"},
			neigh: map[netip.Addr]tpMAC{tp6PodA6: tpMACPodA6}},
	}
}

// node6 makes node A of the IPv6 topology, with its cluster networks.
func (w *tpWorld) node6() *tpNode {
	w.ipv6 = true
	n := w.node("node-a6", tpNodeA, tp6NodeASpec())
	n.cnet6("fd00:65::/48", tpCnetPool)
	n.cnet6("2001:db8::1/128", tpCnetHost|tpCnetSelf)
	n.cnet6("2001:db8::2/128", tpCnetHost)
	n.cnet6("2001:db8:100::1/128", tpCnetHost|tpCnetSelf)
	return n
}

func tp6A(a netip.Addr) sluiceAddr6 { return NetAddr6(a) }

func tp6Key(src, dst netip.AddrPort, proto uint8) sluiceCtKeyV6 {
	return sluiceCtKeyV6{Src: tp6A(src.Addr()), Dst: tp6A(dst.Addr()), Sport: tpP(src.Port()), Dport: tpP(dst.Port()), Proto: proto}
}

func tp6Backend(addr netip.AddrPort, flags uint16) sluiceBeValV6 {
	return sluiceBeValV6{Addr: tp6A(addr.Addr()), Port: tpP(addr.Port()), Flags: flags}
}

func (n *tpNode) cnet6(prefix string, flags uint32) {
	n.t.Helper()
	p := netip.MustParsePrefix(prefix)
	n.put(n.o.SlCnetV6, sluiceCnetKeyV6{Prefixlen: uint32(p.Bits()), Addr: tp6A(p.Addr())}, sluiceCnetVal{Flags: flags})
}

func (n *tpNode) frontend6(addr netip.Addr, port uint16, proto uint8, v sluiceFeVal) {
	n.t.Helper()
	n.put(n.o.SlFeV6, sluiceFeKeyV6{Addr: tp6A(addr), Port: tpP(port), Proto: proto}, v)
}

func (n *tpNode) backends6(id uint64, bs ...sluiceBeValV6) {
	n.t.Helper()
	for i, b := range bs {
		n.put(n.o.SlBeV6, sluiceBeKey{ListId: id, Ordinal: uint32(i)}, b)
		if len(bs) > AffinityScan {
			n.put(n.o.SlBeIdxV6, sluiceBeIdxKeyV6{ListId: id, Addr: b.Addr, Port: b.Port}, uint32(i))
		}
	}
}

func (n *tpNode) ct6(k sluiceCtKeyV6) (sluiceCtValV6, bool) {
	n.t.Helper()
	var v sluiceCtValV6
	err := n.o.SlCtV6.Lookup(&k, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return v, false
	}
	if err != nil {
		n.t.Fatalf("%s: conntrack lookup: %v", n.name, err)
	}
	return v, true
}

// wantCT6 checks the IPv6 conntrack entry of k, ignoring its timestamps (which must be set).
func (n *tpNode) wantCT6(k sluiceCtKeyV6, want sluiceCtValV6) {
	n.t.Helper()
	got, ok := n.ct6(k)
	if !ok {
		n.t.Errorf("%s: no conntrack entry %+v", n.name, k)
		return
	}
	if got.Created == 0 || got.LastSeen < got.Created {
		n.t.Errorf("%s: conntrack %+v: created %d, last seen %d", n.name, k, got.Created, got.LastSeen)
	}
	want.Created, want.LastSeen = got.Created, got.LastSeen
	if got != want {
		n.t.Errorf("%s: conntrack %+v:\n got %+v\nwant %+v", n.name, k, got, want)
	}
}

// run6 runs a hook's IPv4 program (which passes the IPv6 frame on to the hook's IPv6 program).
func (n *tpNode) run6(prog *ebpf.Program, iface string, egress bool, f tp6Frame) (uint32, []byte) {
	n.t.Helper()
	return n.runBytes(prog, iface, egress, f.build())
}

// tp6Want checks the verdict and that the output decodes (good checksums) to want's fields:
// MACs, addresses, ports, TCP flags and payload.
func tp6Want(t *testing.T, rc uint32, out []byte, wantRC uint32, want tp6Frame) tp6Frame {
	t.Helper()
	if rc != wantRC {
		t.Errorf("verdict %d, want %d", rc, wantRC)
	}
	got := tp6DecodeOK(t, out)
	w := tp6DecodeOK(t, want.build())
	if got.String() != w.String() || string(got.Payload) != string(w.Payload) {
		t.Errorf("output\n got %v\nwant %v", got, w)
	}
	return got
}

// TestProg6ClusterIP: a workload's flow to an IPv6 cluster IP is translated to a local
// endpoint and sent straight to it; the reply is translated back and sent straight to the
// client; the conntrack entries are the pair the IPv4 path makes; a second packet of the
// flow goes the same way.
func TestProg6ClusterIP(t *testing.T) {
	w := tpNewWorld(t)
	a := w.node6()
	a.frontend6(tp6Cluster, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: 1, Local: 1})
	a.frontend6(tp6Cluster, 0, 0, sluiceFeVal{SvcId: 0xa1, Flags: tpFeAddrOnly})
	a.backends6(1, tp6Backend(netip.AddrPortFrom(tp6PodA5, 8080), tpBeLocal))

	client := netip.AddrPortFrom(tp6PodA7, 40000)
	fe := netip.AddrPortFrom(tp6Cluster, 80)
	be := netip.AddrPortFrom(tp6PodA5, 8080)
	syn := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 100, 0, nil)
	rc, out := a.run6(a.o.SlFromWep, "wep1", false, syn)
	want := tp6TCP(tpMACWepA0, tpMACPodA5, client, be, tpSYN, 100, 0, nil)
	tp6Want(t, rc, out, tpRedirect, want)
	a.wantCT6(tp6Key(client, fe, tpProtoTCP), sluiceCtValV6{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tp6A(tp6PodA5),
		NatPort: tpP(8080), NatSport: tpP(40000)})
	a.wantCT6(tp6Key(be, client, tpProtoTCP), sluiceCtValV6{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPSyn,
		NatAddr: tp6A(tp6Cluster), NatPort: tpP(80), NatSport: tpP(40000)})

	synack := tp6TCP(tpMACPodA5, tpMACWepA0, be, client, tpSYN|tpACK, 500, 101, nil)
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, synack)
	tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACWepA1, tpMACPodA7, fe, client, tpSYN|tpACK, 500, 101, nil))

	ack := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpACK, 101, 501, []byte("GET / HTTP/1.0\r\n\r\n"))
	rc, out = a.run6(a.o.SlFromWep, "wep1", false, ack)
	tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACWepA0, tpMACPodA5, client, be, tpACK, 101, 501, []byte("GET / HTTP/1.0\r\n\r\n")))
	a.wantCT6(tp6Key(be, client, tpProtoTCP), sluiceCtValV6{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPSyn | tpTCPReplied,
		NatAddr: tp6A(tp6Cluster), NatPort: tpP(80), NatSport: tpP(40000)})
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
}

// TestProg6ConntrackCleaned: the cleaner expires IPv6 flows as IPv4 ones (by the kernel
// program and, before Linux 5.14, from user space), and deletes at once the flows whose
// endpoint left its service.
func TestProg6ConntrackCleaned(t *testing.T) {
	for _, userSpace := range []bool{false, true} {
		name := "cleaner program"
		if userSpace {
			name = "user space"
		}
		t.Run(name, func(t *testing.T) {
			w := tpNewWorld(t)
			a := w.node6()
			a.frontend6(tp6Cluster, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: 1, Local: 1})
			a.backends6(1, tp6Backend(netip.AddrPortFrom(tp6PodA5, 8080), tpBeLocal))
			fe := netip.AddrPortFrom(tp6Cluster, 80)
			be := netip.AddrPortFrom(tp6PodA5, 8080)
			open := func(port uint16) {
				syn := tp6TCP(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tp6PodA7, port), fe, tpSYN, 1, 0, nil)
				if rc, _ := a.run6(a.o.SlFromWep, "wep1", false, syn); rc != tpRedirect {
					t.Fatalf("SYN from port %d: verdict %d", port, rc)
				}
			}
			open(40000)
			open(40001)
			c := NewConntrack(a.o, DefaultTimeouts)
			if userSpace {
				c.Cleaner, c.Cleaner6 = nil, nil
			}
			c.Live = func(addr netip.Addr, port uint16) bool { return true }
			now := Monotonic()
			st, err := c.Clean(now)
			if err != nil || st.Entries != 4 || st.Expired != 0 {
				t.Fatalf("a cleanup at once: %+v, %v; want 4 entries, none expired", st, err)
			}
			// Past the handshake timeout both unanswered flows go, each with its pair.
			st, err = c.Clean(now + uint64(DefaultTimeouts.TCPSyn) + uint64(time.Second))
			if err != nil || st.Expired != 2 || st.Deleted != 2 {
				t.Fatalf("a cleanup past the SYN timeout: %+v, %v; want 2 expired and deleted", st, err)
			}
			for _, p := range []uint16{40000, 40001} {
				client := netip.AddrPortFrom(tp6PodA7, p)
				for _, k := range []sluiceCtKeyV6{tp6Key(client, fe, tpProtoTCP), tp6Key(be, client, tpProtoTCP)} {
					if v, ok := a.ct6(k); ok {
						t.Errorf("entry %+v left: %+v", k, v)
					}
				}
			}
			// A live flow whose endpoint left its service goes at once, with its pair.
			open(40002)
			c.Live = func(addr netip.Addr, port uint16) bool { return addr != tp6PodA5 }
			n, err := c.SweepStale()
			if err != nil || n != 2 {
				t.Errorf("sweeping a removed endpoint's flow: %d deleted, %v; want 2", n, err)
			}
		})
	}
}

func tp6NodeBSpec() []tpIfaceSpec {
	return []tpIfaceSpec{
		{name: "nic0", mac: tpMACB0, peerMAC: tpMACRouter, addrs: []string{"2001:db8::2/64"}, gateway6: tp6Router,
			neigh: map[netip.Addr]tpMAC{tp6NodeA: tpMACA0, tp6Router: tpMACRouter}},
		{name: "wep0", mac: tpMACWepB0, peerMAC: tpMACPodB5, routes: []string{"fd00:65:1::5/128"},
			neigh: map[netip.Addr]tpMAC{tp6PodB5: tpMACPodB5}},
	}
}

// tp6Tunnel makes node A and node B of the IPv6 topology with the IPv6 tunnel set up (each
// node's IPv6 underlay address and an inner MTU of 1430), and a node port 30080 on A whose
// only endpoint is node B's pod fd00:65:1::5:8080.
func tp6Tunnel(t *testing.T) (a, b *tpNode) {
	w := tpNewWorld(t)
	a = w.node6()
	a.put(a.o.SlCfgV6, uint32(0), sluiceCfgV6{HostIp: tp6A(tp6NodeA), TunnelMtu: 1430})
	b = w.node("node-b6", tpNodeB, tp6NodeBSpec())
	b.put(b.o.SlCfgV6, uint32(0), sluiceCfgV6{HostIp: tp6A(tp6NodeB), TunnelMtu: 1430})
	b.cnet6("fd00:65::/48", tpCnetPool)
	b.cnet6("2001:db8::1/128", tpCnetHost)
	b.cnet6("2001:db8::2/128", tpCnetHost|tpCnetSelf)
	a.frontend6(netip.IPv6Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: 1, Flags: tpFeNodePort})
	be := tp6Backend(netip.AddrPortFrom(tp6PodB5, 8080), 0)
	be.NodeAddr = tp6A(tp6NodeB)
	a.backends6(1, be)
	return a, b
}

// tp6WantVXLAN checks a redirected VXLAN-over-IPv6 frame from node src to node dst (MACs,
// addresses, our port and VNI, UDP checksum 0, source port 49152-65535) and returns the inner
// frame decoded (good checksums) and its bytes.
func tp6WantVXLAN(t *testing.T, rc uint32, out []byte, srcMAC, dstMAC tpMAC, src, dst netip.Addr) (tp6Frame, []byte) {
	t.Helper()
	if rc != tpRedirect {
		t.Errorf("verdict %d, want %d (redirect)", rc, tpRedirect)
	}
	outer, bad, err := tp6Decode(out)
	if err != nil {
		t.Fatalf("output %x: %v", out, err)
	}
	if outer.Src != srcMAC || outer.Dst != dstMAC || outer.SrcIP != src || outer.DstIP != dst || outer.Proto != tpProtoUDP ||
		outer.UDP.Dport != tpVXLANPort || outer.UDP.Sport < 0xc000 || len(outer.Payload) < 8+14 {
		t.Fatalf("outer header %v, want %v>%v %v>%v UDP to %d", outer, srcMAC, dstMAC, src, dst, tpVXLANPort)
	}
	if !outer.UDP.ZeroCheck || len(bad) != 1 {
		t.Errorf("outer UDP checksum %04x (%v), want 0", outer.UDP.Check, bad)
	}
	vx := outer.Payload[:8]
	if vx[0] != 0x08 || uint32(vx[4])<<16|uint32(vx[5])<<8|uint32(vx[6]) != tpVNI {
		t.Errorf("VXLAN header %x, want flags 08 and VNI %#x", vx, tpVNI)
	}
	inner := outer.Payload[8:]
	return tp6DecodeOK(t, inner), inner
}

// TestProg6NodePortRemoteBackend is seed 000 over IPv6: a client outside the cluster reaches
// node A's node port whose endpoint is on node B; A picks it, keeps the client's address and
// port and tunnels the packet to B over the IPv6 underlay; B delivers it and sends the pod's
// reply back through the tunnel; A translates it back and sends it out of the interface the
// request came in by, to the hop it came from. A segment too large for the tunnel gets Packet
// Too Big; a tunnel packet from an address that is no node is dropped.
func TestProg6NodePortRemoteBackend(t *testing.T) {
	a, b := tp6Tunnel(t)
	client := netip.AddrPortFrom(tp6Client, 40000)
	front := netip.AddrPortFrom(tp6EdgeA, 30080)
	pod := netip.AddrPortFrom(tp6PodB5, 8080)

	syn := tp6TCP(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
	rc, out := a.run6(a.o.SlFromHost, "nic1", false, syn)
	sent := append([]byte(nil), out...)
	inner, _ := tp6WantVXLAN(t, rc, out, tpMACA0, tpMACB0, tp6NodeA, tp6NodeB)
	if inner.SrcIP != tp6Client || inner.TCP.Sport != 40000 || inner.DstIP != tp6PodB5 || inner.TCP.Dport != 8080 || inner.TCP.Flags != tpSYN {
		t.Errorf("inner packet %v, want the client's SYN to the pod", inner)
	}
	a.wantCT6(tp6Key(client, front, tpProtoTCP), sluiceCtValV6{Type: tpCtFwd, Flags: tpCtRemote, NatAddr: tp6A(tp6PodB5),
		TunAddr: tp6A(tp6NodeB), NatPort: tpP(8080), NatSport: tpP(40000)})
	revWant := sluiceCtValV6{Type: tpCtRev, Flags: tpCtRemote | tpCtRedirect, Tcp: tpTCPSyn, Ifindex: uint32(a.ifindex["nic1"]),
		NatAddr: tp6A(tp6EdgeA), TunAddr: tp6A(tp6NodeB), NatPort: tpP(30080), NatSport: tpP(40000), MacLocal: tpMACA1, MacPeer: tpMACEdge}
	a.wantCT6(tp6Key(pod, client, tpProtoTCP), revWant)

	// Node B: unwrapped and delivered to the pod; the ingress node is remembered.
	rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
	tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACWepB0, tpMACPodB5, client, pod, tpSYN, 1000, 0, nil))
	b.wantCT6(tp6Key(pod, client, tpProtoTCP), sluiceCtValV6{Type: tpCtTun, Tcp: tpTCPSyn, NatAddr: tp6A(tp6NodeA)})

	// Node B: the pod's answer goes back through the tunnel to node A.
	synack := tp6TCP(tpMACPodB5, tpMACWepB0, pod, client, tpSYN|tpACK, 5000, 1001, nil)
	rc, out = b.run6(b.o.SlFromWep, "wep0", false, synack)
	back, _ := tp6WantVXLAN(t, rc, out, tpMACB0, tpMACA0, tp6NodeB, tp6NodeA)
	if back.SrcIP != tp6PodB5 || back.DstIP != tp6Client || back.TCP.Flags != tpSYN|tpACK {
		t.Errorf("tunnelled answer %v, want the pod's SYN-ACK to the client", back)
	}

	// Node A: unwrapped, translated back, out of nic1 to the edge router.
	rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
	tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACA1, tpMACEdge, front, client, tpSYN|tpACK, 5000, 1001, nil))
	revWant.Tcp |= tpTCPReplied | tpTCPOpening
	a.wantCT6(tp6Key(pod, client, tpProtoTCP), revWant)

	// The client's next segment takes the same way; one too large for the tunnel (1,500
	// bytes: 1,440 of payload) gets Packet Too Big with the tunnel's MTU, quoting it.
	ack := tp6TCP(tpMACEdge, tpMACA1, client, front, tpACK, 1001, 5001, []byte("hello"))
	rc, out = a.run6(a.o.SlFromHost, "nic1", false, ack)
	tp6WantVXLAN(t, rc, out, tpMACA0, tpMACB0, tp6NodeA, tp6NodeB)
	big := tp6TCP(tpMACEdge, tpMACA1, client, front, tpACK, 1006, 5001, make([]byte, 1440))
	rc, out = a.run6(a.o.SlFromHost, "nic1", false, big)
	ptb := tp6DecodeOK(t, out)
	if rc != tpRedirect || ptb.Proto != tp6ProtoICMP || ptb.ICMP.Type != 2 || ptb.ICMP.Data != 1430 || ptb.SrcIP != tp6EdgeA ||
		ptb.DstIP != tp6Client || ptb.Dst != tpMACEdge || ptb.Src != tpMACA1 || len(ptb.Payload) != 128 {
		t.Errorf("verdict %d, %v; want Packet Too Big (MTU 1430) from the node port's address to the client, quoting 128 bytes", rc, ptb)
	}
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1, tpCTunIn: 1, tpCRevNat: 1, tpCICMPTooBig: 1})
	b.wantCounters(map[int]uint64{tpCTunIn: 1})

	// A tunnel packet from an address that is no node is dropped, counted.
	forged := append([]byte(nil), sent...)
	spoof := netip.MustParseAddr("2001:db8::66").As16()
	copy(forged[14+8:14+24], spoof[:])
	rc, _ = b.runBytes(b.o.SlFromHost, "nic0", false, forged)
	tpWantVerdict(t, rc, tpShot)
	b.wantCounters(map[int]uint64{tpCTunIn: 1, tpCDropForgedTunnel: 1})
}

// TestProgChecksumComplete: translated packets keep skb->csum right when they came with a
// complete receive checksum (CHECKSUM_COMPLETE, as NICs that sum the whole packet deliver
// them), so the stack that takes them (the node's, or a pod's across its veth) trusts it
// instead of logging "hw csum failure" and summing the packet again. An IPv6 address change
// needs csum_complete_fix6: bpf_l4_csum_replace adjusts skb->csum as IPv4 needs.
func TestProgChecksumComplete(t *testing.T) {
	if err := haveCsumComplete(); errors.Is(err, unix.EINVAL) {
		t.Skipf("test runs cannot hand a program a CHECKSUM_COMPLETE packet (BPF_F_TEST_SKB_CHECKSUM_COMPLETE, Linux 6.11): %v", err)
	} else if err != nil {
		t.Fatalf("asking whether test runs take a CHECKSUM_COMPLETE packet: %v", err)
	}
	t.Run("IPv6 cluster IP", func(t *testing.T) {
		a := tpNewWorld(t).node6()
		a.csumComplete = true
		a.frontend6(tp6Cluster, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: 1, Local: 1})
		a.frontend6(tp6Cluster, 53, tpProtoUDP, sluiceFeVal{ListId: 2, SvcId: 0xa1, Count: 1, Local: 1})
		a.backends6(1, tp6Backend(netip.AddrPortFrom(tp6PodA5, 8080), tpBeLocal))
		a.backends6(2, tp6Backend(netip.AddrPortFrom(tp6PodA5, 5353), tpBeLocal))
		client := netip.AddrPortFrom(tp6PodA7, 40000)
		fe := netip.AddrPortFrom(tp6Cluster, 80)
		be := netip.AddrPortFrom(tp6PodA5, 8080)
		syn := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 100, 0, []byte("data"))
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, syn)
		tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACWepA0, tpMACPodA5, client, be, tpSYN, 100, 0, []byte("data")))
		synack := tp6TCP(tpMACPodA5, tpMACWepA0, be, client, tpSYN|tpACK, 500, 101, nil)
		rc, out = a.run6(a.o.SlFromWep, "wep0", false, synack)
		tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACWepA1, tpMACPodA7, fe, client, tpSYN|tpACK, 500, 101, nil))
		dns := netip.AddrPortFrom(tp6Cluster, 53)
		q := tp6UDP(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tp6PodA7, 40053), dns, []byte("query"))
		rc, out = a.run6(a.o.SlFromWep, "wep1", false, q)
		tp6Want(t, rc, out, tpRedirect, tp6UDP(tpMACWepA0, tpMACPodA5, netip.AddrPortFrom(tp6PodA7, 40053), netip.AddrPortFrom(tp6PodA5, 5353), []byte("query")))
	})
	t.Run("IPv4 node port through the tunnel", func(t *testing.T) {
		// The endpoint's node takes the tunnelled packet from its NIC (where a complete
		// checksum comes from), unwraps it and hands it to the pod; the ingress node takes
		// the answer from its NIC, unwraps and translates it back.
		a, b := tpRemoteNodePort(t)
		client := netip.AddrPortFrom(tpClient, 40000)
		front := netip.AddrPortFrom(tpEdgeA, 30080)
		pod := netip.AddrPortFrom(tpPodB5, 8080)
		syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, []byte("data"))
		rc, out := a.fromHost("nic1", syn)
		_, port := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
		mid := netip.AddrPortFrom(tpClient, port)
		b.csumComplete = true
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepB0, tpMACPodB5, mid, pod))
		b.csumComplete = false
		synack := tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, mid, tpSYN|tpACK, 5000, 1005, nil)
		rc, out = b.fromWep("wep0", synack)
		tpWantVXLAN(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA, tpUnwrapped(synack), false)
		a.csumComplete = true
		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACA1, tpMACEdge, front, client))
	})
	t.Run("IPv6 node port through the tunnel", func(t *testing.T) {
		a, b := tp6Tunnel(t)
		client := netip.AddrPortFrom(tp6Client, 40000)
		front := netip.AddrPortFrom(tp6EdgeA, 30080)
		pod := netip.AddrPortFrom(tp6PodB5, 8080)
		syn := tp6TCP(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, []byte("data"))
		rc, out := a.run6(a.o.SlFromHost, "nic1", false, syn)
		tp6WantVXLAN(t, rc, out, tpMACA0, tpMACB0, tp6NodeA, tp6NodeB)
		b.csumComplete = true
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACWepB0, tpMACPodB5, client, pod, tpSYN, 1000, 0, []byte("data")))
		b.csumComplete = false
		synack := tp6TCP(tpMACPodB5, tpMACWepB0, pod, client, tpSYN|tpACK, 5000, 1005, nil)
		rc, out = b.run6(b.o.SlFromWep, "wep0", false, synack)
		tp6WantVXLAN(t, rc, out, tpMACB0, tpMACA0, tp6NodeB, tp6NodeA)
		a.csumComplete = true
		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACA1, tpMACEdge, front, client, tpSYN|tpACK, 5000, 1005, nil))
	})
	t.Run("node ports from the NIC to a pod and to the node itself", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		a.csumComplete = true
		a.frontend(netip.IPv4Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeNodePort})
		a.backends(1, tpBackend(tpAP("10.65.0.5:8080"), tpNodeA, true))
		a.frontend(netip.IPv4Unspecified(), 30443, tpProtoTCP, sluiceFeVal{ListId: 2, SvcId: 2, Count: 1, Local: 1, Flags: tpFeNodePort})
		a.backends(2, tpBackend(netip.AddrPortFrom(tpNodeA, 6443), tpNodeA, true))
		client := netip.AddrPortFrom(tpClient, 40000)
		syn := tpTCPFrame(tpMACEdge, tpMACA1, client, netip.AddrPortFrom(tpEdgeA, 30080), tpSYN, 1000, 0, []byte("data"))
		rc, out := a.fromHost("nic1", syn)
		tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, netip.AddrPortFrom(tpPodA5, 8080)))
		// The node's own socket takes it up the stack, where skb->csum is checked.
		syn = tpTCPFrame(tpMACEdge, tpMACA1, client, netip.AddrPortFrom(tpEdgeA, 30443), tpSYN, 1000, 0, []byte("data"))
		rc, out = a.fromHost("nic1", syn)
		tpWant(t, rc, out, tpOK, tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, netip.AddrPortFrom(tpNodeA, 6443)))
	})
	t.Run("IPv4 cluster IP", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		a.csumComplete = true
		vip := netip.MustParseAddr("10.96.0.10")
		a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
		a.backends(1, tpBackend(tpAP("10.65.0.5:8080"), tpNodeA, true))
		client := netip.AddrPortFrom(tpPodA7, 33333)
		front := netip.AddrPortFrom(vip, 80)
		pod := netip.AddrPortFrom(tpPodA5, 8080)
		syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpSYN, 7000, 0, nil)
		rc, out := a.fromWep("wep1", syn)
		tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
		synack := tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, client, tpSYN|tpACK, 9000, 7001, nil)
		rc, out = a.fromWep("wep0", synack)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACWepA1, tpMACPodA7, front, netip.AddrPort{}))
	})
}
