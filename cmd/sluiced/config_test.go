package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md and testdata/cli/sluiced-help.txt")

func TestConfigPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sluiced.yaml")
	if err := os.WriteFile(file, []byte("nodeName: file-node\nlogLevel: warn\nvxlanVNI: 5000\netcdEndpoints: [http://192.0.2.1:2379, http://192.0.2.2:2379]\ncleanConflicts: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := envOf(map[string]string{"SLUICE_CONFIG": file, "SLUICE_NODE_NAME": "env-node", "SLUICE_VXLAN_VNI": "6000"})
	c, err := agentconfig.Parse([]string{"--vxlan-vni", "7000"}, env, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "env-node" || c.LogLevel != "warn" || c.DP.VXLAN.VNI != 7000 || !c.DP.CleanConflicts ||
		strings.Join(c.Etcd.Endpoints, ",") != "http://192.0.2.1:2379,http://192.0.2.2:2379" {
		t.Fatalf("flags > env > file > defaults broken: %+v", *c)
	}
	c, err = agentconfig.Parse(nil, env, &bytes.Buffer{})
	if err != nil || c.DP.VXLAN.VNI != 6000 {
		t.Fatalf("env over file: %v %d", err, c.DP.VXLAN.VNI)
	}
	c, err = agentconfig.Parse([]string{"--config", file, "--clean-conflicts=false", "--pool-blackholes"}, envOf(nil), &bytes.Buffer{})
	if err != nil || c.DP.VXLAN.VNI != 5000 || c.DP.CleanConflicts || !c.Calc.PoolBlackholes {
		t.Fatalf("file, bare and explicit boolean flags: %v %+v", err, c)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("vxlanPort: 70000\n"), 0o644)
	if _, err := agentconfig.Parse([]string{"--config", bad}, envOf(nil), &bytes.Buffer{}); err == nil ||
		!strings.Contains(err.Error(), "option vxlan-port (from file "+bad+" key vxlanPort)") || !strings.Contains(err.Error(), "1 to 65535") {
		t.Fatalf("bad file value: %v", err)
	}
	os.WriteFile(bad, []byte("vxlanPorts: 4789\n"), 0o644)
	if _, err := agentconfig.Parse([]string{"--config", bad}, envOf(nil), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `unknown key "vxlanPorts"`) {
		t.Fatalf("unknown file key: %v", err)
	}
}

// TestConfigurationDoc: docs/configuration.md is what the option table says (-update rewrites
// it); --help says the same in 80 columns (TestHelpReadsIn80Columns).
func TestConfigurationDoc(t *testing.T) {
	var b bytes.Buffer
	agentconfig.Doc(&b)
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
	flags, envs := agentconfig.OptionNames()
	for i := range flags {
		if !strings.Contains(string(got), "`--"+flags[i]+"`") || !strings.Contains(string(got), "`"+envs[i]+"`") {
			t.Fatalf("option %s missing from the docs", flags[i])
		}
	}
}

// TestConfigEmptyEnvironmentBlanks: a variable set but empty counts, as an empty flag does:
// SLUICE_HEALTH_LISTEN= turns the endpoint off although the file sets it; an unset one leaves
// the file's value; an empty one an option cannot take is an error naming it.
func TestConfigEmptyEnvironmentBlanks(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sluiced.yaml")
	if err := os.WriteFile(file, []byte("healthListen: 127.0.0.1:9555\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lookup := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	c, err := agentconfig.ParseEnv(nil, lookup(map[string]string{"SLUICE_CONFIG": file, "SLUICE_HEALTH_LISTEN": ""}), &bytes.Buffer{})
	if err != nil || c.HealthListen != "" {
		t.Fatalf("empty SLUICE_HEALTH_LISTEN: %v, health-listen %q, want it off", err, c.HealthListen)
	}
	c, err = agentconfig.ParseEnv(nil, lookup(map[string]string{"SLUICE_CONFIG": file}), &bytes.Buffer{})
	if err != nil || c.HealthListen != "127.0.0.1:9555" {
		t.Fatalf("unset SLUICE_HEALTH_LISTEN: %v, health-listen %q, want the file's", err, c.HealthListen)
	}
	if _, err := agentconfig.ParseEnv(nil, lookup(map[string]string{"SLUICE_CONFIG": file, "SLUICE_VXLAN_VNI": ""}), &bytes.Buffer{}); err == nil ||
		!strings.Contains(err.Error(), "option vxlan-vni (from environment SLUICE_VXLAN_VNI)") {
		t.Fatalf("empty SLUICE_VXLAN_VNI: %v", err)
	}
}

// TestHelpReadsIn80Columns: --help lists every option in 80 columns; a mistyped flag is one
// short error pointing at --help, not buried under the help.
func TestHelpReadsIn80Columns(t *testing.T) {
	var out bytes.Buffer
	if _, err := agentconfig.Parse([]string{"--help"}, envOf(nil), &out); err != flag.ErrHelp {
		t.Fatalf("--help: %v", err)
	}
	for i, l := range strings.Split(out.String(), "\n") {
		if len(l) > 80 {
			t.Errorf("line %d is %d columns: %q", i+1, len(l), l)
		}
	}
	path := "../../testdata/cli/sluiced-help.txt"
	if *update {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if want, err := os.ReadFile(path); err != nil || string(want) != out.String() {
		t.Errorf("sluiced --help differs from %s (go test ./cmd/sluiced -run HelpReads -update rewrites it): %v\n%s", path, err, out.String())
	}
	flags, envs := agentconfig.OptionNames()
	for i := range flags {
		if !strings.Contains(out.String(), "--"+flags[i]) || !strings.Contains(out.String(), envs[i]) {
			t.Errorf("--help lacks --%s or %s", flags[i], envs[i])
		}
	}
	out.Reset()
	_, err := agentconfig.Parse([]string{"--etcd-endpoint", "x"}, envOf(nil), &out)
	if err == nil || !strings.Contains(err.Error(), "-etcd-endpoint") || !strings.Contains(err.Error(), "sluiced --help") || out.Len() != 0 {
		t.Fatalf("mistyped flag: %v, printed %q", err, out.String())
	}
}
