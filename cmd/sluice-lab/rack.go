package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The lab's rack (issue #38): BGP from testdata/bgp/rack.yaml, the router as each subnet's
// top-of-rack router (the lab's own, sluice-lab tor: AS 65010, peering over eBGP with every
// node, each node an AS of its own), a pool without encapsulation routed across the subnets
// by BGP alone, an outside client reaching a workload and a service's external address
// through the router's routes (ECMP over the nodes for the address every node announces).

// routedWorkloads are the pool-routed workloads: rt-a on node-a (rack a), rt-c on node-c
// (rack b).
var routedWorkloads = []labWorkload{
	{"rt-a", "node-a", "cali-rt-a", "10.67.0.1", ""},
	{"rt-c", "node-c", "cali-rt-c", "10.67.0.129", ""},
}

// rackSetup applies the rack's BGP and starts the router's speaker; before the agents.
func (l *lab) rackSetup() error {
	l.step("the rack: BGP as testdata/bgp/rack.yaml says, the router as top-of-rack (sluice-lab tor, AS 65010)")
	l.mustCtl("apply", "-f", filepath.Join(l.testdata, "..", "bgp", "rack.yaml"))
	if _, err := l.nsRun(nsRouter, "sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1"); err != nil {
		return err
	}
	tor, err := l.start(nsRouter, "tor", false, l.tool(), "tor", "--as", "65010", "--router-id", "192.168.10.1",
		"--peer", "192.168.10.11:64601", "--peer", "192.168.10.12:64602", "--peer", "192.168.20.13:64603")
	if err != nil {
		return err
	}
	if !tor.waitFor(10*time.Second, "READY") {
		return fmt.Errorf("the top-of-rack router did not start: %s", tor.transcript())
	}
	l.tor = tor
	return nil
}

const routedPool = `apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: pool-routed}
spec: {cidr: 10.67.0.0/16, vxlanMode: Never, ipipMode: Never, natOutgoing: false}
`

func routedWEP(w labWorkload) string {
	return fmt.Sprintf(`apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata: {name: %s-k8s-%s-eth0, namespace: default}
spec: {orchestrator: k8s, node: %s, pod: %s, endpoint: eth0, interfaceName: %s, ipNetworks: [%s/32]}
`, strings.ReplaceAll(w.node, "-", "--"), strings.ReplaceAll(w.name, "-", "--"), w.node, w.name, w.iface, w.addr)
}

// The service every node announces: its external address is in a single-address range.
const bgpService = `apiVersion: v1
kind: Service
metadata: {name: web-bgp, namespace: default}
spec:
  type: ClusterIP
  clusterIPs: [10.96.0.77]
  externalIPs: [192.168.50.7]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-bgp-1, namespace: default, labels: {kubernetes.io/service-name: web-bgp}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
  - {addresses: [10.65.0.1], nodeName: node-a, conditions: {ready: true}}
  - {addresses: [10.65.0.65], nodeName: node-b, conditions: {ready: true}}
  - {addresses: [10.65.0.129], nodeName: node-c, conditions: {ready: true}}
`

// routerHas waits up to timeout for the router's BGP routes to include every line of want
// (and none of lacks), and returns how long that took.
func (l *lab) routerHas(timeout time.Duration, want []string, lacks []string) (time.Duration, string, bool) {
	var out string
	took, err := l.retry(timeout, func() error {
		var err error
		if out, err = l.nsRun(nsRouter, "ip", "route", "show", "proto", "186"); err != nil {
			return err
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("no %q", w)
			}
		}
		for _, w := range lacks {
			if strings.Contains(out, w) {
				return fmt.Errorf("still %q", w)
			}
		}
		return nil
	})
	return took, oneLine(out), err == nil
}

