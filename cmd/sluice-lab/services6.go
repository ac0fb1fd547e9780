package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// seedDual is a dual-stack NodePort service, seed/dual, as Kubernetes writes one
// (ipFamilyPolicy RequireDualStack, one cluster IP per family, one EndpointSlice per family):
// its endpoints are the web workloads' whoami servers on port 8086 of both their addresses.
const seedDual = `apiVersion: v1
kind: Service
metadata: {name: dual, namespace: seed}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.30
  clusterIPs: [10.96.0.30, "fd00:96::30"]
  ports:
  - {name: who, protocol: TCP, port: 86, targetPort: 8086, nodePort: 30186}
  externalTrafficPolicy: Cluster
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dual-4
  namespace: seed
  labels: {kubernetes.io/service-name: dual}
addressType: IPv4
endpoints:
- {addresses: [10.65.0.1], conditions: {ready: true}, nodeName: node-a}
- {addresses: [10.65.0.65], conditions: {ready: true}, nodeName: node-b}
- {addresses: [10.65.0.129], conditions: {ready: true}, nodeName: node-c}
ports:
- {name: who, protocol: TCP, port: 8086}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dual-6
  namespace: seed
  labels: {kubernetes.io/service-name: dual}
addressType: IPv6
endpoints:
- {addresses: ["fd00:65::1"], conditions: {ready: true}, nodeName: node-a}
- {addresses: ["fd00:65::41"], conditions: {ready: true}, nodeName: node-b}
- {addresses: ["fd00:65::81"], conditions: {ready: true}, nodeName: node-c}
ports:
- {name: who, protocol: TCP, port: 8086}
`

// seedNP6 is seed 000 over IPv6: a single-stack IPv6 NodePort service whose only endpoint is
// web-b on node-b (its whoami server, and its echo server for bulk transfers).
const seedNP6 = `apiVersion: v1
kind: Service
metadata: {name: np6, namespace: seed}
spec:
  type: NodePort
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv6]
  clusterIPs: ["fd00:96::31"]
  ports:
  - {name: who, protocol: TCP, port: 86, targetPort: 8086, nodePort: 30187}
  - {name: echo, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30188}
  externalTrafficPolicy: Cluster
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: np6-1
  namespace: seed
  labels: {kubernetes.io/service-name: np6}
addressType: IPv6
endpoints:
- {addresses: ["fd00:65::41"], conditions: {ready: true}, nodeName: node-b}
ports:
- {name: who, protocol: TCP, port: 8086}
- {name: echo, protocol: TCP, port: 8080}
`

// seedNoDF6 is an IPv6 UDP echo service, seed/nodf6: cluster IP [fd00:96::32]:7 and node port
// 30189, whose one endpoint is web-b's echo server with path MTU discovery off, on node-b.
const seedNoDF6 = `apiVersion: v1
kind: Service
metadata: {name: nodf6, namespace: seed}
spec:
  type: NodePort
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv6]
  clusterIPs: ["fd00:96::32"]
  ports:
  - {name: echo, protocol: UDP, port: 7, targetPort: 7008, nodePort: 30189}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: nodf6-1
  namespace: seed
  labels: {kubernetes.io/service-name: nodf6}
addressType: IPv6
endpoints:
- {addresses: ["fd00:65::41"], conditions: {ready: true}, nodeName: node-b}
ports:
- {name: echo, protocol: UDP, port: 7008}
`

// nodeIPs6 are the nodes' IPv6 underlay addresses (topo.go).
var nodeIPs6 = map[string]string{"node-a": "fd00:10::11", "node-b": "fd00:10::12", "node-c": "fd00:20::13"}

// answers parses tcp-ask's output: each answer with its count, and the failures.
func answers(out string) (map[string]int, int) {
	got, failed := map[string]int{}, -1
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "answer":
			n, _ := strconv.Atoi(f[2])
			got[f[1]] += n
		case len(f) == 2 && f[0] == "failed":
			failed, _ = strconv.Atoi(f[1])
		}
	}
	return got, failed
}

// onlyFrom says whether every answer is one of want (and there are n in all).
func onlyFrom(got map[string]int, n int, want ...string) bool {
	total := 0
	for a, c := range got {
		ok := false
		for _, w := range want {
			ok = ok || a == w
		}
		if !ok {
			return false
		}
		total += c
	}
	return total == n
}

