package bpf

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The IPv6 data path's decisions, one test each, as prog_test.go and its neighbours test them
// for IPv4: node ports from outside, endpoints on other nodes, rejects, extension headers,
// fragments, ICMPv6 errors, loadBalancerSourceRanges, client-IP affinity, hairpin and the UDP
// checksum that must never become 0. Every packet enters through its hook's IPv4 program
// (run6), which hands it to the hook's IPv6 program by the tail call, as on a real interface.
// Outputs are compared byte for byte with frames built from scratch (tp6xWant), so every
// checksum is checked by recomputation.

// tp6xQuoteLen is how much of a packet (from its IPv6 header) sluice's own ICMPv6 error
// quotes: 128 bytes, or 64, or 48, whichever the packet has (icmp6_back).
func tp6xQuoteLen(frame []byte) int {
	switch {
	case len(frame) >= 14+128:
		return 128
	case len(frame) >= 14+64:
		return 64
	}
	return 48
}

// tp6xNAT returns f with the given changes (zero values leave a field alone). A frame with
// Raw (a later fragment) keeps its transport bytes: only addresses and MACs change.
func tp6xNAT(f tp6Frame, srcMAC, dstMAC tpMAC, src, dst netip.AddrPort) tp6Frame {
	c := f
	c.Ext = slices.Clone(f.Ext)
	c.Payload = bytes.Clone(f.Payload)
	c.Raw = bytes.Clone(f.Raw)
	c.TCP.Options = bytes.Clone(f.TCP.Options)
	if srcMAC != tpZeroMAC {
		c.Src = srcMAC
	}
	if dstMAC != tpZeroMAC {
		c.Dst = dstMAC
	}
	if src.IsValid() {
		c.SrcIP = src.Addr()
		c.tp6xSetPorts(src.Port(), 0)
	}
	if dst.IsValid() {
		c.DstIP = dst.Addr()
		c.tp6xSetPorts(0, dst.Port())
	}
	return c
}

func (f *tp6Frame) tp6xSetPorts(sport, dport uint16) {
	if f.Raw != nil {
		return
	}
	switch f.Proto {
	case tpProtoTCP:
		if sport != 0 {
			f.TCP.Sport = sport
		}
		if dport != 0 {
			f.TCP.Dport = dport
		}
	case tpProtoUDP:
		if sport != 0 {
			f.UDP.Sport = sport
		}
		if dport != 0 {
			f.UDP.Dport = dport
		}
	}
}

// tp6xSame reports the difference when out is not exactly want as built.
func tp6xSame(t *testing.T, out []byte, want tp6Frame) {
	t.Helper()
	w := want.build()
	if bytes.Equal(out, w) {
		return
	}
	got, _, _ := tp6Decode(out)
	wf, _, _ := tp6Decode(w)
	t.Errorf("output differs\n got %v\nwant %v\n got %x\nwant %x", got, wf, out, w)
}

// tp6xWant checks the verdict, that the output decodes with good checksums and that it is
// byte for byte want (built from scratch). It returns the decoded output.
func tp6xWant(t *testing.T, rc uint32, out []byte, wantRC uint32, want tp6Frame) tp6Frame {
	t.Helper()
	if rc != wantRC {
		t.Errorf("verdict %d, want %d", rc, wantRC)
	}
	got := tp6DecodeOK(t, out)
	tp6xSame(t, out, want)
	return got
}

// tp6xIP is the IPv6 packet of a frame (what an ICMPv6 error quotes).
func tp6xIP(frame []byte) []byte { return append([]byte(nil), frame[14:]...) }

// tp6xError is an ICMPv6 error (type, code, the header's second word) from src to dst quoting
// quote.
func tp6xError(srcMAC, dstMAC tpMAC, src, dst netip.Addr, typ, code uint8, data uint32, quote []byte) tp6Frame {
	return tp6Frame{Dst: dstMAC, Src: srcMAC, SrcIP: src, DstIP: dst, HopLimit: 64, Proto: tp6ProtoICMP,
		ICMP: tpICMP6{Type: typ, Code: code, Data: data}, Payload: bytes.Clone(quote)}
}

// tp6xRequote is the quote as the programs leave it when they translate quoted into as: the
// packet built from as, cut to quoted's length, with quoted's transport checksum kept (the
// quoted packet's checksum is not the error's: receivers match errors to sockets by addresses
// and ports, as for IPv4, icmp_test.go).
func tp6xRequote(quoted []byte, as tp6Frame) []byte {
	b := tp6xIP(as.build())[:len(quoted)]
	w, _ := tp6xWalk(b)
	off := w.off + 6
	if as.Proto == tpProtoTCP {
		off = w.off + 16
	}
	if len(quoted) >= off+2 {
		copy(b[off:off+2], quoted[off:off+2])
	}
	return b
}

// tp6xQuoted reads the tuple an ICMPv6 error quotes (an IPv6 header and a transport header
// right after it).
func tp6xQuoted(t *testing.T, f tp6Frame) (src, dst netip.AddrPort) {
	t.Helper()
	q := f.Payload
	if len(q) < 44 || q[0]>>4 != 6 {
		t.Fatalf("quoted packet %x is no IPv6 header and ports", q)
	}
	src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(q[8:24])), binary.BigEndian.Uint16(q[40:]))
	dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(q[24:40])), binary.BigEndian.Uint16(q[42:]))
	return src, dst
}

// tp6xRST is the reset sluice answers with: no options, window 0, hop limit 64.
func tp6xRST(srcMAC, dstMAC tpMAC, src, dst netip.AddrPort, flags uint8, seq, ack uint32) tp6Frame {
	f := tp6TCP(srcMAC, dstMAC, src, dst, flags, seq, ack, nil)
	f.TCP.Window = 0
	return f
}

// tp6xCTLen counts the IPv6 conntrack entries.
func tp6xCTLen(n *tpNode) int {
	n.t.Helper()
	var k sluiceCtKeyV6
	var v sluiceCtValV6
	c := 0
	it := n.o.SlCtV6.Iterate()
	for it.Next(&k, &v) {
		c++
	}
	if err := it.Err(); err != nil {
		n.t.Fatal(err)
	}
	return c
}

func tp6xWantNoCT(n *tpNode, k sluiceCtKeyV6) {
	n.t.Helper()
	if v, ok := n.ct6(k); ok {
		n.t.Errorf("%s: unexpected conntrack entry %+v: %+v", n.name, k, v)
	}
}

