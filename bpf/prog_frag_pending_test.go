package bpf

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// The cutting and the IPv6 tunnel's fragments as test runs (BPF_PROG_TEST_RUN); the same
// traffic through real kernels is TestNodePortFragmentTraffic (fragments_test.go).

// fpPending writes into a built IPv4 frame's UDP or TCP checksum what a stack that leaves the
// checksum to be finished at transmit writes (CHECKSUM_PARTIAL: a socket behind a veth or a
// VM's virtio NIC): the pseudo-header's sum alone, not inverted. A test run cannot hand the
// program such a packet's state, only its bytes.
func fpPending(b []byte) []byte {
	m := append([]byte(nil), b...)
	ip := m[14:]
	hlen := int(ip[0]&0x0f) * 4
	l4 := ip[hlen:]
	off := 6
	if ip[9] == tpProtoTCP {
		off = 16
	}
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	binary.BigEndian.PutUint16(l4[off:], ^tpChecksum(tpPseudo(src, dst, ip[9], l4)[:12]))
	return m
}

// fpCut runs in through run as a hook sees a packet it cuts: each run's output is a piece,
// and what comes back into the hook is the marked copy of what remained (frMarked, frRest),
// until the rest fits the tunnel. It returns the pieces.
func fpCut(t *testing.T, in []byte, run func([]byte) (uint32, []byte)) [][]byte {
	t.Helper()
	cut := (tpMTU - 20) &^ 7
	var outs [][]byte
	feed, cur := in, in
	for i := 0; ; i++ {
		if i > 8 {
			t.Fatal("the datagram never ended")
		}
		rc, out := run(feed)
		if rc != tpRedirect {
			t.Fatalf("piece %d: verdict %d, want a redirect", i, rc)
		}
		if f := tpDecodeOK(t, out); f.Inner == nil || int(f.Inner.IP.TotLen) > tpMTU {
			t.Fatalf("piece %d is not tunnelled within the tunnel's %d bytes: %v", i, tpMTU, f)
		}
		outs = append(outs, out)
		if len(cur)-14 <= tpMTU {
			return outs
		}
		// The first run finished a pending checksum before it cut: the copy carries it.
		if i == 0 {
			cur = fpFinished(cur)
		}
		feed, cur = frMarked(cur), frRest(cur, cut)
	}
}

// fpFinished is b with its transport checksum computed over the whole datagram.
func fpFinished(b []byte) []byte {
	m := append([]byte(nil), b...)
	ip := m[14:]
	hlen := int(ip[0]&0x0f) * 4
	l4 := ip[hlen:]
	off := 6
	if ip[9] == tpProtoTCP {
		off = 16
	}
	l4[off], l4[off+1] = 0, 0
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	binary.BigEndian.PutUint16(l4[off:], tpChecksum(tpPseudo(src, dst, ip[9], l4)))
	return m
}

// A datagram too large for the tunnel whose checksum the sender left to be finished (its field
// holds the pseudo-header's sum: a stack on the client's host behind a veth, or a VM's) is
// summed before it is cut: the pieces put together verify, both ways. Before frag_csum the
// first piece carried the unfinished sum, and the endpoint dropped every such datagram.
func TestProgFragmentSplitPendingChecksum(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (3 s): make test runs it")
	}
	cut := (tpMTU - 20) &^ 7
	for _, size := range []int{1488, 20 + 2*cut + cut/2 + 3} { // the 1,460 bytes of payload; three pieces, an odd length
		a, b := tpRemoteNodePort(t)
		client := netip.AddrPortFrom(tpClient, 42000)
		front := netip.AddrPortFrom(tpEdgeA, 30080)
		pod := netip.AddrPortFrom(tpPodB5, 8080)
		q := tpUDPFrame(tpMACEdge, tpMACA1, client, front, frPayload(size-28))
		q.IP.ID = 0x5151
		q.IP.Frag = 0
		outs := fpCut(t, fpPending(q.build()), func(f []byte) (uint32, []byte) { return a.runBytes(a.o.SlFromHost, "nic1", false, f) })
		frWantDatagram(t, tpReassemble(t, frUnwrap(t, outs)), client, pod, q.Payload)
		outs = frRun(t, outs, tpRedirect, func(f []byte) (uint32, []byte) { return b.runBytes(b.o.SlFromHost, "nic0", false, f) })
		got := tpReassemble(t, outs)
		frWantDatagram(t, got, netip.AddrPortFrom(tpClient, got.UDP.Sport), pod, q.Payload)

		// The endpoint's answer as large, from a stack that also left its checksum: cut on
		// node B, translated back on node A.
		mid := netip.AddrPortFrom(tpClient, got.UDP.Sport)
		r := tpUDPFrame(tpMACPodB5, tpMACWepB0, pod, mid, frPayload(size-28))
		r.IP.ID = 0x5152
		r.IP.Frag = 0
		outs = fpCut(t, fpPending(r.build()), func(f []byte) (uint32, []byte) { return b.runBytes(b.o.SlFromWep, "wep0", false, f) })
		frWantDatagram(t, tpReassemble(t, frUnwrap(t, outs)), pod, mid, r.Payload)
		outs = frRun(t, outs, tpRedirect, func(f []byte) (uint32, []byte) { return a.runBytes(a.o.SlFromHost, "nic0", false, f) })
		frWantDatagram(t, tpReassemble(t, outs), front, client, r.Payload)
		if a.counter(tpCFragSplit) == 0 || b.counter(tpCFragSplit) == 0 {
			t.Errorf("packets cut: node A %d, node B %d; want both cutting", a.counter(tpCFragSplit), b.counter(tpCFragSplit))
		}
	}
}

