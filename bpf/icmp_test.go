package bpf

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// The ICMP tests send ICMP errors about translated flows through the tc programs, as the
// kernel's NAT would see them: an error about a packet a client sent (a backend's port
// unreachable, a router's fragmentation-needed) must reach the client as if about the packet
// it sent to the frontend; an error about a reply must reach the backend as if about the
// reply it sent. Outputs are compared byte for byte with frames built from scratch, so the
// outer IP checksum, the quoted IP header's checksum and the ICMP checksum are all checked
// by recomputation; the quoted header is also decoded and checked field by field.
//
// The quoted packet's own transport checksum is left as it was quoted: receivers match an
// error to a socket by the quoted addresses and ports only (Linux's tcp_v4_err and
// __udp4_lib_err do not check it), and a short quote (RFC 792's 8 bytes) does not even carry
// a TCP checksum. The expected frames keep it as quoted too (ieRequote).

const (
	ieUnreach    = 3
	iePortUnr    = 3
	ieFragNeeded = 4
	ieTimeExc    = 11
	ieEcho       = 8
)

// ieAbout is an ICMP error (type, code and the header's second word rest) from src to dst
// quoting the first n bytes of the IP packet quote (all of it when n is 0 or larger).
func ieAbout(srcMAC, dstMAC tpMAC, src, dst netip.Addr, typ, code uint8, rest uint32, quote []byte, n int) tpFrame {
	if n <= 0 || n > len(quote) {
		n = len(quote)
	}
	return tpFrame{Dst: dstMAC, Src: srcMAC,
		IP:      tpIPv4{TTL: 64, Proto: tpProtoICMP, Src: src, Dst: dst},
		ICMP:    tpICMP{Type: typ, Code: code, Rest: rest},
		Payload: append([]byte(nil), quote[:n]...)}
}

// ieIP is the IP packet of a built frame (what an ICMP error quotes).
func ieIP(frame []byte) []byte { return append([]byte(nil), frame[14:]...) }

// ieRequote is the quote as the programs leave it when they translate quoted into as: the
// packet as built from as, cut to quoted's length, with quoted's transport checksum kept.
func ieRequote(quoted []byte, as tpFrame) []byte {
	b := ieIP(as.build())[:len(quoted)]
	hlen := int(b[0]&0x0f) * 4
	off := hlen + 6
	if as.IP.Proto == tpProtoTCP {
		off = hlen + 16
	}
	if len(quoted) >= off+2 {
		copy(b[off:off+2], quoted[off:off+2])
	}
	return b
}

// ieQuoted decodes the quoted packet of an ICMP error: its IP header (whose checksum must be
// right) and ports.
func ieQuoted(t *testing.T, f tpFrame) (src, dst netip.AddrPort, proto uint8) {
	t.Helper()
	q := f.Payload
	if len(q) < 1 || q[0]>>4 != 4 || q[0]&0x0f < 5 || len(q) < int(q[0]&0x0f)*4+8 {
		t.Fatalf("quoted packet %x is not an IPv4 header and 8 bytes", q)
	}
	hlen := int(q[0]&0x0f) * 4
	if c := tpChecksum(q[:hlen]); c != 0 {
		t.Errorf("quoted IP header checksum %#04x does not verify", binary.BigEndian.Uint16(q[10:]))
	}
	src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(q[12:16])), binary.BigEndian.Uint16(q[hlen:]))
	dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(q[16:20])), binary.BigEndian.Uint16(q[hlen+2:]))
	return src, dst, q[9]
}

// ieWantQuote checks the outer addresses of an ICMP error and the tuple it quotes.
func ieWantQuote(t *testing.T, f tpFrame, outerSrc, outerDst netip.Addr, qsrc, qdst netip.AddrPort) {
	t.Helper()
	if f.IP.Proto != tpProtoICMP {
		t.Fatalf("output %v is no ICMP", f)
	}
	if f.IP.Src != outerSrc || f.IP.Dst != outerDst {
		t.Errorf("ICMP error from %v to %v, want from %v to %v", f.IP.Src, f.IP.Dst, outerSrc, outerDst)
	}
	src, dst, _ := ieQuoted(t, f)
	if src != qsrc || dst != qdst {
		t.Errorf("the error quotes %v > %v, want %v > %v", src, dst, qsrc, qdst)
	}
}