// tp6xAddAddr gives the node's interface one more address (usable at once: no DAD).
func tp6xAddAddr(n *tpNode, iface, cidr string) {
	n.t.Helper()
	h, err := netlink.NewHandleAt(n.ns, unix.NETLINK_ROUTE)
	if err != nil {
		n.t.Fatalf("%s: netlink handle: %v", n.name, err)
	}
	defer h.Close()
	link, err := h.LinkByName(iface)
	if err != nil {
		n.t.Fatalf("%s: %v", n.name, err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		n.t.Fatal(err)
	}
	a.Flags |= unix.IFA_F_NODAD
	if err := h.AddrAdd(link, a); err != nil {
		n.t.Fatalf("%s: address %s: %v", n.name, cidr, err)
	}
	// The kernel puts an IPv6 address's local route in from a work queue: wait for it, or
	// the FIB does not know the address as the node's yet.
	local := &netlink.Route{Table: unix.RT_TABLE_LOCAL, Dst: &net.IPNet{IP: a.IP, Mask: net.CIDRMask(128, 128)}}
	for i := 0; ; i++ {
		rs, err := h.RouteListFiltered(netlink.FAMILY_V6, local, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
		if err != nil {
			n.t.Fatalf("%s: listing local routes: %v", n.name, err)
		}
		if len(rs) > 0 {
			return
		}
		if i == 500 {
			n.t.Fatalf("%s: no local route for %s after 5 s", n.name, cidr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tp6xClusterNode is node A with the cluster IP fd00:96::10: TCP 80 to the local endpoint
// [fd00:65::5]:8080, UDP 53 to [fd00:65::5]:5353, and the address-only entry that makes
// other ports rejected.
func tp6xClusterNode(t *testing.T) *tpNode {
	t.Helper()
	a := tpNewWorld(t).node6()
	a.frontend6(tp6Cluster, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: 1, Local: 1})
	a.frontend6(tp6Cluster, 53, tpProtoUDP, sluiceFeVal{ListId: 2, SvcId: 0xa1, Count: 1, Local: 1})
	a.frontend6(tp6Cluster, 0, 0, sluiceFeVal{SvcId: 0xa1, Flags: tpFeAddrOnly})
	a.backends6(1, tp6Backend(netip.AddrPortFrom(tp6PodA5, 8080), tpBeLocal))
	a.backends6(2, tp6Backend(netip.AddrPortFrom(tp6PodA5, 5353), tpBeLocal))
	return a
}

// tp6xRemote is an endpoint on node B.
func tp6xRemote(addr netip.AddrPort) sluiceBeValV6 {
	b := tp6Backend(addr, 0)
	b.NodeAddr = tp6A(tp6NodeB)
	return b
}

// A node port reached from outside by nic1, its one endpoint on this node: translated with the
// client's address kept and sent to the pod by the FIB; the reply leaves by nic1 to the hop the
// request came from, from the node port. The wildcard serves only this node's addresses.
func TestProg6NodePortFromOutside(t *testing.T) {
	a := tpNewWorld(t).node6()
	a.frontend6(netip.IPv6Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xb1, Count: 1, Local: 1, Flags: tpFeNodePort})
	pod := netip.AddrPortFrom(tp6PodA5, 8080)
	a.backends6(1, tp6Backend(pod, tpBeLocal))
	client := netip.AddrPortFrom(tp6Client, 40000)
	front := netip.AddrPortFrom(tp6EdgeA, 30080)

	syn := tp6TCP(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
	syn.TCP.Options = []byte{2, 4, 0x05, 0xa0} // MSS 1440
	rc, out := a.run6(a.o.SlFromHost, "nic1", false, syn)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	a.wantCT6(tp6Key(client, front, tpProtoTCP), sluiceCtValV6{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tp6A(tp6PodA5),
		NatPort: tpP(8080), NatSport: tpP(40000)})
	revKey := tp6Key(pod, client, tpProtoTCP)
	revWant := sluiceCtValV6{Type: tpCtRev, Flags: tpCtRedirect | tpCtLocal, Tcp: tpTCPSyn, Ifindex: uint32(a.ifindex["nic1"]),
		NatAddr: tp6A(tp6EdgeA), NatPort: tpP(30080), NatSport: tpP(40000), MacLocal: tpMACA1, MacPeer: tpMACEdge}
	a.wantCT6(revKey, revWant)

	// The pod's answer: from the node port, by nic1 to the edge router (MACs turned round).
	synack := tp6TCP(tpMACPodA5, tpMACWepA0, pod, client, tpSYN|tpACK, 5000, 1001, nil)
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, synack)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(synack, tpMACA1, tpMACEdge, front, netip.AddrPort{}))
	revWant.Tcp |= tpTCPReplied | tpTCPOpening
	a.wantCT6(revKey, revWant)

	// The client's next segment follows conntrack and makes the flow established.
	ack := tp6TCP(tpMACEdge, tpMACA1, client, front, tpACK|tpPSH, 1001, 5001, []byte("GET / HTTP/1.0\r\n\r\n"))
	rc, out = a.run6(a.o.SlFromHost, "nic1", false, ack)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(ack, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	revWant.Tcp = tpTCPSyn | tpTCPReplied
	a.wantCT6(revKey, revWant)
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})

	// An address of the node the programs know only from the FIB (not in the cluster
	// networks) is the node's too.
	tp6xAddAddr(a, "nic1", "2001:db8:100::2/64")
	fibOnly := netip.AddrPortFrom(netip.MustParseAddr("2001:db8:100::2"), 30080)
	client2 := netip.AddrPortFrom(tp6Client, 40001)
	syn2 := tp6TCP(tpMACEdge, tpMACA1, client2, fibOnly, tpSYN, 1000, 0, nil)
	rc, out = a.run6(a.o.SlFromHost, "nic1", false, syn2)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(syn2, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	a.wantCT6(tp6Key(pod, client2, tpProtoTCP), sluiceCtValV6{Type: tpCtRev, Flags: tpCtRedirect | tpCtLocal, Tcp: tpTCPSyn,
		Ifindex: uint32(a.ifindex["nic1"]), NatAddr: tp6A(fibOnly.Addr()), NatPort: tpP(30080), NatSport: tpP(40001),
		MacLocal: tpMACA1, MacPeer: tpMACEdge})

	// The same port at an address that is not the node's: passed on untouched.
	notOurs := tp6TCP(tpMACEdge, tpMACA1, netip.AddrPortFrom(tp6Client, 40002),
		netip.AddrPortFrom(netip.MustParseAddr("2001:db8:100::50"), 30080), tpSYN, 1000, 0, nil)
	rc, out = a.run6(a.o.SlFromHost, "nic1", false, notOurs)
	tp6xWant(t, rc, out, tpOK, notOurs)
	a.wantCounters(map[int]uint64{tpCNatNew: 2, tpCRevNat: 1})
	if n := tp6xCTLen(a); n != 4 {
		t.Errorf("%d conntrack entries, want 4 (two flows)", n)
	}
}

// Endpoints on other nodes, on a node without an IPv6 underlay address (node6 sets none, so
// there is no IPv6 node-port tunnel): a flow from a host interface uses this node's endpoints
// only (nat.h), so a node port whose endpoints are all elsewhere drops outside clients; a
// workload's flow to a cluster IP whose endpoint is elsewhere is translated and routed by the
// kernel, and the reply translated back where it meets the client.
func TestProg6RemoteEndpoint(t *testing.T) {
	remote := netip.AddrPortFrom(tp6PodB5, 8080)
	t.Run("node port from outside, no local endpoint", func(t *testing.T) {
		a := tpNewWorld(t).node6()
		a.frontend6(netip.IPv6Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xb1, Count: 1, Flags: tpFeNodePort})
		a.frontend6(netip.IPv6Unspecified(), 30080, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 0xb1, Count: 1, Flags: tpFeNodePort})
		a.backends6(1, tp6xRemote(remote))
		client := netip.AddrPortFrom(tp6Client, 40000)
		front := netip.AddrPortFrom(tp6EdgeA, 30080)
		rc, _ := a.run6(a.o.SlFromHost, "nic1", false, tp6TCP(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil))
		tpWantVerdict(t, rc, tpShot)
		rc, _ = a.run6(a.o.SlFromHost, "nic1", false, tp6UDP(tpMACEdge, tpMACA1, client, front, []byte("ping")))
		tpWantVerdict(t, rc, tpShot)
		a.wantCounters(map[int]uint64{tpCDropNoLocal: 2})
		if n := tp6xCTLen(a); n != 0 {
			t.Errorf("%d conntrack entries for dropped flows", n)
		}
	})

	t.Run("node port from outside, local and remote endpoints", func(t *testing.T) {
		a := tpNewWorld(t).node6()
		a.frontend6(netip.IPv6Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xb1, Count: 2, Local: 1, Flags: tpFeNodePort})
		a.backends6(1, tp6Backend(netip.AddrPortFrom(tp6PodA5, 8080), tpBeLocal), tp6xRemote(remote))
		front := netip.AddrPortFrom(tp6EdgeA, 30080)
		for i := range 32 {
			syn := tp6TCP(tpMACEdge, tpMACA1, netip.AddrPortFrom(tp6Client, uint16(40000+i)), front, tpSYN, 1, 0, nil)
			rc, out := a.run6(a.o.SlFromHost, "nic1", false, syn)
			tp6xWant(t, rc, out, tpRedirect, tp6xNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, netip.AddrPortFrom(tp6PodA5, 8080)))
		}
		a.wantCounters(map[int]uint64{tpCNatNew: 32})
	})

	t.Run("cluster IP from a workload", func(t *testing.T) {
		a := tpNewWorld(t).node6()
		a.frontend6(tp6Cluster, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: 1})
		a.backends6(1, tp6xRemote(remote))
		client := netip.AddrPortFrom(tp6PodA7, 40000)
		fe := netip.AddrPortFrom(tp6Cluster, 80)

		// Translated and passed on for the kernel to route (the MACs are the kernel's to set).
		syn := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 100, 0, nil)
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, syn)
		tp6xWant(t, rc, out, tpOK, tp6xNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, remote))
		a.wantCT6(tp6Key(client, fe, tpProtoTCP), sluiceCtValV6{Type: tpCtFwd, NatAddr: tp6A(tp6PodB5), NatPort: tpP(8080), NatSport: tpP(40000)})
		revKey := tp6Key(remote, client, tpProtoTCP)
		revWant := sluiceCtValV6{Type: tpCtRev, Tcp: tpTCPSyn, NatAddr: tp6A(tp6Cluster), NatPort: tpP(80), NatSport: tpP(40000)}
		a.wantCT6(revKey, revWant)

		// The remote pod's answer, routed to the client's interface, is translated as it
		// leaves for the client.
		synack := tp6TCP(tpMACWepA1, tpMACPodA7, remote, client, tpSYN|tpACK, 500, 101, nil)
		rc, out = a.run6(a.o.SlToWep, "wep1", true, synack)
		tp6xWant(t, rc, out, tpOK, tp6xNAT(synack, tpZeroMAC, tpZeroMAC, fe, netip.AddrPort{}))
		revWant.Tcp |= tpTCPReplied | tpTCPOpening
		a.wantCT6(revKey, revWant)
		ack := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpACK, 101, 501, []byte("hello"))
		rc, out = a.run6(a.o.SlFromWep, "wep1", false, ack)
		tp6xWant(t, rc, out, tpOK, tp6xNAT(ack, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, remote))

		// A second flow whose answer comes in by the node network: translated there and sent
		// straight to the client's interface.
		client2 := netip.AddrPortFrom(tp6PodA7, 40001)
		rc, _ = a.run6(a.o.SlFromWep, "wep1", false, tp6TCP(tpMACPodA7, tpMACWepA1, client2, fe, tpSYN, 100, 0, nil))
		tpWantVerdict(t, rc, tpOK)
		synack2 := tp6TCP(tpMACRouter, tpMACA0, remote, client2, tpSYN|tpACK, 500, 101, nil)
		rc, out = a.run6(a.o.SlFromHost, "nic0", false, synack2)
		tp6xWant(t, rc, out, tpRedirect, tp6xNAT(synack2, tpMACWepA1, tpMACPodA7, fe, netip.AddrPort{}))
		a.wantCounters(map[int]uint64{tpCNatNew: 2, tpCRevNat: 2})
	})
}

