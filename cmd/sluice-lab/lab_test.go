package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// runLab builds the binaries afresh, runs one of the lab's programs and expects every check
// to pass and no namespace to be left. It needs root (network namespaces), which CI has.
func runLab(t *testing.T, run func(l *lab, ctx context.Context) error) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the lab builds network namespaces: needs root")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../sluicectl", "../sluiced", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	var out bytes.Buffer
	l := &lab{bin: bin, testdata: "../../testdata/sample", out: &out, agents: map[string]*proc{}, outage: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	err := run(l, ctx)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if l.failures != 0 || strings.Contains(out.String(), "FAIL:") {
		t.Fatalf("%d of %d checks failed", l.failures, l.checks)
	}
	if l.checks < 40 {
		t.Fatalf("only %d checks ran", l.checks)
	}
	if left, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(left), "sl-") {
		t.Fatalf("namespaces left behind:\n%s", left)
	}
	return out.String()
}

// TestDemo runs the whole lab as `make demo` does.
func TestDemo(t *testing.T) {
	runLab(t, func(l *lab, ctx context.Context) error { return l.demo(ctx, false) })
}

// TestDemoClassicTC runs the whole lab with every agent attaching its programs as classic tc
// filters (bpf-attach tc, the path of kernels before 6.6): every check passes on that path too.
func TestDemoClassicTC(t *testing.T) {
	t.Setenv("SLUICE_BPF_ATTACH", "tc")
	out := runLab(t, func(l *lab, ctx context.Context) error { return l.demo(ctx, false) })
	if n := strings.Count(out, "service stage started attach=tc"); n < 3 || strings.Contains(out, "attach=tcx") {
		t.Fatalf("%d agents said they attach through classic tc; want every one, none through TCX", n)
	}
}

// TestSmoke runs the kernel matrix's scenario (`sluice-lab smoke`) on this machine's kernel.
func TestSmoke(t *testing.T) {
	runLab(t, func(l *lab, ctx context.Context) error { return l.smoke(ctx) })
}

// TestFaults runs the fault suite as `make faults` does, to its last case.
func TestFaults(t *testing.T) {
	out := runLab(t, func(l *lab, ctx context.Context) error { return l.faults(ctx) })
	if !strings.Contains(out, "fault: no cgroup v2 hierarchy visible to the agent") {
		t.Fatal("the suite did not reach its last case")
	}
}