// ieVXLANInner checks a tunnelled output from node src to node dst and returns its inner
// frame.
func ieVXLANInner(t *testing.T, rc uint32, out []byte, srcMAC, dstMAC tpMAC, src, dst netip.Addr) tpFrame {
	t.Helper()
	if rc != tpRedirect {
		t.Errorf("verdict %d, want %d (redirect)", rc, tpRedirect)
	}
	got := tpDecodeOK(t, out)
	if got.Inner == nil {
		t.Fatalf("output is not VXLAN: %v", got)
	}
	if got.Src != srcMAC || got.Dst != dstMAC || got.IP.Src != src || got.IP.Dst != dst || got.VNI != tpVNI {
		t.Errorf("tunnelled %v, want %v>%v %v>%v vni %#x", got, srcMAC, dstMAC, src, dst, tpVNI)
	}
	return *got.Inner
}

// Case 1: a workload's UDP flow to a cluster IP, the backend on the same node answers with
// port unreachable.
func TestICMPErrorFromLocalBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	vip := netip.MustParseAddr("10.96.0.10")
	a.frontend(vip, 53, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
	a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 2, SvcId: 1, Count: 1, Local: 1})
	a.backends(1, tpBackend(tpAP("10.65.0.5:5353"), tpNodeA, true))
	a.backends(2, tpBackend(tpAP("10.65.0.5:8080"), tpNodeA, true))
	client := netip.AddrPortFrom(tpPodA7, 40053)
	front := netip.AddrPortFrom(vip, 53)
	pod := netip.AddrPortFrom(tpPodA5, 5353)

	q := tpUDPFrame(tpMACPodA7, tpMACWepA1, client, front, []byte("query"))
	rc, out := a.fromWep("wep1", q)
	tpWant(t, rc, out, tpRedirect, tpNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	sent := ieIP(out) // the datagram as the backend got it

	// The backend quotes the whole datagram, as Linux does; the error reaches the client from
	// the frontend, about the datagram it sent, routed to its interface.
	unr := ieAbout(tpMACPodA5, tpMACWepA0, tpPodA5, tpPodA7, ieUnreach, iePortUnr, 0, sent, 0)
	rc, out = a.fromWep("wep0", unr)
	got := tpWant(t, rc, out, tpRedirect, ieAbout(tpMACWepA1, tpMACPodA7, vip, tpPodA7, ieUnreach, iePortUnr, 0, ieRequote(sent, q), 0))
	ieWantQuote(t, got, vip, tpPodA7, client, front)

	// The same error egressing to the client's interface (sl_to_wep) is not translated again.
	rc, out2 := a.toWep("wep1", got)
	tpWant(t, rc, out2, tpOK, got)

	// TCP: a reset would be usual, but an error quoting a segment is translated the same way.
	syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, 33333), netip.AddrPortFrom(vip, 80), tpSYN, 7000, 0, nil)
	rc, out = a.fromWep("wep1", syn)
	tpWantVerdict(t, rc, tpRedirect)
	sent = ieIP(out)
	unr = ieAbout(tpMACPodA5, tpMACWepA0, tpPodA5, tpPodA7, ieUnreach, iePortUnr, 0, sent, 0)
	rc, out = a.fromWep("wep0", unr)
	got = tpWant(t, rc, out, tpRedirect, ieAbout(tpMACWepA1, tpMACPodA7, vip, tpPodA7, ieUnreach, iePortUnr, 0, ieRequote(sent, syn), 0))
	ieWantQuote(t, got, vip, tpPodA7, netip.AddrPortFrom(tpPodA7, 33333), netip.AddrPortFrom(vip, 80))
	a.wantCounters(map[int]uint64{tpCNatNew: 2, tpCRevNat: 2})
}

