package bpf

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/sluice-net/sluice/store"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The service stage's benchmarks (issue #9), each beside a reference measured in the same
// run. `make bench-services` runs them as root, each in a network namespace of its own, and
// sets SLUICE_BENCH_NETNS; elsewhere they skip.
//
// The benchmark cluster: 100 nodes, node i named node-%03d at 192.0.2.(i+1); 10,000 services,
// each a cluster IP (10.96.x.y:80) and a node port (30000+s) on this node's address and its
// wildcard, TCP, with 10 endpoints spread over the nodes (about one service in ten has one
// endpoint on this node).

const (
	benchServices  = 10_000
	benchEndpoints = 10
	benchNodes     = 100
	benchNodePort  = 30000
)

func benchGate(b *testing.B) {
	if os.Getenv("SLUICE_BENCH_NETNS") == "" || os.Geteuid() != 0 {
		b.Skip("loads eBPF programs and builds network namespaces: run through `make bench-services` (as root)")
	}
}

func benchNodeName(i int) string      { return fmt.Sprintf("node-%03d", i) }
func benchNodeAddr(i int) netip.Addr  { return netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}) }
func benchClusterIP(s int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, byte(s >> 8), byte(s)}) }

// The IPv6 side of the benchmark cluster: node i at 2001:db8::(i+1), service s's cluster IP
// fd00:96::s, its endpoints fd00:65:2::(s*10+e) on the IPv4 endpoints' nodes and ports.
func benchNodeAddr6(i int) netip.Addr    { return benchAddr6("2001:db8::", i+1) }
func benchClusterIP6(s int) netip.Addr   { return benchAddr6("fd00:96::", s) }
func benchEndpoint6(s, e int) netip.Addr { return benchAddr6("fd00:65:2::", s*benchEndpoints+e) }

func benchAddr6(prefix string, i int) netip.Addr {
	b := netip.MustParseAddr(prefix).As16()
	b[12], b[13], b[14], b[15] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
	return netip.AddrFrom16(b)
}

// bench6 is what benchUpdate adds of IPv6: every service dual-stack (all: an IPv6 cluster IP
// and node ports on this node's IPv6 address and the wildcard, 10 IPv6 endpoints), and the
// endpoints of the services special names (the traffic benchmark's).
type bench6 struct {
	all     bool
	special map[int][]benchBackend
}

// benchEndpoint is endpoint e of service s and its node: 100,000 distinct address:port pairs
// inside the pool 10.65.0.0/16 (from 10.65.2.0, ports 8080 and 8081), so no two services share
// a backend list, on node (s*10+e) mod 100.
func benchEndpoint(s, e int) (netip.AddrPort, int) {
	const span = 63000
	i := s*benchEndpoints + e
	a := 2<<8 + i%span
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 65, byte(a >> 8), byte(a)}), uint16(8080+i/span)), i % benchNodes
}

// benchBackend is one endpoint of a service that replaces the generated ones.
type benchBackend struct {
	addr netip.AddrPort
	node int
}

// benchUpdate is the full update calc hands node self for the benchmark cluster, in calc's
// order: the pool and every node's address, the local workload routes weps (device → pod),
// then every frontend sorted by key, each service's endpoints local first (and all of them
// present). special replaces
// the endpoints of the services it names.
func benchUpdate(self int, special map[int][]benchBackend, weps map[string]netip.Prefix, v6 *bench6) *calc.Update {
	return benchUpdateN(benchServices, self, special, weps, v6)
}

// benchUpdateN is benchUpdate with n services.
func benchUpdateN(n, self int, special map[int][]benchBackend, weps map[string]netip.Prefix, v6 *bench6) *calc.Update {
	u := &calc.Update{Full: true}
	u.Ops = append(u.Ops, calc.Op{ClusterNet: &calc.ClusterNet{Prefix: netip.MustParsePrefix("10.65.0.0/16")}})
	for n := range benchNodes {
		u.Ops = append(u.Ops, calc.Op{ClusterNet: &calc.ClusterNet{Prefix: netip.PrefixFrom(benchNodeAddr(n), 32), Host: true, Node: benchNodeName(n)}})
	}
	if v6 != nil {
		u.Ops = append(u.Ops, calc.Op{ClusterNet: &calc.ClusterNet{Prefix: netip.MustParsePrefix("fd00:65::/48")}})
		for n := range benchNodes {
			u.Ops = append(u.Ops, calc.Op{ClusterNet: &calc.ClusterNet{Prefix: netip.PrefixFrom(benchNodeAddr6(n), 128), Host: true, Node: benchNodeName(n)}})
		}
	}
	for dev, p := range weps {
		u.Ops = append(u.Ops, calc.Op{Route: &calc.Route{Dst: p, Device: dev, Reason: calc.ReasonLocalWorkload}})
	}
	var fronts []calc.Frontend
	// family adds service s's frontends of one family (a cluster IP, node ports on this
	// node's address and the wildcard, TCP; UDP on the wildcard too when udp) over eps, whose
	// nodes' underlay addresses nodeAddr gives.
	family := func(s int, eps []benchBackend, nodeAddr func(int) netip.Addr, cluster, wildcard netip.Addr, udp bool) {
		var local, remote []calc.Backend
		present := make([]netip.AddrPort, 0, len(eps))
		for _, ep := range eps {
			be := calc.Backend{Addr: ep.addr.Addr(), Port: ep.addr.Port(), Node: benchNodeName(ep.node), NodeAddr: nodeAddr(ep.node)}
			if ep.node == self {
				local = append(local, be)
			} else {
				remote = append(remote, be)
			}
			present = append(present, ep.addr)
		}
		slices.SortFunc(present, netip.AddrPort.Compare)
		backends := append(local, remote...)
		name := fmt.Sprintf("svc-%05d", s)
		id := calc.ServiceID(&store.Service{Namespace: "bench", Name: name, UID: "uid-" + name})
		// The frontends of a port share its endpoint lists, as calc gives them (one per
		// family and traffic policy).
		add := func(a netip.Addr, port uint16, proto store.Protocol, kind calc.FrontendKind) {
			fronts = append(fronts, calc.Frontend{Key: calc.FrontendKey{Addr: a, Port: port, Protocol: proto}, Kind: kind,
				Service: "bench/" + name, ServiceID: id, PortName: "http", Backends: backends, LocalBackends: len(local), Present: present})
		}
		add(cluster, 80, store.ProtocolTCP, calc.FrontendClusterIP)
		add(nodeAddr(self), uint16(benchNodePort+s), store.ProtocolTCP, calc.FrontendNodePort)
		add(wildcard, uint16(benchNodePort+s), store.ProtocolTCP, calc.FrontendNodePort)
		if udp {
			// The traffic benchmark's services carry UDP too (UDP-GSO bulk).
			add(wildcard, uint16(benchNodePort+s), store.ProtocolUDP, calc.FrontendNodePort)
		}
	}
	for s := range n {
		eps := special[s]
		if eps == nil {
			for e := range benchEndpoints {
				a, n := benchEndpoint(s, e)
				eps = append(eps, benchBackend{a, n})
			}
		}
		family(s, eps, benchNodeAddr, benchClusterIP(s), netip.IPv4Unspecified(), special[s] != nil)
		if v6 == nil || (!v6.all && v6.special[s] == nil) {
			continue
		}
		eps6 := v6.special[s]
		if eps6 == nil {
			for e := range benchEndpoints {
				a, n := benchEndpoint(s, e)
				eps6 = append(eps6, benchBackend{netip.AddrPortFrom(benchEndpoint6(s, e), a.Port()), n})
			}
		}
		family(s, eps6, benchNodeAddr6, benchClusterIP6(s), netip.IPv6Unspecified(), v6.special[s] != nil)
	}
	slices.SortFunc(fronts, func(a, b calc.Frontend) int {
		return cmp.Or(a.Key.Addr.Compare(b.Key.Addr), cmp.Compare(a.Key.Port, b.Key.Port))
	})
	for i := range fronts {
		u.Ops = append(u.Ops, calc.Op{Frontend: &fronts[i]})
	}
	return u
}