// Rejects: a cluster IP on a port it does not have, and a frontend without endpoints, answer
// TCP with a reset and UDP with an ICMPv6 port unreachable, from the address the client spoke
// to, back by the interface the packet came in on; a reset is never answered.
func TestProg6Reject(t *testing.T) {
	client := netip.AddrPortFrom(tp6PodA7, 40000)
	t.Run("unknown TCP port", func(t *testing.T) {
		a := tp6xClusterNode(t)
		fe := netip.AddrPortFrom(tp6Cluster, 81)
		// A SYN: RST+ACK acknowledging it, sequence number 0.
		syn := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 7000, 0, nil)
		syn.TCP.Options = []byte{2, 4, 0x05, 0xa0}
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, syn)
		tp6xWant(t, rc, out, tpRedirect, tp6xRST(tpMACWepA1, tpMACPodA7, fe, client, tpRST|tpACK, 0, 7001))
		// A SYN carrying data behind a hop-by-hop header: the data counts, the header does not.
		synData := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 7000, 0, []byte("early"))
		synData.Ext = []tp6Ext{tp6Opts(tp6HopByHop, 1, 0)}
		rc, out = a.run6(a.o.SlFromWep, "wep1", false, synData)
		tp6xWant(t, rc, out, tpRedirect, tp6xRST(tpMACWepA1, tpMACPodA7, fe, client, tpRST|tpACK, 0, 7006))
		// A segment with ACK and data: RST with the acknowledged number as its sequence.
		data := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpACK|tpPSH, 8000, 9000, make([]byte, 100))
		rc, out = a.run6(a.o.SlFromWep, "wep1", false, data)
		tp6xWant(t, rc, out, tpRedirect, tp6xRST(tpMACWepA1, tpMACPodA7, fe, client, tpRST, 9000, 0))
		// A FIN without ACK counts one sequence number, as a SYN does.
		fin := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpFIN, 8000, 0, make([]byte, 10))
		rc, out = a.run6(a.o.SlFromWep, "wep1", false, fin)
		tp6xWant(t, rc, out, tpRedirect, tp6xRST(tpMACWepA1, tpMACPodA7, fe, client, tpRST|tpACK, 0, 8011))
		// A reset is dropped, not answered.
		rst := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpRST, 8000, 0, nil)
		rc, _ = a.run6(a.o.SlFromWep, "wep1", false, rst)
		tpWantVerdict(t, rc, tpShot)
		a.wantCounters(map[int]uint64{tpCRejectPort: 5})
		if n := tp6xCTLen(a); n != 0 {
			t.Errorf("%d conntrack entries for rejected packets", n)
		}
	})

	t.Run("unknown UDP port", func(t *testing.T) {
		a := tp6xClusterNode(t)
		fe := netip.AddrPortFrom(tp6Cluster, 54)
		uc := netip.AddrPortFrom(tp6PodA7, 40053)
		// Quotes of 48 (a datagram of no more), 64 and 128 bytes.
		for _, size := range []int{0, 32, 200} {
			q := tp6UDP(tpMACPodA7, tpMACWepA1, uc, fe, frPayload(size))
			b := q.build()
			rc, out := a.run6(a.o.SlFromWep, "wep1", false, q)
			n := tp6xQuoteLen(b)
			got := tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA1, tpMACPodA7, tp6Cluster, tp6PodA7, 1, 4, 0, b[14:14+n]))
			if !bytes.Equal(got.Payload, b[14:14+n]) {
				t.Errorf("datagram of %d bytes: quoted %x, want its first %d bytes from the IPv6 header", len(b)-14, got.Payload, n)
			}
			if got.ICMP.Type != 1 || got.ICMP.Code != 4 {
				t.Errorf("ICMPv6 %d/%d, want destination unreachable 1/4 (port unreachable)", got.ICMP.Type, got.ICMP.Code)
			}
		}
		a.wantCounters(map[int]uint64{tpCRejectPort: 3})
	})

	t.Run("no endpoint", func(t *testing.T) {
		a := tp6xClusterNode(t)
		empty := netip.MustParseAddr("fd00:96::11")
		a.frontend6(empty, 80, tpProtoTCP, sluiceFeVal{ListId: 4, SvcId: 0xa3})
		a.frontend6(empty, 53, tpProtoUDP, sluiceFeVal{ListId: 4, SvcId: 0xa3})
		fe := netip.AddrPortFrom(empty, 80)
		syn := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 7000, 0, nil)
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, syn)
		tp6xWant(t, rc, out, tpRedirect, tp6xRST(tpMACWepA1, tpMACPodA7, fe, client, tpRST|tpACK, 0, 7001))
		q := tp6UDP(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tp6PodA7, 40053), netip.AddrPortFrom(empty, 53), []byte("query"))
		b := q.build()
		rc, out = a.run6(a.o.SlFromWep, "wep1", false, q)
		tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA1, tpMACPodA7, empty, tp6PodA7, 1, 4, 0, b[14:14+tp6xQuoteLen(b)]))
		rst := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpRST|tpACK, 7001, 1, nil)
		rc, _ = a.run6(a.o.SlFromWep, "wep1", false, rst)
		tpWantVerdict(t, rc, tpShot)
		a.wantCounters(map[int]uint64{tpCRejectNoBackend: 3})
		if n := tp6xCTLen(a); n != 0 {
			t.Errorf("%d conntrack entries for rejected packets", n)
		}
	})
}

