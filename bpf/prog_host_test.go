package bpf

import (
	"net/netip"
	"testing"
)

// Backends in the host's own network namespace (host-networked endpoints, at a node's own
// address) answer from the host stack: their replies leave by a host interface, where
// sl_to_host translates them. Same harness as prog_test.go.

func (n *tpNode) toHost(iface string, f tpFrame) (uint32, []byte) {
	n.t.Helper()
	return n.run(n.o.SlToHost, iface, true, f)
}

func TestProgHostBackend(t *testing.T) {
	client := netip.AddrPortFrom(tpClient, 40000)
	front := netip.AddrPortFrom(tpEdgeA, 30080)

	t.Run("node port to a host-networked backend here", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		host := netip.AddrPortFrom(tpNodeA, 6443)
		a.frontend(netip.IPv4Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeNodePort})
		a.backends(1, tpBackend(host, tpNodeA, true))

		syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
		rc, out := a.fromHost("nic1", syn)
		tpWant(t, rc, out, tpOK, tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, host))
		revKey := tpKey(host, client, tpProtoTCP)
		revWant := sluiceCtValV4{Type: tpCtRev, Flags: tpCtRedirect | tpCtLocal, Tcp: tpTCPSyn, Ifindex: uint32(a.ifindex["nic1"]),
			NatAddr: tpA(tpEdgeA), NatPort: tpP(30080), NatSport: tpP(40000), MacLocal: tpMACA1, MacPeer: tpMACEdge}
		a.wantCT(revKey, revWant)

		// The host answers by the interface the request came in by: translated, on its way.
		synack := tpTCPFrame(tpMACA1, tpMACEdge, host, client, tpSYN|tpACK, 9000, 1001, nil)
		rc, out = a.toHost("nic1", synack)
		tpWant(t, rc, out, tpOK, tpNAT(synack, tpZeroMAC, tpZeroMAC, front, netip.AddrPort{}))
		revWant.Tcp |= tpTCPReplied | tpTCPOpening
		a.wantCT(revKey, revWant)

		// The host's routing picks the other interface (node A's default route is by nic0):
		// the reply is sent back by nic1, to the hop the request came from.
		ack := tpTCPFrame(tpMACA0, tpMACRouter, host, client, tpACK, 9001, 1001, []byte("hello"))
		rc, out = a.toHost("nic0", ack)
		tpWant(t, rc, out, tpRedirect, tpNAT(ack, tpMACA1, tpMACEdge, front, netip.AddrPort{}))

		// The host's other traffic passes untouched.
		other := tpTCPFrame(tpMACA0, tpMACRouter, netip.AddrPortFrom(tpNodeA, 22), client, tpACK, 1, 1, nil)
		rc, out = a.toHost("nic0", other)
		tpWant(t, rc, out, tpOK, other)
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 2})
	})

	t.Run("node port tunnelled to a host-networked backend", func(t *testing.T) {
		w := tpNewWorld(t)
		a := w.node("node-a", tpNodeA, tpNodeASpec())
		b := w.node("node-b", tpNodeB, tpNodeBSpec())
		host := netip.AddrPortFrom(tpNodeB, 6443)
		a.frontend(netip.IPv4Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Flags: tpFeNodePort})
		a.backends(1, tpBackend(host, tpNodeB, false))

		syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
		rc, out := a.fromHost("nic1", syn)
		_, port := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, host)), false)
		mid := netip.AddrPortFrom(tpClient, port)
		// Node B: decapsulated and left to its own stack (the backend is the host).
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpOK, tpNAT(syn, tpMACA0, tpMACB0, mid, host))
		tunKey := tpKey(host, mid, tpProtoTCP)
		b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPSyn, NatAddr: tpA(tpNodeA)})

		// Node B's host answers; its route to the client is the router, but the answer goes
		// back through the tunnel to node A, which sends it to the client from the node port.
		synack := tpTCPFrame(tpMACB0, tpMACRouter, host, mid, tpSYN|tpACK, 9000, 1001, nil)
		rc, out = b.toHost("nic0", synack)
		tpWantVXLAN(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA, tpUnwrapped(synack), false)
		b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPSyn | tpTCPReplied | tpTCPOpening, NatAddr: tpA(tpNodeA)})
		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACA1, tpMACEdge, front, client))
		b.wantCounters(map[int]uint64{tpCTunIn: 1})
	})
}