func benchConfig(self int) Config {
	return Config{NodeName: benchNodeName(self), TunnelMTU: 1450, VXLANPort: DefaultVXLANPort, VNI: DefaultVNI,
		PSNATMin: DefaultPSNATMin, PSNATMax: DefaultPSNATMax}
}

func benchMedian(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkServicesColdApply programs 10,000 services of 10 endpoints from cold: the time
// from a full calc update handed to the driver (over real, empty, unpinned kernel maps) to
// Apply returning, beside a bare BatchUpdate of exactly the same frontend, backend and index entries
// into fresh maps (taken from the same driver run over fakes). Each iteration loads fresh
// maps for both, untimed; the two alternate in order; medians are reported. ipv4: IPv4
// services; dual-stack: each service also has an IPv6 cluster IP and node ports with 10 IPv6
// endpoints (twice the entries, in both families' maps).
func BenchmarkServicesColdApply(b *testing.B) {
	benchGate(b)
	b.Run("ipv4", func(b *testing.B) { benchColdApply(b, benchUpdate(0, nil, nil, nil), false) })
	b.Run("dual-stack", func(b *testing.B) { benchColdApply(b, benchUpdate(0, nil, nil, &bench6{all: true}), true) })
}

func benchColdApply(b *testing.B, u *calc.Update, dual bool) {
	cfg := benchConfig(0)
	sizes := DefaultMapSizes
	ft, fakes := MemTables(sizes)
	fs := NewServices(ft, cfg)
	fs.OnUpdate(u)
	if err := fs.Apply(); err != nil {
		b.Fatalf("the driver over fakes: %v", err)
	}
	feK, feV := benchEntries(fakes.Frontends.Entries)
	beK, beV := benchEntries(fakes.Backends.Entries)
	ixK, ixV := benchEntries(fakes.BackendIndex.Entries)
	fe6K, fe6V := benchEntries(fakes.V6.Frontends.Entries)
	be6K, be6V := benchEntries(fakes.V6.Backends.Entries)
	ix6K, ix6V := benchEntries(fakes.V6.BackendIndex.Entries)
	if len(feK) != 4*benchServices || len(beK) != benchServices*benchEndpoints {
		b.Fatalf("the driver wants %d frontends and %d backends; want %d and %d", len(feK), len(beK), 4*benchServices, benchServices*benchEndpoints)
	}
	if dual && (len(fe6K) != 4*benchServices || len(be6K) != benchServices*benchEndpoints) {
		b.Fatalf("the driver wants %d IPv6 frontends and %d IPv6 backends; want %d and %d", len(fe6K), len(be6K), 4*benchServices, benchServices*benchEndpoints)
	}
	load := func() *Objects {
		o, err := Load("", sizes)
		if err != nil {
			b.Fatal(err)
		}
		return o
	}
	var drv, desired, batch []time.Duration
	driver := func(check bool) {
		o := load()
		defer o.Close()
		runtime.GC()
		b.StartTimer()
		start := time.Now()
		s := NewServices(KernelTables(o), cfg)
		s.OnUpdate(u)
		mid := time.Since(start)
		err := s.Apply()
		took := time.Since(start)
		b.StopTimer()
		if err != nil {
			b.Fatalf("apply: %v", err)
		}
		drv, desired = append(drv, took), append(desired, mid)
		if check { // the kernel holds what the fakes hold
			for name, pair := range map[string][2]int{"frontends": {len(feK), MapTable[FrontendKey, FrontendValue]{o.SlFeV4}.Len()},
				"backends":           {len(beK), MapTable[BackendKey, BackendValue]{o.SlBeV4}.Len()},
				"backend index":      {len(ixK), MapTable[BackendIndex, uint32]{o.SlBeIdxV4}.Len()},
				"IPv6 frontends":     {len(fe6K), MapTable[FrontendKey6, FrontendValue]{o.SlFeV6}.Len()},
				"IPv6 backends":      {len(be6K), MapTable[BackendKey, BackendValue6]{o.SlBeV6}.Len()},
				"IPv6 backend index": {len(ix6K), MapTable[BackendIndex6, uint32]{o.SlBeIdxV6}.Len()}} {
				if pair[0] != pair[1] {
					b.Fatalf("%s: %d in the kernel, want %d", name, pair[1], pair[0])
				}
			}
			gotFe, err1 := MapTable[FrontendKey, FrontendValue]{o.SlFeV4}.Dump()
			gotBe, err2 := MapTable[BackendKey, BackendValue]{o.SlBeV4}.Dump()
			gotBe6, err3 := MapTable[BackendKey, BackendValue6]{o.SlBeV6}.Dump()
			if err := errors.Join(err1, err2, err3); err != nil {
				b.Fatal(err)
			}
			for k, v := range fakes.Frontends.Entries {
				if gotFe[k] != v {
					b.Fatalf("frontend %s: kernel has %s", FrontendString(k, v), FrontendString(k, gotFe[k]))
				}
			}
			for k, v := range fakes.Backends.Entries {
				if gotBe[k] != v {
					b.Fatalf("backend %s: kernel has %s", BackendString(k, v), BackendString(k, gotBe[k]))
				}
			}
			for k, v := range fakes.V6.Backends.Entries {
				if gotBe6[k] != v {
					b.Fatalf("IPv6 backend %+v: kernel has %+v", v, gotBe6[k])
				}
			}
		}
	}
	bare := func() {
		o := load()
		defer o.Close()
		runtime.GC()
		start := time.Now()
		n1, err1 := o.SlFeV4.BatchUpdate(feK, feV, nil)
		n2, err2 := o.SlBeV4.BatchUpdate(beK, beV, nil)
		n3, err3 := o.SlBeIdxV4.BatchUpdate(ixK, ixV, nil)
		var n4, n5, n6 int
		var err4, err5, err6 error
		if dual {
			n4, err4 = o.SlFeV6.BatchUpdate(fe6K, fe6V, nil)
			n5, err5 = o.SlBeV6.BatchUpdate(be6K, be6V, nil)
			n6, err6 = o.SlBeIdxV6.BatchUpdate(ix6K, ix6V, nil)
		}
		took := time.Since(start)
		if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil || n1 != len(feK) || n2 != len(beK) || n3 != len(ixK) ||
			n4 != len(fe6K) || n5 != len(be6K) || n6 != len(ix6K) {
			b.Fatalf("batch update: %d of %d frontends, %d of %d backends, %d of %d index entries (IPv6 %d, %d, %d): %v", n1, len(feK), n2, len(beK), n3, len(ixK), n4, n5, n6, err)
		}
		batch = append(batch, took)
	}
	b.ResetTimer()
	b.StopTimer()
	for i := range b.N {
		if i%2 == 0 {
			driver(i == 0)
			bare()
		} else {
			bare()
			driver(false)
		}
	}
	d, ref := benchMedian(drv), benchMedian(batch)
	entries := len(feK) + len(beK) + len(ixK) + len(fe6K) + len(be6K) + len(ix6K)
	b.Logf("driver %v (desired state %v), batch update %v; %d entries", drv, desired, batch, entries)
	b.ReportMetric(0, "ns/op") // the figures below say it
	b.ReportMetric(d.Seconds(), "cold-services-s")
	b.ReportMetric(benchMedian(desired).Seconds(), "cold-desired-s")
	b.ReportMetric(ref.Seconds(), "cold-batch-s")
	b.ReportMetric(float64(d)/float64(ref), "cold-services/batch")
	b.ReportMetric(float64(entries), "entries")
}

// benchEntries returns a fake's entries as key and value slices in one order.
func benchEntries[K comparable, V any](m map[K]V) ([]K, []V) {
	ks := make([]K, 0, len(m))
	vs := make([]V, 0, len(m))
	for k, v := range m {
		ks = append(ks, k)
		vs = append(vs, v)
	}
	return ks, vs
}

// The traffic benchmark's namespaces, all made here and gone with their handles:
//
//	client   eth0 198.51.100.100/24, default route via node A (198.51.100.1)
//	node A   node-000: eth0 192.0.2.1/24 to node B, eth1 198.51.100.1/24 to the client,
//	         wep-a to server A (10.65.0.5/32 dev wep-a); 10.65.1.0/24 via node B
//	node B   node-001: eth0 192.0.2.2/24, wep-b to server B (10.65.1.5/32 dev wep-b);
//	         198.51.100.0/24 via node A (the direct path's replies)
//	server A eth0 10.65.0.5/32, server B eth0 10.65.1.5/32: default via 169.254.1.1 on eth0,
//	         the lab's (Calico's) workload wiring
//
// Every neighbour is permanent (no ARP in the measurements). Both nodes forward and run the
// service stage: its programs on eth* and their workload interface, maps from a full update of
// the 10,000 services, in which service 0 has the one endpoint 10.65.0.5:8080 (local to node
// A) and service 1 the one endpoint 10.65.1.5:8080 (on node B). The servers also listen on
// 8081, which the direct path uses, so the two paths never meet in one TCP tuple (a tuple
// left in TIME_WAIT by the other path, with other timestamps, would stall a connect).
var (
	benchMACClient = net.HardwareAddr{2, 0, 0, 0xbe, 0, 1}
	benchMACA0     = net.HardwareAddr{2, 0, 0, 0xbe, 1, 0}
	benchMACA1     = net.HardwareAddr{2, 0, 0, 0xbe, 1, 1}
	benchMACWepA   = net.HardwareAddr{2, 0, 0, 0xbe, 1, 2}
	benchMACB0     = net.HardwareAddr{2, 0, 0, 0xbe, 2, 0}
	benchMACWepB   = net.HardwareAddr{2, 0, 0, 0xbe, 2, 2}
	benchMACSrvA   = net.HardwareAddr{2, 0, 0, 0xbe, 3, 1}
	benchMACSrvB   = net.HardwareAddr{2, 0, 0, 0xbe, 3, 2}
	benchPodA      = netip.MustParseAddr("10.65.0.5")
	benchPodB      = netip.MustParseAddr("10.65.1.5")
	benchClient    = netip.MustParseAddr("198.51.100.100")
	benchEdgeA     = netip.MustParseAddr("198.51.100.1")
	benchGateway   = netip.MustParseAddr("169.254.1.1")
	// The same over IPv6: client 2001:db8:100::100, node A 2001:db8:100::1 (eth1) and
	// 2001:db8::1 (eth0), node B 2001:db8::2, server A fd00:65::5, server B fd00:65:1::5, the
	// servers' gateway fe80::1 (the host side of their veth).
	benchPodA6    = netip.MustParseAddr("fd00:65::5")
	benchPodB6    = netip.MustParseAddr("fd00:65:1::5")
	benchClient6  = netip.MustParseAddr("2001:db8:100::100")
	benchEdgeA6   = netip.MustParseAddr("2001:db8:100::1")
	benchGateway6 = netip.MustParseAddr("fe80::1")
)

const (
	// benchWorkloadMTU is the workloads' MTU, as Calico sets it with a VXLAN overlay (1500
	// less 50), which the node-port tunnel's MTU matches. With 1500, a segment too big for
	// the tunnel would have to be answered with ICMP fragmentation-needed, and for packets of
	// a local TCP stack (checksum offload pending: CHECKSUM_PARTIAL) that answer is never
	// built: bpf_skb_change_tail refuses to cut into the pending checksum, icmp_back drops
	// the packet, the counter says sent, and the connection stalls (reported, not fixed here).
	benchWorkloadMTU = 1450

	benchNPPort     = 8080 // the services' target port
	benchDirectPort = 8081 // the same server, for the direct path
)

// benchNewNS makes a network namespace (nstest.New) set up to forward, with rp_filter off.
func benchNewNS(b testing.TB) netns.NsHandle {
	ns := nstest.New(b)
	err := nstest.Run(ns, func() error {
		for _, s := range []string{"ipv4/conf/all/forwarding", "ipv6/conf/all/forwarding", "ipv4/conf/all/rp_filter", "ipv4/conf/default/rp_filter"} {
			v := "0"
			if strings.HasSuffix(s, "/forwarding") {
				v = "1"
			}
			if err := os.WriteFile("/proc/sys/net/"+s, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatalf("setting up a network namespace: %v", err)
	}
	return ns
}

type benchNet struct {
	b       testing.TB
	handles map[netns.NsHandle]*netlink.Handle
}

func (n *benchNet) h(ns netns.NsHandle) *netlink.Handle {
	if h := n.handles[ns]; h != nil {
		return h
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		n.b.Fatalf("netlink handle: %v", err)
	}
	n.b.Cleanup(h.Close)
	n.handles[ns] = h
	return h
}

func (n *benchNet) link(ns netns.NsHandle, name string) netlink.Link {
	l, err := n.h(ns).LinkByName(name)
	if err != nil {
		n.b.Fatalf("link %s: %v", name, err)
	}
	return l
}

// veth joins two namespaces: interface an (MAC am) in a and zn (MAC zm) in z, both up with
// the given MTU.
func (n *benchNet) veth(a netns.NsHandle, an string, am net.HardwareAddr, z netns.NsHandle, zn string, zm net.HardwareAddr, mtu int) {
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: an, HardwareAddr: am}, PeerName: zn, PeerHardwareAddr: zm,
		PeerNamespace: netlink.NsFd(int(z))}
	if err := n.h(a).LinkAdd(v); err != nil {
		n.b.Fatalf("veth %s-%s: %v", an, zn, err)
	}
	for _, e := range []struct {
		ns   netns.NsHandle
		name string
	}{{a, an}, {z, zn}} {
		if err := n.h(e.ns).LinkSetMTU(n.link(e.ns, e.name), mtu); err != nil {
			n.b.Fatalf("%s mtu: %v", e.name, err)
		}
		if err := n.h(e.ns).LinkSetUp(n.link(e.ns, e.name)); err != nil {
			n.b.Fatalf("%s up: %v", e.name, err)
		}
	}
}

func (n *benchNet) addr(ns netns.NsHandle, dev, prefix string) {
	a, err := netlink.ParseAddr(prefix)
	if err != nil {
		n.b.Fatal(err)
	}
	if a.IP.To4() == nil {
		a.Flags |= unix.IFA_F_NODAD // usable at once
	}
	if err := n.h(ns).AddrAdd(n.link(ns, dev), a); err != nil {
		n.b.Fatalf("address %s on %s: %v", prefix, dev, err)
	}
}

// route adds dst (a prefix, "default" or "default6") out of dev, via gw when valid.
func (n *benchNet) route(ns netns.NsHandle, dst, dev string, gw netip.Addr) {
	r := &netlink.Route{LinkIndex: n.link(ns, dev).Attrs().Index}
	switch dst {
	case "default":
		r.Dst = &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	case "default6":
		r.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	default:
		p := netip.MustParsePrefix(dst)
		r.Dst = &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
	}
	if gw.IsValid() {
		r.Gw = gw.AsSlice()
	} else {
		r.Scope = netlink.SCOPE_LINK
	}
	if err := n.h(ns).RouteAdd(r); err != nil {
		n.b.Fatalf("route %s dev %s via %v: %v", dst, dev, gw, err)
	}
}

func (n *benchNet) neigh(ns netns.NsHandle, dev string, ip netip.Addr, mac net.HardwareAddr) {
	family := netlink.FAMILY_V4
	if !ip.Is4() {
		family = netlink.FAMILY_V6
	}
	if err := n.h(ns).NeighSet(&netlink.Neigh{LinkIndex: n.link(ns, dev).Attrs().Index, Family: family,
		State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}); err != nil {
		n.b.Fatalf("neighbour %s on %s: %v", ip, dev, err)
	}
}

// benchServer answers on ln: a first byte 'c' gets one byte back and the connection closed
// (the server closes first, so clients keep no TIME_WAIT); 'u' is read to EOF and the count
// of bytes answered; 'd' followed by a duration in nanoseconds gets data for that long.
func benchServer(ln net.Listener, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			var op [1]byte
			if _, err := io.ReadFull(c, op[:]); err != nil {
				return
			}
			switch op[0] {
			case 'c':
				_, _ = c.Write(op[:])
			case 'u':
				n, _ := io.Copy(io.Discard, c)
				_ = binary.Write(c, binary.BigEndian, n)
			case 'd':
				var d int64
				if binary.Read(c, binary.BigEndian, &d) != nil {
					return
				}
				buf := make([]byte, 256<<10)
				end := time.Now().Add(time.Duration(d))
				for time.Now().Before(end) {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}
		}()
	}
}

// benchTraffic is the client side: connections and bulk transfers from the client namespace.
type benchTraffic struct {
	client netns.NsHandle
	stages [2]*Stage
	// nodes, cfgs and updates are each node's namespace, stage configuration and update (a
	// test restarts a stage with them).
	nodes   [2]netns.NsHandle
	cfgs    [2]StageConfig
	updates [2]*calc.Update
	// pods are server A's and server B's namespaces (a test starts servers of its own there).
	pods [2]netns.NsHandle
	// udpBytes counts the payload bytes each UDP server took, by its address.
	udpBytes map[string]*atomic.Int64
}

// udpGSO sends UDP for d from one socket with UDP segmentation offload (UDP_SEGMENT: 46
// datagrams of seg bytes handed to the kernel at a time, as QUIC servers send) to addr, whose
// server counts the bytes (counter): it returns bits per second received.
func (t *benchTraffic) udpGSO(addr string, seg int, counter *atomic.Int64, d time.Duration) (float64, error) {
	var bits float64
	err := nstest.Run(t.client, func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		raw, err := c.(*net.UDPConn).SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT, seg) }); err != nil || serr != nil {
			return fmt.Errorf("UDP_SEGMENT: %v %v", err, serr)
		}
		buf := make([]byte, 46*seg)
		before := counter.Load()
		start := time.Now()
		for time.Since(start) < d {
			if _, err := c.Write(buf); err != nil && !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, unix.ENOBUFS) {
				return err
			}
		}
		time.Sleep(50 * time.Millisecond) // what is in flight arrives
		bits = float64((counter.Load()-before)*8) / time.Since(start).Seconds()
		return nil
	})
	return bits, err
}

