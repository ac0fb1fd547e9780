package store_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

const (
	poolKey  = store.IPPoolPrefix + "pool-a"
	nodeKey  = store.NodePrefix + "node-a"
	blockKey = store.BlockPrefix + "ipv4/block/10.65.0.0-26"
	affKey   = store.AffinityPrefix + "node-a/ipv4/block/10.65.0.0-26"
	wepKey   = store.WorkloadEndpointPrefix + "default/node--a-k8s-web-eth0"
	svcKey   = store.ServicePrefix + "default/web"
	sliceKey = store.EndpointSlicePrefix + "default/web-abc"
)

// eventSummary renders events as "upsert Kind/ID" lines for comparison (in-syncs dropped).
func eventSummary(evs []store.Event) []string {
	var out []string
	for _, ev := range evs {
		if ev.Type == store.EventInSync {
			continue
		}
		out = append(out, ev.Type.String()+" "+ev.Kind.String()+"/"+ev.ID)
	}
	sort.Strings(out)
	return out
}

func TestIntakeInitialReadThenWatch(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	put(t, cli, poolKey, poolValue("pool-a", "10.65.0.0/16", "Always"))
	put(t, cli, nodeKey, nodeValue("node-a", "192.0.2.11/24", "10.65.0.1"))
	put(t, cli, blockKey, blockValue("10.65.0.0/26", "node-a", 0, 1))
	put(t, cli, affKey, `{"state":"confirmed","deleted":false}`)
	put(t, cli, wepKey, wepValue("default", "node--a-k8s-web-eth0", "node-a", "cali1234", "10.65.0.1/32"))
	put(t, cli, svcKey, serviceValue("default", "web", "10.96.0.10"))
	rev := put(t, cli, sliceKey, sliceValue("default", "web-abc", "web", "10.65.0.1", "node-a"))
	put(t, cli, "/calico/ipam/v2/handle/ignored", `{"block":{}}`) // not a watched prefix

	in, s, r := startIntake(t, cli)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })

	first := s.since(0)
	want := []string{
		"upsert Block/10.65.0.0/26", "upsert BlockAffinity/node-a/10.65.0.0/26", "upsert EndpointSlice/default/web-abc",
		"upsert IPPool/pool-a", "upsert Node/node-a", "upsert Service/default/web", "upsert WorkloadEndpoint/default/node--a-k8s-web-eth0",
	}
	if got := eventSummary(first); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("initial events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if last := first[len(first)-1]; last.Type != store.EventInSync || last.Revision < rev {
		t.Fatalf("last event = %+v, want in-sync at revision >= %d", last, rev)
	}
	s.checkCounts(t, in)
	snap := s.index.Snapshot()
	if !snap.InSync() || snap.Revision() < rev {
		t.Fatalf("index in sync %v at %d, want in sync at >= %d", snap.InSync(), snap.Revision(), rev)
	}
	if b := snap.BlocksOfNode("node-a"); len(b) != 1 || len(b[0].Allocations) != 2 {
		t.Fatalf("blocks of node-a = %+v", b)
	}
	if sl := snap.SlicesOfService("default/web"); len(sl) != 1 || sl[0].Endpoints[0].NodeName != "node-a" {
		t.Fatalf("slices of default/web = %+v", sl)
	}
	if len(r.badValues()) != 0 {
		t.Fatalf("bad values: %v", r.badValues())
	}

	// Watch: an update, a delete and a new key arrive as upsert, delete, upsert.
	n := s.count()
	put(t, cli, poolKey, poolValue("pool-a", "10.65.0.0/16", "CrossSubnet"))
	del(t, cli, wepKey)
	last := put(t, cli, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.12/24", "10.65.1.1"))
	want = []string{"delete WorkloadEndpoint/default/node--a-k8s-web-eth0", "upsert IPPool/pool-a", "upsert Node/node-b"}
	eventually(t, 10*time.Second, "watched events", func() bool {
		return in.Stats().Revision.Load() >= last && len(eventSummary(s.since(n))) >= len(want)
	})
	got := eventSummary(s.since(n))
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("watched events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	snap = s.index.Snapshot()
	if p := snap.Get(store.KindIPPool, "pool-a").(*store.IPPool); p.VXLANMode != store.EncapCrossSubnet {
		t.Fatalf("pool-a vxlanMode = %s, want CrossSubnet", p.VXLANMode)
	}
	if snap.Get(store.KindWorkloadEndpoint, "default/node--a-k8s-web-eth0") != nil {
		t.Fatal("deleted workload endpoint still in the index")
	}
	if in.Stats().Resyncs.Load() != 0 {
		t.Fatalf("resyncs = %d, want 0", in.Stats().Resyncs.Load())
	}
}

// TestIntakeCompactedWhileDisconnected cuts the intake off from etcd, changes keys every way
// a key can change, compacts, and reconnects: the intake must read again and emit exactly
// what changed.
func TestIntakeCompactedWhileDisconnected(t *testing.T) {
	writer, proxy, cli := behindProxy(t)

	keys := map[string]string{}
	for _, n := range []string{"stays", "changes", "vanishes", "recreated"} {
		k := store.NodePrefix + n
		keys[n] = k
		put(t, writer, k, nodeValue(n, "192.0.2.1/24", ""))
	}
	in, s, r := startIntake(t, cli)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })
	n := s.count()

	proxy.Cut()
	put(t, writer, keys["changes"], nodeValue("changes", "192.0.2.2/24", ""))
	del(t, writer, keys["vanishes"])
	del(t, writer, keys["recreated"])
	put(t, writer, keys["recreated"], nodeValue("recreated", "192.0.2.1/24", "")) // same value, new key version
	put(t, writer, store.NodePrefix+"appears", nodeValue("appears", "192.0.2.3/24", ""))
	put(t, writer, store.NodePrefix+"scratch", nodeValue("scratch", "192.0.2.4/24", ""))
	rev := del(t, writer, store.NodePrefix+"scratch") // born and gone while away: never seen
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := writer.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()

	eventually(t, 20*time.Second, "second in-sync", func() bool { return s.inSyncs() == 2 })
	got := eventSummary(s.since(n))
	want := []string{"delete Node/vanishes", "upsert Node/appears", "upsert Node/changes", "upsert Node/recreated"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events after reconnect:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if in.Stats().ResyncsBy[0].Load() < 1 { // store.CauseCompacted
		t.Fatalf("no resync counted as caused by compaction: %v", in.Stats().ResyncsBy[0].Load())
	}
	if in.Stats().Resyncs.Load() < 1 || in.Stats().Retries.Load() < 1 {
		t.Fatalf("resyncs %d retries %d, want both >= 1", in.Stats().Resyncs.Load(), in.Stats().Retries.Load())
	}
	r.mu.Lock()
	retries := r.retries
	r.mu.Unlock()
	if retries < 1 {
		t.Fatalf("reporter saw %d retries, want >= 1", retries)
	}
	snap := s.index.Snapshot()
	if got := snap.Count(store.KindNode); got != 4 {
		t.Fatalf("index holds %d nodes, want 4", got)
	}
	s.checkCounts(t, in) // deletes of what vanished under the compaction counted too
	if nd := snap.Get(store.KindNode, "changes").(*store.Node); nd.IPv4Address.String() != "192.0.2.2/24" {
		t.Fatalf("node changes has %s, want 192.0.2.2/24", nd.IPv4Address)
	}
	// And the watch works again.
	last := put(t, writer, keys["stays"], nodeValue("stays", "192.0.2.9/24", ""))
	eventually(t, 10*time.Second, "watch after resync", func() bool { return in.Stats().Revision.Load() >= last })
}

