package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/cmd/internal/agentconfig"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	"github.com/sluice-net/sluice/store/ipam"
	"github.com/sluice-net/sluice/store/manifest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseFlagsDefaults(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skipf("no hostname: %v", err)
	}
	var stderr bytes.Buffer
	c, err := agentconfig.Parse(nil, envOf(nil), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	want := &agentconfig.Config{
		Etcd:           store.ClientConfig{Endpoints: []string{store.DefaultEndpoint}},
		NodeName:       strings.ToLower(host),
		LogLevel:       "info",
		StateFile:      "/var/lib/sluice/desired-state",
		Calc:           calc.DefaultConfig(strings.ToLower(host)),
		Dataplane:      true,
		HealthListen:   "127.0.0.1:9097",
		StatusTTL:      15 * time.Second,
		EtcdLiveness:   10 * time.Second,
		EtcdWatchStall: time.Hour,
		DP: dataplane.Config{Routes: dataplane.RouteTableConfig{Table: 254, Protocol: dataplane.DefaultRouteProtocol, Nexthops: true, NodeName: strings.ToLower(host)},
			VXLAN:   dataplane.VXLANConfig{Name: "vxlan.sluice", VNI: dataplane.DefaultVNI, Port: dataplane.DefaultVXLANPort},
			VXLANv6: dataplane.VXLANConfig{Name: "vxlan-v6.sluice"}, ResyncInterval: 90 * time.Second},
		Services:          true,
		BGPSecretsDir:     "/etc/sluice/bgp-secrets",
		ProxyHealthListen: "0.0.0.0:10256",
		BPF: bpf.StageConfig{PinDir: "/sys/fs/bpf/sluice", Sizes: bpf.DefaultMapSizes, Timeouts: bpf.DefaultTimeouts,
			CleanupInterval: 10 * time.Second, ResyncInterval: 90 * time.Second, Attach: bpf.AttachAuto,
			TunnelDevices: []string{"vxlan.sluice", "vxlan-v6.sluice"}, ReservePorts: [2]uint16{30000, 32767},
			Services: bpf.Config{NodeName: strings.ToLower(host), VXLANPort: bpf.DefaultVXLANPort, VNI: bpf.DefaultVNI,
				PSNATMin: bpf.DefaultPSNATMin, PSNATMax: bpf.DefaultPSNATMax}},
	}
	if got := c.BPF.HostInterfaces.String(); got != bpf.DefaultHostInterfaces {
		t.Errorf("host interfaces: %q, want %q", got, bpf.DefaultHostInterfaces)
	}
	want.BPF.HostInterfaces = c.BPF.HostInterfaces // compiled from the pattern checked above
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n%+v\nwant\n%+v", *c, *want)
	}
}

