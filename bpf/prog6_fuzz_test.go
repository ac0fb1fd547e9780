package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// FuzzProg6Parse feeds the IPv6 program of the workload hook (through sl_from_wep, as every
// IPv6 packet reaches it) packets whose bytes after the Ethernet header the fuzzer chooses,
// on a node with the cluster IP fd00:96::10 (TCP 80 to [fd00:65::5]:8080, UDP 53 to
// [fd00:65::5]:5353, other ports rejected). What must hold for any input:
//
//   - the verdict is TC_ACT_OK, TC_ACT_SHOT or TC_ACT_REDIRECT;
//   - a packet whose transport checksum verifies (a whole packet whose payload length is what
//     follows its header) leaves with one that verifies: translated, passed on or answered;
//   - a new flow (C_NAT_NEW grew) leaves for the endpoint, at the endpoint's port, the length
//     unchanged; when the input decodes cleanly (tp6Decode), so does the output;
//   - a reject that answers (a reset or an ICMPv6 error) decodes cleanly, from the address the
//     packet was sent to, to its source.
//
// The fuzzer's packets are mostly given a right transport checksum before they are run (unless
// keepChecksum), so that it explores the headers rather than checksums the programs never read.
// The node is made once per fuzzing process; counters are compared before and after each run,
// and the conntrack table is emptied now and then so that new flows keep finding room.
func FuzzProg6Parse(f *testing.F) {
	z := tp6xNewFuzzNode(f)
	for _, s := range tp6xFuzzSeeds() {
		f.Add(s, false)
	}
	// One with its checksum as it is: a datagram without any (0), which IPv6 forbids.
	q := tp6UDP(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tp6PodA7, 40099), netip.AddrPortFrom(tp6Cluster, 53), []byte("zero"))
	q.UDP.ZeroCheck = true
	f.Add(q.ip(), true)

	eth := make([]byte, 14)
	copy(eth[0:], tpMACWepA1[:])
	copy(eth[6:], tpMACPodA7[:])
	binary.BigEndian.PutUint16(eth[12:], 0x86dd)
	endpoint := map[uint8]uint16{tpProtoTCP: 8080, tpProtoUDP: 5353}

	f.Fuzz(func(t *testing.T, pkt []byte, keepChecksum bool) {
		// BPF_PROG_TEST_RUN refuses (EINVAL) a frame of type IPv6 too short for the IPv6
		// header; one larger than a page is refused too.
		if len(pkt) < 40 || len(pkt) > 1500 {
			return
		}
		frame := append(bytes.Clone(eth), pkt...)
		if !keepChecksum {
			tp6xFixChecksum(frame[14:])
		}
		in := bytes.Clone(frame)
		before := z.counters(t)
		rc, out := z.run(t, frame)
		after := z.counters(t)
		grew := func(c int) bool { return after[c] > before[c] }
		if after[tpCNatNew] > z.natAtClear+3000 {
			z.clearConntrack(t)
			z.natAtClear = after[tpCNatNew]
		}

		if rc != tpOK && rc != tpShot && rc != tpRedirect {
			t.Fatalf("verdict %d for %x", rc, in[14:])
		}
		if rc == tpShot {
			return
		}
		if len(out) < 14 {
			t.Fatalf("verdict %d with a frame of %d bytes for %x", rc, len(out), in[14:])
		}
		if valid, ok := tp6xL4Valid(in[14:]); ok && valid {
			if valid, ok := tp6xL4Valid(out[14:]); !ok || !valid {
				t.Errorf("a packet with a good transport checksum left without (verdict %d, applicable %v)\n in %x\nout %x", rc, ok, in[14:], out[14:])
			}
		}
		if grew(tpCNatNew) {
			w, ok := tp6xWalk(out[14:])
			switch {
			case !ok || w.off+4 > len(out)-14:
				t.Errorf("a new flow's packet has no transport header\n in %x\nout %x", in[14:], out[14:])
			case netip.AddrFrom16([16]byte(out[14+24:14+40])) != tp6PodA5:
				t.Errorf("a new flow's packet goes to %v, not the endpoint\n in %x\nout %x", netip.AddrFrom16([16]byte(out[14+24:14+40])), in[14:], out[14:])
			case binary.BigEndian.Uint16(out[14+w.off+2:]) != endpoint[w.proto]:
				t.Errorf("a new flow's packet (protocol %d) goes to port %d, not the endpoint's\n in %x\nout %x", w.proto,
					binary.BigEndian.Uint16(out[14+w.off+2:]), in[14:], out[14:])
			}
			if len(out) != len(in) {
				t.Errorf("a translated packet of %d bytes left with %d", len(in), len(out))
			}
			if _, bad, err := tp6xDecode(in); err == nil && len(bad) == 0 {
				if g, bad, err := tp6xDecode(out); err != nil || len(bad) > 0 {
					t.Errorf("a clean packet, translated, does not decode cleanly: %v %v (%v)\n in %x\nout %x", err, bad, g, in[14:], out[14:])
				}
			}
		}
		if (grew(tpCRejectPort) || grew(tpCRejectNoBackend)) && rc == tpRedirect {
			g, bad, err := tp6xDecode(out)
			if err != nil || len(bad) > 0 {
				t.Errorf("a reject does not decode cleanly: %v %v (%v)\n in %x\nout %x", err, bad, g, in[14:], out[14:])
			} else if g.SrcIP != netip.AddrFrom16([16]byte(in[14+24:14+40])) || g.DstIP != netip.AddrFrom16([16]byte(in[14+8:14+24])) ||
				g.Src != tpMACWepA1 || g.Dst != tpMACPodA7 {
				t.Errorf("a reject %v, want it from the address the packet was sent to, back to its sender\n in %x", g, in[14:])
			}
		}
	})
}

