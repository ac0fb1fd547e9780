package main

import (
	"strings"
	"testing"

	"github.com/sluice-net/sluice/store"
)

func poolYAML(name, cidr string) string {
	return "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: " + name + "\nspec:\n  cidr: " + cidr + "\n"
}

// TestApplyRefusesPoolsCalicoctlRefuses: a pool CIDR with host bits, and a pool overlapping
// another (in etcd, or in the same apply), are refused naming both, and nothing is written.
func TestApplyRefusesPoolsCalicoctlRefuses(t *testing.T) {
	c := newCluster(t)
	c.mustCtl("apply", "-f", writeFile(t, "a.yaml", poolYAML("pool-a", "10.65.0.0/16")))
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"host bits", poolYAML("pool-h", "10.83.0.1/16"), []string{"ippools/pool-h: spec.cidr 10.83.0.1/16 has host bits set (its network is 10.83.0.0/16)"}},
		{"overlaps etcd", poolYAML("pool-b", "10.65.128.0/17"), []string{"ippools/pool-b (10.65.128.0/17) overlaps ippools/pool-a (10.65.0.0/16, in etcd)"}},
		{"overlap in one apply", poolYAML("pool-c", "10.70.0.0/16") + "---\n" + poolYAML("pool-d", "10.70.3.0/24"), []string{"ippools/pool-c (10.70.0.0/16) overlaps ippools/pool-d (10.70.3.0/24"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := c.keys("/")
			r := c.ctl("", "apply", "-f", writeFile(t, "p.yaml", tc.text))
			if r.code != 1 || !strings.Contains(r.stderr, "nothing was written") {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
			if after := c.keys("/"); strings.Join(after, " ") != strings.Join(before, " ") {
				t.Errorf("etcd changed: %v -> %v", before, after)
			}
		})
	}
	// The same pool applied again (its own CIDR) is not an overlap.
	c.mustCtl("apply", "-f", writeFile(t, "a.yaml", poolYAML("pool-a", "10.65.0.0/16")))
}

// TestDeleteRefusesToOrphan: deleting a pool or a node that still holds blocks (or a node with
// workload endpoints) is refused, saying what would be orphaned; --force deletes; a pool or
// node holding nothing deletes as before.
func TestDeleteRefusesToOrphan(t *testing.T) {
	c := newCluster(t)
	c.loadSample() // node-a's workloads among them
	c.mustCtl("ipam", "claim", "--node", "node-b", "--pool", "pool-vxlan", "--cidr", "10.65.0.64/26")
	r := c.ctl("", "delete", "ippool", "pool-vxlan")
	if r.code != 1 || !strings.Contains(r.stderr, "ippools/pool-vxlan still holds block 10.65.0.64/26 of node-b") || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("delete pool: exit %d, stderr %q", r.code, r.stderr)
	}
	r = c.ctl("", "delete", "node", "node-a")
	if r.code != 1 || !strings.Contains(r.stderr, "nodes/node-a still holds") || !strings.Contains(r.stderr, "workload endpoints") {
		t.Fatalf("delete node: exit %d, stderr %q", r.code, r.stderr)
	}
	if len(c.keys(store.IPPoolPrefix+"pool-vxlan")) != 1 || len(c.keys(store.NodePrefix+"node-a")) != 1 {
		t.Fatal("a refused delete deleted")
	}
	c.mustCtl("delete", "ippool", "pool-vxlan", "--force")
	if len(c.keys(store.IPPoolPrefix+"pool-vxlan")) != 0 {
		t.Fatal("--force did not delete the pool")
	}
	// A pool holding nothing goes without --force.
	c.mustCtl("apply", "-f", writeFile(t, "e.yaml", poolYAML("pool-empty", "10.99.0.0/16")))
	c.mustCtl("delete", "ippool", "pool-empty")
}

// TestDeleteFromFile: delete -f deletes what the file's documents name; objects already gone
// are reported, the others still deleted; the orphan check covers every document first.
func TestDeleteFromFile(t *testing.T) {
	c := newCluster(t)
	two := poolYAML("pool-x", "10.90.0.0/16") + "---\n" + poolYAML("pool-y", "10.91.0.0/16")
	path := writeFile(t, "two.yaml", two)
	c.mustCtl("apply", "-f", path)
	if out := c.mustCtl("delete", "-f", path); !strings.Contains(out, "ippools/pool-x deleted") || !strings.Contains(out, "ippools/pool-y deleted") {
		t.Fatalf("delete -f: %q", out)
	}
	if keys := c.keys(store.IPPoolPrefix); len(keys) != 0 {
		t.Fatalf("left %v", keys)
	}
	c.mustCtl("apply", "-f", writeFile(t, "x.yaml", poolYAML("pool-x", "10.90.0.0/16")))
	r := c.ctl("", "delete", "-f", path)
	if r.code != 1 || !strings.Contains(r.stdout, "ippools/pool-x deleted") || !strings.Contains(r.stderr, "not found, so not deleted: ippools/pool-y") {
		t.Fatalf("delete -f with one gone: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A pool in the file that still holds a block: nothing in the file is deleted.
	c.mustCtl("apply", "-f", path)
	c.loadSample()
	c.mustCtl("ipam", "claim", "--node", "node-a", "--pool", "pool-vxlan", "--cidr", "10.65.0.0/26")
	mixed := writeFile(t, "mixed.yaml", poolYAML("pool-x", "10.90.0.0/16")+"---\n"+poolYAML("pool-vxlan", "10.65.0.0/16"))
	if r := c.ctl("", "delete", "-f", mixed); r.code != 1 || !strings.Contains(r.stderr, "nothing was deleted") || len(c.keys(store.IPPoolPrefix+"pool-x")) != 1 {
		t.Fatalf("delete -f with a pool in use: exit %d\n%s", r.code, r.stderr)
	}
}
