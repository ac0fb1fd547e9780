package store_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/store"
	yaml "go.yaml.in/yaml/v3"
)

func TestParseKey(t *testing.T) {
	cases := []struct {
		key, kind, id string
		bad           bool
	}{
		{key: store.IPPoolPrefix + "p", kind: "IPPool", id: "p"},
		{key: store.NodePrefix + "n", kind: "Node", id: "n"},
		{key: store.WorkloadEndpointPrefix + "ns/w", kind: "WorkloadEndpoint", id: "ns/w"},
		{key: store.BlockPrefix + "ipv4/block/10.65.1.0-26", kind: "Block", id: "10.65.1.0/26"},
		{key: store.BlockPrefix + "ipv6/block/fd00::-122", kind: "Block", id: "fd00::/122"},
		{key: store.AffinityPrefix + "node-a/ipv4/block/10.65.1.0-26", kind: "BlockAffinity", id: "node-a/10.65.1.0/26"},
		{key: store.ServicePrefix + "ns/s", kind: "Service", id: "ns/s"},
		{key: store.EndpointSlicePrefix + "ns/e", kind: "EndpointSlice", id: "ns/e"},
		{key: store.IPPoolPrefix + "a/b", bad: true},
		{key: store.WorkloadEndpointPrefix + "nonamespace", bad: true},
		{key: store.BlockPrefix + "ipv6/block/10.65.1.0-26", bad: true}, // family mismatch
		{key: store.BlockPrefix + "ipv4/block/10.65.1.1-26", bad: true}, // not a network address
		{key: store.BlockPrefix + "ipv4/block/10.65.1.0", bad: true},
		{key: store.AffinityPrefix + "node-a/ipv4/10.65.1.0-26", bad: true},
		{key: "/elsewhere", bad: true},
	}
	for _, c := range cases {
		k, id, err := store.ParseKey(c.key)
		if c.bad {
			if err == nil || !errors.Is(err, store.ErrUnknownKey) {
				t.Errorf("ParseKey(%q) = %v %q %v, want ErrUnknownKey", c.key, k, id, err)
			}
			continue
		}
		if err != nil || k.String() != c.kind || id != c.id {
			t.Errorf("ParseKey(%q) = %v %q %v, want %s %q", c.key, k, id, err, c.kind, c.id)
			continue
		}
		back, err := store.KeyFor(k, id)
		if err != nil || back != c.key {
			t.Errorf("KeyFor(%v, %q) = %q %v, want %q", k, id, back, err, c.key)
		}
	}
}

