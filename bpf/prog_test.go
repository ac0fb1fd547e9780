package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The program tests run sluice's tc programs through BPF_PROG_TEST_RUN on hand-built
// packets and check the packets they return byte for byte. Each test makes its own network
// namespaces ("nodes") with veth interfaces, addresses, routes and permanent neighbours, so
// that bpf_fib_lookup in the programs finds known interfaces and MACs; each node has its own
// private (unpinned) maps. A test that needs two nodes (the node-port tunnel) loads the
// objects twice, once per node, and switches the test's OS thread between the namespaces
// before each run.
//
// What BPF_PROG_TEST_RUN cannot show: the interface a redirect goes to (the return value is
// only TC_ACT_REDIRECT). The tests check instead what the program chose it from: the MACs it
// wrote, which come from the same FIB result or conntrack entry as the ifindex, and the
// ifindex recorded in conntrack.

// The driver's constants of c/sluice.h under the tests' short names
// (TestProgHeaderConstants checks the driver's values against the header).
const (
	tpFeExtLocal  = FrontendExternalLocal
	tpFeIntLocal  = FrontendInternalLocal
	tpFeSrcRanges = FrontendSourceRanges
	tpFeAddrOnly  = FrontendAddrOnly
	tpFeNodePort  = FrontendNodePort

	tpBeLocal  = BackendLocal
	tpBeRouted = BackendRouted

	tpCnetPool = ClusterNetPool
	tpCnetHost = ClusterNetHost
	tpCnetSelf = ClusterNetSelf

	tpCtFwd = ConntrackFwd
	tpCtRev = ConntrackRev
	tpCtTun = ConntrackTun

	tpCtRemote   = ConntrackRemote
	tpCtRedirect = ConntrackRedirect
	tpCtPsnat    = ConntrackPSNAT
	tpCtLocal    = ConntrackLocal

	tpTCPSyn     = TCPSyn
	tpTCPReplied = TCPReplied
	tpTCPOpening = TCPOpening
	tpTCPFinFwd  = TCPFinFwd
	tpTCPFinRev  = TCPFinRev
	tpTCPRst     = TCPRst
	tpTCPLiveFwd = TCPLiveFwd
	tpTCPLiveRev = TCPLiveRev
)

// Counters, in the order of enum counter.
const (
	tpCNatNew = iota
	tpCNatFwdRemote
	tpCTunIn
	tpCDropForgedTunnel
	tpCDropNoLocal
	tpCDropSrcRange
	tpCDropCtFull
	tpCDropTooBig
	tpCDropCollision
	tpCDropFib
	tpCDropMalformed
	tpCRejectNoBackend
	tpCRejectPort
	tpCICMPTooBig
	tpCRevNat
	tpCSockNat
	tpCRejectSock
	tpCCtSuperseded
	tpCFragSplit
	tpCDropFibBlackhole
	tpCDropFibProhibit
	tpCDropFibFrag
	tpCDropFibOther
	tpCCtEvicted
	tpCNum
)

var tpCounterNames = []string{"C_NAT_NEW", "C_NAT_FWD_REMOTE", "C_TUN_IN", "C_DROP_FORGED_TUNNEL",
	"C_DROP_NO_LOCAL", "C_DROP_SRC_RANGE", "C_DROP_CT_FULL", "C_DROP_TOO_BIG", "C_DROP_COLLISION",
	"C_DROP_FIB", "C_DROP_MALFORMED", "C_REJECT_NO_BACKEND", "C_REJECT_PORT", "C_ICMP_TOO_BIG", "C_REV_NAT", "C_SOCK_NAT", "C_REJECT_SOCK", "C_CT_SUPERSEDED", "C_FRAG_SPLIT",
	"C_DROP_FIB_BLACKHOLE", "C_DROP_FIB_PROHIBIT", "C_DROP_FIB_FRAG", "C_DROP_FIB_OTHER", "C_CT_EVICTED"}

// tc verdicts.
const (
	tpOK       = 0
	tpShot     = 2
	tpRedirect = 7
)

// tpSkb is struct __sk_buff (include/uapi/linux/bpf.h), the context of a tc program's test
// run. The kernel accepts only mark, priority, ingress_ifindex, ifindex, cb, tstamp,
// wire_len, gso_segs, gso_size and hwtstamp set; ifindex > 1 makes the packet arrive on that
// device (of the caller's network namespace), ingress_ifindex becomes skb->skb_iif.
type tpSkb struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TCIndex                                  uint32
	CB                                                                          [5]uint32
	Hash, TCClassid, Data, DataEnd, NapiID                                      uint32
	Family, RemoteIP4, LocalIP4                                                 uint32
	RemoteIP6, LocalIP6                                                         [4]uint32
	RemotePort, LocalPort, DataMeta                                             uint32
	FlowKeys                                                                    uint64
	Tstamp                                                                      uint64
	WireLen, GSOSegs                                                            uint32
	Sk                                                                          uint64
	GSOSize                                                                     uint32
	TstampType                                                                  uint8
	_                                                                           [3]byte
	Hwtstamp                                                                    uint64
}

// The test topology. Node A is the ingress node: nic0 on the node network (192.0.2.0/24,
// with the default route), nic1 an external uplink (198.51.100.0/24) by which clients come;
// its second address there, 198.51.100.2, is not in the cluster-networks map (the programs
// know it for the node's own only through the FIB).
// Node B and node C are other nodes. Every interface is one end of a veth pair whose other
// end (in the same namespace) stands for the hop behind it: a router or a pod.
var (
	tpNodeA     = netip.MustParseAddr("192.0.2.1")
	tpNodeB     = netip.MustParseAddr("192.0.2.2")
	tpNodeC     = netip.MustParseAddr("192.0.2.3")
	tpRouter    = netip.MustParseAddr("192.0.2.254")
	tpEdgeA     = netip.MustParseAddr("198.51.100.1") // node A's address on nic1
	tpEdgeRtr   = netip.MustParseAddr("198.51.100.254")
	tpClient    = netip.MustParseAddr("203.0.113.10") // outside the cluster
	tpPodA5     = netip.MustParseAddr("10.65.0.5")    // on node A, wep0
	tpPodA6     = netip.MustParseAddr("10.65.0.6")    // on node A, wep2
	tpPodA7     = netip.MustParseAddr("10.65.0.7")    // on node A, wep1: the workload client
	tpPodB5     = netip.MustParseAddr("10.65.1.5")    // on node B, wep0
	tpMACA0     = tpMAC{2, 0, 0, 0, 0x01, 0x01}
	tpMACA1     = tpMAC{2, 0, 0, 0, 0x01, 0x11}
	tpMACB0     = tpMAC{2, 0, 0, 0, 0x02, 0x01}
	tpMACC0     = tpMAC{2, 0, 0, 0, 0x03, 0x01}
	tpMACRouter = tpMAC{2, 0, 0, 0, 0xfe, 0x01}
	tpMACEdge   = tpMAC{2, 0, 0, 0, 0xfe, 0x11}
	tpMACWepA0  = tpMAC{2, 0, 0, 0, 0x0a, 0x01}
	tpMACWepA1  = tpMAC{2, 0, 0, 0, 0x0a, 0x11}
	tpMACWepA2  = tpMAC{2, 0, 0, 0, 0x0a, 0x21}
	tpMACWepB0  = tpMAC{2, 0, 0, 0, 0x0b, 0x01}
	tpMACPodA5  = tpMAC{2, 0, 0, 0, 0x0c, 0x05}
	tpMACPodA6  = tpMAC{2, 0, 0, 0, 0x0c, 0x06}
	tpMACPodA7  = tpMAC{2, 0, 0, 0, 0x0c, 0x07}
	tpMACPodB5  = tpMAC{2, 0, 0, 0, 0x0d, 0x05}
	tpZeroMAC   = tpMAC{}
)

const (
	tpVXLANPort = 4790
	tpVNI       = 0x51ce
	tpMTU       = 1450
	tpPsnatMin  = 20000
	tpPsnatMax  = 29999
)

// tpA is an IPv4 address as the generated structs hold it (network order bytes).
func tpA(a netip.Addr) uint32 { return binary.LittleEndian.Uint32(a.AsSlice()) }

// tpP is a port as the generated structs hold it (network order bytes).
func tpP(p uint16) uint16 { return p<<8 | p>>8 }

func tpAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// tpKey is the conntrack key of a packet from src to dst.
func tpKey(src, dst netip.AddrPort, proto uint8) sluiceCtKeyV4 {
	return sluiceCtKeyV4{Src: tpA(src.Addr()), Dst: tpA(dst.Addr()), Sport: tpP(src.Port()), Dport: tpP(dst.Port()), Proto: proto}
}

// tpBackend is a backend at addr on the node at node.
func tpBackend(addr netip.AddrPort, node netip.Addr, local bool) sluiceBeValV4 {
	b := sluiceBeValV4{Addr: tpA(addr.Addr()), NodeAddr: tpA(node), Port: tpP(addr.Port())}
	if local {
		b.Flags = tpBeLocal
	}
	return b
}

type tpIfaceSpec struct {
	name    string
	mac     tpMAC
	peerMAC tpMAC // the other end of the veth: the router or pod behind the interface
	addrs   []string
	routes  []string // prefixes routed straight out of this interface (pods)
	gateway netip.Addr
	// gateway6 is the IPv6 default route's (tests of IPv6 services).
	gateway6 netip.Addr
	neigh    map[netip.Addr]tpMAC
}

func tpNodeASpec() []tpIfaceSpec {
	return []tpIfaceSpec{
		{name: "nic0", mac: tpMACA0, peerMAC: tpMACRouter, addrs: []string{"192.0.2.1/24"}, gateway: tpRouter,
			neigh: map[netip.Addr]tpMAC{tpNodeB: tpMACB0, tpNodeC: tpMACC0, tpRouter: tpMACRouter}},
		{name: "nic1", mac: tpMACA1, peerMAC: tpMACEdge, addrs: []string{"198.51.100.1/24", "198.51.100.2/24"},
			neigh: map[netip.Addr]tpMAC{tpEdgeRtr: tpMACEdge}},
		{name: "wep0", mac: tpMACWepA0, peerMAC: tpMACPodA5, routes: []string{"10.65.0.5/32"},
			neigh: map[netip.Addr]tpMAC{tpPodA5: tpMACPodA5}},
		{name: "wep1", mac: tpMACWepA1, peerMAC: tpMACPodA7, routes: []string{"10.65.0.7/32"},
			neigh: map[netip.Addr]tpMAC{tpPodA7: tpMACPodA7}},
		{name: "wep2", mac: tpMACWepA2, peerMAC: tpMACPodA6, routes: []string{"10.65.0.6/32"},
			neigh: map[netip.Addr]tpMAC{tpPodA6: tpMACPodA6}},
	}
}

func tpNodeBSpec() []tpIfaceSpec {
	return []tpIfaceSpec{
		{name: "nic0", mac: tpMACB0, peerMAC: tpMACRouter, addrs: []string{"192.0.2.2/24"}, gateway: tpRouter,
			neigh: map[netip.Addr]tpMAC{tpNodeA: tpMACA0, tpNodeC: tpMACC0, tpRouter: tpMACRouter}},
		{name: "wep0", mac: tpMACWepB0, peerMAC: tpMACPodB5, routes: []string{"10.65.1.5/32"},
			neigh: map[netip.Addr]tpMAC{tpPodB5: tpMACPodB5}},
	}
}

// tpWorld holds the test's OS thread for the namespaces it makes and returns it to its own
// namespace at the end.
type tpWorld struct {
	t *testing.T
	// ipv6: nodes load the IPv6 programs too (the IPv6 tests).
	ipv6 bool
}

func tpNewWorld(t *testing.T) *tpWorld {
	t.Helper()
	nstest.NeedRoot(t, "running eBPF programs in network namespaces")
	nstest.Lock(t)
	return &tpWorld{t: t}
}

// tpNode is one node: a namespace with its interfaces and a private load of the objects.
type tpNode struct {
	t       *testing.T
	name    string
	host    netip.Addr
	ns      netns.NsHandle
	o       *Objects
	ifindex map[string]int
	mac     map[string]tpMAC
	// csumComplete runs the programs on packets received with a complete checksum
	// (testSkbChecksumComplete): a run that leaves skb->csum wrong fails the test.
	csumComplete bool
}

