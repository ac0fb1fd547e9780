package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// setup builds the lab, starts etcd, loads the sample cluster and runs one sluiced per
// node, each in sync and programmed. The caller runs l.cleanup.
func (l *lab) setup() error {
	l.step("building three nodes, a router, a LAN gateway, a client and five workloads as network namespaces")
	if err := l.buildTopology(); err != nil {
		return err
	}
	var err error
	if l.dir, err = os.MkdirTemp("", "sluice-lab-"); err != nil {
		return err
	}

	l.step("starting etcd in the router namespace on %s", etcdListen)
	etcd, err := l.start(nsRouter, "etcd", false, l.tool(), "etcd", etcdListen, filepath.Join(l.dir, "etcd"))
	if err != nil {
		return err
	}
	if !etcd.waitFor(30*time.Second, "READY") {
		return fmt.Errorf("etcd did not start: %v", etcd.lines)
	}
	l.etcd = etcd

	l.step("loading the sample cluster from %s with sluicectl", l.testdata)
	l.mustCtl("apply", "-f", l.testdata)
	l.step("claiming blocks and assigning addresses as calico-ipam does")
	for i, node := range []string{"node-a", "node-b", "node-c"} {
		l.mustCtl("ipam", "claim", "--node", node, "--pool", "pool-vxlan", "--cidr", fmt.Sprintf("10.65.0.%d/26", 64*i))
		l.mustCtl("ipam", "assign", "--node", node, "--handle", "vxlan-tunnel-addr-"+node, "--ip", fmt.Sprintf("10.65.0.%d", 64*i))
		l.mustCtl("ipam", "assign", "--node", node, "--handle", "k8s-pod-network.web-"+node[5:], "--ip", fmt.Sprintf("10.65.0.%d", 64*i+1))
	}
	for i, node := range []string{"node-a", "node-b", "node-c"} {
		l.mustCtl("ipam", "claim", "--node", node, "--pool", "pool-v6", "--cidr", fmt.Sprintf("fd00:65::%x/122", 64*i))
		l.mustCtl("ipam", "assign", "--node", node, "--handle", "vxlan-v6-tunnel-addr-"+node, "--ip", fmt.Sprintf("fd00:65::%x", 64*i))
		l.mustCtl("ipam", "assign", "--node", node, "--handle", "k8s-pod-network.web-"+node[5:], "--ip", fmt.Sprintf("fd00:65::%x", 64*i+1))
	}
	for i, node := range []string{"node-a", "node-b"} {
		l.mustCtl("ipam", "claim", "--node", node, "--pool", "pool-cross", "--cidr", fmt.Sprintf("10.66.0.%d/26", 64*i))
		l.mustCtl("ipam", "assign", "--node", node, "--handle", "k8s-pod-network.db-"+node[5:], "--ip", fmt.Sprintf("10.66.0.%d", 64*i+1))
	}
	l.mustCtl("ipam", "show")
	l.mustCtl("get", "workloadendpoints")

	l.step("starting one sluiced per node, inside its namespace")
	for _, n := range labNodes {
		if _, err := l.startAgent(n.name); err != nil {
			return err
		}
	}
	for _, n := range labNodes {
		l.check(l.agents[n.name].waitFor(20*time.Second, "dataplane updated"), "sluiced on %s is in sync and has programmed its kernel", n.name)
	}
	return nil
}

