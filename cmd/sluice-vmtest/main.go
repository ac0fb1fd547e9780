// Command sluice-vmtest is sluice's kernel matrix (`make test-kernels`): it boots Debian's
// stock kernels in qemu and runs sluice's eBPF tests and the lab's smoke scenario inside each
// guest, then prints one summary row per kernel. On the host it downloads each kernel with
// apt-get download and unpacks it into a cache (never installing it), builds an initramfs
// holding itself as /init, sluice's static binaries, the bpf package's test binary, iproute2
// and the kernel's modules, and boots it under KVM where that works, TCG otherwise. Inside
// the guest (as PID 1) it mounts what a system needs, loads the modules, runs each step and
// writes a transcript on the second serial port, then powers off.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	// The guest's side, only where its plan is: the initramfs this binary built.
	_, planErr := os.Stat(guestPlan)
	if os.Getpid() == 1 && planErr == nil {
		guestInit()
		return
	}
	if len(os.Args) == 2 && os.Args[1] == "guest-run" {
		if planErr != nil || os.Getppid() != 1 {
			fmt.Fprintln(os.Stderr, "sluice-vmtest guest-run: runs only as the kernel matrix's guest, started by its /init")
			os.Exit(2)
		}
		if err := guestRun(); err != nil {
			fmt.Fprintf(os.Stderr, "sluice-vmtest guest: %v\n", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(host())
}

// options are the host's flags.
type options struct {
	kernels  []string
	flavour  string
	attach   string
	accel    string
	memoryMB int
	cpus     int
	jobs     int
	timeout  time.Duration
	bin      string
	testdata string
	bpfRun   string
	bpfSrc   string
	cgroup2  bool
	bpf      bool
	smoke    bool
	uplinks  string
	cache    string
	verbose  bool
}

func defaultCache() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "sluice-vmtest")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "sluice-vmtest-cache")
	}
	return filepath.Join(home, ".cache", "sluice-vmtest")
}

func host() int {
	var o options
	fs := flag.NewFlagSet("sluice-vmtest", flag.ExitOnError)
	kernels := fs.String("kernels", "6.1 6.12", "kernels to boot, space or comma separated: a series (6.1: the newest Debian package of it) or a package name")
	fs.StringVar(&o.flavour, "flavour", "cloud-amd64", "Debian kernel flavour")
	fs.StringVar(&o.attach, "attach", "", "SLUICE_BPF_ATTACH for the guest's runs (auto, tcx or tc); unset when empty")
	fs.StringVar(&o.accel, "accel", "auto", "accelerator: auto (KVM if it works, else TCG), kvm or tcg")
	fs.IntVar(&o.memoryMB, "memory", 3072, "guest memory in MiB")
	fs.IntVar(&o.cpus, "smp", 2, "guest CPUs")
	fs.IntVar(&o.jobs, "jobs", 0, "guests booted at once (0: one per --smp host CPUs)")
	fs.DurationVar(&o.timeout, "timeout", 16*time.Minute, "hard limit for each guest, boot to power-off")
	fs.StringVar(&o.bin, "bin", "", "directory holding sluiced, sluicectl, sluice-lab and bpf.test (default: this binary's)")
	fs.StringVar(&o.testdata, "testdata", "testdata/sample", "the sample cluster's manifests, for the smoke scenario")
	fs.StringVar(&o.bpfRun, "bpf-run", ".", "the -test.run pattern for the bpf tests in the guest")
	fs.StringVar(&o.bpfSrc, "bpf-src", "bpf", "the bpf package's directory (the tests read c/sluice.h from it)")
	fs.BoolVar(&o.cgroup2, "mount-cgroup2", false, "mount the cgroup v2 hierarchy at /sys/fs/cgroup in the guest, as a node has it")
	fs.BoolVar(&o.bpf, "bpf", true, "run the bpf package's tests in the guest")
	fs.BoolVar(&o.smoke, "smoke", true, "run `sluice-lab smoke` in the guest")
	fs.StringVar(&o.uplinks, "uplinks", "bond-vlan", "the smoke scenario's node uplinks (sluice-lab smoke --uplinks): bond-vlan puts node-a behind a bond and node-b behind a VLAN, as on bare metal (the host kernel here has neither)")
	fs.StringVar(&o.cache, "cache", defaultCache(), "where unpacked kernels and the last run's logs are kept")
	fs.BoolVar(&o.verbose, "verbose", false, "show the whole guest console, every test's output included")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: sluice-vmtest [flags]   (the kernel matrix; make test-kernels runs it)")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	o.kernels = strings.FieldsFunc(*kernels, func(r rune) bool { return r == ' ' || r == ',' })
	switch o.attach {
	case "", "auto", "tcx", "tc":
	default:
		fmt.Fprintf(os.Stderr, "sluice-vmtest: --attach %q: want auto, tcx or tc\n", o.attach)
		return 2
	}
	switch o.accel {
	case "auto", "kvm", "tcg":
	default:
		fmt.Fprintf(os.Stderr, "sluice-vmtest: --accel %q: want auto, kvm or tcg\n", o.accel)
		return 2
	}
	if len(o.kernels) == 0 || (!o.bpf && !o.smoke) {
		fmt.Fprintln(os.Stderr, "sluice-vmtest: nothing to do (no kernel, or neither --bpf nor --smoke)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, total, err := matrix(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice-vmtest: %v\n", err)
		return 1
	}
	summarize(os.Stdout, results, total)
	if ctx.Err() != nil {
		return 130
	}
	for _, r := range results {
		if r.failed() {
			return 1
		}
	}
	return 0
}