// node makes a namespace with the interfaces and loads the objects for it, with sluice's
// settings for a node whose underlay address is host and the cluster networks of the
// topology (this node's addresses marked as its own).
func (w *tpWorld) node(name string, host netip.Addr, ifaces []tpIfaceSpec) *tpNode {
	t := w.t
	t.Helper()
	ns := nstest.Another(t) // the thread is now in ns
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("%s: netlink handle: %v", name, err)
	}
	t.Cleanup(h.Close)
	for _, f := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
			t.Fatalf("%s: enabling forwarding (bpf_fib_lookup needs it): %v", name, err)
		}
	}
	n := &tpNode{t: t, name: name, host: host, ns: ns, ifindex: map[string]int{}, mac: map[string]tpMAC{}}
	for _, s := range ifaces {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.name, HardwareAddr: net.HardwareAddr(s.mac[:])},
			PeerName: s.name + "p", PeerHardwareAddr: net.HardwareAddr(s.peerMAC[:])}
		if err := h.LinkAdd(veth); err != nil {
			t.Fatalf("%s: adding %s: %v", name, s.name, err)
		}
		t.Cleanup(func() {
			if err := h.LinkDel(veth); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: deleting %s: %v", name, s.name, err)
			}
		})
		link, err := h.LinkByName(s.name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		peer, err := h.LinkByName(s.name + "p")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := h.LinkSetUp(peer); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := h.LinkSetUp(link); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		idx := link.Attrs().Index
		n.ifindex[s.name] = idx
		n.mac[s.name] = s.mac
		for _, addr := range s.addrs {
			a, err := netlink.ParseAddr(addr)
			if err != nil {
				t.Fatal(err)
			}
			if a.IP.To4() == nil {
				a.Flags |= unix.IFA_F_NODAD // usable at once, not tentative
			}
			if err := h.AddrAdd(link, a); err != nil {
				t.Fatalf("%s: address %s: %v", name, addr, err)
			}
		}
		for _, r := range s.routes {
			_, dst, err := net.ParseCIDR(r)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
				t.Fatalf("%s: route %s: %v", name, r, err)
			}
		}
		for ip, mac := range s.neigh {
			family := netlink.FAMILY_V4
			if !ip.Is4() {
				family = netlink.FAMILY_V6
			}
			if err := h.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: family, State: netlink.NUD_PERMANENT,
				IP: net.IP(ip.AsSlice()), HardwareAddr: net.HardwareAddr(mac[:])}); err != nil {
				t.Fatalf("%s: neighbour %v: %v", name, ip, err)
			}
		}
	}
	// Gateways last: their subnet's route exists once the addresses are in.
	for _, s := range ifaces {
		for _, gw := range []netip.Addr{s.gateway, s.gateway6} {
			if gw.IsValid() {
				if err := h.RouteReplace(&netlink.Route{LinkIndex: n.ifindex[s.name], Gw: net.IP(gw.AsSlice())}); err != nil {
					t.Fatalf("%s: default route via %s: %v", name, gw, err)
				}
			}
		}
	}

	o := tpTake(t, w.ipv6)
	n.o = o
	n.put(o.SlCfg, uint32(0), sluiceCfg{HostIp: tpA(host), TunnelMtu: tpMTU, Vni: tpVNI, VxlanPort: tpP(tpVXLANPort),
		PsnatMin: tpPsnatMin, PsnatMax: tpPsnatMax})
	n.cnet("10.65.0.0/16", tpCnetPool)
	for _, a := range []netip.Addr{tpNodeA, tpNodeB, tpNodeC} {
		f := uint32(tpCnetHost)
		if a == host {
			f |= tpCnetSelf
		}
		n.cnet(netip.PrefixFrom(a, 32).String(), f)
	}
	if host == tpNodeA {
		n.cnet(netip.PrefixFrom(tpEdgeA, 32).String(), tpCnetHost|tpCnetSelf)
	}
	return n
}

func (n *tpNode) put(m *ebpf.Map, k, v any) {
	n.t.Helper()
	if err := m.Put(k, v); err != nil {
		n.t.Fatalf("%s: writing %v: %v", n.name, m, err)
	}
}

func (n *tpNode) cnet(prefix string, flags uint32) {
	n.t.Helper()
	p := netip.MustParsePrefix(prefix)
	n.put(n.o.SlCnetV4, sluiceCnetKeyV4{Prefixlen: uint32(p.Bits()), Addr: tpA(p.Addr())}, sluiceCnetVal{Flags: flags})
}

// frontend writes the frontend addr:port/proto (addr 0.0.0.0: a node port's wildcard).
func (n *tpNode) frontend(addr netip.Addr, port uint16, proto uint8, v sluiceFeVal) {
	n.t.Helper()
	n.put(n.o.SlFeV4, sluiceFeKeyV4{Addr: tpA(addr), Port: tpP(port), Proto: proto}, v)
}

// backends writes the backend list id with bs at ordinals 0, 1, ...
func (n *tpNode) backends(id uint64, bs ...sluiceBeValV4) {
	n.t.Helper()
	for i, b := range bs {
		n.put(n.o.SlBeV4, sluiceBeKey{ListId: id, Ordinal: uint32(i)}, b)
		if len(bs) > AffinityScan {
			n.put(n.o.SlBeIdxV4, sluiceBeIdxKeyV4{ListId: id, Addr: b.Addr, Port: b.Port}, uint32(i))
		}
	}
}

func (n *tpNode) ct(k sluiceCtKeyV4) (sluiceCtValV4, bool) {
	n.t.Helper()
	var v sluiceCtValV4
	err := n.o.SlCtV4.Lookup(&k, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return v, false
	}
	if err != nil {
		n.t.Fatalf("%s: conntrack lookup: %v", n.name, err)
	}
	return v, true
}

func (n *tpNode) ctLen() int {
	n.t.Helper()
	var k sluiceCtKeyV4
	var v sluiceCtValV4
	c := 0
	it := n.o.SlCtV4.Iterate()
	for it.Next(&k, &v) {
		c++
	}
	if err := it.Err(); err != nil {
		n.t.Fatal(err)
	}
	return c
}

// wantCT checks the conntrack entry of k, ignoring its timestamps (which must be set).
func (n *tpNode) wantCT(k sluiceCtKeyV4, want sluiceCtValV4) sluiceCtValV4 {
	n.t.Helper()
	got, ok := n.ct(k)
	if !ok {
		n.t.Errorf("%s: no conntrack entry %+v", n.name, k)
		return got
	}
	if got.Created == 0 || got.LastSeen < got.Created {
		n.t.Errorf("%s: conntrack %+v: created %d, last seen %d", n.name, k, got.Created, got.LastSeen)
	}
	want.Created, want.LastSeen = got.Created, got.LastSeen
	if got != want {
		n.t.Errorf("%s: conntrack %+v:\n got %+v\nwant %+v", n.name, k, got, want)
	}
	return got
}

func (n *tpNode) wantNoCT(k sluiceCtKeyV4) {
	n.t.Helper()
	if v, ok := n.ct(k); ok {
		n.t.Errorf("%s: unexpected conntrack entry %+v: %+v", n.name, k, v)
	}
}

func (n *tpNode) counter(c int) uint64 {
	n.t.Helper()
	var per []uint64
	if err := n.o.SlCounters.Lookup(uint32(c), &per); err != nil {
		n.t.Fatalf("%s: counter %d: %v", n.name, c, err)
	}
	var sum uint64
	for _, v := range per {
		sum += v
	}
	return sum
}

// wantCounters checks the counters named in want; every other counter must be zero.
func (n *tpNode) wantCounters(want map[int]uint64) {
	n.t.Helper()
	for c := 0; c < tpCNum; c++ {
		if got := n.counter(c); got != want[c] {
			n.t.Errorf("%s: counter %s = %d, want %d", n.name, tpCounterNames[c], got, want[c])
		}
	}
}

// run runs prog on the frame as if it arrived on (ingress) or left by (egress) iface and
// returns the verdict and the packet as the program left it.
func (n *tpNode) run(prog *ebpf.Program, iface string, egress bool, f tpFrame) (uint32, []byte) {
	n.t.Helper()
	return n.runBytes(prog, iface, egress, f.build())
}

func (n *tpNode) runBytes(prog *ebpf.Program, iface string, egress bool, in []byte) (uint32, []byte) {
	n.t.Helper()
	return n.runCtx(prog, iface, egress, in, nil)
}

// runCtx is runBytes with the context's other settable fields (gso_size, gso_segs) set by edit.
func (n *tpNode) runCtx(prog *ebpf.Program, iface string, egress bool, in []byte, edit func(*tpSkb)) (uint32, []byte) {
	n.t.Helper()
	idx, ok := n.ifindex[iface]
	if !ok {
		n.t.Fatalf("%s: no interface %s", n.name, iface)
	}
	if err := netns.Set(n.ns); err != nil {
		n.t.Fatalf("%s: entering the namespace: %v", n.name, err)
	}
	ctx := tpSkb{Ifindex: uint32(idx)}
	if !egress {
		ctx.IngressIfindex = uint32(idx)
	}
	if edit != nil {
		edit(&ctx)
	}
	out := make([]byte, 4096)
	var flags uint32
	if n.csumComplete {
		flags = testSkbChecksumComplete
	}
	opts := &ebpf.RunOptions{Data: in, DataOut: out, Context: ctx, Flags: flags}
	rc, err := prog.Run(opts)
	if errors.Is(err, unix.EINVAL) && ctx.IngressIfindex != 0 {
		// Before Linux 5.15 a test run cannot set ingress_ifindex; the programs read ifindex
		// then, which names the same interface on an ingress hook.
		ctx.IngressIfindex = 0
		opts = &ebpf.RunOptions{Data: in, DataOut: out, Context: ctx, Flags: flags}
		rc, err = prog.Run(opts)
	}
	if errors.Is(err, unix.EBADMSG) {
		n.t.Fatalf("%s: %v on %s left skb->csum wrong for a packet received with a complete checksum (CHECKSUM_COMPLETE): the stack would log \"hw csum failure\" and sum it again", n.name, prog, iface)
	}
	if err != nil {
		n.t.Fatalf("%s: running %v on %s: %v", n.name, prog, iface, err)
	}
	return rc, opts.DataOut
}

// testSkbChecksumComplete is BPF_F_TEST_SKB_CHECKSUM_COMPLETE (Linux 6.11): the test run
// hands the program a packet whose skb->csum sums it whole, as a NIC with complete receive
// checksums does, and fails the run with EBADMSG when skb->csum no longer sums the packet the
// program leaves.
const testSkbChecksumComplete = 1 << 2

// haveCsumComplete says whether test runs take testSkbChecksumComplete.
var haveCsumComplete = sync.OnceValue(func() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		return err
	}
	defer prog.Close()
	_, err = prog.Run(&ebpf.RunOptions{Data: make([]byte, 64), Flags: testSkbChecksumComplete})
	return err
})

// fromHost, fromWep and toWep run the three tc programs.
func (n *tpNode) fromHost(iface string, f tpFrame) (uint32, []byte) {
	n.t.Helper()
	return n.run(n.o.SlFromHost, iface, false, f)
}

func (n *tpNode) fromWep(iface string, f tpFrame) (uint32, []byte) {
	n.t.Helper()
	return n.run(n.o.SlFromWep, iface, false, f)
}

func (n *tpNode) toWep(iface string, f tpFrame) (uint32, []byte) {
	n.t.Helper()
	return n.run(n.o.SlToWep, iface, true, f)
}

// tpDecodeOK decodes a program's output, failing the test on a malformed frame and reporting
// every wrong checksum.
func tpDecodeOK(t *testing.T, out []byte) tpFrame {
	t.Helper()
	f, bad, err := tpDecode(out, tpVXLANPort)
	if err != nil {
		t.Fatalf("output %x: %v", out, err)
	}
	for _, b := range bad {
		t.Errorf("output %v: wrong %s", f, b)
	}
	return f
}

// tpWant checks the verdict and that the output is exactly want (built with checksums
// computed from scratch). It returns the decoded output.
func tpWant(t *testing.T, rc uint32, out []byte, wantRC uint32, want tpFrame) tpFrame {
	t.Helper()
	if rc != wantRC {
		t.Errorf("verdict %d, want %d", rc, wantRC)
	}
	got := tpDecodeOK(t, out)
	tpSame(t, out, want)
	return got
}

// tpSame reports the difference when out is not exactly want.
func tpSame(t *testing.T, out []byte, want tpFrame) {
	t.Helper()
	w := want.build()
	if bytes.Equal(out, w) {
		return
	}
	got, _, _ := tpDecode(out, tpVXLANPort)
	wf, _, _ := tpDecode(w, tpVXLANPort)
	t.Errorf("output differs\n got %v\nwant %v\n got %x\nwant %x", got, wf, out, w)
}

// tpWantVerdict checks a verdict that returns no packet of interest (a drop, or a packet
// passed on unchanged).
func tpWantVerdict(t *testing.T, rc uint32, wantRC uint32) {
	t.Helper()
	if rc != wantRC {
		t.Errorf("verdict %d, want %d", rc, wantRC)
	}
}

// tpNAT returns f with the given changes (zero values leave a field alone).
func tpNAT(f tpFrame, srcMAC, dstMAC tpMAC, src, dst netip.AddrPort) tpFrame {
	c := f.clone()
	if srcMAC != tpZeroMAC {
		c.Src = srcMAC
	}
	if dstMAC != tpZeroMAC {
		c.Dst = dstMAC
	}
	if src.IsValid() {
		c.IP.Src = src.Addr()
		c.setPorts(src.Port(), 0)
	}
	if dst.IsValid() {
		c.IP.Dst = dst.Addr()
		c.setPorts(0, dst.Port())
	}
	return c
}

