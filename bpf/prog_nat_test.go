package bpf

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// The tests of three cases of the service data path: UDP flows marked answered (for the
// cleaner's longer timeout), backends on no node of the cluster ("routed"), and a workload
// reaching itself through a service (hairpin). Same harness as prog_test.go.

// A UDP flow is marked replied when the backend answers, on the reverse entry (the client's
// node) and on the tunnel entry (the backend's node), so the cleaner gives it the kernel's
// "stream" timeout (120 s) instead of the unanswered 30 s.
func TestProgUDPReplied(t *testing.T) {
	t.Run("local backend", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		vip := netip.MustParseAddr("10.96.0.10")
		dns := netip.AddrPortFrom(vip, 53)
		pod := netip.AddrPortFrom(tpPodA5, 5353)
		a.frontend(vip, 53, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
		a.backends(1, tpBackend(pod, tpNodeA, true))
		answered := netip.AddrPortFrom(tpPodA7, 40053)
		unanswered := netip.AddrPortFrom(tpPodA7, 40054)

		q := tpUDPFrame(tpMACPodA7, tpMACWepA1, answered, dns, []byte("query"))
		rc, out := a.fromWep("wep1", q)
		tpWant(t, rc, out, tpRedirect, tpNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
		revKey := tpKey(pod, answered, tpProtoUDP)
		rev := a.wantCT(revKey, sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, NatAddr: tpA(vip), NatPort: tpP(53), NatSport: tpP(40053)})
		if got := DefaultTimeouts.Idle(ProtoUDP, rev.Tcp); got != DefaultTimeouts.UDP {
			t.Errorf("an unanswered flow's timeout is %v, want %v", got, DefaultTimeouts.UDP)
		}
		r := tpUDPFrame(tpMACPodA5, tpMACWepA0, pod, answered, []byte("answer"))
		rc, out = a.fromWep("wep0", r)
		tpWant(t, rc, out, tpRedirect, tpNAT(r, tpMACWepA1, tpMACPodA7, dns, netip.AddrPort{}))
		rev = a.wantCT(revKey, sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPReplied, NatAddr: tpA(vip), NatPort: tpP(53), NatSport: tpP(40053)})
		if got := DefaultTimeouts.Idle(ProtoUDP, rev.Tcp); got != DefaultTimeouts.UDPStream {
			t.Errorf("an answered flow's timeout is %v, want %v", got, DefaultTimeouts.UDPStream)
		}
		if s := ConntrackString(revKey, rev, rev.LastSeen); !strings.Contains(s, " replied idle") {
			t.Errorf("an answered UDP flow renders as %q", s)
		}
		// The client's next datagram keeps the mark.
		rc, _ = a.fromWep("wep1", q)
		tpWantVerdict(t, rc, tpRedirect)
		rev = a.wantCT(revKey, sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPReplied, NatAddr: tpA(vip), NatPort: tpP(53), NatSport: tpP(40053)})

		q2 := tpUDPFrame(tpMACPodA7, tpMACWepA1, unanswered, dns, []byte("query"))
		rc, _ = a.fromWep("wep1", q2)
		tpWantVerdict(t, rc, tpRedirect)
		seen2, _ := a.ct(tpKey(pod, unanswered, tpProtoUDP))

		// The cleaner, 60 s after the last packet of each: the answered flow stays, the
		// unanswered one (and its forward entry) goes.
		now := max(rev.LastSeen, seen2.LastSeen) + uint64(60*time.Second)
		st, err := NewConntrack(a.o, DefaultTimeouts).Clean(now)
		if err != nil {
			t.Fatal(err)
		}
		if st.Expired != 1 || st.Deleted != 1 {
			t.Errorf("cleaner expired %d and deleted %d, want 1 and 1", st.Expired, st.Deleted)
		}
		a.wantNoCT(tpKey(pod, unanswered, tpProtoUDP))
		a.wantNoCT(tpKey(unanswered, dns, tpProtoUDP))
		if _, ok := a.ct(revKey); !ok {
			t.Error("the answered flow was cleaned after 60 s")
		}
		if n := a.ctLen(); n != 2 {
			t.Errorf("%d conntrack entries, want the answered flow's 2", n)
		}

		// A reply reaching the client only through sl_to_wep marks the flow the same way.
		r2 := tpUDPFrame(tpMACWepA1, tpMACPodA7, pod, unanswered, []byte("answer"))
		rc, _ = a.fromWep("wep1", q2)
		tpWantVerdict(t, rc, tpRedirect)
		rc, out = a.toWep("wep1", r2)
		tpWant(t, rc, out, tpOK, tpNAT(r2, tpZeroMAC, tpZeroMAC, dns, netip.AddrPort{}))
		a.wantCT(tpKey(pod, unanswered, tpProtoUDP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPReplied, NatAddr: tpA(vip), NatPort: tpP(53), NatSport: tpP(40054)})
	})

	t.Run("tunnelled", func(t *testing.T) {
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
		tunKey := tpKey(pod, mid, tpProtoUDP)
		b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, NatAddr: tpA(tpNodeA)})

		r := tpUDPFrame(tpMACPodB5, tpMACWepB0, pod, mid, []byte("pong"))
		rc, out = b.fromWep("wep0", r)
		tpWantVXLAN(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA, tpUnwrapped(r), false)
		tun := b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPReplied, NatAddr: tpA(tpNodeA)})
		if got := DefaultTimeouts.Idle(ProtoUDP, tun.Tcp); got != DefaultTimeouts.UDPStream {
			t.Errorf("the answered tunnel entry's timeout is %v, want %v", got, DefaultTimeouts.UDPStream)
		}

		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(r, tpMACA1, tpMACEdge, front, client))
		rev := a.wantCT(tpKey(pod, mid, tpProtoUDP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtRemote | tpCtRedirect, Tcp: tpTCPReplied,
			Ifindex: uint32(a.ifindex["nic1"]), NatAddr: tpA(tpEdgeA), TunAddr: tpA(tpNodeB), NatPort: tpP(30080),
			NatSport: tpP(41000), MacLocal: tpMACA1, MacPeer: tpMACEdge})
		if got := DefaultTimeouts.Idle(ProtoUDP, rev.Tcp); got != DefaultTimeouts.UDPStream {
			t.Errorf("the answered reverse entry's timeout is %v, want %v", got, DefaultTimeouts.UDPStream)
		}
	})
}