// Extension headers: the transport header is found after hop-by-hop and destination options,
// which are kept byte for byte; a routing header with segments left means the destination is
// not final, and such a packet is never translated.
func TestProg6ExtensionHeaders(t *testing.T) {
	client := netip.AddrPortFrom(tp6PodA7, 40000)
	fe := netip.AddrPortFrom(tp6Cluster, 80)
	pod := netip.AddrPortFrom(tp6PodA5, 8080)
	t.Run("hop-by-hop and destination options", func(t *testing.T) {
		a := tp6xClusterNode(t)
		syn := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 100, 0, nil)
		syn.Ext = []tp6Ext{tp6Opts(tp6HopByHop, 1, 0), tp6Opts(tp6DestOpts, 2, 0)}
		syn.TCP.Options = []byte{2, 4, 0x05, 0xa0}
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, syn)
		got := tp6xWant(t, rc, out, tpRedirect, tp6xNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
		if len(got.Ext) != 2 || !bytes.Equal(out[14+40:14+40+24], syn.build()[14+40:14+40+24]) {
			t.Errorf("extension headers changed: %x, sent %x", out[14+40:14+40+24], syn.build()[14+40:14+40+24])
		}
		a.wantCT6(tp6Key(client, fe, tpProtoTCP), sluiceCtValV6{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tp6A(tp6PodA5),
			NatPort: tpP(8080), NatSport: tpP(40000)})
		// The answer with a destination-options header of its own is translated back.
		synack := tp6TCP(tpMACPodA5, tpMACWepA0, pod, client, tpSYN|tpACK, 500, 101, nil)
		synack.Ext = []tp6Ext{tp6Opts(tp6DestOpts, 1, 0)}
		rc, out = a.run6(a.o.SlFromWep, "wep0", false, synack)
		tp6xWant(t, rc, out, tpRedirect, tp6xNAT(synack, tpMACWepA1, tpMACPodA7, fe, netip.AddrPort{}))
		// UDP the same way.
		q := tp6UDP(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tp6PodA7, 40053), netip.AddrPortFrom(tp6Cluster, 53), []byte("query"))
		q.Ext = []tp6Ext{tp6Opts(tp6HopByHop, 1, 0), tp6Opts(tp6DestOpts, 1, 0)}
		rc, out = a.run6(a.o.SlFromWep, "wep1", false, q)
		tp6xWant(t, rc, out, tpRedirect, tp6xNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, netip.AddrPortFrom(tp6PodA5, 5353)))
		a.wantCounters(map[int]uint64{tpCNatNew: 2, tpCRevNat: 1})
	})

	t.Run("errors quoting them", func(t *testing.T) {
		// As for IPv4 options (prog_ipopts_test.go) and as the kernel's NAT does
		// (ipv6_skip_exthdr on the quoted packet): the endpoint's error about a datagram that
		// carried extension headers reaches the client as about the datagram it sent.
		a := tp6xClusterNode(t)
		client := netip.AddrPortFrom(tp6PodA7, 40053)
		dns := netip.AddrPortFrom(tp6Cluster, 53)
		q := tp6UDP(tpMACPodA7, tpMACWepA1, client, dns, []byte("query"))
		q.Ext = []tp6Ext{tp6Opts(tp6HopByHop, 1, 0), tp6Opts(tp6DestOpts, 1, 0)}
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, q)
		tp6xWant(t, rc, out, tpRedirect, tp6xNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, netip.AddrPortFrom(tp6PodA5, 5353)))
		sent := tp6xIP(out)
		unr := tp6xError(tpMACPodA5, tpMACWepA0, tp6PodA5, tp6PodA7, 1, 4, 0, sent)
		rc, out = a.run6(a.o.SlFromWep, "wep0", false, unr)
		tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA1, tpMACPodA7, tp6Cluster, tp6PodA7, 1, 4, 0, tp6xRequote(sent, q)))
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
	})

	t.Run("routing header with segments left", func(t *testing.T) {
		a := tp6xClusterNode(t)
		syn := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 100, 0, nil)
		syn.Ext = []tp6Ext{tp6Opts(tp6Routing, 3, 1)}
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, syn)
		tp6xWant(t, rc, out, tpOK, syn)
		a.wantCounters(map[int]uint64{})
		if n := tp6xCTLen(a); n != 0 {
			t.Errorf("%d conntrack entries for a packet not at its final destination", n)
		}
	})

	t.Run("routing header, no segments left", func(t *testing.T) {
		a := tp6xClusterNode(t)
		syn := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 100, 0, nil)
		syn.Ext = []tp6Ext{tp6Opts(tp6Routing, 3, 0)}
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, syn)
		tp6xWant(t, rc, out, tpRedirect, tp6xNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
		a.wantCounters(map[int]uint64{tpCNatNew: 1})
	})
}

// tp6xFragments cuts a UDP datagram (f: a frame without extension headers) in two at cut bytes
// of its transport part (a multiple of 8), each fragment with a fragment header.
func tp6xFragments(f tp6Frame, cut int, id uint32) (first, later tp6Frame) {
	l4 := f.l4()
	first, later = f, f
	first.Ext = []tp6Ext{tp6Frag(0, true, id)}
	first.Raw = bytes.Clone(l4[:cut])
	later.Ext = []tp6Ext{tp6Frag(uint16(cut/8), false, id)}
	later.Raw = bytes.Clone(l4[cut:])
	return first, later
}

// tp6xReassembled checks that two fragment outputs put together make a datagram from src to
// dst whose UDP checksum verifies and that carries payload.
func tp6xReassembled(t *testing.T, first, later []byte, src, dst netip.AddrPort, payload []byte) {
	t.Helper()
	f1, _, err1 := tp6Decode(first)
	f2, _, err2 := tp6Decode(later)
	if err1 != nil || err2 != nil {
		t.Fatalf("fragments do not decode: %v, %v", err1, err2)
	}
	if f1.SrcIP != f2.SrcIP || f1.DstIP != f2.DstIP {
		t.Errorf("fragments of one datagram with different addresses: %v and %v", f1, f2)
	}
	l4 := append(bytes.Clone(first[14+40+8:]), later[14+40+8:]...)
	if c := tpChecksum(tp6Pseudo(f1.SrcIP, f1.DstIP, tpProtoUDP, l4)); c != 0 {
		t.Errorf("the reassembled datagram's UDP checksum %04x does not verify", binary.BigEndian.Uint16(l4[6:]))
	}
	got := netip.AddrPortFrom(f1.SrcIP, binary.BigEndian.Uint16(l4[0:]))
	to := netip.AddrPortFrom(f1.DstIP, binary.BigEndian.Uint16(l4[2:]))
	if got != src || to != dst || !bytes.Equal(l4[8:], payload) {
		t.Errorf("reassembled datagram %v > %v with %d bytes, want %v > %v with the %d sent", got, to, len(l4)-8, src, dst, len(payload))
	}
}