// connRate runs workers that each connect, send 'c', read the answer and the close, for d
// (at least once each); it returns the connections completed per second.
func (t *benchTraffic) connRate(addr string, workers int, d time.Duration) (float64, error) {
	var done atomic.Int64
	errs := make(chan error, workers)
	start := time.Now()
	end := start.Add(d)
	for range workers {
		go func() {
			errs <- nstest.Run(t.client, func() error {
				dialer := net.Dialer{Timeout: 3 * time.Second}
				var b [1]byte
				for first := true; first || time.Now().Before(end); first = false {
					c, err := dialer.Dial("tcp", addr)
					if err != nil {
						return err
					}
					_ = c.SetDeadline(time.Now().Add(3 * time.Second))
					if _, err := c.Write([]byte{'c'}); err != nil {
						c.Close()
						return err
					}
					if _, err := io.ReadFull(c, b[:]); err != nil {
						c.Close()
						return fmt.Errorf("reading the answer: %w", err)
					}
					if _, err := c.Read(b[:]); err != io.EOF {
						c.Close()
						return fmt.Errorf("waiting for the server's close: %v", err)
					}
					c.Close()
					done.Add(1)
				}
				return nil
			})
		}()
	}
	var err error
	for range workers {
		err = errors.Join(err, <-errs)
	}
	return float64(done.Load()) / time.Since(start).Seconds(), err
}

