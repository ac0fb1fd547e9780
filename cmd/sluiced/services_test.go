package main

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/bpf/healthcheck"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/cmd/internal/agent"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/sluice-net/sluice/store"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
)

// TestServiceStageContained: the service stage cannot start (its program load fails, through
// the test hook), then can. While it cannot, it is reported everywhere the agent reports (the
// stage's status, sluice_services_ready with the step, /readyz's reason, the status key, the
// proxy health port's 503) and tried again; once the cause is gone it starts by itself, is
// handed calc's whole desired state computed before it started, programs its maps, attaches
// its programs, and everything says ready. The stage runs in a network namespace of its own
// (a goroutine locked to it); calc is fed by a real intake from etcd holding the sample
// cluster.
func TestServiceStageContained(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	nstest.NeedRoot(t, "the service stage (network namespaces, bpffs, eBPF programs)")
	_, cli, _ := loadedEtcd(t)
	graph, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	state := newAgentState()
	state.nodeName = "node-a"
	plan := &agent.Planner{Graph: graph, Log: zerolog.Nop(), Problems: &state.problems, SelfMissing: &state.selfMissing, FromCalc: &state.fromCalc}
	intake, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: store.Fanout{plan, state}, Prefixes: store.NodePrefixes("node-a")})
	if err != nil {
		t.Fatal(err)
	}
	state.intake = intake
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	intakeDone := make(chan struct{})
	go func() { defer close(intakeDone); _ = intake.Run(ctx) }()
	defer func() { cancel(); <-intakeDone }()
	// calc's first update is handed over before the stage exists: the stage must get it later.
	waitUntil(t, "calc's first update", 10*time.Second, state.fromCalc.Load)

	fs := filepath.Join(t.TempDir(), "bpffs")
	if err := os.Mkdir(fs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", fs, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(fs, unix.MNT_DETACH) })

	var failing atomic.Bool
	failing.Store(true)
	fault := errors.New("the kernel refused the programs (test)")
	cfg := bpf.StageConfig{PinDir: filepath.Join(fs, "sluice"), Sizes: bpf.MapSizes{Frontends: 64, Backends: 256, SourceRanges: 64,
		ClusterNets: 64, Affinity: 64, Conntrack: 1024}, HostInterfaces: regexp.MustCompile(bpf.DefaultHostInterfaces),
		CgroupPath: "none", Attach: testAttachMode(t),
		Services: bpf.Config{NodeName: "node-a", VXLANPort: bpf.DefaultVXLANPort, VNI: bpf.DefaultVNI, PSNATMin: bpf.DefaultPSNATMin, PSNATMax: bpf.DefaultPSNATMax},
		LoadFault: func() error {
			if failing.Load() {
				return fault
			}
			return nil
		}}
	var logs logBuffer
	svc := agent.NewServiceStage(cfg, plan, zerolog.New(&logs))
	svc.RetryMin, svc.RetryMax = 20*time.Millisecond, 20*time.Millisecond
	state.svc = svc
	reg := prometheus.NewRegistry()
	reg.MustRegister(newReadyCollector(svc))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyDone := make(chan struct{})
	go func() { defer close(proxyDone); _ = healthcheck.ServeProxyHealth(ctx, ln, svc.Health()) }()
	defer func() { cancel(); <-proxyDone }()

	// The stage's node: its own network namespace with eth0 holding node-a's address.
	stageDone := make(chan struct{})
	nsReady := make(chan netns.NsHandle, 1)
	go func() {
		defer close(stageDone)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, and its namespace with it
		ns, err := netns.New()
		if err != nil {
			t.Errorf("creating a network namespace: %v", err)
			close(nsReady)
			return
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "up-eth0"}); err != nil {
			t.Errorf("adding eth0: %v", err)
		}
		for _, name := range []string{"eth0", "up-eth0", "lo"} {
			if l, err := netlink.LinkByName(name); err == nil {
				_ = netlink.LinkSetUp(l)
			}
		}
		if l, err := netlink.LinkByName("eth0"); err == nil {
			a, _ := netlink.ParseAddr("192.168.10.11/24")
			_ = netlink.AddrAdd(l, a)
		}
		nsReady <- ns
		svc.Run(ctx)
	}()
	ns, ok := <-nsReady
	if !ok {
		t.FailNow()
	}
	defer ns.Close()
	defer func() { cancel(); <-stageDone }()

	// Cannot start: said, counted, tried again.
	waitUntil(t, "a few start attempts", 10*time.Second, func() bool {
		return svc.Attempts() >= 3
	})
	if ok, step, why := svc.Status(); ok || step != "load" || !strings.Contains(why, fault.Error()) {
		t.Errorf("status %v %q %q, want not ok at step load naming the fault", ok, step, why)
	}
	if got := testutil.ToFloat64(newReadyCollector(svc)); got != 0 {
		t.Errorf("sluice_services_ready %v while the stage cannot start", got)
	}
	if err := testutil.CollectAndCompare(reg, strings.NewReader(readyMetric("load")), "sluice_services_ready"); err != nil {
		t.Error(err)
	}
	if ok, why := state.readiness(); ok || !strings.Contains(why, "service stage not working") || !strings.Contains(why, fault.Error()) {
		t.Errorf("readiness %v %q, want not ready naming the service stage and the fault", ok, why)
	}
	if ok, _ := state.routesReadiness(); !ok {
		t.Error("the routes' readiness follows the service stage")
	}
	var applied int64
	if st := state.status("node-a", &applied); st.Services == "" || !strings.HasPrefix(st.Services, "down: ") || applied == 0 {
		t.Errorf("status key: services %q, applied revision %d; want down with the reason, and the routes' revision", st.Services, applied)
	}
	if code, body := get(t, "http://"+ln.Addr().String()+"/healthz"); code != 503 {
		t.Errorf("proxy health %d %s while the stage cannot start, want 503", code, body)
	}
	if n := len(logs.matching(t, "the service stage cannot start: routes are programmed, services are not (node ports, cluster IPs); retrying with backoff", nil)); n != 1 {
		t.Errorf("the start failure logged %d times, want once for one reason", n)
	}

	// The cause goes: the stage starts by itself with calc's whole state, and attaches.
	failing.Store(false)
	waitUntil(t, "the stage running and ready", 10*time.Second, func() bool { ok, _, _ := svc.Status(); return ok })
	st := svc.Running()
	if c := st.Svc.Counts()["frontends"]; c[0] == 0 || c[0] != c[1] {
		t.Errorf("frontends desired/programmed %v: the late stage was not handed calc's state", c)
	}
	if err := testutil.CollectAndCompare(reg, strings.NewReader(readyMetric("")), "sluice_services_ready"); err != nil {
		t.Error(err)
	}
	if ok, why := state.readiness(); !ok {
		t.Errorf("not ready once the stage runs: %s", why)
	}
	if code, body := get(t, "http://"+ln.Addr().String()+"/healthz"); code != 200 {
		t.Errorf("proxy health %d %s once the stage runs, want 200", code, body)
	}
	if logs.waitFor(t, "service stage started", nil) == nil {
		t.Error("no line says the stage started")
	}
	// Its programs are on eth0 in the stage's namespace.
	if got := hookPrograms(t, ns, "eth0"); got != "sl_from_host" {
		t.Errorf("eth0 ingress runs %q, want sl_from_host", got)
	}
	// A later update reaches the started stage too.
	before := st.Svc.Counts()["frontends"][0]
	if _, err := cli.Delete(context.Background(), store.ServicePrefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the service's removal to reach the stage", 10*time.Second, func() bool { return st.Svc.Counts()["frontends"][0] < before })
	cancel()
	<-stageDone
	if err := bpf.RemoveAll(cfg.PinDir); err != nil {
		t.Errorf("removing the stage's pins: %v", err)
	}
}

