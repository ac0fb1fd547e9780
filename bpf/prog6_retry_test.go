package bpf

import (
	"net/netip"
	"testing"
)

// A SYN sent again for a forwarded IPv6 flow that got no answer takes a source port of its
// own from the node-port range, as IPv4's does (TestProgForwardedSYNRetryNewPort): a load
// balancer that reuses one source port towards two nodes makes two flows of one tuple at the
// endpoint's node, which drops the second as a collision (tunnel_in.h); with the client's
// port kept, every retry of the second met the same tuple and its client hung until the
// first flow ended.
func TestProg6ForwardedSYNRetryNewPort(t *testing.T) {
	a, b := tp6Tunnel(t)
	client := netip.AddrPortFrom(tp6Client, 40000)
	front := netip.AddrPortFrom(tp6EdgeA, 30080)
	pod := netip.AddrPortFrom(tp6PodB5, 8080)
	syn := tp6TCP(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
	rc, out := a.run6(a.o.SlFromHost, "nic1", false, syn)
	first, _ := tp6WantVXLAN(t, rc, out, tpMACA0, tpMACB0, tp6NodeA, tp6NodeB)
	if first.SrcIP != tp6Client || first.TCP.Sport != 40000 || first.DstIP != tp6PodB5 || first.TCP.Dport != 8080 {
		t.Fatalf("first SYN went as %v, want the client's own address and port 40000 to the pod", first)
	}
	rc, out = a.run6(a.o.SlFromHost, "nic1", false, syn)
	wrapped := append([]byte(nil), out...)
	second, _ := tp6WantVXLAN(t, rc, out, tpMACA0, tpMACB0, tp6NodeA, tp6NodeB)
	if second.SrcIP != tp6Client || second.DstIP != tp6PodB5 || second.TCP.Dport != 8080 || second.TCP.Flags != tpSYN {
		t.Fatalf("second SYN went as %v, want the client's SYN to the pod", second)
	}
	if p := second.TCP.Sport; p < tpPsnatMin || p > tpPsnatMax {
		t.Fatalf("second SYN went with source port %d, want one of the node-port range %d-%d", p, tpPsnatMin, tpPsnatMax)
	}
	tp6xWantNoCT(a, tp6Key(pod, client, tpProtoTCP))
	a.wantCT6(tp6Key(client, front, tpProtoTCP), sluiceCtValV6{Type: tpCtFwd, Flags: tpCtRemote | tpCtPsnat, NatAddr: tp6A(tp6PodB5),
		TunAddr: tp6A(tp6NodeB), NatPort: tpP(8080), NatSport: tpP(second.TCP.Sport)})

	// Node B takes the retry as a flow of its own; the pod's answer to the new port comes
	// back through node A translated to the client's own port, from the node port.
	moved := netip.AddrPortFrom(tp6Client, second.TCP.Sport)
	rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, wrapped)
	tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACWepB0, tpMACPodB5, moved, pod, tpSYN, 1000, 0, nil))
	synack := tp6TCP(tpMACPodB5, tpMACWepB0, pod, moved, tpSYN|tpACK, 5000, 1001, nil)
	rc, out = b.run6(b.o.SlFromWep, "wep0", false, synack)
	tp6WantVXLAN(t, rc, out, tpMACB0, tpMACA0, tp6NodeB, tp6NodeA)
	rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
	tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACA1, tpMACEdge, front, client, tpSYN|tpACK, 5000, 1001, nil))
}

// rt6RemoteClosed runs a TCP flow from client through node A's IPv6 node port to pod B5 on
// node B, closed by the client's reset, and returns node B's key of it (its tunnel entry).
func rt6RemoteClosed(t *testing.T, a, b *tpNode, client netip.AddrPort) sluiceCtKeyV6 {
	t.Helper()
	front := netip.AddrPortFrom(tp6EdgeA, 30080)
	pod := netip.AddrPortFrom(tp6PodB5, 8080)
	toPod := func(flags uint8) {
		t.Helper()
		rc, out := a.run6(a.o.SlFromHost, "nic1", false, tp6TCP(tpMACEdge, tpMACA1, client, front, flags, 1000, 5001, nil))
		tp6WantVXLAN(t, rc, out, tpMACA0, tpMACB0, tp6NodeA, tp6NodeB)
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACWepB0, tpMACPodB5, client, pod, flags, 1000, 5001, nil))
	}
	toPod(tpSYN)
	rc, out := b.run6(b.o.SlFromWep, "wep0", false, tp6TCP(tpMACPodB5, tpMACWepB0, pod, client, tpSYN|tpACK, 5000, 1001, nil))
	tp6WantVXLAN(t, rc, out, tpMACB0, tpMACA0, tp6NodeB, tp6NodeA)
	rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
	tp6Want(t, rc, out, tpRedirect, tp6TCP(tpMACA1, tpMACEdge, front, client, tpSYN|tpACK, 5000, 1001, nil))
	toPod(tpACK)
	toPod(tpRST | tpACK)
	key := tp6Key(pod, client, tpProtoTCP)
	if v, ok := b.ct6(key); !ok || v.Type != tpCtTun || v.Tcp&tpTCPRst == 0 {
		t.Fatalf("node B: the flow's tunnel entry is not closed: %+v (found %v)", v, ok)
	}
	return key
}

