package main

import (
	"strings"
	"testing"

	"github.com/sluice-net/sluice/store"
	yaml "go.yaml.in/yaml/v3"
)

// sampleTables are `get KIND` for the sample with node-a's block 10.65.0.0/26 claimed and
// 10.65.0.1 assigned in it.
var sampleTables = map[string]string{
	"ippools": `NAME CIDR VXLAN IPIP BLOCKSIZE NAT DISABLED
pool-cross 10.66.0.0/16 CrossSubnet Never 26 true false
pool-v6 fd00:65::/64 Always Never 122 true false
pool-vxlan 10.65.0.0/16 Always Never 26 true false
`,
	"nodes": `NAME ADDRESS VXLAN-ADDRESS VXLAN-MAC ADDRESS-V6
node-a 192.168.10.11/24 10.65.0.0 66:c1:a0:00:00:0a fd00:10::11/64
node-b 192.168.10.12/24 10.65.0.64 66:c1:a0:00:00:0b fd00:10::12/64
node-c 192.168.20.13/24 10.65.0.128 66:c1:a0:00:00:0c fd00:20::13/64
`,
	"blocks": `CIDR AFFINITY IN-USE SIZE
10.65.0.0/26 host:node-a 1 64
`,
	"blockaffinities": `NODE CIDR STATE
node-a 10.65.0.0/26 confirmed
`,
	"workloadendpoints": `NAMESPACE NAME NODE INTERFACE NETWORKS ORCHESTRATOR
default node--a-k8s-db--a-eth0 node-a cali-db-a 10.66.0.1/32 k8s
default node--a-k8s-web--a-eth0 node-a cali-web-a 10.65.0.1/32,fd00:65::1/128 k8s
default node--b-k8s-db--b-eth0 node-b cali-db-b 10.66.0.65/32 k8s
default node--b-k8s-web--b-eth0 node-b cali-web-b 10.65.0.65/32,fd00:65::41/128 k8s
default node--c-k8s-web--c-eth0 node-c cali-web-c 10.65.0.129/32,fd00:65::81/128 k8s
`,
	"services": `NAMESPACE NAME TYPE CLUSTER-IPS EXTERNAL PORTS POLICY
default web NodePort 10.96.0.10 - 80:30080/TCP ext=Cluster,int=Cluster
`,
	"endpointslices": `NAMESPACE NAME SERVICE ENDPOINTS PORTS
default web-abcde web 10.65.0.1@node-a(ready),10.65.0.65@node-b(ready),10.65.0.129@node-c(terminating) 8080/TCP
`,
	"bgpconfigurations": `NAME AS MESH PORT SERVICE-RANGES
default 64512 false - 10.96.0.0/12,192.168.50.7/32
`,
	"bgppeers": `NAME NODES PEERS AS LOCAL-AS
rack-a rack == 'a' 192.168.10.1 65010 -
rack-b rack == 'b' 192.168.20.1 65010 -
`,
}

// loadSampleWithIPAM applies the sample and its BGP settings, claims a block for node-a and assigns web-a's
// address in it, so that every kind has objects.
func (c *cluster) loadSampleWithIPAM() {
	c.t.Helper()
	c.loadSample()
	c.mustCtl("apply", "-f", "../../testdata/bgp/rack.yaml")
	c.mustCtl("ipam", "claim", "--node", "node-a", "--pool", "pool-vxlan", "--cidr", "10.65.0.0/26")
	c.mustCtl("ipam", "assign", "--node", "node-a", "--handle", "k8s-pod-network.web-a", "--ip", "10.65.0.1")
}

func TestGetTables(t *testing.T) {
	c := newCluster(t)
	c.loadSampleWithIPAM()
	for _, k := range store.Kinds {
		want, ok := sampleTables[k.Plural()]
		if !ok {
			t.Fatalf("no expected table for %s", k.Plural())
		}
		// Plural, singular and the kind's own spelling all name the kind.
		for _, name := range []string{k.Plural(), strings.ToLower(k.String()), k.String()} {
			if got := table(c.mustCtl("get", name)); got != want {
				t.Errorf("get %s:\n%s\nwant\n%s", name, got, want)
			}
		}
	}
	// One object by name.
	if got, want := table(c.mustCtl("get", "node", "node-b")), `NAME ADDRESS VXLAN-ADDRESS VXLAN-MAC ADDRESS-V6
node-b 192.168.10.12/24 10.65.0.64 66:c1:a0:00:00:0b fd00:10::12/64
`; got != want {
		t.Errorf("get node node-b:\n%s\nwant\n%s", got, want)
	}
	if got, want := table(c.mustCtl("get", "blockaffinities", "node-a/10.65.0.0/26")), sampleTables["blockaffinities"]; got != want {
		t.Errorf("get blockaffinities node-a/10.65.0.0/26:\n%s\nwant\n%s", got, want)
	}
}