func TestIntakeSurvivesEtcdRestart(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	put(t, cli, poolKey, poolValue("pool-a", "10.65.0.0/16", "Always"))
	in, s, _ := startIntake(t, cli)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })

	srv.Stop()
	time.Sleep(300 * time.Millisecond) // the intake meets a dead etcd for a while
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	last := put(t, cli, nodeKey, nodeValue("node-a", "192.0.2.11/24", ""))
	eventually(t, 20*time.Second, "event after restart", func() bool {
		return s.index.Snapshot().Get(store.KindNode, "node-a") != nil
	})
	if in.Stats().Revision.Load() < last {
		t.Fatalf("revision %d, want >= %d", in.Stats().Revision.Load(), last)
	}
	if s.index.Snapshot().Get(store.KindIPPool, "pool-a") == nil {
		t.Fatal("pool-a lost across the restart")
	}
}

func TestIntakeThreeMemberFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (4 s): make test runs it")
	}
	cl := etcdtest.NewCluster(t, 3)
	cli := mustClient(t, store.ClientConfig{Endpoints: cl.Endpoints()})
	put(t, cli, poolKey, poolValue("pool-a", "10.65.0.0/16", "Always"))
	in, s, _ := startIntake(t, cli)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })

	// The client balances over every member, so each one is in use; stop the first, then
	// write through a client of another member only.
	cl.Members[0].Stop()
	other := mustClient(t, store.ClientConfig{Endpoints: []string{cl.Members[1].Endpoint()}})
	var last int64
	for i, name := range []string{"node-a", "node-b", "node-c"} {
		last = put(t, other, store.NodePrefix+name, nodeValue(name, "192.0.2.1"+string(rune('1'+i))+"/24", ""))
	}
	eventually(t, 20*time.Second, "events through the other members", func() bool {
		return s.index.Snapshot().Count(store.KindNode) == 3
	})
	if in.Stats().Revision.Load() < last {
		t.Fatalf("revision %d, want >= %d", in.Stats().Revision.Load(), last)
	}
}

