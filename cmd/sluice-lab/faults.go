package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/sluice-net/sluice/dataplane"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The fault suite (issue #10, `make faults`): faults injected into the running lab, each
// checked against what the agent promises (README, "What the agent promises under faults"),
// one PASS or FAIL line with its figure, and each ending with node-a's kernel compared with
// what a freshly started agent programs from the same data (`sluicectl diff`, which runs calc
// afresh on etcd's state and reads the node's kernel).

// faultLiveness is the agents' etcd-liveness in the suite: the default. faultResync is the
// lab agents' resync-interval.
const (
	faultLiveness = 10 * time.Second
	faultResync   = 30 * time.Second
)

func (l *lab) faults(ctx context.Context) (err error) {
	l.ctx = ctx
	defer l.end(&err)
	if err := l.setup(); err != nil {
		return err
	}
	// The service stage starts beside the routes, not before them: every agent is wholly
	// ready before a fault, so a fault's effect on readiness is its own.
	for _, n := range labNodes {
		took, body, ok := l.waitReady(n.name, 200, 30*time.Second)
		l.check(ok, "%s is ready (routes and service stage) %v after the lab came up: %s", n.name, took.Round(100*time.Millisecond), body)
	}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"the link to etcd cut without a word, then restored", l.faultLinkCut},
		{"etcd killed, then started again", l.faultEtcdKilled},
		{"bad and oversized values", l.faultBadValues},
		{"history compacted while the agent is stopped", l.faultCompacted},
		{"kernel state damaged by hand", l.faultKernelDamage},
		{"the agent killed at several points of a cold start of 20,000 blocks", l.faultColdStartKilled},
		{"the agent restarted (stopped, then killed) under a stream of changes", l.faultRestartUnderStream},
		{"the agent killed during a storm of connections through its node port", l.faultKilledUnderConnections},
		{"the service stage damaged by hand: frontends deleted, a program detached, a map pin removed", l.faultServiceDrift},
		{"the service stage cannot start (its pin directory unusable), then can", l.faultServiceStageDown},
		{"no cgroup v2 hierarchy visible to the agent", l.faultNoCgroup2},
	} {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l.step("fault: %s", c.name)
		if err := c.run(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		out, err := l.diff("node-a")
		l.check(err == nil && strings.Contains(out, "matches"), "after the fault node-a's kernel equals a fresh agent's on the same data")
	}
	return nil
}

// health fetches path from node's health address: the status code and the body.
func (l *lab) health(node, path string) (int, string) {
	out, err := l.nsRun(nodeNS(node), l.tool(), "http-get", "http://127.0.0.1:9097"+path)
	if err != nil {
		return 0, out
	}
	var code int
	fmt.Sscanf(out, "status %d", &code)
	return code, strings.TrimSpace(out)
}

