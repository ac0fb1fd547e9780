package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
)

// The services benchmark's cluster in etcd: 100 nodes (node-000, this one, at 192.0.2.1 and
// node-%03d at 192.0.2.(i+1)), and 10,000 NodePort services of 10 endpoints each: cluster IP
// 10.96.x.y:80, node port 30000+s, endpoints spread over the nodes (endpoint e of service s on
// node (s*10+e) mod 100), every endpoint address:port distinct inside 10.65.0.0/16, as in
// bpf's benchmarks.
const (
	svcBenchServices  = 10_000
	svcBenchEndpoints = 10
	svcBenchNodes     = 100
	svcBenchChanges   = 200
	svcBenchWarmup    = 10
	// svcBenchGap separates endpoint changes: more than the service stage's minimum interval
	// between applies (10 ms), so each change is measured alone, not behind the coalescing of
	// the one before.
	svcBenchGap = 20 * time.Millisecond
)

func svcBenchNode(i int) (string, netip.Addr) {
	return fmt.Sprintf("node-%03d", i), netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})
}

func svcBenchClusterIP(s int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 96, byte(s >> 8), byte(s)})
}

// svcBenchEndpoint is endpoint e of service s: its address, port and node.
func svcBenchEndpoint(s, e int) (netip.Addr, uint16, int) {
	const span = 63000
	i := s*svcBenchEndpoints + e
	a := 2<<8 + i%span
	return netip.AddrFrom4([4]byte{10, 65, byte(a >> 8), byte(a)}), uint16(8080 + i/span), i % svcBenchNodes
}

func svcBenchName(s int) string { return fmt.Sprintf("svc-%05d", s) }

func svcBenchService(s int) (string, string) {
	name := svcBenchName(s)
	return store.ServicePrefix + "bench/" + name, fmt.Sprintf(`{"kind":"Service","apiVersion":"v1","metadata":{"name":%q,"namespace":"bench","uid":"uid-%s"},"spec":{"type":"NodePort","clusterIPs":[%q],"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080,"nodePort":%d}],"externalTrafficPolicy":"Cluster"}}`,
		name, name, svcBenchClusterIP(s), 30000+s)
}

// svcBenchSlice is service s's endpoint slice; first, when valid, replaces endpoint 0's
// address.
func svcBenchSlice(s int, first netip.Addr) (string, string) {
	name := svcBenchName(s)
	var eps []string
	var port uint16
	for e := range svcBenchEndpoints {
		addr, p, n := svcBenchEndpoint(s, e)
		if e == 0 && first.IsValid() {
			addr = first
		}
		port = p
		node, _ := svcBenchNode(n)
		eps = append(eps, fmt.Sprintf(`{"addresses":[%q],"conditions":{"ready":true},"nodeName":%q}`, addr, node))
	}
	return store.EndpointSlicePrefix + "bench/" + name + "-1", fmt.Sprintf(`{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"name":"%s-1","namespace":"bench","labels":{"kubernetes.io/service-name":%q}},"addressType":"IPv4","endpoints":[%s],"ports":[{"name":"http","protocol":"TCP","port":%d}]}`,
		name, name, strings.Join(eps, ","), port)
}

