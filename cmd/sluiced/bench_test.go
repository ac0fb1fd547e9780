package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	"github.com/vishvananda/netlink"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if etcdtest.ServeChild() {
		return
	}
	os.Exit(m.Run())
}

const (
	benchBlocks = 20_000
	benchNodes  = 1000
	coldRuns    = 3 // cold starts and ip -batch runs; the median of each is reported
)

// benchBlock is remote block i: node i%1000+1, a /26 in 10.64.0.0/10.
func benchBlock(i int) (netip.Prefix, string) {
	n := i * 64
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(64 + n>>16), byte(n >> 8), byte(n)}), 26), fmt.Sprintf("node-%04d", i%benchNodes+1)
}

// benchTunnel is node n's VXLAN tunnel address: the first address of its first block, as
// calico-ipam hands it out.
func benchTunnel(node int) string {
	cidr, _ := benchBlock(node - 1)
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

// loadBench writes the pool, node-0000 (this node) and 1,000 remote nodes, and 20,000 remote
// blocks with their affinities, in Calico's format.
func loadBench(b testing.TB, cli *clientv3.Client) {
	add, flush := benchWriter(b, cli)
	add(store.IPPoolPrefix+"bench", `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"bench"},"spec":{"cidr":"10.64.0.0/10","vxlanMode":"Always","ipipMode":"Never","blockSize":26}}`)
	add(store.NodePrefix+"node-0000", `{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-0000"},"spec":{"bgp":{"ipv4Address":"192.0.2.11/24"},"ipv4VXLANTunnelAddr":"172.31.0.1"}}`) // this node's blocks are not part of the run
	for n := 1; n <= benchNodes; n++ {
		name := fmt.Sprintf("node-%04d", n)
		add(store.NodePrefix+name, fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"bgp":{"ipv4Address":"198.51.%d.%d/16"},"ipv4VXLANTunnelAddr":%q}}`, name, 100+n/250, n%250+1, benchTunnel(n)))
	}
	for i := range benchBlocks {
		cidr, node := benchBlock(i)
		add(store.BlockKey(cidr), blockJSON(cidr, node))
		add(store.AffinityKey(node, cidr), `{"state":"confirmed","deleted":false}`)
	}
	flush()
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

type agentProc struct {
	cmd   *exec.Cmd
	lines chan string
}

func startAgent(b *testing.B, bin, endpoint string) *agentProc {
	cmd := exec.Command(bin, "--etcd-endpoints", endpoint, "--node-name", "node-0000", "--log-format", "json", "--services=false")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	a := &agentProc{cmd: cmd, lines: make(chan string, 1024)}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) // even when the benchmark fails
	go func() {
		sc := bufio.NewScanner(stderr)
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
	dir := b.TempDir()
	bin := filepath.Join(dir, "sluiced")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("building sluiced: %v\n%s", err, out)
	}
	for _, c := range [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peth0"},
		{"ip", "addr", "add", "192.0.2.11/24", "dev", "eth0"}, {"ip", "link", "set", "eth0", "up"}, {"ip", "link", "set", "peth0", "up"}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v %s", c, err, out)
		}
	}
	etcd, err := etcdtest.StartChild(etcdtest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer etcd.Close()
	cli, err := store.ClientConfig{Endpoints: []string{etcd.Endpoint()}}.New()
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	loadBench(b, cli)

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
	var colds []time.Duration
	for run := range coldRuns {
		if agent != nil {
			agent.stop()
			for _, c := range [][]string{{"ip", "link", "del", "vxlan.sluice"}, {"ip", "route", "flush", "proto", "83"}} {
				if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
					b.Fatalf("%v: %v %s", c, err, out)
				}
			}
			if n := count(); n != 0 {
				b.Fatalf("%d routes left before cold start %d", n, run+1)
			}
		}
		coldStart := time.Now()
		agent = startAgent(b, bin, etcd.Endpoint())
		var phases []string
		for {
			l, ok := agent.next(2 * time.Minute)
			if !ok {
				b.Fatalf("cold start: sluiced ended or said nothing for 2 minutes; %d of %d routes in the kernel", count(), benchBlocks)
			}
			for _, m := range []string{"desired state computed", "dataplane updated"} {
				if strings.Contains(l, m) {
					var at struct{ Time time.Time }
					_ = json.Unmarshal([]byte(l), &at)
					phases = append(phases, fmt.Sprintf("%v %s", at.Time.Sub(coldStart).Round(time.Millisecond), m))
				}
			}
			if strings.Contains(l, "dataplane updated") {
				break
			}
		}
		colds = append(colds, time.Since(coldStart))
		if n := count(); n != benchBlocks {
			b.Fatalf("cold start: sluiced said the dataplane was updated with %d of %d routes in the kernel", n, benchBlocks)
		}
		b.Logf("cold start %d: %v (%s)", run+1, colds[run].Round(time.Millisecond), strings.Join(phases, ", "))
	}
	cold := percentile(colds, 0.5)
	events := subscribeRoutes(b)
	defer events.close()
	time.Sleep(2 * time.Second)
	peak, settled := memKiB(agent.cmd.Process.Pid)

	// One new block at a time.
	var perBlock []time.Duration
	for i := range 200 {
		cidr, node := benchBlock(benchBlocks + i)
		events.drain()
		start := time.Now()
		if _, err := cli.Txn(context.Background()).Then(clientv3.OpPut(store.BlockKey(cidr), blockJSON(cidr, node)),
			clientv3.OpPut(store.AffinityKey(node, cidr), `{"state":"confirmed","deleted":false}`)).Commit(); err != nil {
			b.Fatal(err)
		}
		want := cidr.String()
		if _, ok := events.until(10*time.Second, func(u netlink.RouteUpdate) bool {
			return u.Type == unix.RTM_NEWROUTE && u.Dst != nil && u.Dst.String() == want
		}); !ok {
			b.Fatalf("no route for the new block %s", cidr)
		}
		perBlock = append(perBlock, time.Since(start))
	}
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
		cidr, _ := benchBlock(i * 97)
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

	// Restart with nothing changed.
	agent.stop()
	events.drain()
	start := time.Now()
	agent = startAgent(b, bin, etcd.Endpoint())
	if !agent.waitLine(time.Minute, "desired state computed") {
		b.Fatal("the restarted sluiced never computed its state")
	}
	ready := time.Since(start)
	time.Sleep(2 * time.Second)
	changes := events.drain()
	agent.stop()

	// Reference: ip -batch adding the same routes, after sluice's are flushed, with nothing
	// listening, as in the cold start.
	events.close()
	var batch strings.Builder
	for i := range benchBlocks { // the same 20,000 routes as the cold start
		cidr, node := benchBlock(i)
		n, _ := strconv.Atoi(strings.TrimPrefix(node, "node-"))
		fmt.Fprintf(&batch, "route replace %s via %s dev vxlan.sluice onlink proto 83\n", cidr, benchTunnel(n))
	}
	var ipTimes []time.Duration
	for range coldRuns {
		if out, err := exec.Command("ip", "route", "flush", "proto", "83").CombinedOutput(); err != nil {
			b.Fatalf("flush: %v %s", err, out)
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
		for _, prefix := range store.NodePrefixes("node-0000") {
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
		if n < benchBlocks+benchNodes {
			b.Fatalf("raw read: %d keys", n)
		}
	}
	rawRead := percentile(reads, 0.5)
	b.StopTimer()

	b.ReportMetric(cold.Seconds(), "cold-start-s")
	b.ReportMetric(ipTime.Seconds(), "ip-batch-s")
	b.ReportMetric(rawRead.Seconds(), "raw-read-s")
	b.ReportMetric(float64(percentile(perBlock, 0.5).Microseconds())/1000, "block-p50-ms")
	b.ReportMetric(float64(percentile(perBlock, 0.99).Microseconds())/1000, "block-p99-ms")
	b.ReportMetric(float64(percentile(etcdLat, 0.5).Microseconds())/1000, "etcd-watch-p50-ms")
	b.ReportMetric(float64(percentile(etcdLat, 0.99).Microseconds())/1000, "etcd-watch-p99-ms")
	b.ReportMetric(float64(changes), "restart-route-changes")
	b.ReportMetric(ready.Seconds(), "restart-ready-s")
	b.ReportMetric(float64(percentile(repair, 0.5).Microseconds())/1000, "repair-p50-ms")
	b.ReportMetric(float64(percentile(repair, 0.99).Microseconds())/1000, "repair-p99-ms")
	b.ReportMetric(float64(peak)/1024, "peak-rss-MiB")
	b.ReportMetric(float64(settled)/1024, "settled-rss-MiB")
}