// Case 2: a node port reached from outside, backend on this node: the backend's error goes
// back the way the request came, by the recorded interface to the recorded hop.
func TestICMPErrorNodePortLocal(t *testing.T) {
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	a.frontend(netip.IPv4Unspecified(), 30080, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeNodePort})
	a.backends(1, tpBackend(tpAP("10.65.0.5:8080"), tpNodeA, true))
	client := netip.AddrPortFrom(tpClient, 41000)
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	pod := netip.AddrPortFrom(tpPodA5, 8080)

	q := tpUDPFrame(tpMACEdge, tpMACA1, client, front, []byte("ping"))
	rc, out := a.fromHost("nic1", q)
	tpWant(t, rc, out, tpRedirect, tpNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	rev := a.wantCT(tpKey(pod, client, tpProtoUDP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtRedirect | tpCtLocal,
		Ifindex: uint32(a.ifindex["nic1"]), NatAddr: tpA(tpEdgeA), NatPort: tpP(30080), NatSport: tpP(41000),
		MacLocal: tpMACA1, MacPeer: tpMACEdge})
	sent := ieIP(out)

	unr := ieAbout(tpMACPodA5, tpMACWepA0, tpPodA5, tpClient, ieUnreach, iePortUnr, 0, sent, 0)
	rc, out = a.fromWep("wep0", unr)
	got := tpWant(t, rc, out, tpRedirect, ieAbout(tpMACA1, tpMACEdge, tpEdgeA, tpClient, ieUnreach, iePortUnr, 0, ieRequote(sent, q), 0))
	ieWantQuote(t, got, tpEdgeA, tpClient, client, front)
	if got.Src != rev.MacLocal || got.Dst != rev.MacPeer {
		t.Errorf("error sent %v>%v, want the recorded %v>%v (towards ifindex %d)", got.Src, got.Dst, tpMAC(rev.MacLocal), tpMAC(rev.MacPeer), rev.Ifindex)
	}
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
}

// Case 3: backend on another node. The pod's error about a tunnelled flow goes back through
// the tunnel to the ingress node, which unwraps and translates it.
func TestICMPErrorThroughTunnel(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	t.Run("node port", func(t *testing.T) {
		a, b := tpRemoteNodePort(t)
		client := netip.AddrPortFrom(tpClient, 41000)
		front := netip.AddrPortFrom(tpEdgeA, 30080)
		pod := netip.AddrPortFrom(tpPodB5, 8080)

		q := tpUDPFrame(tpMACEdge, tpMACA1, client, front, []byte("ping"))
		rc, out := a.fromHost("nic1", q)
		_, port := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(q, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
		mid := netip.AddrPortFrom(tpClient, port)
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(q, tpMACWepB0, tpMACPodB5, mid, pod))
		b.wantCT(tpKey(pod, mid, tpProtoUDP), sluiceCtValV4{Type: tpCtTun, NatAddr: tpA(tpNodeA)})
		sent := ieIP(out)

		// Node B: the pod's error (about client:psnat > pod) goes to node A as it is.
		unr := ieAbout(tpMACPodB5, tpMACWepB0, tpPodB5, tpClient, ieUnreach, iePortUnr, 0, sent, 0)
		rc, out = b.fromWep("wep0", unr)
		ieVXLANInner(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA)
		tpSame(t, out[14+20+8+8:], tpUnwrapped(unr))

		// Node A: unwrapped, from the node port about the datagram the client sent, by nic1
		// to the edge router.
		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		got := tpWant(t, rc, out, tpRedirect, ieAbout(tpMACA1, tpMACEdge, tpEdgeA, tpClient, ieUnreach, iePortUnr, 0,
			ieRequote(sent, q), 0))
		ieWantQuote(t, got, tpEdgeA, tpClient, client, front)
		rev, _ := a.ct(tpKey(pod, mid, tpProtoUDP))
		if rev.Ifindex != uint32(a.ifindex["nic1"]) || got.Src != rev.MacLocal || got.Dst != rev.MacPeer {
			t.Errorf("recorded ifindex %d, MACs %v>%v; the error went %v>%v", rev.Ifindex, tpMAC(rev.MacLocal), tpMAC(rev.MacPeer), got.Src, got.Dst)
		}
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1, tpCTunIn: 1, tpCRevNat: 1})
		b.wantCounters(map[int]uint64{tpCTunIn: 1})

		// The same error tunnelled by another node (not the backend's) is forged.
		forged := tpVXLANFrame(tpMACC0, tpMACA0, tpNodeC, tpNodeA, 50000, tpVXLANPort, tpVNI, tpUnwrapped(unr))
		rc, _ = a.fromHost("nic0", forged)
		tpWantVerdict(t, rc, tpShot)
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1, tpCTunIn: 2, tpCRevNat: 1, tpCDropForgedTunnel: 1})
	})

	t.Run("cluster IP", func(t *testing.T) {
		// A workload client: the translated error is routed to its interface.
		a, b := tpRemoteNodePort(t)
		vip := netip.MustParseAddr("10.96.0.10")
		a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1})
		client := netip.AddrPortFrom(tpPodA7, 33333)
		front := netip.AddrPortFrom(vip, 80)
		pod := netip.AddrPortFrom(tpPodB5, 8080)
		syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpSYN, 1000, 0, nil)
		rc, out := a.fromWep("wep1", syn)
		_, port := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
		mid := netip.AddrPortFrom(tpPodA7, port)
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepB0, tpMACPodB5, mid, pod))
		sent := ieIP(out)
		unr := ieAbout(tpMACPodB5, tpMACWepB0, tpPodB5, tpPodA7, ieUnreach, iePortUnr, 0, sent, 0)
		rc, out = b.fromWep("wep0", unr)
		ieVXLANInner(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA)
		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		got := tpWant(t, rc, out, tpRedirect, ieAbout(tpMACWepA1, tpMACPodA7, vip, tpPodA7, ieUnreach, iePortUnr, 0,
			ieRequote(sent, syn), 0))
		ieWantQuote(t, got, vip, tpPodA7, client, front)
	})
}

