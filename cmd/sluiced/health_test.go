package main

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
)

// TestHealthStates: not ready before the intake is in sync; not live before the apply loop
// goes round, live once it does; events move their counter; every metric is sluice_, but the
// Go runtime's and the process's (TestMetricsGoAndProcess). (The
// HTTP endpoints answering 200 once in sync and applied are TestRun's checkHealth.)
func TestHealthStates(t *testing.T) {
	state := newAgentState()
	state.dp = dataplane.New(dataplane.NewFakeKernel(), dataplane.Config{})
	cli, err := store.ClientConfig{Endpoints: []string{"http://127.0.0.1:1"}}.New() // never reachable
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if state.intake, err = store.NewIntake(store.IntakeConfig{Client: cli, Handler: state}); err != nil {
		t.Fatal(err)
	}
	if state.ready() {
		t.Fatal("ready before the intake is in sync")
	}
	if state.live() {
		t.Fatal("live although the apply loop never ran")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go state.dp.Run(ctx)
	deadline := time.Now().Add(3 * time.Second)
	for !state.live() {
		if time.Now().After(deadline) {
			t.Fatal("not live with the loop running")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// An intake stuck in its handler makes the agent not live (the watchdog restarts it); a
	// handler call of ordinary length does not.
	state.intake.Stats().HandlerSince.Store(time.Now().Add(-time.Second).UnixNano())
	if !state.live() {
		t.Fatal("not live during a handler call of a second")
	}
	state.intake.Stats().HandlerSince.Store(time.Now().Add(-stuckIntake - time.Second).UnixNano())
	if state.live() {
		t.Fatal("live with the intake stuck in its handler")
	}
	state.intake.Stats().HandlerSince.Store(0)
	if !state.live() {
		t.Fatal("not live once the handler returned")
	}
	// Silence: not ready, with the reason.
	state.intake.Stats().InSync.Store(true)
	state.intake.Stats().Silent.Store(true)
	state.intake.Stats().LastHeard.Store(time.Now().Add(-12 * time.Second).UnixNano())
	if ok, why := state.readiness(); ok || !strings.Contains(why, "lost etcd: no connection for 12s") {
		t.Fatalf("readiness while silent: %v %q", ok, why)
	}
	state.intake.Stats().Silent.Store(false)
	state.intake.Stats().InSync.Store(false)
	cancel()

	before := testutil.ToFloat64(state.events.WithLabelValues("Node", "upsert"))
	state.OnEvents([]store.Event{{Type: store.EventUpsert, Kind: store.KindNode, ID: "n"}, {Type: store.EventInSync}})
	if after := testutil.ToFloat64(state.events.WithLabelValues("Node", "upsert")); after != before+1 {
		t.Fatalf("sluice_events_total did not move: %v -> %v", before, after)
	}
	families, err := state.registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	ours := 0
	for _, mf := range families {
		switch n := mf.GetName(); {
		case strings.HasPrefix(n, "sluice_"):
			ours += len(mf.GetMetric())
		case strings.HasPrefix(n, "go_"), strings.HasPrefix(n, "process_"): // the client's collectors
		default:
			t.Fatalf("metric %s lacks the sluice_ prefix", n)
		}
	}
	if ours < 20 {
		t.Fatalf("%d sluice_ metrics", ours)
	}
}

// TestMetricsGoAndProcess: /metrics, as the health server serves it, carries the Go runtime's
// and the process's figures beside sluice's own, with values a live process has (a leak shows
// in production as goroutines, heap, resident memory or descriptors that only grow).
func TestMetricsGoAndProcess(t *testing.T) {
	state := offlineAgentState(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- state.serveHealth(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serveHealth: %v", err)
		}
	}()
	code, body := get(t, "http://"+ln.Addr().String()+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	values := map[string]float64{}
	for _, l := range strings.Split(body, "\n") {
		name, v, ok := strings.Cut(l, " ")
		if !ok || strings.HasPrefix(l, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			values[name] = f
		}
	}
	for _, c := range []struct {
		name string
		min  float64 // the least a live Go process can show
	}{
		{"go_goroutines", 2}, // this test's and the server's
		{"go_threads", 1},
		{"go_memstats_alloc_bytes", 1},
		{"go_memstats_heap_alloc_bytes", 1},
		{"go_memstats_sys_bytes", 1 << 20},
		{"process_resident_memory_bytes", 1 << 20},
		{"process_virtual_memory_bytes", 1 << 20},
		{"process_open_fds", 4}, // stdin, stdout, stderr and the listener at least
		{"process_max_fds", 4},
		{"process_start_time_seconds", float64(time.Now().Add(-24 * time.Hour).Unix())},
	} {
		v, ok := values[c.name]
		switch {
		case !ok:
			t.Errorf("/metrics lacks %s", c.name)
		case v < c.min:
			t.Errorf("%s = %v, want at least %v", c.name, v, c.min)
		}
	}
	// The kernel's boot time is whole seconds: the start time may be up to a second ahead.
	if v := values["process_start_time_seconds"]; v > float64(time.Now().Unix()+2) {
		t.Errorf("process_start_time_seconds = %v: after now", v)
	}
	if open, max := values["process_open_fds"], values["process_max_fds"]; open > max {
		t.Errorf("process_open_fds %v > process_max_fds %v", open, max)
	}
}

// offlineAgentState is an agent's state with an intake over an etcd that never answers (its
// client closed by the test's cleanup): enough for its registry and health handlers.
func offlineAgentState(t *testing.T) *agentState {
	t.Helper()
	state := newAgentState()
	cli, err := store.ClientConfig{Endpoints: []string{"http://127.0.0.1:1"}}.New() // never reachable
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	if state.intake, err = store.NewIntake(store.IntakeConfig{Client: cli, Handler: state}); err != nil {
		t.Fatal(err)
	}
	return state
}