func TestGetNamespace(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	r := c.ctl(`apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: node--c-openstack-vm1-tap0a1b2c3d
  namespace: openstack
spec:
  orchestrator: openstack
  node: node-c
  interfaceName: tap0a1b2c3d
  ipNetworks: [203.0.113.7/32]
`, "apply", "-f", "-")
	if r.code != 0 {
		t.Fatalf("apply: exit %d: %s", r.code, r.stderr)
	}
	const header = "NAMESPACE NAME NODE INTERFACE NETWORKS ORCHESTRATOR\n"
	const vm = "openstack node--c-openstack-vm1-tap0a1b2c3d node-c tap0a1b2c3d 203.0.113.7/32 openstack\n"
	defaults := strings.TrimPrefix(sampleTables["workloadendpoints"], header)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"get", "workloadendpoints"}, header + defaults + vm},
		{[]string{"get", "workloadendpoints", "-n", "default"}, header + defaults},
		{[]string{"get", "workloadendpoints", "-n", "openstack"}, header + vm},
		{[]string{"get", "-n", "openstack", "workloadendpoint", "node--c-openstack-vm1-tap0a1b2c3d"}, header + vm},
		{[]string{"get", "workloadendpoints", "openstack/node--c-openstack-vm1-tap0a1b2c3d"}, header + vm},
		{[]string{"get", "workloadendpoints", "-n", "nowhere"}, header},
		{[]string{"get", "services", "-n", "openstack"}, "NAMESPACE NAME TYPE CLUSTER-IPS EXTERNAL PORTS POLICY\n"},
		// -n means nothing to a kind without namespaces.
		{[]string{"get", "ippools", "-n", "openstack"}, sampleTables["ippools"]},
	} {
		if got := table(c.mustCtl(tc.args...)); got != tc.want {
			t.Errorf("sluicectl %s:\n%s\nwant\n%s", strings.Join(tc.args, " "), got, tc.want)
		}
	}
	// A namespaced name looked up in the default namespace is not there.
	r = c.ctl("", "get", "workloadendpoints", "node--c-openstack-vm1-tap0a1b2c3d")
	if r.code != 1 || !strings.Contains(r.stderr, `"node--c-openstack-vm1-tap0a1b2c3d": not found`) {
		t.Errorf("get in the wrong namespace: exit %d, stderr %q; want exit 1, not found", r.code, r.stderr)
	}
}

func TestGetOutputReappliesUnchanged(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	for _, tc := range []struct {
		args    []string
		applied string
		key     string
	}{
		{[]string{"get", "ippools", "pool-vxlan", "-o", "json"}, "ippools/pool-vxlan", store.IPPoolPrefix + "pool-vxlan"},
		{[]string{"get", "ippools", "pool-vxlan", "-o", "yaml"}, "ippools/pool-vxlan", store.IPPoolPrefix + "pool-vxlan"},
		{[]string{"get", "nodes", "node-a", "-o", "yaml"}, "nodes/node-a", store.NodePrefix + "node-a"},
		{[]string{"get", "workloadendpoints", "node--a-k8s-web--a-eth0", "-o", "yaml"},
			"workloadendpoints/default/node--a-k8s-web--a-eth0", store.WorkloadEndpointPrefix + "default/node--a-k8s-web--a-eth0"},
		{[]string{"get", "endpointslices", "web-abcde", "-o", "json"},
			"endpointslices/default/web-abcde", store.EndpointSlicePrefix + "default/web-abcde"},
	} {
		out := c.mustCtl(tc.args...)
		stored := c.kv(tc.key)
		var doc map[string]any
		if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
			t.Errorf("%s: output does not parse: %v\n%s", strings.Join(tc.args, " "), err, out)
			continue
		}
		meta, _ := doc["metadata"].(map[string]any)
		if want := c.value(tc.key)["metadata"].(map[string]any)["uid"]; meta["uid"] != want || want == nil {
			t.Errorf("%s: metadata.uid %v, want the stored %v", strings.Join(tc.args, " "), meta["uid"], want)
		}
		r := c.ctl(out, "apply", "-f", "-")
		if r.code != 0 || r.stdout != tc.applied+" unchanged\n" {
			t.Errorf("%s | apply -f -: exit %d, stdout %q, stderr %q; want %q", strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.applied+" unchanged")
		}
		if now := c.kv(tc.key); now.ModRevision != stored.ModRevision {
			t.Errorf("%s: re-applying its output rewrote the key", strings.Join(tc.args, " "))
		}
	}

	// A list re-applies as a list.
	out := c.mustCtl("get", "nodes", "-o", "json")
	r := c.ctl(out, "apply", "-f", "-")
	if want := "nodes/node-a unchanged\nnodes/node-b unchanged\nnodes/node-c unchanged\n"; r.code != 0 || r.stdout != want {
		t.Errorf("get nodes -o json | apply -f -: exit %d, stdout %q, stderr %q; want %q", r.code, r.stdout, r.stderr, want)
	}
}