// synRetrans reads the client's count of retransmitted SYNs (TcpExt TCPSynRetrans): a
// connection whose first SYN went unanswered or was refused waited a second for its next.
func (t *benchTraffic) synRetrans() (int64, error) {
	var n int64
	err := nstest.Run(t.client, func() error {
		raw, err := os.ReadFile("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		lines := strings.Split(string(raw), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for j := range names {
				if names[0] == "TcpExt:" && names[j] == "TCPSynRetrans" && j < len(vals) {
					n, err = strconv.ParseInt(vals[j], 10, 64)
					return err
				}
			}
		}
		return errors.New("no TcpExt TCPSynRetrans in /proc/net/netstat")
	})
	return n, err
}

// upload sends for d on one connection and returns bits per second as the server counted
// them, over the time until the server's count arrived.
func (t *benchTraffic) upload(addr string, d time.Duration) (float64, error) {
	var bits float64
	err := nstest.Run(t.client, func() error {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(d + 10*time.Second))
		start := time.Now()
		if _, err := c.Write([]byte{'u'}); err != nil {
			return err
		}
		buf := make([]byte, 256<<10)
		for time.Since(start) < d {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return err
		}
		var n int64
		if err := binary.Read(c, binary.BigEndian, &n); err != nil {
			return fmt.Errorf("reading the server's count: %w", err)
		}
		bits = float64(n*8) / time.Since(start).Seconds()
		return nil
	})
	return bits, err
}

