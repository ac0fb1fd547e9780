package bpf

import (
	"net/netip"
	"testing"
)

// Reused tuples (issue #25): a client that reuses a source port, through a service and
// straight to an endpoint's own address, or that reuses a whole 4-tuple after a close, starts
// a new connection on every node; an RST the peers talk past does not shorten their flow.

// rtRemoteClosed runs a node-port flow from client through node A to pod B5 on node B, made
// and closed (closing: the client's and the pod's closing segments, 0 for none), and returns
// the key of the flow's pod-side tuple: the tunnel entry's on node B and, the client's port
// being kept, the reverse entry's on node A.
func rtRemoteClosed(t *testing.T, a, b *tpNode, client netip.AddrPort, closing [2]uint8) sluiceCtKeyV4 {
	t.Helper()
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	pod := netip.AddrPortFrom(tpPodB5, 8080)
	toPod := func(flags uint8) {
		t.Helper()
		f := tpTCPFrame(tpMACEdge, tpMACA1, client, front, flags, 1000, 5001, nil)
		rc, out := a.fromHost("nic1", f)
		if rc != tpRedirect {
			t.Fatalf("node A: %v: verdict %d, want a redirect into the tunnel", f, rc)
		}
		rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(f, tpMACWepB0, tpMACPodB5, client, pod))
	}
	fromPod := func(flags uint8) {
		t.Helper()
		f := tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, client, flags, 5000, 1001, nil)
		rc, out := b.fromWep("wep0", f)
		if rc != tpRedirect {
			t.Fatalf("node B: %v: verdict %d, want a redirect into the tunnel", f, rc)
		}
		rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
		tpWant(t, rc, out, tpRedirect, tpNAT(f, tpMACA1, tpMACEdge, front, client))
	}
	toPod(tpSYN)
	fromPod(tpSYN | tpACK)
	toPod(tpACK)
	if closing[0] != 0 {
		toPod(closing[0])
	}
	if closing[1] != 0 {
		fromPod(closing[1])
	}
	tunKey := tpKey(pod, client, tpProtoTCP)
	if v, ok := b.ct(tunKey); closing != [2]uint8{} && (!ok || !(v.Tcp&tpTCPRst != 0 || v.Tcp&(tpTCPFinFwd|tpTCPFinRev) == tpTCPFinFwd|tpTCPFinRev)) {
		t.Fatalf("node B: the flow is not closed: %+v (found %v)", v, ok)
	}
	return tunKey
}

var rtCloses = []struct {
	name    string
	closing [2]uint8
}{{"FIN both ways", [2]uint8{tpFIN | tpACK, tpFIN | tpACK}}, {"client RST", [2]uint8{tpRST | tpACK, 0}}}

// The lab's reproduction: a client connects from port P to node A's node port (endpoint pod
// B5 on node B) and closes; then it connects from the same port P straight to the pod's own
// address. The pod's answer must leave node B as it is, not through the tunnel to node A to be
// turned into the node port's address. Each way the direct SYN can reach the pod is covered:
// by node B's host interface, by a path no ingress program sees (the kernel's VXLAN device:
// only the workload interface's egress sees it), and not at all (only the answer is seen).
func TestProgDirectAfterNodePort(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	client := netip.AddrPortFrom(tpClient, 40000)
	pod := netip.AddrPortFrom(tpPodB5, 8080)
	for _, cl := range rtCloses {
		for _, path := range []string{"host interface", "workload egress", "unseen"} {
			t.Run(cl.name+"/"+path, func(t *testing.T) {
				a, b := tpRemoteNodePort(t)
				key := rtRemoteClosed(t, a, b, client, cl.closing)
				syn := tpTCPFrame(tpMACRouter, tpMACB0, client, pod, tpSYN, 7000, 0, nil)
				switch path {
				case "host interface":
					rc, out := b.fromHost("nic0", syn)
					tpWant(t, rc, out, tpOK, syn)
				case "workload egress":
					in := syn.clone()
					in.Src, in.Dst = tpMACWepB0, tpMACPodB5
					rc, out := b.toWep("wep0", in)
					tpWant(t, rc, out, tpOK, in)
				}
				synack := tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, client, tpSYN|tpACK, 9000, 7001, nil)
				rc, out := b.fromWep("wep0", synack)
				tpWant(t, rc, out, tpOK, synack)
				b.wantNoCT(key)
				ack := tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, client, tpACK, 9001, 7001, []byte("data"))
				rc, out = b.fromWep("wep0", ack)
				tpWant(t, rc, out, tpOK, ack)
				if got := b.counter(tpCCtSuperseded); got != 1 {
					t.Errorf("node B: %d flows superseded, want 1", got)
				}

				// Node A, where the client's packets to the pod may pass too: its direct SYN
				// drops the closed flow's state there as well, so an answer leaving node A
				// for the client is not turned into the node port's.
				rc, _ = a.fromHost("nic1", tpTCPFrame(tpMACEdge, tpMACA1, client, pod, tpSYN, 7000, 0, nil))
				if rc != tpOK {
					t.Fatalf("node A: the direct SYN got verdict %d, want %d", rc, tpOK)
				}
				a.wantNoCT(key)
				a.wantNoCT(tpKey(client, netip.AddrPortFrom(tpEdgeA, 30080), tpProtoTCP))
			})
		}
	}
	// A live flow's answers are never taken for a new connection's: the pod's ACKs and a
	// SYN-ACK retransmitted while the flow is open go through the tunnel as before.
	t.Run("live flow kept", func(t *testing.T) {
		a, b := tpRemoteNodePort(t)
		tunKey := rtRemoteClosed(t, a, b, client, [2]uint8{})
		synack := tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, client, tpSYN|tpACK, 5000, 1001, nil)
		rc, _ := b.fromWep("wep0", synack)
		tpWantVerdict(t, rc, tpRedirect)
		b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPSyn | tpTCPReplied, NatAddr: tpA(tpNodeA)})
	})
}