// IPv6 fragments through the IPv6 tunnel, both ways: a client's datagram in two fragments
// (its stack fragmented it to the path MTU Packet Too Big told it) reaches the endpoint on
// node B whole, and so does the endpoint's answer in two fragments the client. Before
// tunnel_in6 gave a later fragment its first's ports, node B and node A dropped every later
// fragment the tunnel brought (counted as malformed).
func TestProg6TunnelFragments(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	a, b := tp6Tunnel(t)
	a.frontend6(netip.IPv6Unspecified(), 30080, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: 1, Flags: tpFeNodePort})
	client := netip.AddrPortFrom(tp6Client, 40000)
	front := netip.AddrPortFrom(tp6EdgeA, 30080)
	pod := netip.AddrPortFrom(tp6PodB5, 8080)
	const cut = 8 + 1368 // the first fragment fills 1,430 bytes of packet, with its fragment header

	q := tp6UDP(tpMACEdge, tpMACA1, client, front, frPayload(2000))
	first, later := tp6xFragments(q, cut, 0x5153)
	var delivered [2][]byte
	for i, f := range []tp6Frame{first, later} {
		rc, out := a.run6(a.o.SlFromHost, "nic1", false, f)
		_, inner := tp6WantVXLAN(t, rc, out, tpMACA0, tpMACB0, tp6NodeA, tp6NodeB)
		if len(inner)-14 > 1430 {
			t.Errorf("fragment %d: %d bytes in the tunnel, more than its 1,430", i, len(inner)-14)
		}
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		if rc != tpRedirect {
			t.Fatalf("fragment %d on node B: verdict %d, want a redirect to the pod (malformed: %d)", i, rc, b.counter(tpCDropMalformed))
		}
		delivered[i] = out
	}
	tp6xReassembled(t, delivered[0], delivered[1], client, pod, q.Payload)

	r := tp6UDP(tpMACPodB5, tpMACWepB0, pod, client, frPayload(1800))
	first, later = tp6xFragments(r, cut, 0x5154)
	for i, f := range []tp6Frame{first, later} {
		rc, out := b.run6(b.o.SlFromWep, "wep0", false, f)
		tp6WantVXLAN(t, rc, out, tpMACB0, tpMACA0, tp6NodeB, tp6NodeA)
		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		if rc != tpRedirect {
			t.Fatalf("answer fragment %d on node A: verdict %d, want a redirect to the client (malformed: %d)", i, rc, a.counter(tpCDropMalformed))
		}
		if f := tp6DecodeOK(t, out); f.Src != tpMACA1 || f.Dst != tpMACEdge {
			t.Errorf("answer fragment %d sent %v>%v, want out of nic1 to the edge router %v>%v", i, f.Src, f.Dst, tpMACA1, tpMACEdge)
		}
		delivered[i] = out
	}
	tp6xReassembled(t, delivered[0], delivered[1], front, client, r.Payload)
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1, tpCTunIn: 2, tpCRevNat: 2})
	b.wantCounters(map[int]uint64{tpCTunIn: 2})
}
