package main

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/cli/*.txt from the current output")

// golden compares out with testdata/cli/name (-update rewrites it).
func golden(t *testing.T, name, out string) {
	t.Helper()
	path := filepath.Join("..", "..", "testdata", "cli", name)
	if *update {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./cmd/sluicectl -run Golden -update writes it)", err)
	}
	if string(want) != out {
		t.Fatalf("%s differs (go test ./cmd/sluicectl -run Golden -update rewrites it):\n--- got\n%s\n--- want\n%s", name, out, want)
	}
}

// TestHelpGolden: sluicectl's usage and ipam's, as text an operator reads.
func TestHelpGolden(t *testing.T) {
	c := newCluster(t)
	c.env["SLUICE_ETCD_ENDPOINTS"] = "http://127.0.0.1:1" // never asked
	r := c.ctl("", "help")
	if r.code != 0 {
		t.Fatalf("help: exit %d %s", r.code, r.stderr)
	}
	golden(t, "sluicectl-help.txt", r.stdout)
	r = c.ctl("", "ipam", "--help")
	if r.code != 0 {
		t.Fatalf("ipam --help: exit %d %s", r.code, r.stderr)
	}
	golden(t, "sluicectl-ipam-help.txt", r.stdout)
}
