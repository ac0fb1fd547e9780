package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-net/sluice/bpf"
)

// seedServices are the services of the seed-000 scenario: "np" has its only endpoint on
// node-b (web-b) with externalTrafficPolicy Cluster, so node-a and node-c must forward;
// "lb-local" is a LoadBalancer with externalTrafficPolicy Local and its health check;
// "host-who" has a host-networked endpoint: a server in node-b's own namespace, at its address.
const seedServices = `apiVersion: v1
kind: Service
metadata: {name: np, namespace: seed}
spec:
  type: NodePort
  clusterIPs: [10.96.0.20]
  ports:
  - {name: echo, protocol: TCP, port: 80, targetPort: 8081, nodePort: 30090}
  - {name: who, protocol: TCP, port: 81, targetPort: 8082, nodePort: 30092}
  externalTrafficPolicy: Cluster
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: np-1
  namespace: seed
  labels: {kubernetes.io/service-name: np}
addressType: IPv4
endpoints:
- addresses: [10.65.0.65]
  conditions: {ready: true}
  nodeName: node-b
ports:
- {name: echo, protocol: TCP, port: 8081}
- {name: who, protocol: TCP, port: 8082}
---
apiVersion: v1
kind: Service
metadata: {name: lb-local, namespace: seed}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.0.21]
  ports:
  - {name: who, protocol: TCP, port: 81, targetPort: 8082, nodePort: 30093}
  externalTrafficPolicy: Local
  healthCheckNodePort: 30999
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-local-1
  namespace: seed
  labels: {kubernetes.io/service-name: lb-local}
addressType: IPv4
endpoints:
- addresses: [10.65.0.65]
  conditions: {ready: true}
  nodeName: node-b
ports:
- {name: who, protocol: TCP, port: 8082}
---
apiVersion: v1
kind: Service
metadata: {name: host-who, namespace: seed}
spec:
  type: NodePort
  clusterIPs: [10.96.0.22]
  ports:
  - {name: who, protocol: TCP, port: 83, targetPort: 8083, nodePort: 30094}
  - {name: echo, protocol: TCP, port: 84, targetPort: 8084, nodePort: 30095}
  externalTrafficPolicy: Cluster
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: host-who-1
  namespace: seed
  labels: {kubernetes.io/service-name: host-who}
addressType: IPv4
endpoints:
- addresses: [192.168.10.12]
  conditions: {ready: true}
  nodeName: node-b
ports:
- {name: who, protocol: TCP, port: 8083}
- {name: echo, protocol: TCP, port: 8084}
`