// Fragments: a datagram's later fragment carries no ports and is translated as its first was
// (its addresses changed, its bytes otherwise as they were), so the datagram put together has
// a good checksum, both ways.
func TestProg6Fragments(t *testing.T) {
	a := tp6xClusterNode(t)
	// The packets also come with a complete checksum where test runs can say so: a later
	// fragment's address change, with no transport checksum to fix, must move skb->csum too
	// (csum_complete_fix6).
	a.csumComplete = haveCsumComplete() == nil
	client := netip.AddrPortFrom(tp6PodA7, 40053)
	dns := netip.AddrPortFrom(tp6Cluster, 53)
	pod := netip.AddrPortFrom(tp6PodA5, 5353)
	const cut = 8 + 600

	q := tp6UDP(tpMACPodA7, tpMACWepA1, client, dns, frPayload(1200))
	first, later := tp6xFragments(q, cut, 0xabcd01)
	translated := tp6UDP(tpMACPodA7, tpMACWepA1, client, pod, q.Payload).l4()
	rc, out1 := a.run6(a.o.SlFromWep, "wep1", false, first)
	want1 := tp6xNAT(first, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod)
	want1.Raw = translated[:cut]
	tp6xWant(t, rc, out1, tpRedirect, want1)
	rc, out2 := a.run6(a.o.SlFromWep, "wep1", false, later)
	tp6xWant(t, rc, out2, tpRedirect, tp6xNAT(later, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	tp6xReassembled(t, out1, out2, client, pod, q.Payload)

	// The endpoint's answer in two fragments: both from the frontend to the client.
	r := tp6UDP(tpMACPodA5, tpMACWepA0, pod, client, frPayload(900))
	first, later = tp6xFragments(r, cut, 0xabcd02)
	back := tp6UDP(tpMACPodA5, tpMACWepA0, dns, client, r.Payload).l4()
	rc, out1 = a.run6(a.o.SlFromWep, "wep0", false, first)
	want1 = tp6xNAT(first, tpMACWepA1, tpMACPodA7, dns, netip.AddrPort{})
	want1.Raw = back[:cut]
	tp6xWant(t, rc, out1, tpRedirect, want1)
	rc, out2 = a.run6(a.o.SlFromWep, "wep0", false, later)
	tp6xWant(t, rc, out2, tpRedirect, tp6xNAT(later, tpMACWepA1, tpMACPodA7, dns, netip.AddrPort{}))
	tp6xReassembled(t, out1, out2, dns, client, r.Payload)

	// A later fragment before its first has no ports to go by: passed on as it is.
	other := tp6xNAT(q, tpZeroMAC, tpZeroMAC, netip.AddrPortFrom(tp6PodA7, 40054), netip.AddrPort{})
	_, early := tp6xFragments(other, cut, 0xabcd03)
	rc, out := a.run6(a.o.SlFromWep, "wep1", false, early)
	tp6xWant(t, rc, out, tpOK, early)
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 2})
}

// ICMPv6 errors about translated flows are translated as the kernel's NAT does: an error about
// a packet the client sent reaches the client as if about the packet it sent to the frontend
// (from the frontend when the endpoint itself sent it, from the router otherwise); an error
// about a reply reaches the endpoint as if about the reply it sent. Neighbour discovery,
// router and echo messages are never touched.
func TestProg6ICMPErrors(t *testing.T) {
	a := tp6xClusterNode(t)
	client := netip.AddrPortFrom(tp6PodA7, 40053)
	dns := netip.AddrPortFrom(tp6Cluster, 53)
	pod := netip.AddrPortFrom(tp6PodA5, 5353)
	q := tp6UDP(tpMACPodA7, tpMACWepA1, client, dns, []byte("query"))
	rc, out := a.run6(a.o.SlFromWep, "wep1", false, q)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	sent := tp6xIP(out) // the datagram as the endpoint got it

	// The endpoint's port unreachable: from the cluster IP, about the datagram the client sent.
	unr := tp6xError(tpMACPodA5, tpMACWepA0, tp6PodA5, tp6PodA7, 1, 4, 0, sent)
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, unr)
	got := tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA1, tpMACPodA7, tp6Cluster, tp6PodA7, 1, 4, 0, tp6xRequote(sent, q)))
	if s, d := tp6xQuoted(t, got); s != client || d != dns {
		t.Errorf("the error quotes %v > %v, want %v > %v", s, d, client, dns)
	}
	// Leaving for the client's interface, it is not translated again.
	rc, out2 := a.run6(a.o.SlToWep, "wep1", true, got)
	tp6xWant(t, rc, out2, tpOK, got)

	// A router's Packet Too Big and Time Exceeded about the same datagram keep the router as
	// their source (and the MTU).
	for _, c := range []struct {
		typ  uint8
		data uint32
	}{{2, 1280}, {3, 0}} {
		e := tp6xError(tpMACRouter, tpMACA0, tp6Router, tp6PodA7, c.typ, 0, c.data, sent)
		rc, out = a.run6(a.o.SlFromHost, "nic0", false, e)
		got = tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA1, tpMACPodA7, tp6Router, tp6PodA7, c.typ, 0, c.data, tp6xRequote(sent, q)))
		if s, d := tp6xQuoted(t, got); s != client || d != dns {
			t.Errorf("type %d: the error quotes %v > %v, want %v > %v", c.typ, s, d, client, dns)
		}
	}

	// An error about a reply: the client's port unreachable about the answer it got reaches
	// the endpoint about the answer it sent.
	r := tp6UDP(tpMACPodA5, tpMACWepA0, pod, client, []byte("answer"))
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, r)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(r, tpMACWepA1, tpMACPodA7, dns, netip.AddrPort{}))
	gotReply := tp6xIP(out)
	unr = tp6xError(tpMACPodA7, tpMACWepA1, tp6PodA7, tp6Cluster, 1, 4, 0, gotReply)
	rc, out = a.run6(a.o.SlFromWep, "wep1", false, unr)
	got = tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA0, tpMACPodA5, tp6PodA7, tp6PodA5, 1, 4, 0, tp6xRequote(gotReply, r)))
	if s, d := tp6xQuoted(t, got); s != pod || d != client {
		t.Errorf("the error quotes %v > %v, want %v > %v", s, d, pod, client)
	}
	rc, out2 = a.run6(a.o.SlToWep, "wep0", true, got)
	tp6xWant(t, rc, out2, tpOK, got)
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 4})

	// Not errors about translated flows: passed on byte for byte.
	target := tp6PodA5.As16()
	ns := tp6Frame{Dst: tpMAC{0x33, 0x33, 0xff, 0, 0, 5}, Src: tpMACPodA7, SrcIP: netip.MustParseAddr("fe80::7"),
		DstIP: netip.MustParseAddr("ff02::1:ff00:5"), HopLimit: 255, Proto: tp6ProtoICMP, ICMP: tpICMP6{Type: 135},
		Payload: append(target[:], 1, 1, 2, 0, 0, 0, 0x0c, 7)}
	ra := tp6Frame{Dst: tpMAC{0x33, 0x33, 0, 0, 0, 1}, Src: tpMACRouter, SrcIP: netip.MustParseAddr("fe80::fe"),
		DstIP: netip.MustParseAddr("ff02::1"), HopLimit: 255, Proto: tp6ProtoICMP, ICMP: tpICMP6{Type: 134, Data: 0x40000708},
		Payload: make([]byte, 8)}
	echo := tp6Frame{Dst: tpMACWepA1, Src: tpMACPodA7, SrcIP: tp6PodA7, DstIP: tp6Cluster, HopLimit: 64, Proto: tp6ProtoICMP,
		ICMP: tpICMP6{Type: 128, Data: 0x12340001}, Payload: []byte("abcdefgh")}
	// An echo whose data looks like a quote of the live flow is still an echo.
	echoQuote := echo
	echoQuote.Src, echoQuote.Dst, echoQuote.SrcIP, echoQuote.DstIP = tpMACPodA5, tpMACWepA0, tp6PodA5, tp6PodA7
	echoQuote.ICMP.Type = 129
	echoQuote.Payload = sent
	unknown := tp6xIP(tp6UDP(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tp6PodA7, 40054), pod, []byte("q")).build())
	for _, c := range []struct {
		name   string
		prog   *ebpf.Program
		iface  string
		egress bool
		f      tp6Frame
	}{
		{"neighbour solicitation from a workload", a.o.SlFromWep, "wep1", false, ns},
		{"router advertisement from the router", a.o.SlFromHost, "nic0", false, ra},
		{"router advertisement to a workload", a.o.SlToWep, "wep1", true, ra},
		{"echo request to a cluster IP", a.o.SlFromWep, "wep1", false, echo},
		{"echo request from outside", a.o.SlFromHost, "nic1", false,
			tp6xNAT(echo, tpMACEdge, tpMACA1, netip.AddrPortFrom(tp6Client, 0), netip.AddrPortFrom(tp6EdgeA, 0))},
		{"echo reply carrying a live tuple", a.o.SlFromWep, "wep0", false, echoQuote},
		{"error about an unknown tuple", a.o.SlFromWep, "wep0", false, tp6xError(tpMACPodA5, tpMACWepA0, tp6PodA5, tp6PodA7, 1, 4, 0, unknown)},
		{"error about an unknown tuple, leaving by a host interface", a.o.SlToHost, "nic0", true,
			tp6xError(tpMACA0, tpMACRouter, tp6PodA5, tp6PodA7, 1, 4, 0, unknown)},
	} {
		rc, out := a.run6(c.prog, c.iface, c.egress, c.f)
		if rc != tpOK {
			t.Errorf("%s: verdict %d, want %d (passed on)", c.name, rc, tpOK)
		}
		if !bytes.Equal(out, c.f.build()) {
			t.Errorf("%s: changed\n got %x\nwant %x", c.name, out, c.f.build())
		}
	}
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 4})
}

