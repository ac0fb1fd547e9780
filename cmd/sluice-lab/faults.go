package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The fault suite (issue #10, `make faults`): faults injected into the running lab, each
// checked against what the agent promises (README, "What the agent promises under faults"),
// one PASS or FAIL line with its figure, and each ending with node-a's kernel compared with
// what a freshly started agent programs from the same data (`sluicectl diff`, which runs calc
// afresh on etcd's state and reads the node's kernel).

// faultLiveness is the agents' etcd-liveness in the suite: the default.
const faultLiveness = 10 * time.Second

func (l *lab) faults(ctx context.Context) error {
	defer l.cleanup()
	if err := l.setup(); err != nil {
		return err
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
	out, err := nsRun(nodeNS(node), l.tool(), "http-get", "http://127.0.0.1:9097"+path)
	if err != nil {
		return 0, out
	}
	var code int
	fmt.Sscanf(out, "status %d", &code)
	return code, strings.TrimSpace(out)
}

// metricOf reads one unlabelled metric of node's agent.
func (l *lab) metricOf(node, name string) string {
	_, body := l.health(node, "/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return "?"
}

// waitReady polls node's /readyz until it answers want (200 or 503) and returns how long
// that took and the last answer.
func (l *lab) waitReady(node string, want int, timeout time.Duration) (time.Duration, string, bool) {
	start := time.Now()
	for {
		code, body := l.health(node, "/readyz")
		if code == want {
			return time.Since(start), body, true
		}
		if time.Since(start) > timeout {
			return time.Since(start), body, false
		}
		time.Sleep(100 * time.Millisecond)
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
	took, body, ok := l.waitReady("node-a", 503, 3*faultLiveness)
	l.check(ok && took <= faultLiveness+faultLiveness/2, "node-a reports not ready %v after its link to etcd was cut (etcd-liveness %v): %s", took.Round(100*time.Millisecond), faultLiveness, body)
	l.check(l.metricOf("node-a", "sluice_etcd_in_sync") == "0" && l.metricOf("node-a", "sluice_etcd_silences_total") == "1",
		"during the cut sluice_etcd_in_sync is %s and sluice_etcd_silences_total %s", l.metricOf("node-a", "sluice_etcd_in_sync"), l.metricOf("node-a", "sluice_etcd_silences_total"))
	code, _ := l.health("node-a", "/livez")
	l.check(code == 200, "node-a stays live during the cut (/livez %d): a restart would not bring etcd back", code)
	routesBefore, _ := sh("ip", "-n", nodeNS("node-a"), "route", "show", "proto", "83")
	// A change made meanwhile: a new block on node-c, which node-a must route to.
	l.mustCtl("ipam", "claim", "--node", "node-c", "--pool", "pool-vxlan", "--cidr", "10.65.1.0/26")
	time.Sleep(faultLiveness) // a longer outage: still one log line
	routesDuring, _ := sh("ip", "-n", nodeNS("node-a"), "route", "show", "proto", "83")
	l.check(routesDuring == routesBefore, "node-a's routes are kept as they were while cut off")
	if _, err := sh("ip", "-n", nsRouter, "link", "set", port, "master", "br-a"); err != nil {
		return err
	}
	back := time.Now()
	_, err := retry(30*time.Second, func() error {
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
	time.Sleep(2 * time.Second)
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
	_, err = retry(10*time.Second, func() error {
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
	if err := script([]string{"ip", "-n", nodeNS("node-a"), "link", "set", faultWEPIface, "up"},
		[]string{"ip", "-n", nodeNS("node-a"), "link", "set", faultWEPIface + "-p", "up"}); err != nil {
		return err
	}
	agent := l.agents["node-a"]
	before := l.metricOf("node-a", "sluice_etcd_bad_values_total")
	huge := strings.Repeat("9", 1<<20) // 1 MiB: etcd's default request limit is 1.5 MiB
	if err := l.etcdPut(faultWEPKey, faultWEPValue(huge)); err != nil {
		return err
	}
	_, err := retry(10*time.Second, func() error {
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
	_, err = retry(10*time.Second, func() error {
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
	cases := []struct {
		what, metric string
		damage       []string
		ok           func() bool
	}{
		{"a route to a remote block deleted", "sluice_drift_repairs_route_total", []string{"ip", "-n", ns, "route", "del", "10.65.0.128/26"},
			func() bool { return hasRoute("node-a", "10.65.0.128/26") }},
		{"a neighbour entry of node-c's VTEP deleted", "sluice_drift_repairs_neighbour_total", []string{"ip", "-n", ns, "neigh", "del", "10.65.0.128", "dev", "vxlan.sluice"},
			func() bool {
				out, _ := sh("ip", "-n", ns, "neigh", "show", "10.65.0.128", "dev", "vxlan.sluice")
				return strings.Contains(out, "PERMANENT")
			}},
		{"the FDB entry of node-c's VTEP deleted", "sluice_drift_repairs_neighbour_total", []string{"bridge", "-n", ns, "fdb", "del", "66:c1:a0:00:00:0c", "dev", "vxlan.sluice", "dst", "192.168.20.13"},
			func() bool {
				out, _ := sh("bridge", "-n", ns, "fdb", "show", "dev", "vxlan.sluice")
				return strings.Contains(out, "66:c1:a0:00:00:0c dst 192.168.20.13")
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
		_, err := retry(60*time.Second, func() error {
			if !c.ok() {
				return errors.New("not repaired")
			}
			return nil
		})
		took := time.Since(start) // from the damage command's start: includes running it
		counted := c.metric == ""
		if !counted {
			_, _ = retry(5*time.Second, func() error {
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
	_, err = nsRun(nsRouter, l.tool(), "etcd-put", "http://"+etcdListen, key, f.Name())
	return err
}

func (l *lab) etcdCompact() (int64, error) {
	out, err := nsRun(nsRouter, l.tool(), "etcd-compact", "http://"+etcdListen)
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