// rackBGP is the rack's scene.
func (l *lab) rackBGP() error {
	l.step("BGP: every node peers with its rack's router; a pool without encapsulation is routed across the subnets by BGP alone")
	for _, n := range labNodes {
		var out string
		_, err := l.retry(30*time.Second, func() error {
			var err error
			out, err = l.nsRun(n.ns, filepath.Join(l.bin, "sluicectl"), "bgp", "--agent", "127.0.0.1:9097")
			if err == nil && !strings.Contains(out, "established") {
				err = fmt.Errorf("not established")
			}
			return err
		})
		l.check(err == nil, "sluicectl bgp on %s: its session with the router is established: %s", n.name, oneLine(out))
	}
	if err := l.apply("pool-routed", routedPool); err != nil {
		return err
	}
	for i, w := range routedWorkloads {
		if err := l.apply(w.name, routedWEP(w)); err != nil {
			return err
		}
		l.mustCtl("ipam", "claim", "--node", w.node, "--pool", "pool-routed", "--cidr", fmt.Sprintf("10.67.0.%d/26", 128*i))
		l.mustCtl("ipam", "assign", "--node", w.node, "--handle", "k8s-pod-network."+w.name, "--ip", w.addr)
		if err := l.script(plugWorkload("sl-wl-"+w.name, w.node, w.iface, w.addr, "")...); err != nil {
			return err
		}
	}
	if p, err := l.start("sl-wl-rt-c", "whoami rt-c", false, l.tool(), "tcp-whoami", "10.67.0.129:8093"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("whoami in rt-c: %v", err)
	}
	_, out, ok := l.routerHas(10*time.Second, []string{"10.67.0.0/26 via 192.168.10.11", "10.67.0.128/26 via 192.168.20.13"}, nil)
	l.check(ok, "the router learned node-a's and node-c's blocks of pool-routed, each via its node: %s", out)
	for _, c := range []struct{ node, want, lacks string }{
		{"node-a", "10.67.0.128/26", "10.67.0.128/26 via 10.65"},
		{"node-c", "10.67.0.0/26", "10.67.0.0/26 via 10.65"},
	} {
		look{node: c.node, cmd: "ip route show proto 83 " + c.want, has: []string{"via 192.168." + map[string]string{"node-a": "10", "node-c": "20"}[c.node] + ".1"}, lacks: []string{"vxlan"},
			name: c.node + " routes the other rack's block " + c.want + " through the router, learned by BGP, with sluice's protocol: %s"}.play(l)
	}
	probe{from: "sl-wl-rt-a", send: "tcp-ask 5", to: "10.67.0.129:8093", seenAs: "10.67.0.1", retry: 10 * time.Second,
		name: "rt-a (node-a, rack a) -> rt-c (node-c, rack b) through the router, no overlay, keeping rt-a's address: %s"}.play(l)
	probe{from: nsExt, send: "tcp-ask 5", to: "10.67.0.129:8093", seenAs: "192.168.40.100", retry: 10 * time.Second,
		name: "an outside client (sl-ext) reaches rt-c through the router's learned route: %s"}.play(l)

	l.step("a block claimed and released: announced and withdrawn")
	start := time.Now()
	l.mustCtl("ipam", "claim", "--node", "node-b", "--pool", "pool-routed", "--cidr", "10.67.0.64/26")
	claimed := time.Since(start)
	took, out, ok := l.routerHas(10*time.Second, []string{"10.67.0.64/26 via 192.168.10.12"}, nil)
	l.check(ok, "node-b's new block is at the router %v after its claim was written (%v with the claim): %s", took.Round(time.Millisecond), (claimed + took).Round(time.Millisecond), out)
	start = time.Now()
	l.mustCtl("delete", "blockaffinities", "node-b/10.67.0.64/26")
	l.mustCtl("delete", "blocks", "10.67.0.64/26")
	released := time.Since(start)
	took, out, ok = l.routerHas(10*time.Second, nil, []string{"10.67.0.64/26"})
	l.check(ok, "released, it is withdrawn from the router %v after (%v with the release): %s", took.Round(time.Millisecond), (released + took).Round(time.Millisecond), out)

	l.step("a service address every node announces: the router's ECMP route")
	if err := l.apply("web-bgp", bgpService); err != nil {
		return err
	}
	_, out, ok = l.routerHas(10*time.Second, []string{"192.168.50.7", "nexthop via 192.168.10.11", "nexthop via 192.168.10.12", "nexthop via 192.168.20.13"}, nil)
	l.check(ok, "the router routes 192.168.50.7 over all three nodes (one multipath route): %s", out)
	probe{from: nsExt, send: "tcp-check", to: "192.168.50.7:80", retry: 10 * time.Second,
		name: "an outside client reaches the service's external address 192.168.50.7 through the router's ECMP route"}.play(l)

	l.step("sluiced on node-c killed (SIGKILL) under a stream through the router: nothing withdrawn")
	return l.rackKill()
}

// rackKill kills node-c's sluiced outright under a stream from outside to rt-c: the router
// keeps the route (graceful restart, no Cease), the stream never stops, and the agent started
// again takes the session back.
func (l *lab) rackKill() error {
	if p, err := l.start("sl-wl-rt-c", "echo rt-c", false, l.tool(), "tcp-serve", "10.67.0.129:8080"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("echo in rt-c: %v", err)
	}
	stream, err := l.start(nsExt, "stream to rt-c", false, l.tool(), "stream", "10.67.0.129:8080")
	if err != nil {
		return err
	}
	l.check(stream.waitFor(5*time.Second, "READY"), "a TCP stream sl-ext -> rt-c (through the router) is running")
	l.sleep(500 * time.Millisecond)
	agent := l.agents["node-c"]
	err = agent.cmd.Process.Signal(syscall.SIGKILL)
	<-agent.done
	l.check(err == nil && agent.err != nil && strings.Contains(agent.err.Error(), "killed"), "sluiced on node-c killed outright (SIGKILL): %v", agent.err)
	l.sleep(3 * time.Second)
	_, out, ok := l.routerHas(time.Second, []string{"10.67.0.128/26 via 192.168.20.13"}, nil)
	l.check(ok, "3 s later the router still routes node-c's block (graceful restart: no Cease was sent): %s", out)
	restarted, err := l.startAgent("node-c")
	if err != nil {
		return err
	}
	l.check(restarted.waitFor(30*time.Second, "BGP session up"), "the new sluiced on node-c has its session back")
	l.check(restarted.waitFor(30*time.Second, "BGP in sync"), "and is in sync with the router (End-of-RIB): %q", restarted.matching("BGP in sync"))
	_, out, ok = l.routerHas(5*time.Second, []string{"10.67.0.128/26 via 192.168.20.13"}, nil)
	l.check(ok, "the router routes node-c's block all along: %s", out)
	l.check(stream.finish(), "the stream never broke: %s", stream.transcript())
	return nil
}