// tp6xFuzzSeeds are valid packets (from the IPv6 header) of every shape the parser walks: plain
// TCP and UDP to the cluster IP, extension-header chains (hop-by-hop, destination options,
// routing with and without segments left, authentication, the longest chain accepted and one
// longer), fragments, rejects, ICMPv6 errors and other ICMPv6.
func tp6xFuzzSeeds() [][]byte {
	client := netip.AddrPortFrom(tp6PodA7, 40000)
	uclient := netip.AddrPortFrom(tp6PodA7, 40053)
	fe := netip.AddrPortFrom(tp6Cluster, 80)
	dns := netip.AddrPortFrom(tp6Cluster, 53)
	syn := func(sport uint16, ext ...tp6Ext) tp6Frame {
		f := tp6TCP(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tp6PodA7, sport), fe, tpSYN, 1, 0, nil)
		f.Ext = ext
		return f
	}
	dest := func(n int) []tp6Ext {
		var e []tp6Ext
		for range n {
			e = append(e, tp6Opts(tp6DestOpts, 1, 0))
		}
		return e
	}
	ah := tp6Ext{Type: 51, Body: []byte{1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1}} // 12 bytes: no ICV
	q := tp6UDP(tpMACPodA7, tpMACWepA1, uclient, dns, []byte("query"))
	big := tp6UDP(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tp6PodA7, 40054), dns, frPayload(600))
	first, later := tp6xFragments(big, 8+296, 0x5eed)
	firstHop := first
	firstHop.Ext = append([]tp6Ext{tp6Opts(tp6HopByHop, 1, 0)}, first.Ext...)
	sent := tp6xIP(tp6UDP(tpMACWepA0, tpMACPodA5, uclient, netip.AddrPortFrom(tp6PodA5, 5353), []byte("query")).build())
	frames := []tp6Frame{
		syn(40000),
		syn(40001, tp6Opts(tp6HopByHop, 1, 0), tp6Opts(tp6DestOpts, 2, 0)),
		syn(40002, tp6Opts(tp6Routing, 3, 0)),
		syn(40003, tp6Opts(tp6Routing, 3, 1)),
		syn(40004, ah),
		syn(40005, dest(7)...),
		syn(40006, dest(8)...),
		tp6TCP(tpMACPodA7, tpMACWepA1, client, fe, tpACK|tpPSH, 2, 1, []byte("data")),
		tp6TCP(tpMACPodA7, tpMACWepA1, client, netip.AddrPortFrom(tp6Cluster, 81), tpSYN, 1, 0, nil),
		q,
		tp6UDP(tpMACPodA7, tpMACWepA1, uclient, netip.AddrPortFrom(tp6Cluster, 54), []byte("query")),
		first, later, firstHop,
		tp6xError(tpMACPodA7, tpMACWepA1, tp6PodA5, tp6PodA7, 1, 4, 0, sent),
		tp6xError(tpMACPodA7, tpMACWepA1, tp6PodA7, tp6Cluster, 2, 0, 1280, sent),
		{SrcIP: tp6PodA7, DstIP: tp6Cluster, HopLimit: 64, Proto: tp6ProtoICMP, ICMP: tpICMP6{Type: 128, Data: 1}, Payload: []byte("ping")},
		{SrcIP: netip.MustParseAddr("fe80::7"), DstIP: netip.MustParseAddr("ff02::1:ff00:5"), HopLimit: 255, Proto: tp6ProtoICMP,
			ICMP: tpICMP6{Type: 135}, Payload: tp6PodA5.AsSlice()},
	}
	var seeds [][]byte
	for _, fr := range frames {
		seeds = append(seeds, fr.ip())
	}
	return seeds
}