// ICMPv6 errors about a node port's flow from outside go back the way the request came (by
// nic1 to the edge router); a router's Packet Too Big about a TCP segment, which IPv6's path
// MTU discovery depends on, reaches the client about the segment it sent.
func TestProg6ICMPErrorMore(t *testing.T) {
	t.Run("node port from outside", func(t *testing.T) {
		a := tpNewWorld(t).node6()
		a.frontend6(netip.IPv6Unspecified(), 30053, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 0xb1, Count: 1, Local: 1, Flags: tpFeNodePort})
		pod := netip.AddrPortFrom(tp6PodA5, 5353)
		a.backends6(1, tp6Backend(pod, tpBeLocal))
		client := netip.AddrPortFrom(tp6Client, 41000)
		front := netip.AddrPortFrom(tp6EdgeA, 30053)
		q := tp6UDP(tpMACEdge, tpMACA1, client, front, []byte("ping"))
		rc, out := a.run6(a.o.SlFromHost, "nic1", false, q)
		tp6xWant(t, rc, out, tpRedirect, tp6xNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
		sent := tp6xIP(out)
		unr := tp6xError(tpMACPodA5, tpMACWepA0, tp6PodA5, tp6Client, 1, 4, 0, sent)
		rc, out = a.run6(a.o.SlFromWep, "wep0", false, unr)
		got := tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACA1, tpMACEdge, tp6EdgeA, tp6Client, 1, 4, 0, tp6xRequote(sent, q)))
		if s, d := tp6xQuoted(t, got); s != client || d != front {
			t.Errorf("the error quotes %v > %v, want %v > %v", s, d, client, front)
		}
		// The client's error about the answer it got reaches the endpoint.
		r := tp6UDP(tpMACPodA5, tpMACWepA0, pod, client, []byte("pong"))
		rc, out = a.run6(a.o.SlFromWep, "wep0", false, r)
		tp6xWant(t, rc, out, tpRedirect, tp6xNAT(r, tpMACA1, tpMACEdge, front, netip.AddrPort{}))
		gotReply := tp6xIP(out)
		unr = tp6xError(tpMACEdge, tpMACA1, tp6Client, tp6EdgeA, 1, 4, 0, gotReply)
		rc, out = a.run6(a.o.SlFromHost, "nic1", false, unr)
		tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA0, tpMACPodA5, tp6Client, tp6PodA5, 1, 4, 0, tp6xRequote(gotReply, r)))
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 2})
	})

	t.Run("packet too big about a TCP segment", func(t *testing.T) {
		a := tp6xClusterNode(t)
		client := netip.AddrPortFrom(tp6PodA7, 40000)
		fe := netip.AddrPortFrom(tp6Cluster, 80)
		pod := netip.AddrPortFrom(tp6PodA5, 8080)
		rc, _ := a.run6(a.o.SlFromWep, "wep1", false, tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpSYN, 100, 0, nil))
		tpWantVerdict(t, rc, tpRedirect)
		data := tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpACK|tpPSH, 101, 501, frPayload(1400))
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, data)
		tp6xWant(t, rc, out, tpRedirect, tp6xNAT(data, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
		sent := tp6xIP(out)[:1280-48] // as much as an error of the minimum MTU carries
		ptb := tp6xError(tpMACRouter, tpMACA0, tp6Router, tp6PodA7, 2, 0, 1280, sent)
		rc, out = a.run6(a.o.SlFromHost, "nic0", false, ptb)
		got := tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA1, tpMACPodA7, tp6Router, tp6PodA7, 2, 0, 1280, tp6xRequote(sent, data)))
		if s, d := tp6xQuoted(t, got); s != client || d != fe {
			t.Errorf("the error quotes %v > %v, want %v > %v", s, d, client, fe)
		}
		if got.ICMP.Data != 1280 {
			t.Errorf("MTU %d, want 1280 kept", got.ICMP.Data)
		}
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
	})
}

// loadBalancerSourceRanges: clients outside the ranges are dropped.
func TestProg6SourceRanges(t *testing.T) {
	a := tpNewWorld(t).node6()
	a.frontend6(tp6LB, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xc1, Count: 1, Local: 1, Flags: tpFeSrcRanges})
	pod := netip.AddrPortFrom(tp6PodA5, 8080)
	a.backends6(1, tp6Backend(pod, tpBeLocal))
	for _, r := range []string{"2001:db8:113::/64", "2001:db8:115::7/128"} {
		p := netip.MustParsePrefix(r)
		a.put(a.o.SlSrcV6, sluiceSrcKeyV6{Prefixlen: 160 + uint32(p.Bits()), FeAddr: tp6A(tp6LB), FePort: tpP(80), Proto: tpProtoTCP,
			Src: tp6A(p.Addr())}, uint32(1))
	}
	front := netip.AddrPortFrom(tp6LB, 80)
	for _, c := range []struct {
		client string
		allow  bool
	}{{"2001:db8:113::10", true}, {"2001:db8:113::ffff:1", true}, {"2001:db8:115::7", true},
		{"2001:db8:114::10", false}, {"2001:db8:112::10", false}, {"2001:db8:115::8", false}} {
		client := netip.AddrPortFrom(netip.MustParseAddr(c.client), 40000)
		syn := tp6TCP(tpMACEdge, tpMACA1, client, front, tpSYN, 1, 0, nil)
		rc, out := a.run6(a.o.SlFromHost, "nic1", false, syn)
		if c.allow {
			tp6xWant(t, rc, out, tpRedirect, tp6xNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
			a.wantCT6(tp6Key(client, front, tpProtoTCP), sluiceCtValV6{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tp6A(tp6PodA5),
				NatPort: tpP(8080), NatSport: tpP(40000)})
		} else {
			if rc != tpShot {
				t.Errorf("client %s: verdict %d, want a drop", c.client, rc)
			}
			tp6xWantNoCT(a, tp6Key(client, front, tpProtoTCP))
		}
	}
	a.wantCounters(map[int]uint64{tpCNatNew: 3, tpCDropSrcRange: 3})
}

