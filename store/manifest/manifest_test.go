package manifest_test

import (
	"strings"
	"testing"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/manifest"
)

func TestParseSample(t *testing.T) {
	docs, err := manifest.ParsePaths([]string{"../../testdata/sample"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if _, err := store.Decode(d.Key, d.Value); err != nil {
			t.Errorf("%s: %s does not decode: %v", d.Source, d.Key, err)
		}
	}
	if len(docs) != 13 {
		t.Errorf("the sample holds %d documents, want 13", len(docs))
	}
	if _, err := manifest.ParsePaths([]string{t.TempDir()}, nil); err == nil || !strings.Contains(err.Error(), "no .yaml") {
		t.Errorf("an empty directory: %v", err)
	}
}

// TestParseExactFieldNames checks that a field spelled in the wrong case is refused with
// its path, wherever it sits, while keys of maps (labels) are free.
func TestParseExactFieldNames(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"pool spec", `{kind: IPPool, metadata: {name: p}, spec: {cidr: 10.1.0.0/16, vxlanmode: Always}}`,
			`unknown field "spec.vxlanmode" (did you mean "vxlanMode"?)`},
		{"metadata", `{kind: IPPool, metadata: {Name: p}, spec: {cidr: 10.1.0.0/16}}`,
			`unknown field "metadata.Name" (did you mean "name"?)`},
		{"type meta", `{kind: IPPool, APIVersion: projectcalico.org/v3, metadata: {name: p}, spec: {cidr: 10.1.0.0/16}}`,
			`unknown field "APIVersion" (did you mean "apiVersion"?)`},
		{"nested struct", `{kind: Node, metadata: {name: n}, spec: {bgp: {ipv4address: 192.0.2.1/24}}}`,
			`unknown field "spec.bgp.ipv4address" (did you mean "ipv4Address"?)`},
		{"list element", `{kind: Service, metadata: {name: s}, spec: {clusterIPs: [10.96.0.1], ports: [{port: 80, nodeport: 30080}]}}`,
			`unknown field "spec.ports[0].nodeport" (did you mean "nodePort"?)`},
		{"slice endpoint", `{kind: EndpointSlice, metadata: {name: e, labels: {kubernetes.io/service-name: s}}, addressType: IPv4, endpoints: [{addresses: [10.65.0.1], nodename: a}], ports: []}`,
			`unknown field "endpoints[0].nodename" (did you mean "nodeName"?)`},
		{"block affinity", `{kind: BlockAffinity, Node: node-a, cidr: 10.65.0.0/26}`,
			`unknown field "Node" (did you mean "node"?)`},
		{"block", `{kind: Block, cidr: 10.65.0.0/26, strictaffinity: true}`,
			`unknown field "strictaffinity" (did you mean "strictAffinity"?)`},
		{"near miss", `{kind: Service, metadata: {name: s}, spec: {clusterIPs: [10.96.0.1], ipFamilies: [IPv4], ipFamilyPolicyy: SingleStack}}`,
			`unknown field "spec.ipFamilyPolicyy" (did you mean "ipFamilyPolicy"?)`},
		{"near miss swapped letters", `{kind: EndpointSlice, metadata: {name: e, labels: {kubernetes.io/service-name: s}}, addressType: IPv4, endpoints: [{addresses: [10.65.0.1], hitns: {forZones: [{name: a}]}}]}`,
			`unknown field "endpoints[0].hitns" (did you mean "hints"?)`},
		{"no field near", `{kind: Service, metadata: {name: s}, spec: {clusterIPs: [10.96.0.1], topologyKeys: ["*"]}}`,
			`unknown field "spec.topologyKeys" (line 1)`}, // no hint: nothing is close
		{"list item", "kind: List\nitems:\n- {kind: IPPool, metadata: {name: p}, spec: {cidr: 10.1.0.0/16, blocksize: 26}}\n",
			`item 0: unknown field "spec.blocksize" (did you mean "blockSize"?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs, err := manifest.Parse("in.yaml", strings.NewReader(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse: %v; want an error with %q", err, tc.want)
			}
			if len(docs) != 0 {
				t.Errorf("Parse returned %d documents along with the error, want none", len(docs))
			}
		})
	}

	// Map keys are the user's own; they are not field names.
	docs, err := manifest.Parse("ok.yaml", strings.NewReader(`{kind: WorkloadEndpoint, metadata: {name: w, labels: {App: web, Tier: front}, annotations: {Note: x}}, spec: {node: a, interfaceName: cali0, ipNetworks: [10.65.0.1/32]}}
---
{kind: Service, metadata: {name: s}, spec: {clusterIPs: [10.96.0.1], ports: [{port: 80, targetPort: http}]}}
---
{kind: Block, cidr: 10.65.0.0/26, affinity: "host:node-a", sequenceNumberForAllocation: {"0": 1}}
---
{kind: BlockAffinity, node: node-a, cidr: 10.65.0.0/26, state: confirmed}
`))
	if err != nil || len(docs) != 4 {
		t.Fatalf("Parse: %d documents, %v; want 4 and no error", len(docs), err)
	}
}

// TestUnknownFieldLine: an unknown field's error gives the field's own line, inside lists too.
func TestUnknownFieldLine(t *testing.T) {
	doc := `apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  type: NodePort
  clusterIPs: [10.96.0.10]
  ports:
  - name: http
    port: 80
  - name: https
    prot: 443
`
	_, err := manifest.Parse("svc.yaml", strings.NewReader(doc))
	if err == nil || !strings.Contains(err.Error(), `svc.yaml, document 1 (line 1): unknown field "spec.ports[1].prot" (did you mean "port"?) (line 13)`) {
		t.Fatalf("error: %v", err)
	}
}

// TestParseBGPKinds: calicoctl's YAML for BGP (a route-reflector setup as Calico's own tests
// write it) lands under Calico's keys and decodes; a wrong field is refused by name.
func TestParseBGPKinds(t *testing.T) {
	const doc = `kind: BGPConfiguration
apiVersion: projectcalico.org/v3
metadata: {name: default}
spec:
  asNumber: 64532
  nodeToNodeMeshEnabled: false
  serviceClusterIPs: [{cidr: 10.96.0.0/12}]
---
kind: BGPPeer
apiVersion: projectcalico.org/v3
metadata: {name: bgppeer-v6}
spec:
  peerIP: "[ac13::57]:50"
  asNumber: 64533
  nodeSelector: has(routeReflector)
---
kind: BGPPeer
apiVersion: projectcalico.org/v3
metadata: {name: bgppeer-other-nodes}
spec:
  nodeSelector: has(routeReflector)
  peerSelector: "!has(routeReflector)"
---
kind: Node
apiVersion: projectcalico.org/v3
metadata:
  name: kube-master
  labels: {routeReflector: "true"}
spec:
  bgp: {ipv4Address: 10.192.0.2/16, routeReflectorClusterID: 10.0.0.1}
`
	docs, err := manifest.Parse("rr.yaml", strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	wantKeys := []string{store.BGPConfigPrefix + "default", store.BGPPeerPrefix + "bgppeer-v6", store.BGPPeerPrefix + "bgppeer-other-nodes", store.NodePrefix + "kube-master"}
	if len(docs) != len(wantKeys) {
		t.Fatalf("%d documents, want %d", len(docs), len(wantKeys))
	}
	for i, d := range docs {
		if d.Key != wantKeys[i] {
			t.Errorf("document %d: key %s, want %s", i, d.Key, wantKeys[i])
		}
		o, err := store.Decode(d.Key, d.Value)
		if err != nil {
			t.Fatalf("%s does not decode: %v", d.Key, err)
		}
		if p, ok := o.(*store.BGPPeer); ok && p.Name == "bgppeer-v6" && (p.PeerPort != 50 || p.ASNumber != 64533) {
			t.Errorf("peer: %+v", p)
		}
	}
	_, err = manifest.Parse("bad.yaml", strings.NewReader("kind: BGPPeer\nmetadata: {name: p}\nspec: {peerIP: 10.0.0.1, asNumber: 1, nexthopmode: Self}\n"))
	if err == nil || !strings.Contains(err.Error(), `unknown field "spec.nexthopmode" (did you mean "nextHopMode"?)`) {
		t.Errorf("misspelt field: %v", err)
	}
	_, err = manifest.Parse("bad.yaml", strings.NewReader("kind: BGPPeer\nmetadata: {name: p}\nspec: {peerIP: 10.0.0.1, asNumber: 1, filters: [f]}\n"))
	if err == nil || !strings.Contains(err.Error(), "spec.filters") {
		t.Errorf("refused field: %v", err)
	}
}
