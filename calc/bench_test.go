package calc_test

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// benchCluster builds a cluster of nodes with 4 blocks each, 20 workload endpoints per node,
// and 2 services of 10 endpoints per node, as store events (already decoded).
type benchCluster struct {
	events []store.Event
	weps   []*store.WorkloadEndpoint
	blocks []*store.Block
}

func up(o store.Object) store.Event {
	key, _ := store.KeyFor(o.Kind(), o.ID())
	return store.Event{Type: store.EventUpsert, Kind: o.Kind(), ID: o.ID(), Key: key, Object: o}
}

func nodeName(i int) string { return fmt.Sprintf("node-%05d", i) }

// blockCIDR gives node i's j-th /26 inside 10.0.0.0/8.
func blockCIDR(i, j int) netip.Prefix {
	n := (i*4 + j) * 64
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)}), 26)
}

func makeCluster(nodes int) *benchCluster {
	c := &benchCluster{}
	c.events = append(c.events, up(&store.IPPool{Name: "pool", CIDR: netip.MustParsePrefix("10.0.0.0/8"), VXLANMode: store.EncapCrossSubnet, IPIPMode: store.EncapNever, BlockSize: 26}))
	for i := range nodes {
		name := nodeName(i)
		tunnel := blockCIDR(i, 0).Addr()
		c.events = append(c.events, up(&store.Node{Name: name, IPv4Address: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + i>>16), byte(i >> 8), byte(i)}), 20), IPv4VXLANTunnelAddr: tunnel}))
		for j := range 4 {
			b := &store.Block{CIDR: blockCIDR(i, j), Affinity: "host:" + name, AffinityNode: name}
			c.blocks = append(c.blocks, b)
			c.events = append(c.events, up(b), up(&store.BlockAffinity{Node: name, CIDR: b.CIDR, State: store.AffinityConfirmed}))
		}
		for k := range 20 {
			addr := blockCIDR(i, k%4).Addr()
			for range 1 + k/4 {
				addr = addr.Next()
			}
			w := &store.WorkloadEndpoint{Namespace: "ns", Name: fmt.Sprintf("%s-w%d", name, k), Node: name,
				InterfaceName: fmt.Sprintf("cali%05d%02d", i, k), IPNetworks: []netip.Prefix{netip.PrefixFrom(addr, 32)}}
			c.weps = append(c.weps, w)
			c.events = append(c.events, up(w))
		}
		for s := range 2 {
			id := i*2 + s
			svc := &store.Service{Namespace: "ns", Name: fmt.Sprintf("svc-%d", id), UID: fmt.Sprint(id), Type: store.ServiceNodePort,
				ClusterIPs:            []netip.Addr{netip.AddrFrom4([4]byte{10, 96 + byte(id>>16), byte(id >> 8), byte(id)})},
				Ports:                 []store.ServicePortSpec{{Name: "http", Protocol: store.ProtocolTCP, Port: 80, NodePort: uint16(30000 + id%2768)}},
				ExternalTrafficPolicy: store.PolicyCluster, InternalTrafficPolicy: store.PolicyCluster}
			es := &store.EndpointSlice{Namespace: "ns", Name: svc.Name + "-1", Service: svc.Name, AddressType: "IPv4",
				Ports: []store.EndpointPort{{Name: "http", Protocol: store.ProtocolTCP, Port: 8080}}}
			for e := range 10 {
				w := c.weps[len(c.weps)-1-(e*7+s)%20]
				if i > 0 && e%2 == 1 { // half the endpoints on the previous node
					w = c.weps[len(c.weps)-21-(e*3)%20]
				}
				es.Endpoints = append(es.Endpoints, store.Endpoint{Addresses: []netip.Addr{w.IPNetworks[0].Addr()}, Ready: true, Serving: true, NodeName: w.Node})
			}
			c.events = append(c.events, up(svc), up(es))
		}
	}
	c.events = append(c.events, store.Event{Type: store.EventInSync})
	return c
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkFullComputation: 5,000 nodes, 20,000 blocks, 100,000 workload endpoints and 10,000
// services of 10 endpoints, from nothing to the full state at in-sync.
func BenchmarkFullComputation(b *testing.B) {
	c := makeCluster(5000)
	var g *calc.Graph
	var ops int
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		g, _ = calc.New(calc.DefaultConfig(nodeName(7)))
		u := g.OnEvents(c.events)
		ops = len(u.Ops)
	}
	b.StopTimer()
	before := heapInUse()
	g, _ = calc.New(calc.DefaultConfig(nodeName(7)))
	g.OnEvents(c.events)
	after := heapInUse()
	runtime.KeepAlive(g)
	b.ReportMetric(float64(after-before)/float64(len(c.weps)), "calc-bytes/wep")
	b.ReportMetric(float64(ops), "ops")
}

