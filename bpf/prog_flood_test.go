package bpf

import (
	"net/netip"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// tpOnOneCPU runs the rest of the test on one CPU: the young-flow ring is per CPU, and a
// test run executes on the caller's.
func tpOnOneCPU(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	cpu := -1
	for i := 0; i < 1024 && cpu < 0; i++ {
		if old.IsSet(i) {
			cpu = i
		}
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}

// A SYN flood from spoofed addresses, larger than the whole connection table, through a node
// port: unanswered flows (and ones answered but never acknowledged) are evicted oldest first
// once they fill the young-flow ring; the table never fills, an established flow keeps
// working, and a client that connects in the middle of the flood gets through and stays.
func TestProgSynFlood(t *testing.T) {
	tpOnOneCPU(t)
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	a.frontend(netip.IPv4Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeNodePort})
	a.backends(1, tpBackend(tpAP("10.65.0.5:8080"), tpNodeA, true))
	a.frontend(netip.IPv4Unspecified(), 30081, tpProtoUDP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeNodePort})
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	pod := netip.AddrPortFrom(tpPodA5, 8080)
	ring := int(a.o.SlCtYoungV4.MaxEntries())
	table := int(a.o.SlCtV4.MaxEntries())

	// handshake opens a flow from client: SYN, the pod's SYN-ACK, and (ack) the client's ACK.
	handshake := func(client netip.AddrPort, ack bool) {
		t.Helper()
		rc, out := a.fromHost("nic1", tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil))
		if rc != tpRedirect {
			t.Fatalf("SYN from %v: verdict %d", client, rc)
		}
		_ = out
		rc, _ = a.fromWep("wep0", tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, client, tpSYN|tpACK, 5000, 1001, nil))
		if rc != tpRedirect {
			t.Fatalf("SYN-ACK to %v: verdict %d", client, rc)
		}
		if ack {
			rc, _ = a.fromHost("nic1", tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpACK, 1001, 5001, nil))
			if rc != tpRedirect {
				t.Fatalf("ACK from %v: verdict %d", client, rc)
			}
		}
	}
	// works says whether the flow of client still translates both ways.
	works := func(client netip.AddrPort) bool {
		t.Helper()
		data := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpACK|tpPSH, 1001, 5001, []byte("ping"))
		rc, out := a.fromHost("nic1", data)
		if rc != tpRedirect || tpDecodeOK(t, out).IP.Dst != pod.Addr() {
			return false
		}
		answer := tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, client, tpACK|tpPSH, 5001, 1005, []byte("pong"))
		rc, out = a.fromWep("wep0", answer)
		f := tpDecodeOK(t, out)
		return rc == tpRedirect && f.IP.Src == front.Addr() && f.TCP.Sport == front.Port()
	}
	established := netip.AddrPortFrom(tpClient, 40000)
	handshake(established, true)
	spoofedAnswered := netip.MustParseAddrPort("198.19.255.1:1024")
	handshake(spoofedAnswered, false) // the backend answered an address that never acknowledges
	// A one-way UDP stream (syslog): never answered, never evicted.
	oneWay := netip.AddrPortFrom(tpClient, 514)
	if rc, _ := a.fromHost("nic1", tpUDPFrame(tpMACEdge, tpMACA1, oneWay, netip.AddrPortFrom(tpEdgeA, 30081), []byte("log"))); rc != tpRedirect {
		t.Fatalf("UDP to the node port: verdict %d", rc)
	}

	// The flood: more SYNs than the table has flows, each from another spoofed address; a
	// real client connects halfway.
	n := table
	legit := netip.AddrPortFrom(tpClient, 40001)
	for i := 0; i < n; i++ {
		if i == n/2 {
			handshake(legit, true)
		}
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), uint16(1024+i%50000))
		rc, _ := a.fromHost("nic1", tpTCPFrame(tpMACEdge, tpMACA1, src, front, tpSYN, 1, 0, nil))
		if rc != tpRedirect {
			t.Fatalf("spoofed SYN %d of %d: verdict %d (counters: full %d, evicted %d)", i, n, rc, a.counter(tpCDropCtFull), a.counter(tpCCtEvicted))
		}
	}
	if got := a.counter(tpCDropCtFull); got != 0 {
		t.Errorf("the connection table was full %d times", got)
	}
	// Every flow came into the ring (n spoofed, 4 real); each past the ring's size took the
	// slot of one; all TCP flows but the two acknowledged ones were evicted, the spoofed
	// answered one too; the UDP flow was not.
	if got, want := a.counter(tpCCtEvicted), uint64(n+4-ring-3); got != want {
		t.Errorf("%d flows evicted; want %d (%d flows through a ring of %d, 2 of them established, 1 UDP)", got, want, n+4, ring)
	}
	if got := a.ctLen(); got != 2*ring+6 {
		t.Errorf("%d entries in the table after the flood; want the ring's last %d flows, the 2 established ones and the UDP one, 2 entries each", got, ring)
	}
	a.wantNoCT(tpKey(pod, spoofedAnswered, tpProtoTCP))
	if _, ok := a.ct(tpKey(pod, oneWay, tpProtoUDP)); !ok {
		t.Error("the one-way UDP flow was evicted")
	}
	for _, c := range []netip.AddrPort{established, legit} {
		if !works(c) {
			t.Errorf("the established flow of %v no longer translates after the flood", c)
		}
	}
}
