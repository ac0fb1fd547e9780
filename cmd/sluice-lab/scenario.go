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

	if l.rack {
		if err := l.rackSetup(); err != nil {
			return err
		}
	}
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
// dataplane with real traffic: demoScene.
func (l *lab) demo(ctx context.Context, keep bool) (err error) {
	l.ctx, l.rack = ctx, true
	defer l.end(&err)
	if err := l.setup(); err != nil {
		return err
	}
	if err := l.play(demoScene); err != nil {
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

// Ways the demo's traffic between workloads goes.
const (
	throughVXLAN = "through VXLAN"
	crossSubnet  = "directly (CrossSubnet pool, same subnet)"
)

// demoScene is the demo after its setup: node-a's kernel against what Felix programs,
// workload traffic, natOutgoing, floating IPs, seed 003, drift, restarts, sluicectl diff and
// status, then the services (seed000, endpointRemoved, ipv6Services).
var demoScene = scene{
	workloadServers(),

	heading("node-a's kernel, against what Calico's Felix programs for the same data"),
	// node-a lays routes to other nodes out through nexthop objects (`nhid N`), node-c as
	// Felix does; either way the gateway, device and flag are Felix's.
	routes("node-a", "ip route show proto 83", "node-a has route %q",
		"blackhole 10.65.0.0/26 metric 1024",
		"blackhole 10.66.0.0/26 metric 1024",
		"10.65.0.64/26 nhid * via 10.65.0.64 dev vxlan.sluice onlink",
		"10.65.0.128/26 nhid * via 10.65.0.128 dev vxlan.sluice onlink",
		"10.66.0.64/26 nhid * via 192.168.10.12 dev eth0 onlink",
		"10.65.0.1 dev cali-web-a scope link"),
	look{node: "node-a", cmd: "ip nexthop show proto 83", show: true, name: "node-a's nexthop objects: one per remote node and gateway, sluice's protocol",
		has: []string{"via 10.65.0.128 dev vxlan.sluice scope link proto 83 onlink", "via 10.65.0.64 dev vxlan.sluice scope link proto 83 onlink", "via 192.168.10.12 dev eth0 scope link proto 83 onlink"}},
	look{node: "node-c", cmd: "ip route show proto 83", has: []string{"10.65.0.0/26 via 10.65.0.0 dev vxlan.sluice onlink"}, lacks: []string{"nhid"},
		name: "node-c (--route-layout gateways) lays its routes out as Felix does: 10.65.0.0/26 via 10.65.0.0 dev vxlan.sluice onlink"},
	look{node: "node-a", cmd: "ip -d link show vxlan.sluice", has: []string{"vxlan id 4096", "dstport 4789", "nolearning", "66:c1:a0:00:00:0a", "mtu 1450"},
		name: "node-a's vxlan.sluice: VNI 4096, port 4789, learning off, the node's MAC, MTU 1450"},
	look{node: "node-a", cmd: "ip neigh show dev vxlan.sluice", has: []string{"10.65.0.128 lladdr 66:c1:a0:00:00:0c PERMANENT"},
		name: "node-a has a permanent neighbour for node-c's VTEP"},
	look{node: "node-a", cmd: "bridge fdb show dev vxlan.sluice", has: []string{"66:c1:a0:00:00:0c dst 192.168.20.13"},
		name: "node-a has an FDB entry sending node-c's MAC to 192.168.20.13"},
	routes("node-a", "ip -6 route show proto 83", "node-a has IPv6 route %q",
		"blackhole fd00:65::/122",
		"fd00:65::40/122 nhid * via fd00:65::40 dev vxlan-v6.sluice metric 1024 onlink",
		"fd00:65::80/122 nhid * via fd00:65::80 dev vxlan-v6.sluice metric 1024 onlink",
		"fd00:65::1 dev cali-web-a metric 1024"),
	look{node: "node-a", cmd: "ip -d link show vxlan-v6.sluice", has: []string{"vxlan id 4096", "dstport 4789", "nolearning", "66:c1:a6:00:00:0a", "mtu 1430", "local fd00:10::11"},
		name: "node-a's vxlan-v6.sluice: VNI 4096, port 4789, learning off, the node's IPv6 MAC, MTU 1430, bound to fd00:10::11"},
	look{node: "node-a", cmd: "bridge fdb show dev vxlan-v6.sluice", has: []string{"66:c1:a6:00:00:0c dst fd00:20::13"},
		name: "node-a has an FDB entry sending node-c's IPv6 MAC to fd00:20::13"},

	heading("traffic between workloads on every pair of nodes"),
	pingTCP("web-a", "web-b", throughVXLAN), pingTCP("web-b", "web-a", throughVXLAN),
	pingTCP("web-a", "web-c", throughVXLAN), pingTCP("web-c", "web-a", throughVXLAN),
	pingTCP("web-b", "web-c", throughVXLAN), pingTCP("web-c", "web-b", throughVXLAN),
	pingTCP("db-a", "db-b", crossSubnet), pingTCP("db-b", "db-a", crossSubnet),
	tcp6("web-a", "web-b"), tcp6("web-a", "web-c"), tcp6("web-c", "web-a"), tcp6("web-c", "web-b"),

	heading("natOutgoing: workloads reach the LAN gateway (in no pool) as their node; between pools they keep their addresses"),
	serve{at: nsGateway, run: "tcp-whoami 192.168.10.254:8081", ready: true},
	serve{at: nsGateway, run: "tcp-serve 192.168.10.254:8080", ready: true},
	probe{from: "web-a", send: "tcp-ask 5", to: "192.168.10.254:8081", seenAs: "192.168.10.11", retry: 5 * time.Second,
		name: "web-a (pool with natOutgoing) reaches the gateway 5 of 5 times, seen as node-a's address 192.168.10.11: %s"},
	probe{from: "web-b", send: "tcp-ask 5", to: "192.168.10.254:8081", seenAs: "192.168.10.12", retry: 5 * time.Second,
		name: "web-b (pool with natOutgoing) reaches the gateway 5 of 5 times, seen as node-b's address 192.168.10.12: %s"},
	probe{from: "web-c", send: "tcp-ask 5", to: "192.168.10.254:8081", seenAs: "192.168.20.13", retry: 5 * time.Second,
		name: "web-c (pool with natOutgoing) reaches the gateway 5 of 5 times, seen as node-c's address 192.168.20.13: %s"},
	serve{at: "web-c", run: "tcp-whoami 10.65.0.129:8089", ready: true},
	probe{from: "web-a", send: "tcp-ask 5", to: "10.65.0.129:8089", seenAs: "10.65.0.1", retry: 5 * time.Second,
		name: "web-a -> web-c (another node, same pool) keeps web-a's address: %s"},
	probe{from: "db-a", send: "tcp-ask 5", to: "10.65.0.129:8089", seenAs: "10.66.0.1", retry: 5 * time.Second,
		name: "db-a (another pool) -> web-c keeps db-a's address: %s"},
	// IPv6: the pool fd00:65::/64 has natOutgoing too; the gateway knows no pool.
	serve{at: nsGateway, run: "tcp-whoami [" + gateway6 + "]:8081", ready: true},
	probe{from: "web-a", send: "tcp-ask 5", to: "[fd00:10::fe]:8081", seenAs: "fd00:10::11", retry: 5 * time.Second,
		name: "web-a reaches the gateway over IPv6 5 of 5 times, seen as node-a's address fd00:10::11: %s"},
	probe{from: "web-b", send: "tcp-ask 5", to: "[fd00:10::fe]:8081", seenAs: "fd00:10::12", retry: 5 * time.Second,
		name: "web-b reaches the gateway over IPv6 5 of 5 times, seen as node-b's address fd00:10::12: %s"},
	probe{from: "web-c", send: "tcp-ask 5", to: "[fd00:10::fe]:8081", seenAs: "fd00:20::13", retry: 5 * time.Second,
		name: "web-c reaches the gateway over IPv6 5 of 5 times, seen as node-c's address fd00:20::13: %s"},
	serve{at: "web-c", run: "tcp-whoami [fd00:65::81]:8089", ready: true},
	probe{from: "web-a", send: "tcp-ask 5", to: "[fd00:65::81]:8089", seenAs: "fd00:65::1", retry: 5 * time.Second,
		name: "web-a -> web-c over IPv6 (another node, same pool) keeps web-a's address: %s"},

	act((*lab).floatingIPs),

	heading("seed 003: a client outside the cluster routes the pool to node-a; unassigned addresses must not reach the LAN gateway"),
	act((*lab).noLeak),

	heading("drift: a route and the VXLAN device deleted by hand"),
	act((*lab).driftRepaired),

	heading("sluiced restarted on node-a while a TCP stream crosses it"),
	act((*lab).restartUnderStreams),

	heading("sluicectl diff on a node, and sluicectl status"),
	act((*lab).diffAndStatus),

	act((*lab).seed000),
	act((*lab).endpointRemoved),
	act((*lab).ipv6Services),

	act((*lab).rackBGP),
}

// workloadServers: every workload serves TCP (echo) on port 8080 of each of its addresses.
func workloadServers() scene {
	var s scene
	for _, w := range labWorkloads {
		s = append(s, serve{at: w.name, run: "tcp-serve " + w.addr + ":8080"})
		if w.addr6 != "" {
			s = append(s, serve{at: w.name, run: "tcp-serve [" + w.addr6 + "]:8080"})
		}
	}
	return s
}

// noLeak (seed 003): the client, which routes the pool to node-a, sends UDP to an address of
// node-a's block that no workload has, while a capture on the LAN gateway counts what
// reaches it; the same to an address in no block shows the capture works.
func (l *lab) noLeak() error {
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
	return nil
}

// driftRepaired deletes a route, then the VXLAN device, on node-a by hand: each must be back
// and web-a reach web-c again within 5 s.
func (l *lab) driftRepaired() error {
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
	return nil
}

// restartUnderStreams restarts node-a's sluiced while a TCP stream from web-a crosses it to
// web-c and another goes masqueraded to the gateway: the new agent programs the state the
// old one kept (etcd being unchanged), then etcd's, writing nothing; neither stream breaks.
func (l *lab) restartUnderStreams() error {
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
	return nil
}

// diffAndStatus: sluicectl diff finds node-b's kernel as its agent would program it; with
// the agent stopped and drift made by hand, diff names it and status shows the agent gone;
// the agent started again repairs it from the state it kept.
func (l *lab) diffAndStatus() error {
	out, err := l.diff("node-b")
	l.check(err == nil && strings.Contains(out, "matches"), "node-b's kernel matches its desired state")
	l.check(l.agents["node-b"].stop() == nil, "sluiced on node-b stopped, to let drift stand")
	_, err1 := sh("ip", "-n", nodeNS("node-b"), "route", "del", "10.65.0.0/26")
	_, err2 := sh("ip", "-n", nodeNS("node-b"), "route", "add", "10.99.0.0/24", "dev", "eth0", "proto", "83")
	if err1 != nil || err2 != nil {
		return fmt.Errorf("injecting drift: %v %v", err1, err2)
	}
	out, err = l.diff("node-b")
	l.check(err != nil && routeLine(out, "missing: 10.65.0.0/26 nhid * via 10.65.0.0 dev vxlan.sluice") && strings.Contains(out, "extra:   10.99.0.0/24 dev eth0"),
		"diff reports the missing route and the extra one, and exits 1")
	// node-a was restarted just before: its service stage starts beside its routes (loading
	// the programs takes a second or more on a busy machine), and its status key says
	// "services down" until the agent's next status write after that: asked until it says
	// what is true now, for 15 s at most.
	var status string
	line := func(node string) string {
		for _, l := range strings.Split(status, "\n") {
			if strings.HasPrefix(l, node+" ") {
				return l
			}
		}
		return ""
	}
	want := func() bool {
		return strings.Contains(line("node-b"), "gone") && strings.Contains(line("node-a"), "in sync") && strings.Contains(line("node-c"), "in sync")
	}
	for deadline := time.Now().Add(15 * time.Second); ; l.sleep(250 * time.Millisecond) {
		if status, _ = l.ctl("status"); want() || time.Now().After(deadline) {
			break
		}
	}
	l.check(want(), "sluicectl status shows node-b's agent gone and the others in sync")
	nb, err := l.startAgent("node-b")
	if err != nil {
		return err
	}
	l.check(nb.waitFor(20*time.Second, "dataplane updated"), "sluiced restarted on node-b has applied")
	l.check(nb.count("desired state restored") == 1, "it applied the state it kept, etcd being unchanged: %q", nb.matching("state"))
	_, err = l.retry(5*time.Second, func() error { _, err := l.diff("node-b"); return err })
	l.check(err == nil, "sluiced back on node-b repairs both: the diff is clean again")
	return nil
}

// routeLine reports whether a line of out reads like want, where "nhid *" in want stands for
// any nexthop object's ID.
func routeLine(out, want string) bool {
	re := regexp.MustCompile(strings.ReplaceAll(regexp.QuoteMeta(want), `nhid \*`, `nhid \d+`))
	return re.MatchString(out)
}

// diff runs sluicectl diff for node inside its namespace: the node's kernel against what a
// freshly started agent would program from the same data (calc run afresh on etcd's state);
// env adds to the node's configuration (SLUICE_BGP=true: with what its speaker learned).
func (l *lab) diff(node string, env ...string) (string, error) {
	l.halt()
	cmd := l.command("ip", "netns", "exec", nodeNS(node), filepath.Join(l.bin, "sluicectl"), "diff", "--node", node)
	// The same configuration as the node's sluiced: its etcd and its pin directory.
	cmd.Env = append(os.Environ(), "SLUICE_ETCD_ENDPOINTS=http://"+etcdListen, "SLUICE_BPF_PIN_DIR="+filepath.Join(l.dir, "bpf", node),
		"SLUICE_ROUTE_LAYOUT="+routeLayout(node))
	cmd.Env = append(cmd.Env, env...)
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
func (l *lab) floatingIPs() error { return l.play(floatingScene) }

var floatingScene = scene{
	heading("floating IPs: 192.168.50.2 and fd00:50::2 for web-b (10.65.0.65, fd00:65::41), as networking-calico writes ipNATs"),
	commands{
		"ip -n sl-client route add 192.168.50.0/24 via 192.168.10.11",
		"ip -n sl-router route add 192.168.50.0/24 via 192.168.10.12",
		"ip -n sl-gw route add 192.168.50.0/24 via 192.168.10.11",
		// node-b answers sl-ext by its default route, the gateway: for this step only, the
		// gateway knows sl-ext's network is behind the router (later steps rely on it not),
		// and forwards. Said outright: a new namespace takes IPv4 forwarding from the host's
		// (net.core.devconf_inherit_init_net 0), so without it this step passed or failed
		// with the host's net.ipv4.ip_forward.
		"ip -n sl-gw route add 192.168.40.0/24 via 192.168.10.1",
		"ip netns exec sl-gw sysctl -qw net.ipv4.ip_forward=1",
		// The same for IPv6, fd00:50::/64.
		"ip -n sl-client -6 route add fd00:50::/64 via fd00:10::11",
		"ip -n sl-router -6 route add fd00:50::/64 via fd00:10::12",
		"ip -n sl-gw -6 route add fd00:50::/64 via fd00:10::11",
		"ip -n sl-gw -6 route add fd00:40::/64 via fd00:10::1",
		"ip netns exec sl-gw sysctl -qw net.ipv6.conf.all.forwarding=1",
	},
	undo{
		"ip -n sl-gw route del 192.168.40.0/24",
		"ip netns exec sl-gw sysctl -qw net.ipv4.ip_forward=0",
		"ip -n sl-gw -6 route del fd00:40::/64",
		"ip netns exec sl-gw sysctl -qw net.ipv6.conf.all.forwarding=0",
	},
	// web-b answers on 8090, web-c on 8091: which port answers says which workload it is.
	serve{at: "web-b", run: "tcp-whoami 10.65.0.65:8090", ready: true},
	serve{at: "web-b", run: "tcp-whoami [fd00:65::41]:8090", ready: true},
	serve{at: "web-c", run: "tcp-whoami 10.65.0.129:8091", ready: true},
	serve{at: "web-c", run: "tcp-whoami [fd00:65::81]:8091", ready: true},
	manifest{"fip-web-b.yaml", floatingWEP("node-b", "web-b", "cali-web-b", "10.65.0.65", "fd00:65::41", true)},
	probe{from: nsClient, send: "tcp-ask 5", to: "192.168.50.2:8090", seenAs: "192.168.10.100", retry: 5 * time.Second,
		name: "the client reaches web-b through 192.168.50.2 by way of node-a (its route), 5 of 5, its own address kept: %s"},
	probe{from: nsExt, send: "tcp-ask 5", to: "192.168.50.2:8090", seenAs: "192.168.40.100", retry: 5 * time.Second,
		name: "sl-ext reaches web-b through 192.168.50.2 on node-b itself, 5 of 5, its own address kept: %s"},
	// From another node: its workload (masqueraded there, the floating IP being in no pool,
	// to the address of the interface it leaves by: node-a's tunnel address on
	// vxlan.sluice) and the node itself.
	probe{from: "web-a", send: "tcp-ask 5", to: "192.168.50.2:8090", seenAs: "10.65.0.0", retry: 5 * time.Second,
		name: "web-a on node-a reaches web-b through 192.168.50.2 (masqueraded to node-a's tunnel address, the way out): %s"},
	probe{from: "node-c", send: "tcp-ask 5", to: "192.168.50.2:8090", seenAs: "10.65.0.128", retry: 5 * time.Second,
		name: "node-c itself reaches web-b through 192.168.50.2 (from its tunnel address): %s"},
	probe{from: "web-b", send: "tcp-ask 5", to: "192.168.10.254:8081", seenAs: "192.168.50.2", retry: 5 * time.Second,
		name: "web-b's own traffic out reaches the gateway from 192.168.50.2 (not node-b's address): %s"},
	look{node: "node-a", cmd: "ip route show 192.168.50.2", has: []string{"via 10.65.0.64 dev vxlan.sluice"},
		name: "node-a routes 192.168.50.2 as web-b's own address, through VXLAN to node-b: %s"},
	probe{from: nsClient, send: "tcp-ask 5", to: "[fd00:50::2]:8090", seenAs: "fd00:10::100", retry: 5 * time.Second,
		name: "the client reaches web-b through fd00:50::2 by way of node-a, 5 of 5, its own address kept: %s"},
	probe{from: nsExt, send: "tcp-ask 5", to: "[fd00:50::2]:8090", seenAs: ext6, retry: 5 * time.Second,
		name: "sl-ext reaches web-b through fd00:50::2 on node-b itself, 5 of 5, its own address kept: %s"},
	probe{from: "web-a", send: "tcp-ask 5", to: "[fd00:50::2]:8090", seenAs: "fd00:65::", retry: 5 * time.Second,
		name: "web-a on node-a reaches web-b through fd00:50::2 (masqueraded to node-a's IPv6 tunnel address, the way out): %s"},
	probe{from: "web-b", send: "tcp-ask 5", to: "[fd00:10::fe]:8081", seenAs: "fd00:50::2", retry: 5 * time.Second,
		name: "web-b's own IPv6 traffic out reaches the gateway from fd00:50::2 (not node-b's address): %s"},
	look{node: "node-a", cmd: "ip -6 route show fd00:50::2", has: []string{"dev vxlan-v6.sluice"},
		name: "node-a routes fd00:50::2 as web-b's own address, through VXLAN to node-b: %s"},

	act((*lab).floatingStreamAcrossRestart),

	manifest{"fip-web-b-gone.yaml", floatingWEP("node-b", "web-b", "cali-web-b", "10.65.0.65", "fd00:65::41", false)},
	probe{from: nsClient, send: "tcp-ask 1", to: "192.168.50.2:8090", fails: true, retry: 5 * time.Second,
		name: "with the floating IP removed from web-b's endpoint, 192.168.50.2 leads nowhere"},
	probe{from: nsClient, send: "tcp-ask 1", to: "[fd00:50::2]:8090", fails: true, retry: 5 * time.Second,
		name: "and fd00:50::2 leads nowhere"},

	// A VM live-migrated: 10.65.0.70 (node-b's block) with floating IP 192.168.50.3 runs on
	// node-b; its copy starts on node-c, networking-calico writes the new endpoint, then the
	// old VM stops and its endpoint goes.
	act(func(l *lab) error { return l.plugVM("node-b", "tapvm1b") }),
	manifest{"vm1-node-b.yaml", vmWEP("node-b", "tapvm1b", true)},
	probe{from: nsClient, send: "tcp-ask 5", to: "192.168.50.3:8092", seenAs: "192.168.10.100", retry: 5 * time.Second,
		name: "the client reaches the VM on node-b through 192.168.50.3: %s"},
	act(func(l *lab) error { return l.plugVM("node-c", "tapvm1c") }),
	manifest{"vm1-node-c.yaml", vmWEP("node-c", "tapvm1c", true)},
	commands{"ip -n sl-node-b link del tapvm1b"}, // the old VM stops
	ctl("delete -n openstack workloadendpoint node--b-openstack-vm1-tap"),
	probe{from: nsClient, send: "tcp-ask 5", to: "192.168.50.3:8092", seenAs: "192.168.10.100", retry: 5 * time.Second,
		name: "after the migration the client reaches the VM on node-c through 192.168.50.3 (by way of node-a): %s"},
	probe{from: nsExt, send: "tcp-ask 5", to: "192.168.50.3:8092", seenAs: "192.168.40.100", retry: 5 * time.Second,
		name: "and sl-ext, routed to node-b where the VM was, reaches it on node-c too: %s"},
	probe{from: nsVM + "-node-c", send: "tcp-ask 5", to: "192.168.10.254:8081", seenAs: "192.168.50.3", retry: 5 * time.Second,
		name: "the migrated VM's traffic out leaves node-c from 192.168.50.3: %s"},
	look{node: "node-c", cmd: "ip route show 192.168.50.3", has: []string{"dev tapvm1c"},
		name: "node-c routes 192.168.50.3 to the VM's interface: %s"},
	manifest{"vm1-node-c-nofip.yaml", vmWEP("node-c", "tapvm1c", false)},
	probe{from: nsClient, send: "tcp-ask 1", to: "192.168.50.3:8092", fails: true, retry: 5 * time.Second,
		name: "with the floating IP disassociated, 192.168.50.3 leads nowhere"},
}

// floatingStreamAcrossRestart: a TCP stream from the client through web-b's floating IP
// keeps going while sluiced on node-b is stopped and started again.
func (l *lab) floatingStreamAcrossRestart() error {
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
	return nil
}

// plugVM starts the lab's OpenStack VM (10.65.0.70, a TCP whoami on port 8092) on node,
// plugged in by its tap interface.
func (l *lab) plugVM(node, tap string) error {
	ns := nsVM + "-" + node
	if err := l.script(plugWorkload(ns, node, tap, "10.65.0.70", "")...); err != nil {
		return err
	}
	if p, err := l.start(ns, "whoami vm1 on "+node, false, l.tool(), "tcp-whoami", "10.65.0.70:8092"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("whoami in the VM on %s: %v", node, err)
	}
	return nil
}

// vmWEP is the VM's endpoint on node, by its tap interface, with (fip) or without its
// floating IP 192.168.50.3, as networking-calico writes it.
func vmWEP(node, tap string, fip bool) string {
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
