package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if etcdtest.ServeChild() {
		return
	}
	if ep := os.Getenv(bareWatcherEnv); ep != "" {
		serveBareWatcher(ep)
		return
	}
	if os.Getenv(bareSpeakerEnv) != "" {
		serveBareSpeaker()
		return
	}
	os.Exit(m.Run())
}

// bareWatcherEnv makes this test binary a bare etcd watcher (serveBareWatcher) at the endpoint
// it names: the dataplane benchmark's reference for what etcd's Go client alone costs.
const bareWatcherEnv = "SLUICE_BENCH_BARE_WATCHER"

// bareWatcherPrefixEnv, when set, is the prefix the bare watcher watches instead of /calico/.
const bareWatcherPrefixEnv = "SLUICE_BENCH_BARE_WATCHER_PREFIX"

// serveBareWatcher watches /calico/ (or the prefix bareWatcherPrefixEnv names) as the intake
// does (one watch over the span of its prefixes), counting events and doing nothing else,
// until killed.
func serveBareWatcher(endpoint string) {
	cli, err := store.ClientConfig{Endpoints: []string{endpoint}}.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	prefix := "/calico/"
	if p := os.Getenv(bareWatcherPrefixEnv); p != "" {
		prefix = p
	}
	n := 0
	for resp := range cli.Watch(context.Background(), prefix, clientv3.WithPrefix()) {
		n += len(resp.Events)
	}
	os.Exit(0)
}

// newNodeOps is the transaction that adds remote node n with its block: node, block, affinity.
func newNodeOps(sh benchShape, n int, cidr netip.Prefix) []clientv3.Op {
	node := fmt.Sprintf("node-%05d", n)
	return []clientv3.Op{clientv3.OpPut(store.NodePrefix+node, benchNodeJSON(n, cidr.Addr().String())),
		clientv3.OpPut(store.BlockKey(cidr), blockJSON(cidr, node)),
		clientv3.OpPut(store.AffinityKey(node, cidr), `{"state":"confirmed","deleted":false}`)}
}

// clientFloor is the CPU per change of a bare etcd watcher (serveBareWatcher, a child
// process) over changes new nodes with their blocks, numbered from first, written at the pace
// given: the part of sluiced's CPU per change that is etcd's Go client receiving the change.
func clientFloor(b *testing.B, cli *clientv3.Client, endpoint string, sh benchShape, first, changes int, pace time.Duration) time.Duration {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), bareWatcherEnv+"="+endpoint)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	time.Sleep(time.Second) // connected and watching
	idleStart, idleTicks := time.Now(), cpuTicks(b, pid)
	time.Sleep(2 * time.Second)
	idleRate := float64(cpuTicks(b, pid)-idleTicks) / time.Since(idleStart).Seconds()
	start, ticks := time.Now(), cpuTicks(b, pid)
	for i := range changes {
		cidr, _ := sh.block(sh.blocks + first + i)
		if _, err := cli.Txn(context.Background()).Then(newNodeOps(sh, sh.nodes+1+first+i, cidr)...).Commit(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(pace)
	}
	time.Sleep(500 * time.Millisecond) // the last ones received
	busy := float64(cpuTicks(b, pid)-ticks) - idleRate*time.Since(start).Seconds()
	return time.Duration(busy / clockTicks * float64(time.Second) / float64(changes))
}

const coldRuns = 3 // cold starts and ip -batch runs; the median of each is reported

// benchShape is a cluster the dataplane benchmark loads: nodes remote nodes (each its own
// VTEP) holding blocks /26 blocks between them, block i on node i%nodes+1.
type benchShape struct {
	name          string
	nodes, blocks int
}

// The shapes measured: 1,000 nodes of 20 blocks, and a fleet as Calico lays it out, where
// most nodes hold one block, so 20,000 blocks are 20,000 nodes and 20,000 VTEPs (issue #11).
// 5,000 nodes of one block sit between, so the cost of a change can be seen to be flat in N.
var benchShapes = []benchShape{{"nodes=1000,blocks=20000", 1000, 20_000}, {"nodes=5000,blocks=5000", 5000, 5000}, {"nodes=20000,blocks=20000", 20_000, 20_000}}