// ipv6Services runs the IPv6 and dual-stack checks: a dual-stack service from workloads over
// both families (the endpoint seeing the client's own address, or the hairpin address when
// it reaches itself), from the nodes' own sockets (IPv6, and IPv4 through a mapped address),
// and its IPv6 node port on every node from a client outside the cluster (the router,
// fd00:10::1), its address kept. IPv6 node ports forward to local endpoints only (no IPv6
// node-port tunnel yet): every node has one here.
func (l *lab) ipv6Services() error {
	l.step("IPv6 and dual-stack services: seed/dual, one cluster IP and one EndpointSlice per family")
	for _, w := range labWorkloads {
		if w.addr6 == "" {
			continue
		}
		for _, a := range []string{w.addr + ":8086", "[" + w.addr6 + "]:8086"} {
			if _, err := l.start(wlNS(w), "whoami "+a, false, l.tool(), "tcp-whoami", a); err != nil {
				return err
			}
		}
	}
	if err := l.apply("dual.yaml", seedDual); err != nil {
		return err
	}
	// The maps follow etcd within a second or two: wait for the IPv6 cluster IP to answer.
	if _, err := l.retry(10*time.Second, func() error {
		_, err := l.nsRun(wlNS(l.workload("web-a")), l.tool(), "tcp-ask", "[fd00:96::30]:86", "1")
		return err
	}); err != nil {
		l.check(false, "seed/dual's IPv6 cluster IP answers web-a within 10 s: %v", err)
	}
	for _, name := range []string{"web-a", "web-b", "web-c"} {
		w := l.workload(name)
		out, err := l.nsRun(wlNS(w), l.tool(), "tcp-ask", "[fd00:96::30]:86", "12")
		got, failed := answers(out)
		l.check(err == nil && failed == 0 && onlyFrom(got, 12, w.addr6, "100::5c1c"),
			"%s reaches IPv6 cluster IP [fd00:96::30]:86 12 of 12 times, seen with its own address %s (or 100::5c1c when it reaches itself): %s", name, w.addr6, oneLine(out))
		out, err = l.nsRun(wlNS(w), l.tool(), "tcp-ask", "10.96.0.30:86", "12")
		got, failed = answers(out)
		l.check(err == nil && failed == 0 && onlyFrom(got, 12, w.addr, "169.254.42.1"),
			"%s reaches the same service's IPv4 cluster IP 10.96.0.30:86 12 of 12 times, seen as %s: %s", name, w.addr, oneLine(out))
	}
	// Which endpoints answered: each family's own, on every node.
	out, _ := l.nsRun(wlNS(l.workload("db-a")), l.tool(), "tcp-ask", "10.96.0.30:86", "1")
	l.check(strings.Contains(out, "answer 10.66.0.1 1"), "db-a (IPv4 only) reaches the IPv4 cluster IP: %s", oneLine(out))
	start := time.Now()
	out, err := l.nsRun(wlNS(l.workload("web-a")), l.tool(), "tcp-check", "[fd00:96::30]:87")
	took := time.Since(start)
	l.check(err != nil && strings.Contains(out, "refused") && took < time.Second,
		"a port the IPv6 cluster IP does not have is refused at once (%v): %s", took.Round(time.Millisecond), oneLine(out))

	for _, n := range []string{"node-a", "node-c"} {
		out, err := l.nsRun(nodeNS(n), l.tool(), "tcp-ask", "[fd00:96::30]:86", "10")
		_, failed := answers(out)
		l.check(err == nil && failed == 0, "%s itself reaches IPv6 cluster IP [fd00:96::30]:86 10 of 10 times (connect6): %s", n, oneLine(out))
		out, err = l.nsRun(nodeNS(n), l.tool(), "tcp-ask-mapped", "10.96.0.30:86", "10")
		_, failed = answers(out)
		l.check(err == nil && failed == 0,
			"%s reaches IPv4 cluster IP 10.96.0.30:86 from a dual-stack IPv6 socket through ::ffff:10.96.0.30, 10 of 10 times: %s", n, oneLine(out))
	}

	for _, n := range []string{"node-a", "node-b", "node-c"} {
		addr := fmt.Sprintf("[%s]:30186", nodeIPs6[n])
		out, err := l.nsRun(nsRouter, l.tool(), "tcp-ask", addr, "10")
		got, failed := answers(out)
		l.check(err == nil && failed == 0 && onlyFrom(got, 10, routerOn(n)),
			"from outside the cluster (the router, %s), IPv6 node port %s answers 10 of 10 times, the client's address kept: %s", routerOn(n), addr, oneLine(out))
	}

	l.step("seed 000 over IPv6: node ports whose only endpoint is on node-b, from outside, through the IPv6 tunnel")
	if err := l.apply("np6.yaml", seedNP6); err != nil {
		return err
	}
	if _, err := l.retry(10*time.Second, func() error {
		_, err := l.nsRun(nsRouter, l.tool(), "tcp-ask", "[fd00:10::11]:30187", "1")
		return err
	}); err != nil {
		l.check(false, "seed/np6's node port on node-a answers within 10 s: %v", err)
	}
	before := l.bpfCounters("node-a")
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		addr := fmt.Sprintf("[%s]:30187", nodeIPs6[n])
		out, err := l.nsRun(nsRouter, l.tool(), "tcp-ask", addr, "20")
		got, failed := answers(out)
		how := "remote endpoint (web-b, through the tunnel)"
		if n == "node-b" {
			how = "local endpoint (web-b)"
		}
		l.check(err == nil && failed == 0 && onlyFrom(got, 20, routerOn(n)),
			"20 of 20 connections to %s's IPv6 node port %s reach the %s, which sees the client's own address %s: %s", n, addr, how, routerOn(n), oneLine(out))
	}
	after := l.bpfCounters("node-a")
	l.check(after["nat_forward_remote"]-before["nat_forward_remote"] >= 20,
		"node-a forwarded them to node-b (nat_forward_remote +%d)", after["nat_forward_remote"]-before["nat_forward_remote"])
	// Bulk both ways: full-size segments from the router (MSS 1440) do not fit the tunnel
	// (1430 inside 1500): Packet Too Big is the only way the client learns it.
	out, err = l.nsRun(nsRouter, l.tool(), "tcp-bulk", "[fd00:10::11]:30188", "4000000")
	ptb := l.bpfCounters("node-a")["icmp_too_big_sent"] - after["icmp_too_big_sent"]
	l.check(err == nil && ptb > 0,
		"4 MB echoed by web-b on node-b through node-a's IPv6 node port; node-a sent %d Packet Too Big, and the transfer completed: %s", ptb, oneLine(out))

	if err := l.noDF6(); err != nil {
		return err
	}

	if err := l.multiHomed6(); err != nil {
		return err
	}

	l.step("seed 000 over IPv6: connections through node-a's IPv6 node port across cleanups and a restart of its sluiced")
	front := "[fd00:10::11]:30188"
	idle, err := l.start(nsRouter, "idle6", false, l.tool(), "tcp-idle", front, "7")
	if err != nil {
		return err
	}
	stream, err := l.start(nsRouter, "stream6", false, l.tool(), "stream", "[fd00:20::13]:30188")
	if err != nil {
		return err
	}
	stream.waitFor(3*time.Second, "READY")
	<-idle.done
	l.check(idle.err == nil && idle.count("survived") == 1,
		"a connection through node-a's IPv6 node port idle for 7 s (more than three 2 s cleanup periods) still works: %s %v", strings.Join(idle.lines, " "), idle.err)
	l.check(stream.finish(), "a busy stream through node-c's IPv6 node port to node-b for the same 7 s never broke: %s", stream.transcript())
	return l.restartUnderTraffic(nsRouter, front, "IPv6 node port")
}

