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

// TestDemo runs the whole lab as `make demo` does, with freshly built binaries, and expects
// every check to pass. It needs root (network namespaces), which CI has.
func TestDemo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the lab builds network namespaces: needs root")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../sluicectl", "../sluiced", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	var out bytes.Buffer
	l := &lab{bin: bin, testdata: "../../testdata/sample", out: &out, agents: map[string]*proc{}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := l.demo(ctx, false)
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
}

// TestFaults runs the fault suite as `make faults` does, with freshly built binaries, and
// expects every check to pass.
func TestFaults(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := l.faults(ctx)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if l.failures != 0 || strings.Contains(out.String(), "FAIL:") {
		t.Fatalf("%d of %d checks failed", l.failures, l.checks)
	}
	if !strings.Contains(out.String(), "fault: kernel state damaged by hand") {
		t.Fatal("the suite did not reach its last case")
	}
	if left, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(left), "sl-") {
		t.Fatalf("namespaces left behind:\n%s", left)
	}
}
