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
func (l *lab) seed000() error { return l.play(seed000Scene) }

var seed000Scene = scene{
	heading("seed 000: node ports whose only endpoint is on node-b, from a client outside the cluster (192.168.40.100)"),
	serve{at: "web-b", run: "tcp-serve 10.65.0.65:8081"},
	serve{at: "web-b", run: "tcp-whoami 10.65.0.65:8082"},
	manifest{"seed-services.yaml", seedServices},
	commands{
		// Every node drops conntrack-INVALID packets in forward, input and output, as
		// kube-proxy's KUBE-FORWARD and most host firewalls do: every service path below must
		// work with it.
		"ip netns exec sl-node-a sluice-lab nft-drop-invalid add",
		"ip netns exec sl-node-b sluice-lab nft-drop-invalid add",
		"ip netns exec sl-node-c sluice-lab nft-drop-invalid add",
		// node-a becomes multi-homed: its default route now leads out of eth1 to a gateway
		// that knows no client; replies must still leave by eth0, where requests come in.
		"ip -n sl-node-a route replace default via 192.168.30.254 dev eth1",
	},
	// Wait until every node answers before counting.
	probe{from: nsExt, send: "tcp-ask 1", to: "192.168.10.11:30092", retry: 10 * time.Second, name: "the node port answers on node-a (192.168.10.11:30092)"},
	probe{from: nsExt, send: "tcp-ask 1", to: "192.168.10.12:30092", retry: 10 * time.Second, name: "the node port answers on node-b (192.168.10.12:30092)"},
	probe{from: nsExt, send: "tcp-ask 1", to: "192.168.20.13:30092", retry: 10 * time.Second, name: "the node port answers on node-c (192.168.20.13:30092)"},
	probe{from: nsExt, send: "tcp-ask 50", to: "192.168.10.11:30092", seenAs: "192.168.40.100",
		name: "50 of 50 connections to node-a's node port reach the endpoint on node-b, which sees the client's own address: %s"},
	probe{from: nsExt, send: "tcp-ask 50", to: "192.168.10.12:30092", seenAs: "192.168.40.100",
		name: "50 of 50 connections to node-b's node port reach the endpoint on node-b, which sees the client's own address: %s"},
	probe{from: nsExt, send: "tcp-ask 50", to: "192.168.20.13:30092", seenAs: "192.168.40.100",
		name: "50 of 50 connections to node-c's node port reach the endpoint on node-b, which sees the client's own address: %s"},

	// While node port 30092 leads to web-b's whoami: the same node ports through a node
	// migrated from Cilium and kube-proxy.
	act((*lab).migratedNode),

	heading("IPv4 options: every packet of the connection with Record Route, both ways"),
	probe{from: nsExt, send: "tcp-ask-opts 10", to: "192.168.10.11:30092", seenAs: "192.168.40.100",
		name: "10 of 10 connections with IP options to node-a's node port reach web-b, which sees the client's own address: %s"},
	probe{from: nsExt, send: "tcp-ask-opts 10", to: "192.168.10.12:30092", seenAs: "192.168.40.100",
		name: "10 of 10 connections with IP options to node-b's node port reach web-b, which sees the client's own address: %s"},

	heading("the node's own sockets and the node-port range"),
	look{node: "node-a", cmd: "cat /proc/sys/net/ipv4/ip_local_reserved_ports", has: []string{"30000-32767"},
		name: "node-a reserves the node-port range for its own sockets' source ports: %q"},
	// A socket bound to a node port's number by hand (the reservation does not stop that):
	// its TCP answers are told apart from node-port clients.
	probe{from: "node-a", send: "tcp-reuse 192.168.10.254:8081 fin 30092", to: "192.168.10.254:8081", want: []string{"first 192.168.10.11", "second 192.168.10.11"},
		name: "node-a's own connections from port 30092 (node port of np) to the gateway are answered: %s"},

	heading("UDP datagrams of 4,000 bytes, as IP fragments both ways, through a cluster IP and a node port"),
	serve{at: "web-b", run: "udp-echo 10.65.0.65:7007", ready: true},
	manifest{"seed-big.yaml", seedBig},
	await{from: nsExt, send: "udp-big 100 1", to: "192.168.10.12:30097", retry: 10 * time.Second},
	probe{from: "db-b", send: "udp-big 4000 20", to: "10.96.0.24:7",
		name: "db-b to the cluster IP, endpoint on its own node: 20 datagrams of 4,000 bytes echoed whole: %s"},
	probe{from: "web-a", send: "udp-big 4000 20", to: "10.96.0.24:7",
		name: "web-a to the cluster IP, endpoint on node-b (tunnel): 20 datagrams of 4,000 bytes echoed whole: %s"},
	probe{from: nsExt, send: "udp-big 4000 20", to: "192.168.10.12:30097",
		name: "the outside client to node-b's node port, endpoint local: 20 datagrams of 4,000 bytes echoed whole: %s"},
	probe{from: nsExt, send: "udp-big 4000 20", to: "192.168.10.11:30097",
		name: "the outside client to node-a's node port, endpoint on node-b (tunnel): 20 datagrams of 4,000 bytes echoed whole: %s"},

	act((*lab).noDF),

	heading("a client reuses its source port: through node-a's node port, then straight to the endpoint's own address"),
	// The second connection goes straight to web-b's node (a route of the client's own, so
	// that both directions pass node-b, as the firewall below wants), which must answer it as
	// web-b itself, not through the closed flow's state.
	commands{"ip -n sl-client route add 10.65.0.64/26 via 192.168.10.12"},
	undo{"ip -n sl-client route del 10.65.0.64/26"},
	probe{from: nsClient, send: "tcp-reuse 10.65.0.65:8082 fin 47001", to: "192.168.10.11:30092", want: []string{"first 192.168.10.100", "second 192.168.10.100"},
		name: "from port 47001: node-a's node port, closed with FIN, then web-b's own address 2 s later: both answered: %s"},
	probe{from: nsClient, send: "tcp-reuse 10.65.0.65:8082 rst 47002", to: "192.168.10.11:30092", want: []string{"first 192.168.10.100", "second 192.168.10.100"},
		name: "from port 47002: node-a's node port, closed with RST, then web-b's own address 2 s later: both answered: %s"},

	heading("a host-networked endpoint (node-b's own address): its replies leave by host interfaces"),
	serve{at: "node-b", run: "tcp-whoami 192.168.10.12:8083"},
	await{from: nsExt, send: "tcp-ask 1", to: "192.168.10.12:30094", retry: 5 * time.Second},
	probe{from: nsExt, send: "tcp-ask 20", to: "192.168.10.12:30094", seenAs: "192.168.40.100",
		name: "20 of 20 connections to node-b's node port reach the server in node-b's host namespace, which sees the client's own address: %s"},
	await{from: nsExt, send: "tcp-ask 1", to: "192.168.10.11:30094", retry: 5 * time.Second},
	probe{from: nsExt, send: "tcp-ask 20", to: "192.168.10.11:30094", seenAs: "192.168.40.100",
		name: "20 of 20 connections to node-a's node port reach the server in node-b's host namespace, which sees the client's own address: %s"},
	await{from: nsExt, send: "tcp-ask 1", to: "192.168.20.13:30094", retry: 5 * time.Second},
	probe{from: nsExt, send: "tcp-ask 20", to: "192.168.20.13:30094", seenAs: "192.168.40.100",
		name: "20 of 20 connections to node-c's node port reach the server in node-b's host namespace, which sees the client's own address: %s"},
	// Bulk both ways through node-a: node-b's host stack sends full-size segments (TSO on),
	// too large for the tunnel back to node-a; fragmentation-needed must reach that stack
	// (not leave by the NIC), which then sends segments that fit.
	serve{at: "node-b", run: "tcp-serve 192.168.10.12:8084", ready: true},
	probe{from: nsExt, send: "tcp-bulk 4000000", to: "192.168.10.11:30095",
		name: "4 MB echoed by node-b's host through node-a's node port, segmented (TSO) both ways: %s"},
	// The same with segmentation off on node-b's NIC (as on a VM without offloads): every
	// full-size segment is a packet of its own.
	commands{"ip -n sl-node-b link set eth0 gso_max_segs 1"},
	probe{from: nsExt, send: "tcp-bulk 4000000", to: "192.168.10.11:30095",
		name: "4 MB echoed by node-b's host through node-a's node port, without segmentation offload: %s"},
	commands{"ip -n sl-node-b link set eth0 gso_max_segs 65535"},
	probe{from: "web-a", send: "tcp-ask 10", to: "10.96.0.22:83", seenAs: "10.65.0.1",
		name: "web-a reaches cluster IP 10.96.0.22:83 (node-b's host) 10 of 10 times: %s"},
	probe{from: "web-b", send: "tcp-ask 10", to: "10.96.0.22:83", seenAs: "10.65.0.65",
		name: "web-b reaches cluster IP 10.96.0.22:83 (node-b's host) 10 of 10 times: %s"},

	act((*lab).synFlood),

	heading("seed 000: the reply leaves multi-homed node-a by the NIC the request came in on"),
	act((*lab).repliesLeaveByEth0),

	heading("seed 000: a connection through node-a lives across cleanups, busy and idle"),
	act((*lab).acrossCleanups),

	heading("externalTrafficPolicy Local with its health check node port"),
	// A health check is answered by the node's own socket and routed like any host service;
	// node-b's default gateway does not forward, so node-b gets a route to the client's network.
	commands{"ip -n sl-node-b route add 192.168.40.0/24 via 192.168.10.1"},
	await{from: nsExt, send: "http-get", to: "http://192.168.10.12:30999/", want: []string{"status 200"}, retry: 10 * time.Second},
	probe{from: nsExt, send: "http-get", to: "http://192.168.10.12:30999/", want: []string{`"localEndpoints":1`, `"serviceProxyHealthy":true`},
		name: "node-b's health check answers 200 with one local endpoint: %s"},
	// node-c, not multi-homed node-a: a health check is the host's own socket, answered by
	// the node's routing like any host service.
	probe{from: nsExt, send: "http-get", to: "http://192.168.20.13:30999/", want: []string{"status 503", `"localEndpoints":0`},
		name: "node-c's health check answers 503 with no local endpoint: %s"},
	probe{from: nsExt, send: "tcp-ask 20", to: "192.168.10.12:30093", seenAs: "192.168.40.100",
		name: "node-b serves the Local service to the outside client, whose address is kept: %s"},
	probe{from: nsExt, send: "tcp-ask 1", to: "192.168.20.13:30093", fails: true, want: []string{"failed 1"},
		name: "node-c, which has no local endpoint, drops the Local service's traffic as its health check says: %s"},
	probe{from: "web-a", send: "tcp-ask 5", to: "192.168.10.11:30093", seenAs: "10.65.0.1",
		name: "from inside the cluster (web-a) the same node port on node-a is treated as Cluster: %s"},

	heading("cluster IPs from workloads; unknown ports rejected at once"),
	probe{from: "web-a", send: "tcp-ask 10", to: "10.96.0.20:81", seenAs: "10.65.0.1",
		name: "web-a reaches cluster IP 10.96.0.20:81 (endpoint on node-b) 10 of 10 times, seen with its own address: %s"},
	probe{from: "web-c", send: "tcp-ask 10", to: "10.96.0.20:81", seenAs: "10.65.0.129",
		name: "web-c reaches cluster IP 10.96.0.20:81 (endpoint on node-b) 10 of 10 times, seen with its own address: %s"},
	probe{from: "db-a", send: "tcp-ask 10", to: "10.96.0.20:81", seenAs: "10.66.0.1",
		name: "db-a reaches cluster IP 10.96.0.20:81 (endpoint on node-b) 10 of 10 times, seen with its own address: %s"},
	probe{from: "db-b", send: "tcp-ask 10", to: "10.96.0.20:81", seenAs: "10.66.0.65",
		name: "db-b reaches cluster IP 10.96.0.20:81 (endpoint on node-b) 10 of 10 times, seen with its own address: %s"},
	// Hairpin: web-b is the service's endpoint and reaches it through the cluster IP.
	probe{from: "web-b", send: "tcp-ask 10", to: "10.96.0.20:81", seenAs: "169.254.42.1",
		name: "web-b, the endpoint itself, reaches cluster IP 10.96.0.20:81 10 of 10 times (hairpin, seen as 169.254.42.1): %s"},
	probe{from: "node-a", send: "tcp-ask 10", to: "10.96.0.20:81", want: []string{"failed 0"},
		name: "node-a itself reaches cluster IP 10.96.0.20:81 10 of 10 times (socket programs): %s"},
	probe{from: "node-c", send: "tcp-ask 10", to: "10.96.0.20:81", want: []string{"failed 0"},
		name: "node-c itself reaches cluster IP 10.96.0.20:81 10 of 10 times (socket programs): %s"},
	probe{from: "web-a", send: "tcp-check", to: "10.96.0.20:82", fails: true, want: []string{"refused"}, within: time.Second,
		name: "a port the service does not have is refused at once (%v): %s"},

	heading("an endpoint removed and another added while clients connect"),
	act((*lab).endpointsMoved),

	heading("a UDP service's only endpoint replaced while a resolver sends from one source port"),
	act((*lab).udpEndpointReplaced),

	act((*lab).firewallDrops),

	heading("sluiced restarted on node-a during a stream and a run of new connections through its node port"),
	act(func(l *lab) error { return l.restartUnderTraffic(nsExt, "192.168.10.11:30090", "node port") }),
}