// The same tuple reused through the service after a close: the ingress node starts a new
// flow, and so does the endpoint's node, whose tunnel entry must not keep the closed flow's
// state (which would give the new connection the closed timeout, after which the pod's
// packets leave by its own node).
func TestProgTupleReuseEndpointNode(t *testing.T) {
	client := netip.AddrPortFrom(tpClient, 40000)
	for _, cl := range rtCloses {
		t.Run(cl.name, func(t *testing.T) {
			a, b := tpRemoteNodePort(t)
			tunKey := rtRemoteClosed(t, a, b, client, cl.closing)
			old, _ := b.ct(tunKey)
			syn := tpTCPFrame(tpMACEdge, tpMACA1, client, netip.AddrPortFrom(tpEdgeA, 30080), tpSYN, 90000, 0, nil)
			rc, out := a.fromHost("nic1", syn)
			tpWantVerdict(t, rc, tpRedirect)
			rc, _ = b.runBytes(b.o.SlFromHost, "nic0", false, out)
			tpWantVerdict(t, rc, tpRedirect)
			v := b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPSyn, NatAddr: tpA(tpNodeA)})
			if v.Created <= old.Created {
				t.Errorf("node B: the new flow's entry was created at %d, the closed one's at %d: not started afresh", v.Created, old.Created)
			}
			if d := DefaultTimeouts.Idle(tpProtoTCP, v.Tcp); d != DefaultTimeouts.TCPSyn {
				t.Errorf("node B: the new flow's timeout is %v, want the SYN timeout %v", d, DefaultTimeouts.TCPSyn)
			}
		})
	}
}

// An RST the peers talk past (out of window, or forged): the flow carries traffic both ways
// after it, so it is established again, with that timeout; an RST that ends the flow keeps
// the short one.
func TestProgRSTTalkedPast(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.44")
	front := netip.AddrPortFrom(vip, 80)
	client := netip.AddrPortFrom(tpPodA7, 35000)
	x := netip.AddrPortFrom(tpPodA5, 8080)
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
	a.backends(1, tpBackend(x, tpNodeA, true))
	toX, fromX := tpPodA7ToPodA5(t, a, client, front, x)
	state := func() uint8 {
		t.Helper()
		v, ok := a.ct(tpKey(x, client, tpProtoTCP))
		if !ok {
			t.Fatal("the flow's reverse entry is gone")
		}
		return v.Tcp
	}
	toX(tpSYN)
	fromX(tpSYN | tpACK)
	toX(tpACK)
	toX(tpRST | tpACK)
	if s := state(); DefaultTimeouts.Idle(tpProtoTCP, s) != DefaultTimeouts.TCPRst {
		t.Fatalf("after the RST: state %v, want the reset timeout", TCPStateNames(s))
	}
	toX(tpACK) // one direction only: still reset
	if s := state(); DefaultTimeouts.Idle(tpProtoTCP, s) != DefaultTimeouts.TCPRst {
		t.Fatalf("after the client's next segment: state %v, want the reset timeout still", TCPStateNames(s))
	}
	fromX(tpACK)
	if s := state(); DefaultTimeouts.Idle(tpProtoTCP, s) != DefaultTimeouts.TCPEstablished || s&tpTCPRst != 0 {
		t.Fatalf("after traffic both ways: state %v, want established", TCPStateNames(s))
	}
	// A second RST, and one more from the same side: the flow stays reset.
	fromX(tpRST)
	fromX(tpACK)
	if s := state(); s&tpTCPRst == 0 {
		t.Fatalf("after an RST and a segment of the same side: state %v, want reset", TCPStateNames(s))
	}
}
