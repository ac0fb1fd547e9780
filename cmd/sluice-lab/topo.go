package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// The lab's topology, all in network namespaces named "sl-*":
//
//	sl-router   bridges br-a 192.168.10.1/24, fd00:10::1/64 and br-b 192.168.20.1/24,
//	            fd00:20::1/64, and ext0 192.168.40.1/24, fd00:40::1/64 (sl-ext's network);
//	            serves etcd on 192.168.10.1:2379; default routes via the LAN gateway
//	sl-gw       the LAN gateway, 192.168.10.254 and fd00:10::fe: every node's default
//	            routes lead here; it routes 192.168.20.0/24 and fd00:20::/64 through the
//	            router, and no pool
//	sl-client   a host outside the cluster, 192.168.10.100 and fd00:10::100, routing
//	            10.65.0.0/16 to node-a
//	sl-ext      a client on another network behind the router, 192.168.40.100, fd00:40::100
//	sl-gw2      a gateway leading nowhere, 192.168.30.254 and fd00:30::fe, on node-a's second
//	            NIC eth1 (192.168.30.11, fd00:30::11): seed 000's multi-homed node
//	sl-node-a   192.168.10.11/24 and fd00:10::11/64 (subnet A), sl-node-b 192.168.10.12/24
//	            and fd00:10::12/64, sl-node-c 192.168.20.13/24 and fd00:20::13/64 (subnet B);
//	            the subnets reach each other through the router
//	sl-wl-*     one namespace per workload, joined to its node by a veth pair named as its
//	            endpoint says, addressed /32 (and the web workloads /128) with link-local
//	            default gateways (Calico's way: 169.254.1.1, and the host side's IPv6
//	            link-local address from its MAC ee:ee:ee:ee:ee:ee)
const (
	nsRouter  = "sl-router"
	nsGateway = "sl-gw"
	nsClient  = "sl-client"
	// nsExt is a client on another network behind the router (192.168.40.100), and nsGw2 a
	// second gateway on a network of node-a's second NIC (seed 000's multi-homed node).
	nsExt      = "sl-ext"
	nsGw2      = "sl-gw2"
	etcdListen = "192.168.10.1:2379"
	// gateway6 is the LAN gateway's IPv6 address, ext6 sl-ext's.
	gateway6 = "fd00:10::fe"
	ext6     = "fd00:40::100"
)

type labNode struct {
	name, ns, addr, gw, lan string
	// addr6 is the node's IPv6 address; other6 the other subnet's IPv6 prefix and via6 the
	// router's address towards it.
	addr6, other6, via6 string
}

var labNodes = []labNode{
	{"node-a", "sl-node-a", "192.168.10.11/24", "192.168.10.254", "br-a", "fd00:10::11/64", "fd00:20::/64", "fd00:10::1"},
	{"node-b", "sl-node-b", "192.168.10.12/24", "192.168.10.254", "br-a", "fd00:10::12/64", "fd00:20::/64", "fd00:10::1"},
	{"node-c", "sl-node-c", "192.168.20.13/24", "192.168.20.1", "br-b", "fd00:20::13/64", "fd00:10::/64", "fd00:20::1"},
}

type labWorkload struct {
	name, node, iface, addr string
	addr6                   string // "" for IPv4 only
}

// labWorkloads match testdata/sample/03-workloads.yaml.
var labWorkloads = []labWorkload{
	{"web-a", "node-a", "cali-web-a", "10.65.0.1", "fd00:65::1"},
	{"web-b", "node-b", "cali-web-b", "10.65.0.65", "fd00:65::41"},
	{"web-c", "node-c", "cali-web-c", "10.65.0.129", "fd00:65::81"},
	{"db-a", "node-a", "cali-db-a", "10.66.0.1", ""},
	{"db-b", "node-b", "cali-db-b", "10.66.0.65", ""},
}

// hostSideMAC is the MAC of a workload interface's host side, as Calico sets it; the
// workload's IPv6 default gateway is the link-local address made from it.
const (
	hostSideMAC = "ee:ee:ee:ee:ee:ee"
	hostSideLL  = "fe80::ecee:eeff:feee:eeee"
)

