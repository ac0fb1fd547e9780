package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/store"
)

func TestStatus(t *testing.T) {
	c := newCluster(t)
	// node-z ran an agent once (and stopped); node-c never did.
	for k, v := range map[string]string{
		store.NodePrefix + "node-z": `{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-z"},"spec":{"bgp":{"ipv4Address":"192.0.2.99/24"}}}`,
		store.SeenPrefix + "node-z": "2026-12-04T05:00:00Z",
	} {
		if _, err := c.raw.Put(context.Background(), k, v); err != nil {
			t.Fatal(err)
		}
	}
	c.loadSample() // node-a, node-b, node-c
	latest := c.revision()
	put := func(s store.NodeStatus) {
		b, _ := json.Marshal(s)
		if _, err := c.raw.Put(context.Background(), store.StatusPrefix+s.Node, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	put(store.NodeStatus{Node: "node-a", Revision: latest, AppliedRevision: latest, InSync: true, Ready: true, RoutesDesired: 7, RoutesProgrammed: 7,
		BGPSessions: 3, BGPSessionsUp: 2})
	put(store.NodeStatus{Node: "node-b", Revision: latest, AppliedRevision: latest - 3, InSync: true, BadValues: 1, Problems: 2,
		LeftoversBreaking: 1, LeftoversDormant: 2})
	put(store.NodeStatus{Node: "node-x", Revision: latest, AppliedRevision: latest, InSync: true, LastError: "replacing route to 10.65.0.0/26: no such device"})
	put(store.NodeStatus{Node: "node-y", Revision: latest, AppliedRevision: latest, InSync: true, RoutesDesired: 3, RoutesProgrammed: 3,
		Services: "down: loading the eBPF programs: invalid argument"})
	out := table(c.mustCtl("status", "--settle", "0"))
	for _, want := range []string{
		"NODE STATE REVISION APPLIED ROUTES BAD-VALUES PROBLEMS LEFTOVERS SERVICES BGP LAST-ERROR",
		"node-a in sync", "7/7 0 0 - off 2/3 up -", // two of its three BGP sessions established
		"node-b lagging by 3", "0/0 1 2 1 breaking, 2 dormant off - -", // one bad value, two inputs it cannot act on, leftovers, no BGP
		"node-y services down (routes programmed)", "3/3 0 0 - down: loading the eBPF programs: invalid argument - -",
		"node-c no agent (none ever reported)",
		"node-z gone (its agent last started 2026-12-04T05:00:00Z)",
		"node-x failing", "no such device",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	var rows []statusRow
	if err := json.Unmarshal([]byte(c.mustCtl("status", "-o", "json", "--settle", "0")), &rows); err != nil || len(rows) != 6 || rows[1].Lag != 3 {
		t.Fatalf("json: %v %+v", err, rows)
	}
}

// TestDiffTroubleExitsTwo: diff exits 1 only for "they differ"; trouble (here no etcd) is 2.
func TestDiffTroubleExitsTwo(t *testing.T) {
	c := newCluster(t)
	c.env["SLUICE_ETCD_ENDPOINTS"] = "http://127.0.0.1:1"
	if r := c.ctl("", "diff", "--node", "node-a", "--timeout", "500ms"); r.code != 2 {
		t.Fatalf("diff without etcd exited %d, want 2: %s", r.code, r.stderr)
	}
}

// TestUnreachableEtcdSaysWhy: with no etcd at the endpoint, a command fails naming the endpoint
// and the cause (as etcdctl does), not with "context deadline exceeded" once --timeout is over.
func TestUnreachableEtcdSaysWhy(t *testing.T) {
	c := newCluster(t)
	c.env["SLUICE_ETCD_ENDPOINTS"] = "http://127.0.0.1:1"
	for _, args := range [][]string{{"get", "nodes"}, {"status"}, {"plan", "--node", "node-a"}} {
		r := c.ctl("", args...)
		if r.code == 0 || !strings.Contains(r.stderr, "cannot reach etcd") || !strings.Contains(r.stderr, "http://127.0.0.1:1") ||
			!strings.Contains(r.stderr, "connection refused") || strings.Contains(r.stderr, "deadline exceeded") {
			t.Errorf("sluicectl %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}
