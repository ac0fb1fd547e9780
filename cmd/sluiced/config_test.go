package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md")

func TestConfigPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sluiced.yaml")
	if err := os.WriteFile(file, []byte("nodeName: file-node\nlogLevel: warn\nvxlanVNI: 5000\netcdEndpoints: [http://192.0.2.1:2379, http://192.0.2.2:2379]\ncleanConflicts: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := envOf(map[string]string{"SLUICE_CONFIG": file, "SLUICE_NODE_NAME": "env-node", "SLUICE_VXLAN_VNI": "6000"})
	c, err := parseFlags([]string{"--vxlan-vni", "7000"}, env, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.nodeName != "env-node" || c.logLevel != "warn" || c.dp.VXLAN.VNI != 7000 || !c.dp.CleanConflicts ||
		strings.Join(c.etcd.Endpoints, ",") != "http://192.0.2.1:2379,http://192.0.2.2:2379" {
		t.Fatalf("flags > env > file > defaults broken: %+v", *c)
	}
	c, err = parseFlags(nil, env, &bytes.Buffer{})
	if err != nil || c.dp.VXLAN.VNI != 6000 {
		t.Fatalf("env over file: %v %d", err, c.dp.VXLAN.VNI)
	}
	c, err = parseFlags([]string{"--config", file, "--clean-conflicts=false", "--pool-blackholes"}, envOf(nil), &bytes.Buffer{})
	if err != nil || c.dp.VXLAN.VNI != 5000 || c.dp.CleanConflicts || !c.calc.PoolBlackholes {
		t.Fatalf("file, bare and explicit boolean flags: %v %+v", err, c)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("vxlanPort: 70000\n"), 0o644)
	if _, err := parseFlags([]string{"--config", bad}, envOf(nil), &bytes.Buffer{}); err == nil ||
		!strings.Contains(err.Error(), "option vxlan-port (from file "+bad+" key vxlanPort)") || !strings.Contains(err.Error(), "1 to 65535") {
		t.Fatalf("bad file value: %v", err)
	}
	os.WriteFile(bad, []byte("vxlanPorts: 4789\n"), 0o644)
	if _, err := parseFlags([]string{"--config", bad}, envOf(nil), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `unknown key "vxlanPorts"`) {
		t.Fatalf("unknown file key: %v", err)
	}
}

// TestConfigurationDoc: docs/configuration.md is what the option table says (-update rewrites
// it), and --help prints the same table.
func TestConfigurationDoc(t *testing.T) {
	var b bytes.Buffer
	configurationDoc(&b)
	path := "../../docs/configuration.md"
	if *update {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, b.Bytes()) {
		t.Fatalf("docs/configuration.md is stale (go test ./cmd/sluiced -run ConfigurationDoc -update): %v", err)
	}
	var help bytes.Buffer
	parseFlags([]string{"--help"}, envOf(nil), &help)
	var table bytes.Buffer
	writeOptionTable(&table)
	if !strings.Contains(help.String(), table.String()) {
		t.Fatal("--help does not print the option table")
	}
	for _, o := range optionTable() {
		if !strings.Contains(string(got), "`--"+o.name+"`") || !strings.Contains(string(got), "`"+o.env+"`") {
			t.Fatalf("option %s missing from the docs", o.name)
		}
	}
}