func TestIntakeBadValues(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	put(t, cli, store.IPPoolPrefix+"broken-json", `{"spec":`)
	put(t, cli, store.IPPoolPrefix+"bad-cidr", poolValue("bad-cidr", "10.300.0.0/16", "Always"))
	put(t, cli, store.IPPoolPrefix+"bad-mode", poolValue("bad-mode", "10.66.0.0/16", "Sometimes"))
	put(t, cli, store.IPPoolPrefix+"wrong-kind", nodeValue("wrong-kind", "192.0.2.1/24", ""))
	put(t, cli, store.IPPoolPrefix+"good", poolValue("good", "10.65.0.0/16", "Always"))
	in, s, r := startIntake(t, cli)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })

	bad := r.badValues()
	var got []string
	for _, b := range bad {
		got = append(got, b.Key[len(store.IPPoolPrefix):]+" "+b.Field)
	}
	sort.Strings(got)
	want := []string{"bad-cidr spec.cidr", "bad-mode spec.vxlanMode", "broken-json ", "wrong-kind kind"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("reported %q, want %q", got, want)
	}
	for _, b := range bad {
		if !strings.Contains(b.Error(), b.Key) {
			t.Fatalf("error %q does not name its key", b.Error())
		}
	}
	if in.Stats().BadValues.Load() != 4 || s.index.Snapshot().Count(store.KindIPPool) != 1 {
		t.Fatalf("bad values %d, pools %d; want 4 and 1", in.Stats().BadValues.Load(), s.index.Snapshot().Count(store.KindIPPool))
	}

	// A bad value that becomes valid is picked up; a valid one that turns bad is deleted.
	n := s.count()
	put(t, cli, store.IPPoolPrefix+"bad-mode", poolValue("bad-mode", "10.66.0.0/16", "CrossSubnet"))
	last := put(t, cli, store.IPPoolPrefix+"good", poolValue("good", "10.65.0.0/16", "Often"))
	eventually(t, 10*time.Second, "fix and breakage", func() bool { return in.Stats().Revision.Load() >= last })
	if got := eventSummary(s.since(n)); strings.Join(got, "|") != "delete IPPool/good|upsert IPPool/bad-mode" {
		t.Fatalf("events %q", got)
	}
	if len(r.badValues()) != 5 {
		t.Fatalf("%d reports, want 5 (each bad version once)", len(r.badValues()))
	}
	// Deleting a key that was never valid emits nothing.
	n = s.count()
	del(t, cli, store.IPPoolPrefix+"wrong-kind")
	last = put(t, cli, store.IPPoolPrefix+"marker", poolValue("marker", "10.67.0.0/16", "Never"))
	eventually(t, 10*time.Second, "marker", func() bool { return in.Stats().Revision.Load() >= last })
	if got := eventSummary(s.since(n)); strings.Join(got, "|") != "upsert IPPool/marker" {
		t.Fatalf("events %q", got)
	}
	s.checkCounts(t, in) // values turned bad and back counted as they went
}

func TestIntakeTLSAndAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (5 s): make test runs it")
	}
	files, err := etcdtest.WriteTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := etcdtest.Start(etcdtest.Options{TLS: files})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if err := etcdtest.EnableAuth(srv, "s3cret"); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"ETCDCTL_ENDPOINTS": srv.Endpoint(),
		"ETCDCTL_CACERT":    files.CAFile,
		"ETCDCTL_CERT":      files.ClientCertFile,
		"ETCDCTL_KEY":       files.ClientKeyFile,
		"ETCDCTL_USER":      "root:s3cret",
	}
	cfg := store.ClientConfig{}.WithEnv(func(k string) string { return env[k] })
	cli := mustClient(t, cfg)
	put(t, cli, poolKey, poolValue("pool-a", "10.65.0.0/16", "Always"))
	_, s, _ := startIntake(t, cli)
	eventually(t, 10*time.Second, "in-sync over TLS with auth", func() bool { return s.inSyncs() == 1 })
	if s.index.Snapshot().Get(store.KindIPPool, "pool-a") == nil {
		t.Fatal("pool-a not read over TLS")
	}

	wrong := cfg
	wrong.Password = "nope"
	wrong.DialTimeout = 2 * time.Second
	if c, err := wrong.New(); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err = c.Get(ctx, poolKey)
		cancel()
		c.Close()
		if err == nil {
			t.Fatal("a wrong password was accepted")
		}
	}
	noCert := cfg
	noCert.Cert, noCert.Key = "", ""
	if c, err := noCert.New(); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = c.Get(ctx, poolKey)
		cancel()
		c.Close()
		if err == nil {
			t.Fatal("a client without a certificate was accepted")
		}
	}
}

// TestIntakeLostLeader leaves the intake's only member without a leader: the watch must end
// (WithRequireLeader), the intake retry with bounded, growing backoff, and once quorum is back
// read again and carry on.
func TestIntakeLostLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (6 s): make test runs it")
	}
	cl := etcdtest.NewCluster(t, 3)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{cl.Members[2].Endpoint()}})
	put(t, cli, poolKey, poolValue("pool-a", "10.65.0.0/16", "Always"))
	s, r := newSink(), &delayReporter{}
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: s, Reporter: r, RequestTimeout: 300 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 160 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runIntake(t, in)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })

	cl.Members[0].Stop()
	cl.Members[1].Stop()
	eventually(t, 20*time.Second, "several retries without a leader", func() bool { return in.Stats().Retries.Load() >= 5 })
	if in.Stats().InSync.Load() {
		t.Fatal("intake claims to be in sync with a member that has no leader")
	}
	for _, m := range cl.Members[:2] {
		if err := m.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	last := put(t, cli, nodeKey, nodeValue("node-a", "192.0.2.11/24", ""))
	eventually(t, 30*time.Second, "in sync again with the new node", func() bool {
		return in.Stats().InSync.Load() && s.index.Snapshot().Get(store.KindNode, "node-a") != nil
	})
	if in.Stats().Revision.Load() < last || in.Stats().Resyncs.Load() < 1 {
		t.Fatalf("revision %d resyncs %d, want >= %d and >= 1", in.Stats().Revision.Load(), in.Stats().Resyncs.Load(), last)
	}
	delays := r.get()
	for i, d := range delays {
		if d > 160*time.Millisecond || d < 10*time.Millisecond {
			t.Fatalf("retry %d waited %v, want between MinBackoff/2 and MaxBackoff", i, d)
		}
	}
	if len(delays) >= 5 && delays[4] <= delays[0] {
		t.Fatalf("backoff does not grow: %v", delays)
	}
}

type delayReporter struct {
	mu     sync.Mutex
	delays []time.Duration
}

func (r *delayReporter) BadValue(*store.BadValueError) {}
func (r *delayReporter) Silent(time.Duration)          {}
func (r *delayReporter) Heard(time.Duration)           {}
func (r *delayReporter) Retry(err error, _ int, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.delays = append(r.delays, d)
}
func (r *delayReporter) get() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.delays...)
}

