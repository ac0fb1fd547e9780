package calc_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// Objects for the BGP rule tables, as calicoctl and calico-ipam write them.

func bgpPool(name, cidr string, noExport bool) string {
	return fmt.Sprintf(`%s%s {"spec":{"cidr":%q,"vxlanMode":"Never","disableBGPExport":%v}}`, store.IPPoolPrefix, name, cidr, noExport)
}

func bgpNode(name, addr string, extra ...string) string {
	labels, bgp := "", ""
	for _, e := range extra {
		if strings.HasPrefix(e, "labels:") {
			labels = `,"labels":{` + strings.TrimPrefix(e, "labels:") + `}`
		} else {
			bgp += "," + e
		}
	}
	return fmt.Sprintf(`%s%s {"metadata":{"name":%q%s},"spec":{"bgp":{"ipv4Address":%q%s}}}`, store.NodePrefix, name, name, labels, addr, bgp)
}

func bgpBlock(cidr, node string, held ...string) string {
	p := netip.MustParsePrefix(cidr)
	allocs := make([]string, 1<<(32-p.Bits()))
	var attrs []string
	for i := range allocs {
		allocs[i] = "null"
	}
	for _, h := range held {
		addr, owner, _ := strings.Cut(h, "@")
		i := int(netip.MustParseAddr(addr).As4()[3] - p.Addr().As4()[3])
		allocs[i] = fmt.Sprint(len(attrs))
		attrs = append(attrs, fmt.Sprintf(`{"handle_id":"h-%s","secondary":{"node":%q}}`, addr, owner))
	}
	return fmt.Sprintf(`%s {"cidr":%q,"affinity":"host:%s","allocations":[%s],"unallocated":[],"attributes":[%s]}`,
		store.BlockKey(p), cidr, node, strings.Join(allocs, ","), strings.Join(attrs, ","))
}

func bgpAffinity(node, cidr, state string) string {
	return fmt.Sprintf(`%s {"state":%q}`, store.AffinityKey(node, netip.MustParsePrefix(cidr)), state)
}

func bgpWEP(name, node, addr, floating string) string {
	nat := ""
	if floating != "" {
		nat = fmt.Sprintf(`,"ipNATs":[{"internalIP":%q,"externalIP":%q}]`, addr, floating)
	}
	return fmt.Sprintf(`%sdefault/%s {"spec":{"node":%q,"interfaceName":"cali-%s","ipNetworks":["%s/32"]%s}}`,
		store.WorkloadEndpointPrefix, name, node, name, addr, nat)
}

func bgpService(name, policy, typ string, clusterIP string, ext, lb []string) string {
	status := ""
	if len(lb) > 0 {
		status = fmt.Sprintf(`,"status":{"loadBalancer":{"ingress":[{"ip":%q}]}}`, lb[0])
	}
	extJSON := ""
	if len(ext) > 0 {
		extJSON = fmt.Sprintf(`,"externalIPs":["%s"]`, strings.Join(ext, `","`))
	}
	return fmt.Sprintf(`%sdefault/%s {"metadata":{"name":%q,"namespace":"default","uid":"u"},"spec":{"type":%q,"clusterIPs":[%q],"ports":[{"name":"p","protocol":"TCP","port":80}],"externalTrafficPolicy":%q%s}%s}`,
		store.ServicePrefix, name, name, typ, clusterIP, policy, extJSON, status)
}

func bgpSlice(service, addr, node string, ready bool) string {
	return fmt.Sprintf(`%sdefault/%s-1 {"metadata":{"name":"%s-1","namespace":"default","labels":{"kubernetes.io/service-name":%q}},"addressType":"IPv4","endpoints":[{"addresses":[%q],"nodeName":%q,"conditions":{"ready":%v}}],"ports":[{"name":"p","protocol":"TCP","port":8080}]}`,
		store.EndpointSlicePrefix, service, service, service, addr, node, ready)
}

func bgpConfig(name, spec string) string {
	return fmt.Sprintf(`%s%s {"spec":{%s}}`, store.BGPConfigPrefix, name, spec)
}

func bgpPeer(name, spec string) string {
	return fmt.Sprintf(`%s%s {"spec":{%s}}`, store.BGPPeerPrefix, name, spec)
}

