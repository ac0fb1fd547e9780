package calc_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// TestIncrementalMatchesScratch drives the graph with random changes to a small cluster —
// pools changing mode, nodes moving subnet and tunnel address (and gaining or losing an IPv6
// address, several nodes often claiming one), blocks changing affinity and lending addresses,
// affinities changing state, workloads coming and going, services and endpoint slices with
// endpoints on known, unknown and no nodes — delivered in random batches with the first
// in-sync at a random point, and checks that the state it ends in (and its consumer's, fed
// only the updates) equals what a new graph computes from the final objects in one batch.
// Blocks of /26, /32 and /23 (more than one bucket of calc's address index) are in the mix,
// and a /32 pool that may equal a node's address. With BGP on, nodes carry labels, AS numbers
// and reflector cluster IDs, and BGP configurations and peers come and go too.
func TestIncrementalMatchesScratch(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (9 s): make test runs it")
	}
	const runs = 1500
	for seed := range uint64(runs) {
		r := rand.New(rand.NewPCG(seed, 7))
		u := newUniverse(r)
		var batches [][]store.Event
		var batch []store.Event
		syncAt := r.IntN(60)
		for step := range 60 {
			batch = append(batch, u.change(t))
			if step == syncAt {
				batch = append(batch, inSync())
			}
			if r.IntN(4) == 0 {
				batches = append(batches, batch)
				batch = nil
			}
		}
		batches = append(batches, append(batch, inSync()))
		for _, node := range []string{"node-a", "node-c"} {
			for _, bgp := range []bool{false, true} {
				cfg := calc.DefaultConfig(node)
				cfg.BGP = bgp
				got := finalState(t, cfg, batches)
				want := finalState(t, cfg, [][]store.Event{append(u.objects(t), inSync())})
				if got != want {
					t.Fatalf("seed %d, node %s, bgp %v: incremental state differs from scratch:\n--- incremental\n%s\n--- scratch\n%s\n--- events\n%s",
						seed, node, bgp, got, want, describeBatches(batches))
				}
			}
		}
	}
}

// universe is the random cluster: the current value of every key that exists.
type universe struct {
	r      *rand.Rand
	values map[string]string
}

var (
	propNodes   = []string{"node-a", "node-b", "node-c", "node-d"}
	propBlocks  = []string{"10.65.0.0/26", "10.65.0.64/26", "10.65.1.0/26", "10.65.4.0/23", "10.65.0.200/32", "10.66.0.0/26", "10.66.0.64/26"}
	propTunnels = []string{"10.65.0.0", "10.65.0.64", "10.65.1.5", "10.65.5.7", "10.66.0.1"}
)

func newUniverse(r *rand.Rand) *universe { return &universe{r: r, values: map[string]string{}} }

func (u *universe) pick(xs []string) string { return xs[u.r.IntN(len(xs))] }

// change upserts or deletes one random key and returns the event.
func (u *universe) change(t *testing.T) store.Event {
	key, value := u.randomObject()
	if _, ok := u.values[key]; ok && u.r.IntN(4) == 0 {
		delete(u.values, key)
		kind, id, err := store.ParseKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return store.Event{Type: store.EventDelete, Kind: kind, ID: id, Key: key}
	}
	u.values[key] = value
	return upsert(t, key, value)
}

func upsert(t *testing.T, key, value string) store.Event {
	obj, err := store.Decode(key, []byte(value))
	if err != nil {
		t.Fatalf("%s: %v\n%s", key, err, value)
	}
	return store.Event{Type: store.EventUpsert, Kind: obj.Kind(), ID: obj.ID(), Key: key, Object: obj, Value: []byte(value)}
}

func (u *universe) objects(t *testing.T) []store.Event {
	var out []store.Event
	for k, v := range u.values {
		out = append(out, upsert(t, k, v))
	}
	return out
}