// demo builds the lab, loads the sample cluster, runs sluiced on every node and checks the
// dataplane with real traffic.
func (l *lab) demo(ctx context.Context, keep bool) (err error) {
	l.ctx = ctx
	defer l.end(&err)
	if err := l.setup(); err != nil {
		return err
	}
	for _, w := range labWorkloads {
		if _, err := l.start(wlNS(w), "tcp "+w.name, false, l.tool(), "tcp-serve", w.addr+":8080"); err != nil {
			return err
		}
		if w.addr6 != "" {
			if _, err := l.start(wlNS(w), "tcp6 "+w.name, false, l.tool(), "tcp-serve", "["+w.addr6+"]:8080"); err != nil {
				return err
			}
		}
	}

	l.step("node-a's kernel, against what Calico's Felix programs for the same data")
	routes, _ := sh("ip", "-n", nodeNS("node-a"), "route", "show", "proto", "83")
	fmt.Fprint(l.out, routes)
	// node-a lays routes to other nodes out through nexthop objects (`nhid N`), node-c as
	// Felix does; either way the gateway, device and flag are Felix's.
	for _, want := range []string{
		"blackhole 10.65.0.0/26 metric 1024",
		"blackhole 10.66.0.0/26 metric 1024",
		"10.65.0.64/26 nhid * via 10.65.0.64 dev vxlan.sluice onlink",
		"10.65.0.128/26 nhid * via 10.65.0.128 dev vxlan.sluice onlink",
		"10.66.0.64/26 nhid * via 192.168.10.12 dev eth0 onlink",
		"10.65.0.1 dev cali-web-a scope link",
	} {
		l.check(routeLine(routes, want), "node-a has route %q", want)
	}
	objects, _ := sh("ip", "-n", nodeNS("node-a"), "nexthop", "show", "proto", "83")
	fmt.Fprint(l.out, objects)
	l.check(strings.Contains(objects, "via 10.65.0.128 dev vxlan.sluice scope link proto 83 onlink") &&
		strings.Contains(objects, "via 10.65.0.64 dev vxlan.sluice scope link proto 83 onlink") &&
		strings.Contains(objects, "via 192.168.10.12 dev eth0 scope link proto 83 onlink"),
		"node-a's nexthop objects: one per remote node and gateway, sluice's protocol")
	routesC, _ := sh("ip", "-n", nodeNS("node-c"), "route", "show", "proto", "83")
	l.check(strings.Contains(routesC, "10.65.0.0/26 via 10.65.0.0 dev vxlan.sluice onlink") && !strings.Contains(routesC, "nhid"),
		"node-c (--route-layout gateways) lays its routes out as Felix does: 10.65.0.0/26 via 10.65.0.0 dev vxlan.sluice onlink")
	link, _ := sh("ip", "-n", nodeNS("node-a"), "-d", "link", "show", "vxlan.sluice")
	l.check(strings.Contains(link, "vxlan id 4096") && strings.Contains(link, "dstport 4789") && strings.Contains(link, "nolearning") &&
		strings.Contains(link, "66:c1:a0:00:00:0a") && strings.Contains(link, "mtu 1450"),
		"node-a's vxlan.sluice: VNI 4096, port 4789, learning off, the node's MAC, MTU 1450")
	neigh, _ := sh("ip", "-n", nodeNS("node-a"), "neigh", "show", "dev", "vxlan.sluice")
	l.check(strings.Contains(neigh, "10.65.0.128 lladdr 66:c1:a0:00:00:0c PERMANENT"), "node-a has a permanent neighbour for node-c's VTEP")
	fdb, _ := sh("bridge", "-n", nodeNS("node-a"), "fdb", "show", "dev", "vxlan.sluice")
	l.check(strings.Contains(fdb, "66:c1:a0:00:00:0c dst 192.168.20.13"), "node-a has an FDB entry sending node-c's MAC to 192.168.20.13")

	routes6, _ := sh("ip", "-n", nodeNS("node-a"), "-6", "route", "show", "proto", "83")
	fmt.Fprint(l.out, routes6)
	for _, want := range []string{
		"blackhole fd00:65::/122",
		"fd00:65::40/122 nhid * via fd00:65::40 dev vxlan-v6.sluice metric 1024 onlink",
		"fd00:65::80/122 nhid * via fd00:65::80 dev vxlan-v6.sluice metric 1024 onlink",
		"fd00:65::1 dev cali-web-a metric 1024",
	} {
		l.check(routeLine(routes6, want), "node-a has IPv6 route %q", want)
	}
	link6, _ := sh("ip", "-n", nodeNS("node-a"), "-d", "link", "show", "vxlan-v6.sluice")
	l.check(strings.Contains(link6, "vxlan id 4096") && strings.Contains(link6, "dstport 4789") && strings.Contains(link6, "nolearning") &&
		strings.Contains(link6, "66:c1:a6:00:00:0a") && strings.Contains(link6, "mtu 1430") && strings.Contains(link6, "local fd00:10::11"),
		"node-a's vxlan-v6.sluice: VNI 4096, port 4789, learning off, the node's IPv6 MAC, MTU 1430, bound to fd00:10::11")
	fdb6, _ := sh("bridge", "-n", nodeNS("node-a"), "fdb", "show", "dev", "vxlan-v6.sluice")
	l.check(strings.Contains(fdb6, "66:c1:a6:00:00:0c dst fd00:20::13"), "node-a has an FDB entry sending node-c's IPv6 MAC to fd00:20::13")

	l.step("traffic between workloads on every pair of nodes")
	pairs := [][2]string{{"web-a", "web-b"}, {"web-b", "web-a"}, {"web-a", "web-c"}, {"web-c", "web-a"}, {"web-b", "web-c"}, {"web-c", "web-b"}, {"db-a", "db-b"}, {"db-b", "db-a"}}
	for _, p := range pairs {
		how := "through VXLAN"
		if strings.HasPrefix(p[0], "db") {
			how = "directly (CrossSubnet pool, same subnet)"
		}
		_, err := l.retry(10*time.Second, func() error { return l.ping(p[0], p[1]) })
		l.check(err == nil, "ping %s -> %s %s", p[0], p[1], how)
		_, err = l.retry(5*time.Second, func() error { return l.tcp(p[0], p[1], false) })
		l.check(err == nil, "TCP %s -> %s %s", p[0], p[1], how)
	}

	for _, p := range [][2]string{{"web-a", "web-b"}, {"web-a", "web-c"}, {"web-c", "web-a"}, {"web-c", "web-b"}} {
		_, err := l.retry(10*time.Second, func() error { return l.tcp(p[0], p[1], true) })
		l.check(err == nil, "TCP over IPv6 %s -> %s through vxlan-v6.sluice", p[0], p[1])
	}

	l.step("natOutgoing: workloads reach the LAN gateway (in no pool) as their node; between pools they keep their addresses")
	if p, err := l.start(nsGateway, "whoami gateway", false, l.tool(), "tcp-whoami", "192.168.10.254:8081"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("whoami on the gateway: %v", err)
	}
	if p, err := l.start(nsGateway, "tcp gateway", false, l.tool(), "tcp-serve", "192.168.10.254:8080"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("echo server on the gateway: %v", err)
	}
	for _, w := range []struct{ wl, node string }{{"web-a", "node-a"}, {"web-b", "node-b"}, {"web-c", "node-c"}} {
		out, ok := l.ask(wlNS(l.workload(w.wl)), "192.168.10.254:8081", nodeIPs[w.node])
		l.check(ok, "%s (pool with natOutgoing) reaches the gateway 5 of 5 times, seen as %s's address %s: %s", w.wl, w.node, nodeIPs[w.node], out)
	}
	if p, err := l.start(wlNS(l.workload("web-c")), "whoami web-c", false, l.tool(), "tcp-whoami", "10.65.0.129:8089"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("whoami on web-c: %v", err)
	}
	out, ok := l.ask(wlNS(l.workload("web-a")), "10.65.0.129:8089", "10.65.0.1")
	l.check(ok, "web-a -> web-c (another node, same pool) keeps web-a's address: %s", out)
	out, ok = l.ask(wlNS(l.workload("db-a")), "10.65.0.129:8089", l.workload("db-a").addr)
	l.check(ok, "db-a (another pool) -> web-c keeps db-a's address: %s", out)

	// IPv6: the pool fd00:65::/64 has natOutgoing too; the gateway knows no pool.
	if p, err := l.start(nsGateway, "whoami gateway v6", false, l.tool(), "tcp-whoami", "["+gateway6+"]:8081"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("whoami on the gateway (IPv6): %v", err)
	}
	for _, w := range []struct{ wl, node string }{{"web-a", "node-a"}, {"web-b", "node-b"}, {"web-c", "node-c"}} {
		out, ok := l.ask(wlNS(l.workload(w.wl)), "["+gateway6+"]:8081", nodeIPs6[w.node])
		l.check(ok, "%s reaches the gateway over IPv6 5 of 5 times, seen as %s's address %s: %s", w.wl, w.node, nodeIPs6[w.node], out)
	}
	if p, err := l.start(wlNS(l.workload("web-c")), "whoami web-c v6", false, l.tool(), "tcp-whoami", "[fd00:65::81]:8089"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("whoami on web-c (IPv6): %v", err)
	}
	out, ok = l.ask(wlNS(l.workload("web-a")), "[fd00:65::81]:8089", "fd00:65::1")
	l.check(ok, "web-a -> web-c over IPv6 (another node, same pool) keeps web-a's address: %s", out)

	if err := l.floatingIPs(); err != nil {
		return err
	}

	l.step("seed 003: a client outside the cluster routes the pool to node-a; unassigned addresses must not reach the LAN gateway")
	sniff := func(dst string) int {
		p, err := l.start(nsGateway, "sniff", false, l.tool(), "sniff", "eth0", dst, "1.5")
		if err != nil || !p.waitFor(5*time.Second, "READY") {
			return -1
		}
		_, _ = l.nsRun(nsClient, l.tool(), "send-udp", dst)
		<-p.done
		for _, line := range p.lines {
			if n, ok := strings.CutPrefix(line, "packets "); ok {
				c, _ := strconv.Atoi(n)
				return c
			}
		}
		return -1
	}
	control := sniff("10.65.200.5")
	l.check(control > 0, "control: 10.65.200.5 is in no block (pool blackholes are off), so node-a forwards it to the gateway (%d packets seen there): the capture works", control)
	leaked := sniff("10.65.0.5")
	l.check(leaked == 0, "10.65.0.5, unassigned in node-a's block, is blackholed: %d packets reached the gateway", leaked)

	l.step("drift: a route and the VXLAN device deleted by hand")
	if _, err := sh("ip", "-n", nodeNS("node-a"), "route", "del", "10.65.0.128/26"); err != nil {
		return err
	}
	took, err := l.retry(5*time.Second, func() error {
		out, _ := sh("ip", "-n", nodeNS("node-a"), "route", "show", "10.65.0.128/26")
		if !strings.Contains(out, "vxlan.sluice") {
			return fmt.Errorf("not back")
		}
		return l.ping("web-a", "web-c")
	})
	l.check(err == nil, "the deleted route is back and web-a reaches web-c again (%v)", took.Round(time.Millisecond))
	if _, err := sh("ip", "-n", nodeNS("node-a"), "link", "del", "vxlan.sluice"); err != nil {
		return err
	}
	took, err = l.retry(5*time.Second, func() error { return l.ping("web-a", "web-c") })
	l.check(err == nil, "the deleted VXLAN device is back with its neighbours and routes; traffic recovers (%v)", took.Round(time.Millisecond))

	l.step("sluiced restarted on node-a while a TCP stream crosses it")
	stream, err := l.start(wlNS(l.workload("web-a")), "stream", false, l.tool(), "stream", l.workload("web-c").addr+":8080")
	if err != nil {
		return err
	}
	l.check(stream.waitFor(5*time.Second, "READY"), "a TCP stream web-a -> web-c is running")
	natStream, err := l.start(wlNS(l.workload("web-a")), "stream to gateway", false, l.tool(), "stream", "192.168.10.254:8080")
	if err != nil {
		return err
	}
	l.check(natStream.waitFor(5*time.Second, "READY"), "a TCP stream web-a -> the gateway (masqueraded by node-a) is running")
	l.sleep(500 * time.Millisecond)
	old := l.agents["node-a"]
	l.check(old.stop() == nil, "sluiced on node-a stops cleanly on SIGTERM, leaving the dataplane in place")
	l.sleep(500 * time.Millisecond)
	restarted, err := l.startAgent("node-a")
	if err != nil {
		return err
	}
	l.check(restarted.waitFor(20*time.Second, "desired state computed"), "the new sluiced on node-a is in sync")
	l.sleep(1500 * time.Millisecond)
	l.check(restarted.count("desired state restored") == 1, "the restarted sluiced programmed the state it kept as it stopped, etcd being unchanged since: %q", restarted.matching("state"))
	l.check(restarted.count("dataplane updated") == 2 && restarted.count("dataplane updated", "writes=0") == 2,
		"it found everything in place, with the kept state and then with etcd's, and wrote nothing to the kernel (its reports: %q)", restarted.matching("dataplane updated"))
	l.check(stream.finish(), "the stream never broke: %s", stream.transcript())
	l.check(natStream.finish(), "the masqueraded stream never broke either: %s", natStream.transcript())

	l.step("sluicectl diff on a node, and sluicectl status")
	diff := l.diff
	out, err = diff("node-b")
	l.check(err == nil && strings.Contains(out, "matches"), "node-b's kernel matches its desired state")
	l.check(l.agents["node-b"].stop() == nil, "sluiced on node-b stopped, to let drift stand")
	_, err1 := sh("ip", "-n", nodeNS("node-b"), "route", "del", "10.65.0.0/26")
	_, err2 := sh("ip", "-n", nodeNS("node-b"), "route", "add", "10.99.0.0/24", "dev", "eth0", "proto", "83")
	if err1 != nil || err2 != nil {
		return fmt.Errorf("injecting drift: %v %v", err1, err2)
	}
	out, err = diff("node-b")
	l.check(err != nil && routeLine(out, "missing: 10.65.0.0/26 nhid * via 10.65.0.0 dev vxlan.sluice") && strings.Contains(out, "extra:   10.99.0.0/24 dev eth0"),
		"diff reports the missing route and the extra one, and exits 1")
	status, _ := l.ctl("status")
	line := func(node string) string {
		for _, l := range strings.Split(status, "\n") {
			if strings.HasPrefix(l, node+" ") {
				return l
			}
		}
		return ""
	}
	l.check(strings.Contains(line("node-b"), "gone") && strings.Contains(line("node-a"), "in sync") && strings.Contains(line("node-c"), "in sync"),
		"sluicectl status shows node-b's agent gone and the others in sync")
	nb, err := l.startAgent("node-b")
	if err != nil {
		return err
	}
	l.check(nb.waitFor(20*time.Second, "dataplane updated"), "sluiced restarted on node-b has applied")
	l.check(nb.count("desired state restored") == 1, "it applied the state it kept, etcd being unchanged: %q", nb.matching("state"))
	_, err = l.retry(5*time.Second, func() error { _, err := diff("node-b"); return err })
	l.check(err == nil, "sluiced back on node-b repairs both: the diff is clean again")

	if err := l.seed000(); err != nil {
		return err
	}
	if err := l.endpointRemoved(); err != nil {
		return err
	}
	if err := l.ipv6Services(); err != nil {
		return err
	}

	if keep {
		l.step("the lab stays up; Ctrl-C tears it down")
		fmt.Fprintln(l.out, "look around:")
		fmt.Fprintf(l.out, "  ip netns exec %s ip route              # node-a's routes\n", nodeNS("node-a"))
		fmt.Fprintf(l.out, "  ip netns exec %s %s ping 10.65.0.129   # from web-a to web-c\n", wlNS(l.workload("web-a")), l.tool())
		fmt.Fprintf(l.out, "  ip netns exec %s env SLUICE_ETCD_ENDPOINTS=http://%s %s plan --node node-c\n", nsRouter, etcdListen, filepath.Join(l.bin, "sluicectl"))
		<-ctx.Done()
		fmt.Fprintf(l.out, "\n==> tearing down (%v)\n", context.Cause(ctx)) // not a step: the lab's context is done
		return nil
	}
	l.step("tearing down")
	return nil
}

