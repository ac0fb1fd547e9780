package store_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3rpc"
)

// stallingWatcher passes on every watch's responses until stalled, then swallows those of the
// watch over start: the watch stays open and says nothing, as one etcd's gRPC proxy stopped
// serving (etcd-io/etcd#9988, #21813).
type stallingWatcher struct {
	clientv3.Watcher
	start   string
	stalled atomic.Bool
}

func (w *stallingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	if key != w.start {
		return in
	}
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			if w.stalled.Load() {
				continue
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// progressEvery makes the embedded etcd of this process send progress notifications every d
// to idle watches (10 minutes otherwise), for the test.
func progressEvery(t *testing.T, d time.Duration) {
	v3rpc.SetProgressReportInterval(d)
	t.Cleanup(func() { v3rpc.SetProgressReportInterval(10 * time.Minute) }) // etcd's default
}

func stallIntake(t *testing.T, cli *clientv3.Client, after time.Duration) (*store.Intake, *sink) {
	t.Helper()
	s := newSink()
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: s, Reporter: &reporter{}, Prefixes: store.NodePrefixes("node-a"),
		Liveness: 2 * time.Second, StallAfter: after, MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runIntake(t, in)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })
	return in, s
}

// TestIntakeResyncsAStalledWatch: a watch that stays open but delivers nothing more while etcd
// moves on is taken for lost after StallAfter, and the read that follows brings what it
// missed; before the stall, the same changes with the watches served read nothing again.
func TestIntakeResyncsAStalledWatch(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (4 s): make test runs it")
	}
	progressEvery(t, 200*time.Millisecond) // the idle /sluice/ watch kept current too
	srv := etcdtest.New(t)
	writer := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	w := &stallingWatcher{Watcher: cli.Watcher, start: store.WatchSpans(store.NodePrefixes("node-a"))[0].Start}
	cli.Watcher = w
	put(t, writer, nodeKey, nodeValue("node-a", "192.0.2.11/24", ""))
	in, s := stallIntake(t, cli, time.Second)

	// Served: changes arrive by the watch, nothing is read again.
	put(t, writer, store.NodePrefix+"node-c", nodeValue("node-c", "192.0.2.13/24", ""))
	eventually(t, 5*time.Second, "node-c", func() bool { return s.index.Snapshot().Get(store.KindNode, "node-c") != nil })
	time.Sleep(2500 * time.Millisecond) // more than twice StallAfter, many probes
	if got := in.Stats().Resyncs.Load(); got != 0 {
		t.Fatalf("%d resyncs with every watch served, want 0", got)
	}

	w.stalled.Store(true)
	stalledAt := time.Now()
	put(t, writer, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.12/24", ""))
	eventually(t, 15*time.Second, "node-b, read again", func() bool { return s.index.Snapshot().Get(store.KindNode, "node-b") != nil })
	t.Logf("the stalled watch's change delivered %v after the stall (StallAfter 1s)", time.Since(stalledAt).Round(time.Millisecond))
	// Counted once the read is over (its events are delivered before).
	stalled := slices.Index(store.ResyncCauses, store.CauseWatchStalled)
	eventually(t, 5*time.Second, "the resync counted as a stalled watch's", func() bool { return in.Stats().ResyncsBy[stalled].Load() >= 1 })
}

// TestIntakeIdleWatchIsNotStalled: etcd moves on with keys no watch covers, so the watches
// deliver nothing but etcd's progress notifications; they keep up, and nothing is read again,
// on etcd directly and through etcd's gRPC proxy (which passes its own watches' notifications
// on to every client watch it serves from them).
func TestIntakeIdleWatchIsNotStalled(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (8 s): make test runs it")
	}
	progressEvery(t, 200*time.Millisecond)
	for _, via := range []string{"direct", "grpc-proxy"} {
		t.Run(via, func(t *testing.T) {
			srv := etcdtest.New(t)
			writer := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
			endpoint := srv.Endpoint()
			if via == "grpc-proxy" {
				endpoint = etcdtest.NewGRPCProxy(t, srv.Endpoint()).Endpoint()
			}
			cli := mustClient(t, store.ClientConfig{Endpoints: []string{endpoint}})
			put(t, writer, nodeKey, nodeValue("node-a", "192.0.2.11/24", ""))
			// StallAfter above twice the progress interval, and its jitter.
			in, _ := stallIntake(t, cli, time.Second)
			deadline := time.Now().Add(4 * time.Second)
			last := int64(0)
			for time.Now().Before(deadline) {
				last = put(t, writer, "/other-application/key", time.Now().String())
				time.Sleep(50 * time.Millisecond)
			}
			eventually(t, 5*time.Second, "the watches' revision past the other application's writes", func() bool {
				return in.Stats().Revision.Load() >= last
			})
			if got := in.Stats().Resyncs.Load(); got != 0 {
				t.Fatalf("%d resyncs while etcd's progress notifications kept the watches current, want 0", got)
			}
		})
	}
}