// Client-IP affinity: new flows of one client keep reaching one endpoint, in a short list (read
// whole) and a long one (found by the index); an index entry that does not name the endpoint
// at its ordinal is not trusted.
func TestProg6Affinity(t *testing.T) {
	fe := netip.AddrPortFrom(tp6Cluster, 80)
	ep := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x65, 15: byte(0x10 + i)}), uint16(8000+i))
	}
	setup := func(t *testing.T, n int) (*tpNode, map[netip.AddrPort]bool) {
		a := tpNewWorld(t).node6()
		a.frontend6(tp6Cluster, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: uint32(n), Local: uint32(n), AffinitySec: 3600})
		var bs []sluiceBeValV6
		valid := map[netip.AddrPort]bool{}
		for i := range n {
			bs = append(bs, tp6Backend(ep(i), tpBeLocal))
			valid[ep(i)] = true
		}
		a.backends6(1, bs...)
		return a, valid
	}
	reached := func(t *testing.T, a *tpNode, client netip.Addr, sport uint16) netip.AddrPort {
		t.Helper()
		syn := tp6TCP(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(client, sport), fe, tpSYN, 1, 0, nil)
		rc, out := a.run6(a.o.SlFromWep, "wep1", false, syn)
		if rc != tpOK && rc != tpRedirect {
			t.Fatalf("flow from port %d: verdict %d", sport, rc)
		}
		f := tp6DecodeOK(t, out)
		return netip.AddrPortFrom(f.DstIP, f.TCP.Dport)
	}
	affKey := sluiceAffKeyV6{FeAddr: tp6A(tp6Cluster), FePort: tpP(80), Proto: tpProtoTCP, Client: tp6A(tp6PodA7)}
	aff := func(t *testing.T, a *tpNode) sluiceAffValV6 {
		t.Helper()
		var v sluiceAffValV6
		if err := a.o.SlAffV6.Lookup(&affKey, &v); err != nil {
			t.Fatalf("affinity entry: %v", err)
		}
		return v
	}
	remember := func(t *testing.T, a *tpNode, target netip.AddrPort) {
		t.Helper()
		v := aff(t, a)
		v.Addr, v.Port = tp6A(target.Addr()), tpP(target.Port())
		a.put(a.o.SlAffV6, affKey, v)
	}
	same := func(t *testing.T, a *tpNode, valid map[netip.AddrPort]bool, base uint16) netip.AddrPort {
		t.Helper()
		first := reached(t, a, tp6PodA7, base)
		if !valid[first] {
			t.Fatalf("the first flow went to %v, no endpoint of the list", first)
		}
		for i := 1; i <= 10; i++ {
			if got := reached(t, a, tp6PodA7, base+uint16(i)); got != first {
				t.Fatalf("new flow %d went to %v, the client's first to %v", i, got, first)
			}
		}
		if v := aff(t, a); v.Addr != tp6A(first.Addr()) || v.Port != tpP(first.Port()) {
			t.Errorf("affinity entry %v:%d, want %v", HostAddr6(v.Addr), HostPort(v.Port), first)
		}
		return first
	}

	t.Run("three endpoints", func(t *testing.T) {
		a, valid := setup(t, 3)
		same(t, a, valid, 30000)
		// Other clients spread over the endpoints.
		spread := map[netip.AddrPort]bool{}
		for i := range 40 {
			c := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x65, 14: 1, 15: byte(i)})
			spread[reached(t, a, c, 30000)] = true
		}
		if len(spread) < 2 {
			t.Errorf("40 clients all went to %v", spread)
		}
		a.wantCounters(map[int]uint64{tpCNatNew: 51})
	})

	t.Run("long list", func(t *testing.T) {
		a, valid := setup(t, 20)
		same(t, a, valid, 30000)
		// Remembered at ordinal 18, past what is read whole: found by the index.
		remember(t, a, ep(18))
		for i := range 10 {
			if got := reached(t, a, tp6PodA7, 31000+uint16(i)); got != ep(18) {
				t.Fatalf("flow %d went to %v; the client is remembered at %v, ordinal 18 of 20", i, got, ep(18))
			}
		}
		// A wrong index entry: an endpoint not in the list, indexed at ordinal 3. Not trusted:
		// the flow gets an endpoint of the list, and it is remembered.
		gone := netip.AddrPortFrom(netip.MustParseAddr("fd00:65::99"), 9999)
		a.put(a.o.SlBeIdxV6, sluiceBeIdxKeyV6{ListId: 1, Addr: tp6A(gone.Addr()), Port: tpP(gone.Port())}, uint32(3))
		remember(t, a, gone)
		got := reached(t, a, tp6PodA7, 32000)
		if !valid[got] {
			t.Errorf("with a wrong index entry the flow went to %v, no endpoint of the list", got)
		}
		if v := aff(t, a); v.Addr != tp6A(got.Addr()) || v.Port != tpP(got.Port()) {
			t.Errorf("affinity entry %v:%d after a fresh choice of %v", HostAddr6(v.Addr), HostPort(v.Port), got)
		}
		// An index entry past the list's end: not trusted either.
		a.put(a.o.SlBeIdxV6, sluiceBeIdxKeyV6{ListId: 1, Addr: tp6A(gone.Addr()), Port: tpP(gone.Port())}, uint32(500))
		remember(t, a, gone)
		if got := reached(t, a, tp6PodA7, 32001); !valid[got] {
			t.Errorf("with an index entry past the list's end the flow went to %v", got)
		} else if v := aff(t, a); v.Addr != tp6A(got.Addr()) || v.Port != tpP(got.Port()) {
			t.Errorf("affinity entry %v:%d after a fresh choice of %v", HostAddr6(v.Addr), HostPort(v.Port), got)
		}
		// An endpoint of the list whose index entry names another's ordinal: not trusted.
		a.put(a.o.SlBeIdxV6, sluiceBeIdxKeyV6{ListId: 1, Addr: tp6A(ep(17).Addr()), Port: tpP(ep(17).Port())}, uint32(4))
		remember(t, a, ep(17))
		if got := reached(t, a, tp6PodA7, 32002); !valid[got] {
			t.Errorf("with a wrong ordinal in the index the flow went to %v", got)
		} else if v := aff(t, a); v.Addr != tp6A(got.Addr()) || v.Port != tpP(got.Port()) {
			// Trusting the entry would send the flow to ordinal 4 and leave ep(17) remembered.
			t.Errorf("affinity entry %v:%d after the flow went to %v", HostAddr6(v.Addr), HostPort(v.Port), got)
		}
		a.wantCounters(map[int]uint64{tpCNatNew: 24})
	})
}