func loadServicesBench(b *testing.B, cli *clientv3.Client) {
	add, flush := benchWriter(b, cli)
	add(store.IPPoolPrefix+"bench", `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"bench"},"spec":{"cidr":"10.65.0.0/16","vxlanMode":"Never","ipipMode":"Never","blockSize":26}}`)
	for n := range svcBenchNodes {
		name, addr := svcBenchNode(n)
		add(store.NodePrefix+name, fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"bgp":{"ipv4Address":"%s/24"}}}`, name, addr))
	}
	for s := range svcBenchServices {
		add(svcBenchService(s))
		add(svcBenchSlice(s, netip.Addr{}))
	}
	flush()
}

// svcBenchLogLine is what the benchmark reads of sluiced's JSON log: "took" is a duration
// with its unit ("1.2ms").
type svcBenchLogLine struct {
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
	Took    string    `json:"took"`
	Writes  int       `json:"writes"`
	// Frontends and Removed are a desired-state change's frontend sets and removals.
	Frontends int `json:"frontends"`
	Removed   int `json:"removed"`
}

// startServicesAgent runs sluiced for node-000 with the service stage pinned under pinDir.
func startServicesAgent(b *testing.B, bin, endpoint, pinDir string, more ...string) *agentProc {
	// The desired state it keeps as it stops goes beside its pins, not to the host's
	// /var/lib/sluice.
	args := []string{"--etcd-endpoints", endpoint, "--node-name", "node-000", "--log-format", "json", "--bpf-pin-dir", pinDir,
		"--state-file", filepath.Join(b.TempDir(), "desired-state")}
	// The socket programs would attach to the cgroup hierarchy, which `ip netns exec` hides
	// (it remounts /sys): they are not what is measured.
	if help, _ := exec.Command(bin, "--help").CombinedOutput(); strings.Contains(string(help), "cgroup-path") {
		args = append(args, "--cgroup-path", "none")
	}
	return execAgent(b, bin, append(args, more...)...)
}

// servicesBenchWorld builds sluiced and makes what the service benchmarks run it in: eth0 at
// 192.0.2.1/24 (node-000's address) in the benchmark's namespace, a bpffs the benchmark mounts
// (sluiced is its child, in its mount namespace) with the directory to pin under, and an etcd
// child with a client. All of it goes when the benchmark ends, even when it fails.
func servicesBenchWorld(b *testing.B) (bin, pinDir string, etcd *etcdtest.Child, cli *clientv3.Client) {
	var err error
	dir := b.TempDir()
	bin = filepath.Join(dir, "sluiced")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("building sluiced: %v\n%s", err, out)
	}
	for _, c := range [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peth0"},
		{"ip", "addr", "add", "192.0.2.1/24", "dev", "eth0"}, {"ip", "link", "set", "eth0", "up"}, {"ip", "link", "set", "peth0", "up"}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v %s", c, err, out)
		}
		if c[2] == "add" && c[1] == "link" {
			// The namespace may outlive the benchmark (one made by hand for a series of runs).
			b.Cleanup(func() { _ = exec.Command("ip", "link", "del", "eth0").Run() })
		}
	}
	bpffs := filepath.Join(dir, "bpf")
	if err := os.Mkdir(bpffs, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		b.Fatalf("mounting bpffs: %v", err)
	}
	// Last first: sluiced is killed (its cleanup comes later) before the pins, links and maps go
	// with the mount.
	b.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	pinDir = filepath.Join(bpffs, "sluiced")
	etcd, err = etcdtest.StartChild(etcdtest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { etcd.Close() })
	cli, err = store.ClientConfig{Endpoints: []string{etcd.Endpoint()}}.New()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	return bin, pinDir, etcd, cli
}

// BenchmarkServiceEndpointChange runs sluiced with the service stage for a node of a cluster
// of 10,000 services of 10 endpoints in etcd, inside a network namespace of its own (make
// bench-services creates it and sets SLUICE_BENCH_NETNS), its maps pinned on a bpffs the
// benchmark mounts (sluiced is its child, in its mount namespace). It reports the time from
// starting sluiced to its first service-map apply (every frontend in the map), and then, for
// one endpoint's address changed in an endpoint slice at a time, p50 and p99 from the etcd
// write to the map holding the new backend: the backend list is written before the frontend
// that points at it, so the benchmark reads the service's cluster-IP frontend in a bounded
// loop (one lookup, then a 10 µs nanosleep: about 0.1 ms between reads here, leaving the CPU
// to sluiced and etcd) until it names a new list, and checks that list holds the new address.
// Reference, in the same run: etcd's own put-to-watch-event latency.
func BenchmarkServiceEndpointChange(b *testing.B) {
	if os.Getenv("SLUICE_BENCH_NETNS") == "" || os.Geteuid() != 0 {
		b.Skip("programs a kernel: run through `make bench-services`, which gives it its own network namespace")
	}
	bin, pinDir, etcd, cli := servicesBenchWorld(b)
	loadStart := time.Now()
	loadServicesBench(b, cli)
	b.Logf("etcd loaded in %v", time.Since(loadStart).Round(time.Millisecond))

	b.ResetTimer()
	start := time.Now()
	agent := startServicesAgent(b, bin, etcd.Endpoint(), pinDir)
	defer agent.stop()
	if !agent.waitLine(2*time.Minute, "service maps updated") {
		b.Fatal("sluiced ended or never updated the service maps")
	}
	cold := time.Since(start)
	pinned, err := bpf.OpenPinned(pinDir) // checks the maps' layouts against this build
	if err != nil {
		b.Fatal(err)
	}
	feCount, beCount := pinned.Tables().Frontends.Len(), pinned.Tables().Backends.Len()
	pinned.Close()
	if feCount != 4*svcBenchServices || beCount != svcBenchServices*svcBenchEndpoints {
		b.Fatalf("after the first apply: %d frontends and %d backends in the maps; want %d and %d", feCount, beCount,
			4*svcBenchServices, svcBenchServices*svcBenchEndpoints)
	}
	b.Logf("cold start to every frontend in the map: %v", cold.Round(time.Millisecond))
	ro := &ebpf.LoadPinOptions{ReadOnly: true}
	fe, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "sl_fe_v4"), ro)
	if err != nil {
		b.Fatal(err)
	}
	defer fe.Close()
	be, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "sl_be_v4"), ro)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	// sluiced's own account of each change, from its log: when calc's update was ready and
	// when the service maps' apply ended (log times are the same clock's).
	var logMu sync.Mutex
	var logged []svcBenchLogLine
	go func() {
		for l := range agent.lines {
			var e svcBenchLogLine
			if json.Unmarshal([]byte(l), &e) == nil && (e.Message == "desired state changed" || e.Message == "service maps updated") {
				logMu.Lock()
				logged = append(logged, e)
				logMu.Unlock()
			}
		}
	}()

	// One endpoint's address changed at a time, each in a service of its own.
	nap := unix.NsecToTimespec(int64(10 * time.Microsecond))
	var perChange []time.Duration
	var begins []time.Time
	var polls int
	for j := range svcBenchWarmup + svcBenchChanges {
		s := (j*37 + 11) % svcBenchServices
		key := bpf.FrontendKey{Addr: bpf.NetAddr(svcBenchClusterIP(s)), Port: bpf.NetPort(80), Proto: bpf.ProtoTCP}
		var old bpf.FrontendValue
		if err := fe.Lookup(&key, &old); err != nil {
			b.Fatalf("frontend of %s: %v", svcBenchName(s), err)
		}
		addr := netip.AddrFrom4([4]byte{10, 65, 250, byte(j)})
		k, v := svcBenchSlice(s, addr)
		time.Sleep(svcBenchGap)
		begin := time.Now()
		if _, err := cli.Put(context.Background(), k, v); err != nil {
			b.Fatal(err)
		}
		deadline := begin.Add(10 * time.Second)
		var cur bpf.FrontendValue
		for {
			polls++
			if err := fe.Lookup(&key, &cur); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				b.Fatal(err)
			}
			if cur.ListId != old.ListId {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("change %d: the frontend of %s still names its old list after 10s", j, svcBenchName(s))
			}
			_ = unix.Nanosleep(&nap, nil)
		}
		took := time.Since(begin)
		found := false
		for o := uint32(0); o < cur.Count; o++ {
			var bv bpf.BackendValue
			if err := be.Lookup(&bpf.BackendKey{ListId: cur.ListId, Ordinal: o}, &bv); err != nil {
				b.Fatalf("change %d: backend %d of the new list of %s: %v", j, o, svcBenchName(s), err)
			}
			found = found || bv.Addr == bpf.NetAddr(addr)
		}
		if !found || cur.Count != svcBenchEndpoints {
			b.Fatalf("change %d: the new list of %s has %d backends, new address %s among them: %v", j, svcBenchName(s), cur.Count, addr, found)
		}
		if j >= svcBenchWarmup {
			perChange = append(perChange, took)
			begins = append(begins, begin)
		}
	}
	// Reference: etcd's own put-to-watch-event latency, in the same run and the same rhythm.
	var etcdLat []time.Duration
	wch := cli.Watch(context.Background(), "/bench/ref/", clientv3.WithPrefix())
	for i := range svcBenchWarmup + svcBenchChanges {
		time.Sleep(svcBenchGap)
		begin := time.Now()
		if _, err := cli.Put(context.Background(), fmt.Sprintf("/bench/ref/%d", i), "x"); err != nil {
			b.Fatal(err)
		}
		<-wch
		if i >= svcBenchWarmup {
			etcdLat = append(etcdLat, time.Since(begin))
		}
	}
	b.StopTimer()
	peak, settled := memKiB(agent.cmd.Process.Pid)
	// For each change: the first calc update and the first service-map apply logged after it.
	logMu.Lock()
	var toCalc, toApplied, applies []time.Duration
	for _, begin := range begins {
		var calcAt, appliedAt time.Time
		var took time.Duration
		for _, e := range logged {
			if e.Time.Before(begin) {
				continue
			}
			if e.Message == "desired state changed" && calcAt.IsZero() {
				calcAt = e.Time
			}
			if e.Message == "service maps updated" && !calcAt.IsZero() && appliedAt.IsZero() {
				d, _ := time.ParseDuration(e.Took)
				appliedAt, took = e.Time, d
			}
		}
		if !appliedAt.IsZero() {
			toCalc = append(toCalc, calcAt.Sub(begin))
			toApplied = append(toApplied, appliedAt.Sub(begin))
			applies = append(applies, took)
		}
	}
	logMu.Unlock()
	if len(toCalc) > 0 {
		b.Logf("from sluiced's log (%d changes): etcd write to calc's update p50 %v, to the end of the service-map apply p50 %v; the apply itself p50 %v p99 %v",
			len(toCalc), percentile(toCalc, 0.5), percentile(toApplied, 0.5), percentile(applies, 0.5), percentile(applies, 0.99))
	}
	b.Logf("%d map reads while waiting for %d changes; sluiced peak %d MiB, now %d MiB", polls, svcBenchWarmup+svcBenchChanges, peak/1024, settled/1024)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(0, "ns/op") // the whole run's time: meaningless here
	b.ReportMetric(cold.Seconds(), "svc-cold-start-s")
	b.ReportMetric(ms(percentile(perChange, 0.5)), "endpoint-p50-ms")
	b.ReportMetric(ms(percentile(perChange, 0.99)), "endpoint-p99-ms")
	b.ReportMetric(ms(percentile(etcdLat, 0.5)), "etcd-watch-p50-ms")
	b.ReportMetric(ms(percentile(etcdLat, 0.99)), "etcd-watch-p99-ms")
	b.ReportMetric(float64(peak)/1024, "peak-rss-MiB")
}

// svcArrivingWriters is how many writers put the services and slices, as four parallel
// `sluicectl apply` do: one transaction per object.
const svcArrivingWriters = 4

// BenchmarkServicesArriving runs sluiced for node-000 of the services benchmark's cluster with
// no service in etcd yet, then writes the 10,000 services and their slices while it runs: four
// writers, one transaction per object, as four parallel `sluicectl apply` write them (#36).
// It reports the time from the last commit to the maps complete (every frontend and backend of
// every service in the pinned maps), beside etcd's own time for the writes, and sluiced's CPU
// over the whole write beside what a bare etcd watcher of the same prefix (a child process
// doing nothing but receiving the events) spends over the same span. While thousands of
// services are present, every write is a change sluiced applies on its own or coalesced:
// a cost per apply or per change that grows with the services present shows here, and not
// in BenchmarkServicesColdApply, which applies them all at once.
func BenchmarkServicesArriving(b *testing.B) {
	if os.Getenv("SLUICE_BENCH_NETNS") == "" || os.Geteuid() != 0 {
		b.Skip("programs a kernel: run through `make bench-services`, which gives it its own network namespace")
	}
	bin, pinDir, etcd, cli := servicesBenchWorld(b)
	add, flush := benchWriter(b, cli)
	add(store.IPPoolPrefix+"bench", `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"bench"},"spec":{"cidr":"10.65.0.0/16","vxlanMode":"Never","ipipMode":"Never","blockSize":26}}`)
	for n := range svcBenchNodes {
		name, addr := svcBenchNode(n)
		add(store.NodePrefix+name, fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"bgp":{"ipv4Address":"%s/24"}}}`, name, addr))
	}
	flush()

	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	watcher := exec.Command(self, "-test.run=^$", "-test.bench=^$")
	watcher.Env = append(os.Environ(), bareWatcherEnv+"="+etcd.Endpoint(), bareWatcherPrefixEnv+"=/sluice/v1/")
	if err := watcher.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = watcher.Process.Kill(); _ = watcher.Wait() })
	// SLUICE_BENCH_CPUPROFILE=FILE saves sluiced's CPU profile over the first 10 s of the write,
	// SLUICE_BENCH_HEAP=PREFIX its heap profile (what it allocated: -sample_index=alloc_space)
	// once the maps are complete.
	cpuProfile, heapProfile := os.Getenv("SLUICE_BENCH_CPUPROFILE"), os.Getenv("SLUICE_BENCH_HEAP")
	var more []string
	if cpuProfile != "" || heapProfile != "" {
		more = append(more, "--profiling")
	}
	agent := startServicesAgent(b, bin, etcd.Endpoint(), pinDir, more...)
	defer agent.stop()
	for waiting := []string{"dataplane updated", "service stage started"}; len(waiting) > 0; {
		l, ok := agent.next(time.Minute)
		if !ok {
			b.Fatalf("sluiced ended, or said nothing for a minute, before it logged %q", waiting)
		}
		waiting = slices.DeleteFunc(waiting, func(m string) bool { return strings.Contains(l, m) })
	}
	// sluiced's log lines during the write, counted by message: how many applies it made.
	var logMu sync.Mutex
	messages := map[string]int{}
	var mapWrites int     // the entries the service-map applies wrote
	var frontendOps int   // the frontend sets and removals calc handed over
	var warnings []string // the first lines above info level, for a failure's message
	go func() {
		for l := range agent.lines {
			var e svcBenchLogLine
			if json.Unmarshal([]byte(l), &e) == nil {
				logMu.Lock()
				messages[e.Message]++
				switch e.Message {
				case "service maps updated":
					mapWrites += e.Writes
				case "desired state changed":
					frontendOps += e.Frontends + e.Removed
				}
				if !strings.Contains(l, `"level":"info"`) && !strings.Contains(l, `"level":"debug"`) && len(warnings) < 20 {
					warnings = append(warnings, l)
				}
				logMu.Unlock()
			}
		}
	}()
	time.Sleep(time.Second) // the watcher watching
	pinned, err := bpf.OpenPinned(pinDir)
	if err != nil {
		b.Fatal(err)
	}
	defer pinned.Close()
	fe, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "sl_fe_v4"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer fe.Close()

	b.ResetTimer()
	agentPid, watcherPid := agent.cmd.Process.Pid, watcher.Process.Pid
	agentUser, agentSys := cpuSplit(b, agentPid)
	watcherUser, watcherSys := cpuSplit(b, watcherPid)
	logMu.Lock()
	clear(messages)
	mapWrites, frontendOps = 0, 0
	logMu.Unlock()
	start := time.Now()
	profiled := make(chan struct{})
	go func() {
		defer close(profiled)
		if cpuProfile != "" {
			saveProfile(b, "http://127.0.0.1:9097/debug/pprof/profile?seconds=10", cpuProfile)
		}
	}()
	var mu sync.Mutex
	var lastCommit time.Time
	var wg sync.WaitGroup
	errs := make(chan error, svcArrivingWriters)
	for w := range svcArrivingWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := w; s < svcBenchServices; s += svcArrivingWriters {
				for _, kv := range [][2]string{pair(svcBenchService(s)), pair(svcBenchSlice(s, netip.Addr{}))} {
					if _, err := cli.Txn(context.Background()).Then(clientv3.OpPut(kv[0], kv[1])).Commit(); err != nil {
						errs <- err
						return
					}
				}
			}
			mu.Lock()
			lastCommit = time.Now()
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	writes := lastCommit.Sub(start)

	// Complete: the last service of each writer has its frontends (its backends are written
	// before them), then every frontend and backend of every service is counted.
	deadline := lastCommit.Add(2 * time.Minute)
	var complete time.Time
	for complete.IsZero() {
		if time.Now().After(deadline) {
			logMu.Lock()
			b.Fatalf("the maps were not complete 2 minutes after the last commit; sluiced logged %v, and above info level:\n%s", messages, strings.Join(warnings, "\n"))
		}
		time.Sleep(2 * time.Millisecond)
		last := true
		for w := range svcArrivingWriters {
			s := svcBenchServices - svcArrivingWriters + w
			var v bpf.FrontendValue
			key := bpf.FrontendKey{Addr: bpf.NetAddr(svcBenchClusterIP(s)), Port: bpf.NetPort(80), Proto: bpf.ProtoTCP}
			if err := fe.Lookup(&key, &v); err != nil || v.Count != svcBenchEndpoints {
				last = false
				break
			}
		}
		if !last {
			continue
		}
		at := time.Now()
		if pinned.Tables().Frontends.Len() == 4*svcBenchServices && pinned.Tables().Backends.Len() == svcBenchServices*svcBenchEndpoints {
			complete = at
		}
	}
	ticks := func(t int64) time.Duration { return time.Duration(float64(t) / clockTicks * float64(time.Second)) }
	u, sy := cpuSplit(b, agentPid)
	agentUserCPU, agentSysCPU := ticks(u-agentUser), ticks(sy-agentSys)
	u, sy = cpuSplit(b, watcherPid)
	watcherUserCPU, watcherSysCPU := ticks(u-watcherUser), ticks(sy-watcherSys)
	agentCPU, watcherCPU := agentUserCPU+agentSysCPU, watcherUserCPU+watcherSysCPU
	peak, _ := memKiB(agentPid)
	b.StopTimer()
	<-profiled
	if heapProfile != "" {
		saveHeap(b, heapProfile+"-arriving.pb.gz")
	}
	after := complete.Sub(lastCommit)
	b.Logf("%d services of %d endpoints written by %d writers in %v; maps complete %v after the last commit; CPU over the write: sluiced %v, a bare watcher %v (%.2fx); sluiced's peak RSS %d MiB",
		svcBenchServices, svcBenchEndpoints, svcArrivingWriters, writes.Round(time.Millisecond), after.Round(time.Millisecond),
		agentCPU.Round(10*time.Millisecond), watcherCPU.Round(10*time.Millisecond), agentCPU.Seconds()/watcherCPU.Seconds(), peak/1024)
	b.Logf("user and system CPU: sluiced %v and %v, the watcher %v and %v", agentUserCPU.Round(10*time.Millisecond), agentSysCPU.Round(10*time.Millisecond),
		watcherUserCPU.Round(10*time.Millisecond), watcherSysCPU.Round(10*time.Millisecond))
	logMu.Lock()
	b.Logf("sluiced logged during the write: %d service-map applies writing %d entries, %d dataplane applies, %d desired-state changes carrying %d frontend ops (%v)",
		messages["service maps updated"], mapWrites, messages["dataplane updated"], messages["desired state changed"], frontendOps, messages)
	logMu.Unlock()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(writes.Seconds(), "etcd-writes-s")
	b.ReportMetric(after.Seconds(), "after-last-commit-s")
	b.ReportMetric(agentCPU.Seconds(), "sluiced-cpu-s")
	b.ReportMetric(watcherCPU.Seconds(), "watcher-cpu-s")
	b.ReportMetric(agentCPU.Seconds()/watcherCPU.Seconds(), "cpu-x-watcher")
	b.ReportMetric(float64(peak)/1024, "peak-rss-MiB")
}

func pair(k, v string) [2]string { return [2]string{k, v} }