// metricOf reads one metric of node's agent: name as the exposition writes it, labels and
// all (`sluice_drift_repairs_total{kind="nat"}`).
func (l *lab) metricOf(node, name string) string {
	_, body := l.health(node, "/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return "?"
}

// waitReady polls node's /readyz until it answers want (200 or 503), the timeout passes or
// the lab's context is done, and returns how long that took and the last answer.
func (l *lab) waitReady(node string, want int, timeout time.Duration) (time.Duration, string, bool) {
	start := time.Now()
	for {
		code, body := l.health(node, "/readyz")
		if code == want {
			return time.Since(start), body, true
		}
		if time.Since(start) > timeout || !l.sleep(100*time.Millisecond) {
			return time.Since(start), body, false
		}
	}
}

// hasRoute says whether node's kernel has a route for dst.
func hasRoute(node, dst string) bool {
	out, err := sh("ip", "-n", nodeNS(node), "route", "show", dst)
	return err == nil && strings.TrimSpace(out) != ""
}

func (l *lab) faultLinkCut() error {
	port := "a-node-a" // node-a's port on the router's bridge
	agent := l.agents["node-a"]
	silentBefore := agent.count("etcd has not answered")
	// Off the bridge, node-a's packets go nowhere: no reset, no unreachable, its own link up.
	if _, err := sh("ip", "-n", nsRouter, "link", "set", port, "nomaster"); err != nil {
		return err
	}
	cutAt := time.Now()
	took, body, ok := l.waitReady("node-a", 503, 3*faultLiveness)
	l.check(ok && took <= faultLiveness+faultLiveness/2, "node-a reports not ready %v after its link to etcd was cut (etcd-liveness %v): %s", took.Round(100*time.Millisecond), faultLiveness, body)
	l.check(l.metricOf("node-a", "sluice_etcd_in_sync") == "0" && l.metricOf("node-a", "sluice_etcd_silences_total") == "1",
		"during the cut sluice_etcd_in_sync is %s and sluice_etcd_silences_total %s", l.metricOf("node-a", "sluice_etcd_in_sync"), l.metricOf("node-a", "sluice_etcd_silences_total"))
	code, _ := l.health("node-a", "/livez")
	l.check(code == 200, "node-a stays live during the cut (/livez %d): a restart would not bring etcd back", code)
	routesBefore, _ := sh("ip", "-n", nodeNS("node-a"), "route", "show", "proto", "83")
	// A change made meanwhile: a new block on node-c, which node-a must route to.
	l.mustCtl("ipam", "claim", "--node", "node-c", "--pool", "pool-vxlan", "--cidr", "10.65.1.0/26")
	l.sleep(l.outage) // a longer outage: still one log line
	routesDuring, _ := sh("ip", "-n", nodeNS("node-a"), "route", "show", "proto", "83")
	fmt.Fprintf(l.out, "link cut for %v\n", time.Since(cutAt).Round(100*time.Millisecond))
	l.check(routesDuring == routesBefore, "node-a's routes are kept as they were while cut off")
	if _, err := sh("ip", "-n", nsRouter, "link", "set", port, "master", "br-a"); err != nil {
		return err
	}
	back := time.Now()
	_, err := l.retry(30*time.Second, func() error {
		if !hasRoute("node-a", "10.65.1.0/26") {
			return errors.New("no route yet")
		}
		return nil
	})
	caught := time.Since(back)
	tookReady, body, ok := l.waitReady("node-a", 200, 30*time.Second)
	l.check(err == nil && ok, "node-a caught up %v after the link came back (the route to the new block in its kernel), ready after %v: %s",
		caught.Round(10*time.Millisecond), tookReady.Round(10*time.Millisecond), body)
	n := agent.count("etcd has not answered") - silentBefore
	l.check(n == 1 && agent.count("etcd answers again") == 1, "the outage was logged once (%d) and the recovery once (%d)", n, agent.count("etcd answers again"))
	return nil
}

func (l *lab) faultEtcdKilled() error {
	if err := l.etcd.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-l.etcd.done
	killed := time.Now()
	took, body, ok := l.waitReady("node-a", 503, 3*faultLiveness)
	l.check(ok && took <= faultLiveness, "node-a reports not ready %v after etcd was killed: %s", took.Round(100*time.Millisecond), body)
	l.sleep(2 * time.Second)
	etcd, err := l.start(nsRouter, "etcd", false, l.tool(), "etcd", etcdListen, filepath.Join(l.dir, "etcd"))
	if err != nil {
		return err
	}
	if !etcd.waitFor(30*time.Second, "READY") {
		return fmt.Errorf("etcd did not start again: %v", etcd.lines)
	}
	l.etcd = etcd
	up := time.Now()
	for _, n := range labNodes {
		took, body, ok := l.waitReady(n.name, 200, 30*time.Second)
		l.check(ok, "%s ready %v after etcd was back (down %v): %s", n.name, took.Round(10*time.Millisecond), up.Sub(killed).Round(100*time.Millisecond), body)
	}
	// The watch works: a change reaches the kernel.
	l.mustCtl("ipam", "claim", "--node", "node-b", "--pool", "pool-vxlan", "--cidr", "10.65.1.64/26")
	_, err = l.retry(10*time.Second, func() error {
		if !hasRoute("node-a", "10.65.1.64/26") {
			return errors.New("no route yet")
		}
		return nil
	})
	l.check(err == nil, "a change after etcd's restart reaches node-a's kernel")
	return nil
}

// faultWEP is a workload endpoint on node-a for the bad-value case, with its interface.
const (
	faultWEPKey   = "/calico/resources/v3/projectcalico.org/workloadendpoints/default/node--a-k8s-fault-eth0"
	faultWEPIface = "cali-fault"
	faultWEPAddr  = "10.65.0.9"
)

func faultWEPValue(net string) string {
	return `{"kind":"WorkloadEndpoint","apiVersion":"projectcalico.org/v3","metadata":{"name":"node--a-k8s-fault-eth0","namespace":"default"},` +
		`"spec":{"orchestrator":"k8s","node":"node-a","pod":"fault","endpoint":"eth0","interfaceName":"` + faultWEPIface + `","ipNetworks":["` + net + `"]}}`
}

func (l *lab) faultBadValues() error {
	if _, err := sh("ip", "-n", nodeNS("node-a"), "link", "add", faultWEPIface, "type", "veth", "peer", "name", faultWEPIface+"-p"); err != nil {
		return err
	}
	if err := l.script([]string{"ip", "-n", nodeNS("node-a"), "link", "set", faultWEPIface, "up"},
		[]string{"ip", "-n", nodeNS("node-a"), "link", "set", faultWEPIface + "-p", "up"}); err != nil {
		return err
	}
	agent := l.agents["node-a"]
	before := l.metricOf("node-a", "sluice_etcd_bad_values_total")
	huge := strings.Repeat("9", 1<<20) // 1 MiB: etcd's default request limit is 1.5 MiB
	if err := l.etcdPut(faultWEPKey, faultWEPValue(huge)); err != nil {
		return err
	}
	_, err := l.retry(10*time.Second, func() error {
		if len(agent.matching("skipping invalid value")) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	longest := 0
	for _, line := range agent.lines {
		longest = max(longest, len(line))
	}
	l.check(err == nil && longest < 2048, "a 1 MiB invalid workload endpoint is rejected with a bounded log line (longest line of node-a's log: %d bytes)", longest)
	after := l.metricOf("node-a", "sluice_etcd_bad_values_total")
	l.check(after != before && after != "?", "it is counted: sluice_etcd_bad_values_total %s -> %s", before, after)
	out, err := l.diff("node-a")
	l.check(err == nil && strings.Contains(out, "matches"), "node-a's other state is intact")
	if err := l.etcdPut(faultWEPKey, faultWEPValue(faultWEPAddr+"/32")); err != nil {
		return err
	}
	_, err = l.retry(10*time.Second, func() error {
		if !hasRoute("node-a", faultWEPAddr) {
			return errors.New("no route yet")
		}
		return nil
	})
	route, _ := sh("ip", "-n", nodeNS("node-a"), "route", "show", faultWEPAddr)
	l.check(err == nil && strings.Contains(route, "dev "+faultWEPIface), "the value fixed takes effect: %s", strings.TrimSpace(route))
	return nil
}

func (l *lab) faultCompacted() error {
	l.check(l.agents["node-a"].stop() == nil, "sluiced on node-a stopped")
	// Meanwhile: a block claimed for node-c (a route to add), the fault workload removed (a
	// route to delete), and the history compacted past both.
	l.mustCtl("ipam", "claim", "--node", "node-c", "--pool", "pool-vxlan", "--cidr", "10.65.1.128/26")
	l.mustCtl("delete", "workloadendpoint", "default/node--a-k8s-fault-eth0")
	rev, err := l.etcdCompact()
	if err != nil {
		return err
	}
	fmt.Fprintf(l.out, "compacted etcd at revision %d\n", rev)
	agent, err := l.startAgent("node-a")
	if err != nil {
		return err
	}
	l.check(agent.waitFor(30*time.Second, "dataplane updated"), "sluiced on node-a is back")
	l.check(agent.count("state file not used", "etcd changed since revision") == 1 && agent.count("desired state restored") == 0,
		"the state it kept as it stopped was not used, etcd having changed since: %q", agent.matching("state"))
	lines := agent.matching("dataplane updated")
	first := ""
	if len(lines) > 0 {
		first = lines[0]
	}
	l.check(regexp.MustCompile(`writes=2\b`).MatchString(first), "its first apply wrote only the difference, 2 routes (one added, one removed): %s", strings.TrimSpace(first))
	l.check(hasRoute("node-a", "10.65.1.128/26") && !hasRoute("node-a", faultWEPAddr), "the new block is routed and the removed workload is not")
	return nil
}

func (l *lab) faultKernelDamage() error {
	ns := nodeNS("node-a")
	// Each repair is also seen in the agent's counters (the damage was there, however fast
	// it went): metric is the counter that must grow, "" for the device (its recreation is
	// logged, not counted).
	// node-c's nexthop object on node-a: deleting it takes node-c's route along, and the
	// kernel tells only of the object.
	objects, _ := sh("ip", "-n", ns, "nexthop", "show", "proto", "83")
	m := regexp.MustCompile(`(?m)^id (\d+) via 10\.65\.0\.128 dev vxlan\.sluice`).FindStringSubmatch(objects)
	if m == nil {
		return fmt.Errorf("node-a has no nexthop object for node-c's VTEP:\n%s", objects)
	}
	nodeC := m[1]
	cases := []struct {
		what, metric string
		damage       []string
		ok           func() bool
	}{
		{"node-c's nexthop object deleted (its route goes with it, unannounced)", `sluice_drift_repairs_total{kind="nexthop"}`, []string{"ip", "-n", ns, "nexthop", "del", "id", nodeC},
			func() bool {
				out, _ := sh("ip", "-n", ns, "route", "show", "10.65.0.128/26")
				return strings.Contains(out, "nhid "+nodeC+" via 10.65.0.128 dev vxlan.sluice")
			}},
		{"a route to a remote block deleted", `sluice_drift_repairs_total{kind="route"}`, []string{"ip", "-n", ns, "route", "del", "10.65.0.128/26"},
			func() bool { return hasRoute("node-a", "10.65.0.128/26") }},
		{"a neighbour entry of node-c's VTEP deleted", `sluice_drift_repairs_total{kind="neighbour"}`, []string{"ip", "-n", ns, "neigh", "del", "10.65.0.128", "dev", "vxlan.sluice"},
			func() bool {
				out, _ := sh("ip", "-n", ns, "neigh", "show", "10.65.0.128", "dev", "vxlan.sluice")
				return strings.Contains(out, "PERMANENT")
			}},
		{"the FDB entry of node-c's VTEP deleted", `sluice_drift_repairs_total{kind="neighbour"}`, []string{"bridge", "-n", ns, "fdb", "del", "66:c1:a0:00:00:0c", "dev", "vxlan.sluice", "dst", "192.168.20.13"},
			func() bool {
				out, _ := sh("bridge", "-n", ns, "fdb", "show", "dev", "vxlan.sluice")
				return strings.Contains(out, "66:c1:a0:00:00:0c dst 192.168.20.13")
			}},
		{"sluice's nftables table (outgoing NAT) deleted", `sluice_drift_repairs_total{kind="nat"}`, []string{"ip", "netns", "exec", ns, l.tool(), "nft-table", dataplane.NATTable, "delete"},
			func() bool {
				out, _ := l.nsRun(ns, l.tool(), "nft-table", dataplane.NATTable)
				return strings.Contains(out, "present")
			}},
		{"the VXLAN device deleted", "", []string{"ip", "-n", ns, "link", "del", "vxlan.sluice"},
			func() bool { return hasRoute("node-a", "10.65.0.128/26") && hasRoute("node-a", "10.65.0.64/26") }},
	}
	for _, c := range cases {
		if !c.ok() {
			return fmt.Errorf("%s: not there before the damage", c.what)
		}
		before := ""
		if c.metric != "" {
			before = l.metricOf("node-a", c.metric)
		}
		start := time.Now()
		if _, err := sh(c.damage...); err != nil {
			return fmt.Errorf("%s: %w", c.what, err)
		}
		_, err := l.retry(60*time.Second, func() error {
			if !c.ok() {
				return errors.New("not repaired")
			}
			return nil
		})
		took := time.Since(start) // from the damage command's start: includes running it
		counted := c.metric == ""
		if !counted {
			_, _ = l.retry(5*time.Second, func() error {
				if l.metricOf("node-a", c.metric) == before {
					return errors.New("not counted")
				}
				return nil
			})
			counted = l.metricOf("node-a", c.metric) != before
		}
		how := "recreated with its neighbours, FDB entries and routes"
		if c.metric != "" {
			how = fmt.Sprintf("counted: %s %s -> %s", c.metric, before, l.metricOf("node-a", c.metric))
		}
		l.check(err == nil && counted, "%s: repaired within %v of the damage (%s)", c.what, took.Round(time.Millisecond), how)
	}
	return nil
}

// etcdPut writes value under key raw, through the lab's tool inside the router (where etcd
// is), as any etcd writer could: sluicectl would refuse a bad value.
func (l *lab) etcdPut(key, value string) error {
	f, err := os.CreateTemp(l.dir, "value-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(value); err != nil {
		return err
	}
	f.Close()
	_, err = l.nsRun(nsRouter, l.tool(), "etcd-put", "http://"+etcdListen, key, f.Name())
	return err
}

func (l *lab) etcdCompact() (int64, error) {
	out, err := l.nsRun(nsRouter, l.tool(), "etcd-compact", "http://"+etcdListen)
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, out)
	}
	var rev int64
	fmt.Sscanf(out, "compacted %d", &rev)
	return rev, nil
}

// toolEtcdPut writes a file's bytes under a key, as any etcd writer could: no validation.
func toolEtcdPut(args []string) error {
	if len(args) != 3 {
		return errors.New("usage: etcd-put ENDPOINT KEY FILE")
	}
	b, err := os.ReadFile(args[2])
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{args[0]}, DialTimeout: 5 * time.Second, MaxCallSendMsgSize: 4 << 20})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Put(ctx, args[1], string(b))
	return err
}