// bgpEvents turns "key value" lines into upserts ("-key" deletes).
func bgpEvents(t *testing.T, objs []string) []store.Event {
	t.Helper()
	var out []store.Event
	for _, o := range objs {
		key, value, _ := strings.Cut(o, " ")
		if strings.HasPrefix(key, "-") {
			kind, id, err := store.ParseKey(key[1:])
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, store.Event{Type: store.EventDelete, Kind: kind, ID: id, Key: key[1:]})
			continue
		}
		out = append(out, upsert(t, key, value))
	}
	return out
}

// announced runs objs (in one batch, then one object a batch) through node-a's graph with BGP
// on and returns what it announces as "prefix reason" lines; both ways must agree.
func announced(t *testing.T, cfg calc.Config, objs []string) (paths []string, s *calc.State) {
	t.Helper()
	evs := bgpEvents(t, objs)
	var got [2][]string
	for i, batches := range [][][]store.Event{{append(slices.Clone(evs), inSync())}, oneEach(evs)} {
		g, err := calc.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range batches {
			g.OnEvents(b)
		}
		s = g.State()
		for _, p := range s.BGPPaths {
			got[i] = append(got[i], p.Prefix.String()+" "+p.Reason)
		}
	}
	if !slices.Equal(got[0], got[1]) {
		t.Fatalf("in one batch %v, one object a batch %v", got[0], got[1])
	}
	return got[0], s
}

func oneEach(evs []store.Event) [][]store.Event {
	out := [][]store.Event{{inSync()}}
	for _, e := range evs {
		out = append(out, []store.Event{e})
	}
	return out
}

func bgpCfg(node string) calc.Config {
	c := calc.DefaultConfig(node)
	c.BGP = true
	return c
}