func TestParseFlagsFlagBeatsEnv(t *testing.T) {
	env := envOf(map[string]string{
		"SLUICE_NODE_NAME":      "env-node",
		"SLUICE_LOG_FORMAT":     "console",
		"SLUICE_LOG_LEVEL":      "warn",
		"SLUICE_ETCD_ENDPOINTS": "http://192.0.2.1:2379,http://192.0.2.2:2379",
	})
	var stderr bytes.Buffer
	c, err := agentconfig.Parse(nil, env, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "env-node" || c.LogFormat != "console" || c.LogLevel != "warn" ||
		!slices.Equal(c.Etcd.Endpoints, []string{"http://192.0.2.1:2379", "http://192.0.2.2:2379"}) {
		t.Errorf("from the environment: %+v", *c)
	}
	c, err = agentconfig.Parse([]string{"--node-name", "flag-node", "--log-format", "json", "--log-level", "debug",
		"--etcd-endpoints", "http://198.51.100.1:2379", "--record", "/tmp/events.jsonl"}, env, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "flag-node" || c.LogFormat != "json" || c.LogLevel != "debug" || c.Record != "/tmp/events.jsonl" ||
		!slices.Equal(c.Etcd.Endpoints, []string{"http://198.51.100.1:2379"}) {
		t.Errorf("flags and environment: %+v", *c)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"--log-format", "xml"}, nil, []string{"option log-format", "flag --log-format", `"xml"`, "json, console"}},
		{nil, map[string]string{"SLUICE_LOG_FORMAT": "text"}, []string{"option log-format", "environment SLUICE_LOG_FORMAT", `"text"`, "json, console"}},
		{[]string{"--log-level", "verbose"}, nil, []string{"option log-level", `"verbose"`, "debug, info, warn or error"}},
		{nil, map[string]string{"SLUICE_LOG_LEVEL": "loud"}, []string{"option log-level", `"loud"`, "debug, info, warn or error"}},
		{[]string{"--vxlan-vni", "0"}, nil, []string{"option vxlan-vni", "1 to 16777215"}},
		{[]string{"--route-protocol", "2"}, nil, []string{"option route-protocol", "3 to 255"}},
		{[]string{"--route-table", "255"}, nil, []string{"option route-table", "the local table"}},
		{[]string{"--resync-interval", "5ms"}, nil, []string{"option resync-interval", "at least 1s"}},
		{[]string{"--etcd-watch-stall", "5ms"}, nil, []string{"option etcd-watch-stall", "0, or a duration of at least 1s"}},
		{[]string{"--node-address", "node-a"}, nil, []string{"option node-address", "an IP address"}},
		{[]string{"--vxlan=maybe"}, nil, []string{"option vxlan", "true or false"}},
		{[]string{"--config", "/does/not/exist.yaml"}, nil, []string{"reading configuration file"}},
		{[]string{"--node-name", "a", "node-b"}, nil, []string{`unexpected argument "node-b"`}},
		{[]string{"--colour"}, nil, []string{"flag provided but not defined: -colour"}},
		{[]string{"--vxlan-device-v6", "vxlan.sluice"}, nil, []string{"options vxlan-device and vxlan-device-v6 both name", `"vxlan.sluice"`}},
	} {
		var stderr bytes.Buffer
		c, err := agentconfig.Parse(tc.args, envOf(tc.env), &stderr)
		if err == nil {
			t.Errorf("agentconfig.Parse(%q, %v) = %+v, want an error", tc.args, tc.env, *c)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("agentconfig.Parse(%q, %v): %v; want it to contain %q", tc.args, tc.env, err, w)
			}
		}
	}
	var stderr bytes.Buffer
	if _, err := agentconfig.Parse([]string{"-h"}, envOf(nil), &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "-node-name") {
		t.Errorf("-h: %v, usage %q; want flag.ErrHelp and the flags listed", err, stderr.String())
	}
}

func TestNewLogger(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	log := newLogger(&agentconfig.Config{NodeName: "node-a", LogLevel: "warn"}, f)
	log.Info().Msg("quiet")
	log.Warn().Str("key", "k").Msg("loud")
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	lines := parseLines(t, b)
	if len(lines) != 1 || lines[0]["message"] != "loud" || lines[0]["node"] != "node-a" || lines[0]["level"] != "warn" || lines[0]["time"] == nil {
		t.Errorf("a file gets JSON at level warn with the node and time; got\n%s", b)
	}
}

// parseLines decodes JSON log lines.
func parseLines(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line is not JSON: %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// logBuffer is a log destination the agent's goroutines write while the test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) lines(t *testing.T) []map[string]any {
	b.mu.Lock()
	raw := bytes.Clone(b.buf.Bytes())
	b.mu.Unlock()
	return parseLines(t, raw)
}

