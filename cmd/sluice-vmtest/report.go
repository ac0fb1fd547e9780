package main

import (
	"fmt"
	"io"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"
)

// stepOutput is one guest step as the transcript tells it.
type stepOutput struct {
	name  string
	begun bool
	ended bool
	rc    int
	secs  float64
	err   string
	lines []string
}

// stepsOf groups the transcript's lines by step.
func stepsOf(events []guestEvent) map[string]*stepOutput {
	steps := map[string]*stepOutput{}
	get := func(name string) *stepOutput {
		if steps[name] == nil {
			steps[name] = &stepOutput{name: name}
		}
		return steps[name]
	}
	for _, e := range events {
		switch e.T {
		case "begin":
			get(e.Step).begun = true
		case "line":
			s := get(e.Step)
			s.lines = append(s.lines, e.Text)
		case "end":
			s := get(e.Step)
			s.ended, s.rc, s.secs, s.err = true, e.RC, e.Secs, e.Err
		}
	}
	return steps
}

// goTest is one top-level test of a `go test -v` run.
type goTest struct {
	name   string
	result string // "pass", "fail", "skip"; "fail" too when the binary died inside it
	output []string
}

// goTestRun is a test binary's run: its tests in order, and how the binary ended.
type goTestRun struct {
	tests []*goTest
	// died says the binary ended without a verdict for the test it was in (panic, timeout,
	// killed), or failed with no test failing.
	died string
}

func (r *goTestRun) count(result string) int {
	n := 0
	for _, t := range r.tests {
		if t.result == result {
			n++
		}
	}
	return n
}