// noDF6 is noDF's IPv6 equivalent, from the host outside the cluster on node-a's own network
// (sl-client: no router between them that learnt the tunnel's MTU from node-a earlier and
// would answer first). IPv6 routers never fragment: a datagram too large for the tunnel (1,440
// bytes of payload, 1,488 on the wire, one packet on links of 1,500) gets Packet Too Big from
// node-a, and the client's stack fragments the resend to the MTU it learnt, as web-b's echo
// server (link of 1,500) does its echo after node-b's; the fragments a host makes must cross
// the tunnel both ways. Before the tunnel's receiving side gave a later fragment its first's
// ports, it dropped every one: no such datagram was answered.
func (l *lab) noDF6() error {
	l.step("seed 000 over IPv6: UDP too large for the tunnel with path MTU discovery off: Packet Too Big, then the hosts' own fragments cross")
	if p, err := l.start(wlNS(l.workload("web-b")), "udp-echo nodf web-b6", false, l.tool(), "udp-echo", "[fd00:65::41]:7008", "nodf"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("udp-echo nodf on web-b's IPv6 address: %v", err)
	}
	if err := l.apply("nodf6.yaml", seedNoDF6); err != nil {
		return err
	}
	// Small datagrams first, until both nodes' maps have the node port (each node follows etcd
	// on its own: a large one sent before would not learn the MTU from node-a).
	for _, n := range []string{"node-b", "node-a"} {
		_, _ = l.retry(10*time.Second, func() error {
			_, err := l.nsRun(nsClient, l.tool(), "udp-big", "["+nodeIPs6[n]+"]:30189", "100", "1")
			return err
		})
	}
	before := l.bpfCounters("node-a")
	out, err := l.nsRun(nsClient, l.tool(), "udp-big", "[fd00:10::11]:30189", "1440", "3", "nodf")
	ptb := l.bpfCounters("node-a")["icmp_too_big_sent"] - before["icmp_too_big_sent"]
	l.check(err == nil && ptb > 0,
		"from fd00:10::100, 3 of 3 datagrams of 1,440 bytes through node-a's IPv6 node port to web-b on node-b echoed whole; node-a sent %d Packet Too Big and the client's stack fragmented the resends: %s", ptb, oneLine(out))
	out, err = l.nsRun(nsClient, l.tool(), "udp-big", "[fd00:10::11]:30189", "3000", "3", "nodf")
	l.check(err == nil, "3 of 3 datagrams of 3,000 bytes, fragmented by the client's own stack, echoed whole through the same node port: %s", oneLine(out))
	return nil
}