// tp6xNewFuzzNode makes the fuzz target's node: a namespace with wep0 (the endpoint
// fd00:65::5 behind it) and wep1 (the client fd00:65::7), and the objects with the cluster IP.
// It is made once for the fuzz target (testing.F has no helpers of tpWorld's, which need a
// *testing.T and would be torn down after the first input).
func tp6xNewFuzzNode(f *testing.F) *tp6xFuzzNode {
	f.Helper()
	nstest.NeedRoot(f, "running eBPF programs in network namespaces")
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		f.Fatalf("getting the test's network namespace: %v", err)
	}
	ns, err := netns.New() // the thread is now in ns
	if err != nil {
		runtime.UnlockOSThread()
		orig.Close()
		f.Fatalf("creating a network namespace: %v", err)
	}
	z := &tp6xFuzzNode{ns: ns, orig: orig}
	f.Cleanup(func() {
		if z.o != nil {
			z.o.Close()
		}
		ns.Close()
		orig.Close()
	})
	setupErr := z.setup()
	if err := netns.Set(orig); err != nil {
		// The thread stays locked: the runtime ends it with the goroutine.
		f.Fatalf("returning to the test's network namespace: %v", err)
	}
	runtime.UnlockOSThread()
	if setupErr != nil {
		f.Fatal(setupErr)
	}
	return z
}

type tp6xFuzzNode struct {
	ns, orig   netns.NsHandle
	o          *Objects
	wep1       int
	natAtClear uint64
}

