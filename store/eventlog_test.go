package store_test

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
)

// snapshotText renders a whole index for comparison.
func snapshotText(s *store.Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rev=%d insync=%t\n", s.Revision(), s.InSync())
	for _, k := range store.Kinds {
		for _, o := range s.List(k) {
			fmt.Fprintf(&b, "%s %s\n", k, reflectString(o))
		}
	}
	return b.String()
}

// TestRecordReplayGivesSameIndex records a live run (initial read, watched changes, a bad
// value turning a good object into a delete) and replays the log into a fresh index.
func TestRecordReplayGivesSameIndex(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	loadDump(t, cli, "../testdata/calico/etcd-dump.txt")
	put(t, cli, svcKey, serviceValue("default", "web", "10.96.0.10"))
	put(t, cli, sliceKey, sliceValue("default", "web-abc", "web", "10.65.174.129", "node-a"))

	var log bytes.Buffer
	live := store.NewIndex()
	rec := store.NewRecorder(&log)
	h := store.Fanout{live, rec}
	s := newSink()
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: store.Fanout{h, s}, PageSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	stop := runIntake(t, in)
	eventually(t, 10*time.Second, "in-sync", func() bool { return s.inSyncs() == 1 })
	put(t, cli, store.NodePrefix+"node-d", nodeValue("node-d", "192.168.20.14/24", "10.65.200.0"))
	del(t, cli, store.NodePrefix+"node-c")
	put(t, cli, store.IPPoolPrefix+"pool-cross", `{"spec":{"cidr":"broken"}}`)
	last := put(t, cli, sliceKey, sliceValue("default", "web-abc", "web", "10.65.9.5", "node-b"))
	eventually(t, 10*time.Second, "watched changes", func() bool {
		snap := live.Snapshot()
		return in.Stats().Revision.Load() >= last && snap.Get(store.KindIPPool, "pool-cross") == nil && snap.Get(store.KindNode, "node-d") != nil
	})
	stop()
	if err := rec.Flush(); err != nil {
		t.Fatal(err)
	}

	replayed := store.NewIndex()
	if err := store.Replay(bytes.NewReader(log.Bytes()), replayed); err != nil {
		t.Fatal(err)
	}
	got, want := snapshotText(replayed.Snapshot()), snapshotText(live.Snapshot())
	if got != want {
		t.Fatalf("replayed index differs from live index:\n--- replayed\n%s\n--- live\n%s", got, want)
	}
	if live.Snapshot().Get(store.KindIPPool, "pool-cross") != nil || live.Snapshot().Get(store.KindNode, "node-d") == nil {
		t.Fatal("live index did not follow the changes")
	}
	// Every line carries a revision.
	for i, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		if !strings.Contains(line, `"rev":`) || strings.Contains(line, `"rev":0`) {
			t.Fatalf("line %d has no revision: %s", i+1, line)
		}
	}
	// Replay tells which line is bad.
	bad := log.String() + `{"rev":99,"type":"upsert","key":"` + poolKey + `","value":{"spec":{"cidr":"x"}}}` + "\n"
	err = store.Replay(strings.NewReader(bad), store.NewIndex())
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("line %d", strings.Count(bad, "\n"))) || !strings.Contains(err.Error(), "spec.cidr") {
		t.Fatalf("replay of a bad line: %v", err)
	}
	if !reflect.DeepEqual(replayed.Snapshot().List(store.KindBlock), live.Snapshot().List(store.KindBlock)) {
		t.Fatal("blocks differ")
	}
}