// matching returns the lines with the message msg whose string fields include fields.
func (b *logBuffer) matching(t *testing.T, msg string, fields map[string]string) []map[string]any {
	var out []map[string]any
	for _, l := range b.lines(t) {
		if l["message"] != msg {
			continue
		}
		ok := true
		for k, v := range fields {
			ok = ok && l[k] == v
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// waitFor waits until a line with msg and fields appears and returns it.
func (b *logBuffer) waitFor(t *testing.T, msg string, fields map[string]string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ls := b.matching(t, msg, fields); len(ls) > 0 {
			return ls[0]
		}
		if time.Now().After(deadline) {
			b.mu.Lock()
			defer b.mu.Unlock()
			t.Fatalf("no log line %q with %v after 10s; log:\n%s", msg, fields, b.buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestReporterRateLimitsRetries(t *testing.T) {
	for _, tc := range []struct {
		name    string
		attempt func(i int) int
	}{
		// One outage: attempts count up.
		{"outage", func(i int) int { return i }},
		// A flapping etcd: every list succeeds and every watch then breaks, so each retry
		// is the first since a success.
		{"flapping", func(int) int { return 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			r := newReporter(zerolog.New(&buf))
			t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			now := t0
			r.now = func() time.Time { return now }
			errLost := errors.New("watch lost: etcdserver: no leader")

			// 100 retries within 29.7 s: one line, for the first.
			for i := range 100 {
				now = t0.Add(time.Duration(i) * 300 * time.Millisecond)
				r.Retry(errLost, tc.attempt(i+1), 100*time.Millisecond)
			}
			lines := parseLines(t, buf.Bytes())
			if len(lines) != 1 {
				t.Fatalf("100 retries in 30 s logged %d lines, want 1:\n%s", len(lines), buf.String())
			}
			if l := lines[0]; l["level"] != "warn" || l["retries"] != 1.0 || l["error"] != errLost.Error() {
				t.Errorf("first line: %v; want a warning with retries 1 and the error", l)
			}

			// 30 s after the first line: the next retry logs the 99 held back and itself.
			now = t0.Add(30 * time.Second)
			r.Retry(errLost, tc.attempt(101), 200*time.Millisecond)
			now = t0.Add(31 * time.Second)
			r.Retry(errLost, tc.attempt(102), 200*time.Millisecond)
			lines = parseLines(t, buf.Bytes())
			if len(lines) != 2 {
				t.Fatalf("after 30 s: %d lines, want 2:\n%s", len(lines), buf.String())
			}
			if l := lines[1]; l["retries"] != 100.0 || l["attempt"] != float64(tc.attempt(101)) {
				t.Errorf("second line: %v; want retries 100, attempt %d", l, tc.attempt(101))
			}
		})
	}
}

func TestReporterBadValue(t *testing.T) {
	var buf bytes.Buffer
	r := newReporter(zerolog.New(&buf))
	r.BadValue(&store.BadValueError{Key: store.IPPoolPrefix + "p", Field: "spec.vxlanMode", Reason: `unknown mode "Sometimes"`})
	r.BadValue(&store.BadValueError{Key: store.NodePrefix + "n", Reason: "not valid JSON"})
	lines := parseLines(t, buf.Bytes())
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	want := []map[string]any{
		{"level": "warn", "message": "skipping invalid value", "key": store.IPPoolPrefix + "p", "field": "spec.vxlanMode", "reason": `unknown mode "Sometimes"`},
		{"level": "warn", "message": "skipping invalid value", "key": store.NodePrefix + "n", "reason": "not valid JSON"},
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("logged\n%v\nwant\n%v", lines, want)
	}
}

// loadCluster writes the sample cluster with a block claimed for node-a, and returns
// what every kind should count.
func loadCluster(t *testing.T, cli *clientv3.Client) map[string]any {
	t.Helper()
	ctx := context.Background()
	docs, err := manifest.ParsePaths([]string{"../../testdata/sample"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if _, err := manifest.Apply(ctx, cli, d, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	m := ipam.New(cli)
	if _, err := m.ClaimBlock(ctx, "node-a", "pool-vxlan", netip.MustParsePrefix("10.65.0.0/26")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: "k8s-pod-network.web-a", Node: "node-a", IP: netip.MustParseAddr("10.65.0.1")}); err != nil {
		t.Fatal(err)
	}
	return map[string]any{"ippools": 3.0, "nodes": 3.0, "blocks": 1.0, "blockaffinities": 1.0,
		"workloadendpoints": 5.0, "services": 1.0, "endpointslices": 1.0, "bgpconfigurations": 0.0, "bgppeers": 0.0}
}

// etcdObjects decodes every valid value under the watched prefixes, by kind and ID.
func etcdObjects(t *testing.T, cli *clientv3.Client) map[store.Kind]map[string]store.Object {
	t.Helper()
	out := map[store.Kind]map[string]store.Object{}
	for _, k := range store.Kinds {
		out[k] = map[string]store.Object{}
	}
	for _, p := range store.WatchedPrefixes {
		resp, err := cli.Get(context.Background(), p, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if obj, err := store.Decode(string(kv.Key), kv.Value); err == nil {
				out[obj.Kind()][obj.ID()] = obj
			}
		}
	}
	return out
}

func TestRun(t *testing.T) {
	srv, cli, counts := loadedEtcd(t)
	rev0, err := cli.Get(context.Background(), "/")
	if err != nil {
		t.Fatal(err)
	}

	record := filepath.Join(t.TempDir(), "events.jsonl")
	healthAddr := freeAddr(t)
	c, err := agentconfig.Parse([]string{"--etcd-endpoints", srv.Endpoint(), "--node-name", "node-a", "--log-level", "debug", "--record", record, "--dataplane=false", "--health-listen", healthAddr},
		envOf(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	log := zerolog.New(&logs).Level(zerolog.DebugLevel).With().Str("node", c.NodeName).Logger()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, c, log) }()

	if l := logs.waitFor(t, "starting", nil); !reflect.DeepEqual(l["etcd"], []any{srv.Endpoint()}) || l["node"] != "node-a" {
		t.Errorf("starting line %v; want the endpoint and the node", l)
	}
	inSync := logs.waitFor(t, "in sync with etcd", nil)
	checkHealth(t, healthAddr)
	if v := metric(t, healthAddr, `sluice_objects{kind="Node"}`); v != "3" {
		t.Errorf(`sluice_objects{kind="Node"} %s, want 3`, v)
	}
	// The agent says, once per start and without a lease, that this node runs one.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := cli.Get(context.Background(), store.SeenPrefix+"node-a")
		if err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].Lease == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %snode-a without a lease: %v %v", store.SeenPrefix, resp, err)
		}
	}
	// The agent's own keys (its status and that it runs) may be written before its first
	// read: the revision is the one the cluster was loaded at, or up to two more.
	if rev, _ := inSync["revision"].(float64); !reflect.DeepEqual(inSync["objects"], counts) || rev < float64(rev0.Header.Revision) || rev > float64(rev0.Header.Revision)+2 {
		t.Errorf("in-sync line %v; want objects %v at revision %d (or up to two more)", inSync, counts, rev0.Header.Revision)
	}
	if planned := logs.waitFor(t, "desired state computed", nil); planned["vteps"] == nil || planned["routes"] == nil {
		t.Errorf("desired-state line %v; want counts of VTEPs and routes", planned)
	}
	if n := len(logs.matching(t, "event", map[string]string{"event": "upsert"})); n != 15 {
		t.Errorf("%d upsert events logged at debug, want 15", n)
	}

	// A bad value is one warning naming key and field; the next good change still arrives.
	badKey := store.IPPoolPrefix + "pool-bad"
	if _, err := cli.Put(context.Background(), badKey,
		`{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"pool-bad"},"spec":{"cidr":"10.67.0.0/16","vxlanMode":"Sometimes"}}`); err != nil {
		t.Fatal(err)
	}
	nodeKey := store.NodePrefix + "node-d"
	if _, err := cli.Put(context.Background(), nodeKey,
		`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-d"},"spec":{"bgp":{"ipv4Address":"192.168.20.14/24"}}}`); err != nil {
		t.Fatal(err)
	}
	logs.waitFor(t, "event", map[string]string{"event": "upsert", "kind": "Node", "key": nodeKey})
	warns := logs.matching(t, "skipping invalid value", nil)
	if len(warns) != 1 {
		t.Fatalf("%d invalid-value warnings, want 1: %v", len(warns), warns)
	}
	if w := warns[0]; w["level"] != "warn" || w["key"] != badKey || w["field"] != "spec.vxlanMode" || !strings.Contains(fmt.Sprint(w["reason"]), `"Sometimes"`) {
		t.Errorf("warning %v; want level warn, key %s, field spec.vxlanMode and the bad mode", w, badKey)
	}
	// node-d has no VXLAN tunnel address: a block it claims in the VXLAN pool cannot be
	// routed, and the agent says so once, with the key and why, and counts it.
	if metric(t, healthAddr, "sluice_problems") != "0" {
		t.Fatalf("sluice_problems %s before any problem", metric(t, healthAddr, "sluice_problems"))
	}
	// (The block alone, as calico-ipam writes it first: node-a does not watch node-d's
	// affinities.)
	if _, err := cli.Put(context.Background(), store.BlockKey(netip.MustParsePrefix("10.65.1.0/26")),
		`{"cidr":"10.65.1.0/26","affinity":"host:node-d","allocations":[`+strings.TrimSuffix(strings.Repeat("null,", 64), ",")+`],"unallocated":[],"attributes":[],"deleted":false}`); err != nil {
		t.Fatal(err)
	}
	problem := logs.waitFor(t, "cannot act on input", map[string]string{"key": "block/10.65.1.0/26"})
	if r := fmt.Sprint(problem["reason"]); problem["level"] != "warn" || !strings.Contains(r, "node node-d has no IPv4 VXLAN tunnel address (spec.ipv4VXLANTunnelAddr)") {
		t.Errorf("problem line %v; want a warning saying node-d has no tunnel address", problem)
	}
	if got := metric(t, healthAddr, "sluice_problems"); got != "1" {
		t.Errorf("sluice_problems %s, want 1", got)
	}
	final, err := cli.Get(context.Background(), "/")
	if err != nil {
		t.Fatal(err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run returned %v after cancel, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return 10 s after cancel")
	}
	stopped := logs.waitFor(t, "stopped", nil)
	if stopped["revision"] != float64(final.Header.Revision) || stopped["events"] != 18.0 || stopped["bad_values"] != 1.0 {
		t.Errorf("stopped line %v; want revision %d, 18 events (15 upserts, in-sync, node-d and its block), 1 bad value", stopped, final.Header.Revision)
	}

	// The recording rebuilds the same index, the event after the last in-sync included.
	f, err := os.Open(record)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	idx := store.NewIndex()
	if err := store.Replay(f, idx); err != nil {
		t.Fatal(err)
	}
	snap := idx.Snapshot()
	if snap.Revision() != final.Header.Revision || !snap.InSync() {
		t.Errorf("replayed index at revision %d, in sync %t; want %d, true", snap.Revision(), snap.InSync(), final.Header.Revision)
	}
	want := etcdObjects(t, cli)
	for _, k := range store.Kinds {
		got := map[string]store.Object{}
		for _, o := range snap.List(k) {
			got[o.ID()] = o
		}
		if !reflect.DeepEqual(got, want[k]) {
			t.Errorf("replayed %s: %v\nwant %v", k.Plural(), slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want[k])))
		}
	}
	if snap.Get(store.KindNode, "node-d") == nil || snap.Get(store.KindIPPool, "pool-bad") != nil {
		t.Errorf("replayed index: node-d %v, pool-bad %v; want node-d only", snap.Get(store.KindNode, "node-d"), snap.Get(store.KindIPPool, "pool-bad"))
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	var resp *http.Response
	var err error
	for range 100 {
		if resp, err = http.Get(url); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// checkHealth: live and ready once in sync (no dataplane in this run), and metrics present.
func checkHealth(t *testing.T, addr string) {
	t.Helper()
	if code, _ := get(t, "http://"+addr+"/livez"); code != 200 {
		t.Errorf("/livez = %d", code)
	}
	waitReadyz(t, addr, 200, "", 5*time.Second)
	_, body := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{"sluice_etcd_in_sync 1", `sluice_events_total{kind="IPPool",type="upsert"}`, `sluice_objects{kind="Node"} `, "sluice_ready 1", "sluice_etcd_revision ", "sluice_build_info{goversion=\"go"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// testAgent is one agent a test runs in this process, with its log and health address.
type testAgent struct {
	logs       *logBuffer
	healthAddr string
	cancel     context.CancelFunc
	done       chan error
	stopOnce   sync.Once
	err        error
}

// runAgent runs the agent for node-a with etcd at endpoint only, without dataplane
// or services; args add to these (a later flag wins: --node-name names another node). The test's cleanup stops it if the test did not.
func runAgent(t *testing.T, endpoint string, args ...string) *testAgent {
	t.Helper()
	a := &testAgent{logs: &logBuffer{}, healthAddr: freeAddr(t), done: make(chan error, 1)}
	c, err := agentconfig.Parse(append([]string{"--etcd-endpoints", endpoint, "--node-name", "node-a", "--log-level", "debug",
		"--dataplane=false", "--services=false", "--health-listen", a.healthAddr}, args...), envOf(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(a.logs).Level(zerolog.DebugLevel).With().Str("node", c.NodeName).Logger()
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- run(ctx, c, log) }()
	t.Cleanup(func() { a.stop() })
	return a
}

// stop cancels the agent and returns what run returned. It is idempotent.
func (a *testAgent) stop() error {
	a.stopOnce.Do(func() {
		a.cancel()
		a.err = <-a.done
	})
	return a.err
}

// loadedEtcd starts etcd with the sample cluster (loadCluster) and returns it, a client of
// it (closed by the test's cleanup) and what every kind should count.
func loadedEtcd(t *testing.T) (*etcdtest.Server, *clientv3.Client, map[string]any) {
	t.Helper()
	srv, cli := newEtcd(t)
	return srv, cli, loadCluster(t, cli)
}

// newEtcd starts an empty etcd and returns it and a client of it (closed by the test's
// cleanup).
func newEtcd(tb testing.TB) (*etcdtest.Server, *clientv3.Client) {
	tb.Helper()
	srv := etcdtest.New(tb)
	cli, err := srv.Client()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return srv, cli
}

// waitReadyz polls addr's /readyz until it answers code with a body holding want, and
// returns the body; the test fails after timeout.
func waitReadyz(t *testing.T, addr string, code int, want string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got, body := get(t, "http://"+addr+"/readyz")
		if got == code && strings.Contains(body, want) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q after %v, want %d with %q", got, body, timeout, code, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metric returns the value of an unlabelled metric from /metrics.
func metric(t *testing.T, addr, name string) string {
	t.Helper()
	_, body := get(t, "http://"+addr+"/metrics")
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	t.Fatalf("no metric %s", name)
	return ""
}

// TestRunEtcdSilence: the link to etcd goes silent (nothing closed, nothing answered). The
// agent reports it within its liveness time on /readyz (with the reason) and in its
// metrics, logs it once, stays live, and once the link is back is ready again with what
// changed meanwhile (issue #10: the outage used to be invisible on the node).
func TestRunEtcdSilence(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (7 s): make test runs it")
	}
	srv, cli, _ := loadedEtcd(t)
	proxy, err := etcdtest.NewProxy(srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	a := runAgent(t, proxy.Endpoint(), "--etcd-liveness", "2s", "--status-ttl", "60s")
	healthAddr, logs := a.healthAddr, a.logs
	logs.waitFor(t, "in sync with etcd", nil)
	checkHealth(t, healthAddr)

	proxy.Silence()
	cut := time.Now()
	body := waitReadyz(t, healthAddr, 503, "", 30*time.Second)
	t.Logf("not ready %v into the silence: %s", time.Since(cut).Round(time.Millisecond), strings.TrimSpace(body))
	if !strings.Contains(body, "lost etcd: no connection for") {
		t.Errorf("/readyz says %q; want the reason", body)
	}
	if v := metric(t, healthAddr, "sluice_etcd_in_sync"); v != "0" {
		t.Errorf("sluice_etcd_in_sync %s during the silence", v)
	}
	if v := metric(t, healthAddr, "sluice_etcd_silences_total"); v != "1" {
		t.Errorf("sluice_etcd_silences_total %s; want 1", v)
	}
	if code, _ := get(t, "http://"+healthAddr+"/livez"); code != 200 {
		t.Errorf("/livez %d while cut off: restarting the agent would not help", code)
	}
	if _, err := cli.Put(context.Background(), store.NodePrefix+"node-e",
		`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-e"},"spec":{"bgp":{"ipv4Address":"192.168.20.15/24"}}}`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)

	proxy.Restore()
	back := time.Now()
	logs.waitFor(t, "event", map[string]string{"event": "upsert", "kind": "Node", "key": store.NodePrefix + "node-e"})
	checkHealth(t, healthAddr)
	t.Logf("ready again %v after the link came back", time.Since(back).Round(time.Millisecond))
	if v := metric(t, healthAddr, "sluice_etcd_in_sync"); v != "1" {
		t.Errorf("sluice_etcd_in_sync %s after the link came back", v)
	}
	if n := len(logs.matching(t, "etcd has not answered; not ready until it does (the dataplane stays as it is)", nil)); n != 1 {
		t.Errorf("the silence was logged %d times; want once", n)
	}
	if n := len(logs.matching(t, "etcd answers again; catching up from the last revision", nil)); n != 1 {
		t.Errorf("the recovery was logged %d times; want once", n)
	}
}

// TestRunUnknownNode: an agent whose node is not in etcd (a typo, a hostname unlike the Node's
// name) is not ready, says why on /readyz, logs it once as a problem and counts it; it gets
// ready as soon as the Node appears.
func TestRunUnknownNode(t *testing.T) {
	srv, cli, _ := loadedEtcd(t)
	a := runAgent(t, srv.Endpoint(), "--node-name", "node-typo")
	healthAddr, logs := a.healthAddr, a.logs
	logs.waitFor(t, "in sync with etcd", nil)
	problem := logs.waitFor(t, "cannot act on input", map[string]string{"key": "node/node-typo"})
	if r := fmt.Sprint(problem["reason"]); !strings.Contains(r, "node node-typo is not in etcd") || !strings.Contains(r, "option node-name") {
		t.Errorf("problem line %v", problem)
	}
	// (The problem is logged while the in-sync is being delivered; readiness follows it.)
	waitReadyz(t, healthAddr, 503, "node node-typo is not in etcd", 5*time.Second)
	if got := metric(t, healthAddr, "sluice_problems"); got != "1" {
		t.Errorf("sluice_problems %s, want 1", got)
	}
	if _, err := cli.Put(context.Background(), store.NodePrefix+"node-typo",
		`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-typo"},"spec":{"bgp":{"ipv4Address":"192.168.20.15/24"}}}`); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, healthAddr, 200, "", 10*time.Second)
	if got := metric(t, healthAddr, "sluice_problems"); got != "0" {
		t.Errorf("sluice_problems %s once the node is there, want 0", got)
	}
}

// TestVersionFlag: sluiced --version (and version) prints its build and exits 0, without
// reading any configuration.
func TestVersionFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (13 s): make test runs it")
	}
	bin := filepath.Join(t.TempDir(), "sluiced")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building sluiced: %v\n%s", err, out)
	}
	for _, arg := range []string{"--version", "version"} {
		out, err := exec.Command(bin, arg).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "sluiced version ") || !strings.Contains(string(out), "commit ") {
			t.Errorf("sluiced %s: %v %q", arg, err, out)
		}
	}
}

// TestParseWatchStall: 0 turns the stalled-watch check off; a duration sets it.
func TestParseWatchStall(t *testing.T) {
	for v, want := range map[string]time.Duration{"0": 0, "2m": 2 * time.Minute} {
		c, err := agentconfig.Parse([]string{"--etcd-watch-stall", v}, envOf(nil), &bytes.Buffer{})
		if err != nil {
			t.Errorf("--etcd-watch-stall %s: %v", v, err)
		} else if c.EtcdWatchStall != want {
			t.Errorf("--etcd-watch-stall %s: %v; want %v", v, c.EtcdWatchStall, want)
		}
	}
}