// tpRouted is an apiserver host outside the cluster (no node, no pool), reached by node A's
// default route through the router: the backend of default/kubernetes, an endpoint without
// nodeName.
var tpRouted = netip.AddrPortFrom(netip.MustParseAddr("198.18.0.10"), 6443)

func tpRoutedBackend(addr netip.AddrPort) sluiceBeValV4 {
	return sluiceBeValV4{Addr: tpA(addr.Addr()), Port: tpP(addr.Port()), Flags: tpBeRouted}
}

// A backend on no node: plain DNAT and the way a local backend's packets take (the kernel's
// routing from a workload, the FIB from a host interface), never the tunnel; its replies come
// back by a host interface and are translated there.
func TestProgRoutedBackend(t *testing.T) {
	t.Run("cluster IP from a workload", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		api := netip.MustParseAddr("10.96.0.1")
		front := netip.AddrPortFrom(api, 443)
		a.frontend(api, 443, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1})
		a.frontend(api, 0, 0, sluiceFeVal{SvcId: 1, Flags: tpFeAddrOnly})
		a.backends(1, tpRoutedBackend(tpRouted))
		client := netip.AddrPortFrom(tpPodA7, 33333)

		syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpSYN, 7000, 0, nil)
		rc, out := a.fromWep("wep1", syn)
		tpWant(t, rc, out, tpOK, tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, tpRouted))
		fwdKey, revKey := tpKey(client, front, tpProtoTCP), tpKey(tpRouted, client, tpProtoTCP)
		a.wantCT(fwdKey, sluiceCtValV4{Type: tpCtFwd, NatAddr: tpA(tpRouted.Addr()), NatPort: tpP(6443), NatSport: tpP(33333)})
		revWant := sluiceCtValV4{Type: tpCtRev, Tcp: tpTCPSyn, NatAddr: tpA(api), NatPort: tpP(443), NatSport: tpP(33333)}
		a.wantCT(revKey, revWant)

		// The answer comes in by the node network and goes to the client's interface.
		synack := tpTCPFrame(tpMACRouter, tpMACA0, tpRouted, client, tpSYN|tpACK, 9000, 7001, nil)
		rc, out = a.fromHost("nic0", synack)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACWepA1, tpMACPodA7, front, netip.AddrPort{}))
		revWant.Tcp |= tpTCPReplied | tpTCPOpening
		a.wantCT(revKey, revWant)
		ack := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpACK|tpPSH, 7001, 9001, []byte("GET /version"))
		rc, out = a.fromWep("wep1", ack)
		tpWant(t, rc, out, tpOK, tpNAT(ack, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, tpRouted))

		// A reply the kernel routed to the client (after undoing a masquerade of the node's,
		// say) is translated as it leaves for the workload.
		c2 := netip.AddrPortFrom(tpPodA7, 33334)
		syn2 := tpTCPFrame(tpMACPodA7, tpMACWepA1, c2, front, tpSYN, 100, 0, nil)
		rc, _ = a.fromWep("wep1", syn2)
		tpWantVerdict(t, rc, tpOK)
		synack2 := tpTCPFrame(tpMACWepA1, tpMACPodA7, tpRouted, c2, tpSYN|tpACK, 500, 101, nil)
		rc, out = a.toWep("wep1", synack2)
		tpWant(t, rc, out, tpOK, tpNAT(synack2, tpZeroMAC, tpZeroMAC, front, netip.AddrPort{}))

		a.wantCounters(map[int]uint64{tpCNatNew: 2, tpCRevNat: 2})
		if n := a.ctLen(); n != 4 {
			t.Errorf("%d conntrack entries, want 4", n)
		}
	})

	t.Run("node port from outside", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		a.frontend(netip.IPv4Unspecified(), 30443, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Flags: tpFeNodePort})
		a.backends(1, tpRoutedBackend(tpRouted))
		client := netip.AddrPortFrom(tpClient, 40000)
		front := netip.AddrPortFrom(tpEdgeA, 30443)

		// In by nic1, out through the FIB by nic0 to the router, the client's address kept.
		syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
		rc, out := a.fromHost("nic1", syn)
		tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACA0, tpMACRouter, netip.AddrPort{}, tpRouted))
		a.wantCT(tpKey(client, front, tpProtoTCP), sluiceCtValV4{Type: tpCtFwd, NatAddr: tpA(tpRouted.Addr()), NatPort: tpP(6443), NatSport: tpP(40000)})
		revWant := sluiceCtValV4{Type: tpCtRev, Flags: tpCtRedirect, Tcp: tpTCPSyn,
			Ifindex: uint32(a.ifindex["nic1"]), NatAddr: tpA(tpEdgeA), NatPort: tpP(30443), NatSport: tpP(40000),
			MacLocal: tpMACA1, MacPeer: tpMACEdge}
		a.wantCT(tpKey(tpRouted, client, tpProtoTCP), revWant)

		// The answer, back by nic0, leaves from the node port by nic1 to the edge router.
		synack := tpTCPFrame(tpMACRouter, tpMACA0, tpRouted, client, tpSYN|tpACK, 5000, 1001, nil)
		rc, out = a.fromHost("nic0", synack)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACA1, tpMACEdge, front, netip.AddrPort{}))
		revWant.Tcp |= tpTCPReplied | tpTCPOpening
		a.wantCT(tpKey(tpRouted, client, tpProtoTCP), revWant)
		ack := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpACK, 1001, 5001, nil)
		rc, out = a.fromHost("nic1", ack)
		tpWant(t, rc, out, tpRedirect, tpNAT(ack, tpMACA0, tpMACRouter, netip.AddrPort{}, tpRouted))
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
	})

	t.Run("rendering", func(t *testing.T) {
		s := BackendString(BackendKey{ListId: 1}, tpRoutedBackend(tpRouted))
		if !strings.HasSuffix(s, "198.18.0.10:6443 node 0.0.0.0 routed") {
			t.Errorf("a routed backend renders as %q", s)
		}
	})
}