// setup runs in the node's namespace.
func (z *tp6xFuzzNode) setup() error {
	for _, p := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enabling forwarding: %w", err)
		}
	}
	h, err := netlink.NewHandleAt(z.ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	defer h.Close()
	for _, s := range []struct {
		name      string
		mac, peer tpMAC
		pod       netip.Addr
		keepIndex bool
	}{
		{name: "wep0", mac: tpMACWepA0, peer: tpMACPodA5, pod: tp6PodA5},
		{name: "wep1", mac: tpMACWepA1, peer: tpMACPodA7, pod: tp6PodA7, keepIndex: true},
	} {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.name, HardwareAddr: net.HardwareAddr(s.mac[:])},
			PeerName: s.name + "p", PeerHardwareAddr: net.HardwareAddr(s.peer[:])}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("adding %s: %w", s.name, err)
		}
		for _, name := range []string{s.name + "p", s.name} {
			l, err := h.LinkByName(name)
			if err != nil {
				return err
			}
			if err := h.LinkSetUp(l); err != nil {
				return fmt.Errorf("setting %s up: %w", name, err)
			}
		}
		l, err := h.LinkByName(s.name)
		if err != nil {
			return err
		}
		idx := l.Attrs().Index
		if s.keepIndex {
			z.wep1 = idx
		}
		dst := &net.IPNet{IP: net.IP(s.pod.AsSlice()), Mask: net.CIDRMask(128, 128)}
		if err := h.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("route to %v: %w", s.pod, err)
		}
		if err := h.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
			IP: net.IP(s.pod.AsSlice()), HardwareAddr: net.HardwareAddr(s.peer[:])}); err != nil {
			return fmt.Errorf("neighbour %v: %w", s.pod, err)
		}
	}
	o, err := Load("", MapSizes{Frontends: 1024, Backends: 1024, SourceRanges: 1024, ClusterNets: 1024, Affinity: 1024, Conntrack: 8192})
	if err != nil {
		return err
	}
	z.o = o
	pool := netip.MustParsePrefix("fd00:65::/48")
	for _, p := range []struct {
		m    *ebpf.Map
		k, v any
	}{
		{o.SlCfg, uint32(0), sluiceCfg{HostIp: tpA(tpNodeA), TunnelMtu: tpMTU, Vni: tpVNI, VxlanPort: tpP(tpVXLANPort), PsnatMin: tpPsnatMin, PsnatMax: tpPsnatMax}},
		{o.SlCnetV6, sluiceCnetKeyV6{Prefixlen: uint32(pool.Bits()), Addr: tp6A(pool.Addr())}, sluiceCnetVal{Flags: tpCnetPool}},
		{o.SlFeV6, sluiceFeKeyV6{Addr: tp6A(tp6Cluster), Port: tpP(80), Proto: tpProtoTCP}, sluiceFeVal{ListId: 1, SvcId: 0xa1, Count: 1, Local: 1}},
		{o.SlFeV6, sluiceFeKeyV6{Addr: tp6A(tp6Cluster), Port: tpP(53), Proto: tpProtoUDP}, sluiceFeVal{ListId: 2, SvcId: 0xa1, Count: 1, Local: 1}},
		{o.SlFeV6, sluiceFeKeyV6{Addr: tp6A(tp6Cluster)}, sluiceFeVal{SvcId: 0xa1, Flags: tpFeAddrOnly}},
		{o.SlBeV6, sluiceBeKey{ListId: 1}, tp6Backend(netip.AddrPortFrom(tp6PodA5, 8080), tpBeLocal)},
		{o.SlBeV6, sluiceBeKey{ListId: 2}, tp6Backend(netip.AddrPortFrom(tp6PodA5, 5353), tpBeLocal)},
	} {
		if err := p.m.Put(p.k, p.v); err != nil {
			return fmt.Errorf("writing %v: %w", p.m, err)
		}
	}
	return nil
}

// run runs sl_from_wep on frame as arriving on wep1, in the node's namespace (the test run
// finds the interface, and the FIB its routes, in the caller's namespace).
func (z *tp6xFuzzNode) run(t *testing.T, frame []byte) (uint32, []byte) {
	t.Helper()
	runtime.LockOSThread()
	if err := netns.Set(z.ns); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("entering the namespace: %v", err)
	}
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, 4096),
		Context: tpSkb{Ifindex: uint32(z.wep1), IngressIfindex: uint32(z.wep1)}}
	rc, err := z.o.SlFromWep.Run(opts)
	if errors.Is(err, unix.EINVAL) {
		// Before Linux 5.15 a test run cannot set ingress_ifindex (tpNode.runCtx): the
		// programs read ifindex then, which names the same interface on an ingress hook.
		opts = &ebpf.RunOptions{Data: frame, DataOut: make([]byte, 4096), Context: tpSkb{Ifindex: uint32(z.wep1)}}
		rc, err = z.o.SlFromWep.Run(opts)
	}
	if err := netns.Set(z.orig); err != nil {
		// The thread stays locked: the runtime ends it with the goroutine.
		t.Fatalf("returning to the test's network namespace: %v", err)
	}
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatalf("running sl_from_wep on %x: %v", frame, err)
	}
	return rc, opts.DataOut
}

// counters reads the counters the fuzz test compares (summed over the CPUs).
func (z *tp6xFuzzNode) counters(t *testing.T) [tpCNum]uint64 {
	t.Helper()
	var c [tpCNum]uint64
	for _, i := range []int{tpCNatNew, tpCRejectPort, tpCRejectNoBackend} {
		var per []uint64
		if err := z.o.SlCounters.Lookup(uint32(i), &per); err != nil {
			t.Fatalf("counter %s: %v", tpCounterNames[i], err)
		}
		for _, v := range per {
			c[i] += v
		}
	}
	return c
}

