package store_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestMain(m *testing.M) {
	if etcdtest.ServeChild() {
		return
	}
	code := m.Run()
	closeBenchEtcd()
	os.Exit(code)
}

// sink records every event the intake delivers and feeds an index.
type sink struct {
	mu     sync.Mutex
	events []store.Event
	index  *store.Index
}

func newSink() *sink { return &sink{index: store.NewIndex()} }

// checkCounts fails unless the intake's object counts are what the index holds, kind by kind.
func (s *sink) checkCounts(t *testing.T, in *store.Intake) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := s.index.Snapshot()
	for _, k := range store.Kinds {
		if got, want := in.Stats().Objects(k), snap.Count(k); got != want {
			t.Errorf("the intake counts %d %s, the index holds %d", got, k.Plural(), want)
		}
	}
}

func (s *sink) OnEvents(b []store.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range b {
		ev.Value = append([]byte(nil), ev.Value...)
		s.events = append(s.events, ev)
	}
	s.index.OnEvents(b)
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.events)
}

// since returns the events delivered after the first n.
func (s *sink) since(n int) []store.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]store.Event(nil), s.events[n:]...)
}

func (s *sink) inSyncs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ev := range s.events {
		if ev.Type == store.EventInSync {
			n++
		}
	}
	return n
}

// reporter collects rejected values and retries.
type reporter struct {
	mu       sync.Mutex
	bad      []*store.BadValueError
	retries  int
	silences []time.Duration
	heard    []time.Duration
}

func (r *reporter) Silent(quiet time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.silences = append(r.silences, quiet)
}

func (r *reporter) Heard(outage time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heard = append(r.heard, outage)
}

func (r *reporter) outages() (silences, heard int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.silences), len(r.heard)
}

func (r *reporter) BadValue(err *store.BadValueError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bad = append(r.bad, err)
}

func (r *reporter) Retry(error, int, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retries++
}

func (r *reporter) badValues() []*store.BadValueError {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*store.BadValueError(nil), r.bad...)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startIntake runs an intake on cli into a new sink until the test ends.
func startIntake(t *testing.T, cli *clientv3.Client) (*store.Intake, *sink, *reporter) {
	t.Helper()
	s, r := newSink(), &reporter{}
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: s, Reporter: r, PageSize: 3,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runIntake(t, in)
	return in, s, r
}

// runIntake runs in until the returned stop is called or the test ends.
func runIntake(t *testing.T, in *store.Intake) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = in.Run(ctx) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

func mustClient(t *testing.T, cfg store.ClientConfig) *clientv3.Client {
	t.Helper()
	cfg.DialTimeout = 2 * time.Second
	cli, err := cfg.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func put(t *testing.T, cli *clientv3.Client, key, value string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Put(ctx, key, value)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

func del(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Delete(ctx, key)
	if err != nil {
		t.Fatalf("delete %s: %v", key, err)
	}
	return resp.Header.Revision
}

// Sample values, one per kind, in Calico's and sluice's stored formats.
func poolValue(name, cidr, vxlan string) string {
	return fmt.Sprintf(`{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"cidr":%q,"vxlanMode":%q,"ipipMode":"Never","natOutgoing":true,"blockSize":26}}`, name, cidr, vxlan)
}

func nodeValue(name, addr, tunnel string) string {
	return fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"bgp":{"ipv4Address":%q},"ipv4VXLANTunnelAddr":%q,"vxlanTunnelMACAddr":"66:c1:a0:00:00:0a"}}`, name, addr, tunnel)
}

func blockValue(cidr, node string, used ...int) string {
	alloc := make([]string, 64)
	for i := range alloc {
		alloc[i] = "null"
	}
	attrs := ""
	for j, u := range used {
		alloc[u] = fmt.Sprint(j)
		if j > 0 {
			attrs += ","
		}
		attrs += fmt.Sprintf(`{"handle_id":"h%d","secondary":{"node":%q}}`, u, node)
	}
	a := "["
	for i, s := range alloc {
		if i > 0 {
			a += ","
		}
		a += s
	}
	a += "]"
	return fmt.Sprintf(`{"cidr":%q,"affinity":"host:%s","strictAffinity":false,"allocations":%s,"unallocated":[],"attributes":[%s],"deleted":false,"sequenceNumber":1,"sequenceNumberForAllocation":{}}`, cidr, node, a, attrs)
}

func wepValue(ns, name, node, iface, ip string) string {
	return fmt.Sprintf(`{"kind":"WorkloadEndpoint","apiVersion":"projectcalico.org/v3","metadata":{"name":%q,"namespace":%q},"spec":{"orchestrator":"k8s","node":%q,"interfaceName":%q,"ipNetworks":[%q]}}`, name, ns, node, iface, ip)
}

func serviceValue(ns, name, clusterIP string) string {
	return fmt.Sprintf(`{"kind":"Service","apiVersion":"v1","metadata":{"name":%q,"namespace":%q},"spec":{"type":"NodePort","clusterIPs":[%q],"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080,"nodePort":30080}],"externalTrafficPolicy":"Local"}}`, name, ns, clusterIP)
}

func sliceValue(ns, name, svc, ip, node string) string {
	return fmt.Sprintf(`{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"name":%q,"namespace":%q,"labels":{"kubernetes.io/service-name":%q}},"addressType":"IPv4","endpoints":[{"addresses":[%q],"conditions":{"ready":true},"nodeName":%q}],"ports":[{"name":"http","protocol":"TCP","port":8080}]}`, name, ns, svc, ip, node)
}
