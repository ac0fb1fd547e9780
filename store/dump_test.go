package store_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// loadDump puts every key of an etcdctl-style dump (key line, value line) into etcd.
func loadDump(t *testing.T, cli *clientv3.Client, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		key := sc.Text()
		if !sc.Scan() {
			t.Fatalf("%s: key %s has no value line", path, key)
		}
		put(t, cli, key, sc.Text())
		n++
	}
	return n
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }
func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// TestCalicoDump reads a dump in Calico's own etcdv3 format and checks every object.
func TestCalicoDump(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	loadDump(t, cli, "../testdata/calico/etcd-dump.txt")
	in, s, r := startIntake(t, cli)
	eventually(t, 10*time.Second, "in-sync", func() bool { return s.inSyncs() == 1 })
	if bad := r.badValues(); len(bad) != 0 {
		t.Fatalf("rejected values in Calico's own dump: %v", bad)
	}
	snap := s.index.Snapshot()
	want := map[store.Kind][]store.Object{
		store.KindIPPool: {
			&store.IPPool{Name: "pool-cross", CIDR: pfx("10.66.0.0/16"), VXLANMode: store.EncapCrossSubnet, IPIPMode: store.EncapNever, NATOutgoing: true, BlockSize: 26, NodeSelector: "all()"},
			&store.IPPool{Name: "pool-v6", CIDR: pfx("fd00:65::/48"), VXLANMode: store.EncapNever, IPIPMode: store.EncapNever, Disabled: true, BlockSize: 122, NodeSelector: "all()"},
			&store.IPPool{Name: "pool-vxlan", CIDR: pfx("10.65.0.0/16"), VXLANMode: store.EncapAlways, IPIPMode: store.EncapNever, NATOutgoing: true, BlockSize: 26, NodeSelector: "all()", AllowedUses: []string{"Workload", "Tunnel"}},
		},
		store.KindNode: {
			&store.Node{Name: "node-a", IPv4Address: pfx("192.168.10.11/24"), IPv4VXLANTunnelAddr: addr("10.65.174.128"), VXLANTunnelMAC: mac("66:c1:a0:00:00:0a"),
				Labels: map[string]string{"rack": "rack1", "kubernetes.io/hostname": "node-a"}, BGP: &store.NodeBGP{ASNumber: 64512}},
			&store.Node{Name: "node-b", IPv4Address: pfx("192.168.10.12/24"), IPv4VXLANTunnelAddr: addr("10.65.9.0"), VXLANTunnelMAC: mac("66:c1:a0:00:00:0b"), V6: &store.NodeV6{Address: pfx("fd00:10::12/64")},
				BGP: &store.NodeBGP{}},
			&store.Node{Name: "node-c", IPv4Address: pfx("192.168.20.13/24"), IPv4VXLANTunnelAddr: addr("10.65.77.64")},
		},
		store.KindBlock: {
			&store.Block{CIDR: pfx("10.65.174.128/26"), Affinity: "host:node-a", AffinityNode: "node-a", Allocations: []store.Allocation{
				{Addr: addr("10.65.174.128"), Handle: "vxlan-tunnel-addr-node-a", Node: "node-a"},
				{Addr: addr("10.65.174.129"), Handle: "k8s-pod-network.web-1", Node: "node-a"},
				{Addr: addr("10.65.174.130"), Handle: "k8s-pod-network.borrowed-1", Node: "node-b"},
			}},
			&store.Block{CIDR: pfx("10.65.77.64/26"), Affinity: "host:node-c", AffinityNode: "node-c", Allocations: []store.Allocation{
				{Addr: addr("10.65.77.64"), Handle: "vxlan-tunnel-addr-node-c", Node: "node-c"},
			}},
			&store.Block{CIDR: pfx("10.65.9.0/26"), Affinity: "host:node-b", AffinityNode: "node-b", Allocations: []store.Allocation{
				{Addr: addr("10.65.9.0"), Handle: "vxlan-tunnel-addr-node-b", Node: "node-b"},
				{Addr: addr("10.65.9.5"), Handle: "k8s-pod-network.db-1", Node: "node-b"},
			}},
			&store.Block{CIDR: pfx("10.66.3.7/32"), Affinity: "host:node-c", AffinityNode: "node-c", Allocations: []store.Allocation{
				{Addr: addr("10.66.3.7"), Handle: "k8s-pod-network.single", Node: "node-c"},
			}},
			&store.Block{CIDR: pfx("fd00:65::/122"), Affinity: "host:node-b", AffinityNode: "node-b", Allocations: []store.Allocation{
				{Addr: addr("fd00:65::1"), Handle: "k8s-pod-network.v6", Node: "node-b"},
			}},
		},
		store.KindBlockAffinity: {
			&store.BlockAffinity{Node: "node-a", CIDR: pfx("10.65.174.128/26"), State: store.AffinityConfirmed},
			&store.BlockAffinity{Node: "node-b", CIDR: pfx("10.65.9.0/26"), State: store.AffinityConfirmed},
			&store.BlockAffinity{Node: "node-b", CIDR: pfx("fd00:65::/122"), State: store.AffinityConfirmed},
			&store.BlockAffinity{Node: "node-c", CIDR: pfx("10.65.77.64/26"), State: store.AffinityPending},
			&store.BlockAffinity{Node: "node-c", CIDR: pfx("10.66.3.7/32"), State: store.AffinityConfirmed},
		},
		store.KindBGPConfiguration: {
			&store.BGPConfiguration{Name: "default", ASNumber: 64512, NoNodeToNodeMesh: true,
				ServiceClusterIPs: []netip.Prefix{pfx("10.96.0.0/12")}, ServiceExternalIPs: []netip.Prefix{pfx("203.0.113.0/24")},
				Communities: map[string]store.Community{"bgp-large-community": {Large: true, A: 63400, B: 300, C: 100}},
				PrefixAdvertisements: []store.PrefixAdvertisement{{CIDR: pfx("10.65.0.0/16"),
					Communities: []store.Community{{Large: true, A: 63400, B: 300, C: 100}, {A: 63400, B: 120}}}}},
		},
		store.KindBGPPeer: {
			&store.BGPPeer{Name: "rack1-tor", NodeSelector: mustSelector(t, "rack == 'rack1'"), PeerIP: addr("192.168.10.1"), ASNumber: 64513,
				NextHopMode: store.NextHopAuto, MaxRestartTime: 120 * time.Second, Password: &store.SecretKeyRef{Name: "bgp-secrets", Key: "rack1"}},
		},
		store.KindWorkloadEndpoint: {
			&store.WorkloadEndpoint{Namespace: "default", Name: "node--a-k8s-web--1-eth0", Node: "node-a", Orchestrator: "k8s", InterfaceName: "cali0a1b2c3d4e5",
				IPNetworks: []netip.Prefix{pfx("10.65.174.129/32")}, MAC: mac("ee:ee:ee:ee:ee:ee")},
			&store.WorkloadEndpoint{Namespace: "default", Name: "node--b-k8s-borrowed--1-eth0", Node: "node-b", Orchestrator: "k8s", InterfaceName: "cali9f8e7d6c5b4",
				IPNetworks: []netip.Prefix{pfx("10.65.174.130/32")}},
			&store.WorkloadEndpoint{Namespace: "openstack", Name: "node--c-openstack-vm1-tap1234abcd-56", Node: "node-c", Orchestrator: "openstack", InterfaceName: "tap1234abcd-56",
				IPNetworks: []netip.Prefix{pfx("10.70.0.5/32"), pfx("fd00:70::5/128")},
				IPNATs:     []store.IPNAT{{InternalIP: addr("10.70.0.5"), ExternalIP: addr("203.0.113.50")}}, MAC: mac("fa:16:3e:00:00:05")},
		},
	}
	for _, k := range store.Kinds {
		got := snap.List(k)
		if !reflect.DeepEqual(got, want[k]) && !(len(got) == 0 && len(want[k]) == 0) {
			t.Errorf("%s:\n got  %s\n want %s", k.Plural(), dumpObjects(got), dumpObjects(want[k]))
		}
	}
	if in.Stats().BadValues.Load() != 0 {
		t.Fatalf("bad values: %d", in.Stats().BadValues.Load())
	}
	// The secondary indexes answer what later stages ask.
	if got := len(snap.EndpointsOfNode("node-c")); got != 1 {
		t.Errorf("endpoints of node-c = %d, want 1", got)
	}
	if got := len(snap.AffinitiesOfNode("node-b")); got != 2 {
		t.Errorf("affinities of node-b = %d, want 2", got)
	}
	if got := len(snap.BlocksOfNode("node-c")); got != 2 {
		t.Errorf("blocks of node-c = %d, want 2", got)
	}
}

func dumpObjects(objs []store.Object) string {
	var b bytes.Buffer
	for _, o := range objs {
		b.WriteString("\n   " + reflectString(o))
	}
	return b.String()
}

// reflectString prints every field of an object, MACs in their usual form.
func reflectString(o store.Object) string {
	v := reflect.ValueOf(o).Elem()
	var b bytes.Buffer
	for i := range v.NumField() {
		f := v.Field(i).Interface()
		if m, ok := f.(net.HardwareAddr); ok {
			f = m.String()
		}
		fmt.Fprintf(&b, "%s=%v ", v.Type().Field(i).Name, f)
	}
	return b.String()
}

func mustSelector(t *testing.T, s string) store.Selector {
	t.Helper()
	sel, err := store.ParseSelector(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}