// download asks for data for d on one connection and returns bits per second received.
func (t *benchTraffic) download(addr string, d time.Duration) (float64, error) {
	var bits float64
	err := nstest.Run(t.client, func() error {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(d + 10*time.Second))
		req := make([]byte, 9)
		req[0] = 'd'
		binary.BigEndian.PutUint64(req[1:], uint64(d))
		start := time.Now()
		if _, err := c.Write(req); err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, c)
		if err != nil {
			return err
		}
		bits = float64(n*8) / time.Since(start).Seconds()
		return nil
	})
	return bits, err
}

// benchTrafficWorld builds the namespaces, starts both nodes' service stages and the servers.
func benchTrafficWorld(b testing.TB) *benchTraffic {
	return benchTrafficWorldN(b, benchServices, false)
}

// benchTrafficWorldN is the traffic world with n services (at least 2); ipv4Only loads the
// IPv4 programs only (IPv6 packets then pass untouched).
func benchTrafficWorldN(b testing.TB, services int, ipv4Only bool) *benchTraffic {
	client, nodeA, nodeB, srvA, srvB := benchNewNS(b), benchNewNS(b), benchNewNS(b), benchNewNS(b), benchNewNS(b)
	n := &benchNet{b: b, handles: map[netns.NsHandle]*netlink.Handle{}}
	n.veth(nodeA, "eth0", benchMACA0, nodeB, "eth0", benchMACB0, 1500)
	n.veth(nodeA, "eth1", benchMACA1, client, "eth0", benchMACClient, 1500)
	n.veth(nodeA, "wep-a", benchMACWepA, srvA, "eth0", benchMACSrvA, benchWorkloadMTU)
	n.veth(nodeB, "wep-b", benchMACWepB, srvB, "eth0", benchMACSrvB, benchWorkloadMTU)
	n.addr(client, "eth0", "198.51.100.100/24")
	n.addr(nodeA, "eth0", "192.0.2.1/24")
	n.addr(nodeA, "eth1", "198.51.100.1/24")
	n.addr(nodeB, "eth0", "192.0.2.2/24")
	n.addr(srvA, "eth0", "10.65.0.5/32")
	n.addr(srvB, "eth0", "10.65.1.5/32")
	n.route(client, "default", "eth0", benchEdgeA)
	n.route(nodeA, "10.65.0.5/32", "wep-a", netip.Addr{})
	n.route(nodeA, "10.65.1.0/24", "eth0", benchNodeAddr(1))
	n.route(nodeB, "10.65.1.5/32", "wep-b", netip.Addr{})
	n.route(nodeB, "198.51.100.0/24", "eth0", benchNodeAddr(0))
	for _, srv := range []netns.NsHandle{srvA, srvB} {
		n.route(srv, "169.254.1.1/32", "eth0", netip.Addr{})
		n.route(srv, "default", "eth0", benchGateway)
	}
	n.neigh(client, "eth0", benchEdgeA, benchMACA1)
	n.neigh(nodeA, "eth1", benchClient, benchMACClient)
	n.neigh(nodeA, "eth0", benchNodeAddr(1), benchMACB0)
	n.neigh(nodeA, "wep-a", benchPodA, benchMACSrvA)
	n.neigh(nodeB, "eth0", benchNodeAddr(0), benchMACA0)
	n.neigh(nodeB, "wep-b", benchPodB, benchMACSrvB)
	n.neigh(srvA, "eth0", benchGateway, benchMACWepA)
	n.neigh(srvB, "eth0", benchGateway, benchMACWepB)
	// IPv6, laid out the same way.
	n.addr(client, "eth0", "2001:db8:100::100/64")
	n.addr(nodeA, "eth1", "2001:db8:100::1/64")
	n.addr(nodeA, "eth0", "2001:db8::1/64")
	n.addr(nodeB, "eth0", "2001:db8::2/64")
	n.addr(nodeA, "wep-a", "fe80::1/64")
	n.addr(nodeB, "wep-b", "fe80::1/64")
	n.addr(srvA, "eth0", "fd00:65::5/128")
	n.addr(srvB, "eth0", "fd00:65:1::5/128")
	n.route(client, "default6", "eth0", benchEdgeA6)
	n.route(nodeA, "fd00:65::5/128", "wep-a", netip.Addr{})
	n.route(nodeA, "fd00:65:1::/64", "eth0", benchNodeAddr6(1))
	n.route(nodeB, "fd00:65:1::5/128", "wep-b", netip.Addr{})
	n.route(nodeB, "2001:db8:100::/64", "eth0", benchNodeAddr6(0))
	for _, srv := range []netns.NsHandle{srvA, srvB} {
		n.route(srv, "default6", "eth0", benchGateway6)
	}
	n.neigh(client, "eth0", benchEdgeA6, benchMACA1)
	n.neigh(nodeA, "eth1", benchClient6, benchMACClient)
	n.neigh(nodeA, "eth0", benchNodeAddr6(1), benchMACB0)
	n.neigh(nodeA, "wep-a", benchPodA6, benchMACSrvA)
	n.neigh(nodeB, "eth0", benchNodeAddr6(0), benchMACA0)
	n.neigh(nodeB, "wep-b", benchPodB6, benchMACSrvB)
	n.neigh(srvA, "eth0", benchGateway6, benchMACWepA)
	n.neigh(srvB, "eth0", benchGateway6, benchMACWepB)

	// The stages, pinned on a bpffs of the benchmark's own (unmounted at the end: the pinned
	// links go with it).
	bpffs := filepath.Join(b.TempDir(), "bpf")
	if err := os.Mkdir(bpffs, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		b.Fatalf("mounting bpffs: %v", err)
	}
	b.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	special := map[int][]benchBackend{0: {{netip.AddrPortFrom(benchPodA, benchNPPort), 0}}, 1: {{netip.AddrPortFrom(benchPodB, benchNPPort), 1}}}
	var stages [2]*Stage
	var cfgs [2]StageConfig
	var updates [2]*calc.Update
	for i, node := range []struct {
		ns  netns.NsHandle
		wep string
		pod netip.Addr
	}{{nodeA, "wep-a", benchPodA}, {nodeB, "wep-b", benchPodB}} {
		special6 := map[int][]benchBackend{0: {{netip.AddrPortFrom(benchPodA6, benchNPPort), 0}}, 1: {{netip.AddrPortFrom(benchPodB6, benchNPPort), 1}}}
		u := benchUpdateN(services, i, special, map[string]netip.Prefix{node.wep: netip.PrefixFrom(node.pod, 32)}, &bench6{special: special6})
		cfgs[i] = StageConfig{PinDir: filepath.Join(bpffs, benchNodeName(i)), Sizes: DefaultMapSizes,
			HostInterfaces: regexp.MustCompile(`^eth[0-9]+$`), Services: benchConfig(i), CgroupPath: "none", Timeouts: DefaultTimeouts,
			Attach: stAttach(), ipv4Programs: ipv4Only}
		updates[i] = u
		err := nstest.Run(node.ns, func() error {
			st, err := StartStage(cfgs[i])
			if err != nil {
				return err
			}
			stages[i] = st
			st.OnUpdate(u)
			start := time.Now()
			writes, err := st.Apply()
			b.Logf("%s: %d map writes and the programs attached in %v; hooks %v", benchNodeName(i), writes, time.Since(start).Round(time.Millisecond), st.Hooks())
			return err
		})
		if stages[i] != nil {
			b.Cleanup(stages[i].Close)
		}
		if err != nil {
			b.Fatalf("%s: service stage: %v", benchNodeName(i), err)
		}
	}

	var wg sync.WaitGroup
	b.Cleanup(wg.Wait) // after the listeners close (cleanups run last first)
	for _, srv := range []struct {
		ns  netns.NsHandle
		pod netip.Addr
	}{{srvA, benchPodA}, {srvB, benchPodB}, {srvA, benchPodA6}, {srvB, benchPodB6}} {
		for _, port := range []uint16{benchNPPort, benchDirectPort} {
			var ln net.Listener
			if err := nstest.Run(srv.ns, func() (err error) {
				ln, err = net.Listen("tcp", netip.AddrPortFrom(srv.pod, port).String())
				return err
			}); err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go benchServer(ln, &wg)
			b.Cleanup(func() { ln.Close() })
		}
	}

	udp := map[string]*atomic.Int64{}
	for _, srv := range []struct {
		ns  netns.NsHandle
		pod netip.Addr
	}{{srvA, benchPodA}, {srvB, benchPodB}, {srvA, benchPodA6}, {srvB, benchPodB6}} {
		for _, port := range []uint16{benchNPPort, benchDirectPort} {
			addr := netip.AddrPortFrom(srv.pod, port)
			var pc net.PacketConn
			if err := nstest.Run(srv.ns, func() (err error) {
				pc, err = net.ListenPacket("udp", addr.String())
				return err
			}); err != nil {
				b.Fatal(err)
			}
			_ = pc.(*net.UDPConn).SetReadBuffer(8 << 20)
			n := &atomic.Int64{}
			udp[addr.String()] = n
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 64<<10)
				for {
					k, _, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					n.Add(int64(k))
				}
			}()
			b.Cleanup(func() { pc.Close() })
		}
	}

	return &benchTraffic{client: client, stages: stages, udpBytes: udp, nodes: [2]netns.NsHandle{nodeA, nodeB}, cfgs: cfgs, updates: updates,
		pods: [2]netns.NsHandle{srvA, srvB}}
}