// The lab's reproduction over IPv6 (TestProgDirectAfterNodePort is IPv4's): after a flow
// through node A's node port to pod B5 closed, the client connects from the same port
// straight to the pod, by a path no ingress program of node B sees (the kernel's VXLAN
// device: only the workload interface's egress sees the SYN). The SYN drops the closed
// tunnel entry, so the pod's answers leave node B as they are: a SYN-ACK, and a reset from a
// pod that does not listen, which through the tunnel would have reached the client as the
// node port's and been ignored, the client retrying until the closed entry expired.
func TestProg6DirectAfterNodePort(t *testing.T) {
	client := netip.AddrPortFrom(tp6Client, 40000)
	pod := netip.AddrPortFrom(tp6PodB5, 8080)
	for _, answer := range []uint8{tpSYN | tpACK, tpRST | tpACK} {
		a, b := tp6Tunnel(t)
		key := rt6RemoteClosed(t, a, b, client)
		syn := tp6TCP(tpMACWepB0, tpMACPodB5, client, pod, tpSYN, 7000, 0, nil)
		rc, out := b.run6(b.o.SlToWep, "wep0", false, syn)
		tp6Want(t, rc, out, tpOK, syn)
		tp6xWantNoCT(b, key)
		reply := tp6TCP(tpMACPodB5, tpMACWepB0, pod, client, answer, 9000, 7001, nil)
		rc, out = b.run6(b.o.SlFromWep, "wep0", false, reply)
		tp6Want(t, rc, out, tpOK, reply)
	}
}

// A workload reaching itself through a cluster IP whose endpoint names no node (a routed
// backend: an endpoint written without its node) is a hairpin as for a local endpoint, as
// IPv4's is: without the hairpin source the kernel would hand the workload a packet from
// itself to itself, and its answer would never come back to be translated.
func TestProg6HairpinRoutedBackend(t *testing.T) {
	a := tpNewWorld(t).node6()
	a.frontend6(tp6Cluster, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: 1})
	a.backends6(1, tp6Backend(netip.AddrPortFrom(tp6PodA5, 8080), tpBeRouted))
	fe := netip.AddrPortFrom(tp6Cluster, 80)
	client := netip.AddrPortFrom(tp6PodA5, 40000)
	syn := tp6TCP(tpMACPodA5, tpMACWepA0, client, fe, tpSYN, 1000, 0, nil)
	_, out := a.run6(a.o.SlFromWep, "wep0", false, syn)
	got := tp6DecodeOK(t, out)
	if got.SrcIP != tp6Hairpin || got.DstIP != tp6PodA5 || got.TCP.Dport != 8080 {
		t.Fatalf("the workload's SYN to its own service went as %v, want from the hairpin address %v to itself", got, tp6Hairpin)
	}
	a.wantCT6(tp6Key(netip.AddrPortFrom(tp6PodA5, 8080), netip.AddrPortFrom(tp6Hairpin, 40000), tpProtoTCP),
		sluiceCtValV6{Type: tpCtRev, Tcp: tpTCPSyn, NatAddr: tp6A(tp6Cluster), NatPort: tpP(80), NatSport: tpP(40000), NatSaddr: tp6A(tp6PodA5)})
	// Its answer to the hairpin address reaches it from the cluster IP.
	synack := tp6TCP(tpMACPodA5, tpMACWepA0, netip.AddrPortFrom(tp6PodA5, 8080), netip.AddrPortFrom(tp6Hairpin, 40000), tpSYN|tpACK, 5000, 1001, nil)
	_, out = a.run6(a.o.SlFromWep, "wep0", false, synack)
	if back := tp6DecodeOK(t, out); back.SrcIP != tp6Cluster || back.TCP.Sport != 80 || back.DstIP != tp6PodA5 || back.TCP.Dport != 40000 {
		t.Errorf("the answer went as %v, want from the cluster IP's port 80 to the workload's port 40000", back)
	}
}
