package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the whole lab as `make demo` does, with freshly built binaries, and expects
// every check to pass.
func TestDemo(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../sluicectl", "../sluiced")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	var out bytes.Buffer
	l := &lab{bin: bin, testdata: "../../testdata/sample", out: &out}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := l.demo(ctx, false)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if l.failures != 0 || strings.Contains(out.String(), "FAIL:") {
		t.Fatalf("%d checks failed", l.failures)
	}
	if n := strings.Count(out.String(), "PASS:"); n < 30 {
		t.Fatalf("only %d checks ran", n)
	}
}
