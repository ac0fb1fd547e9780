package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/cmd/internal/agent"
	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// shapeState is calc's desired state for node-00000 of the benchmark's shape sh, computed
// from the keys loadBench writes.
func shapeState(tb testing.TB, sh benchShape) (*calc.State, calc.Config) {
	var events []store.Event
	benchKeys(sh, func(k, v string) {
		obj, err := store.Decode(k, []byte(v))
		if err != nil {
			tb.Fatalf("%s: %v", k, err)
		}
		events = append(events, store.Event{Type: store.EventUpsert, Kind: obj.Kind(), ID: obj.ID(), Key: k, Revision: 1, Object: obj})
	})
	g, err := calc.New(calc.DefaultConfig("node-00000"))
	if err != nil {
		tb.Fatal(err)
	}
	g.OnEvents(append(events, store.Event{Type: store.EventInSync, Revision: 1}))
	return g.State(), g.Config()
}

// shapeInEtcd starts etcd with the shape's keys and returns a client of it (closed by the
// test's cleanup), what an intake of node-00000's prefixes held of them once in sync (read by
// a real intake, stopped then), and calc's desired state for node-00000 with its
// configuration.
func shapeInEtcd(tb testing.TB, sh benchShape) (*clientv3.Client, []store.PrefixState, *calc.State, calc.Config) {
	_, cli := newEtcd(tb)
	loadBench(tb, cli, sh)
	st, cfg := shapeState(tb, sh)
	return cli, heldBy(tb, cli), st, cfg
}

// heldBy runs an intake of node-00000's prefixes on cli until it is in sync, stops it, and
// returns what it held.
func heldBy(tb testing.TB, cli *clientv3.Client) []store.PrefixState {
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: store.Fanout{}, Prefixes: store.NodePrefixes("node-00000")})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = in.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !in.Stats().InSync.Load() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	held, ok := in.Held()
	if !ok {
		tb.Fatal("the intake never held etcd's keys whole")
	}
	return held
}

// BenchmarkKeptState: writing the state file of the 20,000-node shape (20,000 VTEPs, host
// nets and routes) as an agent does when it stops, and restoring it as one does when it
// starts: the header read, etcd checked (each prefix's keys counted and its newest found, in
// one transaction; also alone, "check"), the state read and turned into the dataplane's
// update.
func BenchmarkKeptState(b *testing.B) {
	sh := benchShapes[len(benchShapes)-1]
	cli, held, st, cfg := shapeInEtcd(b, sh)
	prefixes := store.NodePrefixes("node-00000")
	path := filepath.Join(b.TempDir(), "desired-state")
	ctx := context.Background()
	var size int64
	var err error
	b.Run("write", func(b *testing.B) {
		for b.Loop() {
			if size, err = agent.SaveState(path, "bench", cfg, held, st); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(size)/(1<<20), "MiB")
	})
	b.Run("check", func(b *testing.B) { // etcd's part of a restore alone
		for b.Loop() {
			if same, _, err := store.Unchanged(ctx, cli, held); err != nil || !same {
				b.Fatalf("unchanged %v, %v", same, err)
			}
		}
	})
	b.Run("restore", func(b *testing.B) {
		var ops int
		for b.Loop() {
			u, _, _, err := agent.RestoreState(ctx, path, cli, "bench", cfg, prefixes)
			if err != nil {
				b.Fatal(err)
			}
			ops = len(u.Ops)
		}
		if ops != 3*sh.nodes+3 { // a VTEP, host net and route per remote node; this node's VTEP and host net; the pool
			b.Fatalf("%d ops", ops)
		}
	})
}