// block is remote block i: a /26 in 10.64.0.0/10, and its node.
func (sh benchShape) block(i int) (netip.Prefix, string) {
	n := i * 64
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(64 + n>>16), byte(n >> 8), byte(n)}), 26), fmt.Sprintf("node-%05d", i%sh.nodes+1)
}

// tunnel is node n's VXLAN tunnel address: the first address of its first block, as
// calico-ipam hands it out.
func (sh benchShape) tunnel(node int) string {
	cidr, _ := sh.block(node - 1)
	return cidr.Addr().String()
}

// benchWriter puts keys into etcd in transactions of 128: add queues one, flush writes what
// is queued.
func benchWriter(b testing.TB, cli *clientv3.Client) (add func(k, v string), flush func()) {
	var ops []clientv3.Op
	flush = func() {
		if len(ops) == 0 {
			return
		}
		if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[:0]
	}
	add = func(k, v string) {
		ops = append(ops, clientv3.OpPut(k, v))
		if len(ops) == 128 {
			flush()
		}
	}
	return add, flush
}

// loadBench writes the pool, node-00000 (this node) and the shape's remote nodes and blocks
// with their affinities, in Calico's format.
func loadBench(b testing.TB, cli *clientv3.Client, sh benchShape) {
	add, flush := benchWriter(b, cli)
	benchKeys(sh, add)
	flush()
}

// benchKeys calls add with every key of the shape and its value (loadBench).
func benchKeys(sh benchShape, add func(k, v string)) {
	add(store.IPPoolPrefix+"bench", `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"bench"},"spec":{"cidr":"10.64.0.0/10","vxlanMode":"Always","ipipMode":"Never","blockSize":26}}`)
	add(store.NodePrefix+"node-00000", `{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-00000"},"spec":{"bgp":{"ipv4Address":"192.0.2.11/24"},"ipv4VXLANTunnelAddr":"172.31.0.1"}}`) // this node's blocks are not part of the run
	for n := 1; n <= sh.nodes; n++ {
		add(store.NodePrefix+fmt.Sprintf("node-%05d", n), benchNodeJSON(n, sh.tunnel(n)))
	}
	for i := range sh.blocks {
		cidr, node := sh.block(i)
		add(store.BlockKey(cidr), blockJSON(cidr, node))
		add(store.AffinityKey(node, cidr), `{"state":"confirmed","deleted":false}`)
	}
}