// TestBGPExportRules is one table for each of calico/node's export rules (its BIRD templates'
// calico_export_to_bgp_peers and confd's service route generator): each case is a cluster
// and what node-a announces in it.
func TestBGPExportRules(t *testing.T) {
	base := []string{bgpPool("routed", "10.80.0.0/16", false), bgpPool("private", "10.81.0.0/16", true),
		bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.12/24")}
	cases := []struct {
		rule string
		objs []string
		want []string
	}{
		{"an affine block is announced (its blackhole is the source)",
			[]string{bgpBlock("10.80.0.0/26", "node-a"), bgpAffinity("node-a", "10.80.0.0/26", "confirmed")},
			[]string{"10.80.0.0/26 block"}},
		{"a block not yet confirmed is not",
			[]string{bgpBlock("10.80.0.0/26", "node-a"), bgpAffinity("node-a", "10.80.0.0/26", "pending")}, nil},
		{"another node's block is not",
			[]string{bgpBlock("10.80.0.64/26", "node-b"), bgpAffinity("node-b", "10.80.0.64/26", "confirmed")}, nil},
		{"a pool with disableBGPExport is never announced",
			[]string{bgpBlock("10.81.0.0/26", "node-a", "10.81.0.5@node-a"), bgpAffinity("node-a", "10.81.0.0/26", "confirmed"),
				bgpWEP("w", "node-a", "10.81.0.5", ""), bgpBlock("10.81.0.64/26", "node-b", "10.81.0.70@node-a"), bgpWEP("b", "node-a", "10.81.0.70", "")}, nil},
		{"an address borrowed from another node's block is announced alone",
			[]string{bgpBlock("10.80.0.64/26", "node-b", "10.80.0.70@node-a"), bgpAffinity("node-b", "10.80.0.64/26", "confirmed"),
				bgpWEP("b", "node-a", "10.80.0.70", "")},
			[]string{"10.80.0.70/32 workload"}},
		{"a workload inside this node's announced block is not announced alone",
			[]string{bgpWEP("w", "node-a", "10.80.0.5", ""), bgpBlock("10.80.0.0/26", "node-a", "10.80.0.5@node-a"),
				bgpAffinity("node-a", "10.80.0.0/26", "confirmed")},
			[]string{"10.80.0.0/26 block"}},
		{"once the block's affinity goes, its workload is announced alone",
			[]string{bgpWEP("w", "node-a", "10.80.0.5", ""), bgpBlock("10.80.0.0/26", "node-a", "10.80.0.5@node-a"),
				bgpAffinity("node-a", "10.80.0.0/26", "confirmed"), "-" + store.AffinityKey("node-a", netip.MustParsePrefix("10.80.0.0/26"))},
			[]string{"10.80.0.5/32 workload"}},
		{"a workload of a single-address block is announced",
			[]string{bgpBlock("10.80.1.7/32", "node-a", "10.80.1.7@node-a"), bgpAffinity("node-a", "10.80.1.7/32", "confirmed"),
				bgpWEP("w", "node-a", "10.80.1.7", "")},
			[]string{"10.80.1.7/32 workload"}},
		{"a workload address in no pool is not announced",
			[]string{bgpWEP("w", "node-a", "172.16.0.5", "")}, nil},
		{"a local workload's floating IP is announced; a remote one's is not",
			[]string{bgpWEP("w", "node-a", "10.80.0.5", "203.0.113.50"), bgpWEP("r", "node-b", "10.80.0.70", "203.0.113.51")},
			[]string{"10.80.0.5/32 workload", "203.0.113.50/32 floating-ip"}},
		{"service ranges are announced from every node",
			[]string{bgpConfig("default", `"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}],"serviceExternalIPs":[{"cidr":"203.0.113.0/24"}],"serviceLoadBalancerIPs":[{"cidr":"198.51.100.0/24"}]`)},
			[]string{"10.96.0.0/12 service-range", "198.51.100.0/24 service-range", "203.0.113.0/24 service-range"}},
		{"a Local service with a ready endpoint here: its listed addresses",
			[]string{bgpConfig("default", `"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}],"serviceExternalIPs":[{"cidr":"203.0.113.0/24"}]`),
				bgpService("web", "Local", "ClusterIP", "10.96.0.10", []string{"203.0.113.9", "192.0.2.99"}, nil), bgpSlice("web", "10.80.0.5", "node-a", true)},
			[]string{"10.96.0.0/12 service-range", "10.96.0.10/32 service", "203.0.113.0/24 service-range", "203.0.113.9/32 service"}},
		{"a Local service whose endpoint here is not ready: nothing of its",
			[]string{bgpConfig("default", `"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}]`),
				bgpService("web", "Local", "ClusterIP", "10.96.0.10", nil, nil), bgpSlice("web", "10.80.0.5", "node-a", false)},
			[]string{"10.96.0.0/12 service-range"}},
		{"a Local service with endpoints elsewhere only: nothing of its",
			[]string{bgpConfig("default", `"serviceLoadBalancerIPs":[{"cidr":"198.51.100.0/24"}]`),
				bgpService("lb", "Local", "LoadBalancer", "10.96.0.12", nil, []string{"198.51.100.12"}), bgpSlice("lb", "10.80.0.70", "node-b", true)},
			[]string{"198.51.100.0/24 service-range"}},
		{"a Local load balancer with a ready endpoint here: its ingress address",
			[]string{bgpConfig("default", `"serviceLoadBalancerIPs":[{"cidr":"198.51.100.0/24"}]`),
				bgpService("lb", "Local", "LoadBalancer", "10.96.0.12", nil, []string{"198.51.100.12"}), bgpSlice("lb", "10.80.0.5", "node-a", true)},
			[]string{"198.51.100.0/24 service-range", "198.51.100.12/32 service"}},
		{"cluster IPs only when a cluster range is listed",
			[]string{bgpConfig("default", `"serviceExternalIPs":[{"cidr":"203.0.113.0/24"}]`),
				bgpService("web", "Local", "ClusterIP", "10.96.0.10", []string{"203.0.113.9"}, nil), bgpSlice("web", "10.80.0.5", "node-a", true)},
			[]string{"203.0.113.0/24 service-range", "203.0.113.9/32 service"}},
		{"a Cluster service: nothing but the ranges",
			[]string{bgpConfig("default", `"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}],"serviceExternalIPs":[{"cidr":"203.0.113.0/24"}]`),
				bgpService("api", "Cluster", "ClusterIP", "10.96.0.11", []string{"203.0.113.9"}, nil)},
			[]string{"10.96.0.0/12 service-range", "203.0.113.0/24 service-range"}},
		{"a Cluster service with an address in a single-address range: all its addresses, from every node",
			[]string{bgpConfig("default", `"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}],"serviceExternalIPs":[{"cidr":"203.0.113.9/32"}]`),
				bgpService("api", "Cluster", "ClusterIP", "10.96.0.11", []string{"203.0.113.9"}, nil)},
			[]string{"10.96.0.0/12 service-range", "10.96.0.11/32 service", "203.0.113.9/32 service-range"}},
		{"a node labelled exclude-from-external-load-balancers announces no service address",
			[]string{bgpNode("node-a", "192.0.2.11/24", `labels:"`+calc.ExcludeFromLBLabel+`":"true"`),
				bgpConfig("default", `"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}]`),
				bgpService("web", "Local", "ClusterIP", "10.96.0.10", nil, nil), bgpSlice("web", "10.80.0.5", "node-a", true)},
			[]string{"10.96.0.0/12 service-range"}},
		{"the exclusion label set to anything but true excludes nothing",
			[]string{bgpNode("node-a", "192.0.2.11/24", `labels:"`+calc.ExcludeFromLBLabel+`":"false"`),
				bgpConfig("default", `"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}]`),
				bgpService("web", "Local", "ClusterIP", "10.96.0.10", nil, nil), bgpSlice("web", "10.80.0.5", "node-a", true)},
			[]string{"10.96.0.0/12 service-range", "10.96.0.10/32 service"}},
		{"a node without spec.bgp announces nothing",
			[]string{`/calico/resources/v3/projectcalico.org/nodes/node-a {"spec":{"addresses":[{"address":"192.0.2.11","type":"InternalIP"}]}}`,
				bgpBlock("10.80.0.0/26", "node-a"), bgpAffinity("node-a", "10.80.0.0/26", "confirmed"),
				bgpConfig("default", `"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}]`)}, nil},
	}
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			got, _ := announced(t, bgpCfg("node-a"), append(slices.Clone(base), c.objs...))
			if !slices.Equal(got, c.want) {
				t.Fatalf("announced %q, want %q", got, c.want)
			}
		})
	}
	// With BGP off (the option), nothing at all: no speaker, sessions or paths.
	_, s := announced(t, calc.DefaultConfig("node-a"), append(slices.Clone(base), bgpBlock("10.80.0.0/26", "node-a"),
		bgpAffinity("node-a", "10.80.0.0/26", "confirmed"), bgpPeer("p", `"peerIP":"192.0.2.1","asNumber":65001`)))
	if s.BGPSpeaker != nil || len(s.BGPPeers) != 0 || len(s.BGPPaths) != 0 {
		t.Fatalf("BGP off computed %+v %v %v", s.BGPSpeaker, s.BGPPeers, s.BGPPaths)
	}
}