func say(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

// matrix prepares what every guest shares and each kernel in turn, then boots the guests.
func matrix(ctx context.Context, o options) ([]*kernelResult, time.Duration, error) {
	start := time.Now()
	if runtime.GOARCH != "amd64" {
		return nil, 0, fmt.Errorf("the kernel matrix boots amd64 kernels and runs this binary in them: build it for amd64 (this one is %s)", runtime.GOARCH)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, 0, err
	}
	if o.bin == "" {
		o.bin = filepath.Dir(self)
	}
	pay := payload{self: self, binaries: map[string]string{}, commands: []string{"ip", "sysctl", "bridge"}}
	need := []string{"sluiced", "sluicectl", "sluice-lab"}
	if o.bpf {
		need = append(need, "bpf.test")
	}
	for _, name := range append([]string{""}, need...) {
		p := self
		if name != "" {
			p = filepath.Join(o.bin, name)
		}
		if _, err := os.Stat(p); err != nil {
			return nil, 0, fmt.Errorf("%s is missing: run make build, and CGO_ENABLED=0 go test -c -o %s ./bpf (make test-kernels does both)", p, filepath.Join(o.bin, "bpf.test"))
		}
		if err := checkStatic(p); err != nil {
			return nil, 0, err
		}
		if name != "" {
			pay.binaries[name] = p
		}
	}
	if o.bpf {
		if _, err := os.Stat(filepath.Join(o.bpfSrc, "c")); err != nil {
			return nil, 0, fmt.Errorf("--bpf-src %s: not the bpf package's directory (no c/ in it)", o.bpfSrc)
		}
		pay.bpfSrc = o.bpfSrc
	}
	if o.smoke {
		if st, err := os.Stat(o.testdata); err != nil || !st.IsDir() {
			return nil, 0, fmt.Errorf("--testdata %s: not a directory of manifests", o.testdata)
		}
		pay.testdata, _ = filepath.Abs(o.testdata)
	}
	qemu, err := ensureQEMU(say)
	if err != nil {
		return nil, 0, err
	}
	tmp, err := os.MkdirTemp("", "sluice-vmtest-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(tmp)
	logs := filepath.Join(o.cache, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, 0, err
	}

	accel := o.accel
	var notes []string
	if accel == "auto" {
		if ok, why := kvmUsable(); ok {
			accel = "kvm"
		} else {
			accel = "tcg"
			notes = append(notes, "TCG: KVM is not usable here ("+why+")")
		}
	}
	// Fetching and packing go one kernel at a time (apt and its lists are shared); the guests
	// then boot o.jobs at a time, each with its own directory for its transcript.
	var results []*kernelResult
	var guests []*guest
	for _, series := range o.kernels {
		if ctx.Err() != nil {
			break
		}
		label := strings.TrimSuffix(strings.TrimPrefix(series, "linux-image-"), "-"+o.flavour)
		r := &kernelResult{series: series, label: label, notes: append([]string(nil), notes...)}
		results = append(results, r)
		dir := filepath.Join(tmp, fmt.Sprint(len(results)))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, 0, err
		}
		g := prepareKernel(o, r, pay, dir)
		if g == nil {
			continue
		}
		// Logs are named by the kernel's release: the same kernel listed twice (a series and
		// its package) is booted once.
		if i := slices.IndexFunc(guests, func(o *guest) bool { return o.k.release == g.k.release }); i >= 0 {
			say("Linux %s: the same kernel as %s, listed twice: booted once", r.label, guests[i].r.label)
			results = results[:len(results)-1]
			os.Remove(g.initrd)
			continue
		}
		guests = append(guests, g)
	}
	jobs := o.jobs
	if jobs <= 0 {
		// A guest's CPUs each need a host CPU: two 2-CPU guests on this 2-core machine took
		// 7 min 45 s each where one alone takes 5 min, 1 min 30 s saved in all at the risk of
		// the guest's limit.
		jobs = runtime.NumCPU() / max(1, o.cpus)
	}
	jobs = max(1, min(jobs, len(guests)))
	if len(guests) > 1 {
		say("booting %d guests, %d at a time (--jobs)", len(guests), jobs)
	}
	ac := &accelChoice{v: accel}
	sem := make(chan struct{}, jobs)
	var wg sync.WaitGroup
	// In the order given: a slot goes to the next kernel as soon as one is free.
	for _, g := range guests {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			g.r.err = "not booted: interrupted"
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			bootKernel(ctx, o, g, qemu, logs, ac)
		}()
	}
	wg.Wait()
	return results, time.Since(start), nil
}

