package bgp_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sluice-net/sluice/internal/nstest"
)

// bird is a BIRD 2 daemon in a namespace of the test's, with its own control socket: never
// the system's service.
type bird struct {
	t    *testing.T
	ns   netns.NsHandle
	dir  string
	ctl  string
	cmd  *exec.Cmd
	conf string
}

// needBIRD skips unless bird and birdc are installed (CI installs Debian's bird2).
func needBIRD(t *testing.T) {
	t.Helper()
	for _, b := range []string{"bird", "birdc"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed (apt-get install bird2): %v", b, err)
		}
	}
}

// startBIRD runs bird in ns with conf, in the foreground of a child process the test's
// cleanup kills.
func startBIRD(t *testing.T, ns netns.NsHandle, name, conf string) *bird {
	t.Helper()
	dir := t.TempDir()
	b := &bird{t: t, ns: ns, dir: dir, ctl: filepath.Join(dir, name+".ctl"), conf: filepath.Join(dir, name+".conf")}
	if err := os.WriteFile(b.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	b.cmd = exec.Command("bird", "-f", "-c", b.conf, "-s", b.ctl, "-P", filepath.Join(dir, name+".pid"))
	b.cmd.Stdout, b.cmd.Stderr = os.Stderr, os.Stderr
	if err := nstest.Run(ns, b.cmd.Start); err != nil {
		t.Fatalf("starting bird: %v", err)
	}
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := b.c("show status"); err == nil {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("bird's control socket %s never answered", b.ctl)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// c runs a birdc command and returns its output.
func (b *bird) c(cmd string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", b.ctl}, strings.Fields(cmd)...)...).CombinedOutput()
	return string(out), err
}

// mustC is c, failing the test on an error.
func (b *bird) mustC(cmd string) string {
	b.t.Helper()
	out, err := b.c(cmd)
	if err != nil {
		b.t.Fatalf("birdc %s: %v\n%s", cmd, err, out)
	}
	return out
}

// waitC polls a birdc command until ok accepts its output, and returns when.
func (b *bird) waitC(what, cmd string, timeout time.Duration, ok func(string) bool) time.Time {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		// birdc exits non-zero on "Network not found": what it printed is the answer, as
		// long as it reached bird.
		out, _ := b.c(cmd)
		if strings.Contains(out, "BIRD ") && ok(out) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not within %v; birdc %s says:\n%s\nprotocols:\n%s", what, timeout, cmd, out, b.mustC("show protocols all"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kernelRoutes lists ns's routes of a protocol, as "dst via gw" lines.
func kernelRoutes(t *testing.T, ns netns.NsHandle, proto netlink.RouteProtocol) []string {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	rs, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: proto}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		line := r.Dst.String()
		if r.Gw != nil {
			line += " via " + r.Gw.String()
		}
		out = append(out, line)
	}
	return out
}

// link joins two namespaces with a veth pair and gives each end an address (CIDR form).
func link(t *testing.T, a netns.NsHandle, aName, aAddr string, b netns.NsHandle, bName, bAddr string) {
	t.Helper()
	ha, err := netlink.NewHandleAt(a)
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()
	if err := ha.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName}, PeerName: bName, PeerNamespace: netlink.NsFd(b)}); err != nil {
		t.Fatal(err)
	}
	hb, err := netlink.NewHandleAt(b)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	addrOn(t, ha, aName, aAddr)
	addrOn(t, hb, bName, bAddr)
}

// torConf is a top-of-rack router's BIRD configuration: it peers with one node over eBGP
// (with a password and graceful restart), programs what it learns into its kernel and
// announces a route of its own.
func torConf(routerID, local string, localAS int, neighbor string, neighborAS int, password string) string {
	return routerConf(routerID, local, localAS, neighbor, neighborAS, password, "198.18.0.0/24")
}

// routerConf is torConf announcing route instead.
func routerConf(routerID, local string, localAS int, neighbor string, neighborAS int, password, route string) string {
	pw := ""
	if password != "" {
		pw = fmt.Sprintf("  password %q;\n", password)
	}
	return fmt.Sprintf(`router id %s;
protocol device { scan time 1; }
protocol kernel { ipv4 { import none; export all; }; merge paths on; }
protocol static { ipv4; route %s blackhole; }
protocol bgp node {
  local %s as %d;
  neighbor %s as %d;
%s  graceful restart on;
  connect retry time 1;
  ipv4 { import all; export all; };
}
`, routerID, route, local, localAS, neighbor, neighborAS, pw)
}

