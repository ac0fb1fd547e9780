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