func TestDecodeRejectsWithField(t *testing.T) {
	cases := []struct {
		name, key, value, field, reason string
	}{
		{"pool cidr", store.IPPoolPrefix + "p", `{"metadata":{"name":"p"},"spec":{"cidr":"nope"}}`, "spec.cidr", "not a CIDR"},
		{"pool mode", store.IPPoolPrefix + "p", `{"spec":{"cidr":"10.0.0.0/16","vxlanMode":"always"}}`, "spec.vxlanMode", "unknown mode"},
		{"pool block size", store.IPPoolPrefix + "p", `{"spec":{"cidr":"10.0.0.0/16","blockSize":8}}`, "spec.blockSize", "out of range"},
		{"pool block bigger than pool", store.IPPoolPrefix + "p", `{"spec":{"cidr":"10.0.0.0/28","blockSize":26}}`, "spec.blockSize", "do not fit"},
		{"pool name mismatch", store.IPPoolPrefix + "p", `{"metadata":{"name":"q"},"spec":{"cidr":"10.0.0.0/16"}}`, "metadata.name", "does not match"},
		{"pool type", store.IPPoolPrefix + "p", `{"spec":{"cidr":"10.0.0.0/16","blockSize":"26"}}`, "spec.blockSize", "got JSON string"},
		{"wrong kind", store.IPPoolPrefix + "p", `{"kind":"Node","spec":{}}`, "kind", "under a IPPool key"},
		{"empty", store.IPPoolPrefix + "p", ``, "", "empty value"},
		{"node addr", store.NodePrefix + "n", `{"spec":{"bgp":{"ipv4Address":"fd00::1/64"}}}`, "spec.bgp.ipv4Address", "not an IPv4"},
		{"node mac", store.NodePrefix + "n", `{"spec":{"vxlanTunnelMACAddr":"zz"}}`, "spec.vxlanTunnelMACAddr", "not a MAC"},
		{"node tunnel", store.NodePrefix + "n", `{"spec":{"ipv4VXLANTunnelAddr":"fd00::1"}}`, "spec.ipv4VXLANTunnelAddr", "not an IPv4"},
		{"block cidr mismatch", store.BlockPrefix + "ipv4/block/10.0.0.0-30", `{"cidr":"10.0.0.4/30","allocations":[null,null,null,null]}`, "cidr", "does not match"},
		{"block slots", store.BlockPrefix + "ipv4/block/10.0.0.0-30", `{"cidr":"10.0.0.0/30","allocations":[null]}`, "allocations", "want 4"},
		{"block attr index", store.BlockPrefix + "ipv4/block/10.0.0.0-30", `{"cidr":"10.0.0.0/30","allocations":[0,null,null,null],"attributes":[]}`, "allocations[0]", "out of range"},
		{"block too big", store.BlockPrefix + "ipv4/block/10.0.0.0-8", `{"cidr":"10.0.0.0/8","allocations":[]}`, "cidr", "larger than any"},
		{"affinity state", store.AffinityPrefix + "n/ipv4/block/10.0.0.0-30", `{"state":"maybe"}`, "state", "unknown state"},
		{"wep node", store.WorkloadEndpointPrefix + "ns/w", `{"spec":{"interfaceName":"cali1"}}`, "spec.node", "missing"},
		{"wep iface", store.WorkloadEndpointPrefix + "ns/w", `{"spec":{"node":"n","interfaceName":"a-very-long-interface-name"}}`, "spec.interfaceName", "not a Linux interface"},
		{"wep net", store.WorkloadEndpointPrefix + "ns/w", `{"spec":{"node":"n","interfaceName":"cali1","ipNetworks":["10.0.0.300/32"]}}`, "spec.ipNetworks[0]", "not a CIDR"},
		{"wep nat", store.WorkloadEndpointPrefix + "ns/w", `{"spec":{"node":"n","interfaceName":"cali1","ipNATs":[{"internalIP":"10.0.0.1","externalIP":"fd00::1"}]}}`, "spec.ipNATs[0]", "one family"},
		{"wep namespace mismatch", store.WorkloadEndpointPrefix + "ns/w", `{"metadata":{"name":"w","namespace":"other"},"spec":{"node":"n","interfaceName":"cali1"}}`, "metadata.name", "does not match"},
		{"svc type", store.ServicePrefix + "ns/s", `{"spec":{"type":"Headless"}}`, "spec.type", "unknown type"},
		{"svc port", store.ServicePrefix + "ns/s", `{"spec":{"ports":[{"port":0}]}}`, "spec.ports[0].port", "not a port"},
		{"svc proto", store.ServicePrefix + "ns/s", `{"spec":{"ports":[{"port":80,"protocol":"ICMP"}]}}`, "spec.ports[0].protocol", "unknown protocol"},
		{"svc dup port", store.ServicePrefix + "ns/s", `{"spec":{"ports":[{"name":"a","port":80},{"name":"b","port":80}]}}`, "spec.ports[1]", "duplicate"},
		{"svc unnamed ports", store.ServicePrefix + "ns/s", `{"spec":{"ports":[{"port":80},{"port":81}]}}`, "spec.ports[0].name", "needs a name"},
		{"svc dup names", store.ServicePrefix + "ns/s", `{"spec":{"ports":[{"name":"a","port":80},{"name":"a","port":81}]}}`, "spec.ports[1].name", "duplicate port name"},
		{"svc dup node port", store.ServicePrefix + "ns/s", `{"spec":{"type":"NodePort","ports":[{"name":"a","port":80,"nodePort":30000},{"name":"b","port":81,"nodePort":30000}]}}`, "spec.ports[1].nodePort", "duplicate node port"},
		{"wep host bits", store.WorkloadEndpointPrefix + "ns/w", `{"spec":{"node":"n","interfaceName":"cali1","ipNetworks":["10.65.0.5/24"]}}`, "spec.ipNetworks[0]", "host bits"},
		{"node underlay any", store.NodePrefix + "n", `{"spec":{"bgp":{"ipv4Address":"0.0.0.0/0"}}}`, "spec.bgp.ipv4Address", "cannot be a node's address"},
		{"node tunnel loopback", store.NodePrefix + "n", `{"spec":{"ipv4VXLANTunnelAddr":"127.0.0.1"}}`, "spec.ipv4VXLANTunnelAddr", "cannot be a node's address"},
		{"node broadcast mac", store.NodePrefix + "n", `{"spec":{"vxlanTunnelMACAddr":"ff:ff:ff:ff:ff:ff"}}`, "spec.vxlanTunnelMACAddr", "unicast"},
		{"svc policy", store.ServicePrefix + "ns/s", `{"spec":{"externalTrafficPolicy":"Nearby"}}`, "spec.externalTrafficPolicy", "unknown policy"},
		{"svc affinity timeout", store.ServicePrefix + "ns/s", `{"spec":{"sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":90000}}}}`, "spec.sessionAffinityConfig.clientIP.timeoutSeconds", "out of range"},
		{"svc cluster ip", store.ServicePrefix + "ns/s", `{"spec":{"clusterIPs":["10.96.0.300"]}}`, "spec.clusterIPs[0]", "not an IP"},
		{"svc lb ip mode", store.ServicePrefix + "ns/s", `{"spec":{},"status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.1","ipMode":"Direct"}]}}}`, "status.loadBalancer.ingress[0].ipMode", "unknown mode"},
		{"svc lb ip", store.ServicePrefix + "ns/s", `{"spec":{},"status":{"loadBalancer":{"ingress":[{"ip":"x"}]}}}`, "status.loadBalancer.ingress[0].ip", "not an IP"},
		{"svc source range", store.ServicePrefix + "ns/s", `{"spec":{"loadBalancerSourceRanges":["1.2.3/8"]}}`, "spec.loadBalancerSourceRanges[0]", "not a CIDR"},
		{"slice label", store.EndpointSlicePrefix + "ns/e", `{"addressType":"IPv4","endpoints":[]}`, "metadata.labels", "missing label"},
		{"slice type", store.EndpointSlicePrefix + "ns/e", `{"metadata":{"labels":{"kubernetes.io/service-name":"s"}},"addressType":"FQDN"}`, "addressType", "unknown address type"},
		{"slice addr family", store.EndpointSlicePrefix + "ns/e", `{"metadata":{"labels":{"kubernetes.io/service-name":"s"}},"addressType":"IPv4","endpoints":[{"addresses":["fd00::1"]}]}`, "endpoints[0].addresses[0]", "not an IPv4"},
		{"slice port", store.EndpointSlicePrefix + "ns/e", `{"metadata":{"labels":{"kubernetes.io/service-name":"s"}},"addressType":"IPv4","ports":[{"port":70000}]}`, "ports[0].port", "not a port"},
	}
	for _, c := range cases {
		_, err := store.Decode(c.key, []byte(c.value))
		var bv *store.BadValueError
		if !errors.As(err, &bv) {
			t.Errorf("%s: Decode = %v, want a BadValueError", c.name, err)
			continue
		}
		if bv.Key != c.key || bv.Field != c.field || !strings.Contains(bv.Reason, c.reason) {
			t.Errorf("%s: got key %q field %q reason %q; want field %q reason containing %q", c.name, bv.Key, bv.Field, bv.Reason, c.field, c.reason)
		}
		if !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: error %q does not name the key", c.name, err)
		}
	}
}