var (
	goTestEvent   = regexp.MustCompile(`^=== (RUN|CONT|NAME|PAUSE)\s+(\S+)`)
	goTestVerdict = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): (\S+)`)
)

// parseGoTest reads `go test -v` output. Output lines belong to the top-level test last named
// by an "=== RUN/CONT/NAME" line (subtests' lines go to their parent); only top-level verdicts
// (at the start of the line) count. A test begun without a verdict failed: the binary died in
// it, and rc, err say how.
func parseGoTest(lines []string, ended bool, rc int, err string) *goTestRun {
	run := &goTestRun{}
	byName := map[string]*goTest{}
	var cur *goTest
	top := func(name string) string { return strings.SplitN(name, "/", 2)[0] }
	for _, line := range lines {
		if m := goTestEvent.FindStringSubmatch(line); m != nil {
			name := top(m[2])
			t := byName[name]
			if t == nil {
				t = &goTest{name: name}
				byName[name] = t
				run.tests = append(run.tests, t)
			}
			cur = t
			continue
		}
		if m := goTestVerdict.FindStringSubmatch(line); m != nil && !strings.Contains(m[2], "/") {
			t := byName[m[2]]
			if t == nil {
				t = &goTest{name: m[2]}
				byName[m[2]] = t
				run.tests = append(run.tests, t)
			}
			t.result = strings.ToLower(m[1])
			continue
		}
		if cur != nil {
			cur.output = append(cur.output, line)
		}
	}
	how := fmt.Sprintf("the test binary exited with %d: %s", rc, err)
	if !ended {
		how = "the guest ended before the test binary did"
	}
	for _, t := range run.tests {
		if t.result == "" {
			t.result = "fail"
			t.output = append(t.output, "no verdict: "+how)
			run.died = how + " (in " + t.name + ")"
		}
	}
	if run.died == "" && (!ended || (rc != 0 && run.count("fail") == 0)) {
		run.died = how
	}
	return run
}

// smokeRun is the lab's smoke scenario as its output tells it.
type smokeRun struct {
	passed, failed int
	failures       []string
	died           string   // why it stopped early, or never finished
	agentErrors    []string // the agents' own error lines (why sluiced exited), distinct
}

// agentError matches an agent's error line as the lab echoes it:
// "  [sluiced node-a] 01:48:06.195 ERR exiting error=...".
var agentError = regexp.MustCompile(`^\s*\[(sluiced [^\]]+)\] \S+ (ERR|FTL|PNC) (.*)$`)

func parseSmoke(lines []string, ended bool, rc int, err string) *smokeRun {
	r := &smokeRun{}
	var last string
	seen := map[string]bool{}
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "PASS: "):
			r.passed++
		case strings.HasPrefix(line, "FAIL: "):
			r.failed++
			r.failures = append(r.failures, strings.TrimPrefix(line, "FAIL: "))
		case strings.HasPrefix(line, "sluice-lab smoke: "):
			last = strings.TrimPrefix(line, "sluice-lab smoke: ")
		default:
			// The same error from every agent is shown once, with the first agent's name.
			if m := agentError.FindStringSubmatch(line); m != nil && len(r.agentErrors) < 6 {
				msg := strings.ReplaceAll(m[3], strings.TrimPrefix(m[1], "sluiced "), "NODE")
				if !seen[msg] {
					seen[msg] = true
					r.agentErrors = append(r.agentErrors, m[1]+": "+m[2]+" "+m[3])
				}
			}
		}
	}
	switch {
	case !ended:
		r.died = "the guest ended before the smoke scenario did"
	case rc != 0 && last != "" && !strings.HasPrefix(last, fmt.Sprintf("%d of ", r.failed)):
		r.died = last // not only "N of M checks failed": it stopped early
	case rc != 0 && r.failed == 0:
		r.died = fmt.Sprintf("exited with %d: %s", rc, err)
	}
	return r
}

// kernelResult is one row of the summary.
type kernelResult struct {
	series  string // as asked: a series ("6.1") or a package name
	label   string // the series, or the package's version part ("6.1.0-47")
	kernel  *kernel
	accel   string
	boot    time.Duration
	guestUp float64
	total   time.Duration
	err     string // a step of the harness that failed: download, extract, initramfs, boot, timeout
	modules []string
	bpf     *goTestRun
	smoke   *smokeRun
	logs    []string
	notes   []string
}

func (r *kernelResult) failed() bool {
	if r.err != "" || len(r.modules) > 0 {
		return true
	}
	if r.bpf != nil && (r.bpf.count("fail") > 0 || r.bpf.died != "") {
		return true
	}
	return r.smoke != nil && (r.smoke.failed > 0 || r.smoke.died != "")
}

func (r *kernelResult) name() string {
	if r.kernel != nil {
		return r.kernel.release
	}
	return "Linux " + r.label
}

// summarize prints the table and, under it, what failed on each kernel.
func summarize(w io.Writer, results []*kernelResult, total time.Duration) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "kernel\taccel\tboot\tbpf pass/fail/skip\tsmoke pass/fail\ttime\tresult")
	for _, r := range results {
		boot, bpf, smoke, took := "-", "-", "-", "-"
		if r.boot > 0 {
			boot = fmt.Sprintf("%.1fs", r.boot.Seconds())
		}
		if r.bpf != nil {
			bpf = fmt.Sprintf("%d/%d/%d", r.bpf.count("pass"), r.bpf.count("fail"), r.bpf.count("skip"))
			if r.bpf.died != "" {
				bpf += " (died)"
			}
		}
		if r.smoke != nil {
			smoke = fmt.Sprintf("%d/%d", r.smoke.passed, r.smoke.failed)
			if r.smoke.died != "" {
				smoke += " (died)"
			}
		}
		if r.total > 0 {
			took = r.total.Round(time.Second).String()
		}
		verdict := "PASS"
		if r.failed() {
			verdict = "FAIL"
		}
		accel := r.accel
		if accel == "" {
			accel = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.name(), accel, boot, bpf, smoke, took, verdict)
	}
	tw.Flush()
	fmt.Fprintf(w, "total %v\n", total.Round(time.Second))
	for _, r := range results {
		if !r.failed() && len(r.notes) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", r.name())
		for _, n := range r.notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
		if r.err != "" {
			fmt.Fprintf(w, "  %s\n", r.err)
		}
		for _, m := range r.modules {
			fmt.Fprintf(w, "  module %s\n", m)
		}
		if r.bpf != nil {
			for _, t := range r.bpf.tests {
				if t.result == "fail" {
					fmt.Fprintf(w, "  bpf FAIL %s\n", t.name)
					for _, l := range keyLines(t.output, 8) {
						fmt.Fprintf(w, "      %s\n", l)
					}
				}
			}
			if r.bpf.died != "" {
				fmt.Fprintf(w, "  bpf: %s\n", r.bpf.died)
			}
			if n := r.bpf.count("skip"); n > 0 {
				fmt.Fprintf(w, "  bpf skipped %d: %s\n", n, skipReasons(r.bpf))
			}
		}
		if r.smoke != nil {
			for _, f := range r.smoke.failures {
				fmt.Fprintf(w, "  smoke FAIL: %s\n", clip(f, 300))
			}
			if r.smoke.died != "" {
				fmt.Fprintf(w, "  smoke: %s\n", clip(r.smoke.died, 400))
			}
			if r.smoke.failed > 0 || r.smoke.died != "" {
				for _, e := range r.smoke.agentErrors {
					fmt.Fprintf(w, "  smoke, %s\n", clip(e, 400))
				}
			}
		}
		for _, l := range r.logs {
			fmt.Fprintf(w, "  log: %s\n", l)
		}
	}
}

// keyLines picks a failed test's telling lines: those a t.Error/t.Fatal wrote (file.go:N:),
// panics and errors, else its last lines; at most n, each clipped.
func keyLines(output []string, n int) []string {
	var key []string
	seen := map[string]bool{}
	for _, l := range output {
		t := strings.TrimSpace(l)
		if seen[t] {
			continue // the same failure in several subtests, once
		}
		seen[t] = true
		if strings.Contains(t, "_test.go:") || strings.HasPrefix(t, "panic:") || strings.HasPrefix(t, "no verdict:") ||
			strings.Contains(t, "error") || strings.Contains(t, "invalid") {
			key = append(key, clip(t, 400))
		}
		if len(key) == n {
			break
		}
	}
	if len(key) == 0 {
		start := max(0, len(output)-n)
		for _, l := range output[start:] {
			key = append(key, clip(strings.TrimSpace(l), 400))
		}
	}
	return key
}

// skipReasons groups the skipped tests by the reason they gave.
func skipReasons(r *goTestRun) string {
	reasons := map[string][]string{}
	var order []string
	for _, t := range r.tests {
		if t.result != "skip" {
			continue
		}
		why := "no reason given"
		for _, l := range t.output {
			if l = strings.TrimSpace(l); strings.Contains(l, "_test.go:") {
				if _, after, ok := strings.Cut(l, ": "); ok {
					why = after
				}
			}
		}
		if reasons[why] == nil {
			order = append(order, why)
		}
		reasons[why] = append(reasons[why], t.name)
	}
	var parts []string
	for _, why := range order {
		parts = append(parts, fmt.Sprintf("%d (%s): %s", len(reasons[why]), clip(why, 160), strings.Join(reasons[why], " ")))
	}
	return strings.Join(parts, "; ")
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("... (%d bytes more)", len(s)-n)
}