// benchNodeJSON is remote node n (node-NNNNN) with its underlay address and tunnel address.
func benchNodeJSON(n int, tunnel string) string {
	name := fmt.Sprintf("node-%05d", n)
	return fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"bgp":{"ipv4Address":"198.%d.%d.%d/8"},"ipv4VXLANTunnelAddr":%q}}`, name, 18+n/62500, n/250%250, n%250+1, tunnel)
}

func blockJSON(cidr netip.Prefix, node string) string {
	return fmt.Sprintf(`{"cidr":%q,"affinity":"host:%s","allocations":[%s],"unallocated":[],"attributes":[],"deleted":false}`,
		cidr, node, strings.TrimSuffix(strings.Repeat("null,", 64), ","))
}

// routeEvents counts new and deleted routes of sluice's protocol in this namespace.
type routeEvents struct {
	ch   chan netlink.RouteUpdate
	done chan struct{}
	once sync.Once
}

func subscribeRoutes(b *testing.B) *routeEvents {
	r := &routeEvents{ch: make(chan netlink.RouteUpdate, 1<<16), done: make(chan struct{})}
	if err := netlink.RouteSubscribeWithOptions(r.ch, r.done, netlink.RouteSubscribeOptions{ReceiveBufferSize: 64 << 20, ReceiveBufferForceSize: true}); err != nil {
		b.Fatal(err)
	}
	return r
}

func (r *routeEvents) close() { r.once.Do(func() { close(r.done) }) }

// until reads events until f says stop or the timeout passes; it returns the time taken.
func (r *routeEvents) until(timeout time.Duration, f func(netlink.RouteUpdate) bool) (time.Duration, bool) {
	start := time.Now()
	deadline := time.After(timeout)
	for {
		select {
		case u := <-r.ch:
			if int(u.Protocol) == dataplane.DefaultRouteProtocol && f(u) {
				return time.Since(start), true
			}
		case <-deadline:
			return time.Since(start), false
		}
	}
}

func (r *routeEvents) drain() int {
	n := 0
	for {
		select {
		case u := <-r.ch:
			if int(u.Protocol) == dataplane.DefaultRouteProtocol {
				n++
			}
		default:
			return n
		}
	}
}

// objectEvents counts the kernel's events about nexthop objects of sluice's protocol and about
// neighbour and FDB entries on sluice's VXLAN device in this namespace.
type objectEvents struct {
	sock            *nl.NetlinkSocket
	nexthops, neigh atomic.Int64
	stop            atomic.Bool
	done            chan struct{}
}

func subscribeObjects(b *testing.B) *objectEvents {
	vx, err := netlink.LinkByName("vxlan.sluice")
	if err != nil {
		b.Fatal(err)
	}
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_NEXTHOP, unix.RTNLGRP_NEIGH)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.SetReceiveBufferSize(64<<20, true); err != nil {
		b.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond)) // to see close() without a blocked read
	if err := s.SetReceiveTimeout(&tv); err != nil {
		b.Fatal(err)
	}
	o := &objectEvents{sock: s, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		for !o.stop.Load() {
			msgs, _, err := s.Receive()
			if err != nil {
				continue // a timeout
			}
			for _, m := range msgs {
				switch m.Header.Type {
				case unix.RTM_NEWNEXTHOP, unix.RTM_DELNEXTHOP:
					if len(m.Data) > 2 && int(m.Data[2]) == dataplane.DefaultRouteProtocol {
						o.nexthops.Add(1)
					}
				case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
					if len(m.Data) >= 8 && int(int32(binary.NativeEndian.Uint32(m.Data[4:8]))) == vx.Attrs().Index {
						o.neigh.Add(1)
					}
				}
			}
		}
	}()
	return o
}

func (o *objectEvents) counts() (nexthops, neigh int) {
	return int(o.nexthops.Load()), int(o.neigh.Load())
}

func (o *objectEvents) close() {
	if !o.stop.Swap(true) {
		<-o.done
		o.sock.Close()
	}
}

type agentProc struct {
	cmd   *exec.Cmd
	lines chan string
}

func startAgent(b *testing.B, bin, endpoint string, args ...string) *agentProc {
	// --profiling serves Go's profiles on the health address (127.0.0.1:9097 in the
	// benchmark's namespace): SLUICE_BENCH_HEAP saves a heap profile of the settled agent.
	return execAgent(b, bin, append([]string{"--etcd-endpoints", endpoint, "--node-name", "node-00000", "--log-format", "json", "--services=false", "--profiling"}, args...)...)
}

// execAgent starts the sluiced binary with args, its log lines read into the agentProc (a line that finds
// the buffer full is dropped), and kills it when the benchmark ends, even when it fails.
func execAgent(b *testing.B, bin string, args ...string) *agentProc {
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	a := &agentProc{cmd: cmd, lines: make(chan string, 4096)}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			select {
			case a.lines <- sc.Text():
			default:
			}
		}
		close(a.lines)
	}()
	return a
}

// next returns sluiced's next log line, or false when it ended or said nothing in time.
func (a *agentProc) next(timeout time.Duration) (string, bool) {
	select {
	case l, ok := <-a.lines:
		return l, ok
	case <-time.After(timeout):
		return "", false
	}
}

func (a *agentProc) waitLine(timeout time.Duration, part string) bool {
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-a.lines:
			if !ok {
				return false
			}
			if strings.Contains(l, part) {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// untilApplied reads the agent's log until its first "dataplane updated" line and returns
// when, after start, it computed its desired state and applied it, and how many kernel
// writes that apply made. A failed apply ends it too, not ok (the phases end with the line).
func (a *agentProc) untilApplied(start time.Time) (phases []string, writes int, ok bool) {
	for {
		l, ok := a.next(2 * time.Minute)
		if !ok {
			return phases, 0, false
		}
		if strings.Contains(l, "dataplane apply failed") {
			return append(phases, l), 0, false
		}
		for _, m := range []string{"desired state restored", "desired state computed", "dataplane updated"} {
			if !strings.Contains(l, m) {
				continue
			}
			var at struct {
				Time   time.Time
				Writes int
			}
			_ = json.Unmarshal([]byte(l), &at)
			phases = append(phases, fmt.Sprintf("%v %s", at.Time.Sub(start).Round(time.Millisecond), m))
			if m == "dataplane updated" {
				return phases, at.Writes, true
			}
		}
	}
}

func (a *agentProc) stop() {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	_ = a.cmd.Wait()
}

// memKiB reads a process's VmHWM (peak) and VmRSS (now) in KiB.
func memKiB(pid int) (peak, now int) {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			v, _ := strconv.Atoi(f[1])
			switch f[0] {
			case "VmHWM:":
				peak = v
			case "VmRSS:":
				now = v
			}
		}
	}
	return peak, now
}

// buildSluiced builds sluiced into dir, as make build does, and returns its path.
func buildSluiced(b *testing.B, dir string) string {
	bin := filepath.Join(dir, "sluiced")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as make build does
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building sluiced: %v\n%s", err, out)
	}
	return bin
}

// startBenchEtcd starts an etcd child process and a client of it, both closed when the
// benchmark ends.
func startBenchEtcd(b *testing.B) (*etcdtest.Child, *clientv3.Client) {
	etcd, err := etcdtest.StartChild(etcdtest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { etcd.Close() })
	cli, err := store.ClientConfig{Endpoints: []string{etcd.Endpoint()}}.New()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	return etcd, cli
}

func percentile(d []time.Duration, p float64) time.Duration {
	slices.Sort(d)
	return d[int(float64(len(d)-1)*p)]
}

// BenchmarkDataplane runs sluiced for a node with 20,000 remote blocks in etcd, inside a
// network namespace of its own (make bench creates it and sets SLUICE_BENCH_NETNS), and
// reports: cold start to all routes in the kernel (median of three) beside `ip -batch` adding
// the same routes and a bare read of the keys it reads;
// one new block in etcd to its route in the kernel beside etcd's own put-to-watch latency; a
// restart with everything unchanged (route changes seen, time to ready); a route deleted by
// hand to its repair; and sluiced's peak and settled memory.
func BenchmarkDataplane(b *testing.B) {
	if os.Getenv("SLUICE_BENCH_NETNS") == "" || os.Geteuid() != 0 {
		b.Skip("programs a kernel: run through `make bench`, which gives it its own network namespace")
	}
	for _, sh := range benchShapes {
		b.Run(sh.name, func(b *testing.B) { benchDataplane(b, sh) })
	}
}

func benchDataplane(b *testing.B, sh benchShape) {
	benchBlocks := sh.blocks
	dir := b.TempDir()
	// The shapes share the namespace: each leaves it bare (its devices take their routes,
	// neighbours and FDB entries along).
	b.Cleanup(func() {
		for _, c := range [][]string{{"ip", "nexthop", "flush"}, {"ip", "link", "del", "vxlan.sluice"}, {"ip", "link", "del", "eth0"}} {
			_ = exec.Command(c[0], c[1:]...).Run()
		}
	})
	bin := buildSluiced(b, dir)
	for _, c := range [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peth0"},
		{"ip", "addr", "add", "192.0.2.11/24", "dev", "eth0"}, {"ip", "link", "set", "eth0", "up"}, {"ip", "link", "set", "peth0", "up"}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v %s", c, err, out)
		}
	}
	etcd, cli := startBenchEtcd(b)
	loadBench(b, cli, sh)

	b.ResetTimer()
	// Cold start, three times (the median is reported): from starting the process to
	// sluiced's report that the kernel acknowledged every write of its first full apply, then
	// checked by counting sluice's routes. Nothing else listens to or reads the kernel
	// meanwhile (a dump of 20,000 routes every few milliseconds would compete with sluiced for
	// the CPU and slow what it measures). Between runs the agent stops and its device and
	// routes are deleted, so each run starts from a bare kernel.
	h, err := netlink.NewHandle()
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	count := func() int {
		rs, _ := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: dataplane.DefaultRouteProtocol},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		return len(rs)
	}
	var agent *agentProc
	// The agents keep their desired state here as they stop (option state-file); a cold start
	// begins without it, so that it reads etcd.
	kept := filepath.Join(dir, "desired-state")
	// coldStarts starts sluiced from a bare kernel coldRuns times with args and returns the
	// median time to all routes; the last agent is left running.
	coldStarts := func(layout string, args ...string) time.Duration {
		var colds []time.Duration
		args = append([]string{"--state-file", kept}, args...)
		for run := range coldRuns {
			if agent != nil {
				agent.stop()
				for _, c := range [][]string{{"ip", "link", "del", "vxlan.sluice"}, {"ip", "route", "flush", "proto", "83"}, {"ip", "nexthop", "flush"}} {
					if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
						b.Fatalf("%v: %v %s", c, err, out)
					}
				}
				if n := count(); n != 0 {
					b.Fatalf("%d routes left before cold start %d", n, run+1)
				}
			}
			if err := os.Remove(kept); err != nil && !os.IsNotExist(err) {
				b.Fatal(err)
			}
			coldStart := time.Now()
			agent = startAgent(b, bin, etcd.Endpoint(), args...)
			phases, _, ok := agent.untilApplied(coldStart)
			if !ok {
				b.Fatalf("cold start: sluiced's apply failed, it ended, or it said nothing for 2 minutes (%s); %d of %d routes in the kernel", strings.Join(phases, ", "), count(), benchBlocks)
			}
			colds = append(colds, time.Since(coldStart))
			if n := count(); n != benchBlocks {
				b.Fatalf("cold start: sluiced said the dataplane was updated with %d of %d routes in the kernel", n, benchBlocks)
			}
			b.Logf("cold start %d (%s): %v (%s)", run+1, layout, colds[run].Round(time.Millisecond), strings.Join(phases, ", "))
		}
		return percentile(colds, 0.5)
	}
	// Felix's layout first, then the default (nexthop objects), whose agent the rest measures.
	coldGateways := coldStarts("gateways", "--route-layout", "gateways")
	cold := coldStarts("nexthops")
	if out, err := exec.Command("ip", "nexthop", "show", "proto", "83").CombinedOutput(); err != nil || strings.Count(string(out), "\n") != sh.nodes {
		b.Fatalf("nexthop objects after the cold start: %d lines, want one per node (%d): %v", strings.Count(string(out), "\n"), sh.nodes, err)
	}
	events := subscribeRoutes(b)
	defer events.close()
	time.Sleep(2 * time.Second)
	peak, settled := memKiB(agent.cmd.Process.Pid)
	if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", agent.cmd.Process.Pid)); err == nil {
		for _, l := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(l, "Rss") {
				b.Logf("settled %s", strings.Join(strings.Fields(l), " "))
			}
		}
	}
	if path := os.Getenv("SLUICE_BENCH_HEAP"); path != "" {
		saveHeap(b, fmt.Sprintf("%s-%d-nodes.pb.gz", path, sh.nodes))
	}

	// sluiced's CPU while idle, over as long as the changes below take, to subtract.
	idleStart, idleTicks := time.Now(), cpuTicks(b, agent.cmd.Process.Pid)
	time.Sleep(3 * time.Second)
	idleRate := float64(cpuTicks(b, agent.cmd.Process.Pid)-idleTicks) / time.Since(idleStart).Seconds()

	// One new node with its block at a time: a new VTEP (neighbour, FDB entry, nexthop
	// object) and a route.
	changeStart, changeTicks := time.Now(), cpuTicks(b, agent.cmd.Process.Pid)
	_, changeSys := cpuSplit(b, agent.cmd.Process.Pid)
	var perBlock []time.Duration
	nChanges := 200
	var profiled chan struct{}
	if path := os.Getenv("SLUICE_BENCH_CPU"); path != "" {
		// A CPU profile of sluiced over more changes than the figures need (they then
		// include the profiler's cost: use such a run for the profile only).
		nChanges = 3000
		profiled = make(chan struct{})
		go func() {
			defer close(profiled)
			saveProfile(b, "http://127.0.0.1:9097/debug/pprof/profile?seconds=5", fmt.Sprintf("%s-%d-nodes.pb.gz", path, sh.nodes))
		}()
	}
	for i := range nChanges {
		cidr, _ := sh.block(benchBlocks + i)
		events.drain()
		start := time.Now()
		if _, err := cli.Txn(context.Background()).Then(newNodeOps(sh, sh.nodes+1+i, cidr)...).Commit(); err != nil {
			b.Fatal(err)
		}
		want := cidr.String()
		if _, ok := events.until(10*time.Second, func(u netlink.RouteUpdate) bool {
			return u.Type == unix.RTM_NEWROUTE && u.Dst != nil && u.Dst.String() == want
		}); !ok {
			b.Fatalf("no route for the new node's block %s", cidr)
		}
		perBlock = append(perBlock, time.Since(start))
	}
	if profiled != nil {
		<-profiled
	}
	busy := float64(cpuTicks(b, agent.cmd.Process.Pid)-changeTicks) - idleRate*time.Since(changeStart).Seconds()
	cpuPerChange := time.Duration(busy / clockTicks * float64(time.Second) / float64(len(perBlock)))
	// Of which in the kernel (system time): the netlink writes themselves, socket reads and
	// writes, wake-ups. (Idle time is nearly all user time: not subtracted here.)
	_, sysNow := cpuSplit(b, agent.cmd.Process.Pid)
	sysPerChange := time.Duration(float64(sysNow-changeSys) / clockTicks * float64(time.Second) / float64(len(perBlock)))
	// Reference: etcd's Go client alone, receiving the same kind of change at the same pace.
	floor := clientFloor(b, cli, etcd.Endpoint(), sh, nChanges, 200, percentile(perBlock, 0.5))
	// Reference: etcd's own put-to-watch-event latency, in the same run.
	var etcdLat []time.Duration
	wch := cli.Watch(context.Background(), "/bench/ref/", clientv3.WithPrefix())
	for i := range 200 {
		start := time.Now()
		if _, err := cli.Put(context.Background(), fmt.Sprintf("/bench/ref/%d", i), "x"); err != nil {
			b.Fatal(err)
		}
		<-wch
		etcdLat = append(etcdLat, time.Since(start))
	}

	// A route deleted by hand.
	var repair []time.Duration
	for i := range 50 {
		cidr, _ := sh.block(i * 97)
		events.drain()
		dst := &net.IPNet{IP: cidr.Addr().AsSlice(), Mask: net.CIDRMask(26, 32)}
		start := time.Now()
		if err := h.RouteDel(&netlink.Route{Dst: dst, Table: unix.RT_TABLE_MAIN, Protocol: dataplane.DefaultRouteProtocol}); err != nil {
			b.Fatal(err)
		}
		if _, ok := events.until(10*time.Second, func(u netlink.RouteUpdate) bool {
			return u.Type == unix.RTM_NEWROUTE && u.Dst != nil && u.Dst.String() == cidr.String()
		}); !ok {
			b.Fatalf("route %s not repaired", cidr)
		}
		repair = append(repair, time.Since(start))
	}

	// Restart with nothing changed, coldRuns times each way: from the state the agent kept as
	// it stopped (etcd shows the keys unchanged), then reading etcd (no state file). No route,
	// nexthop object, neighbour or FDB entry moves.
	objects := subscribeObjects(b)
	defer objects.close()
	events.drain()
	restarts := func(how string, args ...string) time.Duration {
		var readies []time.Duration
		for run := range coldRuns {
			agent.stop()
			start := time.Now()
			// The CPU both sides spend until ready: sluiced's, and etcd's (serving the read), on a
			// machine of runtime.NumCPU() cores.
			etcdStart := cpuTicks(b, etcd.Pid())
			agent = startAgent(b, bin, etcd.Endpoint(), args...)
			// Ready as systemd's READY=1 and /readyz mean it: in sync (or the kept state found
			// current) and the first full apply done (which, with nothing changed, writes nothing).
			phases, writes, ok := agent.untilApplied(start)
			if !ok {
				b.Fatalf("the restarted sluiced (%s) never applied its state: %s", how, strings.Join(phases, ", "))
			}
			readies = append(readies, time.Since(start))
			agentCPU, etcdCPU := cpuTicks(b, agent.cmd.Process.Pid), cpuTicks(b, etcd.Pid())-etcdStart
			b.Logf("restart %d (%s): %v (%s); CPU until then: sluiced %v, etcd %v, on %d cores", run+1, how, readies[run].Round(time.Millisecond),
				strings.Join(phases, ", "), time.Duration(float64(agentCPU)/clockTicks*float64(time.Second)), time.Duration(float64(etcdCPU)/clockTicks*float64(time.Second)), runtime.NumCPU())
			if writes != 0 {
				b.Fatalf("the restarted sluiced (%s) wrote %d kernel objects with nothing changed", how, writes)
			}
			if restored := strings.Contains(strings.Join(phases, " "), "desired state restored"); restored != (how == "state file") {
				b.Fatalf("restart %d (%s): restored from the state file %v: %s", run+1, how, restored, strings.Join(phases, ", "))
			}
		}
		return percentile(readies, 0.5)
	}
	ready := restarts("state file", "--state-file", kept)
	readyEtcd := restarts("etcd", "--state-file", "")
	time.Sleep(2 * time.Second)
	changes := events.drain()
	nhChanges, neighChanges := objects.counts()
	agent.stop()

	// Reference: ip -batch adding the same routes, after sluice's are flushed, with nothing
	// listening, as in the cold start.
	events.close()
	var batch strings.Builder
	// Two layouts: Felix's (each route its own gateway, `via <tunnel> onlink`), and one
	// nexthop object per remote VTEP shared by that node's routes (issue #11).
	var nhBatch strings.Builder
	for n := 1; n <= sh.nodes; n++ {
		fmt.Fprintf(&nhBatch, "nexthop replace id %d via %s dev vxlan.sluice onlink proto 83\n", n, sh.tunnel(n))
	}
	for i := range benchBlocks { // the same 20,000 routes as the cold start
		cidr, node := sh.block(i)
		n, _ := strconv.Atoi(strings.TrimPrefix(node, "node-"))
		fmt.Fprintf(&batch, "route replace %s via %s dev vxlan.sluice onlink proto 83\n", cidr, sh.tunnel(n))
		fmt.Fprintf(&nhBatch, "route replace %s nhid %d proto 83\n", cidr, n)
	}
	var ipTimes []time.Duration
	for range coldRuns {
		// (The nexthop objects first, taking their routes: iproute2 cannot flush a route
		// through one, its dump carries both the object and its gateway.)
		for _, c := range [][]string{{"ip", "nexthop", "flush"}, {"ip", "route", "flush", "proto", "83"}} {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				b.Fatalf("%v: %v %s", c, err, out)
			}
		}
		ipb := exec.Command("ip", "-batch", "-")
		ipb.Stdin = strings.NewReader(batch.String())
		ipStart := time.Now()
		if out, err := ipb.CombinedOutput(); err != nil {
			b.Fatalf("ip -batch: %v %s", err, out)
		}
		ipTimes = append(ipTimes, time.Since(ipStart))
	}
	b.Logf("ip -batch: %v", ipTimes)
	ipTime := percentile(ipTimes, 0.5)
	var nhTimes []time.Duration
	for range coldRuns {
		for _, c := range [][]string{{"ip", "nexthop", "flush"}, {"ip", "route", "flush", "proto", "83"}} {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				b.Fatalf("%v: %v %s", c, err, out)
			}
		}
		ipb := exec.Command("ip", "-batch", "-")
		ipb.Stdin = strings.NewReader(nhBatch.String())
		ipStart := time.Now()
		if out, err := ipb.CombinedOutput(); err != nil {
			b.Fatalf("ip -batch (nexthops): %v %s", err, out)
		}
		nhTimes = append(nhTimes, time.Since(ipStart))
	}
	b.Logf("ip -batch through nexthop objects: %v", nhTimes)
	nhTime := percentile(nhTimes, 0.5)

	// Reference: what the cold start cannot do without, reading the keys it reads (pages of
	// the intake's size, from a new connection, nothing decoded) — the write half is
	// dataplane's BenchmarkRouteWrite.
	var reads []time.Duration
	for range coldRuns {
		start := time.Now()
		rc, err := store.ClientConfig{Endpoints: []string{etcd.Endpoint()}}.New()
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, prefix := range store.NodePrefixes("node-00000") {
			key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
			for {
				resp, err := rc.Get(context.Background(), key, clientv3.WithRange(end), clientv3.WithLimit(store.DefaultPageSize))
				if err != nil {
					b.Fatal(err)
				}
				n += len(resp.Kvs)
				if !resp.More || len(resp.Kvs) == 0 {
					break
				}
				key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
			}
		}
		reads = append(reads, time.Since(start))
		rc.Close()
		if n < benchBlocks+sh.nodes {
			b.Fatalf("raw read: %d keys", n)
		}
	}
	rawRead := percentile(reads, 0.5)
	b.StopTimer()

	b.ReportMetric(cold.Seconds(), "cold-start-s")
	b.ReportMetric(coldGateways.Seconds(), "cold-start-gw-s")
	b.ReportMetric(ipTime.Seconds(), "ip-batch-s")
	b.ReportMetric(nhTime.Seconds(), "ip-batch-nhid-s")
	b.ReportMetric(rawRead.Seconds(), "raw-read-s")
	b.ReportMetric(float64(percentile(perBlock, 0.5).Microseconds())/1000, "block-p50-ms")
	b.ReportMetric(float64(percentile(perBlock, 0.99).Microseconds())/1000, "block-p99-ms")
	b.ReportMetric(float64(percentile(etcdLat, 0.5).Microseconds())/1000, "etcd-watch-p50-ms")
	b.ReportMetric(float64(percentile(etcdLat, 0.99).Microseconds())/1000, "etcd-watch-p99-ms")
	b.ReportMetric(float64(changes), "restart-route-changes")
	b.ReportMetric(float64(nhChanges), "restart-nexthop-changes")
	b.ReportMetric(float64(neighChanges), "restart-neigh-changes")
	b.ReportMetric(ready.Seconds(), "restart-ready-s")
	b.ReportMetric(readyEtcd.Seconds(), "restart-ready-etcd-s")
	b.ReportMetric(float64(percentile(repair, 0.5).Microseconds())/1000, "repair-p50-ms")
	b.ReportMetric(float64(percentile(repair, 0.99).Microseconds())/1000, "repair-p99-ms")
	b.ReportMetric(float64(cpuPerChange.Microseconds())/1000, "cpu-per-change-ms")
	b.ReportMetric(float64(sysPerChange.Microseconds())/1000, "cpu-sys-per-change-ms")
	b.ReportMetric(float64(floor.Microseconds())/1000, "cpu-etcd-client-ms")
	b.ReportMetric(float64(peak)/1024, "peak-rss-MiB")
	b.ReportMetric(float64(settled)/1024, "settled-rss-MiB")
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's CPU times.
const clockTicks = 100

// cpuTicks returns a process's user and system CPU time so far, in clock ticks.
func cpuTicks(b *testing.B, pid int) int64 {
	u, st := cpuSplit(b, pid)
	return u + st
}

// cpuSplit reads a process's user and system CPU times, in clock ticks.
func cpuSplit(b *testing.B, pid int) (user, sys int64) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's closing parenthesis: utime and stime are the 12th
	// and 13th of them.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	user, _ = strconv.ParseInt(f[11], 10, 64)
	sys, _ = strconv.ParseInt(f[12], 10, 64)
	return user, sys
}

// saveHeap writes the settled agent's heap profile (after a GC) to path.
// Beside it, path.txt: the same in text, ending with the runtime's memory statistics (heap in
// use, idle, released; stacks; what RSS holds besides the live heap).
func saveHeap(b *testing.B, path string) {
	saveProfile(b, "http://127.0.0.1:9097/debug/pprof/heap?gc=1", path)
	saveProfile(b, "http://127.0.0.1:9097/debug/pprof/heap?gc=1&debug=1", strings.TrimSuffix(path, ".pb.gz")+".txt")
}

// saveProfile writes the profile served at url to path.
func saveProfile(b *testing.B, url, path string) {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		b.Fatal(err)
	}
	b.Logf("profile: %s", path)
}