// mustDecode decodes value under key, failing the test on an error.
func mustDecode(t *testing.T, key, value string) store.Object {
	t.Helper()
	o, err := store.Decode(key, []byte(value))
	if err != nil {
		t.Fatalf("Decode(%s): %v", key, err)
	}
	return o
}

func TestDecodeDefaultsAndFallbacks(t *testing.T) {
	dec := func(key, value string) store.Object { t.Helper(); return mustDecode(t, key, value) }
	p := dec(store.IPPoolPrefix+"v6", `{"spec":{"cidr":"fd00:65::/48"}}`).(*store.IPPool)
	if p.BlockSize != 122 || p.VXLANMode != store.EncapNever || p.IPIPMode != store.EncapNever {
		t.Errorf("v6 pool defaults: %+v", p)
	}
	p = dec(store.IPPoolPrefix+"v4", `{"spec":{"cidr":"10.65.3.4/16"}}`).(*store.IPPool)
	if p.BlockSize != 26 || p.CIDR != netip.MustParsePrefix("10.65.0.0/16") {
		t.Errorf("v4 pool defaults: %+v", p)
	}
	n := dec(store.NodePrefix+"n", `{"spec":{"addresses":[{"address":"203.0.113.5","type":"ExternalIP"},{"address":"192.0.2.5/24","type":"InternalIP"}]}}`).(*store.Node)
	if n.IPv4Address != netip.MustParsePrefix("192.0.2.5/24") {
		t.Errorf("node underlay from addresses = %s, want the InternalIP 192.0.2.5/24", n.IPv4Address)
	}
	a := dec(store.AffinityPrefix+"n/ipv4/block/10.0.0.0-30", `{}`).(*store.BlockAffinity)
	if a.State != store.AffinityConfirmed || a.Node != "n" {
		t.Errorf("affinity defaults: %+v", a)
	}
	b := dec(store.BlockPrefix+"ipv4/block/10.0.0.0-30", `{"cidr":"10.0.0.0/30","affinity":"virtual:x","allocations":[null,0,null,1],"attributes":[{"handle_id":"h1","secondary":{"node":"n1"}},{"handle_id":"h2","secondary":{"node":"n2"}}]}`).(*store.Block)
	if b.AffinityNode != "" || len(b.Allocations) != 2 || b.Allocations[0].Addr != netip.MustParseAddr("10.0.0.1") ||
		b.Allocations[1].Node != "n2" || b.Allocations[1].Handle != "h2" {
		t.Errorf("block: %+v", b)
	}
	s := dec(store.ServicePrefix+"ns/s", `{"spec":{"clusterIP":"10.96.0.1","ports":[{"name":"dns","port":53,"protocol":"UDP","targetPort":"dns"},{"name":"http","port":80,"targetPort":"8080"}],"sessionAffinity":"ClientIP"}}`).(*store.Service)
	if s.Type != store.ServiceClusterIP || len(s.ClusterIPs) != 1 || s.Ports[0].TargetPortName != "dns" || s.Ports[1].TargetPort != 8080 ||
		s.Ports[1].Protocol != store.ProtocolTCP || s.AffinityTimeout != store.DefaultAffinityTimeout ||
		s.ExternalTrafficPolicy != store.PolicyCluster || s.InternalTrafficPolicy != store.PolicyCluster {
		t.Errorf("service defaults: %+v", s)
	}
	e := dec(store.EndpointSlicePrefix+"ns/e", `{"metadata":{"labels":{"kubernetes.io/service-name":"s"}},"addressType":"IPv4","endpoints":[
		{"addresses":["10.0.0.1"]},
		{"addresses":["10.0.0.2"],"conditions":{"ready":false,"serving":true,"terminating":true}},
		{"addresses":["10.0.0.3"],"conditions":{"ready":false}}],"ports":[{"port":80}]}`).(*store.EndpointSlice)
	want := []store.Endpoint{
		{Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Ready: true, Serving: true},
		{Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, Serving: true, Terminating: true},
		{Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.3")}, Serving: true}, // serving unknown means serving, as kube-proxy reads it
	}
	for i, w := range want {
		g := e.Endpoints[i]
		if g.Ready != w.Ready || g.Serving != w.Serving || g.Terminating != w.Terminating || g.Addresses[0] != w.Addresses[0] {
			t.Errorf("endpoint %d = %+v, want %+v", i, g, w)
		}
	}
	if e.ServiceID() != "ns/s" {
		t.Errorf("slice service = %q", e.ServiceID())
	}
}

// kubernetesObject reads one object of testdata/kubernetes, written as kubectl prints it, and
// returns the key it belongs under and its value as JSON.
func kubernetesObject(t *testing.T, file string) (string, []byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "kubernetes", file))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	meta, _ := doc["metadata"].(map[string]any)
	kindName, _ := doc["kind"].(string)
	kind, err := store.KindNamed(kindName)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	key, err := store.KeyFor(kind, meta["namespace"].(string)+"/"+meta["name"].(string))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	v, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return key, v
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// TestDecodeKubernetesObjects: a Service and an EndpointSlice as Kubernetes writes them, with
// every field kubectl prints (managedFields, ownerReferences, targetRef, hints...), decode to
// what a proxy needs; the rest is accepted and left out.
func TestDecodeKubernetesObjects(t *testing.T) {
	for _, tc := range []struct {
		file string
		want store.Object
	}{
		{"service-single-stack.yaml", &store.Service{Namespace: "shop", Name: "web", UID: "3f7e1c52-8a0b-4d4e-9c61-2b5d7e0f9a13",
			Type: store.ServiceClusterIP, ClusterIPs: addrs("10.96.14.7"), IPFamilies: []string{"IPv4"}, IPFamilyPolicy: store.SingleStack,
			Ports:                 []store.ServicePortSpec{{Name: "http", Protocol: store.ProtocolTCP, Port: 80, TargetPortName: "http"}},
			ExternalTrafficPolicy: store.PolicyCluster, InternalTrafficPolicy: store.PolicyCluster}},
		{"service-dual-stack.yaml", &store.Service{Namespace: "shop", Name: "gateway", UID: "9d0a4c1e-5b7f-4a2d-8e36-c41f07b2d958",
			Type: store.ServiceLoadBalancer, ClusterIPs: addrs("10.96.14.8", "2001:db8:96::8"), IPFamilies: []string{"IPv4", "IPv6"},
			IPFamilyPolicy:  store.RequireDualStack,
			Ports:           []store.ServicePortSpec{{Name: "https", Protocol: store.ProtocolTCP, Port: 443, TargetPort: 8443, NodePort: 30443}},
			LoadBalancerIPs: addrs("203.0.113.10", "2001:db8:feed::10"), ExternalTrafficPolicy: store.PolicyLocal,
			InternalTrafficPolicy: store.PolicyCluster, HealthCheckNodePort: 31894}},
		{"endpointslice.yaml", &store.EndpointSlice{Namespace: "shop", Name: "web-x7k2p", Service: "web", AddressType: "IPv4",
			Endpoints: []store.Endpoint{
				{Addresses: addrs("10.65.0.1"), Ready: true, Serving: true, NodeName: "node-a", Zone: "zone-a"},
				{Addresses: addrs("10.65.0.65"), Serving: true, Terminating: true, NodeName: "node-b", Zone: "zone-b"},
			},
			Ports: []store.EndpointPort{{Name: "http", Protocol: store.ProtocolTCP, Port: 8080}}}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			key, value := kubernetesObject(t, tc.file)
			got, err := store.Decode(key, value)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("decoded\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// TestDecodeIPFamiliesRejects: spec.ipFamilies and spec.ipFamilyPolicy are held to the
// apiserver's rules, and the error names the field at fault.
func TestDecodeIPFamiliesRejects(t *testing.T) {
	key := store.ServicePrefix + "ns/s"
	for _, tc := range []struct {
		name, spec, field, reason string
	}{
		{"unknown family", `"clusterIPs":["10.96.0.1","2001:db8::1"],"ipFamilies":["IPv4","IPv5"],"ipFamilyPolicy":"RequireDualStack"`,
			"spec.ipFamilies[1]", `unknown family "IPv5": want IPv4 or IPv6`},
		{"family in lower case", `"clusterIPs":["10.96.0.1"],"ipFamilies":["ipv4"]`,
			"spec.ipFamilies[0]", `unknown family "ipv4": want IPv4 or IPv6`},
		{"family twice", `"clusterIPs":["10.96.0.1","10.96.0.2"],"ipFamilies":["IPv4","IPv4"],"ipFamilyPolicy":"PreferDualStack"`,
			"spec.ipFamilies[1]", `duplicate family "IPv4"`},
		{"three families", `"clusterIPs":["10.96.0.1"],"ipFamilies":["IPv4","IPv6","IPv4"]`,
			"spec.ipFamilies", "3 entries: want at most two, one per family"},
		{"unknown policy", `"clusterIPs":["10.96.0.1"],"ipFamilyPolicy":"DualStack"`,
			"spec.ipFamilyPolicy", `unknown policy "DualStack": want SingleStack, PreferDualStack or RequireDualStack`},
		{"single stack, two families", `"clusterIPs":["10.96.0.1","2001:db8::1"],"ipFamilies":["IPv4","IPv6"],"ipFamilyPolicy":"SingleStack"`,
			"spec.ipFamilies", "names two families, but spec.ipFamilyPolicy is SingleStack"},
		{"single stack, addresses of two families", `"clusterIPs":["10.96.0.1","2001:db8::1"],"ipFamilyPolicy":"SingleStack"`,
			"spec.clusterIPs", "has addresses of both families, but spec.ipFamilyPolicy is SingleStack"},
		{"require dual stack, one family", `"clusterIPs":["10.96.0.1"],"ipFamilies":["IPv4"],"ipFamilyPolicy":"RequireDualStack"`,
			"spec.ipFamilies", "names only IPv4, but spec.ipFamilyPolicy is RequireDualStack"},
		{"require dual stack, one address", `"clusterIPs":["10.96.0.1"],"ipFamilyPolicy":"RequireDualStack"`,
			"spec.clusterIPs", "one family only, but spec.ipFamilyPolicy is RequireDualStack"},
		{"require dual stack, clusterIP alone", `"clusterIP":"10.96.0.1","ipFamilyPolicy":"RequireDualStack"`,
			"spec.clusterIP", "one family only, but spec.ipFamilyPolicy is RequireDualStack"},
		{"address of the other family", `"clusterIPs":["10.96.0.1","2001:db8::1"],"ipFamilies":["IPv6","IPv4"],"ipFamilyPolicy":"RequireDualStack"`,
			"spec.clusterIPs[0]", "10.96.0.1 is IPv4, but spec.ipFamilies[0] is IPv6"},
		{"second address of the first family", `"clusterIPs":["10.96.0.1","10.96.0.2"],"ipFamilies":["IPv4","IPv6"],"ipFamilyPolicy":"PreferDualStack"`,
			"spec.clusterIPs[1]", "10.96.0.2 is IPv4, but spec.ipFamilies[1] is IPv6"},
		{"clusterIP of the other family", `"clusterIP":"2001:db8::1","ipFamilies":["IPv4"]`,
			"spec.clusterIP", "2001:db8::1 is IPv6, but spec.ipFamilies[0] is IPv4"},
		{"external name", `"type":"ExternalName","externalName":"db.example.com"`,
			"spec.type", "ExternalName is a DNS alias with no address or port to proxy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := store.Decode(key, []byte(`{"spec":{`+tc.spec+`}}`))
			var bv *store.BadValueError
			if !errors.As(err, &bv) {
				t.Fatalf("Decode = %v, want a BadValueError", err)
			}
			if bv.Field != tc.field || !strings.Contains(bv.Reason, tc.reason) {
				t.Errorf("got field %q reason %q; want field %q reason containing %q", bv.Field, bv.Reason, tc.field, tc.reason)
			}
		})
	}
}

// TestDecodeIPFamiliesAccepts: what the apiserver accepts decodes, the policy defaulted as it
// defaults it; a headless service keeps its families; without ipFamilies the addresses rule.
func TestDecodeIPFamiliesAccepts(t *testing.T) {
	key := store.ServicePrefix + "ns/s"
	for _, tc := range []struct {
		name, spec   string
		clusterIPs   []netip.Addr
		families     []string
		policy       string
		loadBalancer []netip.Addr
	}{
		{"nothing given, one address", `"clusterIPs":["10.96.0.1"]`, addrs("10.96.0.1"), nil, store.SingleStack, nil},
		{"nothing given, two families", `"clusterIPs":["2001:db8::1","10.96.0.1"]`, addrs("2001:db8::1", "10.96.0.1"), nil, store.RequireDualStack, nil},
		{"families given, policy not", `"clusterIPs":["10.96.0.1","2001:db8::1"],"ipFamilies":["IPv4","IPv6"]`,
			addrs("10.96.0.1", "2001:db8::1"), []string{"IPv4", "IPv6"}, store.RequireDualStack, nil},
		{"IPv6 first", `"clusterIPs":["2001:db8::1","10.96.0.1"],"ipFamilies":["IPv6","IPv4"],"ipFamilyPolicy":"RequireDualStack"`,
			addrs("2001:db8::1", "10.96.0.1"), []string{"IPv6", "IPv4"}, store.RequireDualStack, nil},
		{"prefer dual stack on a single-stack cluster", `"clusterIPs":["10.96.0.1"],"ipFamilies":["IPv4"],"ipFamilyPolicy":"PreferDualStack"`,
			addrs("10.96.0.1"), []string{"IPv4"}, store.PreferDualStack, nil},
		{"single stack IPv6", `"clusterIP":"2001:db8::1","clusterIPs":["2001:db8::1"],"ipFamilies":["IPv6"],"ipFamilyPolicy":"SingleStack"`,
			addrs("2001:db8::1"), []string{"IPv6"}, store.SingleStack, nil},
		{"headless dual stack", `"clusterIP":"None","clusterIPs":["None"],"ipFamilies":["IPv4","IPv6"],"ipFamilyPolicy":"RequireDualStack"`,
			nil, []string{"IPv4", "IPv6"}, store.RequireDualStack, nil},
		{"headless, one family required dual", `"clusterIPs":["None"],"ipFamilies":["IPv6"],"ipFamilyPolicy":"RequireDualStack"`,
			nil, []string{"IPv6"}, store.RequireDualStack, nil},
		{"load balancer modes", `"type":"LoadBalancer","clusterIPs":["10.96.0.1"]},"status":{"loadBalancer":{"ingress":[` +
			`{"ip":"203.0.113.1","ipMode":"VIP"},{"ip":"203.0.113.2","ipMode":"Proxy","ports":[{"port":80,"protocol":"TCP"}]},` +
			`{"ip":"203.0.113.3"},{"hostname":"lb.example.com"}]}`,
			addrs("10.96.0.1"), nil, store.SingleStack, addrs("203.0.113.1", "203.0.113.3")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := store.Decode(key, []byte(`{"spec":{`+tc.spec+`}}`))
			if err != nil {
				t.Fatal(err)
			}
			s := o.(*store.Service)
			if !slices.Equal(s.ClusterIPs, tc.clusterIPs) || !slices.Equal(s.IPFamilies, tc.families) || s.IPFamilyPolicy != tc.policy ||
				!slices.Equal(s.LoadBalancerIPs, tc.loadBalancer) {
				t.Errorf("cluster IPs %v, families %q, policy %q, load-balancer IPs %v; want %v, %q, %q, %v",
					s.ClusterIPs, s.IPFamilies, s.IPFamilyPolicy, s.LoadBalancerIPs, tc.clusterIPs, tc.families, tc.policy, tc.loadBalancer)
			}
		})
	}
}

// FuzzDecode feeds arbitrary keys and values to the decoder: it may reject them, never panic,
// and what it accepts must be self-consistent.
func FuzzDecode(f *testing.F) {
	seeds := []struct{ key, value string }{
		{poolKey, poolValue("pool-a", "10.65.0.0/16", "Always")},
		{nodeKey, nodeValue("node-a", "192.0.2.11/24", "10.65.0.1")},
		{blockKey, blockValue("10.65.0.0/26", "node-a", 0, 5)},
		{affKey, `{"state":"pending","deleted":false}`},
		{wepKey, wepValue("default", "node--a-k8s-web-eth0", "node-a", "cali1234", "10.65.0.1/32")},
		{svcKey, serviceValue("default", "web", "10.96.0.10")},
		{sliceKey, sliceValue("default", "web-abc", "web", "10.65.0.1", "node-a")},
		{store.BlockPrefix + "ipv6/block/fd00::-126", `{"cidr":"fd00::/126","allocations":[0,null,null,null],"attributes":[{}]}`},
		{store.BGPConfigPrefix + "default", `{"spec":{"asNumber":"1.10","nodeToNodeMeshEnabled":false,"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}],"communities":[{"name":"c","value":"1:2:3"}],"prefixAdvertisements":[{"cidr":"10.65.0.0/16","communities":["c","65000:1"]}]}}`},
		{store.BGPPeerPrefix + "tor", `{"spec":{"nodeSelector":"rack in {'a','b'} && !has(rr)","peerIP":"[fd00::1]:1179","asNumber":64513,"password":{"secretKeyRef":{"name":"s","key":"k"}}}}`},
	}
	for _, s := range seeds {
		f.Add(s.key, []byte(s.value))
	}
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		obj, err := store.Decode(key, value)
		if err != nil {
			var bv *store.BadValueError
			if !errors.As(err, &bv) || bv.Key != key {
				t.Fatalf("error %v is not a BadValueError for key %q", err, key)
			}
			return
		}
		kind, id, perr := store.ParseKey(key)
		if perr != nil || obj.Kind() != kind || obj.ID() != id {
			t.Fatalf("accepted %q as %v/%q, key says %v/%q (%v)", key, obj.Kind(), obj.ID(), kind, id, perr)
		}
	})
}