// TestIntakeNodePrefixes: an intake on store.NodePrefixes reads and follows its own node's
// block affinities and none of another node's (node-ab's prefix shares node-a's start), while
// blocks of every node still arrive.
func TestIntakeNodePrefixes(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	aff := `{"state":"confirmed","deleted":false}`
	put(t, cli, blockKey, blockValue("10.65.0.0/26", "node-a"))
	put(t, cli, store.BlockPrefix+"ipv4/block/10.65.0.64-26", blockValue("10.65.0.64/26", "node-b"))
	put(t, cli, affKey, aff)
	put(t, cli, store.AffinityPrefix+"node-b/ipv4/block/10.65.0.64-26", aff)
	put(t, cli, store.AffinityPrefix+"node-ab/ipv4/block/10.65.0.128-26", aff)

	s := newSink()
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: s, Prefixes: store.NodePrefixes("node-a"), PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	runIntake(t, in)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })
	want := []string{"upsert Block/10.65.0.0/26", "upsert Block/10.65.0.64/26", "upsert BlockAffinity/node-a/10.65.0.0/26"}
	if got := eventSummary(s.since(0)); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("initial events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	n := s.count()
	// Another node's affinity delivers nothing, but the intake's revision passes it (or
	// `sluicectl status` would call this node lagging behind a key it does not read).
	rev := put(t, cli, store.AffinityPrefix+"node-b/ipv4/block/10.65.1.0-26", aff)
	eventually(t, 10*time.Second, "the revision past node-b's affinity", func() bool { return in.Stats().Revision.Load() >= rev })
	put(t, cli, store.AffinityPrefix+"node-a/ipv4/block/10.65.1.64-26", aff)
	eventually(t, 10*time.Second, "node-a's new affinity", func() bool { return s.count() > n })
	time.Sleep(100 * time.Millisecond) // anything else would have arrived by now
	want = []string{"upsert BlockAffinity/node-a/10.65.1.64/26"}
	if got := eventSummary(s.since(n)); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("watched events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestIntakeShrinksPagesTooLargeForOneMessage: with a client that takes at most 16 KiB in
// one message and blocks of about 1.3 KiB, a page of 100 keys is too large; the intake asks
// again with fewer keys and still reads everything.
func TestIntakeShrinksPagesTooLargeForOneMessage(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	var used []int
	for i := range 64 {
		used = append(used, i)
	}
	for i := range 60 {
		cidr := fmt.Sprintf("10.65.%d.0/26", i)
		put(t, cli, store.BlockKey(netip.MustParsePrefix(cidr)), blockValue(cidr, "node-a", used...))
	}
	small, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 2 * time.Second, MaxCallRecvMsgSize: 16 << 10, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	s := newSink()
	in, err := store.NewIntake(store.IntakeConfig{Client: small, Handler: s, PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	runIntake(t, in)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })
	if n := len(eventSummary(s.since(0))); n != 60 {
		t.Fatalf("%d blocks read, want 60", n)
	}
	if in.Stats().PageShrinks.Load() == 0 || in.Stats().Retries.Load() != 0 {
		t.Fatalf("page shrinks %d, retries %d: want some shrinks and no retries", in.Stats().PageShrinks.Load(), in.Stats().Retries.Load())
	}
}

// TestIntakeNoticesSilence: a link that goes silent (nothing closed, nothing answered)
// leaves the watch open; the intake notices within its liveness time, says it is no longer
// in sync (once), keeps what it holds, and once the link is back catches up from its
// revision (no resync) with what changed meanwhile.
func TestIntakeNoticesSilence(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (6 s): make test runs it")
	}
	writer, proxy, cli := behindProxy(t)
	put(t, writer, nodeKey, nodeValue("node-a", "192.0.2.11/24", ""))
	s, r := newSink(), &reporter{}
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: s, Reporter: r, Liveness: time.Second,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runIntake(t, in)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })

	// A quiet but healthy etcd is not silence: progress notifications answer.
	time.Sleep(3 * time.Second)
	if !in.Stats().InSync.Load() || in.Stats().Silences.Load() != 0 {
		t.Fatalf("a quiet etcd: in sync %v, %d silences; want in sync, none", in.Stats().InSync.Load(), in.Stats().Silences.Load())
	}

	proxy.Silence()
	cutAt := time.Now()
	eventually(t, 30*time.Second, "the silence noticed", func() bool { return !in.Stats().InSync.Load() })
	t.Logf("silence noticed after %v (liveness 1s)", time.Since(cutAt).Round(time.Millisecond))
	if !in.Stats().Silent.Load() || in.Stats().Silences.Load() != 1 {
		t.Fatalf("silent %v, %d silences; want set, 1", in.Stats().Silent.Load(), in.Stats().Silences.Load())
	}
	last := put(t, writer, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.12/24", ""))
	time.Sleep(2 * time.Second) // longer silence: still reported once
	if sil, _ := r.outages(); sil != 1 {
		t.Fatalf("the silence was reported %d times; want once", sil)
	}
	if s.index.Snapshot().Get(store.KindNode, "node-a") == nil {
		t.Fatal("node-a lost during the silence")
	}

	proxy.Restore()
	backAt := time.Now()
	eventually(t, 20*time.Second, "in sync again with node-b", func() bool {
		return in.Stats().InSync.Load() && s.index.Snapshot().Get(store.KindNode, "node-b") != nil
	})
	t.Logf("caught up %v after the link came back", time.Since(backAt).Round(time.Millisecond))
	if sil, heard := r.outages(); sil != 1 || heard != 1 {
		t.Fatalf("reported %d silences and %d recoveries; want 1 and 1", sil, heard)
	}
	if in.Stats().Resyncs.Load() != 0 || in.Stats().Revision.Load() < last || in.Stats().Silent.Load() {
		t.Fatalf("resyncs %d, revision %d (want >= %d), silent %v: want a catch-up from the revision",
			in.Stats().Resyncs.Load(), in.Stats().Revision.Load(), last, in.Stats().Silent.Load())
	}
}

