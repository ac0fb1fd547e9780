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
	checkResource(store.NodePrefix+"node-c", "Node", "projectcalico.org/v3", `{"name":"node-c","labels":{"rack":"b"}}`,
		`{"bgp":{"ipv4Address":"192.168.20.13/24","ipv6Address":"fd00:20::13/64","asNumber":64603},"ipv4VXLANTunnelAddr":"10.65.0.128","vxlanTunnelMACAddr":"66:c1:a0:00:00:0c","ipv6VXLANTunnelAddr":"fd00:65::80","vxlanTunnelMACAddrV6":"66:c1:a6:00:00:0c"}`)
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

// kubernetesDir holds a single-stack Service, a dual-stack one and an EndpointSlice exactly
// as `kubectl get -o yaml` prints them, managedFields and all.
const kubernetesDir = "../../store/testdata/kubernetes"

func readKubernetes(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kubernetesDir, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestApplyKubernetesObjects: what kubectl prints applies as printed; sluice keeps every
// field a Kubernetes reader expects, drops the apiserver's bookkeeping, and reads the
// families back. Printed again and applied again, nothing changes.
func TestApplyKubernetesObjects(t *testing.T) {
	c := newCluster(t)
	objects := []string{"endpointslices/shop/web-x7k2p", "services/shop/gateway", "services/shop/web"}
	out := c.mustCtl("apply", "-f", kubernetesDir)
	for i, action := range []string{"created", "unchanged"} {
		want := make([]string, len(objects))
		for j, o := range objects {
			want[j] = o + " " + action
		}
		if got := lines(out); !slices.Equal(got, want) {
			t.Errorf("apply %d printed\n%s\nwant\n%s", i+1, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		out = c.mustCtl("apply", "-f", kubernetesDir)
	}

	web, gateway, slice := store.ServicePrefix+"shop/web", store.ServicePrefix+"shop/gateway", store.EndpointSlicePrefix+"shop/web-x7k2p"
	for _, key := range []string{web, gateway, slice} {
		meta := c.value(key)["metadata"].(map[string]any)
		for _, dropped := range []string{"resourceVersion", "generation", "managedFields"} {
			if v, ok := meta[dropped]; ok {
				t.Errorf("%s: metadata.%s stored (%v), want it dropped", key, dropped, v)
			}
		}
		if uid, _ := meta["uid"].(string); !uidRE.MatchString(uid) {
			t.Errorf("%s: metadata.uid %q is not a version 4 UUID", key, uid)
		}
	}
	v := c.value(web)
	if meta := v["metadata"].(map[string]any); !jsonEqual(t, meta["labels"], `{"app":"web"}`) || meta["annotations"] == nil {
		t.Errorf("%s: labels %v annotations %v, want them kept", web, meta["labels"], meta["annotations"])
	}
	if !jsonEqual(t, v["spec"], `{"type":"ClusterIP","selector":{"app":"web"},"clusterIP":"10.96.14.7","clusterIPs":["10.96.14.7"],`+
		`"ipFamilies":["IPv4"],"ipFamilyPolicy":"SingleStack","ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":"http"}],`+
		`"internalTrafficPolicy":"Cluster","sessionAffinity":"None"}`) {
		t.Errorf("%s: spec %v", web, v["spec"])
	}
	if meta := c.value(gateway)["metadata"].(map[string]any); !jsonEqual(t, meta["finalizers"], `["service.kubernetes.io/load-balancer-cleanup"]`) {
		t.Errorf("%s: finalizers %v, want them kept", gateway, meta["finalizers"])
	}
	v = c.value(slice)
	if meta := v["metadata"].(map[string]any); meta["generateName"] != "web-" ||
		!jsonEqual(t, meta["ownerReferences"], `[{"apiVersion":"v1","kind":"Service","name":"web","uid":"3f7e1c52-8a0b-4d4e-9c61-2b5d7e0f9a13","controller":true,"blockOwnerDeletion":true}]`) {
		t.Errorf("%s: generateName %v ownerReferences %v, want them kept", slice, meta["generateName"], meta["ownerReferences"])
	}
	if ep := v["endpoints"].([]any)[0]; !jsonEqual(t, ep, `{"addresses":["10.65.0.1"],"conditions":{"ready":true,"serving":true,"terminating":false},`+
		`"targetRef":{"kind":"Pod","namespace":"shop","name":"web-7c9d8b6f5-x2kqp","uid":"61c2f0d4-7a3e-4b18-a9d5-0e8f3c6b2a71"},`+
		`"nodeName":"node-a","zone":"zone-a","hints":{"forZones":[{"name":"zone-a"}],"forNodes":[{"name":"node-a"}]}}`) {
		t.Errorf("%s: endpoints[0] %v", slice, ep)
	}

	// The agent's decoder reads the families back.
	o, err := store.Decode(gateway, c.kv(gateway).Value)
	if err != nil {
		t.Fatal(err)
	}
	if s := o.(*store.Service); !slices.Equal(s.IPFamilies, []string{"IPv4", "IPv6"}) || s.IPFamilyPolicy != store.RequireDualStack || len(s.ClusterIPs) != 2 {
		t.Errorf("%s decodes to families %q policy %q cluster IPs %v, want IPv4, IPv6, RequireDualStack and two", gateway, s.IPFamilies, s.IPFamilyPolicy, s.ClusterIPs)
	}
	if got, want := table(c.mustCtl("get", "services", "-n", "shop")), `NAMESPACE NAME TYPE CLUSTER-IPS EXTERNAL PORTS POLICY
shop gateway LoadBalancer 10.96.14.8,2001:db8:96::8 203.0.113.10,2001:db8:feed::10 443:30443/TCP ext=Local,int=Cluster
shop web ClusterIP 10.96.14.7 - 80/TCP ext=Cluster,int=Cluster
`; got != want {
		t.Errorf("get services -n shop:\n%s\nwant\n%s", got, want)
	}

	// sluicectl's own output re-applies unchanged.
	for _, o := range objects {
		kind, name, _ := strings.Cut(o, "/")
		ns, name, _ := strings.Cut(name, "/")
		out := c.mustCtl("get", kind, name, "-n", ns, "-o", "yaml")
		if r := c.ctl(out, "apply", "-f", "-"); r.code != 0 || r.stdout != o+" unchanged\n" {
			t.Errorf("get %s -o yaml | apply -f -: exit %d, stdout %q, stderr %q", o, r.code, r.stdout, r.stderr)
		}
	}
}

// TestApplyKubernetesList: `kubectl get svc,endpointslices -o yaml` prints a List.
func TestApplyKubernetesList(t *testing.T) {
	c := newCluster(t)
	var b strings.Builder
	b.WriteString("apiVersion: v1\nitems:\n")
	for _, f := range []string{"service-single-stack.yaml", "service-dual-stack.yaml", "endpointslice.yaml"} {
		first := true
		for _, line := range strings.Split(strings.TrimRight(readKubernetes(t, f), "\n"), "\n") {
			if strings.HasPrefix(line, "#") {
				continue
			}
			if first {
				b.WriteString("- " + line + "\n")
				first = false
			} else {
				b.WriteString("  " + line + "\n")
			}
		}
	}
	b.WriteString("kind: List\nmetadata:\n  resourceVersion: \"\"\n")
	r := c.ctl(b.String(), "apply", "-f", "-")
	want := "services/shop/web created\nservices/shop/gateway created\nendpointslices/shop/web-x7k2p created\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("apply of a List: exit %d, stdout %q, stderr %q; want %q", r.code, r.stdout, r.stderr, want)
	}
}

// TestApplyRefusesKubernetesMistakes: fields Kubernetes does not have are still refused,
// with a hint when one is close, and wrong families are named; nothing is written.
func TestApplyRefusesKubernetesMistakes(t *testing.T) {
	c := newCluster(t)
	svc, slice := readKubernetes(t, "service-single-stack.yaml"), readKubernetes(t, "endpointslice.yaml")
	lineOf := func(text, s string) int { return strings.Count(text[:strings.Index(text, s)], "\n") + 1 }
	for _, tc := range []struct {
		name, text, old, new string
		want                 []string
	}{
		{"typo in a Service", svc, "ipFamilyPolicy: SingleStack", "ipFamilyPolicyy: SingleStack",
			[]string{`unknown field "spec.ipFamilyPolicyy" (did you mean "ipFamilyPolicy"?) (line %d)`}},
		{"typo in an EndpointSlice", slice, "  targetRef:", "  targetref:",
			[]string{`unknown field "endpoints[0].targetref" (did you mean "targetRef"?) (line %d)`}},
		{"no such field", svc, "  sessionAffinity: None", "  topologyKeys: [\"*\"]",
			[]string{`unknown field "spec.topologyKeys" (line %d)`}},
		{"family of another address", svc, "  - IPv4\n", "  - IPv6\n",
			[]string{"field spec.clusterIPs[0]", "10.96.14.7 is IPv4, but spec.ipFamilies[0] is IPv6"}},
		{"unknown family", svc, "  - IPv4\n", "  - IPv4\n  - IPv5\n",
			[]string{"field spec.ipFamilies[1]", `unknown family "IPv5": want IPv4 or IPv6`}},
		{"ExternalName", svc, "  type: ClusterIP", "  type: ExternalName\n  externalName: db.example.com",
			[]string{"field spec.type", "ExternalName is a DNS alias"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(tc.text, tc.old) {
				t.Fatalf("the object has no %q", tc.old)
			}
			text := strings.Replace(tc.text, tc.old, tc.new, 1)
			path := writeFile(t, "object.yaml", text)
			r := c.ctl("", "apply", "-f", path)
			if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "nothing was written") {
				t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant exit 1, nothing on stdout, and nothing was written", r.code, r.stdout, r.stderr)
			}
			for _, w := range tc.want {
				if strings.Contains(w, "%d") {
					w = fmt.Sprintf(w, lineOf(text, strings.TrimSpace(strings.SplitN(tc.new, ":", 2)[0])+":"))
				}
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
			if keys := c.keys("/"); len(keys) != 0 {
				t.Errorf("etcd holds %v after a rejected apply, want nothing", keys)
			}
		})
	}
}