// A workload reaching itself through a service: the flow's source becomes the hairpin
// address, so the workload's answer leaves it and is translated back.
func TestProgHairpin(t *testing.T) {
	hp := netip.MustParseAddr(HairpinAddr)
	vip := netip.MustParseAddr("10.96.0.60")
	front := netip.AddrPortFrom(vip, 80)
	pod := netip.AddrPortFrom(tpPodA5, 8080) // the backend, and the client
	client := netip.AddrPortFrom(tpPodA5, 40000)
	setup := func(t *testing.T) *tpNode {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
		a.frontend(vip, 53, tpProtoUDP, sluiceFeVal{ListId: 2, SvcId: 1, Count: 1, Local: 1})
		a.backends(1, tpBackend(pod, tpNodeA, true))
		a.backends(2, tpBackend(netip.AddrPortFrom(tpPodA5, 5353), tpNodeA, true))
		return a
	}

	t.Run("tcp", func(t *testing.T) {
		a := setup(t)
		// The SYN: to the workload itself from the hairpin address, its port kept, sent
		// straight back to the workload's interface.
		syn := tpTCPFrame(tpMACPodA5, tpMACWepA0, client, front, tpSYN, 1000, 0, nil)
		syn.TCP.Options = []byte{2, 4, 5, 0xb4}
		rc, out := a.fromWep("wep0", syn)
		hpClient := netip.AddrPortFrom(hp, 40000)
		toPod := tpNAT(syn, tpMACWepA0, tpMACPodA5, hpClient, pod)
		tpWant(t, rc, out, tpRedirect, toPod)
		fwdKey, revKey := tpKey(client, front, tpProtoTCP), tpKey(pod, hpClient, tpProtoTCP)
		fwd := a.wantCT(fwdKey, sluiceCtValV4{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tpA(tpPodA5), NatPort: tpP(8080), NatSport: tpP(40000), NatSaddr: tpA(hp)})
		revWant := sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPSyn, NatAddr: tpA(vip), NatPort: tpP(80), NatSport: tpP(40000), NatSaddr: tpA(tpPodA5)}
		rev := a.wantCT(revKey, revWant)
		if PairKey(fwdKey, fwd) != revKey || PairKey(revKey, rev) != fwdKey {
			t.Errorf("pair keys %+v and %+v, want %+v and %+v", PairKey(fwdKey, fwd), PairKey(revKey, rev), revKey, fwdKey)
		}
		// Leaving by the workload's interface, it is no reply to translate.
		rc, out2 := a.toWep("wep0", tpDecodeOK(t, out))
		tpWant(t, rc, out2, tpOK, toPod)

		// The SYN-ACK, to the hairpin address by the workload's default route: from the
		// frontend to the workload's own address and port, back to its interface.
		synack := tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, hpClient, tpSYN|tpACK, 5000, 1001, nil)
		rc, out = a.fromWep("wep0", synack)
		back := tpNAT(synack, tpMACWepA0, tpMACPodA5, front, client)
		tpWant(t, rc, out, tpRedirect, back)
		revWant.Tcp |= tpTCPReplied | tpTCPOpening
		a.wantCT(revKey, revWant)
		rc, out2 = a.toWep("wep0", tpDecodeOK(t, out))
		tpWant(t, rc, out2, tpOK, back)

		// The rest of the client's direction the same way as the SYN, a SYN sent again too.
		ack := tpTCPFrame(tpMACPodA5, tpMACWepA0, client, front, tpACK|tpPSH, 1001, 5001, []byte("GET / HTTP/1.0\r\n\r\n"))
		rc, out = a.fromWep("wep0", ack)
		tpWant(t, rc, out, tpRedirect, tpNAT(ack, tpMACWepA0, tpMACPodA5, hpClient, pod))
		rc, out = a.fromWep("wep0", syn)
		tpWant(t, rc, out, tpRedirect, toPod)
		revWant.Tcp &^= tpTCPOpening // the client acknowledged the answer: established
		a.wantCT(revKey, revWant)
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
		if n := a.ctLen(); n != 2 {
			t.Errorf("%d conntrack entries, want 2", n)
		}

		// Operators see the hairpin address and the client's own.
		now := rev.LastSeen
		if s := ConntrackString(fwdKey, fwd, now); !strings.Contains(s, "dnat to 10.65.0.5:8080 from 169.254.42.1:40000 (hairpin)") {
			t.Errorf("forward entry renders as %q", s)
		}
		if s := ConntrackString(revKey, rev, now); !strings.Contains(s, "reply as 10.96.0.60:80 to client 10.65.0.5:40000 (hairpin)") {
			t.Errorf("reverse entry renders as %q", s)
		}

		// The cleaner takes the pair together: the reverse entry judged, its forward entry
		// found by the pair key (not judged an orphan).
		last, _ := a.ct(revKey)
		st, err := NewConntrack(a.o, DefaultTimeouts).Clean(last.LastSeen + uint64(DefaultTimeouts.TCPEstablished) + 1)
		if err != nil {
			t.Fatal(err)
		}
		if st.Expired != 1 || st.Deleted != 1 || a.ctLen() != 0 {
			t.Errorf("cleaner expired %d and deleted %d, left %d entries; want 1, 1, 0", st.Expired, st.Deleted, a.ctLen())
		}
	})

	t.Run("tuple taken", func(t *testing.T) {
		// The same client port to a second frontend of the same backend: the hairpin tuple
		// is taken, so the second flow gets a port of the range.
		a := setup(t)
		vip2 := netip.MustParseAddr("10.96.0.61")
		a.frontend(vip2, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 2, Count: 1, Local: 1})
		rc, _ := a.fromWep("wep0", tpTCPFrame(tpMACPodA5, tpMACWepA0, client, front, tpSYN, 1, 0, nil))
		tpWantVerdict(t, rc, tpRedirect)
		syn2 := tpTCPFrame(tpMACPodA5, tpMACWepA0, client, netip.AddrPortFrom(vip2, 80), tpSYN, 1, 0, nil)
		rc, out := a.fromWep("wep0", syn2)
		got := tpDecodeOK(t, out)
		sport := got.TCP.Sport
		if sport < tpPsnatMin || sport > tpPsnatMax {
			t.Fatalf("second flow's source port %d, want one of %d-%d", sport, tpPsnatMin, tpPsnatMax)
		}
		tpWant(t, rc, out, tpRedirect, tpNAT(syn2, tpMACWepA0, tpMACPodA5, netip.AddrPortFrom(hp, sport), pod))
		a.wantCT(tpKey(client, netip.AddrPortFrom(vip2, 80), tpProtoTCP), sluiceCtValV4{Type: tpCtFwd, Flags: tpCtPsnat | tpCtLocal,
			NatAddr: tpA(tpPodA5), NatPort: tpP(8080), NatSport: tpP(sport), NatSaddr: tpA(hp)})
		a.wantCT(tpKey(pod, netip.AddrPortFrom(hp, sport), tpProtoTCP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtPsnat | tpCtLocal, Tcp: tpTCPSyn,
			NatAddr: tpA(vip2), NatPort: tpP(80), NatSport: tpP(40000), NatSaddr: tpA(tpPodA5)})
		synack := tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, netip.AddrPortFrom(hp, sport), tpSYN|tpACK, 1, 2, nil)
		rc, out = a.fromWep("wep0", synack)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACWepA0, tpMACPodA5, netip.AddrPortFrom(vip2, 80), client))
	})

	t.Run("other clients unchanged", func(t *testing.T) {
		a := setup(t)
		other := netip.AddrPortFrom(tpPodA7, 33333)
		syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, other, front, tpSYN, 1, 0, nil)
		rc, out := a.fromWep("wep1", syn)
		tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
		fwdKey, revKey := tpKey(other, front, tpProtoTCP), tpKey(pod, other, tpProtoTCP)
		fwd := a.wantCT(fwdKey, sluiceCtValV4{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tpA(tpPodA5), NatPort: tpP(8080), NatSport: tpP(33333)})
		rev := a.wantCT(revKey, sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPSyn, NatAddr: tpA(vip), NatPort: tpP(80), NatSport: tpP(33333)})
		if fwd.NatSaddr != 0 || rev.NatSaddr != 0 || PairKey(fwdKey, fwd) != revKey || PairKey(revKey, rev) != fwdKey {
			t.Errorf("a flow of another workload: forward %+v, reverse %+v", fwd, rev)
		}
		if s := ConntrackString(fwdKey, fwd, fwd.Created); strings.Contains(s, "hairpin") {
			t.Errorf("forward entry renders as %q", s)
		}
		synack := tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, other, tpSYN|tpACK, 1, 2, nil)
		rc, out = a.fromWep("wep0", synack)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACWepA1, tpMACPodA7, front, netip.AddrPort{}))
		// From a host interface, a client whose address is the backend's is no hairpin: the
		// hairpin address never leaves the node.
		a.frontend(netip.IPv4Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeNodePort})
		fromHost := tpTCPFrame(tpMACRouter, tpMACA0, netip.AddrPortFrom(tpPodA5, 41000), netip.AddrPortFrom(tpNodeA, 30080), tpSYN, 1, 0, nil)
		rc, out = a.fromHost("nic0", fromHost)
		tpWant(t, rc, out, tpRedirect, tpNAT(fromHost, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	})

	t.Run("udp and ICMP errors", func(t *testing.T) {
		a := setup(t)
		dns := netip.AddrPortFrom(vip, 53)
		uclient := netip.AddrPortFrom(tpPodA5, 40053)
		be := netip.AddrPortFrom(tpPodA5, 5353)
		hpClient := netip.AddrPortFrom(hp, 40053)
		q := tpUDPFrame(tpMACPodA5, tpMACWepA0, uclient, dns, []byte("query"))
		rc, out := a.fromWep("wep0", q)
		tpWant(t, rc, out, tpRedirect, tpNAT(q, tpMACWepA0, tpMACPodA5, hpClient, be))
		sent := ieIP(out)

		// The workload's port unreachable about the datagram it got (sent to the hairpin
		// address) reaches it from the frontend, about the datagram it sent.
		unr := ieAbout(tpMACPodA5, tpMACWepA0, tpPodA5, hp, ieUnreach, iePortUnr, 0, sent, 0)
		rc, out = a.fromWep("wep0", unr)
		got := tpWant(t, rc, out, tpRedirect, ieAbout(tpMACWepA0, tpMACPodA5, vip, tpPodA5, ieUnreach, iePortUnr, 0, ieRequote(sent, q), 0))
		ieWantQuote(t, got, vip, tpPodA5, uclient, dns)

		// An answer, then the workload's error about the answer it got (from the frontend)
		// reaches it from the hairpin address, about the answer it sent.
		r := tpUDPFrame(tpMACPodA5, tpMACWepA0, be, hpClient, []byte("answer"))
		rc, out = a.fromWep("wep0", r)
		asGot := tpNAT(r, tpMACWepA0, tpMACPodA5, dns, uclient)
		tpWant(t, rc, out, tpRedirect, asGot)
		a.wantCT(tpKey(be, hpClient, tpProtoUDP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPReplied, NatAddr: tpA(vip), NatPort: tpP(53),
			NatSport: tpP(40053), NatSaddr: tpA(tpPodA5)})
		got2 := ieIP(out)
		unr = ieAbout(tpMACPodA5, tpMACWepA0, tpPodA5, vip, ieUnreach, iePortUnr, 0, got2, 0)
		rc, out = a.fromWep("wep0", unr)
		g := tpWant(t, rc, out, tpRedirect, ieAbout(tpMACWepA0, tpMACPodA5, hp, tpPodA5, ieUnreach, iePortUnr, 0, ieRequote(got2, r), 0))
		ieWantQuote(t, g, hp, tpPodA5, be, hpClient)
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 2})
	})
}