// TestKeptState: the state saved as an agent stops comes back as calc's first update would
// carry it while etcd holds the same keys, and not when anything under the watched prefixes
// moved, when another build or configuration computed it, or when the file is missing or
// damaged; each answer says which.
func TestKeptState(t *testing.T) {
	sh := benchShape{name: "small", nodes: 3, blocks: 6}
	cli, held, st, cfg := shapeInEtcd(t, sh)
	want := opsText(st.Update())
	rev := held[0].Revision
	prefixes := store.NodePrefixes("node-00000")
	path := filepath.Join(t.TempDir(), "desired-state")
	ctx := context.Background()
	if _, err := agent.SaveState(path, "build-1", cfg, held, st); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("the temporary file is left: %v", err)
	}

	u, kept, checked, err := agent.RestoreState(ctx, path, cli, "build-1", cfg, prefixes)
	if err != nil {
		t.Fatalf("etcd unchanged: %v", err)
	}
	if kept != rev || checked < rev || !u.Full {
		t.Errorf("restored at %d, checked at %d, full %v; want %d, at least that, full", kept, checked, u.Full, rev)
	}
	if got := opsText(u); got != want {
		t.Errorf("restored ops differ:\n--- restored\n%s\n--- calc\n%s", got, want)
	}

	refused := func(what, reason string, build string, cfg calc.Config) {
		t.Helper()
		_, _, _, err := agent.RestoreState(ctx, path, cli, build, cfg, prefixes)
		var nc agent.NotCurrent
		if !errors.As(err, &nc) || !strings.Contains(err.Error(), reason) {
			t.Errorf("%s: %v, want it not current, saying %q", what, err, reason)
		}
	}
	refused("another build", "another build", "build-2", cfg)
	other := cfg
	other.BlackholeMetric++
	refused("another configuration", "another configuration", "build-1", other)
	if _, err := cli.Put(ctx, store.NodePrefix+"node-00002", benchNodeJSON(2, sh.tunnel(2))); err != nil {
		t.Fatal(err)
	}
	refused("a node written again, with the same value", "etcd changed since revision", "build-1", cfg)

	if _, _, _, err := agent.RestoreState(ctx, filepath.Join(t.TempDir(), "none"), cli, "build-1", cfg, prefixes); !errors.Is(err, agent.ErrNoKeptState) {
		t.Errorf("no file: %v, want ErrNoKeptState", err)
	}
	// Saved again (etcd as it is now), then damaged: cut short, a byte of the state changed.
	size, err := agent.SaveState(path, "build-1", cfg, heldBy(t, cli), st)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := agent.RestoreState(ctx, path, cli, "build-1", cfg, prefixes); err != nil {
		t.Fatalf("saved again with etcd as it is: %v", err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var nc agent.NotCurrent
	for what, damaged := range map[string][]byte{"cut short": raw[:size-100], "a byte changed": append(raw[:size-10:size-10], append([]byte{raw[size-10] ^ 0x20}, raw[size-9:]...)...)} {
		if err := os.WriteFile(path, damaged, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, _, err = agent.RestoreState(ctx, path, cli, "build-1", cfg, prefixes)
		if err == nil || errors.As(err, &nc) || errors.Is(err, agent.ErrNoKeptState) || !strings.Contains(err.Error(), path) {
			t.Errorf("a file %s: %v, want an error naming %s", what, err, path)
		}
	}
	if err := os.WriteFile(path, []byte("not a state file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err = agent.RestoreState(ctx, path, cli, "build-1", cfg, prefixes); err == nil || errors.As(err, &nc) || !strings.Contains(err.Error(), path) {
		t.Errorf("a file of something else: %v, want an error naming %s", err, path)
	}
}

// opsText writes an update's ops one per line.
func opsText(u *calc.Update) string {
	var b strings.Builder
	for _, op := range u.Ops {
		fmt.Fprintf(&b, "%v %s\n", op.Remove, op.String())
	}
	return b.String()
}

// TestSyncedAtStandsInUntilTheFirstSync: a restored state makes the agent count as in sync
// only until the intake's first in-sync, and only while its first read has not failed; after
// the first in-sync, only the intake's own counts.
func TestSyncedAtStandsInUntilTheFirstSync(t *testing.T) {
	_, cli := newEtcd(t)
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: store.Fanout{}})
	if err != nil {
		t.Fatal(err)
	}
	a := newAgentState()
	a.intake = in
	st := in.Stats()
	if _, ok := a.syncedAt(); ok {
		t.Fatal("synced before anything")
	}
	a.restored.Store(7)
	if rev, ok := a.syncedAt(); !ok || rev != 7 {
		t.Fatalf("restored at 7: synced %v at %d", ok, rev)
	}
	st.Retries.Add(1) // the first read failed: etcd may be gone
	if _, ok := a.syncedAt(); ok {
		t.Fatal("restored, the intake's first read failed: synced")
	}
	st.Revision.Store(9)
	st.InSync.Store(true)
	st.Syncs.Add(1)
	if rev, ok := a.syncedAt(); !ok || rev != 9 {
		t.Fatalf("in sync at 9: synced %v at %d", ok, rev)
	}
	st.InSync.Store(false) // a watch lost after the first in-sync: the restored state is old news
	if _, ok := a.syncedAt(); ok {
		t.Fatal("synced while the intake reads again after its first in-sync")
	}
}

// TestRestoreKeptOutcomes: what the agent makes of its state file at start, each outcome
// counted under its name and only a current state handed over: none there; a current one
// (handed over, its revision standing for etcd's); one etcd moved on from; etcd not
// answering; a damaged file; and a current one when calc's own update came first.
func TestRestoreKeptOutcomes(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	sh := benchShape{name: "small", nodes: 3, blocks: 6}
	cli, held, st, cfg := shapeInEtcd(t, sh)
	prefixes := store.NodePrefixes("node-00000")
	path := filepath.Join(t.TempDir(), "desired-state")
	try := func(what, outcome string, want bool, cli *clientv3.Client, fromCalc bool) *agentState {
		t.Helper()
		graph, err := calc.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		state := newAgentState()
		state.fromCalc.Store(fromCalc)
		plan := &agent.Planner{Graph: graph, Problems: &state.problems, SelfMissing: &state.selfMissing, FromCalc: &state.fromCalc}
		if got := restoreKept(context.Background(), path, cli, "build-1", plan, prefixes, state, zerolog.Nop()); got != want {
			t.Errorf("%s: handed over %v, want %v", what, got, want)
		}
		if n := testutil.ToFloat64(state.stateFile.WithLabelValues(outcome)); n != 1 {
			t.Errorf("%s: counted %v as %s, want 1", what, n, outcome)
		}
		if restored := state.restored.Load() != 0; restored != want {
			t.Errorf("%s: restored revision set %v, want %v", what, restored, want)
		}
		return state
	}
	try("no file", "missing", false, cli, false)
	if _, err := agent.SaveState(path, "build-1", cfg, held, st); err != nil {
		t.Fatal(err)
	}
	state := try("etcd unchanged", "restored", true, cli, false)
	if rev := state.restored.Load(); rev < held[0].Revision {
		t.Errorf("restored at revision %d, before the one held (%d)", rev, held[0].Revision)
	}
	try("calc came first", "not-current", false, cli, true)
	closed, err := clientv3.New(clientv3.Config{Endpoints: cli.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	try("etcd not answering", "etcd-unavailable", false, closed, false)
	if _, err := cli.Put(context.Background(), store.NodePrefix+"node-00001", benchNodeJSON(1, sh.tunnel(1))); err != nil {
		t.Fatal(err)
	}
	try("etcd changed", "not-current", false, cli, false)
	if err := os.WriteFile(path, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	try("a damaged file", "not-current", false, cli, false) // format 0: of no use, said so
	if err := os.WriteFile(path, []byte("not a state file"), 0o600); err != nil {
		t.Fatal(err)
	}
	try("not a state file", "unreadable", false, cli, false)
}