// TestDecodeSliceAfterAnother: a slice's wire form is kept between decodes for its room; what
// one slice said never shows in the next. A slice with labels, conditions, several addresses
// and two ports is decoded, then one with none of them, then the first again.
func TestDecodeSliceAfterAnother(t *testing.T) {
	full := `{"metadata":{"labels":{"kubernetes.io/service-name":"a","team":"x"}},"addressType":"IPv4","endpoints":[
		{"addresses":["10.0.0.1","10.0.0.9"],"conditions":{"ready":false,"serving":false,"terminating":true},"nodeName":"n1","zone":"z1"},
		{"addresses":["10.0.0.2"],"conditions":{"ready":true},"nodeName":"n2"}],
		"ports":[{"name":"http","protocol":"UDP","port":80},{"name":"dns","port":53}]}`
	bare := `{"metadata":{"labels":{"kubernetes.io/service-name":"b"}},"addressType":"IPv4","endpoints":[
		{"addresses":["10.0.1.1"]}],"ports":[{"port":8080}]}`
	noLabel := `{"addressType":"IPv4","endpoints":[{"addresses":["10.0.1.1"]}]}`
	decode := func(v string) *store.EndpointSlice {
		t.Helper()
		return mustDecode(t, store.EndpointSlicePrefix+"ns/e", v).(*store.EndpointSlice)
	}
	first := decode(full)
	b := decode(bare)
	want := store.EndpointSlice{Namespace: "ns", Name: "e", Service: "b", AddressType: "IPv4",
		Endpoints: []store.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.0.1.1")}, Ready: true, Serving: true}},
		Ports:     []store.EndpointPort{{Protocol: store.ProtocolTCP, Port: 8080}}}
	if !reflect.DeepEqual(*b, want) {
		t.Errorf("the bare slice after the full one:\n got %+v\nwant %+v", *b, want)
	}
	if _, err := store.Decode(store.EndpointSlicePrefix+"ns/e", []byte(noLabel)); err == nil || !strings.Contains(err.Error(), "missing label") {
		t.Errorf("a slice without the service label after two with it: %v; want the missing label", err)
	}
	if again := decode(full); !reflect.DeepEqual(again, first) {
		t.Errorf("the full slice decoded again:\n got %+v\nwant %+v", *again, *first)
	}
	if len(first.Endpoints) != 2 || len(first.Endpoints[0].Addresses) != 2 || first.Endpoints[0].Serving || !first.Endpoints[0].Terminating ||
		first.Endpoints[0].Zone != "z1" || len(first.Ports) != 2 || first.Ports[0].Protocol != store.ProtocolUDP {
		t.Errorf("the full slice: %+v", *first)
	}
}

