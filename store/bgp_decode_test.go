package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
)

// TestDecodeBGPRejectsWithField: every BGP field sluice cannot take is refused with the field
// named and the reason, never dropped silently.
func TestDecodeBGPRejectsWithField(t *testing.T) {
	cfg, peer := store.BGPConfigPrefix+"default", store.BGPPeerPrefix+"p"
	cases := []struct {
		name, key, value, field, reason string
	}{
		{"config name", store.BGPConfigPrefix + "other", `{"spec":{}}`, "metadata.name", "want default or node."},
		{"as zero", cfg, `{"spec":{"asNumber":0}}`, "spec.asNumber", "not an AS number"},
		{"as too big", cfg, `{"spec":{"asNumber":4294967296}}`, "spec.asNumber", "not an AS number"},
		{"as asdot part", cfg, `{"spec":{"asNumber":"1.70000"}}`, "spec.asNumber", "not an AS number"},
		{"as text", cfg, `{"spec":{"asNumber":"sixty"}}`, "spec.asNumber", "not an AS number"},
		{"listen port", cfg, `{"spec":{"listenPort":70000}}`, "spec.listenPort", "not a port"},
		{"cluster ips", cfg, `{"spec":{"serviceClusterIPs":[{"cidr":"10.96.0.0/40"}]}}`, "spec.serviceClusterIPs[0].cidr", "not a CIDR"},
		{"community", cfg, `{"spec":{"communities":[{"name":"c","value":"70000:1"}]}}`, "spec.communities[0].value", "at most 65535"},
		{"community name", cfg, `{"spec":{"communities":[{"value":"1:1"}]}}`, "spec.communities[0].name", "want a name"},
		{"advert community", cfg, `{"spec":{"prefixAdvertisements":[{"cidr":"10.0.0.0/8","communities":["nope"]}]}}`, "spec.prefixAdvertisements[0].communities[0]", "neither a name"},
		{"advert cidr", cfg, `{"spec":{"prefixAdvertisements":[{"cidr":"x"}]}}`, "spec.prefixAdvertisements[0].cidr", "not a CIDR"},
		{"mesh password inline", cfg, `{"spec":{"nodeMeshPassword":{}}}`, "spec.nodeMeshPassword", "secretKeyRef"},
		{"restart time", cfg, `{"spec":{"nodeMeshMaxRestartTime":"soon"}}`, "spec.nodeMeshMaxRestartTime", "not a duration"},
		{"bind mode", cfg, `{"spec":{"bindMode":"NodeIP"}}`, "spec.bindMode", "not supported"},
		{"program cluster routes", cfg, `{"spec":{"programClusterRoutes":"Enabled"}}`, "spec.programClusterRoutes", "not supported"},
		{"node config as", store.BGPConfigPrefix + "node.a", `{"spec":{"asNumber":64512}}`, "spec.asNumber", "cluster-wide"},
		{"node config mesh", store.BGPConfigPrefix + "node.a", `{"spec":{"nodeToNodeMeshEnabled":true}}`, "spec.nodeToNodeMeshEnabled", "cluster-wide"},
		{"peer neither", peer, `{"spec":{"asNumber":1}}`, "spec.peerIP", "want peerIP or peerSelector"},
		{"peer both", peer, `{"spec":{"peerIP":"10.0.0.1","peerSelector":"all()","asNumber":1}}`, "spec.peerSelector", "cannot both"},
		{"peer node and selector", peer, `{"spec":{"node":"a","nodeSelector":"all()","peerSelector":"all()"}}`, "spec.nodeSelector", "cannot both"},
		{"peer ip", peer, `{"spec":{"peerIP":"10.0.0.300","asNumber":1}}`, "spec.peerIP", "want an address"},
		{"peer ip loopback", peer, `{"spec":{"peerIP":"127.0.0.1","asNumber":1}}`, "spec.peerIP", "cannot be"},
		{"peer ip no as", peer, `{"spec":{"peerIP":"10.0.0.1"}}`, "spec.asNumber", "required"},
		{"peer selector", peer, `{"spec":{"peerSelector":"rack ==","asNumber":1}}`, "spec.peerSelector", "quoted value"},
		{"node selector", peer, `{"spec":{"nodeSelector":"has(rack","peerIP":"10.0.0.1","asNumber":1}}`, "spec.nodeSelector", "want ')'"},
		{"next hop", peer, `{"spec":{"peerIP":"10.0.0.1","asNumber":1,"nextHopMode":"Other"}}`, "spec.nextHopMode", "want Auto, Self or Keep"},
		{"next hop both", peer, `{"spec":{"peerIP":"10.0.0.1","asNumber":1,"nextHopMode":"Self","keepOriginalNextHop":true}}`, "spec.nextHopMode", "contradicts"},
		{"source", peer, `{"spec":{"peerIP":"10.0.0.1","asNumber":1,"sourceAddress":"Any"}}`, "spec.sourceAddress", "UseNodeIP or None"},
		{"secret path", peer, `{"spec":{"peerIP":"10.0.0.1","asNumber":1,"password":{"secretKeyRef":{"name":"../etc","key":"k"}}}}`, "spec.password.secretKeyRef.name", "without '/'"},
		{"filters", peer, `{"spec":{"peerIP":"10.0.0.1","asNumber":1,"filters":["f"]}}`, "spec.filters", "not supported"},
		{"reverse", peer, `{"spec":{"peerSelector":"all()","reversePeering":"Sometimes"}}`, "spec.reversePeering", "Auto or Manual"},
		{"node rr id", store.NodePrefix + "n", `{"spec":{"bgp":{"ipv4Address":"10.0.0.1/24","routeReflectorClusterID":"fd00::1"}}}`, "spec.bgp.routeReflectorClusterID", "IPv4 address form"},
		{"node as", store.NodePrefix + "n", `{"spec":{"bgp":{"ipv4Address":"10.0.0.1/24","asNumber":-1}}}`, "spec.bgp.asNumber", "not an AS number"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := store.Decode(c.key, []byte(c.value))
			var bv *store.BadValueError
			if !errors.As(err, &bv) {
				t.Fatalf("got %v, want a BadValueError", err)
			}
			if bv.Key != c.key || bv.Field != c.field || !strings.Contains(bv.Reason, c.reason) {
				t.Fatalf("got key %q field %q reason %q; want field %q reason containing %q", bv.Key, bv.Field, bv.Reason, c.field, c.reason)
			}
		})
	}
}