// accelChoice is the accelerator the next guest boots under: TCG for every guest once KVM
// has failed one, and why.
type accelChoice struct {
	mu  sync.Mutex
	v   string
	why string // the KVM failure that turned it to TCG, for the reports of the guests after it
}

func (a *accelChoice) get() (accel, why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.v, a.why
}

// fallBack turns every later guest to TCG; of guests failing side by side, the first says why.
func (a *accelChoice) fallBack(why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.v = "tcg"
	if a.why == "" {
		a.why = why
	}
}

// guest is a kernel ready to boot: its initramfs packed in its own directory.
type guest struct {
	r      *kernelResult
	k      *kernel
	p      plan
	dir    string
	initrd string
}

// prepareKernel fetches one kernel and packs its initramfs in dir; on failure it fills r's
// error and returns nil.
func prepareKernel(o options, r *kernelResult, pay payload, dir string) *guest {
	start := time.Now()
	defer func() { r.total += time.Since(start) }()
	if strings.HasPrefix(r.series, "linux-image-") {
		say("Linux %s: looking up %s", r.label, r.series)
	} else {
		say("Linux %s: finding the newest %s kernel apt offers", r.label, o.flavour)
	}
	k, err := fetchKernel(o.cache, r.series, o.flavour, say)
	if err != nil {
		r.err = err.Error()
		return nil
	}
	r.kernel = k
	say("Linux %s: %s %s", r.label, k.pkg, k.version)
	cfg, err := kernelConfig(k.config)
	if err != nil {
		r.err = "extract: " + err.Error()
		return nil
	}
	for _, opt := range requiredConfig {
		if cfg[opt] != "y" {
			r.err = fmt.Sprintf("initramfs: %s is built without %s, which the guest needs", k.release, opt)
			return nil
		}
	}
	mods, builtin, err := resolveModules(k, defaultModules)
	if err != nil {
		r.err = err.Error()
		return nil
	}
	names := make([]string, len(mods))
	for i, m := range mods {
		names[i] = m.name
	}
	if len(builtin) == 0 {
		builtin = []string{"none of those asked for"}
	}
	say("Linux %s: %d modules to load (%s); built in: %s", r.label, len(mods), strings.Join(names, " "), strings.Join(builtin, " "))
	p := plan{Release: k.release, Verbose: o.verbose, Cgroup2: o.cgroup2}
	if o.attach != "" {
		p.Env = append(p.Env, "SLUICE_BPF_ATTACH="+o.attach)
	}
	// Each step's own limit leaves the guest time to report it before the host's limit.
	stepLimit := o.timeout - min(time.Minute, o.timeout/4)
	testLimit := stepLimit - min(30*time.Second, stepLimit/10) // go test's own, to print where it hung
	// The smoke scenario first: it uses the guest's first half minute, which the bpf tests that
	// age entries by a timeout on the monotonic clock (10 s) would otherwise wait out.
	if o.smoke {
		p.Steps = append(p.Steps, step{Name: "smoke", Dir: "/sluice", Timeout: stepLimit.String(),
			Args: []string{guestBin + "/sluice-lab", "smoke", "--testdata", guestTestdata + "/" + filepath.Base(pay.testdata), "--uplinks", o.uplinks}})
	}
	if o.bpf {
		p.Steps = append(p.Steps, step{Name: "bpf", Dir: guestSrc + "/bpf", Timeout: stepLimit.String(), NotBefore: 15,
			Args: []string{guestBin + "/bpf.test", "-test.v", "-test.count=1", "-test.run", o.bpfRun,
				"-test.timeout", testLimit.String()}})
	}
	initrd := filepath.Join(dir, k.release+".cpio")
	t0 := time.Now()
	if err := buildInitramfs(initrd, k, mods, pay, p); err != nil {
		r.err = err.Error()
		return nil
	}
	st, _ := os.Stat(initrd)
	say("Linux %s: initramfs %d MiB in %.1fs", r.label, st.Size()>>20, time.Since(t0).Seconds())
	return &guest{r: r, k: k, p: p, dir: dir, initrd: initrd}
}