// frr is FRR's bgpd alone (no zebra) in a namespace, with its own vty socket directory.
type frr struct {
	t   *testing.T
	dir string
}

// needFRR skips unless FRR's bgpd and vtysh are installed (Debian's frr).
func needFRR(t *testing.T) {
	t.Helper()
	for _, b := range []string{"/usr/lib/frr/bgpd", "vtysh"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed (apt-get install frr): %v", b, err)
		}
	}
}

// startFRR runs bgpd with conf in ns until the test ends.
func startFRR(t *testing.T, ns netns.NsHandle, conf string) *frr {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bgpd.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/lib/frr/bgpd", "-f", cfg, "-i", filepath.Join(dir, "bgpd.pid"), "--vty_socket", dir, "-Z", "-S", "-n", "-A", "127.0.0.1", "-P", "0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := nstest.Run(ns, cmd.Start); err != nil {
		t.Fatalf("starting bgpd: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	f := &frr{t: t, dir: dir}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if out, err := f.c("show bgp summary"); err == nil && strings.Contains(out, "BGP") {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("bgpd's vty in %s never answered", dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// c runs a vtysh command against this bgpd.
func (f *frr) c(cmd string) (string, error) {
	out, err := exec.Command("vtysh", "--vty_socket", f.dir, "-c", cmd).CombinedOutput()
	return string(out), err
}

// waitC polls a vtysh command until ok accepts its output.
func (f *frr) waitC(what, cmd string, timeout time.Duration, ok func(string) bool) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, _ := f.c(cmd)
		if ok(out) {
			return
		}
		if time.Now().After(deadline) {
			summary, _ := f.c("show bgp summary")
			f.t.Fatalf("%s: not within %v; vtysh %s says:\n%s\n%s", what, timeout, cmd, out, summary)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// segmentPort is one router on a segment: its namespace and address (CIDR form).
type segmentPort struct {
	ns   netns.NsHandle
	addr string
}

// segment puts the node (address nodeAddr on bridge eth0 in nodeNS) and each router on one
// Ethernet segment: a veth from the bridge to each router's eth0.
func segment(t *testing.T, nodeNS netns.NsHandle, nodeAddr string, ports []segmentPort) {
	t.Helper()
	h, err := netlink.NewHandleAt(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}}
	if err := h.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	addrOn(t, h, "eth0", nodeAddr)
	for i, p := range ports {
		port := fmt.Sprintf("port%d", i)
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MasterIndex: mustLink(t, h, "eth0").Attrs().Index},
			PeerName: "eth0", PeerNamespace: netlink.NsFd(p.ns)}); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(mustLink(t, h, port)); err != nil {
			t.Fatal(err)
		}
		hp, err := netlink.NewHandleAt(p.ns)
		if err != nil {
			t.Fatal(err)
		}
		addrOn(t, hp, "eth0", p.addr)
		hp.Close()
	}
}

func mustLink(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// addrOn puts addr (CIDR form) on the link name and brings it up.
func addrOn(t *testing.T, h *netlink.Handle, name, addr string) {
	t.Helper()
	l := mustLink(t, h, name)
	p := netip.MustParsePrefix(addr)
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD // usable at once: a speaker binds to it
	}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
}

// torConf6 is torConf over IPv6: the session, what it programs and what it announces
// (2001:db8:18::/48).
func torConf6(routerID, local string, localAS int, neighbor string, neighborAS int) string {
	return fmt.Sprintf(`router id %s;
protocol device { scan time 1; }
protocol kernel { ipv6 { import none; export all; }; merge paths on; }
protocol static { ipv6; route 2001:db8:18::/48 blackhole; }
protocol bgp node {
  local %s as %d;
  neighbor %s as %d;
  graceful restart on;
  connect retry time 1;
  ipv6 { import all; export all; };
}
`, routerID, local, localAS, neighbor, neighborAS)
}