// silenceOnSync silences a proxy when the first in-sync reaches it, before the intake opens
// its watch.
type silenceOnSync struct {
	store.Handler
	proxy *etcdtest.Proxy
	once  sync.Once
}

func (h *silenceOnSync) OnEvents(batch []store.Event) {
	h.Handler.OnEvents(batch)
	if batch[len(batch)-1].Type == store.EventInSync {
		h.once.Do(h.proxy.Silence)
	}
}

// TestIntakeNoticesSilenceAtWatchStart: a link that goes silent between the read and the
// watch's creation (etcd confirms a new watch before the client hands it over) is noticed
// within the liveness time too; the watch opens once the link is back, without a resync.
func TestIntakeNoticesSilenceAtWatchStart(t *testing.T) {
	writer, proxy, cli := behindProxy(t)
	put(t, writer, nodeKey, nodeValue("node-a", "192.0.2.11/24", ""))
	s, r := newSink(), &reporter{}
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: &silenceOnSync{Handler: s, proxy: proxy}, Reporter: r,
		Liveness: time.Second, Prefixes: store.NodePrefixes("node-a"), MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runIntake(t, in)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })
	cutAt := time.Now()
	eventually(t, 10*time.Second, "the silence noticed", func() bool { return in.Stats().Silent.Load() })
	t.Logf("silence noticed after %v (liveness 1s)", time.Since(cutAt).Round(time.Millisecond))
	if in.Stats().InSync.Load() {
		t.Fatal("silent, yet in sync")
	}
	last := put(t, writer, store.NodePrefix+"node-b", nodeValue("node-b", "192.0.2.12/24", ""))
	proxy.Restore()
	eventually(t, 20*time.Second, "in sync again with node-b", func() bool {
		return in.Stats().InSync.Load() && s.index.Snapshot().Get(store.KindNode, "node-b") != nil
	})
	if sil, heard := r.outages(); sil != 1 || heard != 1 {
		t.Fatalf("reported %d silences and %d recoveries; want 1 and 1", sil, heard)
	}
	if in.Stats().Resyncs.Load() != 0 || in.Stats().Revision.Load() < last {
		t.Fatalf("resyncs %d, revision %d (want >= %d): want the watch opened from the read's revision",
			in.Stats().Resyncs.Load(), in.Stats().Revision.Load(), last)
	}
}

