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
	if _, err := retry(10*time.Second, func() error {
		_, err := nsRun(wlNS(l.workload("web-a")), l.tool(), "tcp-ask", "[fd00:96::30]:86", "1")
		return err
	}); err != nil {
		l.check(false, "seed/dual's IPv6 cluster IP answers web-a within 10 s: %v", err)
	}
	for _, name := range []string{"web-a", "web-b", "web-c"} {
		w := l.workload(name)
		out, err := nsRun(wlNS(w), l.tool(), "tcp-ask", "[fd00:96::30]:86", "12")
		got, failed := answers(out)
		l.check(err == nil && failed == 0 && onlyFrom(got, 12, w.addr6, "100::5c1c"),
			"%s reaches IPv6 cluster IP [fd00:96::30]:86 12 of 12 times, seen with its own address %s (or 100::5c1c when it reaches itself): %s", name, w.addr6, oneLine(out))
		out, err = nsRun(wlNS(w), l.tool(), "tcp-ask", "10.96.0.30:86", "12")
		got, failed = answers(out)
		l.check(err == nil && failed == 0 && onlyFrom(got, 12, w.addr, "169.254.42.1"),
			"%s reaches the same service's IPv4 cluster IP 10.96.0.30:86 12 of 12 times, seen as %s: %s", name, w.addr, oneLine(out))
	}
	// Which endpoints answered: each family's own, on every node.
	out, _ := nsRun(wlNS(l.workload("db-a")), l.tool(), "tcp-ask", "10.96.0.30:86", "1")
	l.check(strings.Contains(out, "answer 10.66.0.1 1"), "db-a (IPv4 only) reaches the IPv4 cluster IP: %s", oneLine(out))
	start := time.Now()
	out, err := nsRun(wlNS(l.workload("web-a")), l.tool(), "tcp-check", "[fd00:96::30]:87")
	took := time.Since(start)
	l.check(err != nil && strings.Contains(out, "refused") && took < time.Second,
		"a port the IPv6 cluster IP does not have is refused at once (%v): %s", took.Round(time.Millisecond), oneLine(out))

	for _, n := range []string{"node-a", "node-c"} {
		out, err := nsRun(nodeNS(n), l.tool(), "tcp-ask", "[fd00:96::30]:86", "10")
		_, failed := answers(out)
		l.check(err == nil && failed == 0, "%s itself reaches IPv6 cluster IP [fd00:96::30]:86 10 of 10 times (connect6): %s", n, oneLine(out))
		out, err = nsRun(nodeNS(n), l.tool(), "tcp-ask-mapped", "10.96.0.30:86", "10")
		_, failed = answers(out)
		l.check(err == nil && failed == 0,
			"%s reaches IPv4 cluster IP 10.96.0.30:86 from a dual-stack IPv6 socket through ::ffff:10.96.0.30, 10 of 10 times: %s", n, oneLine(out))
	}

	for _, n := range []string{"node-a", "node-b", "node-c"} {
		addr := fmt.Sprintf("[%s]:30186", nodeIPs6[n])
		router := "fd00:10::1" // the router's address on the node's subnet
		if n == "node-c" {
			router = "fd00:20::1"
		}
		out, err := nsRun(nsRouter, l.tool(), "tcp-ask", addr, "10")
		got, failed := answers(out)
		l.check(err == nil && failed == 0 && onlyFrom(got, 10, router),
			"from outside the cluster (the router, %s), IPv6 node port %s answers 10 of 10 times, the client's address kept: %s", router, addr, oneLine(out))
	}
	return nil
}
