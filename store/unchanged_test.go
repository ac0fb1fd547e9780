package store_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdHeld reads from etcd what Held says of each prefix at revision rev: the count and the
// newest mod revision of its keys.
func etcdHeld(t *testing.T, cli *clientv3.Client, prefixes []string, rev int64) []store.PrefixState {
	t.Helper()
	out := make([]store.PrefixState, len(prefixes))
	for i, p := range prefixes {
		resp, err := cli.Get(context.Background(), p, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatal(err)
		}
		out[i] = store.PrefixState{Prefix: p, Revision: rev, Keys: int64(len(resp.Kvs))}
		for _, kv := range resp.Kvs {
			out[i].Newest = max(out[i].Newest, kv.ModRevision)
		}
	}
	return out
}

// TestIntakeHeld: an intake stopped after its watches delivered holds exactly etcd's keys as
// of the revision each watch reached (the two watches apart: /calico/ moved on, /sluice/ did
// not), counted by the intake itself; one stopped in the middle of its read holds nothing
// whole.
func TestIntakeHeld(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	prefixes := store.NodePrefixes("node-a")
	put(t, cli, store.NodePrefix+"node-a", nodeValue("node-a", "192.0.2.1/24", "10.65.0.1"))
	put(t, cli, store.ServicePrefix+"default/web", serviceValue("default", "web", "10.96.0.10"))
	put(t, cli, store.IPPoolPrefix+"bad", `{"not":"a pool"}`) // held too: a key is a key
	for i := range 5 {
		put(t, cli, store.BlockPrefix+"ipv4/block/10.65."+strconv.Itoa(i)+".0-26", blockValue("10.65."+strconv.Itoa(i)+".0/26", "node-b"))
	}
	s := newSink()
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: s, Prefixes: prefixes, PageSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	stop := runIntake(t, in)
	eventually(t, 5*time.Second, "in sync", func() bool { return s.inSyncs() == 1 })
	n := s.count()
	node := put(t, cli, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.2/24", "10.65.0.65"))
	eventually(t, 5*time.Second, "node-b delivered", func() bool { return s.count() > n })
	stop()
	held, ok := in.Held()
	if !ok {
		t.Fatal("an intake stopped in its watch holds nothing whole")
	}
	for i, h := range held {
		if h.Prefix != prefixes[i] {
			t.Fatalf("prefix %d: %s, want %s", i, h.Prefix, prefixes[i])
		}
		want := etcdHeld(t, cli, prefixes[i:i+1], h.Revision)[0]
		if h != want {
			t.Errorf("%s: held %+v, etcd had %+v at that revision", h.Prefix, h, want)
		}
		if root := h.Prefix[:8]; root == "/calico/" && h.Revision != node {
			t.Errorf("%s: held at %d, want %d (node-b's write)", h.Prefix, h.Revision, node)
		}
	}
	if got, _, err := store.Unchanged(context.Background(), cli, held); err != nil || !got {
		t.Errorf("etcd untouched: unchanged %v, %v", got, err)
	}

	// Stopped in the middle of a read after the first (its watch fell behind a compaction
	// while cut off; meanwhile blocks changed, more than a page of them): the pages delivered
	// so far are newer than the rest, and deletions would come last: nothing whole.
	writer, proxy, viaProxy := behindProxy(t)
	for i := range 9 {
		put(t, writer, store.BlockPrefix+"ipv4/block/10.66."+strconv.Itoa(i)+".0-26", blockValue("10.66."+strconv.Itoa(i)+".0/26", "node-b"))
	}
	cut := &cutter{}
	in2, err := store.NewIntake(store.IntakeConfig{Client: viaProxy, Handler: cut, Prefixes: prefixes, PageSize: 3,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cut.cancel = cancel
	done := make(chan struct{})
	go func() { defer close(done); _ = in2.Run(ctx) }()
	eventually(t, 5*time.Second, "in sync", func() bool { return in2.Stats().InSync.Load() })
	proxy.Cut()
	var last int64
	for i := range 9 {
		last = put(t, writer, store.BlockPrefix+"ipv4/block/10.66."+strconv.Itoa(i)+".0-26", blockValue("10.66."+strconv.Itoa(i)+".0/26", "node-b", 1))
	}
	if _, err := writer.Compact(context.Background(), last); err != nil {
		t.Fatal(err)
	}
	cut.arm()
	proxy.Restore()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("the read after the compaction never delivered a page")
	}
	if !cut.cutEarly() {
		t.Fatal("the read after the compaction delivered everything in one batch: nothing to cut")
	}
	if _, ok := in2.Held(); ok {
		t.Error("an intake stopped in the middle of a read says it holds etcd's keys whole")
	}
}

// cutter, once armed, cancels its intake at the next batch, noting whether that batch came
// before the read's in-sync.
type cutter struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	armed  bool
	early  bool
}

func (c *cutter) arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = true
}