// routeLine reports whether a line of out reads like want, where "nhid *" in want stands for
// any nexthop object's ID.
func routeLine(out, want string) bool {
	re := regexp.MustCompile(strings.ReplaceAll(regexp.QuoteMeta(want), `nhid \*`, `nhid \d+`))
	return re.MatchString(out)
}

// diff runs sluicectl diff for node inside its namespace: the node's kernel against what a
// freshly started agent would program from the same data (calc run afresh on etcd's state).
func (l *lab) diff(node string) (string, error) {
	l.halt()
	cmd := l.command("ip", "netns", "exec", nodeNS(node), filepath.Join(l.bin, "sluicectl"), "diff", "--node", node)
	// The same configuration as the node's sluiced: its etcd and its pin directory.
	cmd.Env = append(os.Environ(), "SLUICE_ETCD_ENDPOINTS=http://"+etcdListen, "SLUICE_BPF_PIN_DIR="+filepath.Join(l.dir, "bpf", node),
		"SLUICE_ROUTE_LAYOUT="+routeLayout(node))
	out, err := cmd.CombinedOutput()
	fmt.Fprintf(l.out, "$ sluicectl diff --node %s   (in %s)\n%s", node, nodeNS(node), out)
	return string(out), err
}

// floatingWEP is web-b's endpoint (or web-c's, on node-c) naming the floating IPs
// 192.168.50.2 and fd00:50::2 (fip false: without them), as networking-calico writes ipNATs.
func floatingWEP(node, pod, iface, addr, addr6 string, fip bool) string {
	nats := ""
	if fip {
		nats = "\n  ipNATs: [{internalIP: " + addr + ", externalIP: 192.168.50.2}, {internalIP: " + addr6 + ", externalIP: " + floating6 + "}]"
	}
	return fmt.Sprintf(`apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: %[1]s-k8s-%[2]s-eth0
  namespace: default
  labels:
    app: web
spec:
  orchestrator: k8s
  node: %[3]s
  pod: %[2]s
  endpoint: eth0
  interfaceName: %[4]s
  ipNetworks: [%[5]s/32, %[6]s/128]%[7]s
`, strings.ReplaceAll(node, "-", "--"), pod, node, iface, addr, addr6, nats)
}