// BenchmarkOneChange measures one change after in-sync at several cluster sizes: a remote
// workload endpoint moving to another address, or a remote block's allocations changing.
func BenchmarkOneChange(b *testing.B) {
	for _, nodes := range []int{1000, 5000, 20000} {
		c := makeCluster(nodes)
		g, _ := calc.New(calc.DefaultConfig(nodeName(7)))
		g.OnEvents(c.events)
		b.Run(fmt.Sprintf("endpoint/nodes=%d", nodes), func(b *testing.B) {
			// Precompute two versions of many endpoints; each change flips one.
			const n = 1024
			alt := make([][2]store.Event, n)
			for i := range n {
				w := c.weps[(i*7919)%len(c.weps)]
				moved := *w
				moved.IPNetworks = []netip.Prefix{netip.PrefixFrom(w.IPNetworks[0].Addr().Next().Next().Next().Next().Next().Next(), 32)}
				alt[i] = [2]store.Event{up(&moved), up(w)}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				e := alt[i%n][(i/n)%2]
				g.OnEvents([]store.Event{e})
			}
		})
		b.Run(fmt.Sprintf("slice/nodes=%d", nodes), func(b *testing.B) {
			// An endpoint of a service's slice turning terminating and back (two services per node).
			const n = 1024
			var slices []*store.EndpointSlice
			for _, ev := range c.events {
				if es, ok := ev.Object.(*store.EndpointSlice); ok {
					slices = append(slices, es)
				}
			}
			alt := make([][2]store.Event, n)
			for i := range n {
				es := slices[(i*7919)%len(slices)]
				changed := *es
				changed.Endpoints = append([]store.Endpoint(nil), es.Endpoints...)
				changed.Endpoints[0].Ready, changed.Endpoints[0].Terminating = false, true
				alt[i] = [2]store.Event{up(&changed), up(es)}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				g.OnEvents([]store.Event{alt[i%n][(i/n)%2]})
			}
		})
		b.Run(fmt.Sprintf("node-moves/nodes=%d", nodes), func(b *testing.B) {
			// A node with endpoints (half of its neighbour's services' endpoints are on it)
			// moving to another underlay address and back: the services with an endpoint
			// there are found through the index of slices by node.
			var nodes []*store.Node
			for _, ev := range c.events {
				if n, ok := ev.Object.(*store.Node); ok {
					nodes = append(nodes, n)
				}
			}
			const n = 1024
			alt := make([][2]store.Event, n)
			for i := range n {
				nd := nodes[1+(i*7919)%(len(nodes)-1)]
				moved := *nd
				moved.IPv4Address = netip.PrefixFrom(nd.IPv4Address.Addr().Next(), nd.IPv4Address.Bits())
				alt[i] = [2]store.Event{up(&moved), up(nd)}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				g.OnEvents([]store.Event{alt[i%n][(i/n)%2]})
			}
		})
		b.Run(fmt.Sprintf("block/nodes=%d", nodes), func(b *testing.B) {
			const n = 1024
			alt := make([][2]store.Event, n)
			for i := range n {
				blk := c.blocks[(i*7919)%len(c.blocks)]
				changed := *blk
				changed.Allocations = append([]store.Allocation{{Addr: blk.CIDR.Addr(), Handle: "h", Node: blk.AffinityNode}}, blk.Allocations...)
				alt[i] = [2]store.Event{up(&changed), up(blk)}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				g.OnEvents([]store.Event{alt[i%n][(i/n)%2]})
			}
		})
	}
}