// Case 4: a router on the way to the backend (here an endpoint the node reaches through the
// edge router) sends fragmentation-needed about the client's translated packet: the error
// keeps the router's address and quotes the packet the client sent.
func TestICMPErrorFromRouter(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.60")
	far := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.50"), 6443)
	client := netip.AddrPortFrom(tpPodA7, 33333)
	front := netip.AddrPortFrom(vip, 443)
	setup := func(t *testing.T) (*tpNode, tpFrame, []byte) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		a.frontend(vip, 443, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
		a.backends(1, tpRoutedBackend(far)) // on no node: the kernel routes it
		data := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpSYN, 1000, 0, make([]byte, 1400))
		rc, out := a.fromWep("wep1", data)
		tpWant(t, rc, out, tpOK, tpNAT(data, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, far))
		return a, data, ieIP(out)
	}
	for _, c := range []struct {
		name      string
		typ, code uint8
		rest      uint32
		n         int
	}{
		{"frag-needed quoting 548 bytes", ieUnreach, ieFragNeeded, 1400, 548},
		{"frag-needed quoting 8 bytes of TCP (RFC 792)", ieUnreach, ieFragNeeded, 1400, 28},
		{"time exceeded", ieTimeExc, 0, 0, 548},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, data, sent := setup(t)
			tooBig := ieAbout(tpMACEdge, tpMACA1, tpEdgeRtr, tpPodA7, c.typ, c.code, c.rest, sent, c.n)
			rc, out := a.fromHost("nic1", tooBig)
			got := tpWant(t, rc, out, tpRedirect, ieAbout(tpMACWepA1, tpMACPodA7, tpEdgeRtr, tpPodA7, c.typ, c.code, c.rest,
				ieRequote(tooBig.Payload, data), 0))
			ieWantQuote(t, got, tpEdgeRtr, tpPodA7, client, front)
			if got.ICMP.Rest != c.rest {
				t.Errorf("the error's second word is %#x, want %#x (the MTU kept)", got.ICMP.Rest, c.rest)
			}
			a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
		})
	}
}