// TestBGPCommunities: prefix advertisements give communities to the routes inside them, from
// the cluster's configuration and the node's own, by name or value, sorted and once each.
func TestBGPCommunities(t *testing.T) {
	_, s := announced(t, bgpCfg("node-a"), []string{bgpPool("routed", "10.80.0.0/16", false), bgpNode("node-a", "192.0.2.11/24"),
		bgpBlock("10.80.0.0/26", "node-a"), bgpAffinity("node-a", "10.80.0.0/26", "confirmed"),
		bgpConfig("default", `"communities":[{"name":"rack","value":"65000:100"}],"prefixAdvertisements":[{"cidr":"10.80.0.0/16","communities":["rack","64512:1:2"]},{"cidr":"10.0.0.0/8","communities":["65000:100"]}],"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}]`),
		bgpConfig("node.node-a", `"prefixAdvertisements":[{"cidr":"10.80.0.0/26","communities":["65000:26"]},{"cidr":"10.80.0.0/24","communities":["65000:100"]}]`)})
	var got []string
	for _, p := range s.BGPPaths {
		got = append(got, (&p).String())
	}
	want := []string{"10.80.0.0/26 (block) communities 65000:26,65000:100,64512:1:2", "10.96.0.0/12 (service-range) communities 65000:100"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

// TestBGPSessionRules is one table for each rule by which calico/node makes sessions: the
// mesh, explicit peers, selectors both ways, route reflectors, AS numbers and ports.
func TestBGPSessionRules(t *testing.T) {
	cases := []struct {
		rule string
		node string
		objs []string
		want []string // "peer as local-as flags node origin"
	}{
		{"the mesh: every other BGP node, the higher address connecting",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.12/24"), bgpNode("node-c", "192.0.2.10/24"),
				`/calico/resources/v3/projectcalico.org/nodes/node-d {"spec":{"addresses":[{"address":"192.0.2.13","type":"InternalIP"}]}}`},
			[]string{"192.0.2.10 64512 64512 - node-c mesh", "192.0.2.12 64512 64512 passive node-b mesh"}},
		{"the mesh off",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.12/24"), bgpConfig("default", `"nodeToNodeMeshEnabled":false`)}, nil},
		{"AS numbers: the node's own, else the cluster's",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24", `"asNumber":65011`), bgpNode("node-b", "192.0.2.12/24"), bgpConfig("default", `"asNumber":64600`)},
			[]string{"192.0.2.12 64600 65011 passive node-b mesh"}},
		{"a reflector leaves the mesh; the others keep it without it",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.12/24"), bgpNode("node-rr", "192.0.2.2/24", `"routeReflectorClusterID":"10.0.0.1"`)},
			[]string{"192.0.2.12 64512 64512 passive node-b mesh"}},
		{"a reflector has no mesh",
			"node-rr", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-rr", "192.0.2.2/24", `"routeReflectorClusterID":"10.0.0.1"`)}, nil},
		{"a global peer: every node",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpConfig("default", `"nodeToNodeMeshEnabled":false`),
				bgpPeer("tor", `"peerIP":"192.0.2.1:1179","asNumber":65001,"localASNumber":64999,"keepOriginalNextHop":true,"ttlSecurity":1`)},
			[]string{"192.0.2.1:1179 65001 64999 ttl-security=1,next-hop=Keep - BGPPeer tor"}},
		{"a node peer applies to its node only; a node selector to the nodes it selects",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24", `labels:"rack":"r1"`), bgpConfig("default", `"nodeToNodeMeshEnabled":false`),
				bgpPeer("mine", `"node":"node-a","peerIP":"192.0.2.1","asNumber":65001`), bgpPeer("theirs", `"node":"node-b","peerIP":"192.0.2.3","asNumber":65001`),
				bgpPeer("r1", `"nodeSelector":"rack == 'r1'","peerIP":"192.0.2.4","asNumber":65001`), bgpPeer("r2", `"nodeSelector":"rack == 'r2'","peerIP":"192.0.2.5","asNumber":65001`)},
			[]string{"192.0.2.1 65001 64512 - - BGPPeer mine", "192.0.2.4 65001 64512 - - BGPPeer r1"}},
		{"peerSelector: the selected nodes, rr-client from a reflector",
			"node-rr", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.12/24", `"routeReflectorClusterID":"10.0.0.1"`, `labels:"rr":"y"`),
				bgpNode("node-rr", "192.0.2.2/24", `"routeReflectorClusterID":"10.0.0.1"`, `labels:"rr":"y"`),
				bgpPeer("rr", `"nodeSelector":"has(rr)","peerSelector":"all()"`)},
			[]string{"192.0.2.11 64512 64512 rr-client node-a BGPPeer rr", "192.0.2.12 64512 64512 - node-b BGPPeer rr"}},
		{"peerSelector the other way: a selected node peers back",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-rr", "192.0.2.2/24", `"routeReflectorClusterID":"10.0.0.1"`, `labels:"rr":"y"`),
				bgpPeer("rr", `"nodeSelector":"has(rr)","peerSelector":"!has(rr)"`)},
			[]string{"192.0.2.2 64512 64512 passive node-rr BGPPeer rr"}}, // "192.0.2.2" > "192.0.2.11" as text
		{"node sessions are one-way by their addresses as text, as calico/node's templates compare them",
			"node-a", []string{bgpNode("node-a", "10.0.0.9/24"), bgpNode("node-b", "10.0.0.10/24")},
			[]string{"10.0.0.10 64512 64512 - node-b mesh"}}, // "10.0.0.10" < "10.0.0.9": node-a connects
		{"a mesh peer's port is its node's listen port",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.12/24"), bgpNode("node-c", "192.0.2.13/24"),
				bgpConfig("default", `"listenPort":1790`), bgpConfig("node.node-c", `"listenPort":1791`)},
			[]string{"192.0.2.12:1790 64512 64512 passive node-b mesh", "192.0.2.13:1791 64512 64512 passive node-c mesh"}},
		{"rr-client: iBGP peers only, by address too",
			"node-rr", []string{bgpNode("node-rr", "192.0.2.2/24", `"routeReflectorClusterID":"10.0.0.1"`, `labels:"rr":"y"`),
				bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-x", "192.0.2.12/24", `"asNumber":65099`),
				bgpPeer("clients", `"nodeSelector":"has(rr)","peerSelector":"!has(rr)"`),
				bgpPeer("tor", `"nodeSelector":"has(rr)","peerIP":"192.0.2.1","asNumber":64512`),
				bgpPeer("upstream", `"nodeSelector":"has(rr)","peerIP":"192.0.2.3","asNumber":65001`)},
			[]string{"192.0.2.1 64512 64512 rr-client - BGPPeer tor", "192.0.2.3 65001 64512 - - BGPPeer upstream",
				"192.0.2.11 64512 64512 rr-client node-a BGPPeer clients", "192.0.2.12 65099 64512 - node-x BGPPeer clients"}},
		{"reversePeering Manual: no peering back",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-rr", "192.0.2.2/24", `"routeReflectorClusterID":"10.0.0.1"`, `labels:"rr":"y"`),
				bgpPeer("rr", `"nodeSelector":"has(rr)","peerSelector":"!has(rr)","reversePeering":"Manual"`)}, nil},
		{"an explicit peer takes a mesh peer's place",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.12/24"),
				bgpPeer("b", `"peerIP":"192.0.2.12","asNumber":64512,"password":{"secretKeyRef":{"name":"s","key":"b"}}`)},
			[]string{"192.0.2.12 64512 64512 password=s/b - BGPPeer b"}},
		{"two explicit peers of one address: the first by name, and a problem",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpConfig("default", `"nodeToNodeMeshEnabled":false`),
				bgpPeer("a-tor", `"peerIP":"192.0.2.1","asNumber":65001`), bgpPeer("b-tor", `"peerIP":"192.0.2.1","asNumber":65002`)},
			[]string{"192.0.2.1 65001 64512 - - BGPPeer a-tor", "problem bgp/session/192.0.2.1"}},
		{"a peer of a family this node has no address of: no session, a problem",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpPeer("v6", `"peerIP":"fd00::1","asNumber":65001`)},
			[]string{"problem bgp/session/fd00::1"}},
		{"the mesh password and restart time",
			"node-a", []string{bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.10/24"),
				bgpConfig("default", `"nodeMeshPassword":{"secretKeyRef":{"name":"mesh","key":"pw"}},"nodeMeshMaxRestartTime":"90s"`)},
			[]string{"192.0.2.10 64512 64512 password=mesh/pw,restart=1m30s node-b mesh"}},
	}
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			_, s := announced(t, bgpCfg(c.node), c.objs)
			var got []string
			for _, p := range s.BGPPeers {
				peer := p.Addr.String()
				if p.Port != 0 {
					peer = netip.AddrPortFrom(p.Addr, p.Port).String()
				}
				node := p.Node
				if node == "" {
					node = "-"
				}
				fl := p.Flags()
				if fl == "" {
					fl = "-"
				}
				got = append(got, fmt.Sprintf("%s %d %d %s %s %s", peer, p.ASN, p.LocalASN, fl, node, p.Origin))
			}
			for _, pr := range s.Problems {
				if strings.HasPrefix(pr.Key, "bgp/") {
					got = append(got, "problem "+pr.Key)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("sessions %q\nwant %q", got, c.want)
			}
		})
	}
}

