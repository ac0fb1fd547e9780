package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
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

// labNode is a node: its namespace, the router's bridge its uplink is a port of, and the
// addresses its uplink carries (their routes are in labRoutes).
type labNode struct {
	name, ns, lan string
	addr, addr6   string
}

var labNodes = []labNode{
	{name: "node-a", ns: "sl-node-a", lan: "br-a", addr: "192.168.10.11/24", addr6: "fd00:10::11/64"},
	{name: "node-b", ns: "sl-node-b", lan: "br-a", addr: "192.168.10.12/24", addr6: "fd00:10::12/64"},
	{name: "node-c", ns: "sl-node-c", lan: "br-b", addr: "192.168.20.13/24", addr6: "fd00:20::13/64"},
}

// labHosts are the underlay's namespaces that are no node.
var labHosts = []string{nsRouter, nsGateway, nsClient, nsExt, nsGw2}

// routerLANs are the router's bridges, one per subnet, with its addresses on them.
var routerLANs = []struct{ bridge, addr, addr6 string }{
	{"br-a", "192.168.10.1/24", "fd00:10::1/64"}, // subnet A: node-a, node-b, the gateway, the client
	{"br-b", "192.168.20.1/24", "fd00:20::1/64"}, // subnet B: node-c
}

// labSysctls are set in a namespace: the router forwards.
var labSysctls = []struct{ at, setting string }{
	{nsRouter, "net.ipv6.conf.all.forwarding=1"},
	{nsRouter, "net.ipv4.ip_forward=1"},
}

// labCable is a veth pair: dev at a namespace (nsOf), and its peer at another, a port of
// the router's bridge when one is named; each end has its addresses.
type labCable struct {
	at, dev      string
	addrs        []string
	peerAt, peer string
	bridge       string
	peerAddrs    []string
}

// labCables join the hosts to the router, and node-a's second NIC to a gateway; the nodes'
// uplinks are the node's own (nodeUplink).
var labCables = []labCable{
	{at: nsGateway, dev: "eth0", addrs: []string{"192.168.10.254/24", gateway6 + "/64"}, peerAt: nsRouter, peer: "a-gw", bridge: "br-a"},
	{at: nsClient, dev: "eth0", addrs: []string{"192.168.10.100/24", "fd00:10::100/64"}, peerAt: nsRouter, peer: "a-client", bridge: "br-a"},
	{at: nsExt, dev: "eth0", addrs: []string{"192.168.40.100/24", ext6 + "/64"}, peerAt: nsRouter, peer: "ext0", peerAddrs: []string{"192.168.40.1/24", "fd00:40::1/64"}},
	// node-a's second NIC, on a network of its own with a gateway that leads nowhere:
	// replies routed by the default route through it would never reach a client.
	{at: nsGw2, dev: "eth0", addrs: []string{"192.168.30.254/24", "fd00:30::fe/64"}, peerAt: "node-a", peer: "eth1", peerAddrs: []string{"192.168.30.11/24", "fd00:30::11/64"}},
}

// labRoute is a static route at a namespace (nsOf): dst by way of via, IPv6 when via is.
type labRoute struct{ at, dst, via string }