// seedUDP is a UDP service seed/<name> on cluster IP ip:port (and nodePort when not 0) whose
// one endpoint is addr:target on node.
func seedUDP(name, ip string, port, nodePort int, addr string, target int, node string) string {
	typ, np := "", ""
	if nodePort != 0 {
		typ, np = "\n  type: NodePort", fmt.Sprintf(", nodePort: %d", nodePort)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: seed}
spec:%[2]s
  clusterIPs: [%[3]s]
  ports:
  - {name: %[1]s, protocol: UDP, port: %[4]d, targetPort: %[5]d%[6]s}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-1
  namespace: seed
  labels: {kubernetes.io/service-name: %[1]s}
addressType: IPv4
endpoints:
- addresses: [%[7]s]
  conditions: {ready: true}
  nodeName: %[8]s
ports:
- {name: %[1]s, protocol: UDP, port: %[5]d}
`, name, typ, ip, port, target, np, addr, node)
}

// seedBig is a UDP echo service, cluster IP 10.96.0.24:7 and node port 30097, whose one
// endpoint is web-b:7007.
var seedBig = seedUDP("big", "10.96.0.24", 7, 30097, "10.65.0.65", 7007, "node-b")

// seedNoDF is a UDP echo service, cluster IP 10.96.0.25:7 and node port 30098, whose one
// endpoint is web-b:7008, an echo server with path MTU discovery off (its echoes go with DF
// clear, as the clients' requests).
var seedNoDF = seedUDP("nodf", "10.96.0.25", 7, 30098, "10.65.0.65", 7008, "node-b")

// seedDNS is a UDP service, cluster IP 10.96.0.23:53, whose one endpoint is addr:5353 on node.
func seedDNS(addr, node string) string { return seedUDP("dns", "10.96.0.23", 53, 0, addr, 5353, node) }

var nodeIPs = map[string]string{"node-a": "192.168.10.11", "node-b": "192.168.10.12", "node-c": "192.168.20.13"}

// seed000 runs the first user report's story with real traffic: node ports whose endpoint
// is on another node, from a client on another network, through a multi-homed node whose
// default route leads elsewhere; long and idle connections across cleanups; Local policy with
// its health check; cluster IPs from workloads; and agent restarts under traffic.
func (l *lab) seed000() error {
	l.step("seed 000: node ports whose only endpoint is on node-b, from a client outside the cluster (192.168.40.100)")
	webB := wlNS(l.workload("web-b"))
	for _, port := range []string{"8081"} {
		if _, err := l.start(webB, "echo web-b:"+port, false, l.tool(), "tcp-serve", "10.65.0.65:"+port); err != nil {
			return err
		}
	}
	if _, err := l.start(webB, "whoami web-b", false, l.tool(), "tcp-whoami", "10.65.0.65:8082"); err != nil {
		return err
	}
	if err := l.apply("seed-services.yaml", seedServices); err != nil {
		return err
	}
	// Every node drops conntrack-INVALID packets in forward, input and output, as
	// kube-proxy's KUBE-FORWARD and most host firewalls do: every service path below must
	// work with it.
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if _, err := l.nsRun(nodeNS(n), l.tool(), "nft-drop-invalid", "add"); err != nil {
			return fmt.Errorf("firewall on %s: %v", n, err)
		}
	}
	// node-a becomes multi-homed: its default route now leads out of eth1 to a gateway
	// that knows no client; replies must still leave by eth0, where requests come in.
	if _, err := sh("ip", "-n", nodeNS("node-a"), "route", "replace", "default", "via", "192.168.30.254", "dev", "eth1"); err != nil {
		return err
	}
	// Wait until every node answers before counting.
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		_, err := l.retry(10*time.Second, func() error {
			_, err := l.nsRun(nsExt, l.tool(), "tcp-ask", nodeIPs[n]+":30092", "1")
			return err
		})
		l.check(err == nil, "the node port answers on %s (%s:30092)", n, nodeIPs[n])
	}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		out, err := l.nsRun(nsExt, l.tool(), "tcp-ask", nodeIPs[n]+":30092", "50")
		l.check(err == nil && strings.Contains(out, "answer 192.168.40.100 50"),
			"50 of 50 connections to %s's node port reach the endpoint on node-b, which sees the client's own address: %s", n, oneLine(out))
	}

	// While node port 30092 leads to web-b's whoami: the same node ports through a node
	// migrated from Cilium and kube-proxy.
	if err := l.migratedNode(); err != nil {
		return err
	}

	l.step("IPv4 options: every packet of the connection with Record Route, both ways")
	for _, n := range []string{"node-a", "node-b"} {
		out, err := l.nsRun(nsExt, l.tool(), "tcp-ask-opts", nodeIPs[n]+":30092", "10")
		l.check(err == nil && strings.Contains(out, "answer 192.168.40.100 10"),
			"10 of 10 connections with IP options to %s's node port reach web-b, which sees the client's own address: %s", n, oneLine(out))
	}

	l.step("the node's own sockets and the node-port range")
	out, err := sh("ip", "netns", "exec", nodeNS("node-a"), "cat", "/proc/sys/net/ipv4/ip_local_reserved_ports")
	l.check(err == nil && strings.Contains(out, "30000-32767"), "node-a reserves the node-port range for its own sockets' source ports: %q", strings.TrimSpace(out))
	// A socket bound to a node port's number by hand (the reservation does not stop that):
	// its TCP answers are told apart from node-port clients.
	out, err = l.nsRun(nodeNS("node-a"), l.tool(), "tcp-reuse", "192.168.10.254:8081", "192.168.10.254:8081", "fin", "30092")
	l.check(err == nil && strings.Count(out, "192.168.10.11") == 2, "node-a's own connections from port 30092 (node port of np) to the gateway are answered: %s", oneLine(out))

	l.step("UDP datagrams of 4,000 bytes, as IP fragments both ways, through a cluster IP and a node port")
	if p, err := l.start(webB, "udp-echo web-b", false, l.tool(), "udp-echo", "10.65.0.65:7007"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("udp-echo on web-b: %v", err)
	}
	if err := l.apply("seed-big.yaml", seedBig); err != nil {
		return err
	}
	_, _ = l.retry(10*time.Second, func() error {
		_, err := l.nsRun(nsExt, l.tool(), "udp-big", nodeIPs["node-b"]+":30097", "100", "1")
		return err
	})
	for _, c := range []struct{ ns, to, what string }{
		{wlNS(l.workload("db-b")), "10.96.0.24:7", "db-b to the cluster IP, endpoint on its own node"},
		{wlNS(l.workload("web-a")), "10.96.0.24:7", "web-a to the cluster IP, endpoint on node-b (tunnel)"},
		{nsExt, nodeIPs["node-b"] + ":30097", "the outside client to node-b's node port, endpoint local"},
		{nsExt, nodeIPs["node-a"] + ":30097", "the outside client to node-a's node port, endpoint on node-b (tunnel)"},
	} {
		out, err := l.nsRun(c.ns, l.tool(), "udp-big", c.to, "4000", "20")
		l.check(err == nil, "%s: 20 datagrams of 4,000 bytes echoed whole: %s", c.what, oneLine(out))
	}

	if err := l.noDF(webB); err != nil {
		return err
	}

	l.step("a client reuses its source port: through node-a's node port, then straight to the endpoint's own address")
	// The second connection goes straight to web-b's node (a route of the client's own, so
	// that both directions pass node-b, as the firewall below wants), which must answer it as
	// web-b itself, not through the closed flow's state.
	if _, err := sh("ip", "-n", nsClient, "route", "add", "10.65.0.64/26", "via", nodeIPs["node-b"]); err != nil {
		return err
	}
	defer func() { _, _ = sh("ip", "-n", nsClient, "route", "del", "10.65.0.64/26") }()
	for i, how := range []string{"fin", "rst"} {
		port := strconv.Itoa(47001 + i)
		out, err := l.nsRun(nsClient, l.tool(), "tcp-reuse", nodeIPs["node-a"]+":30092", "10.65.0.65:8082", how, port)
		l.check(err == nil && strings.Contains(out, "first 192.168.10.100") && strings.Contains(out, "second 192.168.10.100"),
			"from port %s: node-a's node port, closed with %s, then web-b's own address 2 s later: both answered: %s", port, strings.ToUpper(how), oneLine(out))
	}

	l.step("a host-networked endpoint (node-b's own address): its replies leave by host interfaces")
	if _, err := l.start(nodeNS("node-b"), "whoami node-b host", false, l.tool(), "tcp-whoami", nodeIPs["node-b"]+":8083"); err != nil {
		return err
	}
	for _, n := range []string{"node-b", "node-a", "node-c"} {
		_, _ = l.retry(5*time.Second, func() error {
			_, err := l.nsRun(nsExt, l.tool(), "tcp-ask", nodeIPs[n]+":30094", "1")
			return err
		})
		out, err := l.nsRun(nsExt, l.tool(), "tcp-ask", nodeIPs[n]+":30094", "20")
		l.check(err == nil && strings.Contains(out, "answer 192.168.40.100 20"),
			"20 of 20 connections to %s's node port reach the server in node-b's host namespace, which sees the client's own address: %s", n, oneLine(out))
	}
	// Bulk both ways through node-a: node-b's host stack sends full-size segments (TSO on),
	// too large for the tunnel back to node-a; fragmentation-needed must reach that stack
	// (not leave by the NIC), which then sends segments that fit.
	if p, err := l.start(nodeNS("node-b"), "echo node-b host", false, l.tool(), "tcp-serve", nodeIPs["node-b"]+":8084"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("echo server in node-b's host namespace: %v", err)
	}
	out, err = l.nsRun(nsExt, l.tool(), "tcp-bulk", nodeIPs["node-a"]+":30095", "4000000")
	l.check(err == nil, "4 MB echoed by node-b's host through node-a's node port, segmented (TSO) both ways: %s", oneLine(out))
	// The same with segmentation off on node-b's NIC (as on a VM without offloads): every
	// full-size segment is a packet of its own.
	if _, err := sh("ip", "-n", nodeNS("node-b"), "link", "set", "eth0", "gso_max_segs", "1"); err != nil {
		return err
	}
	out, err = l.nsRun(nsExt, l.tool(), "tcp-bulk", nodeIPs["node-a"]+":30095", "4000000")
	l.check(err == nil, "4 MB echoed by node-b's host through node-a's node port, without segmentation offload: %s", oneLine(out))
	if _, err := sh("ip", "-n", nodeNS("node-b"), "link", "set", "eth0", "gso_max_segs", "65535"); err != nil {
		return err
	}
	for _, w := range []string{"web-a", "web-b"} {
		out, err := l.nsRun(wlNS(l.workload(w)), l.tool(), "tcp-ask", "10.96.0.22:83", "10")
		l.check(err == nil && strings.Contains(out, "answer "+l.workload(w).addr+" 10"),
			"%s reaches cluster IP 10.96.0.22:83 (node-b's host) 10 of 10 times: %s", w, oneLine(out))
	}

	if err := l.synFlood(); err != nil {
		return err
	}

	l.step("seed 000: the reply leaves multi-homed node-a by the NIC the request came in on")
	eth0, err := l.start(nodeNS("node-a"), "sniff eth0", false, l.tool(), "sniff", "eth0", "192.168.40.100", "3")
	if err != nil {
		return err
	}
	eth1, err := l.start(nodeNS("node-a"), "sniff eth1", false, l.tool(), "sniff", "eth1", "192.168.40.100", "3")
	if err != nil {
		return err
	}
	if !eth0.waitFor(2*time.Second, "READY") || !eth1.waitFor(2*time.Second, "READY") {
		return fmt.Errorf("the captures on node-a's eth0 and eth1 did not start: %s; %s", eth0.transcript(), eth1.transcript())
	}
	out, err = l.nsRun(nsExt, l.tool(), "tcp-ask", nodeIPs["node-a"]+":30092", "10")
	<-eth0.done
	<-eth1.done
	l.check(err == nil, "10 connections through node-a succeed although its default route leads out of eth1: %s", oneLine(out))
	l.check(eth1.count("packets 0") == 1, "no packet to the client left node-a by eth1 (capture: %s)", strings.Join(eth1.lines, " "))
	l.check(eth0.count("packets 0") == 0 && eth0.count("packets") == 1, "the replies left node-a by eth0 (capture: %s)", strings.Join(eth0.lines, " "))

	l.step("seed 000: a connection through node-a lives across cleanups, busy and idle")
	idle, err := l.start(nsExt, "idle", false, l.tool(), "tcp-idle", nodeIPs["node-a"]+":30090", "7")
	if err != nil {
		return err
	}
	stream, err := l.start(nsExt, "stream", false, l.tool(), "stream", nodeIPs["node-c"]+":30090")
	if err != nil {
		return err
	}
	stream.waitFor(3*time.Second, "READY")
	<-idle.done
	l.check(idle.err == nil && idle.count("survived") == 1,
		"a connection through node-a idle for 7 s (more than three 2 s cleanup periods) still works: %s %v", strings.Join(idle.lines, " "), idle.err)
	l.check(stream.finish(), "a busy stream through node-c to node-b for the same 7 s never broke: %s", stream.transcript())

	l.step("externalTrafficPolicy Local with its health check node port")
	// A health check is answered by the node's own socket and routed like any host service;
	// node-b's default gateway does not forward, so node-b gets a route to the client's network.
	if _, err := sh("ip", "-n", nodeNS("node-b"), "route", "add", "192.168.40.0/24", "via", "192.168.10.1"); err != nil {
		return err
	}
	ok, err := l.retry(10*time.Second, func() error {
		out, err := l.nsRun(nsExt, l.tool(), "http-get", "http://"+nodeIPs["node-b"]+":30999/")
		if err == nil && !strings.Contains(out, "status 200") {
			err = fmt.Errorf("%s", out)
		}
		return err
	})
	_ = ok
	outB, _ := l.nsRun(nsExt, l.tool(), "http-get", "http://"+nodeIPs["node-b"]+":30999/")
	l.check(err == nil && strings.Contains(outB, `"localEndpoints":1`) && strings.Contains(outB, `"serviceProxyHealthy":true`),
		"node-b's health check answers 200 with one local endpoint: %s", oneLine(outB))
	// node-c, not multi-homed node-a: a health check is the host's own socket, answered by
	// the node's routing like any host service.
	outC, _ := l.nsRun(nsExt, l.tool(), "http-get", "http://"+nodeIPs["node-c"]+":30999/")
	l.check(strings.Contains(outC, "status 503") && strings.Contains(outC, `"localEndpoints":0`),
		"node-c's health check answers 503 with no local endpoint: %s", oneLine(outC))
	out, err = l.nsRun(nsExt, l.tool(), "tcp-ask", nodeIPs["node-b"]+":30093", "20")
	l.check(err == nil && strings.Contains(out, "answer 192.168.40.100 20"), "node-b serves the Local service to the outside client, whose address is kept: %s", oneLine(out))
	out, err = l.nsRun(nsExt, l.tool(), "tcp-ask", nodeIPs["node-c"]+":30093", "1")
	l.check(err != nil && strings.Contains(out, "failed 1"), "node-c, which has no local endpoint, drops the Local service's traffic as its health check says: %s", oneLine(out))
	out, err = l.nsRun(wlNS(l.workload("web-a")), l.tool(), "tcp-ask", nodeIPs["node-a"]+":30093", "5")
	l.check(err == nil && strings.Contains(out, "answer 10.65.0.1 5"), "from inside the cluster (web-a) the same node port on node-a is treated as Cluster: %s", oneLine(out))

	l.step("cluster IPs from workloads; unknown ports rejected at once")
	for _, w := range []string{"web-a", "web-c", "db-a", "db-b"} {
		out, err := l.nsRun(wlNS(l.workload(w)), l.tool(), "tcp-ask", "10.96.0.20:81", "10")
		l.check(err == nil && strings.Contains(out, "answer "+l.workload(w).addr+" 10"),
			"%s reaches cluster IP 10.96.0.20:81 (endpoint on node-b) 10 of 10 times, seen with its own address: %s", w, oneLine(out))
	}
	// Hairpin: web-b is the service's endpoint and reaches it through the cluster IP.
	out, err = l.nsRun(wlNS(l.workload("web-b")), l.tool(), "tcp-ask", "10.96.0.20:81", "10")
	l.check(err == nil && strings.Contains(out, "answer 169.254.42.1 10"),
		"web-b, the endpoint itself, reaches cluster IP 10.96.0.20:81 10 of 10 times (hairpin, seen as 169.254.42.1): %s", oneLine(out))
	for _, n := range []string{"node-a", "node-c"} {
		out, err := l.nsRun(nodeNS(n), l.tool(), "tcp-ask", "10.96.0.20:81", "10")
		l.check(err == nil && strings.Contains(out, "failed 0"), "%s itself reaches cluster IP 10.96.0.20:81 10 of 10 times (socket programs): %s", n, oneLine(out))
	}
	start := time.Now()
	out, err = l.nsRun(wlNS(l.workload("web-a")), l.tool(), "tcp-check", "10.96.0.20:82")
	took := time.Since(start)
	l.check(err != nil && strings.Contains(out, "refused") && took < time.Second,
		"a port the service does not have is refused at once (%v): %s", took.Round(time.Millisecond), oneLine(out))

	l.step("an endpoint removed and another added while clients connect")
	loop, err := l.start(nsExt, "loop", false, l.tool(), "tcp-loop", nodeIPs["node-a"]+":30090")
	if err != nil {
		return err
	}
	if _, err := l.start(wlNS(l.workload("web-c")), "echo web-c:8081", false, l.tool(), "tcp-serve", "10.65.0.129:8081"); err != nil {
		return err
	}
	loop.waitFor(3*time.Second, "READY")
	l.sleep(500 * time.Millisecond)
	// web-c joins the echo service (terminating web-b first, then removing it).
	moved := strings.Replace(seedServices, "- addresses: [10.65.0.65]\n  conditions: {ready: true}\n  nodeName: node-b\nports:\n- {name: echo, protocol: TCP, port: 8081}",
		"- addresses: [10.65.0.65]\n  conditions: {ready: false, serving: true, terminating: true}\n  nodeName: node-b\n- addresses: [10.65.0.129]\n  conditions: {ready: true}\n  nodeName: node-c\nports:\n- {name: echo, protocol: TCP, port: 8081}", 1)
	if err := l.apply("seed-services.yaml", moved); err != nil {
		return err
	}
	l.sleep(time.Second)
	// Then web-b leaves the slice altogether.
	gone := strings.Replace(moved, "- addresses: [10.65.0.65]\n  conditions: {ready: false, serving: true, terminating: true}\n  nodeName: node-b\n", "", 1)
	if err := l.apply("seed-services.yaml", gone); err != nil {
		return err
	}
	l.sleep(time.Second)
	_ = loop.stdin.Close()
	<-loop.done
	l.check(loop.err == nil && loop.count("failed 0") == 1, "connections through node-a while web-b turned terminating, web-c was added and web-b was removed: %s", oneLine(strings.Join(loop.lines, " ")))

	l.step("a UDP service's only endpoint replaced while a resolver sends from one source port")
	for _, w := range []struct{ name, addr string }{{"web-b", "10.65.0.65"}, {"web-c", "10.65.0.129"}} {
		if p, err := l.start(wlNS(l.workload(w.name)), "udp-who "+w.name, false, l.tool(), "udp-who", w.addr+":5353", w.name); err != nil || !p.waitFor(5*time.Second, "READY") {
			return fmt.Errorf("udp-who on %s: %v", w.name, err)
		}
	}
	if err := l.apply("seed-dns.yaml", seedDNS("10.65.0.65", "node-b")); err != nil {
		return err
	}
	resolver, err := l.start(wlNS(l.workload("web-a")), "resolver", false, l.tool(), "udp-resolver", "10.96.0.23:53", "5300")
	if err != nil {
		return err
	}
	l.check(resolver.waitFor(10*time.Second, "answer web-b"), "web-a's resolver, from port 5300, gets answers from web-b through cluster IP 10.96.0.23:53: %s", oneLine(strings.Join(resolver.lines, " ")))
	if err := l.apply("seed-dns.yaml", seedDNS("10.65.0.129", "node-c")); err != nil {
		return err
	}
	applied := time.Now()
	answered := resolver.waitFor(5*time.Second, "answer web-c")
	swapped := time.Since(applied)
	l.check(answered && swapped < time.Second, "after web-b was replaced by web-c, the resolver's next answers come from web-c within a second (%v; cleanup runs every 2 s)", swapped.Round(10*time.Millisecond))
	_ = resolver.stdin.Close()
	<-resolver.done

	for _, n := range []string{"node-a", "node-b", "node-c"} {
		out, _ := l.nsRun(nodeNS(n), l.tool(), "nft-drop-invalid", "count")
		fmt.Fprintf(l.out, "%s's firewall dropped as conntrack-INVALID: %s\n", n, strings.TrimSpace(out))
	}

	l.step("sluiced restarted on node-a during a stream and a run of new connections through its node port")
	return l.restartUnderTraffic(nsExt, nodeIPs["node-a"]+":30090", "node port")
}

// restartUnderTraffic restarts node-a's sluiced while a stream and a run of new connections
// go from the client namespace to front (one of node-a's node ports, named what in the
// checks): the stream must never break and no new connection fail.
func (l *lab) restartUnderTraffic(client, front, what string) error {
	stream, err := l.start(client, "stream", false, l.tool(), "stream", front)
	if err != nil {
		return err
	}
	loop, err := l.start(client, "loop", false, l.tool(), "tcp-loop", front)
	if err != nil {
		return err
	}
	stream.waitFor(3*time.Second, "READY")
	loop.waitFor(3*time.Second, "READY")
	l.check(l.agents["node-a"].stop() == nil, "sluiced on node-a stops on SIGTERM, leaving programs and maps pinned")
	l.sleep(time.Second)
	restarted, err := l.startAgent("node-a")
	if err != nil {
		return err
	}
	l.check(restarted.waitFor(20*time.Second, "service stage started"), "the new sluiced on node-a has adopted the pinned programs and maps")
	l.sleep(time.Second)
	_ = loop.stdin.Close()
	l.check(stream.finish(), "the stream through node-a's %s never broke across the restart: %s", what, stream.transcript())
	<-loop.done
	l.check(loop.err == nil && loop.count("failed 0") == 1, "no new connection through node-a's %s failed across the restart: %s", what,
		oneLine(strings.Join(loop.lines, " ")))
	return nil
}

// synFlood floods node-a's node port 30094 (node-b's host) with SYNs from spoofed addresses
// while a connection made before it idles through it and new ones are made during it.
func (l *lab) synFlood() error {
	l.step("a SYN flood from spoofed addresses through node-a's node port: old and new connections keep working")
	front := nodeIPs["node-a"] + ":30094"
	before := map[string]map[string]uint64{}
	for _, n := range []string{"node-a", "node-b"} {
		before[n] = l.bpfCounters(n)
	}
	idle, err := l.start(nsExt, "idle through the flood", false, l.tool(), "tcp-idle", nodeIPs["node-a"]+":30095", "8")
	if err != nil || !idle.waitFor(3*time.Second, "READY") {
		return fmt.Errorf("a connection to node-a:30095 before the flood: %v", err)
	}
	flood, err := l.start(nsClient, "syn flood", false, l.tool(), "syn-flood", front, "12")
	if err != nil {
		return err
	}
	// Without the eviction the table is full within three seconds at this rate (40,000 to
	// 48,000 a second here), and stays full: the backend's SYN-ACKs made every flow answered.
	l.sleep(5 * time.Second)
	out, _ := l.nsRun(nsExt, l.tool(), "tcp-ask", front, "100")
	failed := -1
	for _, line := range strings.Split(out, "\n") {
		if f, ok := strings.CutPrefix(line, "failed "); ok {
			failed, _ = strconv.Atoi(strings.TrimSpace(f))
		}
	}
	<-idle.done
	<-flood.done
	l.check(failed >= 0 && failed <= 5, "during the flood %d of 100 new connections succeed (at least 95): %s", 100-failed, oneLine(out))
	l.check(idle.err == nil, "a connection made before the flood answers again 8 s later, in the middle of it: %s", idle.transcript())
	out, err = l.nsRun(nsExt, l.tool(), "tcp-ask", front, "20")
	l.check(err == nil, "after the flood 20 of 20 new connections succeed: %s", oneLine(out))
	var report []string
	for _, n := range []string{"node-a", "node-b"} {
		after := l.bpfCounters(n)
		for _, c := range []string{"nat_new", "conntrack_evicted", "drop_conntrack_full"} {
			report = append(report, fmt.Sprintf("%s %s +%d", n, c, after[c]-before[n][c]))
		}
	}
	fmt.Fprintf(l.out, "%s; %s\n", flood.transcript(), strings.Join(report, ", "))
	return nil
}

// noDF sends UDP that may be fragmented (DF clear: Windows, NFS, RADIUS, SNMP and many
// appliances send so) and is too large for the node-port tunnel, 1,460 bytes of payload on
// links of 1,500, from the outside client through node-a's node port to an echo server on
// node-b that answers as large, also with DF clear: node-a cuts each request and node-b each
// echo, as routers would. The client's stack leaves its checksum to be finished at transmit
// (it sits behind a veth), as do the echo server's: every datagram was lost until the
// programs finished such a checksum before cutting.
func (l *lab) noDF(webB string) error {
	l.step("UDP with DF clear, 1,460 bytes of payload: too large for the tunnel, cut by node-a and node-b both ways")
	if p, err := l.start(webB, "udp-echo nodf web-b", false, l.tool(), "udp-echo", "10.65.0.65:7008", "nodf"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("udp-echo nodf on web-b: %v", err)
	}
	if err := l.apply("seed-nodf.yaml", seedNoDF); err != nil {
		return err
	}
	// Small datagrams first, until both nodes' maps have the node port.
	for _, n := range []string{"node-b", "node-a"} {
		_, _ = l.retry(10*time.Second, func() error {
			_, err := l.nsRun(nsExt, l.tool(), "udp-big", nodeIPs[n]+":30098", "100", "1")
			return err
		})
	}
	for _, c := range []struct{ node, what string }{
		{"node-b", "endpoint local"},
		{"node-a", "endpoint on node-b (tunnel)"},
	} {
		beforeA, beforeB := l.bpfCounters("node-a"), l.bpfCounters("node-b")
		out, err := l.nsRun(nsExt, l.tool(), "udp-big", nodeIPs[c.node]+":30098", "1460", "3", "nodf")
		cutA := l.bpfCounters("node-a")["fragment_split"] - beforeA["fragment_split"]
		cutB := l.bpfCounters("node-b")["fragment_split"] - beforeB["fragment_split"]
		ok := err == nil && strings.Contains(out, "echoed 3 of 3 in 3 sends")
		if c.node == "node-a" {
			ok = ok && cutA >= 3 && cutB >= 3
		}
		l.check(ok, "the outside client to %s's node port, %s: 3 of 3 datagrams of 1,460 bytes with DF clear echoed whole, none sent twice (cut: node-a %d, node-b %d): %s",
			c.node, c.what, cutA, cutB, oneLine(out))
	}
	return nil
}

// bpfCounters reads a node's service-stage counters from its pinned map (all zero when it
// cannot: the check that uses them then fails).
func (l *lab) bpfCounters(node string) map[string]uint64 {
	p, err := bpf.OpenPinned(filepath.Join(l.dir, "bpf", node))
	if err != nil {
		return map[string]uint64{}
	}
	defer p.Close()
	c, _ := p.Counters()
	return c
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
