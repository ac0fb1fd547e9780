package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
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

	if err := l.rackECMP(); err != nil {
		return err
	}

	l.step("sluiced on node-c killed (SIGKILL) under a stream through the router: nothing withdrawn")
	return l.rackKill()
}

// The second router of rack a: the LAN gateway (sl-gw) speaks BGP too, for rackECMP.
const rackSecondRouter = `apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata: {name: rack-a-gw}
spec: {nodeSelector: rack == 'a', peerIP: 192.168.10.254, asNumber: 65010}
`

// rackECMP: a prefix both of rack a's routers announce (the router, and the LAN gateway as a
// second router) is one multipath route on node-a, through a nexthop group; connections from
// rt-a cross both routers; one router withdrawing it leaves the other's path, and traffic goes
// on.
func (l *lab) rackECMP() error {
	l.step("a prefix from two routers: one multipath route on node-a (a nexthop group), one path withdrawn")
	if err := l.script(
		[]string{"ip", "-n", nsExt, "addr", "add", "198.18.0.100/32", "dev", "lo"},
		[]string{"ip", "-n", nsRouter, "route", "add", "198.18.0.0/24", "via", "192.168.40.100"},
		[]string{"ip", "-n", nsGateway, "route", "add", "198.18.0.0/24", "via", "192.168.10.1"},
		[]string{"ip", "netns", "exec", nsGateway, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		// node-a spreads connections over the paths by their ports, not only their addresses.
		[]string{"ip", "netns", "exec", "sl-node-a", "sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1"},
	); err != nil {
		return err
	}
	if p, err := l.start(nsExt, "whoami 198.18.0.100", false, l.tool(), "tcp-whoami", "198.18.0.100:8094"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("whoami on 198.18.0.100: %v", err)
	}
	gw, err := l.start(nsGateway, "tor2", false, l.tool(), "tor", "--as", "65010", "--router-id", "192.168.10.254",
		"--peer", "192.168.10.11:64601", "--peer", "192.168.10.12:64602")
	if err != nil || !gw.waitFor(10*time.Second, "READY") {
		return fmt.Errorf("the second router did not start: %v", err)
	}
	if err := l.apply("rack-a-gw", rackSecondRouter); err != nil {
		return err
	}
	l.check(gw.waitFor(30*time.Second, "UP 192.168.10.11"), "node-a peers with rack a's second router (BGPPeer rack-a-gw): %s", oneLine(strings.Join(gw.matching("UP"), " ")))
	for _, r := range []*proc{l.tor, gw} {
		if _, err := io.WriteString(r.stdin, "announce 198.18.0.0/24\n"); err != nil {
			return err
		}
		l.check(r.waitFor(5*time.Second, "ANNOUNCED 198.18.0.0/24"), "a router announces 198.18.0.0/24")
	}
	// routeOnA waits for node-a's route to 198.18.0.0/24 to have paths paths (1: a plain
	// route) and to say each of want.
	routeOnA := func(paths int, want ...string) (time.Duration, string, bool) {
		var out string
		took, err := l.retry(10*time.Second, func() error {
			var err error
			if out, err = l.nsRun("sl-node-a", "ip", "route", "show", "198.18.0.0/24"); err != nil {
				return err
			}
			if n := max(1, strings.Count(out, "nexthop via")); n != paths {
				return fmt.Errorf("%d paths, not %d", n, paths)
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					return fmt.Errorf("no %q", w)
				}
			}
			return nil
		})
		return took, oneLine(out), err == nil
	}
	_, out, ok := routeOnA(2, "nexthop via 192.168.10.1 ", "nexthop via 192.168.10.254 ", "proto 83")
	l.check(ok, "node-a routes 198.18.0.0/24 over both routers, one multipath route with sluice's protocol: %s", out)
	objects, _ := l.nsRun("sl-node-a", "ip", "nexthop", "show")
	var groups []string
	for line := range strings.SplitSeq(objects, "\n") {
		if strings.Contains(line, " group ") {
			groups = append(groups, strings.TrimSpace(line))
		}
	}
	l.check(len(groups) == 1 && strings.Contains(out, strings.Fields(groups[0])[1]), "through a nexthop group over the two gateways' objects: %s", strings.Join(groups, "; "))
	out, err = l.diff("node-a", "SLUICE_BGP=true")
	l.check(err == nil && strings.Contains(out, "matches"), "sluicectl diff on node-a (with what its speaker learned): the kernel, multipath route and group included, matches: %s", oneLine(out))
	forwarded := func() int {
		out, _ := l.nsRun(nsGateway, "cat", "/proc/net/snmp")
		return snmpIP(out, "ForwDatagrams")
	}
	before := forwarded()
	probe{from: "sl-wl-rt-a", send: "tcp-ask 20", to: "198.18.0.100:8094", seenAs: "10.67.0.1", retry: 10 * time.Second,
		name: "rt-a reaches 198.18.0.100 over the multipath route, keeping its address, 20 connections: %s"}.play(l)
	n := forwarded() - before
	l.check(n > 0, "some of them crossed the second router: it forwarded %d packets", n)

	if _, err := io.WriteString(gw.stdin, "withdraw 198.18.0.0/24\n"); err != nil {
		return err
	}
	took, out, ok := routeOnA(1, "via 192.168.10.1 dev eth0")
	l.check(ok && !strings.Contains(out, "192.168.10.254"), "the second router withdraws it: node-a's route is the first router's path alone %v after: %s", took.Round(time.Millisecond), out)
	probe{from: "sl-wl-rt-a", send: "tcp-ask 5", to: "198.18.0.100:8094", seenAs: "10.67.0.1", retry: 10 * time.Second,
		name: "rt-a still reaches 198.18.0.100, through the first router: %s"}.play(l)
	// The second router goes: its peer first (removed at once, not kept under graceful
	// restart), then the router.
	l.mustCtl("delete", "bgppeers", "rack-a-gw")
	if _, err := io.WriteString(l.tor.stdin, "withdraw 198.18.0.0/24\n"); err != nil {
		return err
	}
	return gw.stop()
}

// snmpIP reads an Ip: counter of /proc/net/snmp (-1: none).
func snmpIP(snmp, counter string) int {
	var names []string
	for line := range strings.SplitSeq(snmp, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Ip:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == counter && i < len(f) {
				n, _ := strconv.Atoi(f[i])
				return n
			}
		}
	}
	return -1
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