// floating6 is web-b's IPv6 floating IP.
const floating6 = "fd00:50::2"

// floatingIPs: an outside client reaches web-b through its floating IP 192.168.50.2 by way of
// another node (the client routes it to node-a) and on its own node (the router sends the
// other client, sl-ext, straight to node-b), keeping the client's address; web-b's own
// traffic out leaves from the floating IP; a stream through it survives sluiced's restart on
// node-b; a VM with its floating IP live-migrated from node-b to node-c is reached there.
func (l *lab) floatingIPs() error {
	l.step("floating IPs: 192.168.50.2 and fd00:50::2 for web-b (10.65.0.65, fd00:65::41), as networking-calico writes ipNATs")
	write := func(name, doc string) {
		if err := l.apply(name, doc); err != nil {
			l.check(false, "writing %s: %v", name, err)
		}
	}
	if err := l.script(
		[]string{"ip", "-n", nsClient, "route", "add", "192.168.50.0/24", "via", nodeIPs["node-a"]},
		[]string{"ip", "-n", nsRouter, "route", "add", "192.168.50.0/24", "via", nodeIPs["node-b"]},
		[]string{"ip", "-n", nsGateway, "route", "add", "192.168.50.0/24", "via", nodeIPs["node-a"]},
		// node-b answers sl-ext by its default route, the gateway: for this step only, the
		// gateway knows sl-ext's network is behind the router (later steps rely on it not),
		// and forwards. Said outright: a new namespace takes IPv4 forwarding from the host's
		// (net.core.devconf_inherit_init_net 0), so without it this step passed or failed
		// with the host's net.ipv4.ip_forward.
		[]string{"ip", "-n", nsGateway, "route", "add", "192.168.40.0/24", "via", "192.168.10.1"},
		[]string{"ip", "netns", "exec", nsGateway, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		// The same for IPv6, fd00:50::/64.
		[]string{"ip", "-n", nsClient, "-6", "route", "add", "fd00:50::/64", "via", nodeIPs6["node-a"]},
		[]string{"ip", "-n", nsRouter, "-6", "route", "add", "fd00:50::/64", "via", nodeIPs6["node-b"]},
		[]string{"ip", "-n", nsGateway, "-6", "route", "add", "fd00:50::/64", "via", nodeIPs6["node-a"]},
		[]string{"ip", "-n", nsGateway, "-6", "route", "add", "fd00:40::/64", "via", "fd00:10::1"},
		[]string{"ip", "netns", "exec", nsGateway, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
	); err != nil {
		return err
	}
	defer func() {
		_, _ = sh("ip", "-n", nsGateway, "route", "del", "192.168.40.0/24")
		_, _ = sh("ip", "netns", "exec", nsGateway, "sysctl", "-qw", "net.ipv4.ip_forward=0")
		_, _ = sh("ip", "-n", nsGateway, "-6", "route", "del", "fd00:40::/64")
		_, _ = sh("ip", "netns", "exec", nsGateway, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=0")
	}()
	// web-b answers on 8090, web-c on 8091: which port answers says which workload it is.
	for w, port := range map[string]string{"web-b": "8090", "web-c": "8091"} {
		for _, addr := range []string{l.workload(w).addr, "[" + l.workload(w).addr6 + "]"} {
			if p, err := l.start(wlNS(l.workload(w)), "whoami "+w+" fip "+addr, false, l.tool(), "tcp-whoami", addr+":"+port); err != nil || !p.waitFor(5*time.Second, "READY") {
				return fmt.Errorf("whoami on %s: %v", w, err)
			}
		}
	}
	write("fip-web-b.yaml", floatingWEP("node-b", "web-b", "cali-web-b", "10.65.0.65", "fd00:65::41", true))
	// leadsNowhere says whether the client's connections to addr stop being answered soon.
	leadsNowhere := func(addr string) bool {
		_, err := l.retry(5*time.Second, func() error {
			if _, err := l.nsRun(nsClient, l.tool(), "tcp-ask", addr, "1"); err == nil {
				return fmt.Errorf("%s still answered", addr)
			}
			return nil
		})
		return err == nil
	}
	out, ok := l.ask(nsClient, "192.168.50.2:8090", "192.168.10.100")
	l.check(ok, "the client reaches web-b through 192.168.50.2 by way of node-a (its route), 5 of 5, its own address kept: %s", out)
	out, ok = l.ask(nsExt, "192.168.50.2:8090", "192.168.40.100")
	l.check(ok, "sl-ext reaches web-b through 192.168.50.2 on node-b itself, 5 of 5, its own address kept: %s", out)
	// From another node: its workload (masqueraded there, the floating IP being in no pool,
	// to the address of the interface it leaves by: node-a's tunnel address on
	// vxlan.sluice) and the node itself.
	out, ok = l.ask(wlNS(l.workload("web-a")), "192.168.50.2:8090", "10.65.0.0")
	l.check(ok, "web-a on node-a reaches web-b through 192.168.50.2 (masqueraded to node-a's tunnel address, the way out): %s", out)
	out, ok = l.ask(nodeNS("node-c"), "192.168.50.2:8090", "10.65.0.128")
	l.check(ok, "node-c itself reaches web-b through 192.168.50.2 (from its tunnel address): %s", out)
	out, ok = l.ask(wlNS(l.workload("web-b")), "192.168.10.254:8081", "192.168.50.2")
	l.check(ok, "web-b's own traffic out reaches the gateway from 192.168.50.2 (not node-b's address): %s", out)
	routes, _ := sh("ip", "-n", nodeNS("node-a"), "route", "show", "192.168.50.2")
	l.check(strings.Contains(routes, "via 10.65.0.64 dev vxlan.sluice"), "node-a routes 192.168.50.2 as web-b's own address, through VXLAN to node-b: %s", strings.TrimSpace(routes))

	fip6 := "[" + floating6 + "]:8090"
	out, ok = l.ask(nsClient, fip6, "fd00:10::100")
	l.check(ok, "the client reaches web-b through %s by way of node-a, 5 of 5, its own address kept: %s", floating6, out)
	out, ok = l.ask(nsExt, fip6, ext6)
	l.check(ok, "sl-ext reaches web-b through %s on node-b itself, 5 of 5, its own address kept: %s", floating6, out)
	out, ok = l.ask(wlNS(l.workload("web-a")), fip6, "fd00:65::")
	l.check(ok, "web-a on node-a reaches web-b through %s (masqueraded to node-a's IPv6 tunnel address, the way out): %s", floating6, out)
	out, ok = l.ask(wlNS(l.workload("web-b")), "["+gateway6+"]:8081", floating6)
	l.check(ok, "web-b's own IPv6 traffic out reaches the gateway from %s (not node-b's address): %s", floating6, out)
	routes, _ = sh("ip", "-n", nodeNS("node-a"), "-6", "route", "show", floating6)
	l.check(strings.Contains(routes, "dev vxlan-v6.sluice"), "node-a routes %s as web-b's own address, through VXLAN to node-b: %s", floating6, strings.TrimSpace(routes))

	stream, err := l.start(nsClient, "stream to floating IP", false, l.tool(), "stream", "192.168.50.2:8080")
	if err != nil {
		return err
	}
	l.check(stream.waitFor(5*time.Second, "READY"), "a TCP stream from the client to 192.168.50.2 (web-b) is running")
	l.check(l.agents["node-b"].stop() == nil, "sluiced on node-b stops")
	nb, err := l.startAgent("node-b")
	if err != nil {
		return err
	}
	l.check(nb.waitFor(20*time.Second, "dataplane updated"), "sluiced on node-b is back")
	l.sleep(time.Second)
	l.check(stream.finish(), "the stream through the floating IP never broke across the restart: %s", stream.transcript())

	write("fip-web-b-gone.yaml", floatingWEP("node-b", "web-b", "cali-web-b", "10.65.0.65", "fd00:65::41", false))
	l.check(leadsNowhere("192.168.50.2:8090"), "with the floating IP removed from web-b's endpoint, 192.168.50.2 leads nowhere")
	l.check(leadsNowhere(fip6), "and %s leads nowhere", floating6)

	// A VM live-migrated: 10.65.0.70 (node-b's block) with floating IP 192.168.50.3 runs on
	// node-b; its copy starts on node-c, networking-calico writes the new endpoint, then the
	// old VM stops and its endpoint goes.
	vm := func(node, tap string) (string, error) {
		ns := nsVM + "-" + node
		if err := l.script(
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", nodeNS(node), "link", "add", tap, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", nodeNS(node), "link", "set", tap, "up"},
			[]string{"ip", "-n", ns, "addr", "add", "10.65.0.70/32", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", ns, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"},
			[]string{"ip", "-n", ns, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0"},
		); err != nil {
			return "", err
		}
		if p, err := l.start(ns, "whoami vm1 on "+node, false, l.tool(), "tcp-whoami", "10.65.0.70:8092"); err != nil || !p.waitFor(5*time.Second, "READY") {
			return "", fmt.Errorf("whoami in the VM on %s: %v", node, err)
		}
		return ns, nil
	}
	vmWEP := func(node, tap string, fip bool) string {
		nats := ""
		if fip {
			nats = "\n  ipNATs: [{internalIP: 10.65.0.70, externalIP: 192.168.50.3}]"
		}
		return fmt.Sprintf(`apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: %s-openstack-vm1-tap
  namespace: openstack
spec:
  orchestrator: openstack
  node: %s
  endpoint: tap
  interfaceName: %s
  ipNetworks: [10.65.0.70/32]%s
`, strings.ReplaceAll(node, "-", "--"), node, tap, nats)
	}
	if _, err := vm("node-b", "tapvm1b"); err != nil {
		return err
	}
	write("vm1-node-b.yaml", vmWEP("node-b", "tapvm1b", true))
	out, ok = l.ask(nsClient, "192.168.50.3:8092", "192.168.10.100")
	l.check(ok, "the client reaches the VM on node-b through 192.168.50.3: %s", out)
	vmC, err := vm("node-c", "tapvm1c")
	if err != nil {
		return err
	}
	write("vm1-node-c.yaml", vmWEP("node-c", "tapvm1c", true))
	if _, err := sh("ip", "-n", nodeNS("node-b"), "link", "del", "tapvm1b"); err != nil { // the old VM stops
		return err
	}
	l.mustCtl("delete", "-n", "openstack", "workloadendpoint", "node--b-openstack-vm1-tap")
	out, ok = l.ask(nsClient, "192.168.50.3:8092", "192.168.10.100")
	l.check(ok, "after the migration the client reaches the VM on node-c through 192.168.50.3 (by way of node-a): %s", out)
	out, ok = l.ask(nsExt, "192.168.50.3:8092", "192.168.40.100")
	l.check(ok, "and sl-ext, routed to node-b where the VM was, reaches it on node-c too: %s", out)
	out, ok = l.ask(vmC, "192.168.10.254:8081", "192.168.50.3")
	l.check(ok, "the migrated VM's traffic out leaves node-c from 192.168.50.3: %s", out)
	routesC, _ := sh("ip", "-n", nodeNS("node-c"), "route", "show", "192.168.50.3")
	l.check(strings.Contains(routesC, "dev tapvm1c"), "node-c routes 192.168.50.3 to the VM's interface: %s", strings.TrimSpace(routesC))
	write("vm1-node-c-nofip.yaml", vmWEP("node-c", "tapvm1c", false))
	l.check(leadsNowhere("192.168.50.3:8092"), "with the floating IP disassociated, 192.168.50.3 leads nowhere")
	return nil
}

// migratedNode: node-c as a node migrated from Cilium and kube-proxy keeps them: Cilium's
// program ahead of sluice's on its uplink (node ports through node-c break) and kube-proxy's
// service chain (dormant). sluicectl leftovers names both and exits 1; node-c's sluiced
// restarted with --clean-conflicts removes Cilium's program only; the node port works again.
func (l *lab) migratedNode() error {
	l.step("a migrated node: Cilium's program and kube-proxy's rules left on node-c, found and cleaned")
	up := l.uplink("node-c")
	pin := filepath.Join(l.dir, "bpf", "foreign-cilium-link")
	if _, err := l.nsRun(nodeNS("node-c"), l.tool(), "plant-leftovers", up, pin); err != nil {
		return fmt.Errorf("planting the leftovers on node-c: %v", err)
	}
	np := nodeIPs["node-c"] + ":30092"
	out, err := l.nsRun(nsExt, l.tool(), "tcp-ask", np, "3")
	l.check(err != nil, "with Cilium's program ahead of sluice's on %s, node-c's node port fails: %s", up, oneLine(out))
	leftovers := func() (string, error) {
		l.halt()
		cmd := l.command("ip", "netns", "exec", nodeNS("node-c"), filepath.Join(l.bin, "sluicectl"), "leftovers", "--cgroup", filepath.Join(l.dir, "cgroup"))
		out, err := cmd.CombinedOutput()
		fmt.Fprintf(l.out, "$ sluicectl leftovers   (in %s)\n%s", nodeNS("node-c"), out)
		return string(out), err
	}
	out, err = leftovers()
	l.check(err != nil && strings.Contains(out, "breaking  tcx") && strings.Contains(out, "cil_from_netdev") && strings.Contains(out, "cilium") &&
		strings.Contains(out, "dormant") && strings.Contains(out, "kube-proxy's netfilter chains in ip nat"),
		"sluicectl leftovers names Cilium's program (breaking) and kube-proxy's chain (dormant), and exits 1")
	// The running agent finds it at its next resync (30 s here); one started now, at once.
	l.check(l.agents["node-c"].stop() == nil, "sluiced on node-c stopped")
	nc, err := l.startAgent("node-c")
	if err != nil {
		return err
	}
	var body string
	took, err := l.retry(30*time.Second, func() error {
		var code int
		if code, body = l.health("node-c", "/readyz"); code != 503 || !strings.Contains(body, "cil_from_netdev (cilium)") {
			return errors.New("not yet")
		}
		return nil
	})
	l.check(err == nil && nc.count("a leftover of other software breaks sluice's paths") > 0,
		"sluiced on node-c, started again, says not ready %v after its start and names Cilium's program: %s", took.Round(100*time.Millisecond), oneLine(body))
	l.check(nc.stop() == nil, "sluiced on node-c stopped")
	nc, err = l.startAgent("node-c", "--clean-conflicts")
	if err != nil {
		return err
	}
	l.check(nc.waitFor(30*time.Second, "removed a leftover of other software", "cil_from_netdev"),
		"sluiced on node-c started with --clean-conflicts removes Cilium's program: %q", nc.matching("leftover of other software"))
	_, body, ok := l.waitReady("node-c", 200, 30*time.Second)
	l.check(ok, "and is ready: %s", oneLine(body))
	l.check(nc.count("kind=cgroup") == 0, "the other nodes' sluice socket programs on the lab's shared cgroup are not taken for leftovers: %q", nc.matching("kind=cgroup"))
	_, err = l.retry(10*time.Second, func() error { _, err := l.nsRun(nsExt, l.tool(), "tcp-ask", np, "1"); return err })
	out, err2 := l.nsRun(nsExt, l.tool(), "tcp-ask", np, "20")
	l.check(err == nil && err2 == nil && strings.Contains(out, "answer 192.168.40.100 20"),
		"20 of 20 connections to node-c's node port reach the endpoint again, the client's address kept: %s", oneLine(out))
	out, err = leftovers()
	l.check(err == nil && !strings.Contains(out, "cil_from_netdev") && strings.Contains(out, "kube-proxy's netfilter chains in ip nat"),
		"sluicectl leftovers exits 0: kube-proxy's dormant chain is listed and left alone")
	var status string
	_, err = l.retry(5*time.Second, func() error {
		status, _ = l.ctl("status")
		for _, line := range strings.Split(status, "\n") {
			if strings.HasPrefix(line, "node-c ") && strings.Contains(line, " 1 dormant ") {
				return nil
			}
		}
		return errors.New("not yet")
	})
	l.check(err == nil, "sluicectl status counts node-c's leftover (1 dormant):\n%s", status)
	return nil
}