// TestDecodeServiceAfterAnother: as TestDecodeSliceAfterAnother, for services: a dual-stack
// load balancer with a selector, ranges and external IPs, then a bare cluster-IP service;
// the first keeps what it was decoded with.
func TestDecodeServiceAfterAnother(t *testing.T) {
	full := `{"metadata":{"uid":"u1","labels":{"app":"a"}},"spec":{"type":"LoadBalancer","selector":{"app":"a"},
		"clusterIPs":["10.96.0.1","fd00:96::1"],"ipFamilies":["IPv4","IPv6"],"ipFamilyPolicy":"RequireDualStack",
		"externalIPs":["192.0.2.7"],"loadBalancerSourceRanges":["198.51.100.0/24"],"externalTrafficPolicy":"Local","healthCheckNodePort":31000,
		"ports":[{"name":"http","port":80,"targetPort":8080,"nodePort":30080},{"name":"dns","protocol":"UDP","port":53,"targetPort":"dns","nodePort":30053}],
		"sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":60}}},
		"status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.9"}]}}}`
	bare := `{"spec":{"clusterIP":"fd00:96::2","ipFamilies":["IPv6"],"ports":[{"port":443}]}}`
	decode := func(v string) *store.Service {
		t.Helper()
		return mustDecode(t, store.ServicePrefix+"ns/s", v).(*store.Service)
	}
	first := decode(full)
	kept := *first
	kept.IPFamilies = slices.Clone(first.IPFamilies)
	b := decode(bare)
	if b.Type != store.ServiceClusterIP || len(b.ClusterIPs) != 1 || !slices.Equal(b.IPFamilies, []string{"IPv6"}) || len(b.ExternalIPs) != 0 || len(b.LoadBalancerIPs) != 0 ||
		len(b.LoadBalancerSourceRanges) != 0 || len(b.Ports) != 1 || b.Ports[0].NodePort != 0 || b.Ports[0].TargetPortName != "" ||
		b.AffinityTimeout != 0 || b.ExternalTrafficPolicy != store.PolicyCluster || b.HealthCheckNodePort != 0 || b.UID != "" {
		t.Errorf("the bare service after the full one: %+v", *b)
	}
	if !reflect.DeepEqual(first.IPFamilies, kept.IPFamilies) || len(first.IPFamilies) != 2 {
		t.Errorf("the first service's families became %v; were %v", first.IPFamilies, kept.IPFamilies)
	}
	if again := decode(full); !reflect.DeepEqual(again, first) {
		t.Errorf("the full service decoded again:\n got %+v\nwant %+v", *again, *first)
	}
}
