package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnitVerifies runs `systemd-analyze verify` on the unit with ExecStart pointing
// at a freshly built sluiced, and checks the settings the agent relies on.
func TestSystemdUnitVerifies(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (8 s): make test runs it")
	}
	unit, err := os.ReadFile("../../deploy/systemd/sluiced.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "WatchdogSec=", "Restart=on-failure", "CapabilityBoundingSet=CAP_NET_ADMIN CAP_BPF CAP_PERFMON CAP_SYS_ADMIN",
		"ProtectSystem=strict", "NoNewPrivileges=yes", "KillSignal=SIGTERM", "SystemCallFilter=@system-service bpf @mount", "-/sys/fs/bpf", "LimitMEMLOCK=infinity"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit lacks %s", want)
		}
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (CI installs it)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sluiced")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "sluiced.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/sluiced", bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	// Lines about other units on this machine are not ours to judge.
	var ours []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "sluiced.service") {
			ours = append(ours, line)
		}
	}
	if err != nil || len(ours) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, strings.Join(ours, "\n"))
	}
}
