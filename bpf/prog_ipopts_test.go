package bpf

import (
	"net/netip"
	"testing"
)

// IPv4 options (issue #25): a packet whose header is longer than 20 bytes is translated like
// any other, its transport header found after the options, in every direction and through
// the tunnel; errors quoting such packets are translated too.

// ioOpts are 8 bytes of options: Router Alert (RFC 2113) and padding.
var ioOpts = []byte{0x94, 0x04, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00}

func ioWith(f tpFrame) tpFrame {
	f.IP.Options = ioOpts
	return f
}

func TestProgIPOptions(t *testing.T) {
	t.Run("node port, local endpoint", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		a.frontend(netip.IPv4Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeNodePort})
		a.backends(1, tpBackend(tpAP("10.65.0.5:8080"), tpNodeA, true))
		client := netip.AddrPortFrom(tpClient, 40000)
		front := netip.AddrPortFrom(tpEdgeA, 30080)
		pod := netip.AddrPortFrom(tpPodA5, 8080)
		syn := ioWith(tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil))
		rc, out := a.fromHost("nic1", syn)
		tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
		// A reply with options in the middle of a flow: translated, never leaking the pod's
		// address.
		synack := tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, client, tpSYN|tpACK, 5000, 1001, nil)
		rc, out = a.fromWep("wep0", synack)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACA1, tpMACEdge, front, netip.AddrPort{}))
		data := ioWith(tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, client, tpACK, 5001, 1001, []byte("answer")))
		rc, out = a.fromWep("wep0", data)
		tpWant(t, rc, out, tpRedirect, tpNAT(data, tpMACA1, tpMACEdge, front, netip.AddrPort{}))
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 2})
	})
	t.Run("cluster IP, UDP, rejects", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		vip := netip.MustParseAddr("10.96.0.10")
		a.frontend(vip, 53, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
		a.frontend(vip, 0, 0, sluiceFeVal{SvcId: 1, Flags: tpFeAddrOnly})
		a.backends(1, tpBackend(tpAP("10.65.0.5:5353"), tpNodeA, true))
		client := netip.AddrPortFrom(tpPodA7, 40053)
		q := ioWith(tpUDPFrame(tpMACPodA7, tpMACWepA1, client, netip.AddrPortFrom(vip, 53), []byte("query")))
		rc, out := a.fromWep("wep1", q)
		tpWant(t, rc, out, tpRedirect, tpNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, tpAP("10.65.0.5:5353")))
		// The backend's port unreachable quoting the datagram with its options reaches the
		// client as about the datagram it sent.
		sent := ieIP(out)
		unr := ieAbout(tpMACPodA5, tpMACWepA0, tpPodA5, tpPodA7, ieUnreach, iePortUnr, 0, sent, 0)
		rc, out = a.fromWep("wep0", unr)
		got := tpWant(t, rc, out, tpRedirect, ieAbout(tpMACWepA1, tpMACPodA7, vip, tpPodA7, ieUnreach, iePortUnr, 0, ieRequote(sent, q), 0))
		ieWantQuote(t, got, vip, tpPodA7, client, netip.AddrPortFrom(vip, 53))
		// A port the service does not have: a TCP segment with options gets a reset.
		syn := ioWith(tpTCPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, 33000), netip.AddrPortFrom(vip, 81), tpSYN, 7000, 0, nil))
		rc, out = a.fromWep("wep1", syn)
		rst := tpTCPFrame(tpMACWepA1, tpMACPodA7, netip.AddrPortFrom(vip, 81), netip.AddrPortFrom(tpPodA7, 33000), tpRST|tpACK, 0, 7001, nil)
		rst.IP.Frag = 0
		rst.IP.TTL = 64
		rst.TCP.Window = 0
		got = tpDecodeOK(t, out)
		if rc != tpRedirect || got.IP.Src != vip || got.IP.Dst != tpPodA7 || got.TCP.Flags != tpRST|tpACK || got.TCP.Ack != 7001 ||
			got.TCP.Sport != 81 || got.TCP.Dport != 33000 || len(got.IP.Options) != 0 {
			t.Errorf("reject of a segment with options: verdict %d, %v; want a reset from %v", rc, got, rst)
		}
	})
	t.Run("node port, endpoint on another node", func(t *testing.T) {
		a, b := tpRemoteNodePort(t)
		client := netip.AddrPortFrom(tpClient, 40000)
		front := netip.AddrPortFrom(tpEdgeA, 30080)
		pod := netip.AddrPortFrom(tpPodB5, 8080)
		syn := ioWith(tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil))
		rc, out := a.fromHost("nic1", syn)
		tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepB0, tpMACPodB5, client, pod))
		synack := ioWith(tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, client, tpSYN|tpACK, 5000, 1001, nil))
		rc, out = b.fromWep("wep0", synack)
		tpWantVXLAN(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA, tpUnwrapped(synack), false)
		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACA1, tpMACEdge, front, client))
	})
}