// Hairpin: a workload reaching itself through a cluster IP gets the hairpin source, so that its
// answer leaves it and is translated back to come from the cluster IP.
func TestProg6Hairpin(t *testing.T) {
	a := tp6xClusterNode(t)
	fe := netip.AddrPortFrom(tp6Cluster, 80)
	pod := netip.AddrPortFrom(tp6PodA5, 8080)
	client := netip.AddrPortFrom(tp6PodA5, 40000)
	hp := netip.AddrPortFrom(tp6Hairpin, 40000)

	syn := tp6TCP(tpMACPodA5, tpMACWepA0, client, fe, tpSYN, 1000, 0, nil)
	rc, out := a.run6(a.o.SlFromWep, "wep0", false, syn)
	toPod := tp6xNAT(syn, tpMACWepA0, tpMACPodA5, hp, pod)
	tp6xWant(t, rc, out, tpRedirect, toPod)
	a.wantCT6(tp6Key(client, fe, tpProtoTCP), sluiceCtValV6{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tp6A(tp6PodA5), NatPort: tpP(8080),
		NatSport: tpP(40000), NatSaddr: tp6A(tp6Hairpin)})
	revKey := tp6Key(pod, hp, tpProtoTCP)
	revWant := sluiceCtValV6{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPSyn, NatAddr: tp6A(tp6Cluster), NatPort: tpP(80),
		NatSport: tpP(40000), NatSaddr: tp6A(tp6PodA5)}
	a.wantCT6(revKey, revWant)
	// Leaving by the workload's interface it is no reply to translate.
	rc, out2 := a.run6(a.o.SlToWep, "wep0", true, toPod)
	tp6xWant(t, rc, out2, tpOK, toPod)

	// The answer to the hairpin address: from the cluster IP to the pod's own address.
	synack := tp6TCP(tpMACPodA5, tpMACWepA0, pod, hp, tpSYN|tpACK, 5000, 1001, nil)
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, synack)
	back := tp6xNAT(synack, tpMACWepA0, tpMACPodA5, fe, client)
	tp6xWant(t, rc, out, tpRedirect, back)
	revWant.Tcp |= tpTCPReplied | tpTCPOpening
	a.wantCT6(revKey, revWant)
	rc, out2 = a.run6(a.o.SlToWep, "wep0", true, back)
	tp6xWant(t, rc, out2, tpOK, back)

	ack := tp6TCP(tpMACPodA5, tpMACWepA0, client, fe, tpACK|tpPSH, 1001, 5001, []byte("GET / HTTP/1.0\r\n\r\n"))
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, ack)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(ack, tpMACWepA0, tpMACPodA5, hp, pod))
	revWant.Tcp &^= tpTCPOpening
	a.wantCT6(revKey, revWant)
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})

	// UDP, and ICMPv6 errors in both directions (as TestProgHairpin for IPv4): the workload's
	// port unreachable about the datagram it got (sent to the hairpin address) reaches it from
	// the cluster IP about the datagram it sent; its error about the answer it got (from the
	// cluster IP) reaches it from the hairpin address about the answer it sent.
	dns := netip.AddrPortFrom(tp6Cluster, 53)
	uclient := netip.AddrPortFrom(tp6PodA5, 40053)
	be := netip.AddrPortFrom(tp6PodA5, 5353)
	uhp := netip.AddrPortFrom(tp6Hairpin, 40053)
	q := tp6UDP(tpMACPodA5, tpMACWepA0, uclient, dns, []byte("query"))
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, q)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(q, tpMACWepA0, tpMACPodA5, uhp, be))
	sent := tp6xIP(out)
	unr := tp6xError(tpMACPodA5, tpMACWepA0, tp6PodA5, tp6Hairpin, 1, 4, 0, sent)
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, unr)
	got := tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA0, tpMACPodA5, tp6Cluster, tp6PodA5, 1, 4, 0, tp6xRequote(sent, q)))
	if s, d := tp6xQuoted(t, got); s != uclient || d != dns {
		t.Errorf("the error quotes %v > %v, want %v > %v", s, d, uclient, dns)
	}
	r := tp6UDP(tpMACPodA5, tpMACWepA0, be, uhp, []byte("answer"))
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, r)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(r, tpMACWepA0, tpMACPodA5, dns, uclient))
	gotAnswer := tp6xIP(out)
	unr = tp6xError(tpMACPodA5, tpMACWepA0, tp6PodA5, tp6Cluster, 1, 4, 0, gotAnswer)
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, unr)
	got = tp6xWant(t, rc, out, tpRedirect, tp6xError(tpMACWepA0, tpMACPodA5, tp6Hairpin, tp6PodA5, 1, 4, 0, tp6xRequote(gotAnswer, r)))
	if s, d := tp6xQuoted(t, got); s != be || d != uhp {
		t.Errorf("the error quotes %v > %v, want %v > %v", s, d, be, uhp)
	}
	a.wantCounters(map[int]uint64{tpCNatNew: 2, tpCRevNat: 3})
}

// tp6xZeroSum returns payload with the 16-bit word at off (even) chosen so that the UDP
// checksum of the datagram from src to dst computes to 0 (the one's-complement sum is all
// ones), which IPv6 must carry as 0xffff.
func tp6xZeroSum(src, dst netip.AddrPort, payload []byte, off int) []byte {
	p := bytes.Clone(payload)
	p[off], p[off+1] = 0, 0
	l4 := tp6UDP(tpZeroMAC, tpZeroMAC, src, dst, p).l4()
	l4[6], l4[7] = 0, 0
	binary.BigEndian.PutUint16(p[off:], tpChecksum(tp6Pseudo(src.Addr(), dst.Addr(), tpProtoUDP, l4)))
	return p
}

// A UDP checksum that becomes 0 by the translation is written 0xffff (0 is "no checksum",
// which IPv6 forbids), both ways.
func TestProg6UDPChecksumNeverZero(t *testing.T) {
	a := tp6xClusterNode(t)
	client := netip.AddrPortFrom(tp6PodA7, 40053)
	dns := netip.AddrPortFrom(tp6Cluster, 53)
	pod := netip.AddrPortFrom(tp6PodA5, 5353)
	wantFFFF := func(t *testing.T, out []byte) {
		t.Helper()
		if c := binary.BigEndian.Uint16(out[14+40+6:]); c != 0xffff {
			t.Errorf("UDP checksum %#04x, want 0xffff", c)
		}
	}

	payload := tp6xZeroSum(client, pod, []byte("zero-sum query!!"), 4)
	check := func(src, dst netip.AddrPort, p []byte) uint16 {
		l4 := tp6UDP(tpZeroMAC, tpZeroMAC, src, dst, p).l4()
		l4[6], l4[7] = 0, 0
		return tpChecksum(tp6Pseudo(src.Addr(), dst.Addr(), tpProtoUDP, l4))
	}
	if c := check(client, pod, payload); c != 0 {
		t.Fatalf("the crafted datagram's translated checksum computes to %#04x, not 0", c)
	}
	if c := check(client, dns, payload); c == 0 {
		t.Fatalf("the crafted datagram's checksum as sent is 0 too")
	}
	q := tp6UDP(tpMACPodA7, tpMACWepA1, client, dns, payload)
	rc, out := a.run6(a.o.SlFromWep, "wep1", false, q)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	wantFFFF(t, out)

	// The answer, whose checksum becomes 0 as it is translated back.
	answer := tp6xZeroSum(dns, client, []byte("zero-sum answer!"), 6)
	r := tp6UDP(tpMACPodA5, tpMACWepA0, pod, client, answer)
	rc, out = a.run6(a.o.SlFromWep, "wep0", false, r)
	tp6xWant(t, rc, out, tpRedirect, tp6xNAT(r, tpMACWepA1, tpMACPodA7, dns, netip.AddrPort{}))
	wantFFFF(t, out)
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
}