// clearConntrack empties the IPv6 conntrack table.
func (z *tp6xFuzzNode) clearConntrack(t *testing.T) {
	t.Helper()
	var keys []sluiceCtKeyV6
	var k sluiceCtKeyV6
	var v sluiceCtValV6
	it := z.o.SlCtV6.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		t.Fatalf("reading conntrack: %v", err)
	}
	for _, k := range keys {
		if err := z.o.SlCtV6.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatalf("emptying conntrack: %v", err)
		}
	}
}

// tp6xL4 is where an IPv6 packet's transport header is, as an extension-header walker finds it.
type tp6xL4 struct {
	proto uint8
	off   int  // from the IPv6 header
	frag  bool // a fragment header was on the way
}

// tp6xWalk walks the extension headers the programs walk (hop-by-hop, routing, destination
// options, authentication, fragment); false when the chain runs past the packet.
func tp6xWalk(ip []byte) (tp6xL4, bool) {
	var w tp6xL4
	if len(ip) < 40 || ip[0]>>4 != 6 {
		return w, false
	}
	next, off := ip[6], 40
	for range 64 {
		switch next {
		case tp6HopByHop, tp6Routing, tp6DestOpts, 51:
			if off+2 > len(ip) {
				return w, false
			}
			n := (int(ip[off+1]) + 1) * 8
			if next == 51 {
				n = (int(ip[off+1]) + 2) * 4
			}
			next, off = ip[off], off+n
		case tp6Fragment:
			if off+8 > len(ip) {
				return w, false
			}
			w.frag = true
			next, off = ip[off], off+8
		default:
			w.proto, w.off = next, off
			return w, off <= len(ip)
		}
	}
	return w, false
}

// tp6xChecksumAt is the offset of the checksum in a transport header, or -1.
func tp6xChecksumAt(proto uint8) int {
	switch proto {
	case tpProtoTCP:
		return 16
	case tpProtoUDP:
		return 6
	case tp6ProtoICMP:
		return 2
	}
	return -1
}

// tp6xWhole returns the transport part of a whole packet (no fragment, the payload length
// what follows the header) carrying TCP, UDP or ICMPv6 with room for its checksum.
func tp6xWhole(ip []byte) (tp6xL4, []byte, bool) {
	w, ok := tp6xWalk(ip)
	if !ok || w.frag || 40+int(binary.BigEndian.Uint16(ip[4:])) != len(ip) {
		return w, nil, false
	}
	at := tp6xChecksumAt(w.proto)
	if at < 0 || len(ip)-w.off < at+2 {
		return w, nil, false
	}
	return w, ip[w.off:], true
}

// tp6xL4Valid says whether a whole packet's transport checksum verifies (a UDP checksum 0 does
// not: IPv6 has no datagrams without one); applicable is false for what has no checksum to check.
func tp6xL4Valid(ip []byte) (valid, applicable bool) {
	w, l4, ok := tp6xWhole(ip)
	if !ok {
		return false, false
	}
	if w.proto == tpProtoUDP && l4[6] == 0 && l4[7] == 0 {
		return false, true
	}
	src, dst := netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	return tpChecksum(tp6Pseudo(src, dst, w.proto, l4)) == 0, true
}

// tp6xFixChecksum gives a whole packet the right transport checksum.
func tp6xFixChecksum(ip []byte) {
	w, l4, ok := tp6xWhole(ip)
	if !ok {
		return
	}
	at := tp6xChecksumAt(w.proto)
	l4[at], l4[at+1] = 0, 0
	src, dst := netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	c := tpChecksum(tp6Pseudo(src, dst, w.proto, l4))
	if c == 0 && w.proto == tpProtoUDP {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(l4[at:], c)
}

// tp6xDecode is tp6Decode for any bytes: a header length that runs past the packet is an
// error, not a panic.
func tp6xDecode(b []byte) (f tp6Frame, bad []string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed: %v", r)
		}
	}()
	return tp6Decode(b)
}