// bootKernel boots a prepared kernel, fills its result from the guest's transcript and
// removes its initramfs.
func bootKernel(ctx context.Context, o options, g *guest, qemu, logs string, ac *accelChoice) {
	r, k, p := g.r, g.k, g.p
	start := time.Now()
	defer func() { r.total += time.Since(start) }()
	defer os.Remove(g.initrd)
	accel, why := ac.get()
	if why != "" {
		r.notes = append(r.notes, "TCG: "+why)
	}

	consolePath := filepath.Join(logs, k.release+".console.log")
	console, err := os.Create(consolePath)
	if err != nil {
		r.err = "boot: " + err.Error()
		return
	}
	defer console.Close()
	opts := bootOptions{qemu: qemu, memoryMB: o.memoryMB, cpus: o.cpus, timeout: o.timeout, verbose: o.verbose, log: console,
		show: func(line string) { fmt.Printf("  [%s] %s\n", r.label, line) }}
	say("Linux %s: booting under %s (%d MiB, %d CPUs, limit %v)", r.label, strings.ToUpper(accel), o.memoryMB, o.cpus, o.timeout)
	b := runGuest(ctx, opts, k, g.initrd, g.dir, accel)
	// Any KVM guest that did not reach init (qemu aborted or exited, or the guest hung) boots
	// again under TCG, and every guest after it boots under TCG at once.
	if b.kvmError != "" && o.accel == "auto" {
		r.notes = append(r.notes, "TCG: "+b.kvmError)
		say("Linux %s: %s; falling back to TCG for it and the guests after it", r.label, b.kvmError)
		fmt.Fprintf(console, "\n--- %s; falling back to TCG ---\n\n", b.kvmError)
		accel = "tcg"
		ac.fallBack(fmt.Sprintf("KVM failed Linux %s's guest: %s", r.label, b.kvmError))
		b = runGuest(ctx, opts, k, g.initrd, g.dir, accel)
	}
	r.accel, r.boot, r.guestUp = b.accel, b.boot, b.guestUp
	if b.poweroffHung {
		r.notes = append(r.notes, fmt.Sprintf("the guest did not power off within %v of finishing; qemu was stopped", poweroffLimit))
	}
	r.err = b.err
	for _, e := range b.events {
		if e.T == "module" && e.Err != "" {
			r.modules = append(r.modules, e.Module+": "+e.Err)
		}
	}
	steps := stepsOf(b.events)
	r.logs = append(r.logs, consolePath)
	for _, s := range p.Steps {
		so := steps[s.Name]
		if so == nil || !so.begun {
			continue
		}
		path := filepath.Join(logs, k.release+"."+s.Name+".log")
		if err := os.WriteFile(path, []byte(strings.Join(so.lines, "\n")+"\n"), 0o644); err == nil {
			r.logs = append(r.logs, path)
		}
		switch s.Name {
		case "bpf":
			r.bpf = parseGoTest(so.lines, so.ended, so.rc, so.err)
		case "smoke":
			r.smoke = parseSmoke(so.lines, so.ended, so.rc, so.err)
		}
	}
	if r.err == "" && b.done {
		if o.bpf && r.bpf == nil {
			r.err = "the bpf step never started in the guest"
		}
		if o.smoke && r.smoke == nil {
			r.err = "the smoke step never started in the guest"
		}
	}
	say("Linux %s: %s", r.label, oneResult(r))
}

// oneResult is a kernel's outcome on one line, for the progress output.
func oneResult(r *kernelResult) string {
	var parts []string
	if r.boot > 0 {
		parts = append(parts, fmt.Sprintf("init after %.1fs (guest uptime %.1fs)", r.boot.Seconds(), r.guestUp))
	}
	if r.bpf != nil {
		parts = append(parts, fmt.Sprintf("bpf %d passed, %d failed, %d skipped", r.bpf.count("pass"), r.bpf.count("fail"), r.bpf.count("skip")))
	}
	if r.smoke != nil {
		parts = append(parts, fmt.Sprintf("smoke %d passed, %d failed", r.smoke.passed, r.smoke.failed))
	}
	if r.err != "" {
		parts = append(parts, r.err)
	}
	return strings.Join(parts, "; ")
}
