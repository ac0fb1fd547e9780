package store_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/store"
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

func TestDecodeDefaultsAndFallbacks(t *testing.T) {
	dec := func(key, value string) store.Object {
		t.Helper()
		o, err := store.Decode(key, []byte(value))
		if err != nil {
			t.Fatalf("Decode(%s): %v", key, err)
		}
		return o
	}
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