// Case 5: an error from the client's side about a reply goes to the backend, about the reply
// the backend sent.
func TestICMPErrorAboutReply(t *testing.T) {
	t.Run("local backend", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		a.frontend(netip.IPv4Unspecified(), 30080, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeNodePort})
		vip := netip.MustParseAddr("10.96.0.10")
		a.frontend(vip, 53, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
		a.backends(1, tpBackend(tpAP("10.65.0.5:8080"), tpNodeA, true))
		pod := netip.AddrPortFrom(tpPodA5, 8080)

		// From outside, by the node port.
		client := netip.AddrPortFrom(tpClient, 41000)
		front := netip.AddrPortFrom(tpEdgeA, 30080)
		rc, _ := a.fromHost("nic1", tpUDPFrame(tpMACEdge, tpMACA1, client, front, []byte("ping")))
		tpWantVerdict(t, rc, tpRedirect)
		r := tpUDPFrame(tpMACPodA5, tpMACWepA0, pod, client, []byte("pong"))
		rc, out := a.fromWep("wep0", r)
		tpWant(t, rc, out, tpRedirect, tpNAT(r, tpMACA1, tpMACEdge, front, netip.AddrPort{}))
		got := ieIP(out) // the reply as the client got it
		unr := ieAbout(tpMACEdge, tpMACA1, tpClient, tpEdgeA, ieUnreach, iePortUnr, 0, got, 0)
		rc, out = a.fromHost("nic1", unr)
		f := tpWant(t, rc, out, tpRedirect, ieAbout(tpMACWepA0, tpMACPodA5, tpClient, tpPodA5, ieUnreach, iePortUnr, 0,
			ieRequote(got, r), 0))
		ieWantQuote(t, f, tpClient, tpPodA5, pod, client)

		// From a workload, by the cluster IP.
		wc := netip.AddrPortFrom(tpPodA7, 40053)
		dns := netip.AddrPortFrom(vip, 53)
		rc, _ = a.fromWep("wep1", tpUDPFrame(tpMACPodA7, tpMACWepA1, wc, dns, []byte("query")))
		tpWantVerdict(t, rc, tpRedirect)
		r = tpUDPFrame(tpMACPodA5, tpMACWepA0, pod, wc, []byte("answer"))
		rc, out = a.fromWep("wep0", r)
		tpWant(t, rc, out, tpRedirect, tpNAT(r, tpMACWepA1, tpMACPodA7, dns, netip.AddrPort{}))
		got = ieIP(out)
		unr = ieAbout(tpMACPodA7, tpMACWepA1, tpPodA7, vip, ieUnreach, iePortUnr, 0, got, 0)
		rc, out = a.fromWep("wep1", unr)
		f = tpWant(t, rc, out, tpRedirect, ieAbout(tpMACWepA0, tpMACPodA5, tpPodA7, tpPodA5, ieUnreach, iePortUnr, 0,
			ieRequote(got, r), 0))
		ieWantQuote(t, f, tpPodA7, tpPodA5, pod, wc)
		// Egressing to the backend's interface it is not translated again.
		rc, out = a.toWep("wep0", f)
		tpWant(t, rc, out, tpOK, f)
		a.wantCounters(map[int]uint64{tpCNatNew: 2, tpCRevNat: 2})
	})

	t.Run("remote backend", func(t *testing.T) {
		a, b := tpRemoteNodePort(t)
		client := netip.AddrPortFrom(tpClient, 41000)
		front := netip.AddrPortFrom(tpEdgeA, 30080)
		pod := netip.AddrPortFrom(tpPodB5, 8080)
		q := tpUDPFrame(tpMACEdge, tpMACA1, client, front, []byte("ping"))
		rc, out := a.fromHost("nic1", q)
		_, port := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(q, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
		mid := netip.AddrPortFrom(tpClient, port)
		rc, _ = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tpWantVerdict(t, rc, tpRedirect)
		r := tpUDPFrame(tpMACPodB5, tpMACWepB0, pod, mid, []byte("pong"))
		rc, out = b.fromWep("wep0", r)
		tpWantVXLAN(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA, tpUnwrapped(r), false)
		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(r, tpMACA1, tpMACEdge, front, client))
		got := ieIP(out)

		// Node A: the client's error, to the pod about pod > client:psnat, through the tunnel.
		unr := ieAbout(tpMACEdge, tpMACA1, tpClient, tpEdgeA, ieUnreach, iePortUnr, 0, got, 0)
		rc, out = a.fromHost("nic1", unr)
		want := ieAbout(tpZeroMAC, tpZeroMAC, tpClient, tpPodB5, ieUnreach, iePortUnr, 0,
			ieRequote(got, r), 0)
		inner := ieVXLANInner(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB)
		tpSame(t, out[14+20+8+8:], want)
		ieWantQuote(t, inner, tpClient, tpPodB5, pod, mid)

		// Node B: unwrapped and delivered to the pod as it is.
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(want, tpMACWepB0, tpMACPodB5, netip.AddrPort{}, netip.AddrPort{}))
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1, tpCTunIn: 1, tpCRevNat: 1})
		b.wantCounters(map[int]uint64{tpCTunIn: 2})

		// Another node cannot send the pod errors about the flow.
		forged := tpVXLANFrame(tpMACC0, tpMACB0, tpNodeC, tpNodeB, 50000, tpVXLANPort, tpVNI, want)
		rc, _ = b.fromHost("nic0", forged)
		tpWantVerdict(t, rc, tpShot)
		b.wantCounters(map[int]uint64{tpCTunIn: 3, tpCDropForgedTunnel: 1})
	})
}