func (f *tpFrame) setPorts(sport, dport uint16) {
	switch f.IP.Proto {
	case tpProtoTCP:
		if sport != 0 {
			f.TCP.Sport = sport
		}
		if dport != 0 {
			f.TCP.Dport = dport
		}
	case tpProtoUDP:
		if sport != 0 {
			f.UDP.Sport = sport
		}
		if dport != 0 {
			f.UDP.Dport = dport
		}
	}
}

// tpUnwrapped is a frame as the tunnel carries it: the inner Ethernet header is empty.
func tpUnwrapped(f tpFrame) tpFrame {
	c := f.clone()
	c.Src, c.Dst = tpZeroMAC, tpZeroMAC
	return c
}

// tpWantVXLAN checks a redirected VXLAN output from node src to node dst (our VNI and port,
// UDP checksum 0, an outer source port of 49152-65535) carrying exactly innerWant, except
// that with psnat the inner source port is the one chosen from the node-port range (without,
// the client's own port is kept). It returns the outer source port and the inner one.
func tpWantVXLAN(t *testing.T, rc uint32, out []byte, srcMAC, dstMAC tpMAC, src, dst netip.Addr, innerWant tpFrame, psnat bool) (outerSport, innerSport uint16) {
	t.Helper()
	if rc != tpRedirect {
		t.Errorf("verdict %d, want %d (redirect)", rc, tpRedirect)
	}
	got := tpDecodeOK(t, out)
	if got.Inner == nil {
		t.Fatalf("output is not VXLAN: %v", got)
	}
	outerSport = got.UDP.Sport
	if outerSport < 0xc000 {
		t.Errorf("outer UDP source port %d, want one of 49152-65535", outerSport)
	}
	innerWant = innerWant.clone()
	innerSport = got.Inner.TCP.Sport
	if got.Inner.IP.Proto == tpProtoUDP {
		innerSport = got.Inner.UDP.Sport
	}
	if psnat {
		if innerSport < tpPsnatMin || innerSport > tpPsnatMax {
			t.Errorf("inner source port %d, want one of the node-port range %d-%d", innerSport, tpPsnatMin, tpPsnatMax)
		}
		innerWant.setPorts(innerSport, 0)
	}
	tpSame(t, out, tpVXLANFrame(srcMAC, dstMAC, src, dst, outerSport, tpVXLANPort, tpVNI, innerWant))
	return outerSport, innerSport
}

// tpICMPError is the ICMP destination-unreachable error the programs send for orig (a frame
// as received), out of the interface it came in on. It quotes the IP header and 28 bytes
// beyond when the packet has them, else 20 (TCP) or 8 (UDP).
func tpICMPError(orig tpFrame, code uint8, mtu uint16) tpFrame {
	b := orig.build()
	return tpFrame{Dst: orig.Src, Src: orig.Dst,
		IP:      tpIPv4{TTL: 64, Proto: tpProtoICMP, Src: orig.IP.Dst, Dst: orig.IP.Src},
		ICMP:    tpICMP{Type: 3, Code: code, Rest: uint32(mtu)},
		Payload: b[14 : 14+tpQuoteLen(b)]}
}

func tpQuoteLen(b []byte) int {
	switch {
	case len(b) >= 14+48:
		return 48
	case b[14+9] == tpProtoTCP:
		return 40
	}
	return 28
}

