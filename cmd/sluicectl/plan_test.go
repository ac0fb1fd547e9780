package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestPlanFromLogMatchesGolden: plan over a recorded log prints the golden final state.
func TestPlanFromLogMatchesGolden(t *testing.T) {
	c := newCluster(t)
	out := c.mustCtl("plan", "--node", "node-a", "--from-log", "../../testdata/calc/seed003-blackholes/events.jsonl")
	golden, err := os.ReadFile("../../testdata/calc/seed003-blackholes/node-a.want.txt")
	if err != nil {
		t.Fatal(err)
	}
	sections := strings.Split(string(golden), "=== after in-sync ")
	last := sections[len(sections)-1]
	last = last[strings.Index(last, "\n")+1:]
	if !strings.Contains(out, strings.TrimSpace(last)) {
		t.Fatalf("plan output:\n%s\nwant the golden state:\n%s", out, last)
	}
}

// TestPlanLive: plan against live etcd after loading the sample cluster shows node-a's
// blackhole, its local workloads and VXLAN routes to the other nodes' blocks.
func TestPlanLive(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	for i, node := range []string{"node-a", "node-b", "node-c"} {
		cidr := []string{"10.65.0.0/26", "10.65.0.64/26", "10.65.0.128/26"}[i]
		c.mustCtl("ipam", "claim", "--node", node, "--pool", "pool-vxlan", "--cidr", cidr)
	}
	out := c.mustCtl("plan", "--node", "node-a", "-o", "json")
	// camelCase keys, as status -o json has them.
	if !strings.Contains(out, `"routes": [`) || !strings.Contains(out, `"dst": "10.65.0.0/26"`) || strings.Contains(out, `"Routes"`) {
		t.Errorf("plan -o json keys are not camelCase:\n%.400s", out)
	}
	var st struct {
		Routes []struct {
			Dst, Type, Device, Gateway, Reason string
		}
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got := map[string]string{}
	for _, r := range st.Routes {
		got[r.Dst] = r.Type + " " + r.Device + " " + r.Gateway + " " + r.Reason
	}
	want := map[string]string{
		"10.65.0.0/26":   "blackhole   local-block",
		"10.65.0.1/32":   "unicast cali-web-a  local-workload",
		"10.66.0.1/32":   "unicast cali-db-a  local-workload",
		"10.65.0.64/26":  "unicast vxlan.sluice 10.65.0.64 remote-block",
		"10.65.0.128/26": "unicast vxlan.sluice 10.65.0.128 remote-block",
		"10.66.0.65/32":  "unicast @parent 192.168.10.12 borrowed",
	}
	for dst, w := range want {
		if got[dst] != w {
			t.Errorf("route %s = %q, want %q", dst, got[dst], w)
		}
	}
	if r := c.ctl("", "plan"); r.code != 2 {
		t.Fatalf("plan without --node exited %d, want 2", r.code)
	}
}

// TestPlanAndDiffUnknownNode: a node name etcd does not know is an error naming it, not a
// believable empty plan; diff without --node says which node it compares.
func TestPlanAndDiffUnknownNode(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	r := c.ctl("", "plan", "--node", "node-typo")
	if r.code == 0 || r.stdout != "" || !strings.Contains(r.stderr, `no node named "node-typo" in etcd (no /calico/resources/v3/projectcalico.org/nodes/node-typo)`) {
		t.Fatalf("plan --node node-typo: exit %d\nstdout %q\nstderr %q", r.code, r.stdout, r.stderr)
	}
	if r := c.ctl("", "diff", "--node", "node-typo"); r.code != 2 || !strings.Contains(r.stderr, `no node named "node-typo" in etcd`) {
		t.Fatalf("diff --node node-typo: exit %d, stderr %q", r.code, r.stderr)
	}
	c.env["SLUICE_NODE_NAME"] = "node-typo" // as this node's sluiced is configured
	r = c.ctl("", "diff")
	if r.code != 2 || !strings.Contains(r.stderr, "node node-typo (the name this node's sluiced would use") || !strings.Contains(r.stderr, `no node named "node-typo"`) {
		t.Fatalf("diff without --node: exit %d, stderr %q", r.code, r.stderr)
	}
}