// Case 6: ICMP that is not about a translated flow passes untouched.
func TestICMPNotOurs(t *testing.T) {
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	vip := netip.MustParseAddr("10.96.0.10")
	a.frontend(vip, 53, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
	a.frontend(vip, 0, 0, sluiceFeVal{SvcId: 1, Flags: tpFeAddrOnly})
	a.backends(1, tpBackend(tpAP("10.65.0.5:5353"), tpNodeA, true))
	// A live flow, so that the tables are not empty.
	rc, _ := a.fromWep("wep1", tpUDPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, 40053), netip.AddrPortFrom(vip, 53), []byte("q")))
	tpWantVerdict(t, rc, tpRedirect)

	other := ieIP(tpUDPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, 40054), tpAP("10.65.0.5:5353"), []byte("q")).build())
	echo := tpFrame{Dst: tpMACWepA1, Src: tpMACPodA7, IP: tpIPv4{TTL: 64, Proto: tpProtoICMP, Src: tpPodA7, Dst: vip},
		ICMP: tpICMP{Type: ieEcho, Rest: 0x12340001}, Payload: []byte("abcdefgh")}
	// An echo whose data looks like a quote of the live flow is still an echo.
	live := ieIP(tpUDPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, 40053), tpAP("10.65.0.5:5353"), []byte("q")).build())
	echoQuote := tpFrame{Dst: tpMACWepA0, Src: tpMACPodA5, IP: tpIPv4{TTL: 64, Proto: tpProtoICMP, Src: tpPodA5, Dst: tpPodA7},
		ICMP: tpICMP{Type: 0, Rest: 0x12340001}, Payload: live}
	for _, c := range []struct {
		name string
		run  func(tpFrame) (uint32, []byte)
		f    tpFrame
	}{
		{"error about an unknown tuple, from a workload", func(f tpFrame) (uint32, []byte) { return a.fromWep("wep0", f) },
			ieAbout(tpMACPodA5, tpMACWepA0, tpPodA5, tpPodA7, ieUnreach, iePortUnr, 0, other, 0)},
		{"error about an unknown tuple, from a host interface", func(f tpFrame) (uint32, []byte) { return a.fromHost("nic1", f) },
			ieAbout(tpMACEdge, tpMACA1, tpEdgeRtr, tpPodA7, ieUnreach, ieFragNeeded, 1400, other, 0)},
		{"error about an unknown tuple, to a workload", func(f tpFrame) (uint32, []byte) { return a.toWep("wep1", f) },
			ieAbout(tpMACWepA1, tpMACPodA7, tpPodA5, tpPodA7, ieUnreach, iePortUnr, 0, other, 0)},
		{"echo request to a cluster IP", func(f tpFrame) (uint32, []byte) { return a.fromWep("wep1", f) }, echo},
		{"echo request from outside", func(f tpFrame) (uint32, []byte) { return a.fromHost("nic1", f) },
			tpNAT(echo, tpMACEdge, tpMACA1, netip.AddrPortFrom(tpClient, 0), netip.AddrPortFrom(tpEdgeA, 0))},
		{"echo reply carrying a live tuple", func(f tpFrame) (uint32, []byte) { return a.fromWep("wep0", f) }, echoQuote},
	} {
		rc, out := c.run(c.f)
		if rc != tpOK {
			t.Errorf("%s: verdict %d, want %d (passed on)", c.name, rc, tpOK)
		}
		tpSame(t, out, c.f)
	}
	a.wantCounters(map[int]uint64{tpCNatNew: 1})
}

// TestICMPBuilder checks the test's own ICMP error frames: the quote is cut where asked and
// every checksum verifies.
func TestICMPBuilder(t *testing.T) {
	q := tpUDPFrame(tpMACPodA7, tpMACWepA1, tpAP("10.65.0.7:40053"), tpAP("10.96.0.10:53"), []byte("query"))
	for _, n := range []int{0, 28, 30} {
		e := ieAbout(tpMACPodA5, tpMACWepA0, tpPodA5, tpPodA7, ieUnreach, iePortUnr, 0, ieIP(q.build()), n)
		got, bad, err := tpDecode(e.build(), tpVXLANPort)
		if err != nil || len(bad) > 0 {
			t.Fatalf("quote %d: %v %v", n, err, bad)
		}
		want := len(ieIP(q.build()))
		if n > 0 {
			want = n
		}
		if len(got.Payload) != want {
			t.Errorf("quote %d: %d bytes quoted", n, len(got.Payload))
		}
		src, dst, proto := ieQuoted(t, got)
		if src != tpAP("10.65.0.7:40053") || dst != tpAP("10.96.0.10:53") || proto != tpProtoUDP {
			t.Errorf("quote %d: %v > %v proto %d", n, src, dst, proto)
		}
	}
}
