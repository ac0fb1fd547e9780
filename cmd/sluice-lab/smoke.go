package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/sluice-net/sluice/bpf"
	"github.com/vishvananda/netlink"
)

// toolSmoke runs the smoke scenario (`sluice-lab smoke [--testdata DIR]`, as root): the lab,
// then the few checks that say sluice works on this kernel at all. It is what the kernel
// matrix (cmd/sluice-vmtest) runs inside each guest, and it passes on the host as well.
func toolSmoke(args []string) error {
	fs := flag.NewFlagSet("sluice-lab smoke", flag.ExitOnError)
	testdata := fs.String("testdata", "testdata/sample", "directory of the sample cluster's manifests")
	uplinks := fs.String("uplinks", "eth", "the nodes' uplinks: eth (one veth each), or bond-vlan (node-a a bond of two, node-b a VLAN sub-interface; needs the bonding and 8021q modules)")
	_ = fs.Parse(args)
	if *uplinks != "eth" && *uplinks != "bond-vlan" {
		return fmt.Errorf("--uplinks: want eth or bond-vlan, got %q", *uplinks)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	l := &lab{bin: filepath.Dir(exe), testdata: *testdata, out: os.Stdout, agents: map[string]*proc{}, bondVLAN: *uplinks == "bond-vlan"}
	ctx, stop := signalContext()
	defer stop()
	start := time.Now()
	err = l.smoke(ctx)
	fmt.Fprintf(l.out, "\n%d checks, %d failed (%v)\n", l.checks, l.failures, time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		return err
	}
	if l.failures > 0 {
		return fmt.Errorf("%d of %d checks failed", l.failures, l.checks)
	}
	return nil
}

// smoke builds the lab (every node in sync with its sluiced), then checks, one PASS/FAIL line
// each: pod traffic between node-a and node-b (ping and TCP through VXLAN); a node port to a
// local endpoint (node-b's) and to a remote one (node-a's, forwarded to node-b), the endpoint
// seeing the outside client's own address; sluiced restarted on the ingress node (node-a)
// under a TCP stream through its node port, which survives. Everything it made is torn down.
func (l *lab) smoke(ctx context.Context) (err error) {
	l.ctx = ctx
	defer l.end(&err)
	if err := l.setup(); err != nil {
		return err
	}
	if l.failures > 0 {
		// Without etcd's data or an agent in sync every check below would only time out.
		return fmt.Errorf("the lab is not up (%d of %d setup checks failed): the traffic checks were not run", l.failures, l.checks)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	l.step("pod traffic between node-a and node-b through VXLAN")
	for _, w := range []string{"web-a", "web-b"} {
		wl := l.workload(w)
		p, err := l.start(wlNS(wl), "tcp "+w, false, l.tool(), "tcp-serve", wl.addr+":8080")
		if err != nil {
			return err
		}
		if !p.waitFor(10*time.Second, "READY") {
			return fmt.Errorf("the echo server on %s did not start: %s", w, p.transcript())
		}
	}
	for _, p := range [][2]string{{"web-a", "web-b"}, {"web-b", "web-a"}} {
		_, err := l.retry(10*time.Second, func() error { return l.ping(p[0], p[1]) })
		l.check(err == nil, "ping %s -> %s through VXLAN%s", p[0], p[1], errSuffix(err))
		_, err = l.retry(5*time.Second, func() error { return l.tcp(p[0], p[1], false) })
		l.check(err == nil, "TCP %s -> %s through VXLAN%s", p[0], p[1], errSuffix(err))
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	l.step("node ports from a client outside the cluster (192.168.40.100); the only endpoint is web-b on node-b")
	webB := wlNS(l.workload("web-b"))
	echo, err := l.start(webB, "echo web-b:8081", false, l.tool(), "tcp-serve", "10.65.0.65:8081")
	if err != nil {
		return err
	}
	who, err := l.start(webB, "whoami web-b", false, l.tool(), "tcp-whoami", "10.65.0.65:8082")
	if err != nil {
		return err
	}
	if !echo.waitFor(10*time.Second, "READY") || !who.waitFor(10*time.Second, "READY") {
		return fmt.Errorf("the servers on web-b did not start: %s; %s", echo.transcript(), who.transcript())
	}
	if err := l.apply("seed-services.yaml", seedServices); err != nil {
		return err
	}
	// The agents load their programs while the routes go on (the service stage starts apart):
	// under emulation that takes tens of seconds, three agents at once.
	// One deadline for both, so that a stage that never starts costs the guest 3 min, not 6.
	start := time.Now()
	deadline := start.Add(3 * time.Minute)
	for _, n := range []string{"node-a", "node-b"} {
		if l.agents[n].waitFor(time.Until(deadline), "service maps updated") {
			fmt.Fprintf(l.out, "sluiced on %s has programmed its service maps (waited %v)\n", n, time.Since(start).Round(100*time.Millisecond))
		} else {
			fmt.Fprintf(l.out, "sluiced on %s has not programmed its service maps after %v\n", n, time.Since(start).Round(100*time.Millisecond))
		}
	}
	for _, c := range []struct{ node, where string }{{"node-b", "local"}, {"node-a", "remote"}} {
		addr := nodeIPs[c.node] + ":30092"
		// Until the node's service stage has the service, the port refuses.
		_, _ = l.retry(20*time.Second, func() error {
			_, err := l.nsRun(nsExt, l.tool(), "tcp-ask", addr, "1")
			return err
		})
		out, err := l.nsRun(nsExt, l.tool(), "tcp-ask", addr, "20")
		l.check(err == nil && strings.Contains(out, "answer 192.168.40.100 20"),
			"20 of 20 connections to %s's node port %s reach the %s endpoint (web-b), which sees the client's own address: %s", c.node, addr, c.where, oneLine(out))
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	if l.bondVLAN {
		if err := l.uplinkChecks(); err != nil {
			return err
		}
	}

	l.step("sluiced restarted on the ingress node (node-a) while a TCP stream crosses its node port to web-b")
	stream, err := l.start(nsExt, "stream", false, l.tool(), "stream", nodeIPs["node-a"]+":30090")
	if err != nil {
		return err
	}
	if !l.check(stream.waitFor(10*time.Second, "READY"), "a TCP stream from the client through node-a's node port 30090 to web-b is running") {
		fmt.Fprintf(l.out, "the stream: %s\n", stream.transcript())
		return nil
	}
	l.sleep(500 * time.Millisecond)
	l.check(l.agents["node-a"].stop() == nil, "sluiced on node-a stops on SIGTERM, leaving programs and maps pinned")
	l.sleep(time.Second)
	restarted, err := l.startAgent("node-a")
	if err != nil {
		return err
	}
	l.check(restarted.waitFor(30*time.Second, "dataplane updated"), "the new sluiced on node-a is in sync and has applied")
	l.sleep(time.Second)
	l.check(stream.finish(), "the stream through node-a's node port never broke across the restart: %s", stream.transcript())
	out, err := l.nsRun(nsExt, l.tool(), "tcp-ask", nodeIPs["node-a"]+":30092", "5")
	l.check(err == nil && strings.Contains(out, "answer 192.168.40.100 5"), "node-a's node port still answers after the restart, the client's address kept: %s", oneLine(out))
	return nil
}

// errSuffix is ": err" for a failed check's line, "" for a passed one.
func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + oneLine(err.Error())
}

// uplinkChecks: the programs sit on node-a's bond and node-b's VLAN device, not on the bond's
// slaves; node-a's node port keeps working when the bond fails over to its other slave
// (replies go to the bond, which sends them by the link alive).
func (l *lab) uplinkChecks() error {
	l.step("bare-metal uplinks: node-a's bond (active-backup) and node-b's VLAN 100")
	hooks := func(node string) string {
		out, err := l.nsRun(nodeNS(node), l.tool(), "hooks")
		if err != nil {
			return "error: " + oneLine(out)
		}
		return oneLine(out)
	}
	a, b := hooks("node-a"), hooks("node-b")
	l.check(strings.Contains(a, "bond0 ingress 1 egress 1") && !strings.Contains(a, "eth0 ") && !strings.Contains(a, "eth2 "),
		"node-a's programs are on bond0, none on its slaves eth0 and eth2: %s", a)
	l.check(strings.Contains(b, "eth0.100 ingress 1 egress 1"), "node-b's programs are on eth0.100: %s", b)
	bond := func() string {
		b, _ := l.nsRun(nodeNS("node-a"), l.tool(), "bond-state", "bond0")
		return oneLine(b)
	}
	addr := nodeIPs["node-a"] + ":30092"
	for _, c := range []struct{ state, what string }{{"down", "failed over to eth2"}, {"up", "with eth0 back"}} {
		if _, err := sh("ip", "-n", nodeNS("node-a"), "link", "set", "eth0", c.state); err != nil {
			return err
		}
		// From the change, how long node-a's own address took to answer a client on its LAN
		// again (its kernel answers: nothing of sluice's on the way) and its node port the
		// client outside.
		start := time.Now()
		_, _ = l.retry(15*time.Second, func() error {
			_, err := l.nsRun(nsClient, l.tool(), "ping", nodeIPs["node-a"])
			return err
		})
		pinged := time.Since(start)
		_, _ = l.retry(15*time.Second, func() error {
			_, err := l.nsRun(nsExt, l.tool(), "tcp-ask", addr, "1")
			return err
		})
		took := time.Since(start)
		if c.state == "up" {
			// The LAN flaps for a few seconds after a link comes back (the router's bridge
			// learning node-a's MAC on the returning port, then on the active one again): seen
			// right after the first answers. The 20 connections wait until node-a has answered
			// pings for 3 s running.
			steady := time.Now()
			for deadline := time.Now().Add(20 * time.Second); time.Since(steady) < 3*time.Second && time.Now().Before(deadline); {
				if _, err := l.nsRun(nsClient, l.tool(), "ping", nodeIPs["node-a"]); err != nil {
					steady = time.Now()
				}
				if !l.sleep(250 * time.Millisecond) {
					break
				}
			}
		}
		out, err := l.nsRun(nsExt, l.tool(), "tcp-ask", addr, "20")
		l.check(err == nil && strings.Contains(out, "answer 192.168.40.100 20"),
			"node-a's bond %s: node-a answered a ping from its LAN after %v and its node port after %v, then 20 of 20 connections reach web-b on node-b (VLAN), which sees the client's own address: %s; bond: %s",
			c.what, pinged.Round(10*time.Millisecond), took.Round(10*time.Millisecond), oneLine(out), bond())
	}
	return nil
}

// toolHooks lists the interfaces of the current namespace that run sluice's programs (named
// sl_*), as TCX links or classic tc filters: "IFACE ingress N egress M" each.
func toolHooks(args []string) error {
	if len(args) != 0 {
		return errors.New("usage: hooks")
	}
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	var lines []string
	for _, l := range links {
		var n [2]int
		for i, egress := range []bool{false, true} {
			names, err := bpf.ProgramsOn(l.Attrs().Index, egress)
			if err != nil {
				return fmt.Errorf("%s: %w", l.Attrs().Name, err)
			}
			for _, name := range names {
				if strings.HasPrefix(name, bpf.ProgramPrefix) {
					n[i]++
				}
			}
		}
		if n[0]+n[1] > 0 {
			lines = append(lines, fmt.Sprintf("%s ingress %d egress %d", l.Attrs().Name, n[0], n[1]))
		}
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	return nil
}

// toolBondState prints a bond's active slave and each slave's link state, from
// /proc/net/bonding (of the current namespace).
func toolBondState(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: bond-state BOND")
	}
	b, err := os.ReadFile(filepath.Join("/proc/net/bonding", args[0]))
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Currently Active Slave") || strings.HasPrefix(line, "Slave Interface") || strings.HasPrefix(line, "MII Status") {
			fmt.Println(line)
		}
	}
	return nil
}