func nodeNS(node string) string { return "sl-" + node }
func wlNS(w labWorkload) string { return "sl-wl-" + w.name }

// allNamespaces lists every namespace the lab makes.
func allNamespaces() []string {
	out := []string{nsRouter, nsGateway, nsClient, nsExt, nsGw2}
	for _, n := range labNodes {
		out = append(out, n.ns)
	}
	for _, w := range labWorkloads {
		out = append(out, wlNS(w))
	}
	return append(out, nsVM+"-node-b", nsVM+"-node-c")
}

// nsVM is the lab's OpenStack VM (floating IPs), live-migrated from node-b to node-c: one
// namespace per node it runs on.
const nsVM = "sl-wl-vm1"

// sh runs a command, returning its combined output and an error that includes it. The
// lab's context does not stop it: its commands are quick, and teardown's are among them.
func sh(args ...string) (string, error) {
	return output(exec.Command(args[0], args[1:]...))
}

// output runs cmd, returning its combined output and an error that includes it.
func output(cmd *exec.Cmd) (string, error) {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// command is a command of the run that the lab's context stops: killed when it is done,
// never started after.
func (l *lab) command(name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(l.ctx, name, args...)
	cmd.WaitDelay = time.Second
	return cmd
}

// nsRun runs a command inside a namespace (a tool's run can take seconds: the lab's context
// stops it).
func (l *lab) nsRun(ns string, args ...string) (string, error) {
	return output(l.command("ip", append([]string{"netns", "exec", ns}, args...)...))
}

// script runs `ip` commands in order, stopping at the first failure; it ends the run (see
// end) before the next command once the lab's context is done.
func (l *lab) script(cmds ...[]string) error {
	for _, c := range cmds {
		l.halt()
		if _, err := sh(c...); err != nil {
			return err
		}
	}
	return nil
}

// teardown removes every lab namespace that exists (and with them their links).
func teardown() {
	existing, _ := sh("ip", "netns", "list")
	for _, ns := range allNamespaces() {
		for _, line := range strings.Split(existing, "\n") {
			if strings.HasPrefix(line, ns+" ") || line == ns {
				_, _ = sh("ip", "netns", "del", ns)
			}
		}
	}
}

func (l *lab) buildTopology() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the lab builds network namespaces: run it as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("the lab needs iproute2's ip command: %w", err)
	}
	teardown() // a previous run that died leaves its namespaces behind
	for _, ns := range []string{nsRouter, nsGateway, nsClient, nsExt, nsGw2} {
		if err := l.script([]string{"ip", "netns", "add", ns}, []string{"ip", "-n", ns, "link", "set", "lo", "up"}); err != nil {
			return err
		}
	}
	for _, n := range labNodes {
		if err := l.script([]string{"ip", "netns", "add", n.ns}, []string{"ip", "-n", n.ns, "link", "set", "lo", "up"}); err != nil {
			return err
		}
	}
	err := l.script(
		[]string{"ip", "-n", nsRouter, "link", "add", "br-a", "type", "bridge"},
		[]string{"ip", "-n", nsRouter, "link", "add", "br-b", "type", "bridge"},
		[]string{"ip", "-n", nsRouter, "addr", "add", "192.168.10.1/24", "dev", "br-a"},
		[]string{"ip", "-n", nsRouter, "addr", "add", "192.168.20.1/24", "dev", "br-b"},
		[]string{"ip", "-n", nsRouter, "addr", "add", "fd00:10::1/64", "dev", "br-a", "nodad"},
		[]string{"ip", "-n", nsRouter, "addr", "add", "fd00:20::1/64", "dev", "br-b", "nodad"},
		[]string{"ip", "netns", "exec", nsRouter, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
		[]string{"ip", "-n", nsRouter, "link", "set", "br-a", "up"},
		[]string{"ip", "-n", nsRouter, "link", "set", "br-b", "up"},
		[]string{"ip", "netns", "exec", nsRouter, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	)
	if err != nil {
		return err
	}
	// Attach a namespace's eth0 to a bridge in the router.
	attach := func(ns, peer, bridge, addr string) error {
		return l.script(
			[]string{"ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", nsRouter},
			[]string{"ip", "-n", nsRouter, "link", "set", peer, "master", bridge, "up"},
			[]string{"ip", "-n", ns, "addr", "add", addr, "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
		)
	}
	if err := attach(nsGateway, "a-gw", "br-a", "192.168.10.254/24"); err != nil {
		return err
	}
	// The gateway knows the site's other subnet, behind the router (node-c's, whose
	// masqueraded traffic it answers); not the pools.
	if err := l.script(
		[]string{"ip", "-n", nsGateway, "route", "add", "192.168.20.0/24", "via", "192.168.10.1"},
		[]string{"ip", "-n", nsGateway, "addr", "add", gateway6 + "/64", "dev", "eth0", "nodad"},
		[]string{"ip", "-n", nsGateway, "-6", "route", "add", "fd00:20::/64", "via", "fd00:10::1"},
	); err != nil {
		return err
	}
	if err := attach(nsClient, "a-client", "br-a", "192.168.10.100/24"); err != nil {
		return err
	}
	if _, err := sh("ip", "-n", nsClient, "addr", "add", "fd00:10::100/64", "dev", "eth0", "nodad"); err != nil {
		return err
	}
	for _, n := range labNodes {
		var err error
		switch up, peer := l.uplink(n.name), n.lan[3:]+"-"+n.name; up {
		case "bond0":
			// Two links to the LAN bridge, bonded (active-backup: eth0 active, eth2 its
			// backup); the bond carries the address.
			err = l.script(
				[]string{"ip", "-n", n.ns, "link", "add", "bond0", "type", "bond", "mode", "active-backup", "miimon", "100"},
				[]string{"ip", "-n", n.ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", nsRouter},
				[]string{"ip", "-n", n.ns, "link", "add", "eth2", "type", "veth", "peer", "name", peer + "2", "netns", nsRouter},
				[]string{"ip", "-n", nsRouter, "link", "set", peer, "master", n.lan, "up"},
				[]string{"ip", "-n", nsRouter, "link", "set", peer + "2", "master", n.lan, "up"},
				[]string{"ip", "-n", n.ns, "link", "set", "eth0", "master", "bond0"},
				[]string{"ip", "-n", n.ns, "link", "set", "eth2", "master", "bond0"},
				[]string{"ip", "-n", n.ns, "link", "set", "bond0", "up"},
				[]string{"ip", "-n", n.ns, "addr", "add", n.addr, "dev", "bond0"},
			)
		case "eth0.100":
			// The LAN reaches this node tagged, VLAN 100: the router's port is the VLAN's.
			err = l.script(
				[]string{"ip", "-n", n.ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", nsRouter},
				[]string{"ip", "-n", nsRouter, "link", "add", "link", peer, "name", peer + ".100", "type", "vlan", "id", "100"},
				[]string{"ip", "-n", nsRouter, "link", "set", peer, "up"},
				[]string{"ip", "-n", nsRouter, "link", "set", peer + ".100", "master", n.lan, "up"},
				[]string{"ip", "-n", n.ns, "link", "set", "eth0", "up"},
				[]string{"ip", "-n", n.ns, "link", "add", "link", "eth0", "name", "eth0.100", "type", "vlan", "id", "100"},
				[]string{"ip", "-n", n.ns, "addr", "add", n.addr, "dev", "eth0.100"},
				[]string{"ip", "-n", n.ns, "link", "set", "eth0.100", "up"},
			)
		default:
			err = attach(n.ns, peer, n.lan, n.addr)
		}
		if err != nil {
			return err
		}
		if _, err := sh("ip", "-n", n.ns, "route", "add", "default", "via", n.gw); err != nil {
			return err
		}
		gw6 := gateway6 // node-c's gateway is the router, which leads there
		if n.lan == "br-b" {
			gw6 = n.via6
		}
		if err := l.script(
			[]string{"ip", "-n", n.ns, "addr", "add", n.addr6, "dev", l.uplink(n.name), "nodad"},
			[]string{"ip", "-n", n.ns, "-6", "route", "add", n.other6, "via", n.via6},
			[]string{"ip", "-n", n.ns, "-6", "route", "add", "default", "via", gw6},
		); err != nil {
			return err
		}
		if n.lan == "br-a" { // the other subnet is through the router, not the gateway
			if _, err := sh("ip", "-n", n.ns, "route", "add", "192.168.20.0/24", "via", "192.168.10.1"); err != nil {
				return err
			}
		}
	}
	if err := l.script(
		[]string{"ip", "-n", nsExt, "link", "add", "eth0", "type", "veth", "peer", "name", "ext0", "netns", nsRouter},
		[]string{"ip", "-n", nsRouter, "addr", "add", "192.168.40.1/24", "dev", "ext0"},
		[]string{"ip", "-n", nsRouter, "link", "set", "ext0", "up"},
		[]string{"ip", "-n", nsExt, "addr", "add", "192.168.40.100/24", "dev", "eth0"},
		[]string{"ip", "-n", nsExt, "link", "set", "eth0", "up"},
		[]string{"ip", "-n", nsExt, "route", "add", "default", "via", "192.168.40.1"},
		[]string{"ip", "-n", nsRouter, "addr", "add", "fd00:40::1/64", "dev", "ext0", "nodad"},
		[]string{"ip", "-n", nsExt, "addr", "add", ext6 + "/64", "dev", "eth0", "nodad"},
		[]string{"ip", "-n", nsExt, "-6", "route", "add", "default", "via", "fd00:40::1"},
		// node-a's second NIC, on a network of its own with a gateway that leads nowhere:
		// replies routed by the default route through it would never reach a client.
		[]string{"ip", "-n", nsGw2, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1", "netns", nodeNS("node-a")},
		[]string{"ip", "-n", nsGw2, "addr", "add", "192.168.30.254/24", "dev", "eth0"},
		[]string{"ip", "-n", nsGw2, "link", "set", "eth0", "up"},
		[]string{"ip", "-n", nodeNS("node-a"), "addr", "add", "192.168.30.11/24", "dev", "eth1"},
		[]string{"ip", "-n", nsGw2, "addr", "add", "fd00:30::fe/64", "dev", "eth0", "nodad"},
		[]string{"ip", "-n", nodeNS("node-a"), "addr", "add", "fd00:30::11/64", "dev", "eth1", "nodad"},
		[]string{"ip", "-n", nodeNS("node-a"), "link", "set", "eth1", "up"},
	); err != nil {
		return err
	}
	if err := l.script(
		[]string{"ip", "-n", nsRouter, "route", "add", "default", "via", "192.168.10.254"},
		[]string{"ip", "-n", nsRouter, "-6", "route", "add", "default", "via", gateway6},
		[]string{"ip", "-n", nsClient, "route", "add", "10.65.0.0/16", "via", "192.168.10.11"},
	); err != nil {
		return err
	}
	for _, w := range labWorkloads {
		node := nodeNS(w.node)
		ns := wlNS(w)
		if err := l.script(
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", node, "link", "add", w.iface, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", node, "link", "set", w.iface, "up"},
			[]string{"ip", "-n", ns, "addr", "add", w.addr + "/32", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", ns, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"},
			[]string{"ip", "-n", ns, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0"},
		); err != nil {
			return err
		}
		if w.addr6 == "" {
			continue
		}
		// IPv6: the host side answers as the workload's router from a link-local address
		// known in advance, at once (no duplicate address detection).
		if err := l.script(
			[]string{"ip", "-n", node, "link", "set", w.iface, "down"},
			[]string{"ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv6.conf." + w.iface + ".accept_dad=0"},
			[]string{"ip", "-n", node, "link", "set", w.iface, "address", hostSideMAC},
			[]string{"ip", "-n", node, "link", "set", w.iface, "up"},
			[]string{"ip", "-n", ns, "addr", "add", w.addr6 + "/128", "dev", "eth0", "nodad"},
			[]string{"ip", "-n", ns, "-6", "route", "add", "default", "via", hostSideLL, "dev", "eth0"},
		); err != nil {
			return err
		}
	}
	return nil
}