// labRoutes are every static route of the underlay.
var labRoutes = []labRoute{
	// The gateway knows the site's other subnet, behind the router (node-c's, whose
	// masqueraded traffic it answers); not the pools.
	{nsGateway, "192.168.20.0/24", "192.168.10.1"},
	{nsGateway, "fd00:20::/64", "fd00:10::1"},
	{nsClient, "10.65.0.0/16", "192.168.10.11"},
	{nsExt, "default", "192.168.40.1"},
	{nsExt, "default", "fd00:40::1"},
	{nsRouter, "default", "192.168.10.254"},
	{nsRouter, "default", gateway6},
	// Every node's default routes lead to the LAN gateway (node-c's to the router, which
	// leads there); the other subnet is through the router, not the gateway.
	{"node-a", "default", "192.168.10.254"},
	{"node-a", "default", gateway6},
	{"node-a", "192.168.20.0/24", "192.168.10.1"},
	{"node-a", "fd00:20::/64", "fd00:10::1"},
	{"node-b", "default", "192.168.10.254"},
	{"node-b", "default", gateway6},
	{"node-b", "192.168.20.0/24", "192.168.10.1"},
	{"node-b", "fd00:20::/64", "fd00:10::1"},
	{"node-c", "default", "192.168.20.1"},
	{"node-c", "default", "fd00:20::1"},
	{"node-c", "fd00:10::/64", "fd00:20::1"},
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

// underlayNamespaces lists the hosts' and the nodes' namespaces.
func underlayNamespaces() []string {
	out := slices.Clone(labHosts)
	for _, n := range labNodes {
		out = append(out, n.ns)
	}
	return out
}

// allNamespaces lists every namespace the lab makes.
func allNamespaces() []string {
	out := underlayNamespaces()
	for _, w := range labWorkloads {
		out = append(out, wlNS(w))
	}
	for _, w := range routedWorkloads {
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

// buildTopology makes the lab's underlay from its tables (labHosts, labNodes, routerLANs,
// labSysctls, labCables, labRoutes) and plugs in labWorkloads.
func (l *lab) buildTopology() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the lab builds network namespaces: run it as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("the lab needs iproute2's ip command: %w", err)
	}
	teardown() // a previous run that died leaves its namespaces behind
	var cmds [][]string
	for _, ns := range underlayNamespaces() {
		cmds = append(cmds, []string{"ip", "netns", "add", ns}, []string{"ip", "-n", ns, "link", "set", "lo", "up"})
	}
	for _, lan := range routerLANs {
		cmds = append(cmds, []string{"ip", "-n", nsRouter, "link", "add", lan.bridge, "type", "bridge"},
			addrAdd(nsRouter, lan.bridge, lan.addr), addrAdd(nsRouter, lan.bridge, lan.addr6),
			[]string{"ip", "-n", nsRouter, "link", "set", lan.bridge, "up"})
	}
	for _, s := range labSysctls {
		cmds = append(cmds, []string{"ip", "netns", "exec", nsOf(s.at), "sysctl", "-qw", s.setting})
	}
	// The LANs' ports first, the hosts' then the nodes', then the other cables: interfaces
	// are numbered in the order they are made.
	for _, c := range labCables {
		if c.bridge != "" {
			cmds = append(cmds, c.commands()...)
		}
	}
	for _, n := range labNodes {
		cmds = append(cmds, l.nodeUplink(n)...)
	}
	for _, c := range labCables {
		if c.bridge == "" {
			cmds = append(cmds, c.commands()...)
		}
	}
	for _, r := range labRoutes {
		family := []string{}
		if strings.Contains(r.via, ":") {
			family = []string{"-6"}
		}
		cmds = append(cmds, slices.Concat([]string{"ip", "-n", nsOf(r.at)}, family, []string{"route", "add", r.dst, "via", r.via}))
	}
	for _, w := range labWorkloads {
		cmds = append(cmds, plugWorkload(wlNS(w), w.node, w.iface, w.addr, w.addr6)...)
	}
	return l.script(cmds...)
}

// addrAdd adds addr to dev at ns (an IPv6 address at once: no duplicate address detection).
func addrAdd(ns, dev, addr string) []string {
	cmd := []string{"ip", "-n", ns, "addr", "add", addr, "dev", dev}
	if strings.Contains(addr, ":") {
		cmd = append(cmd, "nodad")
	}
	return cmd
}

// commands make the cable: the pair, the peer's end (a bridge's port, or addressed), then
// dev's end.
func (c labCable) commands() [][]string {
	ns, peerNS := nsOf(c.at), nsOf(c.peerAt)
	cmds := [][]string{{"ip", "-n", ns, "link", "add", c.dev, "type", "veth", "peer", "name", c.peer, "netns", peerNS}}
	if c.bridge != "" {
		cmds = append(cmds, []string{"ip", "-n", peerNS, "link", "set", c.peer, "master", c.bridge, "up"})
	}
	for _, a := range c.peerAddrs {
		cmds = append(cmds, addrAdd(peerNS, c.peer, a))
	}
	if c.bridge == "" {
		cmds = append(cmds, []string{"ip", "-n", peerNS, "link", "set", c.peer, "up"})
	}
	for _, a := range c.addrs {
		cmds = append(cmds, addrAdd(ns, c.dev, a))
	}
	return append(cmds, []string{"ip", "-n", ns, "link", "set", c.dev, "up"})
}

// nodeUplink joins node n to its LAN, the router's bridge: by one veth (a cable), or in
// bare metal's shapes (smoke --uplinks, l.uplink): a bond, or a VLAN sub-interface.
func (l *lab) nodeUplink(n labNode) [][]string {
	peer := n.lan[3:] + "-" + n.name // a-node-a: its port on the router's bridge
	up := l.uplink(n.name)
	switch up {
	case "bond0":
		// Two links to the LAN bridge, bonded (active-backup: eth0 active, eth2 its
		// backup); the bond carries the addresses.
		return [][]string{
			{"ip", "-n", n.ns, "link", "add", "bond0", "type", "bond", "mode", "active-backup", "miimon", "100"},
			{"ip", "-n", n.ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", nsRouter},
			{"ip", "-n", n.ns, "link", "add", "eth2", "type", "veth", "peer", "name", peer + "2", "netns", nsRouter},
			{"ip", "-n", nsRouter, "link", "set", peer, "master", n.lan, "up"},
			{"ip", "-n", nsRouter, "link", "set", peer + "2", "master", n.lan, "up"},
			{"ip", "-n", n.ns, "link", "set", "eth0", "master", "bond0"},
			{"ip", "-n", n.ns, "link", "set", "eth2", "master", "bond0"},
			{"ip", "-n", n.ns, "link", "set", "bond0", "up"},
			addrAdd(n.ns, up, n.addr), addrAdd(n.ns, up, n.addr6),
		}
	case "eth0.100":
		// The LAN reaches this node tagged, VLAN 100: the router's port is the VLAN's.
		return [][]string{
			{"ip", "-n", n.ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", nsRouter},
			{"ip", "-n", nsRouter, "link", "add", "link", peer, "name", peer + ".100", "type", "vlan", "id", "100"},
			{"ip", "-n", nsRouter, "link", "set", peer, "up"},
			{"ip", "-n", nsRouter, "link", "set", peer + ".100", "master", n.lan, "up"},
			{"ip", "-n", n.ns, "link", "set", "eth0", "up"},
			{"ip", "-n", n.ns, "link", "add", "link", "eth0", "name", up, "type", "vlan", "id", "100"},
			addrAdd(n.ns, up, n.addr), addrAdd(n.ns, up, n.addr6),
			{"ip", "-n", n.ns, "link", "set", up, "up"},
		}
	}
	return labCable{at: n.name, dev: up, addrs: []string{n.addr, n.addr6}, peerAt: nsRouter, peer: peer, bridge: n.lan}.commands()
}

// plugWorkload makes a workload's namespace ns and joins it to its node by a veth pair, the
// host's end named iface, as Calico does: the workload addressed /32 (and /128) with
// link-local default gateways (169.254.1.1, and the host end's IPv6 link-local address from
// its MAC).
func plugWorkload(ns, node, iface, addr, addr6 string) [][]string {
	host := nodeNS(node)
	cmds := [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", host, "link", "add", iface, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "-n", host, "link", "set", iface, "up"},
		{"ip", "-n", ns, "addr", "add", addr + "/32", "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"},
		{"ip", "-n", ns, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0"},
	}
	if addr6 == "" {
		return cmds
	}
	// IPv6: the host side answers as the workload's router from a link-local address
	// known in advance, at once (no duplicate address detection).
	return append(cmds,
		[]string{"ip", "-n", host, "link", "set", iface, "down"},
		[]string{"ip", "netns", "exec", host, "sysctl", "-qw", "net.ipv6.conf." + iface + ".accept_dad=0"},
		[]string{"ip", "-n", host, "link", "set", iface, "address", hostSideMAC},
		[]string{"ip", "-n", host, "link", "set", iface, "up"},
		[]string{"ip", "-n", ns, "addr", "add", addr6 + "/128", "dev", "eth0", "nodad"},
		[]string{"ip", "-n", ns, "-6", "route", "add", "default", "via", hostSideLL, "dev", "eth0"},
	)
}
