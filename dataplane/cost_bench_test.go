package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// BenchmarkNewNodeKernelCost measures the floor under sluiced's CPU per change (issue #11's
// target: 0.2 ms per new node with its block): the kernel writes a new remote node needs, and
// nothing else, sent the way the dataplane sends them (a neighbour and an FDB entry in one
// batch, the nexthop object in another, the route in a third, each one sendmsg and one
// acknowledgement), with 1,000 or 20,000 nodes already programmed. It reports this process's
// CPU per node (getrusage: user and system) over 2,000 new nodes. Run as root: make
// bench-dataplane.
func BenchmarkNewNodeKernelCost(b *testing.B) {
	nstest.NeedRoot(b, "programs a kernel")
	for _, nodes := range []int{1000, 20_000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) { benchNewNodeCost(b, nodes) })
	}
}

// fleetNode returns what the dataplane programs for remote node n: a neighbour and an FDB
// entry, a nexthop object and a route (tunnel address 10.64.x.y, block n's first address;
// MAC; underlay 198.18.x.y).
type fleetNode func(n int) (neighs []*netlink.Neigh, nh Nexthop, route *Route)

// benchFleet makes a namespace with sluice's VXLAN device and nodes remote nodes programmed
// on it, written in bulk, and returns a kernel in it.
func benchFleet(b *testing.B, tag string, nodes int) (*NetlinkKernel, int, fleetNode) {
	_, ns, ip := benchNamespace(b, tag)
	ip("link", "add", "vxlan.sluice", "type", "vxlan", "id", "4096", "dstport", "4789", "dev", "eth0", "local", "192.0.2.11", "nolearning")
	ip("addr", "add", "10.64.0.0/32", "dev", "vxlan.sluice")
	ip("link", "set", "vxlan.sluice", "up")
	k, err := NewKernel(ns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(k.Close)
	links, err := k.LinkIndexes()
	if err != nil {
		b.Fatal(err)
	}
	vx := links["vxlan.sluice"]
	node := func(n int) (neighs []*netlink.Neigh, nh Nexthop, route *Route) {
		a := n * 64
		tunnel := netip.AddrFrom4([4]byte{10, byte(64 + a>>16), byte(a >> 8), byte(a)})
		mac := net.HardwareAddr{0x66, 0x01, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
		under := net.IPv4(198, byte(18+n>>16), byte(n>>8), byte(n))
		neighs = []*netlink.Neigh{
			{LinkIndex: vx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT, IP: tunnel.AsSlice(), HardwareAddr: mac},
			{LinkIndex: vx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF, IP: under, HardwareAddr: mac},
		}
		nh = Nexthop{ID: DefaultRouteProtocol<<24 | uint32(n), Gw: tunnel, Link: vx, OnLink: true, Protocol: DefaultRouteProtocol}
		route = &Route{Route: netlink.Route{Dst: &net.IPNet{IP: tunnel.AsSlice(), Mask: net.CIDRMask(26, 32)}, Table: unix.RT_TABLE_MAIN,
			Protocol: DefaultRouteProtocol, Type: unix.RTN_UNICAST}, NH: nh.ID}
		return
	}
	var neighs []*netlink.Neigh
	var nhs []Nexthop
	var routes []*Route
	for n := 1; n <= nodes; n++ {
		ne, nh, r := node(n)
		neighs, nhs, routes = append(neighs, ne...), append(nhs, nh), append(routes, r)
	}
	checkAll(b, k.NeighSetMany(neighs))
	checkAll(b, k.NexthopSetMany(nhs, false))
	checkAll(b, k.RouteReplaceMany(routes))
	return k, vx, node
}

func checkAll(b *testing.B, errs []error) {
	b.Helper()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

func benchNewNodeCost(b *testing.B, nodes int) {
	k, _, node := benchFleet(b, "nn", nodes)

	// What a full read of the objects costs at this size, and the agent's probe at start.
	dumpStart := time.Now()
	if all, err := k.NexthopList(); err != nil || len(all) != nodes {
		b.Fatalf("nexthop dump: %d objects, %v", len(all), err)
	}
	dump := time.Since(dumpStart)
	probeStart := time.Now()
	if err := k.NexthopsSupported(); err != nil {
		b.Fatal(err)
	}
	probe := time.Since(probeStart)

	const changes = 2000
	var before, after unix.Rusage
	b.ResetTimer()
	start := time.Now()
	_ = unix.Getrusage(unix.RUSAGE_SELF, &before)
	for i := range changes {
		ne, nh, r := node(nodes + 1 + i)
		checkAll(b, k.NeighSetMany(ne))
		checkAll(b, k.NexthopSetMany([]Nexthop{nh}, false))
		checkAll(b, k.RouteReplaceMany([]*Route{r}))
	}
	_ = unix.Getrusage(unix.RUSAGE_SELF, &after)
	wall := time.Since(start)
	b.StopTimer()
	us := func(tv unix.Timeval) float64 { return float64(tv.Sec)*1e6 + float64(tv.Usec) }
	user := (us(after.Utime) - us(before.Utime)) / changes
	sys := (us(after.Stime) - us(before.Stime)) / changes
	b.ReportMetric((user+sys)/1000, "cpu-per-node-ms")
	b.ReportMetric(user/1000, "user-per-node-ms")
	b.ReportMetric(sys/1000, "sys-per-node-ms")
	b.ReportMetric(float64(wall.Microseconds())/changes/1000, "wall-per-node-ms")
	b.ReportMetric(float64(dump.Microseconds())/1000, "nexthop-dump-ms")
	b.ReportMetric(float64(probe.Microseconds())/1000, "nexthop-probe-ms")
}

// BenchmarkRestartRead measures the kernel half of a restart at 1,000 and 20,000 remote nodes:
// the reads the first apply makes to adopt what is there (routes, nexthop objects, the VXLAN
// device's neighbours and FDB entries), through sluice's dumps and parsers, and, as the
// reference in the same run, the same routes, neighbours and FDB entries read through the
// netlink library (which has no nexthop dump). Milliseconds per read of everything. Run as
// root: make bench-dataplane.
func BenchmarkRestartRead(b *testing.B) {
	nstest.NeedRoot(b, "programs a kernel")
	for _, nodes := range []int{1000, 20_000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			k, vx, _ := benchFleet(b, "rr", nodes)
			var own, lib time.Duration
			for b.Loop() {
				start := time.Now()
				nhs, err := k.NexthopList()
				rs, err2 := k.RouteList(unix.RT_TABLE_MAIN)
				ns, err3 := k.Neighs(vx, unix.AF_INET)
				fs, err4 := k.Neighs(vx, unix.AF_BRIDGE)
				own += time.Since(start)
				if err := errors.Join(err, err2, err3, err4); err != nil || len(nhs) != nodes || len(rs) < nodes || len(ns) < nodes || len(fs) < nodes {
					b.Fatalf("read %d objects, %d routes, %d neighbours, %d FDB entries: %v", len(nhs), len(rs), len(ns), len(fs), err)
				}
				start = time.Now()
				lrs, err := k.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
				lns, err2 := k.h.NeighList(vx, unix.AF_INET)
				lfs, err3 := k.h.NeighList(vx, unix.AF_BRIDGE)
				lib += time.Since(start)
				if err := errors.Join(err, err2, err3); err != nil || len(lrs) < nodes || len(lns) < nodes || len(lfs) < nodes {
					b.Fatalf("netlink read %d routes, %d neighbours, %d FDB entries: %v", len(lrs), len(lns), len(lfs), err)
				}
			}
			b.ReportMetric(float64(own.Microseconds())/1000/float64(b.N), "sluice-read-ms")
			b.ReportMetric(float64(lib.Microseconds())/1000/float64(b.N), "netlink-lib-read-ms")
		})
	}
}