func (u *universe) randomObject() (key, value string) {
	r := u.r
	switch r.IntN(9) {
	case 7:
		name := u.pick([]string{"default", "default", "node.node-a", "node.node-c"})
		if name != "default" {
			return store.BGPConfigPrefix + name, fmt.Sprintf(`{"kind":"BGPConfiguration","metadata":{"name":%q},"spec":{"listenPort":%d,"prefixAdvertisements":[{"cidr":%q,"communities":["65000:%d"]}]}}`,
				name, 1790+r.IntN(2), u.pick([]string{"10.65.0.0/16", "10.65.0.0/26"}), r.IntN(3))
		}
		return store.BGPConfigPrefix + name, fmt.Sprintf(`{"kind":"BGPConfiguration","metadata":{"name":"default"},"spec":{"asNumber":%d,"nodeToNodeMeshEnabled":%v,"serviceClusterIPs":[{"cidr":%q}],"serviceExternalIPs":[{"cidr":%q}],"prefixAdvertisements":[{"cidr":"10.65.0.0/16","communities":["65000:%d"]}]}}`,
			64512+r.IntN(2), r.IntN(3) != 0, u.pick([]string{"10.96.0.0/12", "10.96.0.1/32"}), u.pick([]string{"203.0.113.0/24", "203.0.113.1/32"}), r.IntN(3))
	case 8:
		name := u.pick([]string{"peer-1", "peer-2"})
		nodes := u.pick([]string{`"node":"node-a"`, `"nodeSelector":"rack == 'r1'"`, `"nodeSelector":"all()"`, `"nodeSelector":"!has(rr)"`})
		peers := u.pick([]string{`"peerIP":"192.0.2.1","asNumber":65001`, `"peerIP":"192.0.2.11","asNumber":65001`, `"peerSelector":"has(rr)"`, `"peerSelector":"rack == 'r2'"`})
		return store.BGPPeerPrefix + name, fmt.Sprintf(`{"kind":"BGPPeer","metadata":{"name":%q},"spec":{%s,%s}}`, name, nodes, peers)
	case 0:
		name, cidr, blockSize := "pool-a", "10.65.0.0/16", 26
		switch r.IntN(5) {
		case 0, 1:
			name, cidr = "pool-b", "10.66.0.0/16"
		case 2:
			name, cidr, blockSize = "pool-host", "192.0.2.10/32", 32
		}
		mode := u.pick([]string{"Always", "CrossSubnet", "Never"})
		return store.IPPoolPrefix + name, fmt.Sprintf(`{"kind":"IPPool","metadata":{"name":%q},"spec":{"cidr":%q,"vxlanMode":%q,"ipipMode":"Never","disabled":%v,"natOutgoing":%v,"blockSize":%d,"disableBGPExport":%v}}`,
			name, cidr, mode, r.IntN(5) == 0, r.IntN(2) == 0, blockSize, r.IntN(4) == 0)
	case 1:
		name := u.pick(propNodes)
		subnet := u.pick([]string{"192.0.2", "198.51.100"})
		tunnel := ""
		if r.IntN(4) != 0 {
			tunnel = fmt.Sprintf(`,"ipv4VXLANTunnelAddr":%q`, u.pick(propTunnels))
		}
		v6 := ""
		if r.IntN(2) == 0 {
			v6 = fmt.Sprintf(`,"ipv6Address":"2001:db8::%d/64"`, 10+r.IntN(5))
		}
		labels := u.pick([]string{"", `,"labels":{"rack":"r1"}`, `,"labels":{"rack":"r2"}`, `,"labels":{"rack":"r1","rr":"y"}`})
		bgpExtra := u.pick([]string{"", "", `,"asNumber":65010`, `,"routeReflectorClusterID":"10.0.0.1"`})
		return store.NodePrefix + name, fmt.Sprintf(`{"kind":"Node","metadata":{"name":%q%s},"spec":{"bgp":{"ipv4Address":"%s.%d/24"%s%s}%s}}`,
			name, labels, subnet, 10+r.IntN(20), v6, bgpExtra, tunnel)
	case 5:
		// Two services: svc-a IPv4 only, svc-b dual-stack; either may have node ports.
		name := u.pick([]string{"svc-a", "svc-b"})
		ips := `"10.96.0.1"`
		if name == "svc-b" {
			ips = `"10.96.0.2","fd00:96::2"`
		}
		typ := u.pick([]string{"ClusterIP", "NodePort"})
		ext := u.pick([]string{"", `,"externalIPs":["203.0.113.1"]`, `,"externalIPs":["203.0.113.2"]`})
		return store.ServicePrefix + "default/" + name, fmt.Sprintf(`{"kind":"Service","metadata":{"name":%q,"namespace":"default","uid":"uid-%s"},"spec":{"type":%q,"clusterIPs":[%s],"ports":[{"name":"http","protocol":"TCP","port":80,"nodePort":%d}],"externalTrafficPolicy":%q%s}}`,
			name, name, typ, ips, 30000+r.IntN(2), u.pick([]string{"Cluster", "Local"}), ext)
	case 6:
		// Slices naming propNodes, an unknown node and none; svc-b has an IPv6 slice too.
		name := u.pick([]string{"svc-a-1", "svc-a-2", "svc-b-1", "svc-b-v6"})
		svc, family := name[:5], "IPv4"
		if name == "svc-b-v6" {
			family = "IPv6"
		}
		var eps []string
		for i := range 1 + r.IntN(3) {
			a := fmt.Sprintf("10.65.0.%d", 1+r.IntN(8))
			if family == "IPv6" {
				a = fmt.Sprintf("fd00:65::%d", 1+r.IntN(8))
			}
			node := ""
			if j := r.IntN(len(propNodes) + 2); j < len(propNodes) {
				node = fmt.Sprintf(`,"nodeName":%q`, propNodes[j])
			} else if j == len(propNodes) {
				node = `,"nodeName":"node-gone"`
			}
			eps = append(eps, fmt.Sprintf(`{"addresses":[%q]%s,"conditions":{"ready":%v}}`, a, node, i == 0 || r.IntN(3) != 0))
		}
		return store.EndpointSlicePrefix + "default/" + name, fmt.Sprintf(`{"kind":"EndpointSlice","metadata":{"name":%q,"namespace":"default","labels":{"kubernetes.io/service-name":%q}},"addressType":%q,"endpoints":[%s],"ports":[{"name":"http","protocol":"TCP","port":8080}]}`,
			name, svc, family, strings.Join(eps, ","))
	case 2:
		cidr := netip.MustParsePrefix(u.pick(propBlocks))
		slots := 1 << (32 - cidr.Bits())
		allocs := make([]string, slots)
		var attrs []string
		for i := range allocs {
			allocs[i] = "null"
			if r.IntN(8) == 0 {
				allocs[i] = fmt.Sprint(len(attrs))
				attrs = append(attrs, fmt.Sprintf(`{"handle_id":"h%d","secondary":{"node":%q}}`, i, u.pick(propNodes)))
			}
		}
		affinity := `"host:` + u.pick(propNodes) + `"`
		if r.IntN(6) == 0 {
			affinity = "null"
		}
		return store.BlockKey(cidr), fmt.Sprintf(`{"cidr":%q,"affinity":%s,"allocations":[%s],"unallocated":[],"attributes":[%s],"deleted":%v}`,
			cidr, affinity, strings.Join(allocs, ","), strings.Join(attrs, ","), r.IntN(8) == 0)
	case 3:
		cidr := netip.MustParsePrefix(u.pick(propBlocks))
		return store.AffinityKey(u.pick(propNodes), cidr), fmt.Sprintf(`{"state":%q,"deleted":%v}`,
			u.pick([]string{"confirmed", "pending", "pendingDeletion"}), r.IntN(6) == 0)
	default:
		name := fmt.Sprintf("w%d", r.IntN(6))
		block := netip.MustParsePrefix(u.pick(propBlocks))
		a := block.Addr()
		for range r.IntN(1 << (32 - block.Bits())) {
			a = a.Next()
		}
		// Some with a floating IP, two workloads sometimes naming the same one.
		nats := ""
		if r.IntN(2) == 0 {
			nats = fmt.Sprintf(`,"ipNATs":[{"internalIP":%q,"externalIP":"203.0.113.%d"}]`, a, r.IntN(3))
		}
		return store.WorkloadEndpointPrefix + "default/" + name, fmt.Sprintf(`{"kind":"WorkloadEndpoint","metadata":{"name":%q,"namespace":"default"},"spec":{"orchestrator":"k8s","node":%q,"interfaceName":"cali-%s","ipNetworks":["%s/32"]%s}}`,
			name, u.pick(propNodes), name, a, nats)
	}
}

func describeBatches(batches [][]store.Event) string {
	var b strings.Builder
	for i, batch := range batches {
		fmt.Fprintf(&b, "batch %d:\n", i)
		for _, e := range batch {
			fmt.Fprintf(&b, "  %s %s %s\n", e.Type, e.Key, e.Value)
		}
	}
	return b.String()
}
