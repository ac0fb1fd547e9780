package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
)

// TestHealthStates: not ready before the intake is in sync; not live before the apply loop
// goes round, live once it does; events move their counter; every metric is sluice_. (The
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
	r := state.registry()
	n, err := testutil.GatherAndCount(r)
	if err != nil || n < 20 {
		t.Fatalf("metrics: %d, %v", n, err)
	}
	names, _ := r.Gather()
	for _, mf := range names {
		if !strings.HasPrefix(mf.GetName(), "sluice_") {
			t.Fatalf("metric %s lacks the sluice_ prefix", mf.GetName())
		}
	}
}
