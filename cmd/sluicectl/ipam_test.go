package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/store"
)

// allocations returns the block's allocated addresses as "addr handle node" lines, read
// straight from etcd.
func (c *cluster) allocations(cidr string) string {
	c.t.Helper()
	key := store.BlockKey(netip.MustParsePrefix(cidr))
	obj, err := store.Decode(key, c.kv(key).Value)
	if err != nil {
		c.t.Fatalf("block %s: %v", cidr, err)
	}
	var b strings.Builder
	for _, a := range obj.(*store.Block).Allocations {
		fmt.Fprintf(&b, "%s %s %s\n", a.Addr, a.Handle, a.Node)
	}
	return b.String()
}

// handleCounts returns the per-block counts of an IPAM handle, or nil when it does not exist.
func (c *cluster) handleCounts(id string) map[string]int {
	c.t.Helper()
	if len(c.keys(store.HandleKey(id))) == 0 {
		return nil
	}
	var h store.IPAMHandle
	if err := json.Unmarshal(c.kv(store.HandleKey(id)).Value, &h); err != nil {
		c.t.Fatal(err)
	}
	return h.Block
}

func TestIPAMCommands(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	expect := func(want string, args ...string) {
		t.Helper()
		r := c.ctl("", args...)
		if r.code != 0 || r.stdout != want {
			t.Fatalf("sluicectl %s: exit %d\nstdout:\n%s\nstderr:\n%s\nwant stdout:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr, want)
		}
	}
	expectTable := func(want string, args ...string) {
		t.Helper()
		if got := table(c.mustCtl(args...)); got != want {
			t.Errorf("sluicectl %s:\n%s\nwant\n%s", strings.Join(args, " "), got, want)
		}
	}

	expect("claimed 10.65.0.0/26 for node-a\n", "ipam", "claim", "--node", "node-a", "--pool", "pool-vxlan")
	expect("claimed 10.65.0.64/26 for node-b\n", "ipam", "claim", "--node", "node-b", "--pool", "pool-vxlan", "--cidr", "10.65.0.64/26")
	for _, key := range []string{"/calico/ipam/v2/assignment/ipv4/block/10.65.0.0-26", "/calico/ipam/v2/host/node-a/ipv4/block/10.65.0.0-26",
		"/calico/ipam/v2/assignment/ipv4/block/10.65.0.64-26", "/calico/ipam/v2/host/node-b/ipv4/block/10.65.0.64-26"} {
		c.kv(key)
	}
	if r := c.ctl("", "ipam", "claim", "--node", "node-c", "--pool", "pool-vxlan", "--cidr", "10.65.0.64/26"); r.code != 1 || !strings.Contains(r.stderr, "already claimed") {
		t.Errorf("claiming node-b's block for node-c: exit %d, stderr %q; want exit 1, already claimed", r.code, r.stderr)
	}

	expect("10.65.0.0\n10.65.0.1\n10.65.0.2\n", "ipam", "assign", "--node", "node-a", "--handle", "k8s-pod-network.web-a",
		"--pool", "pool-vxlan", "--count", "3", "--attr", "pod=web-a", "--attr", "namespace=default")
	expect("10.65.0.65\n", "ipam", "assign", "--node", "node-b", "--handle", "k8s-pod-network.web-b", "--ip", "10.65.0.65")
	// No block of pool-cross yet: assigning claims one.
	expect("10.66.0.0\n", "ipam", "assign", "--node", "node-c", "--handle", "k8s-pod-network.db-c", "--pool", "pool-cross")

	if got, want := c.allocations("10.65.0.0/26"), "10.65.0.0 k8s-pod-network.web-a node-a\n10.65.0.1 k8s-pod-network.web-a node-a\n10.65.0.2 k8s-pod-network.web-a node-a\n"; got != want {
		t.Errorf("block 10.65.0.0/26 allocations:\n%s\nwant\n%s", got, want)
	}
	if got := c.handleCounts("k8s-pod-network.web-a"); len(got) != 1 || got["10.65.0.0/26"] != 3 {
		t.Errorf("handle k8s-pod-network.web-a counts %v, want 3 in 10.65.0.0/26", got)
	}
	if got, want := c.allocations("10.66.0.0/26"), "10.66.0.0 k8s-pod-network.db-c node-c\n"; got != want {
		t.Errorf("block 10.66.0.0/26 allocations:\n%s\nwant\n%s", got, want)
	}

	expectTable(`POOL NODE BLOCKS IN-USE TOTAL USED%
pool-cross node-c 1 1 64 1.6
pool-vxlan node-a 1 3 64 4.7
pool-vxlan node-b 1 1 64 1.6
`, "ipam", "show")

	expect("released 10.65.0.0\nreleased 10.65.0.1\nreleased 10.65.0.2\n", "ipam", "release", "--handle", "k8s-pod-network.web-a")
	expect("released 10.65.0.65\n", "ipam", "release", "--ip", "10.65.0.65")
	for _, h := range []string{"k8s-pod-network.web-a", "k8s-pod-network.web-b"} {
		if got := c.handleCounts(h); got != nil {
			t.Errorf("handle %s still counts %v after its addresses were released", h, got)
		}
	}
	if got := c.allocations("10.65.0.0/26"); got != "" {
		t.Errorf("block 10.65.0.0/26 still allocates after release:\n%s", got)
	}
	expectTable(`POOL NODE BLOCKS IN-USE TOTAL USED%
pool-cross node-c 1 1 64 1.6
pool-vxlan node-a 1 0 64 0.0
pool-vxlan node-b 1 0 64 0.0
`, "ipam", "show")

	for _, tc := range []struct {
		code int
		want string
		args []string
	}{
		{1, "releasing handle k8s-pod-network.web-a: not found", []string{"ipam", "release", "--handle", "k8s-pod-network.web-a"}},
		{1, "releasing ip 10.65.0.65: not found", []string{"ipam", "release", "--ip", "10.65.0.65"}},
		{2, "assign needs --node and --handle", []string{"ipam", "assign", "--node", "node-a"}},
		{2, "claim needs --node and --pool", []string{"ipam", "claim", "--pool", "pool-vxlan"}},
		{2, "not both", []string{"ipam", "release", "--handle", "h", "--ip", "10.65.0.1"}},
		{2, `--ip "10.65.0.x" is not an IP address`, []string{"ipam", "assign", "--node", "node-a", "--handle", "h", "--ip", "10.65.0.x"}},
		{2, `--attr "pod": want KEY=VALUE`, []string{"ipam", "assign", "--node", "node-a", "--handle", "h", "--attr", "pod"}},
		{2, `unknown ipam subcommand "list"`, []string{"ipam", "list"}},
		{2, "want a subcommand", []string{"ipam"}},
	} {
		r := c.ctl("", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("sluicectl %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.code, tc.want)
		}
	}
}

func TestRecordReplay(t *testing.T) {
	c := newCluster(t)
	c.loadSampleWithIPAM()
	rev := c.revision()
	file := filepath.Join(t.TempDir(), "events.jsonl")

	out := c.mustCtl("record", file, "--until-in-sync")
	// 13 sample objects, the rack's BGP configuration and two peers, node-a's block and its
	// affinity, and the in-sync.
	if want := fmt.Sprintf("recorded 19 events up to revision %d to %s\n", rev, file); out != want {
		t.Errorf("record printed %q, want %q", out, want)
	}

	want := fmt.Sprintf("revision %d, in sync: true\n", rev)
	for _, k := range store.Kinds {
		tbl := sampleTables[k.Plural()]
		want += fmt.Sprintf("\n%s (%d)\n%s", strings.ToUpper(k.Plural()), strings.Count(tbl, "\n")-1, tbl)
	}
	if got := table(c.mustCtl("replay", file)); got != table(want) {
		t.Errorf("replay printed\n%s\nwant\n%s", got, table(want))
	}

	if r := c.ctl("", "replay", filepath.Join(t.TempDir(), "missing.jsonl")); r.code != 1 || !strings.Contains(r.stderr, "missing.jsonl") {
		t.Errorf("replay of a missing file: exit %d, stderr %q", r.code, r.stderr)
	}
	bad := writeFile(t, "bad.jsonl", `{"rev":1,"type":"upsert","key":"/calico/resources/v3/projectcalico.org/ippools/p","value":{"spec":{"cidr":"nope"}}}`+"\n")
	if r := c.ctl("", "replay", bad); r.code != 1 || !strings.Contains(r.stderr, "line 1") || !strings.Contains(r.stderr, "spec.cidr") {
		t.Errorf("replay of a bad log: exit %d, stderr %q; want exit 1 naming line 1 and spec.cidr", r.code, r.stderr)
	}
}

// TestGlobalFlags points the environment at a dead port: only the flag, before or after
// the command, can reach the server.
func TestGlobalFlags(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	real := c.endpoint
	c.env["SLUICE_ETCD_ENDPOINTS"] = "http://127.0.0.1:1"

	for _, args := range [][]string{
		{"--etcd-endpoints", real, "get", "ippools"},
		{"get", "ippools", "--etcd-endpoints", real},
		{"get", "--etcd-endpoints=" + real, "ippools"},
		{"--timeout", "5s", "get", "ippools", "--etcd-endpoints", real},
	} {
		if got := table(c.mustCtl(args...)); got != sampleTables["ippools"] {
			t.Errorf("sluicectl %s:\n%s\nwant\n%s", strings.Join(args, " "), got, sampleTables["ippools"])
		}
	}
	if got := c.mustCtl("apply", "-f", sampleDir, "--etcd-endpoints", real); got != strings.Join(withAction("unchanged"), "\n")+"\n" {
		t.Errorf("apply with the flag after -f printed:\n%s", got)
	}

	// Without the flag the environment is used, and the dead port fails within --timeout.
	for _, args := range [][]string{
		{"--timeout", "500ms", "get", "ippools"},
		{"get", "ippools", "--timeout", "500ms"},
	} {
		if r := c.ctl("", args...); r.code != 1 || !strings.Contains(r.stderr, "sluicectl get:") {
			t.Errorf("sluicectl %s against a dead port: exit %d, stdout %q, stderr %q; want exit 1", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
	}
}

// TestIPAMHelp: ipam --help lists the subcommands; a subcommand's --help lists its own flags
// only; an unknown subcommand is a usage error before etcd is asked anything.
func TestIPAMHelp(t *testing.T) {
	c := newCluster(t)
	c.env["SLUICE_ETCD_ENDPOINTS"] = "http://127.0.0.1:1" // never asked
	r := c.ctl("", "ipam", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "ipam claim") || !strings.Contains(r.stdout, "ipam release") {
		t.Fatalf("ipam --help: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = c.ctl("", "ipam", "claim", "--help")
	if r.code != 0 || !strings.Contains(r.stderr, "-cidr") || strings.Contains(r.stderr, "-count") || strings.Contains(r.stderr, "-attr") {
		t.Fatalf("ipam claim --help: exit %d\n%s", r.code, r.stderr)
	}
	r = c.ctl("", "ipam", "assign", "--help")
	if r.code != 0 || !strings.Contains(r.stderr, "-count") || strings.Contains(r.stderr, "-cidr") {
		t.Fatalf("ipam assign --help: exit %d\n%s", r.code, r.stderr)
	}
	if r = c.ctl("", "ipam", "clam"); r.code != 2 || !strings.Contains(r.stderr, `unknown ipam subcommand "clam"`) || strings.Contains(r.stderr, "cannot reach etcd") {
		t.Fatalf("ipam clam: exit %d\n%s", r.code, r.stderr)
	}
}