// counters lists the nodes' counters that are not zero.
func (t *benchTraffic) counters() string {
	var s []string
	for i, st := range t.stages {
		for c, name := range CounterNames {
			var per []uint64
			if err := st.Objs.SlCounters.Lookup(uint32(c), &per); err != nil {
				continue
			}
			var sum uint64
			for _, v := range per {
				sum += v
			}
			if sum > 0 {
				s = append(s, fmt.Sprintf("%s %s=%d", benchNodeName(i), name, sum))
			}
		}
	}
	return fmt.Sprint(s)
}

// BenchmarkNodePortTraffic measures connections per second (4 clients in parallel, each
// connect, one byte each way, close), bulk TCP throughput both ways (one connection) and UDP
// sent with segmentation offload (UDP_SEGMENT, as QUIC servers send; bytes received) through
// a node port on node A, to an endpoint on node A (local) and to one on node B (remote,
// through the node-port tunnel), beside the same traffic sent straight to the endpoint's
// address (the client routed to the pod network, the same programs attached and passing it)
// in the same run; ipv6-local and ipv6-remote do the same over IPv6 (TCP only), through the
// IPv6 tunnel over the nodes' IPv6 addresses, Packet Too Big telling the client and the
// servers the tunnel's MTU. Both nodes' maps hold 10,000 services, so lookups are not of a toy table.
// Each figure is the mean of three rounds of 0.5 s, the two paths alternating; x/direct is
// the node port's figure over the direct one. conn-np-syn-retrans counts the node-port
// connections whose first SYN got no answer (each waits a second): towards a remote endpoint
// the ingress node gives the flow a random source port of its own (four tries against its
// connection table, where closed flows stay 120 s), and when the endpoint still holds that
// tuple in TIME_WAIT from an earlier connection of the same client, which came from another
// client port and so with other TCP timestamps, it refuses the SYN (PAWS). A direct
// connection keeps its own port and does not meet this.
func BenchmarkNodePortTraffic(b *testing.B) {
	benchGate(b)
	t := benchTrafficWorld(b)
	stages := t.stages
	nodePort := func(s int) string { return netip.AddrPortFrom(benchNodeAddr(0), uint16(benchNodePort+s)).String() }
	nodePort6 := func(s int) string { return netip.AddrPortFrom(benchNodeAddr6(0), uint16(benchNodePort+s)).String() }
	for _, c := range []struct {
		name        string
		np, direct  string
		wantCounter int        // a counter that must have grown on node A: the traffic took the program's path
		pod         netip.Addr // the endpoint: its UDP servers count what arrives
	}{
		{"local", nodePort(0), netip.AddrPortFrom(benchPodA, benchDirectPort).String(), 0, benchPodA},
		{"remote", nodePort(1), netip.AddrPortFrom(benchPodB, benchDirectPort).String(), 1, benchPodB},
		{"ipv6-local", nodePort6(0), netip.AddrPortFrom(benchPodA6, benchDirectPort).String(), 0, benchPodA6},
		{"ipv6-remote", nodePort6(1), netip.AddrPortFrom(benchPodB6, benchDirectPort).String(), 1, benchPodB6},
	} {
		b.Run(c.name, func(b *testing.B) {
			// Both paths work before anything is measured.
			for _, addr := range []string{c.np, c.direct} {
				if _, err := t.connRate(addr, 1, time.Millisecond); err != nil {
					b.Fatalf("%s: %v; counters %s", addr, err, t.counters())
				}
			}
			read := func() uint64 {
				var per []uint64
				_ = stages[0].Objs.SlCounters.Lookup(uint32(c.wantCounter), &per)
				var sum uint64
				for _, v := range per {
					sum += v
				}
				return sum
			}
			before := read()
			var synNP int64 // SYNs the node-port connections had to send again
			const rounds, slice = 3, 500 * time.Millisecond
			var conns, up, down, udp [2]float64 // node port, direct
			addrs := [2]string{c.np, c.direct}
			udpCount := [2]*atomic.Int64{t.udpBytes[netip.AddrPortFrom(c.pod, benchNPPort).String()], t.udpBytes[netip.AddrPortFrom(c.pod, benchDirectPort).String()]}
			for r := range rounds {
				order := []int{0, 1}
				if r%2 == 1 {
					order = []int{1, 0}
				}
				for _, p := range order {
					syn0, err0 := t.synRetrans()
					cps, err := t.connRate(addrs[p], 4, slice)
					if err != nil {
						b.Fatalf("connections to %s: %v; counters %s", addrs[p], err, t.counters())
					}
					conns[p] += cps / rounds
					syn1, err1 := t.synRetrans()
					if err := errors.Join(err0, err1); err != nil {
						b.Fatal(err)
					}
					if p == 0 {
						synNP += syn1 - syn0
					}
				}
				for _, p := range order {
					bps, err := t.upload(addrs[p], slice)
					if err != nil {
						b.Fatalf("upload to %s: %v; counters %s", addrs[p], err, t.counters())
					}
					up[p] += bps / rounds
				}
				for _, p := range order {
					bps, err := t.download(addrs[p], slice)
					if err != nil {
						b.Fatalf("download from %s: %v; counters %s", addrs[p], err, t.counters())
					}
					down[p] += bps / rounds
				}
				for _, p := range order {
					// 1,400 bytes a datagram; over IPv6 1,370, which fits the IPv6 tunnel's
					// 1,430 with its 48 bytes of headers (IPv6 never fragments: a larger
					// one is refused at the send once Packet Too Big has come back).
					seg := 1400
					if c.pod.Is6() {
						seg = 1370
					}
					bps, err := t.udpGSO(addrs[p], seg, udpCount[p], slice)
					if err != nil {
						b.Fatalf("UDP to %s: %v; counters %s", addrs[p], err, t.counters())
					}
					udp[p] += bps / rounds
				}
			}
			if grew := read() - before; grew < uint64(conns[0]) {
				b.Fatalf("counter %s grew by %d over %.0f node-port connections a second: the traffic did not take the program's path", CounterNames[c.wantCounter], grew, conns[0])
			}
			b.Logf("counters %s", t.counters())
			b.ReportMetric(0, "ns/op") // the whole measurement's time: meaningless here
			b.ReportMetric(conns[0], "conn-np/s")
			b.ReportMetric(conns[1], "conn-direct/s")
			b.ReportMetric(conns[0]/conns[1], "conn-np/direct")
			b.ReportMetric(float64(synNP), "conn-np-syn-retrans")
			b.ReportMetric(up[0]/1e9, "up-np-Gbit/s")
			b.ReportMetric(up[1]/1e9, "up-direct-Gbit/s")
			b.ReportMetric(up[0]/up[1], "up-np/direct")
			b.ReportMetric(down[0]/1e9, "down-np-Gbit/s")
			b.ReportMetric(down[1]/1e9, "down-direct-Gbit/s")
			b.ReportMetric(down[0]/down[1], "down-np/direct")
			b.ReportMetric(udp[0]/1e9, "udp-gso-np-Gbit/s")
			b.ReportMetric(udp[1]/1e9, "udp-gso-direct-Gbit/s")
			b.ReportMetric(udp[0]/udp[1], "udp-gso-np/direct")
		})
	}
}

