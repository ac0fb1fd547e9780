package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
)

// TestUnchangedSince takes etcd through every way the keys under the prefixes can move (a
// value written again, even the same one; a key deleted; one added; one deleted and another
// added, so the count is the same) and expects each to be seen, while writes elsewhere,
// which move etcd's revision, are not. After each step the baseline is taken again.
func TestUnchangedSince(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefixes := store.NodePrefixes("node-a")
	put(t, cli, store.NodePrefix+"node-a", nodeValue("node-a", "192.0.2.1/24", "10.65.0.1"))
	put(t, cli, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.2/24", "10.65.0.65"))
	put(t, cli, store.AffinityPrefix+"node-a/ipv4/block/10.65.0.0-26", `{"state":"confirmed"}`)
	since := put(t, cli, store.IPPoolPrefix+"pool-1", poolValue("pool-1", "10.65.0.0/16", "Always"))

	baseline := func() []int64 {
		t.Helper()
		counts, at, err := store.CountKeys(ctx, cli, prefixes, since)
		if err != nil || at != since {
			t.Fatalf("counting at %d: %v (at %d)", since, err, at)
		}
		return counts
	}
	check := func(step string, want bool) {
		t.Helper()
		counts := baseline()
		got, at, err := store.UnchangedSince(ctx, cli, prefixes, since, counts)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if got != want {
			t.Errorf("%s: unchanged = %v, want %v", step, got, want)
		}
		if at < since {
			t.Errorf("%s: checked at revision %d, before %d", step, at, since)
		}
		since = at // the next step's baseline: etcd as it is now
	}
	counts := baseline()
	if want := []int64{1, 2, 0, 1, 0, 0, 0}; !slices.Equal(counts, want) {
		t.Fatalf("counts %v, want %v (pools, nodes, blocks, node-a's affinities, endpoints, services, slices)", counts, want)
	}

	check("nothing written", true)
	put(t, cli, "/other/key", "x")
	put(t, cli, store.AffinityPrefix+"node-b/ipv4/block/10.65.0.64-26", `{"state":"confirmed"}`)
	check("written outside the prefixes (another node's affinity too)", true)
	put(t, cli, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.2/24", "10.65.0.65"))
	check("a node written again with the same value", false)
	check("then nothing", true)
	del(t, cli, store.IPPoolPrefix+"pool-1")
	check("a pool deleted", false)
	put(t, cli, store.BlockPrefix+"ipv4/block/10.65.0.0-26", blockValue("10.65.0.0/26", "node-a"))
	check("a block added", false)
	del(t, cli, store.NodePrefix+"node-b")
	put(t, cli, store.NodePrefix+"node-c", nodeValue("node-c", "192.0.2.3/24", "10.65.0.129"))
	check("a node deleted and another added (the same count)", false)

	// Counting at a revision etcd has compacted away is an error, not a count of now.
	old := since
	put(t, cli, "/other/key", "y")
	if _, err := cli.Compact(ctx, put(t, cli, "/other/key", "z")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.CountKeys(ctx, cli, prefixes, old); err == nil {
		t.Errorf("counting at compacted revision %d: no error", old)
	}
	if _, _, err := store.UnchangedSince(ctx, cli, prefixes, old, []int64{1}); err == nil {
		t.Error("one count for seven prefixes: no error")
	}
}