// TestDecodeBGPAccepts: the forms Calico writes and accepts decode to what they mean.
func TestDecodeBGPAccepts(t *testing.T) {
	o, err := store.Decode(store.BGPConfigPrefix+"node.a", []byte(`{"spec":{"listenPort":1790,"logSeverityScreen":"Debug"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c := o.(*store.BGPConfiguration); c.ListenPort != 1790 || c.NoNodeToNodeMesh || c.ASNumber != 0 {
		t.Fatalf("node config: %+v", c)
	}
	o, err = store.Decode(store.BGPConfigPrefix+"default", []byte(`{"spec":{"asNumber":"1.10","serviceLoadBalancerIPs":[{},{"cidr":"198.51.100.7/24"}],"nodeMeshMaxRestartTime":"2m"}}`))
	if err != nil {
		t.Fatal(err)
	}
	c := o.(*store.BGPConfiguration)
	if c.ASNumber != 65546 || len(c.ServiceLoadBalancerIPs) != 1 || c.ServiceLoadBalancerIPs[0].String() != "198.51.100.0/24" || c.NodeMeshMaxRestartTime != 2*time.Minute {
		t.Fatalf("default config: %+v", c)
	}
	for _, tc := range []struct {
		value, addr string
		port        uint16
		asn, local  uint32
		nextHop     string
		noSource    bool
	}{
		{`{"spec":{"peerIP":"192.0.2.1","asNumber":64513}}`, "192.0.2.1", 0, 64513, 0, store.NextHopAuto, false},
		{`{"spec":{"peerIP":"192.0.2.1:1179","asNumber":"64513","localASNumber":65000}}`, "192.0.2.1", 1179, 64513, 65000, store.NextHopAuto, false},
		{`{"spec":{"peerIP":"[fd00::1]:1179","asNumber":64513,"keepOriginalNextHop":true,"sourceAddress":"None"}}`, "fd00::1", 1179, 64513, 0, store.NextHopKeep, true},
		{`{"spec":{"peerIP":"fd00::1","asNumber":64513,"nextHopMode":"Self"}}`, "fd00::1", 0, 64513, 0, store.NextHopSelf, false},
	} {
		o, err := store.Decode(store.BGPPeerPrefix+"p", []byte(tc.value))
		if err != nil {
			t.Fatalf("%s: %v", tc.value, err)
		}
		p := o.(*store.BGPPeer)
		if p.PeerIP.String() != tc.addr || p.PeerPort != tc.port || p.ASNumber != tc.asn || p.LocalASNumber != tc.local ||
			p.NextHopMode != tc.nextHop || p.NoSourceAddress != tc.noSource {
			t.Fatalf("%s: got %+v", tc.value, p)
		}
	}
	// A node's labels and BGP settings; no spec.bgp means no BGP.
	o, err = store.Decode(store.NodePrefix+"n", []byte(`{"metadata":{"labels":{"rack":"r1"}},"spec":{"bgp":{"ipv4Address":"10.0.0.1/24","asNumber":65001,"routeReflectorClusterID":"224.0.0.1"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := o.(*store.Node); n.Labels["rack"] != "r1" || n.BGP == nil || n.BGP.ASNumber != 65001 || n.BGP.RouteReflectorClusterID.String() != "224.0.0.1" {
		t.Fatalf("node: %+v %+v", n, n.BGP)
	}
	o, err = store.Decode(store.NodePrefix+"n", []byte(`{"spec":{"addresses":[{"address":"10.0.0.1/24","type":"InternalIP"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := o.(*store.Node); n.BGP != nil || n.Labels != nil {
		t.Fatalf("node without bgp: %+v", n)
	}
}

// TestSelector is one table of Calico's selector forms and what they match.
func TestSelector(t *testing.T) {
	labels := map[string]string{"rack": "r1", "zone": "eu-west-1a", "route-reflector": "true", "kubernetes.io/hostname": "n1"}
	cases := []struct {
		sel  string
		want bool
	}{
		{"all()", true},
		{"has(rack)", true},
		{"has(missing)", false},
		{"!has(missing)", true},
		{"! has(rack)", false},
		{"rack == 'r1'", true},
		{`rack == "r2"`, false},
		{"rack != 'r2'", true},
		{"missing != 'x'", true},
		{"rack in {'r1', 'r2'}", true},
		{"rack in {}", false},
		{"rack not in {'r1'}", false},
		{"missing not in {'r1'}", true},
		{"zone contains 'west'", true},
		{"zone starts with 'eu-'", true},
		{"zone ends with '1b'", false},
		{"kubernetes.io/hostname == 'n1'", true},
		{"has(rack) && route-reflector == 'true'", true},
		{"has(missing) || rack == 'r1'", true},
		{"!(has(rack) && has(missing))", true},
		{"has(rack) && (has(missing) || zone == 'eu-west-1a')", true},
		{"has(a) || has(b) && has(c)", false},
	}
	for _, c := range cases {
		s, err := store.ParseSelector(c.sel)
		if err != nil {
			t.Fatalf("%q: %v", c.sel, err)
		}
		if got := s.Matches(labels); got != c.want {
			t.Errorf("%q matched %v, want %v", c.sel, got, c.want)
		}
	}
	for _, bad := range []string{"has(", "rack = 'x'", "rack == x", "rack in {'a' 'b'}", "all", "&& has(a)", "has(a) extra", "rack starts 'x'", "'open"} {
		if _, err := store.ParseSelector(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if s, _ := store.ParseSelector("  "); s.Set() || s.Matches(labels) {
		t.Error("an empty selector is set or matches")
	}
}
