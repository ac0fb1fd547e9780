package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/internal/nstest"
)

// runLab builds the binaries afresh, runs one of the lab's programs and expects every check
// to pass and no namespace to be left. It needs root (network namespaces), which CI has.
func runLab(t *testing.T, run func(l *lab, ctx context.Context) error) string {
	t.Helper()
	var out bytes.Buffer
	l := newTestLab(t, &out)
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

// newTestLab builds the binaries afresh and returns a lab that writes to out. It needs root
// (network namespaces), which CI has.
func newTestLab(t *testing.T, out io.Writer) *lab {
	t.Helper()
	nstest.NeedRoot(t, "the lab (it builds network namespaces)")
	if testing.Short() {
		t.Skip("the lab takes minutes: make test runs it")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../sluicectl", "../sluiced", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	return &lab{bin: bin, testdata: "../../testdata/sample", out: out, agents: map[string]*proc{}, outage: 10 * time.Second}
}

// TestDemoInterrupted interrupts the demo as Ctrl-C does, once while it sets the lab up and
// once during its checks: the lab's context ends with SIGINT as its cause the moment a line
// is printed, and every process of the lab has SIGINT too (the terminal sends it to the whole
// process group). No check may run after it, the run must end with the signal as its error,
// and nothing of the lab may be left: namespaces, processes, mounts, its directory.
func TestDemoInterrupted(t *testing.T) {
	for _, c := range []struct{ name, at string }{
		{"setup", "$ sluicectl apply -f"},                                  // etcd up, no agent yet
		{"checks", "==> traffic between workloads on every pair of nodes"}, // agents and servers up
	} {
		t.Run(c.name, func(t *testing.T) {
			out := &cutOutput{at: c.at}
			l := newTestLab(t, out)
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			out.cut = func() {
				cancel(interrupted{syscall.SIGINT})
				for _, p := range l.procs {
					_ = p.cmd.Process.Signal(syscall.SIGINT)
				}
			}
			err := l.demo(ctx, false)
			t.Log(out.String())
			if sig := (interrupted{}); !errors.As(err, &sig) || sig.sig != syscall.SIGINT {
				t.Fatalf("the run ended with %v; want the interruption by SIGINT", err)
			}
			after, ok := out.after()
			if !ok {
				t.Fatalf("%q never printed", c.at)
			}
			if strings.Contains(after, "PASS:") || strings.Contains(after, "FAIL:") {
				t.Errorf("checks ran after the signal:\n%s", after)
			}
			if !strings.Contains(after, "interrupted by SIGINT") {
				t.Errorf("the run did not say it was interrupted:\n%s", after)
			}
			if len(l.procs) == 0 {
				t.Fatal("the lab had started no process: the interruption came too early to test their end")
			}
			for _, p := range l.procs {
				select {
				case <-p.done:
				default:
					t.Errorf("still running: %v", p.cmd.Args)
				}
			}
			if left := labProcesses(l.bin); len(left) > 0 {
				t.Errorf("processes of the lab left: %q", left)
			}
			if left, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(left), "sl-") {
				t.Errorf("namespaces left behind:\n%s", left)
			}
			if mounts, _ := os.ReadFile("/proc/self/mounts"); l.dir != "" && strings.Contains(string(mounts), l.dir) {
				t.Errorf("mounts of the lab left:\n%s", mounts)
			}
			if _, err := os.Stat(l.dir); l.dir == "" || !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the lab's directory %q: %v; want it made and removed", l.dir, err)
			}
		})
	}
}

// cutOutput is a lab's output that calls cut (once) as it is given a line holding at, and
// keeps what was printed from then on apart.
type cutOutput struct {
	at   string
	cut  func()
	mu   sync.Mutex
	buf  bytes.Buffer
	seen bool // the line holding at came,
	from int  // starting there in buf
}

func (o *cutOutput) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.seen && strings.Contains(string(b), o.at) {
		o.seen, o.from = true, o.buf.Len()
		defer o.cut() // after the line is in buf; still on the writer's goroutine
	}
	return o.buf.Write(b)
}

func (o *cutOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// after is what was printed from the line holding at on, and whether it came.
func (o *cutOutput) after() (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.seen {
		return "", false
	}
	return o.buf.String()[o.from:], true
}

// labProcesses lists the command lines of the processes running a binary from bin.
func labProcesses(bin string) []string {
	var out []string
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), bin+"/") {
			continue
		}
		out = append(out, strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " "))
	}
	return out
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
