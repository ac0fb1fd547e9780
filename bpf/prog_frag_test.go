package bpf

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// IP fragments (issue #25): a datagram's later fragments carry no ports; each is translated
// as its first fragment was, in both directions, for cluster IPs and node ports, local and
// remote endpoints. The tests cut datagrams with tpFragments, run every fragment through the
// programs, and put the outputs back together (tpReassemble), whose checksums must verify.

const frSize = 1024 // bytes of the datagram per fragment: every fragment fits the tunnel

// frRun runs each fragment through run and returns the outputs, each of which must have the
// verdict want.
func frRun(t *testing.T, frags [][]byte, want uint32, run func([]byte) (uint32, []byte)) [][]byte {
	t.Helper()
	var outs [][]byte
	for i, f := range frags {
		rc, out := run(f)
		if rc != want {
			t.Fatalf("fragment %d: verdict %d, want %d", i, rc, want)
		}
		outs = append(outs, out)
	}
	return outs
}

// frUnwrap returns the inner frames of tunnelled outputs.
func frUnwrap(t *testing.T, outs [][]byte) [][]byte {
	t.Helper()
	var in [][]byte
	for i, o := range outs {
		f := tpDecodeOK(t, o)
		if f.Inner == nil {
			t.Fatalf("output %d is not tunnelled: %v", i, f)
		}
		in = append(in, o[14+20+8+8:])
	}
	return in
}

func frWantDatagram(t *testing.T, got tpFrame, src, dst netip.AddrPort, payload []byte) {
	t.Helper()
	if got.IP.Src != src.Addr() || got.IP.Dst != dst.Addr() || got.UDP.Sport != src.Port() || got.UDP.Dport != dst.Port() {
		t.Errorf("reassembled datagram %v, want %v > %v", got, src, dst)
	}
	if string(got.Payload) != string(payload) {
		t.Errorf("reassembled datagram carries %d bytes, want the %d sent", len(got.Payload), len(payload))
	}
}

func frPayload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

func TestProgFragments(t *testing.T) {
	t.Run("cluster IP, local endpoint, both ways", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		vip := netip.MustParseAddr("10.96.0.10")
		a.frontend(vip, 53, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
		a.backends(1, tpBackend(tpAP("10.65.0.5:5353"), tpNodeA, true))
		client := netip.AddrPortFrom(tpPodA7, 40053)
		front := netip.AddrPortFrom(vip, 53)
		pod := tpAP("10.65.0.5:5353")
		q := tpUDPFrame(tpMACPodA7, tpMACWepA1, client, front, frPayload(4000))
		q.IP.ID = 0x1234
		frags := tpFragments(q, frSize)
		// Sent through the FIB to the endpoint's interface: each fragment gets its MACs.
		wantToPod := func(outs [][]byte) {
			t.Helper()
			for i, o := range outs {
				if f := tpDecodeOK(t, o); f.Src != tpMACWepA0 || f.Dst != tpMACPodA5 {
					t.Errorf("fragment %d sent %v>%v, want %v>%v", i, f.Src, f.Dst, tpMACWepA0, tpMACPodA5)
				}
			}
		}
		outs := frRun(t, frags, tpRedirect, func(b []byte) (uint32, []byte) { return a.runBytes(a.o.SlFromWep, "wep1", false, b) })
		wantToPod(outs)
		frWantDatagram(t, tpReassemble(t, outs), client, pod, q.Payload)
		// The answer, fragmented by the endpoint: every fragment back from the frontend.
		r := tpUDPFrame(tpMACPodA5, tpMACWepA0, pod, client, frPayload(3500))
		r.IP.ID = 0x4321
		outs = frRun(t, tpFragments(r, frSize), tpRedirect, func(b []byte) (uint32, []byte) { return a.runBytes(a.o.SlFromWep, "wep0", false, b) })
		frWantDatagram(t, tpReassemble(t, outs), front, client, r.Payload)
		// Fragments in another order: the first one still comes first (a later one before it
		// has no ports to go by and passes on as it is).
		frags = tpFragments(q, frSize)
		frags[1], frags[2] = frags[2], frags[1]
		outs = frRun(t, frags, tpRedirect, func(b []byte) (uint32, []byte) { return a.runBytes(a.o.SlFromWep, "wep1", false, b) })
		wantToPod(outs)
		frWantDatagram(t, tpReassemble(t, outs), client, pod, q.Payload)
		other := tpNAT(q, tpZeroMAC, tpZeroMAC, netip.AddrPortFrom(tpPodA7, 40054), netip.AddrPort{})
		other.IP.ID = 0x7777
		early := tpFragments(other, frSize)[1]
		rc, out := a.runBytes(a.o.SlFromWep, "wep1", false, early)
		if rc != tpOK || string(out) != string(early) {
			t.Errorf("a later fragment before its first: verdict %d, changed %v; want it passed on as it is", rc, string(out) != string(early))
		}
	})
	t.Run("node port, endpoint on another node, both ways", func(t *testing.T) {
		a, b := tpRemoteNodePort(t)
		client := netip.AddrPortFrom(tpClient, 41000)
		front := netip.AddrPortFrom(tpEdgeA, 30080)
		pod := netip.AddrPortFrom(tpPodB5, 8080)
		q := tpUDPFrame(tpMACEdge, tpMACA1, client, front, frPayload(4000))
		q.IP.ID = 0x2222
		q.IP.Frag = 0
		outs := frRun(t, tpFragments(q, frSize), tpRedirect, func(f []byte) (uint32, []byte) { return a.runBytes(a.o.SlFromHost, "nic1", false, f) })
		inner := frUnwrap(t, outs)
		frWantDatagram(t, tpReassemble(t, inner), client, pod, q.Payload)
		// Node B unwraps each and delivers it to the pod.
		outs = frRun(t, outs, tpRedirect, func(f []byte) (uint32, []byte) { return b.runBytes(b.o.SlFromHost, "nic0", false, f) })
		frWantDatagram(t, tpReassemble(t, outs), client, pod, q.Payload)
		// The pod's fragmented answer: through the tunnel to node A, out as the node port's.
		r := tpUDPFrame(tpMACPodB5, tpMACWepB0, pod, client, frPayload(3000))
		r.IP.ID = 0x3333
		r.IP.Frag = 0
		outs = frRun(t, tpFragments(r, frSize), tpRedirect, func(f []byte) (uint32, []byte) { return b.runBytes(b.o.SlFromWep, "wep0", false, f) })
		outs = frRun(t, outs, tpRedirect, func(f []byte) (uint32, []byte) { return a.runBytes(a.o.SlFromHost, "nic0", false, f) })
		frWantDatagram(t, tpReassemble(t, outs), front, client, r.Payload)
	})
}