func (c *cutter) cutEarly() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.early
}

func (c *cutter) OnEvents(b []store.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed {
		return
	}
	c.armed = false
	c.early = !slices.ContainsFunc(b, func(e store.Event) bool { return e.Type == store.EventInSync })
	c.cancel()
}

// TestUnchanged takes etcd through every way the keys under the prefixes can move (a value
// written again, even the same one; a key deleted; one added; one deleted and another added,
// so the count is the same; etcd restored from an older copy) and expects each to be seen,
// while writes elsewhere, which move etcd's revision, are not. After each step the baseline is
// taken again.
func TestUnchanged(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefixes := store.NodePrefixes("node-a")
	block := store.BlockPrefix + "ipv4/block/10.65.0.64-26"
	put(t, cli, store.NodePrefix+"node-a", nodeValue("node-a", "192.0.2.1/24", "10.65.0.1"))
	put(t, cli, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.2/24", "10.65.0.65"))
	put(t, cli, block, blockValue("10.65.0.64/26", "node-b"))
	put(t, cli, store.AffinityPrefix+"node-a/ipv4/block/10.65.0.0-26", `{"state":"confirmed"}`)
	since := put(t, cli, block, blockValue("10.65.0.64/26", "node-b", 1)) // an address handed out
	check := func(step string, want bool) {
		t.Helper()
		got, at, err := store.Unchanged(ctx, cli, etcdHeld(t, cli, prefixes, since))
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
	check("nothing written", true)
	put(t, cli, "/other/key", "x")
	put(t, cli, store.AffinityPrefix+"node-b/ipv4/block/10.65.0.64-26", `{"state":"confirmed"}`)
	check("written outside the prefixes (another node's affinity too)", true)
	put(t, cli, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.2/24", "10.65.0.65"))
	check("a node written again with the same value", false)
	check("then nothing", true)
	kept := etcdHeld(t, cli, prefixes, since) // for the restored copy below
	put(t, cli, store.IPPoolPrefix+"pool-1", poolValue("pool-1", "10.65.0.0/16", "Always"))
	check("a pool added", false)
	del(t, cli, store.IPPoolPrefix+"pool-1")
	check("a pool deleted", false)
	del(t, cli, store.NodePrefix+"node-b")
	put(t, cli, store.NodePrefix+"node-c", nodeValue("node-c", "192.0.2.3/24", "10.65.0.129"))
	check("a node deleted and another added (the same count)", false)

	// etcd restored from a copy older than what was held: the same keys, the block as it was
	// before its address was handed out, every revision lower.
	old := etcdtest.New(t)
	ocli := mustClient(t, store.ClientConfig{Endpoints: []string{old.Endpoint()}})
	put(t, ocli, store.NodePrefix+"node-a", nodeValue("node-a", "192.0.2.1/24", "10.65.0.1"))
	put(t, ocli, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.2/24", "10.65.0.65"))
	put(t, ocli, block, blockValue("10.65.0.64/26", "node-b"))
	put(t, ocli, store.AffinityPrefix+"node-a/ipv4/block/10.65.0.0-26", `{"state":"confirmed"}`)
	if got, _, err := store.Unchanged(ctx, ocli, kept); err != nil || got {
		t.Errorf("etcd restored from an older copy: unchanged %v, %v; want false", got, err)
	}
}