// multiHomed6 is seed 000 over IPv6 from a client on another network (sl-ext, behind the
// router), with node-a's IPv6 default route leading out of its second NIC to a gateway that
// knows no client: every node's node port answers with the client's address kept, and
// node-a's replies leave by the NIC the requests came in on.
func (l *lab) multiHomed6() error {
	l.step("seed 000 over IPv6: from a client on another network (" + ext6 + "), multi-homed node-a's default route leading out of eth1")
	if _, err := sh("ip", "-n", nodeNS("node-a"), "-6", "route", "replace", "default", "via", "fd00:30::fe", "dev", "eth1"); err != nil {
		return err
	}
	defer func() { _, _ = sh("ip", "-n", nodeNS("node-a"), "-6", "route", "replace", "default", "via", gateway6) }()
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		addr := fmt.Sprintf("[%s]:30187", nodeIPs6[n])
		_, _ = l.retry(10*time.Second, func() error {
			_, err := l.nsRun(nsExt, l.tool(), "tcp-ask", addr, "1")
			return err
		})
		out, err := l.nsRun(nsExt, l.tool(), "tcp-ask", addr, "20")
		got, failed := answers(out)
		l.check(err == nil && failed == 0 && onlyFrom(got, 20, ext6),
			"20 of 20 connections from %s to %s's IPv6 node port %s reach web-b, which sees the client's own address: %s", ext6, n, addr, oneLine(out))
	}
	uplink := l.uplink("node-a")
	in, err := l.start(nodeNS("node-a"), "sniff6 "+uplink, false, l.tool(), "sniff", uplink, ext6, "3")
	if err != nil {
		return err
	}
	other, err := l.start(nodeNS("node-a"), "sniff6 eth1", false, l.tool(), "sniff", "eth1", ext6, "3")
	if err != nil {
		return err
	}
	if !in.waitFor(2*time.Second, "READY") || !other.waitFor(2*time.Second, "READY") {
		return fmt.Errorf("the captures on node-a's %s and eth1 did not start: %s; %s", uplink, in.transcript(), other.transcript())
	}
	out, err := l.nsRun(nsExt, l.tool(), "tcp-ask", "[fd00:10::11]:30187", "10")
	<-in.done
	<-other.done
	l.check(err == nil, "10 connections through node-a's IPv6 node port succeed although its IPv6 default route leads out of eth1: %s", oneLine(out))
	l.check(other.count("packets 0") == 1, "no IPv6 packet to the client left node-a by eth1 (capture: %s)", strings.Join(other.lines, " "))
	l.check(in.count("packets 0") == 0 && in.count("packets") == 1, "the replies left node-a by %s (capture: %s)", uplink, strings.Join(in.lines, " "))
	return nil
}

// routerOn is the router's address on a node's IPv6 subnet: the source a client there uses.
func routerOn(node string) string {
	if node == "node-c" {
		return "fd00:20::1"
	}
	return "fd00:10::1"
}