func TestGetMissing(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	for _, args := range [][]string{
		{"get", "ippools", "pool-nowhere"},
		{"get", "ippools", "pool-nowhere", "-o", "yaml"},
		{"get", "workloadendpoints", "-n", "kube-system", "pool-nowhere"},
	} {
		r := c.ctl("", args...)
		if r.code != 1 || !strings.Contains(r.stderr, `"pool-nowhere": not found`) || r.stdout != "" {
			t.Errorf("sluicectl %s: exit %d, stdout %q, stderr %q; want exit 1 and a message naming pool-nowhere",
				strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
	}
}

func TestDelete(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	for _, tc := range []struct {
		args []string
		out  string
		key  string
	}{
		{[]string{"delete", "ippools", "pool-cross"}, "ippools/pool-cross deleted\n", store.IPPoolPrefix + "pool-cross"},
		{[]string{"delete", "workloadendpoint", "node--a-k8s-db--a-eth0"},
			"workloadendpoints/default/node--a-k8s-db--a-eth0 deleted\n", store.WorkloadEndpointPrefix + "default/node--a-k8s-db--a-eth0"},
		{[]string{"delete", "-n", "default", "Service", "web"}, "services/default/web deleted\n", store.ServicePrefix + "default/web"},
	} {
		before := len(c.keys("/"))
		r := c.ctl("", tc.args...)
		if r.code != 0 || r.stdout != tc.out {
			t.Errorf("sluicectl %s: exit %d, stdout %q, stderr %q; want %q", strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.out)
		}
		if keys := c.keys(tc.key); len(keys) != 0 {
			t.Errorf("sluicectl %s left %v", strings.Join(tc.args, " "), keys)
		}
		if after := len(c.keys("/")); after != before-1 {
			t.Errorf("sluicectl %s: %d keys before, %d after; want exactly one fewer", strings.Join(tc.args, " "), before, after)
		}
		r = c.ctl("", tc.args...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.key+": not found") {
			t.Errorf("sluicectl %s again: exit %d, stderr %q; want exit 1 and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.key+": not found")
		}
	}
	if r := c.ctl("", "delete", "ippools"); r.code != 2 || !strings.Contains(r.stderr, "want KIND NAME") {
		t.Errorf("delete without a name: exit %d, stderr %q; want a usage error", r.code, r.stderr)
	}
}

// TestKubectlHabits: --output is -o's long form, short kind names work (get svc, get wep),
// and version / --version print the build.
func TestKubectlHabits(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	long, short := c.mustCtl("get", "ippools", "--output", "yaml"), c.mustCtl("get", "ippools", "-o", "yaml")
	if long != short || !strings.Contains(long, "kind: IPPool") {
		t.Fatalf("--output yaml:\n%s\n-o yaml:\n%s", long, short)
	}
	if svc, services := c.mustCtl("get", "svc"), c.mustCtl("get", "services"); svc != services || !strings.Contains(svc, "web") {
		t.Fatalf("get svc:\n%s\nget services:\n%s", svc, services)
	}
	if wep, weps := c.mustCtl("get", "wep"), c.mustCtl("get", "workloadendpoints"); wep != weps {
		t.Fatalf("get wep:\n%s\nget workloadendpoints:\n%s", wep, weps)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if out := c.mustCtl(args...); !strings.HasPrefix(out, "sluicectl version ") || !strings.Contains(out, "commit ") {
			t.Errorf("sluicectl %v: %q", args, out)
		}
	}
}

// TestGetBlocksInAddressOrder: blocks list by address, not as their keys sort as text.
func TestGetBlocksInAddressOrder(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	for _, cidr := range []string{"10.65.0.128/26", "10.65.0.64/26", "10.65.1.0/26", "10.65.0.0/26"} {
		c.mustCtl("ipam", "claim", "--node", "node-a", "--pool", "pool-vxlan", "--cidr", cidr)
	}
	for _, kind := range []string{"blocks", "blockaffinities"} {
		out := c.mustCtl("get", kind)
		i0, i64, i128, i256 := strings.Index(out, "10.65.0.0/26"), strings.Index(out, "10.65.0.64/26"), strings.Index(out, "10.65.0.128/26"), strings.Index(out, "10.65.1.0/26")
		if i0 < 0 || !(i0 < i64 && i64 < i128 && i128 < i256) {
			t.Errorf("get %s not in address order:\n%s", kind, out)
		}
	}
}
