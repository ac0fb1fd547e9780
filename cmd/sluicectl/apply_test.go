package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var sampleOutput = []string{
	"ippools/pool-vxlan",
	"ippools/pool-cross",
	"ippools/pool-v6",
	"nodes/node-a",
	"nodes/node-b",
	"nodes/node-c",
	"workloadendpoints/default/node--a-k8s-web--a-eth0",
	"workloadendpoints/default/node--b-k8s-web--b-eth0",
	"workloadendpoints/default/node--c-k8s-web--c-eth0",
	"workloadendpoints/default/node--a-k8s-db--a-eth0",
	"workloadendpoints/default/node--b-k8s-db--b-eth0",
	"services/default/web",
	"endpointslices/default/web-abcde",
}

// sampleKeys are the sample's keys in etcd's (byte) order.
var sampleKeys = []string{
	store.IPPoolPrefix + "pool-cross",
	store.IPPoolPrefix + "pool-v6",
	store.IPPoolPrefix + "pool-vxlan",
	store.NodePrefix + "node-a",
	store.NodePrefix + "node-b",
	store.NodePrefix + "node-c",
	store.WorkloadEndpointPrefix + "default/node--a-k8s-db--a-eth0",
	store.WorkloadEndpointPrefix + "default/node--a-k8s-web--a-eth0",
	store.WorkloadEndpointPrefix + "default/node--b-k8s-db--b-eth0",
	store.WorkloadEndpointPrefix + "default/node--b-k8s-web--b-eth0",
	store.WorkloadEndpointPrefix + "default/node--c-k8s-web--c-eth0",
	store.EndpointSlicePrefix + "default/web-abcde",
	store.ServicePrefix + "default/web",
}

func withAction(action string) []string {
	out := make([]string, len(sampleOutput))
	for i, s := range sampleOutput {
		out[i] = s + " " + action
	}
	return out
}

var uidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestApplySampleCreatesThenUnchanged(t *testing.T) {
	c := newCluster(t)
	before := time.Now().Truncate(time.Second)
	out := c.mustCtl("apply", "-f", sampleDir)
	after := time.Now()
	if got, want := lines(out), withAction("created"); !slices.Equal(got, want) {
		t.Errorf("first apply printed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := c.keys("/"); !slices.Equal(got, sampleKeys) {
		t.Fatalf("keys in etcd:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(sampleKeys, "\n"))
	}
	revs := map[string]int64{}
	for _, k := range sampleKeys {
		revs[k] = c.kv(k).ModRevision
	}

	out = c.mustCtl("apply", "-f", sampleDir)
	if got, want := lines(out), withAction("unchanged"); !slices.Equal(got, want) {
		t.Errorf("second apply printed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, k := range sampleKeys {
		if got := c.kv(k).ModRevision; got != revs[k] {
			t.Errorf("%s rewritten by an unchanged apply: mod revision %d, was %d", k, got, revs[k])
		}
	}

	// The values are Calico's layout, exactly: nothing more, nothing less.
	uids := map[string]string{}
	checkResource := func(key, kind, apiVersion, wantMeta, wantSpec string) {
		t.Helper()
		v := c.value(key)
		if got := slices.Sorted(maps.Keys(v)); !slices.Equal(got, []string{"apiVersion", "kind", "metadata", "spec"}) {
			t.Errorf("%s: top-level fields %v, want apiVersion, kind, metadata, spec", key, got)
		}
		if v["kind"] != kind || v["apiVersion"] != apiVersion {
			t.Errorf("%s: kind %v apiVersion %v, want %s %s", key, v["kind"], v["apiVersion"], kind, apiVersion)
		}
		meta, _ := v["metadata"].(map[string]any)
		uid, _ := meta["uid"].(string)
		if !uidRE.MatchString(uid) {
			t.Errorf("%s: metadata.uid %q is not a version 4 UUID", key, uid)
		}
		if other, dup := uids[uid]; dup {
			t.Errorf("%s and %s share uid %s", key, other, uid)
		}
		uids[uid] = key
		ts, _ := meta["creationTimestamp"].(string)
		created, err := time.Parse(time.RFC3339, ts)
		if err != nil || created.Before(before) || created.After(after) {
			t.Errorf("%s: metadata.creationTimestamp %q is not an RFC 3339 time between %s and %s", key, ts, before, after)
		}
		delete(meta, "uid")
		delete(meta, "creationTimestamp")
		if !jsonEqual(t, meta, wantMeta) {
			t.Errorf("%s: metadata besides uid and creationTimestamp is %v, want %s", key, meta, wantMeta)
		}
		if !jsonEqual(t, v["spec"], wantSpec) {
			t.Errorf("%s: spec is %v, want %s", key, v["spec"], wantSpec)
		}
	}
	checkResource(store.IPPoolPrefix+"pool-vxlan", "IPPool", "projectcalico.org/v3", `{"name":"pool-vxlan"}`,
		`{"cidr":"10.65.0.0/16","vxlanMode":"Always","ipipMode":"Never","natOutgoing":true,"blockSize":26,"nodeSelector":"all()"}`)
	checkResource(store.IPPoolPrefix+"pool-cross", "IPPool", "projectcalico.org/v3", `{"name":"pool-cross"}`,
		`{"cidr":"10.66.0.0/16","vxlanMode":"CrossSubnet","ipipMode":"Never","natOutgoing":true,"blockSize":26,"nodeSelector":"all()"}`)
	checkResource(store.NodePrefix+"node-c", "Node", "projectcalico.org/v3", `{"name":"node-c"}`,
		`{"bgp":{"ipv4Address":"192.168.20.13/24","ipv6Address":"fd00:20::13/64"},"ipv4VXLANTunnelAddr":"10.65.0.128","vxlanTunnelMACAddr":"66:c1:a0:00:00:0c","ipv6VXLANTunnelAddr":"fd00:65::80","vxlanTunnelMACAddrV6":"66:c1:a6:00:00:0c"}`)
	checkResource(store.WorkloadEndpointPrefix+"default/node--b-k8s-web--b-eth0", "WorkloadEndpoint", "projectcalico.org/v3",
		`{"name":"node--b-k8s-web--b-eth0","namespace":"default","labels":{"app":"web"}}`,
		`{"orchestrator":"k8s","node":"node-b","pod":"web-b","endpoint":"eth0","interfaceName":"cali-web-b","ipNetworks":["10.65.0.65/32","fd00:65::41/128"]}`)
	checkResource(store.WorkloadEndpointPrefix+"default/node--a-k8s-db--a-eth0", "WorkloadEndpoint", "projectcalico.org/v3",
		`{"name":"node--a-k8s-db--a-eth0","namespace":"default"}`,
		`{"orchestrator":"k8s","node":"node-a","pod":"db-a","endpoint":"eth0","interfaceName":"cali-db-a","ipNetworks":["10.66.0.1/32"]}`)

	// sluice's own kinds carry the Kubernetes kind and apiVersion.
	for key, want := range map[string][2]string{
		store.ServicePrefix + "default/web":             {"Service", "v1"},
		store.EndpointSlicePrefix + "default/web-abcde": {"EndpointSlice", "discovery.k8s.io/v1"},
	} {
		v := c.value(key)
		if v["kind"] != want[0] || v["apiVersion"] != want[1] {
			t.Errorf("%s: kind %v apiVersion %v, want %s %s", key, v["kind"], v["apiVersion"], want[0], want[1])
		}
	}
}

const poolVXLAN = `apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: pool-vxlan
spec:
  cidr: 10.65.0.0/16
  vxlanMode: %s
  ipipMode: Never
  natOutgoing: true
  blockSize: 26
  nodeSelector: all()
`

func TestApplyUpdateKeepsIdentity(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	key := store.IPPoolPrefix + "pool-vxlan"

	// As if calicoctl had created the pool long ago.
	const uid, created = "0b1d2c3e-4f50-4617-8899-aabbccddeeff", "2020-01-02T03:04:05Z"
	c.put(key, `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"pool-vxlan","uid":"`+uid+`","creationTimestamp":"`+created+`"},`+
		`"spec":{"cidr":"10.65.0.0/16","vxlanMode":"Always","ipipMode":"Never","natOutgoing":true,"blockSize":26,"nodeSelector":"all()"}}`)
	old := c.kv(key)

	r := c.ctl(fmt.Sprintf(poolVXLAN, "CrossSubnet"), "apply", "-f", "-")
	if r.code != 0 || r.stdout != "ippools/pool-vxlan updated\n" {
		t.Fatalf("apply: exit %d, stdout %q, stderr %q; want exit 0 and \"ippools/pool-vxlan updated\"", r.code, r.stdout, r.stderr)
	}
	now := c.kv(key)
	if now.ModRevision <= old.ModRevision || now.Version != old.Version+1 {
		t.Errorf("mod revision %d version %d after the update, was %d and %d", now.ModRevision, now.Version, old.ModRevision, old.Version)
	}
	v := c.value(key)
	meta := v["metadata"].(map[string]any)
	if meta["uid"] != uid || meta["creationTimestamp"] != created {
		t.Errorf("update changed the identity: uid %v creationTimestamp %v, want %s %s", meta["uid"], meta["creationTimestamp"], uid, created)
	}
	if mode := v["spec"].(map[string]any)["vxlanMode"]; mode != "CrossSubnet" {
		t.Errorf("spec.vxlanMode = %v after the update, want CrossSubnet", mode)
	}

	// The same again changes nothing.
	r = c.ctl(fmt.Sprintf(poolVXLAN, "CrossSubnet"), "apply", "-f", "-")
	if r.code != 0 || r.stdout != "ippools/pool-vxlan unchanged\n" {
		t.Errorf("re-apply: exit %d, stdout %q, stderr %q; want \"ippools/pool-vxlan unchanged\"", r.code, r.stdout, r.stderr)
	}
	if again := c.kv(key); again.ModRevision != now.ModRevision {
		t.Errorf("unchanged apply wrote the key: mod revision %d, was %d", again.ModRevision, now.ModRevision)
	}
}

// TestApplyConcurrently has writers, each with its own connection as separate sluicectl
// processes would, apply different versions of one object at the same moment.
func TestApplyConcurrently(t *testing.T) {
	c := newCluster(t)
	const writers = 16
	const doc = `apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: pool-race
spec:
  cidr: 10.70.0.0/16
  nodeSelector: writer == '%d'
`
	key := store.IPPoolPrefix + "pool-race"
	for round := range 3 {
		c.ctl("", "delete", "ippools", "pool-race")
		results := make([]result, writers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range writers {
			wg.Go(func() {
				<-start
				results[i] = c.ctl(fmt.Sprintf(doc, i), "apply", "-f", "-")
			})
		}
		close(start)
		wg.Wait()
		actions := map[string]int{}
		for i, r := range results {
			if r.code != 0 {
				t.Fatalf("round %d writer %d: exit %d, stderr %s", round, i, r.code, r.stderr)
			}
			actions[strings.TrimSpace(r.stdout)]++
		}
		want := map[string]int{"ippools/pool-race created": 1, "ippools/pool-race updated": writers - 1}
		if !maps.Equal(actions, want) {
			t.Errorf("round %d: outputs %v, want %v", round, actions, want)
		}
		kv := c.kv(key)
		if kv.Version != writers {
			t.Errorf("round %d: key version %d, want %d (one create and %d updates)", round, kv.Version, writers, writers-1)
		}
		sel := c.value(key)["spec"].(map[string]any)["nodeSelector"]
		var n int
		if s, ok := sel.(string); !ok || func() bool { _, err := fmt.Sscanf(s, "writer == '%d'", &n); return err != nil }() || n < 0 || n >= writers {
			t.Errorf("round %d: final nodeSelector %v is none of the writers'", round, sel)
		}
	}
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestApplyRejectsBadDocumentsWritingNothing(t *testing.T) {
	c := newCluster(t)
	// Line numbers matter: document 2 starts with the "---" on line 7.
	threePools := `apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: pool-one
spec:
  cidr: 10.1.0.0/16
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: pool-two
spec:
  cidr: 10.2.0.0/16
  vxlanMode: Sometimes
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: pool-three
spec:
  cidr: 10.3.0.0/16
`
	for _, tc := range []struct {
		name, file, text string
		want             []string
	}{
		{"bad value", "pools.yaml", threePools,
			[]string{"pools.yaml, document 2 (line 7)", "spec.vxlanMode", `"Sometimes"`, "Never, Always or CrossSubnet"}},
		{"unknown field", "lower.yaml", strings.Replace(threePools, "vxlanMode: Sometimes", "vxlanmode: Always", 1),
			[]string{"lower.yaml, document 2 (line 7)", `unknown field "spec.vxlanmode" (did you mean "vxlanMode"?) (line 14)`}},
		{"unknown nested field", "nested.yaml", strings.Replace(threePools, "  name: pool-two", "  name: pool-two\n  colour: blue", 1),
			[]string{"nested.yaml, document 2 (line 7)", `unknown field "metadata.colour" (line 12)`}},
		{"no kind", "nokind.yaml", strings.Replace(threePools, "kind: IPPool\nmetadata:\n  name: pool-two", "metadata:\n  name: pool-two", 1),
			[]string{"nokind.yaml, document 2 (line 7)", "field kind: missing"}},
		{"unknown kind", "kind.yaml", strings.Replace(threePools, "kind: IPPool\nmetadata:\n  name: pool-two", "kind: IPPoool\nmetadata:\n  name: pool-two", 1),
			[]string{"kind.yaml, document 2 (line 7)", `unknown kind "IPPoool": expected one of IPPool, Node, Block, BlockAffinity, WorkloadEndpoint, Service, EndpointSlice`}},
		{"invalid YAML", "broken.yaml", strings.Replace(threePools, "  cidr: 10.2.0.0/16", "  cidr: [10.2.0.0/16", 1),
			[]string{"broken.yaml, document 2", "not valid YAML or JSON"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.file, tc.text)
			r := c.ctl("", "apply", "-f", path)
			if r.code != 1 {
				t.Errorf("exit %d, want 1; stderr:\n%s", r.code, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("printed %q on stdout, want nothing", r.stdout)
			}
			if !strings.Contains(r.stderr, "nothing was written") {
				t.Errorf("stderr does not say nothing was written:\n%s", r.stderr)
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
			if keys := c.keys("/"); len(keys) != 0 {
				t.Errorf("etcd holds %v after a rejected apply, want nothing", keys)
				if _, err := c.raw.Delete(context.Background(), "/", clientv3.WithPrefix()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestApplyUsageErrors(t *testing.T) {
	c := newCluster(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"apply"}, "need -f"},
		{[]string{"apply", sampleDir}, "files go after -f"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{}, "usage: sluicectl"},
		{[]string{"get"}, "want KIND"},
		{[]string{"get", "widgets"}, `unknown kind "widgets"`},
		{[]string{"get", "ippools", "-o", "xml"}, "want table, yaml or json"},
	} {
		r := c.ctl("", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("sluicectl %s: exit %d, stderr:\n%s\nwant exit 2 and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
	if keys := c.keys("/"); len(keys) != 0 {
		t.Errorf("etcd holds %v after usage errors", keys)
	}
	if r := c.ctl("", "help"); r.code != 0 || !strings.Contains(r.stdout, "usage: sluicectl") || !strings.Contains(r.stdout, "-etcd-endpoints") {
		t.Errorf("help: exit %d, stdout %q; want exit 0 and the usage with the global flags", r.code, r.stdout)
	}
}