// repliesLeaveByEth0: 10 connections from the outside client through multi-homed node-a's
// node port, while captures on its eth0 (where they come in) and eth1 (its default route's)
// count the packets to the client: all leave by eth0.
func (l *lab) repliesLeaveByEth0() error {
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
	out, err := l.nsRun(nsExt, l.tool(), "tcp-ask", nodeIPs["node-a"]+":30092", "10")
	<-eth0.done
	<-eth1.done
	l.check(err == nil, "10 connections through node-a succeed although its default route leads out of eth1: %s", oneLine(out))
	l.check(eth1.count("packets 0") == 1, "no packet to the client left node-a by eth1 (capture: %s)", strings.Join(eth1.lines, " "))
	l.check(eth0.count("packets 0") == 0 && eth0.count("packets") == 1, "the replies left node-a by eth0 (capture: %s)", strings.Join(eth0.lines, " "))
	return nil
}

// acrossCleanups: a connection through node-a's node port idle for 7 s, and a busy stream
// through node-c's for the same time, both across several conntrack cleanups (every 2 s).
func (l *lab) acrossCleanups() error {
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
	return nil
}

// endpointsMoved: new connections through node-a's node port go on without a failure while
// the echo service's endpoint web-b turns terminating, web-c is added, and web-b is removed.
func (l *lab) endpointsMoved() error {
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
	return nil
}

// udpEndpointReplaced: a resolver on web-a sends to a UDP service from one source port while
// the service's only endpoint, web-b, is replaced by web-c: within a second web-c answers.
func (l *lab) udpEndpointReplaced() error {
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
	return nil
}

// firewallDrops prints how many packets each node's firewall dropped as conntrack-INVALID.
func (l *lab) firewallDrops() error {
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		out, _ := l.nsRun(nodeNS(n), l.tool(), "nft-drop-invalid", "count")
		fmt.Fprintf(l.out, "%s's firewall dropped as conntrack-INVALID: %s\n", n, strings.TrimSpace(out))
	}
	return nil
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
func (l *lab) noDF() error {
	l.step("UDP with DF clear, 1,460 bytes of payload: too large for the tunnel, cut by node-a and node-b both ways")
	if p, err := l.start(nsOf("web-b"), "udp-echo nodf web-b", false, l.tool(), "udp-echo", "10.65.0.65:7008", "nodf"); err != nil || !p.waitFor(5*time.Second, "READY") {
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