// TestWatchSpans: one watch per root, from its least prefix to the end of its greatest, in
// the order the roots first appear; every prefix inside its root's span.
func TestWatchSpans(t *testing.T) {
	got := store.WatchSpans([]string{"/calico/b/", "/sluice/x/", "/calico/a/", "/calico/c/d/", "/other"})
	want := []store.Span{{"/calico/a/", "/calico/c/d0"}, {"/sluice/x/", "/sluice/x0"}, {"/other", "/othes"}}
	if !slices.Equal(got, want) {
		t.Errorf("spans %q, want %q", got, want)
	}
	prefixes := store.NodePrefixes("node-a")
	spans := store.WatchSpans(prefixes)
	if len(spans) != 2 {
		t.Errorf("sluice's prefixes watched through %d spans, want 2 (/calico/, /sluice/): %q", len(spans), spans)
	}
	for _, p := range prefixes {
		if !slices.ContainsFunc(spans, func(s store.Span) bool { return s.Start <= p && p < s.End }) {
			t.Errorf("prefix %s in no span of %q", p, spans)
		}
	}
}

// behindProxy starts etcd with a writer on it directly, and a client through a TCP proxy the
// test can cut.
func behindProxy(t *testing.T) (*clientv3.Client, *etcdtest.Proxy, *clientv3.Client) {
	t.Helper()
	srv := etcdtest.New(t)
	writer := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	proxy, err := etcdtest.NewProxy(srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	return writer, proxy, mustClient(t, store.ClientConfig{Endpoints: []string{proxy.Endpoint()}})
}

// gatedSink is a sink whose handler waits at the gate while it is closed, recording the size
// of each batch it is handed.
type gatedSink struct {
	*sink
	gate    chan struct{} // closed: open
	held    chan struct{} // closed once the handler waits
	heldOne sync.Once
	sizes   []int
}

func (g *gatedSink) OnEvents(b []store.Event) {
	if b[0].Type != store.EventInSync {
		g.heldOne.Do(func() { close(g.held) })
		<-g.gate
	}
	g.sink.mu.Lock()
	g.sizes = append(g.sizes, len(b))
	g.sink.mu.Unlock()
	g.sink.OnEvents(b)
}

// TestIntakeBatchesWaitingAnswers: watch answers that wait while the consumers work (a bulk
// apply writing faster than sluiced handles) reach them in one batch, in revision order, not
// one batch each: each batch costs calc and the stages once (BenchmarkServicesArriving in
// cmd/sluiced). An answer that arrives alone is delivered at once.
func TestIntakeBatchesWaitingAnswers(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	g := &gatedSink{sink: newSink(), gate: make(chan struct{}), held: make(chan struct{})}
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: g, Reporter: &reporter{}})
	if err != nil {
		t.Fatal(err)
	}
	runIntake(t, in)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return g.inSyncs() == 1 })

	put(t, cli, store.ServicePrefix+"default/svc-0", serviceValue("default", "svc-0", "10.96.0.1"))
	select {
	case <-g.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the first change never reached the handler")
	}
	const n = 60
	var last int64
	for i := 1; i <= n; i++ {
		last = put(t, cli, fmt.Sprintf("%sdefault/svc-%d", store.ServicePrefix, i), serviceValue("default", fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.96.0.%d", i+1)))
	}
	time.Sleep(200 * time.Millisecond) // the answers reach the client
	close(g.gate)
	eventually(t, 10*time.Second, "every change delivered", func() bool { return g.count() == 1+1+n })

	g.sink.mu.Lock()
	sizes := slices.Clone(g.sizes)
	g.sink.mu.Unlock()
	if sizes[1] != 1 {
		t.Errorf("the first change came in a batch of %d; want alone", sizes[1])
	}
	t.Logf("batches after the first change: %v", sizes[2:])
	if len(sizes) > 2+n/4 {
		t.Errorf("%d changes that waited came in %d batches (%v); want a few", n, len(sizes)-2, sizes[2:])
	}
	evs := g.since(2)
	for i, ev := range evs {
		if want := fmt.Sprintf("%sdefault/svc-%d", store.ServicePrefix, i+1); ev.Key != want {
			t.Fatalf("event %d is %s; want %s (revision order)", i, ev.Key, want)
		}
	}
	if evs[len(evs)-1].Revision != last {
		t.Errorf("the last event's revision is %d; want %d", evs[len(evs)-1].Revision, last)
	}
}

// sizedSink records the size and arrival time of each batch it is handed.
type sizedSink struct {
	*sink
	sizes []int
	at    []time.Time
}

func (s *sizedSink) OnEvents(b []store.Event) {
	s.sink.mu.Lock()
	s.sizes = append(s.sizes, len(b))
	s.at = append(s.at, time.Now())
	s.sink.mu.Unlock()
	s.sink.OnEvents(b)
}

// TestIntakeHoldsBatchesWhileBusy: writes that keep coming, each answered before the next is
// made (a bulk apply's steady stream reaching a consumer fast enough never to fall behind),
// reach the consumer a few at a time, not one batch each; the first write after a quiet
// spell is delivered alone (its delay after the write is logged, not asserted: a loaded
// machine's scheduling would decide a bound).
func TestIntakeHoldsBatchesWhileBusy(t *testing.T) {
	srv := etcdtest.New(t)
	cli := mustClient(t, store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	s := &sizedSink{sink: newSink()}
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: s, Reporter: &reporter{}})
	if err != nil {
		t.Fatal(err)
	}
	runIntake(t, in)
	eventually(t, 10*time.Second, "first in-sync", func() bool { return s.inSyncs() == 1 })

	// A steady stream: each write committed (and so on its way to the watch) before the next.
	// The intake holds a batch open only while answers keep coming (one within 5 ms of the
	// last delivery): a write that returned more than that after the one before (a loaded
	// machine's etcd) starts a batch of its own, rightly, so the bound counts those apart.
	const n, busyWithin = 100, 5 * time.Millisecond
	quiet := 0 // writes that returned more than busyWithin after the one before
	var last time.Time
	for i := range n {
		put(t, cli, fmt.Sprintf("%sdefault/svc-%d", store.ServicePrefix, i), serviceValue("default", fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.96.0.%d", i+1)))
		if now := time.Now(); i > 0 && now.Sub(last) > busyWithin {
			quiet++
		}
		last = time.Now()
		time.Sleep(500 * time.Microsecond)
	}
	eventually(t, 10*time.Second, "every change delivered", func() bool { return s.count() == 1+n })
	s.sink.mu.Lock()
	batches := len(s.sizes) - 1 // after the in-sync
	s.sink.mu.Unlock()
	t.Logf("%d writes in a stream came in %d batches (%d of the writes returned more than %v after the one before)", n, batches, quiet, busyWithin)
	if quiet > n/2 {
		t.Logf("etcd answered more than half the writes slower than a stream: the hold is not measured here")
	} else if want := quiet + (n-quiet)/2; batches > want {
		// Held, a stream comes in 28-35 batches here (two to four writes a batch, by how the
		// writes fall against the holds); without the hold, in one a write (100). At most
		// one a batch on average for every two writes tells them apart with room for a loaded
		// machine (a third was too tight: 34 and 35 batches, quiet and under make test).
		t.Errorf("%d writes in a stream came in %d batches; want them held together, at most %d (two or more a batch, and one for each of the %d slow writes)",
			n, batches, want, quiet)
	}
	for i, ev := range s.since(1) {
		if want := fmt.Sprintf("%sdefault/svc-%d", store.ServicePrefix, i); ev.Key != want {
			t.Fatalf("event %d is %s; want %s (revision order)", i, ev.Key, want)
		}
	}

	// After a quiet spell: alone, and not held.
	time.Sleep(100 * time.Millisecond)
	written := time.Now()
	put(t, cli, store.ServicePrefix+"default/after-quiet", serviceValue("default", "after-quiet", "10.96.1.1"))
	eventually(t, 10*time.Second, "the change after a quiet spell", func() bool { return s.count() == 2+n })
	s.sink.mu.Lock()
	size, at := s.sizes[len(s.sizes)-1], s.at[len(s.at)-1]
	s.sink.mu.Unlock()
	t.Logf("the change after a quiet spell: delivered %v after its write returned", at.Sub(written))
	if size != 1 {
		t.Errorf("the change after a quiet spell came in a batch of %d; want alone", size)
	}
}
