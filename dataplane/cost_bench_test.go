package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

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
	if os.Geteuid() != 0 {
		b.Skip("programs a kernel: needs root")
	}
	for _, nodes := range []int{1000, 20_000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) { benchNewNodeCost(b, nodes) })
	}
}

func benchNewNodeCost(b *testing.B, nodes int) {
	_, ns, ip := benchNamespace(b, "nn")
	ip("link", "add", "vxlan.sluice", "type", "vxlan", "id", "4096", "dstport", "4789", "dev", "eth0", "local", "192.0.2.11", "nolearning")
	ip("addr", "add", "10.64.0.0/32", "dev", "vxlan.sluice")
	ip("link", "set", "vxlan.sluice", "up")
	k, err := NewKernel(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	links, err := k.LinkIndexes()
	if err != nil {
		b.Fatal(err)
	}
	vx := links["vxlan.sluice"]
	// node n: tunnel address 10.64.x.y (block n's first address), MAC, underlay 198.18.x.y.
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
	check := func(errs []error) {
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	// The fleet already there, written in bulk.
	var neighs []*netlink.Neigh
	var nhs []Nexthop
	var routes []*Route
	for n := 1; n <= nodes; n++ {
		ne, nh, r := node(n)
		neighs, nhs, routes = append(neighs, ne...), append(nhs, nh), append(routes, r)
	}
	check(k.NeighSetMany(neighs))
	check(k.NexthopSetMany(nhs, false))
	check(k.RouteReplaceMany(routes))

	// What a full read of the objects costs at this size (the agent's start probes with it).
	dumpStart := time.Now()
	if all, err := k.NexthopList(); err != nil || len(all) != nodes {
		b.Fatalf("nexthop dump: %d objects, %v", len(all), err)
	}
	dump := time.Since(dumpStart)

	const changes = 2000
	var before, after unix.Rusage
	b.ResetTimer()
	start := time.Now()
	_ = unix.Getrusage(unix.RUSAGE_SELF, &before)
	for i := range changes {
		ne, nh, r := node(nodes + 1 + i)
		check(k.NeighSetMany(ne))
		check(k.NexthopSetMany([]Nexthop{nh}, false))
		check(k.RouteReplaceMany([]*Route{r}))
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
}