// TestBGPSpeaker: the speaker's AS, router ID and port, and none without spec.bgp.
func TestBGPSpeaker(t *testing.T) {
	_, s := announced(t, bgpCfg("node-a"), []string{bgpNode("node-a", "192.0.2.11/24", `"routeReflectorClusterID":"10.0.0.1"`),
		bgpConfig("default", `"asNumber":"1.10","listenPort":1179`), bgpConfig("node.node-a", `"listenPort":1790`)})
	if sp := s.BGPSpeaker; sp == nil || sp.ASN != 65546 || sp.RouterID.String() != "192.0.2.11" || sp.ListenPort != 1790 || sp.ClusterID.String() != "10.0.0.1" {
		t.Fatalf("speaker %+v", s.BGPSpeaker)
	}
	_, s = announced(t, bgpCfg("node-a"), []string{`/calico/resources/v3/projectcalico.org/nodes/node-a {"spec":{"bgp":{"ipv6Address":"fd00::11/64"}}}`})
	if sp := s.BGPSpeaker; sp == nil || sp.ASN != calc.DefaultASNumber || !sp.RouterID.Is4() || sp.ListenPort != calc.DefaultBGPPort {
		t.Fatalf("IPv6-only speaker %+v", s.BGPSpeaker)
	}
	_, s = announced(t, bgpCfg("node-a"), []string{`/calico/resources/v3/projectcalico.org/nodes/node-a {"spec":{"addresses":[{"address":"192.0.2.11","type":"InternalIP"}]}}`})
	if s.BGPSpeaker != nil {
		t.Fatalf("a node without spec.bgp has speaker %+v", s.BGPSpeaker)
	}
}