// TestProgHeaderConstants checks the tests' copies of c/sluice.h's flags and counters against
// the header (its #define values and the order of enum counter).
func TestProgHeaderConstants(t *testing.T) {
	src, err := os.ReadFile("c/sluice.h")
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]int{}
	re := regexp.MustCompile(`(?m)^#define (\w+)\s+\(?(\d+)(?:\s*<<\s*(\d+))?\)?`)
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		v, _ := strconv.Atoi(m[2])
		if m[3] != "" {
			s, _ := strconv.Atoi(m[3])
			v <<= s
		}
		defines[m[1]] = v
	}
	for name, v := range map[string]int{"FE_EXT_LOCAL": tpFeExtLocal, "FE_INT_LOCAL": tpFeIntLocal,
		"FE_SRC_RANGES": tpFeSrcRanges, "FE_ADDR_ONLY": tpFeAddrOnly, "FE_NODE_PORT": tpFeNodePort,
		"BE_LOCAL": tpBeLocal, "BE_ROUTED": tpBeRouted, "CNET_POOL": tpCnetPool, "CNET_HOST": tpCnetHost, "CNET_SELF": tpCnetSelf,
		"CT_FWD": tpCtFwd, "CT_REV": tpCtRev, "CT_TUN": tpCtTun, "CT_F_REMOTE": tpCtRemote,
		"CT_F_REDIRECT": tpCtRedirect, "CT_F_PSNAT": tpCtPsnat, "CT_F_LOCAL": tpCtLocal, "TCP_SYN": tpTCPSyn, "TCP_REPLIED": tpTCPReplied,
		"TCP_FIN_FWD": tpTCPFinFwd, "TCP_FIN_REV": tpTCPFinRev, "TCP_RST": tpTCPRst,
		"TCP_LIVE_FWD": tpTCPLiveFwd, "TCP_LIVE_REV": tpTCPLiveRev, "TCP_OPENING": TCPOpening, "AFF_SCAN": AffinityScan} {
		if got, ok := defines[name]; !ok || got != v {
			t.Errorf("%s: header says %d (found %v), the driver uses %d", name, got, ok, v)
		}
	}
	if m := regexp.MustCompile(`(?m)^#define HAIRPIN_ADDR\s+0x([0-9a-fA-F]{8})\b`).FindStringSubmatch(string(src)); m == nil {
		t.Error("no HAIRPIN_ADDR 0x........ in c/sluice.h")
	} else if v, _ := strconv.ParseUint(m[1], 16, 32); netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}) != netip.MustParseAddr(HairpinAddr) {
		t.Errorf("HAIRPIN_ADDR is 0x%s, the driver's HairpinAddr %s", m[1], HairpinAddr)
	}
	enum := regexp.MustCompile(`(?s)enum counter \{(.*?)\};`).FindStringSubmatch(string(src))
	if enum == nil {
		t.Fatal("no enum counter in c/sluice.h")
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s*(C_\w+)`).FindAllStringSubmatch(enum[1], -1) {
		names = append(names, m[1])
	}
	if want := append(append([]string{}, tpCounterNames...), "C_NUM"); strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("enum counter is\n%v\nthe tests use\n%v", names, want)
	}
	if len(CounterNames) != len(names)-1 {
		t.Errorf("the driver names %d counters, the header has %d", len(CounterNames), len(names)-1)
	}
	if n := binary.Size(tpSkb{}); n != 192 {
		t.Errorf("tpSkb is %d bytes, struct __sk_buff 192", n)
	}
}

// TestProgPacketBuilder checks the test's own packet code: a known IPv4 header checksum, and
// that decoding what was built gives the same frame back with every checksum right.
func TestProgPacketBuilder(t *testing.T) {
	hdr := []byte{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7}
	if c := tpChecksum(hdr); c != 0xb861 {
		t.Errorf("checksum of the RFC 1071 example header %#04x, want 0xb861", c)
	}
	syn := tpTCPFrame(tpMACEdge, tpMACA1, tpAP("203.0.113.10:40000"), tpAP("198.51.100.1:30080"), tpSYN, 1000, 0, []byte("hello"))
	syn.TCP.Options = []byte{2, 4, 5, 0xb4}
	udp := tpUDPFrame(tpMACPodA7, tpMACWepA1, tpAP("10.65.0.7:5353"), tpAP("10.96.0.10:53"), []byte("query"))
	vx := tpVXLANFrame(tpMACA0, tpMACB0, tpNodeA, tpNodeB, 0xc123, tpVXLANPort, tpVNI, tpUnwrapped(syn))
	icmp := tpICMPError(syn, 4, tpMTU)
	for name, f := range map[string]tpFrame{"tcp": syn, "udp": udp, "vxlan": vx, "icmp": icmp} {
		b := f.build()
		got, bad, err := tpDecode(b, tpVXLANPort)
		if err != nil || len(bad) > 0 {
			t.Errorf("%s: decoding: %v %v", name, err, bad)
			continue
		}
		if !bytes.Equal(got.build(), b) {
			t.Errorf("%s: decoded %v, built %v", name, got, f)
		}
		b[len(b)-1] ^= 0xff
		if _, bad, _ := tpDecode(b, tpVXLANPort); len(bad) != 1 {
			t.Errorf("%s: a changed last byte gives checksum errors %v, want one", name, bad)
		}
	}
}

// Case 1: a node port reached from outside, backend on this node.
func TestProgNodePortLocalBackend(t *testing.T) {
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	a.frontend(netip.IPv4Unspecified(), 30080, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeNodePort})
	a.backends(1, tpBackend(tpAP("10.65.0.5:8080"), tpNodeA, true))
	client := netip.AddrPortFrom(tpClient, 40000)
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	pod := netip.AddrPortFrom(tpPodA5, 8080)

	// The SYN comes in by nic1 and is sent on to the pod with the client's address kept.
	syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
	syn.TCP.Options = []byte{2, 4, 5, 0xb4} // MSS 1460
	rc, out := a.fromHost("nic1", syn)
	tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	a.wantCT(tpKey(client, front, tpProtoTCP), sluiceCtValV4{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tpA(tpPodA5), NatPort: tpP(8080), NatSport: tpP(40000)})
	a.wantCT(tpKey(pod, client, tpProtoTCP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtRedirect | tpCtLocal, Tcp: tpTCPSyn,
		Ifindex: uint32(a.ifindex["nic1"]), NatAddr: tpA(tpEdgeA), NatPort: tpP(30080), NatSport: tpP(40000),
		MacLocal: tpMACA1, MacPeer: tpMACEdge})

	// The pod's answer leaves from the node port, by nic1 to the edge router that brought the
	// request (the FIB would have chosen nic0's default route).
	synack := tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, client, tpSYN|tpACK, 5000, 1001, nil)
	rc, out = a.fromWep("wep0", synack)
	tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACA1, tpMACEdge, front, netip.AddrPort{}))
	rev := a.wantCT(tpKey(pod, client, tpProtoTCP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtRedirect | tpCtLocal, Tcp: tpTCPSyn | tpTCPReplied | tpTCPOpening,
		Ifindex: uint32(a.ifindex["nic1"]), NatAddr: tpA(tpEdgeA), NatPort: tpP(30080), NatSport: tpP(40000),
		MacLocal: tpMACA1, MacPeer: tpMACEdge})

	// The rest of the flow follows conntrack, refreshing the pair's state.
	ack := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpACK|tpPSH, 1001, 5001, []byte("GET / HTTP/1.0\r\n\r\n"))
	rc, out = a.fromHost("nic1", ack)
	tpWant(t, rc, out, tpRedirect, tpNAT(ack, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	if v, _ := a.ct(tpKey(pod, client, tpProtoTCP)); v.LastSeen <= rev.LastSeen || v.Tcp != tpTCPSyn|tpTCPReplied {
		t.Errorf("the client's ACK did not refresh the flow or make it established: last seen %d, was %d; state %#x", v.LastSeen, rev.LastSeen, v.Tcp)
	}
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
	if n := a.ctLen(); n != 2 {
		t.Errorf("%d conntrack entries, want 2", n)
	}

	// The wildcard serves this node's addresses: also one the programs learn from the FIB
	// only; not an address of another host.
	other := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.2"), 30080)
	syn = tpTCPFrame(tpMACEdge, tpMACA1, netip.AddrPortFrom(tpClient, 40001), other, tpSYN, 1000, 0, nil)
	rc, out = a.fromHost("nic1", syn)
	tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
	notOurs := tpTCPFrame(tpMACEdge, tpMACA1, netip.AddrPortFrom(tpClient, 40002), tpAP("198.51.100.50:30080"), tpSYN, 1000, 0, nil)
	rc, out = a.fromHost("nic1", notOurs)
	tpWant(t, rc, out, tpOK, notOurs)
	a.wantCounters(map[int]uint64{tpCNatNew: 2, tpCRevNat: 1})
}

// Case 2: a cluster IP used by a workload.
func TestProgClusterIPFromWorkload(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.10")
	client := netip.AddrPortFrom(tpPodA7, 33333)
	setup := func(t *testing.T) *tpNode {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
		a.frontend(vip, 53, tpProtoUDP, sluiceFeVal{ListId: 2, SvcId: 1, Count: 1, Local: 1})
		a.frontend(vip, 0, 0, sluiceFeVal{SvcId: 1, Flags: tpFeAddrOnly})
		a.backends(1, tpBackend(tpAP("10.65.0.5:8080"), tpNodeA, true))
		a.backends(2, tpBackend(tpAP("10.65.0.5:5353"), tpNodeA, true))
		return a
	}

	t.Run("backend pod", func(t *testing.T) {
		a := setup(t)
		front := netip.AddrPortFrom(vip, 80)
		pod := netip.AddrPortFrom(tpPodA5, 8080)
		syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpSYN, 7000, 0, nil)
		rc, out := a.fromWep("wep1", syn)
		tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, pod))
		a.wantCT(tpKey(client, front, tpProtoTCP), sluiceCtValV4{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tpA(tpPodA5), NatPort: tpP(8080), NatSport: tpP(33333)})
		a.wantCT(tpKey(pod, client, tpProtoTCP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPSyn, NatAddr: tpA(vip), NatPort: tpP(80), NatSport: tpP(33333)})
		// The backend's answer is translated back as it leaves the backend's interface and
		// sent straight to the client's interface through the FIB.
		synack := tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, client, tpSYN|tpACK, 9000, 7001, nil)
		rc, out = a.fromWep("wep0", synack)
		tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACWepA1, tpMACPodA7, front, netip.AddrPort{}))
		// UDP the same way.
		dns := netip.AddrPortFrom(vip, 53)
		q := tpUDPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, 40053), dns, []byte("query"))
		rc, out = a.fromWep("wep1", q)
		tpWant(t, rc, out, tpRedirect, tpNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, netip.AddrPortFrom(tpPodA5, 5353)))
		r := tpUDPFrame(tpMACPodA5, tpMACWepA0, netip.AddrPortFrom(tpPodA5, 5353), netip.AddrPortFrom(tpPodA7, 40053), []byte("answer"))
		rc, out = a.fromWep("wep0", r)
		tpWant(t, rc, out, tpRedirect, tpNAT(r, tpMACWepA1, tpMACPodA7, dns, netip.AddrPort{}))
		// A UDP datagram without checksum keeps none.
		q.UDP.ZeroCheck = true
		q.UDP.Sport = 40054
		rc, out = a.fromWep("wep1", q)
		tpWant(t, rc, out, tpRedirect, tpNAT(q, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, netip.AddrPortFrom(tpPodA5, 5353)))
		a.wantCounters(map[int]uint64{tpCNatNew: 3, tpCRevNat: 2})
	})

	t.Run("reply through sl_to_wep", func(t *testing.T) {
		// A host-networked backend (this node's own address) answers from the host: the
		// reply reaches the client only through sl_to_wep.
		a := setup(t)
		api := netip.MustParseAddr("10.96.0.1")
		a.frontend(api, 443, tpProtoTCP, sluiceFeVal{ListId: 3, SvcId: 2, Count: 1, Local: 1})
		a.backends(3, tpBackend(netip.AddrPortFrom(tpNodeA, 6443), tpNodeA, true))
		front := netip.AddrPortFrom(api, 443)
		host := netip.AddrPortFrom(tpNodeA, 6443)
		syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpSYN, 7000, 0, nil)
		rc, out := a.fromWep("wep1", syn)
		tpWant(t, rc, out, tpOK, tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, host))
		synack := tpTCPFrame(tpMACWepA1, tpMACPodA7, host, client, tpSYN|tpACK, 9000, 7001, nil)
		rc, out = a.toWep("wep1", synack)
		tpWant(t, rc, out, tpOK, tpNAT(synack, tpZeroMAC, tpZeroMAC, front, netip.AddrPort{}))
		a.wantCT(tpKey(host, client, tpProtoTCP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPSyn | tpTCPReplied | tpTCPOpening, NatAddr: tpA(api), NatPort: tpP(443), NatSport: tpP(33333)})
		// Traffic that is no reply passes untouched.
		other := tpTCPFrame(tpMACWepA1, tpMACPodA7, netip.AddrPortFrom(tpNodeA, 22), client, tpACK, 1, 1, nil)
		rc, out = a.toWep("wep1", other)
		tpWant(t, rc, out, tpOK, other)
		a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCRevNat: 1})
	})

	t.Run("unknown TCP port", func(t *testing.T) {
		a := setup(t)
		front := netip.AddrPortFrom(vip, 81)
		// A SYN: RST+ACK acknowledging it, sequence number 0.
		syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpSYN, 7000, 0, nil)
		syn.TCP.Options = []byte{2, 4, 5, 0xb4}
		rc, out := a.fromWep("wep1", syn)
		tpWant(t, rc, out, tpRedirect, tpFrame{Dst: tpMACPodA7, Src: tpMACWepA1,
			IP:  tpIPv4{TTL: 64, Proto: tpProtoTCP, Src: vip, Dst: tpPodA7},
			TCP: tpTCP{Sport: 81, Dport: 33333, Seq: 0, Ack: 7001, Flags: tpRST | tpACK}})
		// A segment with ACK and data: RST with the acknowledged number as its sequence.
		data := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpACK|tpPSH, 8000, 9000, make([]byte, 100))
		rc, out = a.fromWep("wep1", data)
		tpWant(t, rc, out, tpRedirect, tpFrame{Dst: tpMACPodA7, Src: tpMACWepA1,
			IP:  tpIPv4{TTL: 64, Proto: tpProtoTCP, Src: vip, Dst: tpPodA7},
			TCP: tpTCP{Sport: 81, Dport: 33333, Seq: 9000, Flags: tpRST}})
		// A FIN without ACK counts one sequence number, as a SYN does.
		fin := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpFIN, 8000, 0, make([]byte, 10))
		rc, out = a.fromWep("wep1", fin)
		tpWant(t, rc, out, tpRedirect, tpFrame{Dst: tpMACPodA7, Src: tpMACWepA1,
			IP:  tpIPv4{TTL: 64, Proto: tpProtoTCP, Src: vip, Dst: tpPodA7},
			TCP: tpTCP{Sport: 81, Dport: 33333, Ack: 8011, Flags: tpRST | tpACK}})
		// A reset is never answered.
		rst := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpRST, 8000, 0, nil)
		rc, _ = a.fromWep("wep1", rst)
		tpWantVerdict(t, rc, tpShot)
		a.wantCounters(map[int]uint64{tpCRejectPort: 4})
		if n := a.ctLen(); n != 0 {
			t.Errorf("%d conntrack entries for rejected packets", n)
		}
	})

	t.Run("unknown UDP port", func(t *testing.T) {
		a := setup(t)
		q := tpUDPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, 40053), netip.AddrPortFrom(vip, 54), make([]byte, 32))
		rc, out := a.fromWep("wep1", q)
		got := tpWant(t, rc, out, tpRedirect, tpICMPError(q, 3, 0))
		// The quote is the datagram's IP header and UDP header as sent.
		if b := q.build(); !bytes.Equal(got.Payload, b[14:14+tpQuoteLen(b)]) {
			t.Errorf("quoted %x", got.Payload)
		}
		a.wantCounters(map[int]uint64{tpCRejectPort: 1})
	})

	t.Run("no backend", func(t *testing.T) {
		a := setup(t)
		empty := netip.MustParseAddr("10.96.0.11")
		a.frontend(empty, 80, tpProtoTCP, sluiceFeVal{ListId: 4, SvcId: 3})
		a.frontend(empty, 53, tpProtoUDP, sluiceFeVal{ListId: 4, SvcId: 3})
		syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, netip.AddrPortFrom(empty, 80), tpSYN, 7000, 0, nil)
		rc, out := a.fromWep("wep1", syn)
		tpWant(t, rc, out, tpRedirect, tpFrame{Dst: tpMACPodA7, Src: tpMACWepA1,
			IP:  tpIPv4{TTL: 64, Proto: tpProtoTCP, Src: empty, Dst: tpPodA7},
			TCP: tpTCP{Sport: 80, Dport: 33333, Ack: 7001, Flags: tpRST | tpACK}})
		q := tpUDPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, 40053), netip.AddrPortFrom(empty, 53), []byte("query"))
		rc, out = a.fromWep("wep1", q)
		tpWant(t, rc, out, tpRedirect, tpICMPError(q, 3, 0))
		a.wantCounters(map[int]uint64{tpCRejectNoBackend: 2})
	})
}

// tpRemoteNodePort sets up node A with node port 30080 whose one backend is pod 10.65.1.5 on
// node B, and node B.
func tpRemoteNodePort(t *testing.T) (a, b *tpNode) {
	w := tpNewWorld(t)
	a = w.node("node-a", tpNodeA, tpNodeASpec())
	b = w.node("node-b", tpNodeB, tpNodeBSpec())
	for _, proto := range []uint8{tpProtoTCP, tpProtoUDP} {
		a.frontend(netip.IPv4Unspecified(), 30080, proto, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Flags: tpFeNodePort})
	}
	a.backends(1, tpBackend(netip.AddrPortFrom(tpPodB5, 8080), tpNodeB, false))
	return a, b
}

// Case 3: a node port whose backend is on another node, there and back.
func TestProgNodePortRemoteBackend(t *testing.T) {
	a, b := tpRemoteNodePort(t)
	client := netip.AddrPortFrom(tpClient, 40000)
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	pod := netip.AddrPortFrom(tpPodB5, 8080)

	// Node A: the SYN from nic1 is translated to the pod (client address and port kept)
	// and tunnelled to node B by nic0.
	syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
	rc, out := a.fromHost("nic1", syn)
	outer, port := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
	mid := netip.AddrPortFrom(tpClient, port) // the client as node B sees it
	a.wantCT(tpKey(client, front, tpProtoTCP), sluiceCtValV4{Type: tpCtFwd, Flags: tpCtRemote,
		NatAddr: tpA(tpPodB5), TunAddr: tpA(tpNodeB), NatPort: tpP(8080), NatSport: tpP(port)})
	revWant := sluiceCtValV4{Type: tpCtRev, Flags: tpCtRemote | tpCtRedirect, Tcp: tpTCPSyn,
		Ifindex: uint32(a.ifindex["nic1"]), NatAddr: tpA(tpEdgeA), TunAddr: tpA(tpNodeB), NatPort: tpP(30080),
		NatSport: tpP(40000), MacLocal: tpMACA1, MacPeer: tpMACEdge}
	a.wantCT(tpKey(pod, mid, tpProtoTCP), revWant)
	tunnelled := out

	// Node B: unwrapped and delivered to the pod as it is; the ingress node is remembered.
	rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, tunnelled)
	inner := tpNAT(syn, tpMACWepB0, tpMACPodB5, mid, pod)
	tpWant(t, rc, out, tpRedirect, inner)
	tunKey := tpKey(pod, mid, tpProtoTCP)
	b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPSyn, NatAddr: tpA(tpNodeA)})

	// Node B: the pod's answer goes back through the tunnel to node A.
	synack := tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, mid, tpSYN|tpACK, 5000, 1001, nil)
	rc, out = b.fromWep("wep0", synack)
	tpWantVXLAN(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA, tpUnwrapped(synack), false)
	b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPSyn | tpTCPReplied | tpTCPOpening, NatAddr: tpA(tpNodeA)})

	// Node A: unwrapped, translated back to the node port and the client's own port, and
	// sent by nic1 (where the request came in) to the edge router.
	rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
	tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACA1, tpMACEdge, front, client))
	revWant.Tcp |= tpTCPReplied | tpTCPOpening
	a.wantCT(tpKey(pod, mid, tpProtoTCP), revWant)

	// The client's next segment takes the same way with the same ports.
	ack := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpACK, 1001, 5001, []byte("hello"))
	rc, out = a.fromHost("nic1", ack)
	outer2, _ := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(ack, tpZeroMAC, tpZeroMAC, mid, pod)), false)
	if outer2 != outer {
		t.Errorf("outer source port changed within the flow: %d, then %d", outer, outer2)
	}
	rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
	tpWant(t, rc, out, tpRedirect, tpNAT(ack, tpMACWepB0, tpMACPodB5, mid, pod))

	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1, tpCTunIn: 1, tpCRevNat: 1})
	b.wantCounters(map[int]uint64{tpCTunIn: 2})

	// UDP the same way.
	uc := netip.AddrPortFrom(tpClient, 41000)
	q := tpUDPFrame(tpMACEdge, tpMACA1, uc, front, []byte("ping"))
	rc, out = a.fromHost("nic1", q)
	_, uport := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(q, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
	umid := netip.AddrPortFrom(tpClient, uport)
	rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
	tpWant(t, rc, out, tpRedirect, tpNAT(q, tpMACWepB0, tpMACPodB5, umid, pod))
	r := tpUDPFrame(tpMACPodB5, tpMACWepB0, pod, umid, []byte("pong"))
	rc, out = b.fromWep("wep0", r)
	tpWantVXLAN(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA, tpUnwrapped(r), false)
	rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
	tpWant(t, rc, out, tpRedirect, tpNAT(r, tpMACA1, tpMACEdge, front, uc))
}

// A cluster IP used by a workload whose backend is on another node takes the same tunnel;
// the answer, unwrapped on the client's node, is routed to the client's interface.
func TestProgClusterIPRemoteBackend(t *testing.T) {
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
	a.wantCT(tpKey(pod, mid, tpProtoTCP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtRemote, Tcp: tpTCPSyn,
		NatAddr: tpA(vip), TunAddr: tpA(tpNodeB), NatPort: tpP(80), NatSport: tpP(33333)})
	rc, out = b.runBytes(b.o.SlFromHost, "nic0", false, out)
	tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepB0, tpMACPodB5, mid, pod))
	synack := tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, mid, tpSYN|tpACK, 5000, 1001, nil)
	rc, out = b.fromWep("wep0", synack)
	tpWantVXLAN(t, rc, out, tpMACB0, tpMACA0, tpNodeB, tpNodeA, tpUnwrapped(synack), false)
	rc, out = a.runBytes(a.o.SlFromHost, "nic0", false, out)
	tpWant(t, rc, out, tpRedirect, tpNAT(synack, tpMACWepA1, tpMACPodA7, front, client))
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1, tpCTunIn: 1, tpCRevNat: 1})
	b.wantCounters(map[int]uint64{tpCTunIn: 1})
}

// Case 4: tunnel packets from addresses that are no node.
func TestProgForgedTunnel(t *testing.T) {
	a, _ := tpRemoteNodePort(t)
	client := netip.AddrPortFrom(tpClient, 40000)
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	pod := netip.AddrPortFrom(tpPodB5, 8080)
	syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
	rc, out := a.fromHost("nic1", syn)
	_, port := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
	mid := netip.AddrPortFrom(tpClient, port)
	synack := tpUnwrapped(tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, mid, tpSYN|tpACK, 5000, 1001, nil))

	// From outside the cluster, and from a pool address: dropped, whatever they carry.
	forged := tpVXLANFrame(tpMACEdge, tpMACA1, netip.MustParseAddr("198.51.100.77"), tpEdgeA, 50000, tpVXLANPort, tpVNI, synack)
	rc, _ = a.fromHost("nic1", forged)
	tpWantVerdict(t, rc, tpShot)
	forged = tpVXLANFrame(tpMACRouter, tpMACA0, netip.MustParseAddr("10.65.3.3"), tpNodeA, 50000, tpVXLANPort, 4096, synack)
	rc, _ = a.fromHost("nic0", forged)
	tpWantVerdict(t, rc, tpShot)
	// From a node that is not the backend's: a reply to the flow it cannot be.
	forged = tpVXLANFrame(tpMACC0, tpMACA0, tpNodeC, tpNodeA, 50000, tpVXLANPort, tpVNI, synack)
	rc, _ = a.fromHost("nic0", forged)
	tpWantVerdict(t, rc, tpShot)
	a.wantCT(tpKey(pod, mid, tpProtoTCP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtRemote | tpCtRedirect, Tcp: tpTCPSyn,
		Ifindex: uint32(a.ifindex["nic1"]), NatAddr: tpA(tpEdgeA), TunAddr: tpA(tpNodeB), NatPort: tpP(30080),
		NatSport: tpP(40000), MacLocal: tpMACA1, MacPeer: tpMACEdge})
	// Another VNI from a node is the overlay's, left to the kernel as it is.
	overlay := tpVXLANFrame(tpMACB0, tpMACA0, tpNodeB, tpNodeA, 50000, tpVXLANPort, 4096, synack)
	rc, out = a.fromHost("nic0", overlay)
	tpWant(t, rc, out, tpOK, overlay)
	// The real reply from node B passes.
	real := tpVXLANFrame(tpMACB0, tpMACA0, tpNodeB, tpNodeA, 50000, tpVXLANPort, tpVNI, synack)
	rc, _ = a.fromHost("nic0", real)
	tpWantVerdict(t, rc, tpRedirect)
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1, tpCDropForgedTunnel: 3, tpCTunIn: 2, tpCRevNat: 1})
}

// Case 5: two ingress nodes forward flows that meet on the backend's node as one tuple.
func TestProgTunnelCollision(t *testing.T) {
	b := tpNewWorld(t).node("node-b", tpNodeB, tpNodeBSpec())
	client := netip.AddrPortFrom(tpClient, 21000)
	pod := netip.AddrPortFrom(tpPodB5, 8080)
	tunKey := tpKey(pod, client, tpProtoTCP)
	fromA := func(f tpFrame) tpFrame {
		return tpVXLANFrame(tpMACA0, tpMACB0, tpNodeA, tpNodeB, 50001, tpVXLANPort, tpVNI, tpUnwrapped(f))
	}
	fromC := func(f tpFrame) tpFrame {
		return tpVXLANFrame(tpMACC0, tpMACB0, tpNodeC, tpNodeB, 50003, tpVXLANPort, tpVNI, tpUnwrapped(f))
	}
	seg := func(flags uint8, seq, ack uint32) tpFrame {
		return tpTCPFrame(tpZeroMAC, tpZeroMAC, client, pod, flags, seq, ack, nil)
	}
	deliver := func(f tpFrame) tpFrame { return tpNAT(f, tpMACWepB0, tpMACPodB5, netip.AddrPort{}, netip.AddrPort{}) }

	// The flow from node A is established.
	rc, out := b.fromHost("nic0", fromA(seg(tpSYN, 1, 0)))
	tpWant(t, rc, out, tpRedirect, deliver(seg(tpSYN, 1, 0)))
	rc, _ = b.fromWep("wep0", tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, client, tpSYN|tpACK, 100, 2, nil))
	tpWantVerdict(t, rc, tpRedirect)
	rc, _ = b.fromHost("nic0", fromA(seg(tpACK, 2, 101)))
	tpWantVerdict(t, rc, tpRedirect)

	// Node C's SYN and data for the same tuple are dropped; node A's flow carries on.
	rc, _ = b.fromHost("nic0", fromC(seg(tpSYN, 7, 0)))
	tpWantVerdict(t, rc, tpShot)
	rc, _ = b.fromHost("nic0", fromC(seg(tpACK, 8, 1)))
	tpWantVerdict(t, rc, tpShot)
	b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPSyn | tpTCPReplied, NatAddr: tpA(tpNodeA)})
	rc, out = b.fromHost("nic0", fromA(seg(tpACK|tpPSH, 2, 101)))
	tpWant(t, rc, out, tpRedirect, deliver(seg(tpACK|tpPSH, 2, 101)))
	rc, out = b.fromWep("wep0", tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, client, tpACK, 101, 2, nil))
	got := tpDecodeOK(t, out)
	if rc != tpRedirect || got.Inner == nil || got.IP.Dst != tpNodeA {
		t.Errorf("the pod's answer went %d %v, want tunnelled to node A", rc, got)
	}

	// Once node A's flow is reset, node C's SYN may have the tuple.
	rc, _ = b.fromHost("nic0", fromA(seg(tpRST|tpACK, 2, 101)))
	tpWantVerdict(t, rc, tpRedirect)
	rc, out = b.fromHost("nic0", fromC(seg(tpSYN, 7, 0)))
	tpWant(t, rc, out, tpRedirect, deliver(seg(tpSYN, 7, 0)))
	b.wantCT(tunKey, sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPSyn, NatAddr: tpA(tpNodeC)})

	// A flow that was never answered (its ingress node gave it up and picked another port)
	// is taken over by another node's SYN.
	c2 := netip.AddrPortFrom(tpClient, 21002)
	rc, _ = b.fromHost("nic0", fromA(tpTCPFrame(tpZeroMAC, tpZeroMAC, c2, pod, tpSYN, 1, 0, nil)))
	tpWantVerdict(t, rc, tpRedirect)
	rc, _ = b.fromHost("nic0", fromC(tpTCPFrame(tpZeroMAC, tpZeroMAC, c2, pod, tpACK, 2, 1, nil)))
	tpWantVerdict(t, rc, tpShot)
	rc, _ = b.fromHost("nic0", fromC(tpTCPFrame(tpZeroMAC, tpZeroMAC, c2, pod, tpSYN, 1, 0, nil)))
	tpWantVerdict(t, rc, tpRedirect)
	b.wantCT(tpKey(pod, c2, tpProtoTCP), sluiceCtValV4{Type: tpCtTun, Tcp: tpTCPSyn, NatAddr: tpA(tpNodeC)})

	// UDP: the first node keeps it.
	uc := netip.AddrPortFrom(tpClient, 21001)
	dns := netip.AddrPortFrom(tpPodB5, 5353)
	q := tpUDPFrame(tpZeroMAC, tpZeroMAC, uc, dns, []byte("q"))
	rc, _ = b.fromHost("nic0", fromA(q))
	tpWantVerdict(t, rc, tpRedirect)
	rc, _ = b.fromHost("nic0", fromC(q))
	tpWantVerdict(t, rc, tpShot)
	b.wantCT(tpKey(dns, uc, tpProtoUDP), sluiceCtValV4{Type: tpCtTun, NatAddr: tpA(tpNodeA)})

	b.wantCounters(map[int]uint64{tpCTunIn: 12, tpCDropCollision: 4})
}

// Case 6: packets too large for the tunnel.
func TestProgTooBigForTunnel(t *testing.T) {
	a, b := tpRemoteNodePort(t)
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	pod := netip.AddrPortFrom(tpPodB5, 8080)
	big := make([]byte, tpMTU+10-40) // an IP packet of MTU+10 bytes

	// A new flow's first packet with DF: frag-needed, and no state kept. (Without DF it is
	// cut in two: TestProgFragmentSplit.)
	c1 := netip.AddrPortFrom(tpClient, 40001)
	syn := tpTCPFrame(tpMACEdge, tpMACA1, c1, front, tpSYN, 1000, 0, big)
	rc, out := a.fromHost("nic1", syn)
	tpWant(t, rc, out, tpRedirect, tpICMPError(syn, 4, tpMTU))
	if n := a.ctLen(); n != 0 {
		t.Errorf("%d conntrack entries after refused packets", n)
	}

	// An established flow: a packet of exactly the tunnel MTU passes, one byte more gets
	// frag-needed (DF).
	c2 := netip.AddrPortFrom(tpClient, 40002)
	syn = tpTCPFrame(tpMACEdge, tpMACA1, c2, front, tpSYN, 1000, 0, nil)
	rc, out = a.fromHost("nic1", syn)
	_, port := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
	mid := netip.AddrPortFrom(tpClient, port)
	rc, _ = b.runBytes(b.o.SlFromHost, "nic0", false, out)
	tpWantVerdict(t, rc, tpRedirect)
	fits := tpTCPFrame(tpMACEdge, tpMACA1, c2, front, tpACK, 1001, 1, make([]byte, tpMTU-40))
	rc, out = a.fromHost("nic1", fits)
	tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(fits, tpZeroMAC, tpZeroMAC, mid, pod)), false)
	over := tpTCPFrame(tpMACEdge, tpMACA1, c2, front, tpACK, 1001, 1, make([]byte, tpMTU-39))
	rc, out = a.fromHost("nic1", over)
	tpWant(t, rc, out, tpRedirect, tpICMPError(over, 4, tpMTU))
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1, tpCICMPTooBig: 2})

	// The backend's node: a reply too large for the way back gets frag-needed from the
	// client's address to the pod.
	reply := tpTCPFrame(tpMACPodB5, tpMACWepB0, pod, mid, tpACK, 1, 1001, big)
	rc, out = b.fromWep("wep0", reply)
	tpWant(t, rc, out, tpRedirect, tpICMPError(reply, 4, tpMTU))
	b.wantCounters(map[int]uint64{tpCTunIn: 1, tpCICMPTooBig: 1})
}

// Segmented packets (GSO, or GRO's merge of received ones) are judged by their segment size,
// which the encapsulation keeps: one whose segments fit is tunnelled whole, however long, and
// whatever gso_segs says (VM tap devices leave it 0); one whose segments do not fit gets
// fragmentation-needed, however few they are.
func TestProgTooBigSegmented(t *testing.T) {
	a, b := tpRemoteNodePort(t)
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	client := netip.AddrPortFrom(tpClient, 40003)
	syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
	rc, out := a.fromHost("nic1", syn)
	tpWantVerdict(t, rc, tpRedirect)
	rc, _ = b.runBytes(b.o.SlFromHost, "nic0", false, out)
	tpWantVerdict(t, rc, tpRedirect)
	seg := func(size, segs uint32) func(*tpSkb) {
		return func(c *tpSkb) { c.GSOSize, c.GSOSegs = size, segs }
	}
	fitting := uint32(tpMTU - 40) // TCP header without options: segments of exactly the MTU
	for _, segs := range []uint32{0, 2} {
		f := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpACK, 1001, 1, make([]byte, 2*fitting))
		before := a.counter(tpCICMPTooBig)
		rc, out := a.runCtx(a.o.SlFromHost, "nic1", false, f.build(), seg(fitting, segs))
		if got, _, err := tpDecode(out, tpVXLANPort); err == nil && got.ICMP.Type != 0 {
			t.Errorf("segments of %d bytes (gso_segs %d): answered with ICMP %d/%d, want them tunnelled", fitting+40, segs, got.ICMP.Type, got.ICMP.Code)
		}
		if a.counter(tpCICMPTooBig) != before {
			t.Errorf("segments of %d bytes (gso_segs %d): fragmentation-needed counted", fitting+40, segs)
		}
		// A test run cannot set gso_type, so the kernel refuses to grow this packet
		// (counted as malformed): the encapsulation of real segmented packets is proven with
		// traffic (the lab's bulk transfers through node ports).
		tpWantVerdict(t, rc, tpShot)
	}
	for _, segs := range []uint32{0, 2} {
		f := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpACK, 1001, 1, make([]byte, 2*(fitting+1)))
		rc, out := a.runCtx(a.o.SlFromHost, "nic1", false, f.build(), seg(fitting+1, segs))
		tpWant(t, rc, out, tpRedirect, tpICMPError(f, 4, tpMTU))
	}
	// The backend's node: a host-networked endpoint's segments leaving by the host interface
	// for the tunnel; fragmentation-needed goes up to the host's own stack (not checked here:
	// a test run shows no redirect's flags; the lab's bulk transfer from node-b's host is the
	// proof).
	hostTun := tpTCPFrame(tpMACB0, tpMACRouter, netip.AddrPortFrom(tpNodeB, 8083), client, tpACK, 1, 1001, make([]byte, 2*(fitting+1)))
	b.put(b.o.SlCtV4, tpKey(netip.AddrPortFrom(tpNodeB, 8083), client, tpProtoTCP),
		sluiceCtValV4{Created: 1, LastSeen: 1, Type: tpCtTun, Tcp: tpTCPSyn | tpTCPReplied, NatAddr: tpA(tpNodeA)})
	rc, out = b.runCtx(b.o.SlToHost, "nic0", true, hostTun.build(), seg(fitting+1, 0))
	tpWant(t, rc, out, tpRedirect, tpICMPError(hostTun, 4, tpMTU))
}

// tpChosen runs n new flows (source ports base, base+1, ...) and returns how often each
// backend address was chosen: the translated destination, inside the tunnel if tunnelled.
func tpChosen(t *testing.T, n int, run func(sport uint16) (uint32, []byte), base uint16) map[netip.Addr]int {
	t.Helper()
	seen := map[netip.Addr]int{}
	for i := 0; i < n; i++ {
		rc, out := run(base + uint16(i))
		if rc != tpOK && rc != tpRedirect {
			t.Fatalf("flow %d: verdict %d", i, rc)
		}
		f := tpDecodeOK(t, out)
		if f.Inner != nil {
			f = *f.Inner
		}
		seen[f.IP.Dst]++
	}
	return seen
}

func tpAddrSet(m map[netip.Addr]int) string {
	var s []string
	for a := range m {
		s = append(s, a.String())
	}
	slices.Sort(s)
	return strings.Join(s, " ")
}

// Case 7: traffic policies and the terminating-endpoint fallback.
func TestProgTrafficPolicy(t *testing.T) {
	outside := func(a *tpNode, port uint16) func(uint16) (uint32, []byte) {
		return func(sport uint16) (uint32, []byte) {
			return a.fromHost("nic1", tpTCPFrame(tpMACEdge, tpMACA1, netip.AddrPortFrom(tpClient, sport), netip.AddrPortFrom(tpEdgeA, port), tpSYN, 1, 0, nil))
		}
	}
	// A pod of another node (a pool address) reaching the node port by the node network.
	pool := netip.MustParseAddr("10.65.2.9")
	inside := func(a *tpNode, port uint16) func(uint16) (uint32, []byte) {
		return func(sport uint16) (uint32, []byte) {
			return a.fromHost("nic0", tpTCPFrame(tpMACRouter, tpMACA0, netip.AddrPortFrom(pool, sport), netip.AddrPortFrom(tpNodeA, port), tpSYN, 1, 0, nil))
		}
	}
	workload := func(a *tpNode, vip netip.Addr) func(uint16) (uint32, []byte) {
		return func(sport uint16) (uint32, []byte) {
			return a.fromWep("wep1", tpTCPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, sport), netip.AddrPortFrom(vip, 80), tpSYN, 1, 0, nil))
		}
	}

	t.Run("external local without local endpoint", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		a.frontend(netip.IPv4Unspecified(), 30081, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Flags: tpFeNodePort | tpFeExtLocal})
		a.backends(1, tpBackend(netip.AddrPortFrom(tpPodB5, 8080), tpNodeB, false))
		rc, _ := outside(a, 30081)(40000)
		tpWantVerdict(t, rc, tpShot)
		a.wantCounters(map[int]uint64{tpCDropNoLocal: 1})
		// From inside the cluster the policy is Cluster: a pool address, a node's address.
		if got := tpAddrSet(tpChosen(t, 1, inside(a, 30081), 40000)); got != "10.65.1.5" {
			t.Errorf("a pool client reached %q, want the remote endpoint", got)
		}
		node := tpTCPFrame(tpMACRouter, tpMACA0, netip.AddrPortFrom(tpNodeC, 40000), netip.AddrPortFrom(tpNodeA, 30081), tpSYN, 1, 0, nil)
		rc, out := a.fromHost("nic0", node)
		tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(node, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, netip.AddrPortFrom(tpPodB5, 8080))), false)
		a.wantCounters(map[int]uint64{tpCDropNoLocal: 1, tpCNatNew: 2, tpCNatFwdRemote: 2})
	})

	t.Run("internal local", func(t *testing.T) {
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		none := netip.MustParseAddr("10.96.0.20")
		some := netip.MustParseAddr("10.96.0.21")
		a.frontend(none, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Flags: tpFeIntLocal})
		a.backends(1, tpBackend(netip.AddrPortFrom(tpPodB5, 8080), tpNodeB, false))
		a.frontend(some, 80, tpProtoTCP, sluiceFeVal{ListId: 2, SvcId: 2, Count: 2, Local: 1, Flags: tpFeIntLocal})
		a.frontend(netip.IPv4Unspecified(), 30082, tpProtoTCP, sluiceFeVal{ListId: 2, SvcId: 2, Count: 2, Local: 1, Flags: tpFeIntLocal | tpFeNodePort})
		a.backends(2, tpBackend(netip.AddrPortFrom(tpPodA5, 8080), tpNodeA, true), tpBackend(netip.AddrPortFrom(tpPodB5, 8080), tpNodeB, false))
		rc, _ := workload(a, none)(30000)
		tpWantVerdict(t, rc, tpShot)
		a.wantCounters(map[int]uint64{tpCDropNoLocal: 1})
		if got := tpAddrSet(tpChosen(t, 64, workload(a, some), 30000)); got != "10.65.0.5" {
			t.Errorf("workloads reached %q, want only the local endpoint", got)
		}
		// The policy is for cluster traffic only: outside clients of the node port use all.
		if got := tpAddrSet(tpChosen(t, 64, outside(a, 30082), 40000)); got != "10.65.0.5 10.65.1.5" {
			t.Errorf("outside clients reached %q, want both endpoints", got)
		}
	})

	t.Run("terminating fallback", func(t *testing.T) {
		// Ordinals 0 and 1 are local endpoints that are terminating, used only by the local
		// policy (no local endpoint is ready); 2-4 are ready ones on node B, the cluster set.
		a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
		vip := netip.MustParseAddr("10.96.0.50")
		fe := sluiceFeVal{ListId: 5, SvcId: 5, Count: 5, Local: 2, ClusterStart: 2}
		a.frontend(vip, 80, tpProtoTCP, fe)
		fe.Flags = tpFeNodePort | tpFeExtLocal
		a.frontend(netip.IPv4Unspecified(), 30090, tpProtoTCP, fe)
		a.backends(5, tpBackend(netip.AddrPortFrom(tpPodA5, 8080), tpNodeA, true), tpBackend(netip.AddrPortFrom(tpPodA6, 8080), tpNodeA, true),
			tpBackend(tpAP("10.65.1.20:8080"), tpNodeB, false), tpBackend(tpAP("10.65.1.21:8080"), tpNodeB, false),
			tpBackend(tpAP("10.65.1.22:8080"), tpNodeB, false))
		cluster := "10.65.1.20 10.65.1.21 10.65.1.22"
		if got := tpAddrSet(tpChosen(t, 200, workload(a, vip), 30000)); got != cluster {
			t.Errorf("workloads reached %q, want the cluster set %q", got, cluster)
		}
		if got := tpAddrSet(tpChosen(t, 100, inside(a, 30090), 30000)); got != cluster {
			t.Errorf("cluster clients of the node port reached %q, want the cluster set %q", got, cluster)
		}
		if got := tpAddrSet(tpChosen(t, 100, outside(a, 30090), 40000)); got != "10.65.0.5 10.65.0.6" {
			t.Errorf("outside clients reached %q, want the local endpoints", got)
		}
	})
}

// Case 8: sessionAffinity ClientIP.
func TestProgSessionAffinity(t *testing.T) {
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	vip := netip.MustParseAddr("10.96.0.30")
	// A 10 s timeout: entries are aged by moving their stamp back on the monotonic clock, which
	// must be older than that (a VM that booted seconds ago: the kernel matrix).
	a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 4, Local: 4, AffinitySec: 10})
	a.backends(1, tpBackend(tpAP("10.65.0.10:8080"), tpNodeA, true), tpBackend(tpAP("10.65.0.11:8080"), tpNodeA, true),
		tpBackend(tpAP("10.65.0.12:8080"), tpNodeA, true), tpBackend(tpAP("10.65.0.13:8080"), tpNodeA, true))
	flow := func(client netip.Addr) func(uint16) (uint32, []byte) {
		return func(sport uint16) (uint32, []byte) {
			return a.fromWep("wep1", tpTCPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(client, sport), netip.AddrPortFrom(vip, 80), tpSYN, 1, 0, nil))
		}
	}
	one := func(sport uint16) netip.Addr {
		for a := range tpChosen(t, 1, flow(tpPodA7), sport) {
			return a
		}
		return netip.Addr{}
	}
	affKey := sluiceAffKeyV4{FeAddr: tpA(vip), FePort: tpP(80), Proto: tpProtoTCP, Client: tpA(tpPodA7)}
	aff := func() sluiceAffValV4 {
		t.Helper()
		var v sluiceAffValV4
		if err := a.o.SlAffV4.Lookup(&affKey, &v); err != nil {
			t.Fatalf("affinity entry: %v", err)
		}
		return v
	}
	age := func(d uint64) {
		t.Helper()
		v := aff()
		if v.Seen < d {
			t.Skipf("the monotonic clock (%d ns) is younger than the affinity timeout", v.Seen)
		}
		v.Seen -= d
		if err := a.o.SlAffV4.Put(&affKey, &v); err != nil {
			t.Fatal(err)
		}
	}

	// The same client keeps its backend over many new flows.
	first := tpChosen(t, 50, flow(tpPodA7), 30000)
	if len(first) != 1 {
		t.Fatalf("one client reached %q, want one backend", tpAddrSet(first))
	}
	var chosen netip.Addr
	for a := range first {
		chosen = a
	}
	if v := aff(); v.Addr != tpA(chosen) || v.Port != tpP(8080) {
		t.Errorf("affinity entry %+v, want %v:8080", v, chosen)
	}
	// Within the timeout, however long ago: kept.
	for i := 0; i < 20; i++ {
		age(9e9)
		if got := one(31000 + uint16(i)); got != chosen {
			t.Fatalf("within the timeout the client moved from %v to %v", chosen, got)
		}
	}
	// After it: chosen afresh, and the new choice is kept.
	moved := false
	for i := 0; i < 64 && !moved; i++ {
		age(11e9)
		before := aff().Seen
		got := one(32000 + uint16(i))
		v := aff()
		if v.Addr != tpA(got) || v.Seen <= before {
			t.Fatalf("after the timeout the affinity entry is %+v for a flow to %v", v, got)
		}
		moved = got != chosen
	}
	if !moved {
		t.Errorf("after the timeout 64 new flows all went to %v", chosen)
	}
	// Different clients spread.
	spread := map[netip.Addr]int{}
	for i := 0; i < 40; i++ {
		c := netip.AddrFrom4([4]byte{10, 65, 0, byte(100 + i)})
		for a := range tpChosen(t, 1, flow(c), 30000) {
			spread[a]++
		}
	}
	if len(spread) < 2 {
		t.Errorf("40 clients all went to %q", tpAddrSet(spread))
	}
}

// Client-IP affinity holds in a list of any length (not only its first 64 entries), over a
// change of the list that keeps the endpoint, and only within the set the flow may use.
func TestProgSessionAffinityLongList(t *testing.T) {
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	vip := netip.MustParseAddr("10.96.0.31")
	// 300 endpoints: 200 addresses on this node, the rest on node-b; each its own port.
	ep := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 65, 0, byte(20 + i%200)}), uint16(8000+i))
	}
	list := func(id uint64, order []int) {
		bs := make([]sluiceBeValV4, len(order))
		for j, i := range order {
			bs[j] = tpBackend(ep(i), tpNodeA, true)
		}
		a.backends(id, bs...)
	}
	seq := func(from, to int) []int {
		var o []int
		for i := from; i < to; i++ {
			o = append(o, i)
		}
		return o
	}
	syn := func(sport uint16) tpFrame {
		return tpTCPFrame(tpMACPodA7, tpMACWepA1, netip.AddrPortFrom(tpPodA7, sport), netip.AddrPortFrom(vip, 80), tpSYN, 1, 0, nil)
	}
	reached := func(sport uint16) netip.AddrPort {
		t.Helper()
		rc, out := a.fromWep("wep1", syn(sport))
		if rc != tpOK && rc != tpRedirect {
			t.Fatalf("flow from port %d: verdict %d", sport, rc)
		}
		f := tpDecodeOK(t, out)
		return netip.AddrPortFrom(f.IP.Dst, f.TCP.Dport)
	}
	affKey := sluiceAffKeyV4{FeAddr: tpA(vip), FePort: tpP(80), Proto: tpProtoTCP, Client: tpA(tpPodA7)}
	remember := func(target netip.AddrPort) {
		t.Helper()
		var v sluiceAffValV4
		if err := a.o.SlAffV4.Lookup(&affKey, &v); err != nil {
			t.Fatalf("affinity entry: %v", err)
		}
		v.Addr, v.Port = tpA(target.Addr()), tpP(target.Port())
		a.put(a.o.SlAffV4, affKey, v)
	}

	a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 300, Local: 300, AffinitySec: 3600})
	list(1, seq(0, 300))
	reached(30000) // makes the client's affinity entry
	// The client is remembered at ordinal 250: every new flow goes there.
	target := ep(250)
	remember(target)
	for i := 0; i < 30; i++ {
		if got := reached(30001 + uint16(i)); got != target {
			t.Fatalf("flow %d went to %v; the client is remembered at %v, ordinal 250 of 300", i, got, target)
		}
	}
	// The list changes (another list ID, one more endpoint, the order reversed): still there.
	order := append(append([]int{300}, seq(200, 300)...), seq(0, 200)...)
	slices.Reverse(order[1:])
	list(2, order)
	a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 2, SvcId: 1, Count: 301, Local: 301, AffinitySec: 3600})
	for i := 0; i < 30; i++ {
		if got := reached(31000 + uint16(i)); got != target {
			t.Fatalf("after the list changed, flow %d went to %v; want %v", i, got, target)
		}
	}
	// Outside the set this flow may use (internalTrafficPolicy Local, the endpoint counted as
	// another node's): chosen afresh among the first 40, and remembered.
	a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 2, SvcId: 1, Count: 301, Local: 40, AffinitySec: 3600, Flags: tpFeIntLocal})
	got := reached(32000)
	var v sluiceAffValV4
	if err := a.o.SlAffV4.Lookup(&affKey, &v); err != nil {
		t.Fatal(err)
	}
	if got == target || v.Addr != tpA(got.Addr()) || v.Port != tpP(got.Port()) {
		t.Errorf("a flow limited to the local set went to %v (remembered %v:%d); want another endpoint, remembered", got, HostAddr(v.Addr), HostPort(v.Port))
	}
	// An endpoint that left the list: chosen afresh.
	a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 300, Local: 300, AffinitySec: 3600})
	a.put(a.o.SlBeIdxV4, sluiceBeIdxKeyV4{ListId: 1, Addr: tpA(ep(300).Addr()), Port: tpP(ep(300).Port())}, uint32(7))
	remember(ep(300)) // in list 2 only; a wrong index entry in list 1 names ordinal 7
	if got := reached(33000); got == ep(300) {
		t.Errorf("a flow went to %v, which is not in the frontend's list", got)
	}
}

// Case 9: loadBalancerSourceRanges.
func TestProgSourceRanges(t *testing.T) {
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	lb := netip.MustParseAddr("203.0.113.100")
	a.frontend(lb, 443, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1, Flags: tpFeSrcRanges})
	a.backends(1, tpBackend(netip.AddrPortFrom(tpPodA5, 8443), tpNodeA, true))
	for _, r := range []string{"203.0.113.0/28", "198.51.100.77/32"} {
		p := netip.MustParsePrefix(r)
		a.put(a.o.SlSrcV4, sluiceSrcKeyV4{Prefixlen: 64 + uint32(p.Bits()), FeAddr: tpA(lb), FePort: tpP(443), Proto: tpProtoTCP, Src: tpA(p.Addr())}, uint32(1))
	}
	front := netip.AddrPortFrom(lb, 443)
	for _, c := range []struct {
		client string
		allow  bool
	}{{"203.0.113.10", true}, {"203.0.113.15", true}, {"198.51.100.77", true},
		{"203.0.113.16", false}, {"203.0.113.200", false}, {"198.51.100.78", false}} {
		client := netip.AddrPortFrom(netip.MustParseAddr(c.client), 40000)
		syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1, 0, nil)
		rc, out := a.fromHost("nic1", syn)
		if c.allow {
			tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, netip.AddrPortFrom(tpPodA5, 8443)))
		} else {
			if rc != tpShot {
				t.Errorf("client %s: verdict %d, want a drop", c.client, rc)
			}
			a.wantNoCT(tpKey(client, front, tpProtoTCP))
		}
	}
	a.wantCounters(map[int]uint64{tpCNatNew: 3, tpCDropSrcRange: 3})
}

// Case 10: the conntrack cleaner deletes only what nothing refreshed since it was judged.
func TestProgConntrackCleaner(t *testing.T) {
	if err := haveSyscallPrograms(); err != nil {
		t.Skipf("no syscall programs (before Linux 5.14): sluice cleans from user space there (TestStageConntrackCleanup/user-space): %v", err)
	}
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	vip := netip.MustParseAddr("10.96.0.10")
	front := netip.AddrPortFrom(vip, 80)
	pod := netip.AddrPortFrom(tpPodA5, 8080)
	a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
	a.backends(1, tpBackend(pod, tpNodeA, true))
	open := func(sport uint16) (fwd, rev sluiceCtKeyV4) {
		c := netip.AddrPortFrom(tpPodA7, sport)
		rc, _ := a.fromWep("wep1", tpTCPFrame(tpMACPodA7, tpMACWepA1, c, front, tpSYN, 1, 0, nil))
		tpWantVerdict(t, rc, tpRedirect)
		return tpKey(c, front, tpProtoTCP), tpKey(pod, c, tpProtoTCP)
	}
	fwd1, rev1 := open(30001)
	fwd2, rev2 := open(30002)
	fwd3, rev3 := open(30003)
	judged := func(k sluiceCtKeyV4) uint64 {
		v, ok := a.ct(k)
		if !ok {
			t.Fatalf("no entry %+v", k)
		}
		return v.LastSeen
	}
	seen1, seen2 := judged(rev1), judged(rev2)
	// Flow 2 sees traffic after it was judged.
	rc, _ := a.fromWep("wep0", tpTCPFrame(tpMACPodA5, tpMACWepA0, pod, netip.AddrPortFrom(tpPodA7, 30002), tpSYN|tpACK, 1, 2, nil))
	tpWantVerdict(t, rc, tpRedirect)
	if judged(rev2) == seen2 {
		t.Fatal("the reply did not refresh the flow")
	}
	// A tunnel entry has no pair.
	tun := sluiceCtKeyV4{Src: tpA(tpPodA6), Dst: tpA(tpClient), Sport: tpP(8080), Dport: tpP(20001), Proto: tpProtoTCP}
	a.put(a.o.SlCtV4, tun, sluiceCtValV4{Created: 1000, LastSeen: 5000, Type: tpCtTun, NatAddr: tpA(tpNodeB)})

	var q sluiceCtCleanCtxV4
	q.N = 4
	q.Req[0].Key, q.Req[0].Pair, q.Req[0].Seen = rev1, fwd1, seen1
	q.Req[1].Key, q.Req[1].Pair, q.Req[1].Seen = rev2, fwd2, seen2
	q.Req[2].Key, q.Req[2].Seen = tun, 5000
	q.Req[3].Key, q.Req[3].Pair, q.Req[3].Seen = tpKey(pod, netip.AddrPortFrom(tpPodA7, 39999), tpProtoTCP), fwd3, 1 // gone already
	q.Req[4].Key, q.Req[4].Pair, q.Req[4].Seen = rev3, fwd3, judged(rev3)                                            // beyond n
	a.put(a.o.SlCtCleanq, uint32(0), q)
	rc, err := a.o.SlCtClean.Run(&ebpf.RunOptions{})
	if err != nil || rc != 0 {
		t.Fatalf("cleaner: %d, %v", rc, err)
	}
	var res sluiceCtCleanCtxV4
	if err := a.o.SlCtCleanq.Lookup(uint32(0), &res); err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 2 || res.Kept != 1 {
		t.Errorf("cleaner deleted %d and kept %d, want 2 and 1", res.Deleted, res.Kept)
	}
	a.wantNoCT(rev1)
	a.wantNoCT(fwd1)
	a.wantNoCT(tun)
	for _, k := range []sluiceCtKeyV4{rev2, fwd2, rev3, fwd3} {
		if _, ok := a.ct(k); !ok {
			t.Errorf("entry %+v was deleted", k)
		}
	}
	if n := a.ctLen(); n != 4 {
		t.Errorf("%d conntrack entries left, want 4", n)
	}
}

// Case 11: a SYN on the tuple of a closed flow starts a new one.
func TestProgClosedTupleReuse(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.40")
	front := netip.AddrPortFrom(vip, 80)
	client := netip.AddrPortFrom(tpPodA7, 33333)
	x := netip.AddrPortFrom(tpPodA5, 8080)
	y := netip.AddrPortFrom(tpPodA6, 8080)
	for _, close := range []struct {
		name  string
		flags [2]uint8 // the client's and the backend's closing segments (0: none)
	}{{"client RST", [2]uint8{tpRST | tpACK, 0}}, {"backend RST", [2]uint8{0, tpRST | tpACK}}, {"FIN both ways", [2]uint8{tpFIN | tpACK, tpFIN | tpACK}}} {
		t.Run(close.name, func(t *testing.T) {
			a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
			a.frontend(vip, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
			a.backends(1, tpBackend(x, tpNodeA, true))
			toX, fromX := tpPodA7ToPodA5(t, a, client, front, x)
			toX(tpSYN)
			fromX(tpSYN | tpACK)
			toX(tpACK)
			// The service now has another endpoint only; the live flow keeps its own, even
			// for a SYN.
			a.backends(1, tpBackend(y, tpNodeA, true))
			toX(tpSYN)
			if f := close.flags[0]; f != 0 {
				toX(f)
			}
			if f := close.flags[1]; f != 0 {
				fromX(f)
			}
			v, _ := a.ct(tpKey(x, client, tpProtoTCP))
			if v.Tcp&tpTCPRst == 0 && v.Tcp&(tpTCPFinFwd|tpTCPFinRev) != tpTCPFinFwd|tpTCPFinRev {
				t.Fatalf("flow not closed: tcp state %#x", v.Tcp)
			}
			// A SYN on the closed tuple: the new endpoint, fresh state.
			syn := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, tpSYN, 500, 0, nil)
			rc, out := a.fromWep("wep1", syn)
			tpWant(t, rc, out, tpRedirect, tpNAT(syn, tpMACWepA2, tpMACPodA6, netip.AddrPort{}, y))
			a.wantNoCT(tpKey(x, client, tpProtoTCP))
			a.wantCT(tpKey(client, front, tpProtoTCP), sluiceCtValV4{Type: tpCtFwd, Flags: tpCtLocal, NatAddr: tpA(tpPodA6), NatPort: tpP(8080), NatSport: tpP(33333)})
			a.wantCT(tpKey(y, client, tpProtoTCP), sluiceCtValV4{Type: tpCtRev, Flags: tpCtLocal, Tcp: tpTCPSyn, NatAddr: tpA(vip), NatPort: tpP(80), NatSport: tpP(33333)})
			if n := a.ctLen(); n != 2 {
				t.Errorf("%d conntrack entries, want 2", n)
			}
		})
	}
}

// One client ip:port reaching two frontends that share a backend (Cilium #11810): the
// backend-side tuple is the same, so the second flow gets a source port of its own from the
// range, both flows stay live with entries of their own, and each reply goes back as its
// own frontend.
func TestProgSharedBackendTuple(t *testing.T) {
	vip1, vip2 := netip.MustParseAddr("10.96.0.41"), netip.MustParseAddr("10.96.0.42")
	client := netip.AddrPortFrom(tpPodA7, 34000)
	x := netip.AddrPortFrom(tpPodA5, 8080)
	a := tpNewWorld(t).node("node-a", tpNodeA, tpNodeASpec())
	a.frontend(vip1, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1})
	a.frontend(vip2, 80, tpProtoTCP, sluiceFeVal{ListId: 1, SvcId: 2, Count: 1, Local: 1})
	a.backends(1, tpBackend(x, tpNodeA, true))
	f1 := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, netip.AddrPortFrom(vip1, 80), tpSYN, 1, 0, nil)
	rc, out := a.fromWep("wep1", f1)
	tpWant(t, rc, out, tpRedirect, tpNAT(f1, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, x))
	f2 := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, netip.AddrPortFrom(vip2, 80), tpSYN, 1, 0, nil)
	rc, _ = a.fromWep("wep1", f2)
	if rc != tpRedirect {
		t.Fatalf("second flow: verdict %d, want %d", rc, tpRedirect)
	}
	fwd2, ok := a.ct(tpKey(client, netip.AddrPortFrom(vip2, 80), tpProtoTCP))
	if !ok || fwd2.Flags&tpCtPsnat == 0 {
		t.Fatalf("second flow's forward entry %+v (found %v): want a source port of its own", fwd2, ok)
	}
	sport := HostPort(fwd2.NatSport)
	if sport < tpPsnatMin || sport > tpPsnatMax {
		t.Fatalf("second flow's source port %d, want one of %d-%d", sport, tpPsnatMin, tpPsnatMax)
	}
	// Both reverse entries are there, each naming its own frontend.
	r1, ok1 := a.ct(tpKey(x, client, tpProtoTCP))
	r2, ok2 := a.ct(tpKey(x, netip.AddrPortFrom(tpPodA7, sport), tpProtoTCP))
	if !ok1 || !ok2 || HostAddr(r1.NatAddr) != vip1 || HostAddr(r2.NatAddr) != vip2 || HostPort(r2.NatSport) != 34000 {
		t.Fatalf("reverse entries %+v (%v), %+v (%v): want one per frontend", r1, ok1, r2, ok2)
	}
	// The reply of the second flow is the second frontend's, to the client's own port.
	reply := tpTCPFrame(tpMACPodA5, tpMACWepA0, x, netip.AddrPortFrom(tpPodA7, sport), tpSYN|tpACK, 1, 2, nil)
	rc, out = a.fromWep("wep0", reply)
	tpWant(t, rc, out, tpRedirect, tpNAT(reply, tpMACWepA1, tpMACPodA7, netip.AddrPortFrom(vip2, 80), client))
}

// A SYN sent again for a forwarded flow that got no answer (dropped on the endpoint's node,
// say, by a collision with another ingress node's flow) goes with a source port of the
// node-port range, and the unanswered entries go.
func TestProgForwardedSYNRetryNewPort(t *testing.T) {
	a, _ := tpRemoteNodePort(t)
	client := netip.AddrPortFrom(tpClient, 40000)
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	pod := netip.AddrPortFrom(tpPodB5, 8080)
	syn := tpTCPFrame(tpMACEdge, tpMACA1, client, front, tpSYN, 1000, 0, nil)
	rc, out := a.fromHost("nic1", syn)
	_, first := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false)
	if first != 40000 {
		t.Fatalf("first SYN went with source port %d, want the client's own 40000", first)
	}
	rc, out = a.fromHost("nic1", syn)
	_, second := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(syn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), true)
	a.wantNoCT(tpKey(pod, client, tpProtoTCP))
	a.wantCT(tpKey(client, front, tpProtoTCP), sluiceCtValV4{Type: tpCtFwd, Flags: tpCtRemote | tpCtPsnat,
		NatAddr: tpA(tpPodB5), TunAddr: tpA(tpNodeB), NatPort: tpP(8080), NatSport: tpP(second)})

	// The same from a workload on node A.
	pc := netip.AddrPortFrom(tpPodA7, 41000)
	wsyn := tpTCPFrame(tpMACPodA7, tpMACWepA1, pc, front, tpSYN, 1000, 0, nil)
	rc, out = a.fromWep("wep1", wsyn)
	if _, p := tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(wsyn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), false); p != 41000 {
		t.Fatalf("a workload's first SYN went with source port %d, want its own 41000", p)
	}
	rc, out = a.fromWep("wep1", wsyn)
	tpWantVXLAN(t, rc, out, tpMACA0, tpMACB0, tpNodeA, tpNodeB, tpUnwrapped(tpNAT(wsyn, tpZeroMAC, tpZeroMAC, netip.AddrPort{}, pod)), true)
}

// Every answer of the FIB that stops a tunnelled packet has a counter of its own: a
// blackhole, a prohibit and an unreachable route to the endpoint's node, and a tunnel MTU the
// underlay cannot carry (the wrapped packet is larger than nic0's 1500: "fragmentation
// needed"), which was counted as "no route".
func TestProgFIBResultsNamed(t *testing.T) {
	a, _ := tpRemoteNodePort(t)
	h, err := netlink.NewHandleAt(a.ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	front := netip.AddrPortFrom(tpEdgeA, 30080)
	for i, tc := range []struct {
		node    string
		typ     int
		counter int
	}{{"192.0.2.101", unix.RTN_BLACKHOLE, tpCDropFibBlackhole}, {"192.0.2.102", unix.RTN_PROHIBIT, tpCDropFibProhibit},
		{"192.0.2.103", unix.RTN_UNREACHABLE, tpCDropFib}} {
		node := netip.MustParseAddr(tc.node)
		r := &netlink.Route{Dst: &net.IPNet{IP: node.AsSlice(), Mask: net.CIDRMask(32, 32)}, Type: tc.typ}
		if err := h.RouteAdd(r); err != nil {
			t.Fatalf("route to %s: %v", node, err)
		}
		a.backends(1, tpBackend(tpAP("10.65.1.5:8080"), node, false))
		before := a.counter(tc.counter)
		syn := tpTCPFrame(tpMACEdge, tpMACA1, netip.AddrPortFrom(tpClient, uint16(43000+i)), front, tpSYN, 1, 0, nil)
		rc, _ := a.fromHost("nic1", syn)
		tpWantVerdict(t, rc, tpShot)
		if got := a.counter(tc.counter); got != before+1 {
			t.Errorf("route type %d to the endpoint's node: counter %s went %d -> %d, want one more", tc.typ, tpCounterNames[tc.counter], before, got)
		}
	}
	// A tunnel MTU of 1500 on a 1500-byte underlay: a full packet wraps to 1550.
	a.backends(1, tpBackend(tpAP("10.65.1.5:8080"), tpNodeB, false))
	var c sluiceCfg
	if err := a.o.SlCfg.Lookup(uint32(0), &c); err != nil {
		t.Fatal(err)
	}
	c.TunnelMtu = 1500
	a.put(a.o.SlCfg, uint32(0), c)
	big := tpTCPFrame(tpMACEdge, tpMACA1, netip.AddrPortFrom(tpClient, 43010), front, tpSYN, 1, 0, make([]byte, 1460))
	rc, _ := a.fromHost("nic1", big)
	tpWantVerdict(t, rc, tpShot)
	if got := a.counter(tpCDropFibFrag); got != 1 {
		t.Errorf("a wrapped packet larger than the underlay: %s = %d, want 1 (no route: %d)", tpCounterNames[tpCDropFibFrag], got, a.counter(tpCDropFib))
	}
}

// A host socket whose ephemeral port is a node port's number (30080) talks to a server
// outside: the server's answers reach that port of the node's address. A TCP segment that is
// no SYN and belongs to no flow is such an answer, never a new client: it goes to the host's
// stack untouched, and no flow is made.
func TestProgNodePortHostSocketReply(t *testing.T) {
	a, _ := tpRemoteNodePort(t)
	server := netip.AddrPortFrom(tpClient, 443)
	for _, flags := range []uint8{tpSYN | tpACK, tpACK, tpACK | tpPSH, tpFIN | tpACK, tpRST} {
		f := tpTCPFrame(tpMACEdge, tpMACA1, server, netip.AddrPortFrom(tpEdgeA, 30080), flags, 7, 8, nil)
		rc, out := a.fromHost("nic1", f)
		tpWant(t, rc, out, tpOK, f)
	}
	if n := a.ctLen(); n != 0 {
		t.Errorf("%d conntrack entries made for answers to a host socket", n)
	}
	// A client's SYN to the same node port still starts a flow.
	syn := tpTCPFrame(tpMACEdge, tpMACA1, netip.AddrPortFrom(tpClient, 44000), netip.AddrPortFrom(tpEdgeA, 30080), tpSYN, 1, 0, nil)
	rc, _ := a.fromHost("nic1", syn)
	tpWantVerdict(t, rc, tpRedirect)
	a.wantCounters(map[int]uint64{tpCNatNew: 1, tpCNatFwdRemote: 1})
}

// tpPodA7ToPodA5 returns senders of one TCP flow of node A's workload pod A7 (client, on
// wep1) through front to pod A5 (x, on wep0): toX sends a segment of the client's, fromX one
// of the backend's; each checks the translation and the redirect to the other pod.
func tpPodA7ToPodA5(t *testing.T, a *tpNode, client, front, x netip.AddrPort) (toX, fromX func(flags uint8)) {
	toX = func(flags uint8) {
		t.Helper()
		f := tpTCPFrame(tpMACPodA7, tpMACWepA1, client, front, flags, 1, 1, nil)
		rc, out := a.fromWep("wep1", f)
		tpWant(t, rc, out, tpRedirect, tpNAT(f, tpMACWepA0, tpMACPodA5, netip.AddrPort{}, x))
	}
	fromX = func(flags uint8) {
		t.Helper()
		f := tpTCPFrame(tpMACPodA5, tpMACWepA0, x, client, flags, 1, 1, nil)
		rc, out := a.fromWep("wep0", f)
		tpWant(t, rc, out, tpRedirect, tpNAT(f, tpMACWepA1, tpMACPodA7, front, netip.AddrPort{}))
	}
	return toX, fromX
}

// tpPool holds loaded program sets for reuse by later tests, by flavour (with the IPv6
// programs or without): a load verifies every program, which takes seconds under emulation
// (the kernel matrix), and the program tests make some 150 nodes. A set is handed out emptied
// (every map entry deleted, every array zeroed), so no test sees another's state; sets are
// unpinned and go with the test process.
var tpPool = struct {
	sync.Mutex
	free map[bool][]*Objects
}{free: map[bool][]*Objects{}}

// tpTake returns an emptied program set for the test, loaded with or without the IPv6
// programs (tests of the IPv4 programs never send IPv6), and takes it back at its end.
func tpTake(t *testing.T, ipv6 bool) *Objects {
	t.Helper()
	tpPool.Lock()
	var o *Objects
	if free := tpPool.free[ipv6]; len(free) > 0 {
		o, tpPool.free[ipv6] = free[len(free)-1], free[:len(free)-1]
	}
	tpPool.Unlock()
	if o == nil {
		var err error
		o, err = load("", MapSizes{Frontends: 1024, Backends: 1024, SourceRanges: 1024, ClusterNets: 1024, Affinity: 1024, Conntrack: 8192,
			Sockets: 64}, ipv6)
		if err != nil {
			t.Fatalf("loading the programs: %v", err)
		}
	} else if err := tpEmpty(o); err != nil {
		t.Fatalf("emptying a reused program set: %v", err)
	}
	t.Cleanup(func() {
		tpPool.Lock()
		tpPool.free[ipv6] = append(tpPool.free[ipv6], o)
		tpPool.Unlock()
	})
	return o
}

// tpEmpty deletes every entry of o's maps and zeroes its arrays (the program array, which
// holds the programs, is kept).
func tpEmpty(o *Objects) error {
	maps := reflect.ValueOf(&o.sluiceMaps).Elem()
	for i := range maps.NumField() {
		m, ok := maps.Field(i).Interface().(*ebpf.Map)
		if !ok || m == nil {
			continue
		}
		switch m.Type() {
		case ebpf.ProgramArray:
			continue
		case ebpf.Array, ebpf.PerCPUArray:
			zero := make([]byte, m.ValueSize())
			var v any = zero
			if m.Type() == ebpf.PerCPUArray {
				n, err := ebpf.PossibleCPU()
				if err != nil {
					return err
				}
				per := make([][]byte, n)
				for c := range per {
					per[c] = zero
				}
				v = per
			}
			for k := uint32(0); k < m.MaxEntries(); k++ {
				if err := m.Put(k, v); err != nil {
					return fmt.Errorf("zeroing %v: %w", m, err)
				}
			}
		default:
			var keys [][]byte
			k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
			it := m.Iterate()
			for it.Next(&k, &v) {
				keys = append(keys, append([]byte(nil), k...))
			}
			if err := it.Err(); err != nil {
				return fmt.Errorf("reading %v: %w", m, err)
			}
			for _, k := range keys {
				if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return fmt.Errorf("emptying %v: %w", m, err)
				}
			}
		}
	}
	return nil
}