// toolEtcdCompact compacts etcd's history up to its current revision.
func toolEtcdCompact(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: etcd-compact ENDPOINT")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{args[0]}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return err
	}
	fmt.Printf("compacted %d\n", resp.Header.Revision)
	return nil
}

// The fleet: fleetNodes nodes on another underlay, with fleetBlocks blocks among them in a
// pool of its own, so that node-a's cold start programs tens of thousands of objects.
const (
	fleetNodes  = 1000
	fleetBlocks = 20_000
)

// toolEtcdLoadFleet writes the fleet into etcd in Calico's format, 128 keys a transaction.
func toolEtcdLoadFleet(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: etcd-load-fleet ENDPOINT")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{args[0]}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	var ops []clientv3.Op
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := cli.Txn(ctx).Then(ops...).Commit()
		ops = ops[:0]
		return err
	}
	add := func(k, v string) error {
		ops = append(ops, clientv3.OpPut(k, v))
		if len(ops) == 128 {
			return flush()
		}
		return nil
	}
	block := func(i int) (netip.Prefix, string) {
		n := i * 64
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + n>>16), byte(n >> 8), byte(n)}), 26), fmt.Sprintf("fleet-%04d", i%fleetNodes)
	}
	if err := add(store.IPPoolPrefix+"pool-fleet", `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"pool-fleet"},"spec":{"cidr":"10.128.0.0/10","vxlanMode":"Always","ipipMode":"Never","blockSize":26}}`); err != nil {
		return err
	}
	for n := range fleetNodes {
		first, name := block(n)
		if err := add(store.NodePrefix+name, fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"bgp":{"ipv4Address":"198.18.%d.%d/16"},"ipv4VXLANTunnelAddr":%q}}`,
			name, n/250, n%250+1, first.Addr())); err != nil {
			return err
		}
	}
	for i := range fleetBlocks {
		cidr, node := block(i)
		v := fmt.Sprintf(`{"cidr":%q,"affinity":"host:%s","allocations":[%s],"unallocated":[],"attributes":[],"deleted":false}`,
			cidr, node, strings.TrimSuffix(strings.Repeat("null,", 64), ","))
		if err := add(store.BlockKey(cidr), v); err != nil {
			return err
		}
		if err := add(store.AffinityKey(node, cidr), `{"state":"confirmed","deleted":false}`); err != nil {
			return err
		}
	}
	return flush()
}

// faultColdStartKilled kills node-a's agent (SIGKILL) at several points of a cold start of
// 20,000 remote blocks and starts it again; the last start must leave the kernel equal to a
// fresh agent's, and objects of other software untouched.
func (l *lab) faultColdStartKilled() error {
	ns := nodeNS("node-a")
	l.check(l.agents["node-a"].stop() == nil, "sluiced on node-a stopped")
	if out, err := l.nsRun(nsRouter, l.tool(), "etcd-load-fleet", "http://"+etcdListen); err != nil {
		return fmt.Errorf("loading the fleet: %v: %s", err, out)
	}
	fmt.Fprintf(l.out, "loaded %d nodes and %d blocks (with their affinities) into etcd\n", fleetNodes, fleetBlocks)
	// Other software's objects: a route of another protocol, one in sluice's range of
	// addresses but not its protocol, and a device.
	if err := l.script([]string{"ip", "-n", ns, "route", "add", "10.99.0.0/24", "dev", "eth0", "proto", "static"},
		[]string{"ip", "-n", ns, "route", "add", "10.128.0.0/26", "dev", "eth0", "proto", "boot", "metric", "50"},
		[]string{"ip", "-n", ns, "link", "add", "foreign0", "type", "veth", "peer", "name", "foreign1"}); err != nil {
		return err
	}
	for _, after := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 600 * time.Millisecond, 700 * time.Millisecond, 900 * time.Millisecond} {
		agent, err := l.startAgent("node-a")
		if err != nil {
			return err
		}
		l.sleep(after)
		_ = agent.cmd.Process.Signal(syscall.SIGKILL)
		<-agent.done
		routes, _ := sh("ip", "-n", ns, "route", "show", "proto", "83")
		fmt.Fprintf(l.out, "killed %v into the cold start: %d of sluice's routes in the kernel\n", after, strings.Count(routes, "\n"))
	}
	start := time.Now()
	agent, err := l.startAgent("node-a")
	if err != nil {
		return err
	}
	l.check(agent.waitFor(60*time.Second, "dataplane updated"), "sluiced on node-a, started after being killed six times, has applied (%v)", time.Since(start).Round(10*time.Millisecond))
	// The service stage starts beside the routes and programs the fleet's 20,000 cluster nets
	// in its first apply: the comparison with a fresh agent (after this fault) waits for it.
	l.check(agent.waitFor(60*time.Second, "service maps updated"), "and its service stage has programmed its maps (%v)", time.Since(start).Round(10*time.Millisecond))
	routes, _ := sh("ip", "-n", ns, "route", "show", "proto", "83")
	n := len(fleetRoutes(routes, false))
	l.check(n == fleetBlocks, "node-a routes the fleet's %d blocks (%d of sluice's routes in the fleet's pool)", fleetBlocks, n)
	static, _ := sh("ip", "-n", ns, "route", "show", "10.99.0.0/24")
	boot, _ := sh("ip", "-n", ns, "route", "show", "10.128.0.0/26", "proto", "boot")
	dev, _ := sh("ip", "-n", ns, "link", "show", "foreign0")
	l.check(strings.Contains(static, "proto static") && strings.Contains(boot, "metric 50") && strings.Contains(dev, "foreign0"),
		"other software's routes and device are untouched")
	return l.script([]string{"ip", "-n", ns, "route", "del", "10.99.0.0/24"}, []string{"ip", "-n", ns, "route", "del", "10.128.0.0/26", "proto", "boot", "metric", "50"},
		[]string{"ip", "-n", ns, "link", "del", "foreign0"})
}

// The fleet's pool, and the part of it the churn uses (blocks no fleet node holds).
var (
	fleetPool  = netip.MustParsePrefix("10.128.0.0/10")
	churnRange = netip.MustParsePrefix("10.190.0.0/16")
)

// fleetRoutes returns the destinations in the fleet's pool named by lines of `ip route` or
// `ip monitor route` output (outside the churn's range unless churn is set).
func fleetRoutes(out string, churn bool) []string {
	var dsts []string
	for _, line := range strings.Split(out, "\n") {
		fs := strings.Fields(strings.TrimPrefix(line, "Deleted "))
		if len(fs) == 0 {
			continue
		}
		p, err := netip.ParsePrefix(fs[0])
		if err != nil || !fleetPool.Contains(p.Addr()) || churnRange.Contains(p.Addr()) != churn {
			continue
		}
		dsts = append(dsts, line)
	}
	return dsts
}

// toolEtcdChurn changes the fleet for a while: every 50 ms a block of one of the first ten
// fleet nodes, in the churn range, appears or goes (with its affinity).
func toolEtcdChurn(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: etcd-churn ENDPOINT DURATION")
	}
	d, err := time.ParseDuration(args[1])
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{args[0]}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	changes := 0
	for i := 0; time.Duration(i)*50*time.Millisecond < d; i++ {
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 190, byte(i / 2 % 200), 0}), 26)
		node := fmt.Sprintf("fleet-%04d", i/2%10)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var ops []clientv3.Op
		if i%2 == 0 {
			ops = []clientv3.Op{clientv3.OpPut(store.BlockKey(cidr), fmt.Sprintf(`{"cidr":%q,"affinity":"host:%s","allocations":[%s],"unallocated":[],"attributes":[],"deleted":false}`,
				cidr, node, strings.TrimSuffix(strings.Repeat("null,", 64), ","))), clientv3.OpPut(store.AffinityKey(node, cidr), `{"state":"confirmed","deleted":false}`)}
		} else {
			ops = []clientv3.Op{clientv3.OpDelete(store.BlockKey(cidr)), clientv3.OpDelete(store.AffinityKey(node, cidr))}
		}
		_, err := cli.Txn(ctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return err
		}
		changes++
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("DONE %d changes\n", changes)
	return nil
}

// faultRestartUnderStream restarts node-a's agent twice (SIGTERM, then SIGKILL) while blocks
// of ten fleet nodes come and go, and watches node-a's routes meanwhile: no route of the
// 990 unchanged nodes may be deleted, added or replaced.
func (l *lab) faultRestartUnderStream() error {
	ns := nodeNS("node-a")
	monitor, err := l.start(ns, "monitor", false, "ip", "monitor", "route")
	if err != nil {
		return err
	}
	l.sleep(200 * time.Millisecond)
	churn, err := l.start(nsRouter, "churn", false, l.tool(), "etcd-churn", "http://"+etcdListen, "8s")
	if err != nil {
		return err
	}
	l.sleep(1500 * time.Millisecond)
	l.check(l.agents["node-a"].stop() == nil, "sluiced on node-a stopped (SIGTERM) during the stream")
	agent, err := l.startAgent("node-a")
	if err != nil {
		return err
	}
	l.check(agent.waitFor(30*time.Second, "dataplane updated"), "started again, it applied")
	l.sleep(time.Second)
	_ = agent.cmd.Process.Signal(syscall.SIGKILL)
	<-agent.done
	agent, err = l.startAgent("node-a")
	if err != nil {
		return err
	}
	l.check(agent.waitFor(30*time.Second, "dataplane updated"), "killed (SIGKILL) during the stream and started again, it applied")
	<-churn.done
	l.check(churn.err == nil && churn.count("DONE") == 1, "the stream of changes ran throughout: %s", strings.Join(churn.lines, " "))
	l.sleep(2 * time.Second) // the last changes reach the kernel
	_ = monitor.stop()
	monitor.mu.Lock()
	all := strings.Join(monitor.lines, "\n")
	monitor.mu.Unlock()
	moved := fleetRoutes(all, false)
	churned := fleetRoutes(all, true)
	l.check(len(moved) == 0 && len(churned) > 0, "no route of an unchanged node moved (%d route events of the 990 unchanged nodes; %d of the ten changing ones)", len(moved), len(churned))
	if len(moved) > 0 {
		fmt.Fprintf(l.out, "moved: %s\n", strings.Join(moved[:min(5, len(moved))], "\n"))
	}
	return nil
}

// faultKilledUnderConnections kills node-a's agent (SIGKILL) while a client outside the
// cluster opens connection after connection through node-a's node port to the endpoint on
// node-b, and starts it again: the programs and maps are pinned, so none may fail.
func (l *lab) faultKilledUnderConnections() error {
	if err := l.apply("fault-services.yaml", seedServices); err != nil {
		return err
	}
	if _, err := l.start(wlNS(l.workload("web-b")), "echo web-b", false, l.tool(), "tcp-serve", "10.65.0.65:8081"); err != nil {
		return err
	}
	front := nodeIPs["node-a"] + ":30090"
	_, err := l.retry(15*time.Second, func() error {
		_, err := l.nsRun(nsExt, l.tool(), "tcp-check", front)
		return err
	})
	l.check(err == nil, "the node port on node-a answers (endpoint on node-b)")
	loop, err := l.start(nsExt, "loop", false, l.tool(), "tcp-loop", front)
	if err != nil {
		return err
	}
	loop.waitFor(3*time.Second, "READY")
	l.sleep(time.Second)
	agent := l.agents["node-a"]
	_ = agent.cmd.Process.Signal(syscall.SIGKILL)
	<-agent.done
	l.sleep(time.Second)
	agent, err = l.startAgent("node-a")
	if err != nil {
		return err
	}
	l.check(agent.waitFor(30*time.Second, "in sync with etcd"), "sluiced on node-a, killed (SIGKILL) and started again, is in sync")
	l.sleep(2 * time.Second)
	// It adopts the pinned maps as they are: an apply that writes logs "service maps updated".
	l.check(agent.count("service maps updated") == 0, "it adopted the pinned service maps and programs, writing nothing")
	_ = loop.stdin.Close()
	<-loop.done
	l.check(loop.err == nil && loop.count("failed 0") == 1, "no connection failed while the agent was killed and restarted: %s", oneLine(strings.Join(loop.lines, " ")))
	return nil
}

// toolBPFDamage damages an agent's service stage as someone with bpftool might: every
// frontend entry deleted, the program on a host interface's ingress detached, the backend
// map's pin removed.
func toolBPFDamage(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: bpf-damage PIN-DIR IFACE")
	}
	dir := args[0]
	fe, err := ebpf.LoadPinnedMap(filepath.Join(dir, "sl_fe_v4"), nil)
	if err != nil {
		return err
	}
	defer fe.Close()
	var keys [][]byte
	k := make([]byte, fe.KeySize())
	v := make([]byte, fe.ValueSize())
	it := fe.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, append([]byte(nil), k...))
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := fe.Delete(k); err != nil {
			return err
		}
	}
	ln, err := link.LoadPinnedLink(filepath.Join(dir, "links", args[1]+"_ingress"), nil)
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := ln.Detach(); err != nil {
		return fmt.Errorf("detaching: %w", err)
	}
	if err := os.Remove(filepath.Join(dir, "sl_be_v4")); err != nil {
		return err
	}
	fmt.Printf("deleted %d frontends, detached %s ingress, removed the pin of sl_be_v4\n", len(keys), args[1])
	return nil
}

// faultServiceDrift damages node-a's service stage by hand (frontends deleted, a program
// detached, a map pin removed) and waits for the resync to repair all three.
func (l *lab) faultServiceDrift() error {
	front := nodeIPs["node-a"] + ":30090"
	agent := l.agents["node-a"]
	before := len(agent.matching("service stage drift repaired"))
	out, err := sh(l.tool(), "bpf-damage", filepath.Join(l.dir, "bpf", "node-a"), "eth0")
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	fmt.Fprint(l.out, out)
	_, broken := l.nsRun(nsExt, l.tool(), "tcp-check", front)
	l.check(broken != nil, "with its frontends gone node-a's node port does not answer")
	took, err := l.retry(2*faultResync+10*time.Second, func() error {
		_, err := l.nsRun(nsExt, l.tool(), "tcp-check", front)
		return err
	})
	l.check(err == nil, "the node port works again %v later (resync-interval %v)", took.Round(100*time.Millisecond), faultResync)
	_, err = l.retry(5*time.Second, func() error {
		if len(agent.matching("service stage drift repaired")) == before {
			return errors.New("not logged")
		}
		return nil
	})
	lines := agent.matching("service stage drift repaired")
	last := ""
	if len(lines) > 0 {
		last = lines[len(lines)-1]
	}
	l.check(err == nil && !strings.Contains(last, "map_entries=0") && !strings.Contains(last, "links=0") && !strings.Contains(last, "pins=0"),
		"the repair is counted and logged, entries, link and pin: %s", strings.TrimSpace(last))
	pin, _ := os.Stat(filepath.Join(l.dir, "bpf", "node-a", "sl_be_v4"))
	l.check(pin != nil, "the backend map is pinned again")
	return nil
}

// faultServiceStageDown starts node-a's agent with the service stage unable to start (its pin
// directory lies under a regular file, so bpffs can be neither found nor mounted there) on a
// node cleaned of every service program: the routes are programmed all the same, and the
// failure shows in the log, /readyz, the metric, sluicectl status and the proxy health port.
// The file removed, the stage starts by itself and node-a's node port works.
func (l *lab) faultServiceStageDown() error {
	l.check(l.agents["node-a"].stop() == nil, "sluiced on node-a stopped")
	// A clean slate: --services=false removes node-a's programs, links and pins.
	clean, err := l.startAgent("node-a", "--services=false")
	if err != nil {
		return err
	}
	l.check(clean.waitFor(30*time.Second, "dataplane updated"), "sluiced --services=false on node-a removed its service programs and applied")
	l.check(clean.stop() == nil, "and stopped")
	blocked := filepath.Join(l.dir, "blocked")
	if err := os.WriteFile(blocked, []byte("in the way\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(blocked)
	// A route deleted by hand while the agent is down: the new agent must put it back.
	if _, err := sh("ip", "-n", nodeNS("node-a"), "route", "del", "10.65.0.128/26"); err != nil {
		return err
	}
	agent, err := l.startAgent("node-a", "--bpf-pin-dir", filepath.Join(blocked, "node-a"))
	if err != nil {
		return err
	}
	l.check(agent.waitFor(30*time.Second, "dataplane updated"), "the agent applied its routes with the service stage down")
	l.check(agent.waitFor(10*time.Second, "the service stage cannot start") && len(agent.matching("step=bpffs")) > 0,
		"it says in one line why the service stage cannot start: %s", oneLine(strings.Join(agent.matching("the service stage cannot start"), " ")))
	l.check(hasRoute("node-a", "10.65.0.128/26"), "the route deleted while it was down is back")
	l.check(l.ping("web-a", "web-c") == nil, "web-a (node-a) pings web-c (node-c) through VXLAN")
	_, body, ok := l.waitReady("node-a", 503, 10*time.Second)
	l.check(ok && strings.Contains(body, "service stage not working") && strings.Contains(body, "pin directory"),
		"/readyz answers 503 and says why: %s", oneLine(body))
	l.check(l.metricOf("node-a", `sluice_services_ready{reason="bpffs"}`) == "0", "sluice_services_ready{reason=\"bpffs\"} is 0")
	out, _ := l.ctl("status", "--settle", "0")
	l.check(lineWith(out, "node-a", "services down (routes programmed)"), "sluicectl status shows node-a's services down, its routes programmed")
	proxy, _ := l.nsRun(nodeNS("node-a"), l.tool(), "http-get", "http://127.0.0.1:10256/healthz")
	l.check(strings.HasPrefix(proxy, "status 503"), "the proxy health port answers 503, so load balancers steer away: %s", oneLine(proxy))
	front := nodeIPs["node-a"] + ":30090"
	_, err = l.nsRun(nsExt, l.tool(), "tcp-check", front)
	l.check(err != nil, "node-a's node port does not answer while the stage is down")

	start := time.Now()
	if err := os.Remove(blocked); err != nil {
		return err
	}
	l.check(agent.waitFor(90*time.Second, "service stage started"), "the file removed, the service stage starts by itself, without a restart (%v)", time.Since(start).Round(100*time.Millisecond))
	took, body, ok := l.waitReady("node-a", 200, 20*time.Second)
	l.check(ok, "/readyz answers 200 %v later: %s", took.Round(100*time.Millisecond), oneLine(body))
	_, err = l.retry(10*time.Second, func() error {
		_, err := l.nsRun(nsExt, l.tool(), "tcp-check", front)
		return err
	})
	l.check(err == nil, "node-a's node port answers (endpoint on node-b)")
	proxy, _ = l.nsRun(nodeNS("node-a"), l.tool(), "http-get", "http://127.0.0.1:10256/healthz")
	l.check(strings.HasPrefix(proxy, "status 200"), "the proxy health port answers 200: %s", oneLine(proxy))
	l.check(l.metricOf("node-a", "sluice_services_ready") == "1", "sluice_services_ready is 1, with no reason")
	// Back to the lab's own pin directory (this agent's bpffs went with its mount namespace).
	l.check(agent.stop() == nil, "stopped")
	agent, err = l.startAgent("node-a")
	if err != nil {
		return err
	}
	l.check(agent.waitFor(30*time.Second, "service stage started"), "started again with the lab's pin directory")
	_, _, ok = l.waitReady("node-a", 200, 20*time.Second)
	l.check(ok, "and ready")
	return nil
}

// faultNoCgroup2 starts node-a's agent in a mount namespace of its own where every cgroup2
// mount is unmounted, as on a cgroup v1 host (util-linux's unshare and umount), with the
// option that finds the hierarchy itself. The agent mounts one of its own and node-a itself
// reaches a cluster IP through the socket programs.
func (l *lab) faultNoCgroup2() error {
	_, existed := os.Stat(bpf.DefaultCgroupMount)
	l.check(l.agents["node-a"].stop() == nil, "sluiced on node-a stopped")
	l.agentWrap = []string{"unshare", "--mount", "--propagation", "slave", "sh", "-c", `umount -a -l -t cgroup2 && exec "$@"`, "sh"}
	agent, err := l.startAgent("node-a", "--cgroup-path", "")
	l.agentWrap = nil
	if err != nil {
		return err
	}
	if existed != nil {
		defer os.Remove(bpf.DefaultCgroupMount) // the directory, left on the host's /run; the mount went with the agent
		defer os.Remove(filepath.Dir(bpf.DefaultCgroupMount))
	}
	l.check(agent.waitFor(30*time.Second, "mounted for the service stage") && len(agent.matching("fs=cgroup2")) > 0,
		"it mounts a cgroup2 hierarchy of its own and says so: %s", oneLine(strings.Join(agent.matching("mounted for the service stage"), " ")))
	_, _, ok := l.waitReady("node-a", 200, 30*time.Second)
	l.check(ok, "node-a is ready")
	_, err = l.retry(10*time.Second, func() error {
		_, err := l.nsRun(nodeNS("node-a"), l.tool(), "tcp-check", "10.96.0.20:80")
		return err
	})
	l.check(err == nil, "node-a itself reaches cluster IP 10.96.0.20:80 (socket programs on sluice's own cgroup2 mount)")
	l.check(agent.stop() == nil, "stopped")
	if _, err := l.startAgent("node-a"); err != nil {
		return err
	}
	_, _, ok = l.waitReady("node-a", 200, 30*time.Second)
	l.check(ok, "started again with the lab's cgroup2, and ready")
	return nil
}

// lineWith says whether one line of out holds every part.
func lineWith(out string, parts ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}