// readyMetric is sluice_services_ready as /metrics writes it: 1 with no label when reason is
// "", else 0 with the reason.
func readyMetric(reason string) string {
	series := "sluice_services_ready 1"
	if reason != "" {
		series = `sluice_services_ready{reason="` + reason + `"} 0`
	}
	return "# HELP sluice_services_ready " + servicesReadyHelp + "\n# TYPE sluice_services_ready gauge\n" + series + "\n"
}

// TestServicesReadyGauge: sluice_services_ready in the text of /metrics is one series,
// `sluice_services_ready 1` with no label while the service stage does its whole job, and 0
// with the reason's step while it does not; never an empty reason="". The agent's whole
// registry takes the collector beside its other metrics.
func TestServicesReadyGauge(t *testing.T) {
	scrape := func(g prometheus.Gatherer) string {
		t.Helper()
		rec := httptest.NewRecorder()
		promhttp.HandlerFor(g, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if rec.Code != 200 {
			t.Fatalf("/metrics = %d: %s", rec.Code, rec.Body)
		}
		var out []string
		for _, l := range strings.Split(rec.Body.String(), "\n") {
			if strings.Contains(l, "sluice_services_ready") {
				out = append(out, l)
			}
		}
		return strings.Join(out, "\n") + "\n"
	}
	svc := agent.NewServiceStage(bpf.StageConfig{}, nil, zerolog.Nop())
	c := newReadyCollector(svc)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if got, want := scrape(reg), readyMetric(agent.ReasonStarting); got != want {
		t.Errorf("before the stage starts:\n%s\nwant\n%s", got, want)
	}
	c.status = func() (bool, string, string) { return false, "load", "the kernel refused a program (test)" }
	if got, want := scrape(reg), readyMetric("load"); got != want {
		t.Errorf("refused at load:\n%s\nwant\n%s", got, want)
	}
	c.status = func() (bool, string, string) { return false, agent.ReasonDegraded, "no programs on eth0 (test)" }
	if got, want := scrape(reg), readyMetric(agent.ReasonDegraded); got != want {
		t.Errorf("degraded:\n%s\nwant\n%s", got, want)
	}
	c.status = func() (bool, string, string) { return true, "", "" }
	if got, want := scrape(reg), readyMetric(""); got != want {
		t.Errorf("ready:\n%s\nwant\n%s", got, want)
	}

	state := offlineAgentState(t)
	state.svc = svc // not started: the agent's registry says so from the supervisor itself
	if got, want := scrape(state.registry()), readyMetric(agent.ReasonStarting); got != want {
		t.Errorf("the agent's registry:\n%s\nwant\n%s", got, want)
	}
}

// hookPrograms names the programs on an interface's ingress in ns: TCX programs, then
// classic filters. It looks from a thread in ns (TCX queries name the interface by index).
func hookPrograms(t *testing.T, ns netns.NsHandle, iface string) string {
	t.Helper()
	var names []string
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err = netns.Set(ns); err != nil {
			return
		}
		var l netlink.Link
		if l, err = netlink.LinkByName(iface); err != nil {
			return
		}
		name := func(id ebpf.ProgramID) {
			p, perr := ebpf.NewProgramFromID(id)
			if perr != nil {
				err = perr
				return
			}
			defer p.Close()
			info, _ := p.Info()
			names = append(names, info.Name)
		}
		if bpf.HaveTCX() == nil {
			res, qerr := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
			if qerr != nil {
				err = qerr
				return
			}
			for _, p := range res.Programs {
				name(p.ID)
			}
		}
		if fs, ferr := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS); ferr == nil {
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok {
					name(ebpf.ProgramID(bf.Id))
				}
			}
		}
	}()
	<-done
	if err != nil {
		t.Fatalf("reading %s's hooks: %v", iface, err)
	}
	return strings.Join(names, " ")
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testAttachMode is SLUICE_BPF_ATTACH's mode (auto when unset): `make test` runs the service
// tests in both.
func testAttachMode(t *testing.T) bpf.AttachMode {
	m, err := bpf.ParseAttachMode(os.Getenv("SLUICE_BPF_ATTACH"))
	if err != nil {
		t.Fatalf("SLUICE_BPF_ATTACH: %v", err)
	}
	return m
}

// TestCheckKernel: sluiced --check-kernel lists every feature the agent asks of the kernel,
// each found or not with the probe's answer, and says the kernel does the whole job exactly
// when every feature without a stand-in is found.
func TestCheckKernel(t *testing.T) {
	nstest.NeedRoot(t, "the probes load programs")
	var out strings.Builder
	whole := checkKernel(&out)
	want := true
	for _, f := range kernelFeatures() {
		line := ""
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, f.Name+" ") {
				line = l
			}
		}
		if line == "" {
			t.Errorf("no line for %s:\n%s", f.Name, out.String())
			continue
		}
		if f.Found() != strings.Contains(line, " yes ") {
			t.Errorf("%s found %v, line %q", f.Name, f.Found(), line)
		}
		want = want && (f.Found() || hasStandIn(f.Name))
	}
	if whole != want || strings.Contains(out.String(), "whole job on this kernel") != want {
		t.Errorf("whole job %v, want %v:\n%s", whole, want, out.String())
	}
}