// frMarked is the copy frag_split sends back into the hook: the packet as it was when cut,
// with the reserved flag set (a test run cannot show the copy itself).
func frMarked(b []byte) []byte {
	m := append([]byte(nil), b...)
	ip := m[14:]
	ip[6] |= 0x80
	ip[10], ip[11] = 0, 0
	c := tpChecksum(ip[:int(ip[0]&0x0f)*4])
	ip[10], ip[11] = byte(c>>8), byte(c)
	return m
}

// frRest is what the hook makes of b's marked copy before it goes on: b without the first cut
// bytes after its header, a fragment starting that much further in.
func frRest(b []byte, cut int) []byte {
	ip := b[14:]
	hlen := int(ip[0]&0x0f) * 4
	r := append(append([]byte(nil), b[:14+hlen]...), b[14+hlen+cut:]...)
	rip := r[14:]
	frag := binary.BigEndian.Uint16(ip[6:])
	binary.BigEndian.PutUint16(rip[6:], (frag&0x1fff+uint16(cut/8))|frag&0x2000)
	binary.BigEndian.PutUint16(rip[2:], uint16(len(rip)))
	rip[10], rip[11] = 0, 0
	binary.BigEndian.PutUint16(rip[10:], tpChecksum(rip[:hlen]))
	return r
}

// A packet too large for the tunnel that may be fragmented (no DF) is cut as a router would:
// the packet itself becomes the first part, tunnelled, and a marked copy goes back into the
// hook, which makes it the rest: a later fragment translated as the first part was, cut again
// while it is too large. The pieces reassemble into the datagram the client sent, translated;
// node B delivers each.
func TestProgFragmentSplit(t *testing.T) {
	cut := (tpMTU - 20) &^ 7
	for _, tc := range []struct {
		name string
		size int // bytes of the IP datagram
		frag bool
	}{{"one byte more than fits", tpMTU + 1, false}, {"two and a half pieces", 20 + 2*cut + cut/2, false},
		{"a first fragment", 1500, true}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tpRemoteNodePort(t)
			client := netip.AddrPortFrom(tpClient, 42000)
			front := netip.AddrPortFrom(tpEdgeA, 30080)
			pod := netip.AddrPortFrom(tpPodB5, 8080)
			q := tpUDPFrame(tpMACEdge, tpMACA1, client, front, frPayload(tc.size-28))
			q.IP.ID = 0x5150
			q.IP.Frag = 0
			var inputs [][]byte
			if tc.frag {
				// The client's stack fragmented a larger datagram at its MTU: 1500-byte
				// fragments, each too large for the tunnel.
				q.Payload = frPayload(4000)
				inputs = tpFragments(q, 1480)
			} else {
				inputs = [][]byte{q.build()}
			}
			var outs [][]byte
			for _, in := range inputs {
				// cur is the packet the hook works on; after the first run, what comes back
				// into the hook is its marked copy, and the hook works on the rest.
				feed, cur := in, in
				for i := 0; ; i++ {
					if i > 8 {
						t.Fatal("the datagram never ended")
					}
					rc, out := a.runBytes(a.o.SlFromHost, "nic1", false, feed)
					if rc != tpRedirect {
						t.Fatalf("piece %d: verdict %d, want a redirect", i, rc)
					}
					f := tpDecodeOK(t, out)
					if f.Inner == nil {
						t.Fatalf("piece %d is not tunnelled: %v", i, f)
					}
					if int(f.Inner.IP.TotLen) > tpMTU {
						t.Fatalf("piece %d is %d bytes, more than the tunnel's %d", i, f.Inner.IP.TotLen, tpMTU)
					}
					outs = append(outs, out)
					if len(cur)-14 <= tpMTU {
						break
					}
					feed, cur = frMarked(cur), frRest(cur, cut)
				}
			}
			if !tc.frag {
				if want := (tc.size - 20 + cut - 1) / cut; len(outs) != want {
					t.Errorf("%d pieces, want %d", len(outs), want)
				}
			}
			frWantDatagram(t, tpReassemble(t, frUnwrap(t, outs)), client, pod, q.Payload)
			outs = frRun(t, outs, tpRedirect, func(f []byte) (uint32, []byte) { return b.runBytes(b.o.SlFromHost, "nic0", false, f) })
			frWantDatagram(t, tpReassemble(t, outs), client, pod, q.Payload)
			if got, want := a.counter(tpCFragSplit), uint64(len(outs)-len(inputs)); got != want {
				t.Errorf("%d packets cut, want %d", got, want)
			}
		})
	}
}