// BenchmarkConntrackWalk reads a connection table of 65,536 entries (the unestablished share a
// SYN flood leaves at the default size) as the cleaner and the sweep at an apply do: walk
// (batch lookups), beside the one-at-a-time iteration they used before, in the same run.
func BenchmarkConntrackWalk(b *testing.B) {
	benchGate(b)
	o, err := Load("", MapSizes{Conntrack: 262144})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	const n = 65536
	keys, vals := make([]ConntrackKey, n), make([]ConntrackValue, n)
	for i := range n {
		keys[i] = ConntrackKey{Src: uint32(i), Dst: 0x0100000a, Sport: uint16(i), Dport: 80, Proto: ProtoTCP}
		vals[i] = ConntrackValue{Created: 1, LastSeen: 1, Type: ConntrackRev}
	}
	if c, err := o.SlCtV4.BatchUpdate(keys, vals, nil); err != nil || c != n {
		b.Fatalf("filling the table: %d, %v", c, err)
	}
	var batch, one []time.Duration
	for range b.N {
		start := time.Now()
		got := 0
		if err := walk(o.SlCtV4, func(ConntrackKey, ConntrackValue) { got++ }); err != nil || got != n {
			b.Fatalf("walk: %d entries, %v", got, err)
		}
		batch = append(batch, time.Since(start))
		start = time.Now()
		got = 0
		var k ConntrackKey
		var v ConntrackValue
		it := o.SlCtV4.Iterate()
		for it.Next(&k, &v) {
			got++
		}
		if it.Err() != nil || got != n {
			b.Fatalf("iterate: %d entries, %v", got, it.Err())
		}
		one = append(one, time.Since(start))
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(benchMedian(batch).Seconds()*1e3, "walk-ms")
	b.ReportMetric(benchMedian(one).Seconds()*1e3, "iterate-ms")
	b.ReportMetric(float64(benchMedian(one))/float64(benchMedian(batch)), "iterate/walk")
}