// BenchmarkColdStartBatches is sluiced's cold start as calc sees it (the data of `make
// bench-dataplane`): a VXLAN pool, this node and the remote nodes, 20,000 remote blocks, and
// (at 1,000 nodes) their affinities, delivered as the intake reads them: pools, pages of
// 10,000 nodes, pages of 10,000 blocks (and of 10,000 affinities), then in-sync. Two shapes:
// 1,000 nodes with 20 blocks each, and 20,000 nodes with one each, each its own tunnel
// address (issue #11's; sluiced reads only its own node's affinities, so none there).
func BenchmarkColdStartBatches(b *testing.B) {
	for _, sh := range []struct{ nodes, ops int }{{1000, 22_003}, {20_000, 60_003}} {
		b.Run(fmt.Sprintf("nodes=%d", sh.nodes), func(b *testing.B) {
			batches := coldStartBatches(sh.nodes, sh.nodes == 1000)
			b.ReportAllocs()
			for range b.N {
				g, _ := calc.New(calc.DefaultConfig("node-00000"))
				var u *calc.Update
				for _, batch := range batches {
					u = g.OnEvents(batch)
				}
				if len(u.Ops) != sh.ops {
					b.Fatalf("%d ops, want %d", len(u.Ops), sh.ops)
				}
			}
		})
	}
}

func coldStartBatches(nodes int, affinities bool) [][]store.Event {
	var batches [][]store.Event
	batches = append(batches, []store.Event{up(&store.IPPool{Name: "bench", CIDR: netip.MustParsePrefix("10.64.0.0/10"), VXLANMode: store.EncapAlways, IPIPMode: store.EncapNever, BlockSize: 26})})
	all := []store.Event{up(&store.Node{Name: "node-00000", IPv4Address: netip.MustParsePrefix("192.0.2.11/24"), IPv4VXLANTunnelAddr: netip.MustParseAddr("172.31.0.1")})}
	block := func(i int) (netip.Prefix, string) {
		n := i * 64
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(64 + n>>16), byte(n >> 8), byte(n)}), 26), fmt.Sprintf("node-%05d", i%nodes+1)
	}
	for n := 1; n <= nodes; n++ {
		tunnel, _ := block(n - 1)
		all = append(all, up(&store.Node{Name: fmt.Sprintf("node-%05d", n), IPv4Address: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, byte(18 + n>>16), byte(n >> 8), byte(n)}), 15), IPv4VXLANTunnelAddr: tunnel.Addr()}))
	}
	for i := 0; i < len(all); i += 10_000 {
		batches = append(batches, all[i:min(i+10_000, len(all))])
	}
	var blocks, affs []store.Event
	for i := range 20_000 {
		cidr, node := block(i)
		blocks = append(blocks, up(&store.Block{CIDR: cidr, Affinity: "host:" + node, AffinityNode: node}))
		affs = append(affs, up(&store.BlockAffinity{Node: node, CIDR: cidr, State: store.AffinityConfirmed}))
	}
	batches = append(batches, blocks[:10_000], blocks[10_000:])
	if affinities {
		batches = append(batches, affs[:10_000], affs[10_000:])
	}
	return append(batches, []store.Event{{Type: store.EventInSync}})
}

// BenchmarkServicesArriving is BenchmarkServicesArriving in cmd/sluiced as calc sees it: a
// cluster of 5,000 nodes in sync with no service, then 10,000 services of 10 endpoints each
// arriving one event at a time, each service before its slice (as four parallel `sluicectl
// apply` write them). One op is one service and its slice, each its own OnEvents.
func BenchmarkServicesArriving(b *testing.B) {
	c := makeCluster(5000)
	var base, svcs []store.Event
	for _, ev := range c.events {
		switch ev.Kind {
		case store.KindService, store.KindEndpointSlice:
			svcs = append(svcs, ev)
		default:
			base = append(base, ev)
		}
	}
	var g *calc.Graph
	fresh := func() {
		g, _ = calc.New(calc.DefaultConfig(nodeName(7)))
		g.OnEvents(base)
	}
	fresh()
	var ops int
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		j := 2 * (i % (len(svcs) / 2))
		if j == 0 && i > 0 {
			b.StopTimer()
			fresh()
			b.StartTimer()
		}
		ops += len(g.OnEvents(svcs[j : j+1]).Ops)
		ops += len(g.OnEvents(svcs[j+1 : j+2]).Ops)
	}
	b.ReportMetric(float64(ops)/float64(b.N), "ops/service")
}
