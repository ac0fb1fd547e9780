package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/vishvananda/netlink"
)

// TestLeftoversOnANode: in a namespace of its own, an interface whose ingress holds a program
// named as sluice's, Cilium's placed ahead of it and an operator's after it. leftovers names
// both, Cilium's breaking and the operator's dormant, exits 1, and says the same in JSON; with
// Cilium's gone it exits 0.
func TestLeftoversOnANode(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces and eBPF programs")
	if err := bpf.HaveTCX(); err != nil {
		t.Skipf("needs TCX (Linux 6.6): %v", err)
	}
	nstest.Enter(t)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0-peer"}); err != nil {
		t.Fatal(err)
	}
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	attach := func(name string, anchor link.Anchor) (link.Link, ebpf.ProgramID) {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.SchedCLS, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		l, err := link.AttachTCX(link.TCXOptions{Interface: eth0.Attrs().Index, Program: p, Attach: ebpf.AttachTCXIngress, Anchor: anchor})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		return l, id
	}
	attach("sl_from_host", link.Head())
	cil, cilID := attach("cil_from_netdev", link.Head())
	_, opID := attach("op_counter", link.Tail())

	c := &cluster{t: t, env: map[string]string{}}
	r := c.ctl("", "leftovers", "--cgroup", "none")
	if r.code != 1 {
		t.Fatalf("leftovers with a breaking program: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		fmt.Sprintf("breaking  tcx   cilium   eth0 ingress  tcx program %d cil_from_netdev", cilID),
		fmt.Sprintf("dormant   tcx   unknown  eth0 ingress  tcx program %d op_counter", opID),
		"1 breaking, 1 dormant",
		"breaks node ports, external and load-balancer addresses arriving on eth0",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("leftovers does not say %q:\n%s", want, r.stdout)
		}
	}
	r = c.ctl("", "leftovers", "-o", "json", "--cgroup", "none")
	var got []map[string]string
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != 1 || len(got) != 2 {
		t.Fatalf("leftovers -o json: exit %d, %v\n%s", r.code, err, r.stdout)
	}
	for _, g := range got {
		want := map[string]string{"cil_from_netdev": "breaking cilium", "op_counter": "dormant unknown"}
		name := g["what"][strings.LastIndex(g["what"], " ")+1:]
		if want[name] != g["effect"]+" "+g["owner"] || g["fix"] == "" || g["breaks"] == "" || g["kind"] != "tcx" {
			t.Errorf("json entry %v", g)
		}
	}
	if err := cil.Close(); err != nil {
		t.Fatal(err)
	}
	if r := c.ctl("", "leftovers", "--cgroup", "none"); r.code != 0 || !strings.Contains(r.stdout, "0 breaking, 1 dormant") {
		t.Errorf("with only the dormant program: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Calico's pins on the bpffs sluice pins under: dormant, listed.
	fsRoot := privateBPFFS(t)
	if err := os.Mkdir(filepath.Join(fsRoot, "calico"), 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "cali_v4_ct", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(filepath.Join(fsRoot, "calico", "cali_v4_ct")); err != nil {
		t.Fatal(err)
	}
	if r := c.ctl("", "leftovers", "--cgroup", "none", "--pin-dir", filepath.Join(fsRoot, "sluice")); r.code != 0 ||
		!strings.Contains(table(r.stdout), "dormant pin calico bpffs "+filepath.Join(fsRoot, "calico")+" 1 pinned objects (cali_v4_ct)") {
		t.Errorf("with Calico's pins: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// kube-proxy's service chains, left in iptables-nft and hooked into nat OUTPUT: with the
	// socket programs off (--cgroup none) they take the node's own connections to services.
	if _, err := exec.LookPath("iptables"); err == nil {
		for _, r := range [][]string{{"-t", "nat", "-N", "KUBE-SERVICES"}, {"-t", "nat", "-A", "OUTPUT", "-j", "KUBE-SERVICES"},
			{"-t", "nat", "-A", "KUBE-SERVICES", "-d", "10.96.0.10/32", "-p", "udp", "--dport", "53", "-j", "DNAT", "--to-destination", "10.65.9.9:53"}} {
			if out, err := exec.Command("iptables", append([]string{"-w"}, r...)...).CombinedOutput(); err != nil {
				t.Fatalf("iptables %v: %v: %s", r, err, out)
			}
		}
		r := c.ctl("", "leftovers", "--cgroup", "none")
		if r.code != 1 || !strings.Contains(r.stdout, "breaking  netfilter  kube-proxy  ip nat") ||
			!strings.Contains(r.stdout, "take the node's own connections to services") {
			t.Errorf("with kube-proxy's KUBE-SERVICES in nat OUTPUT: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		for _, r := range [][]string{{"-t", "nat", "-F"}, {"-t", "nat", "-X"}} {
			if out, err := exec.Command("iptables", append([]string{"-w"}, r...)...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		}
	} else {
		t.Log("no iptables: the netfilter part is dataplane's TestNetfilterLeftovers'")
	}

	// The cgroup socket hooks: Calico's connect-time load balancer holding connect4 alone on
	// the cgroup sluiced is configured with.
	root, err := bpf.CgroupV2Root()
	if err != nil {
		t.Skipf("no cgroup v2 hierarchy mounted: %v", err)
	}
	child := filepath.Join(root, fmt.Sprintf("sluicectl-test-%d", os.Getpid()))
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(child)
	cg, err := os.Open(child)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "calico_connect_v4", Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect,
		License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	opts := link.RawAttachProgramOptions{Target: int(cg.Fd()), Program: p, Attach: ebpf.AttachCGroupInet4Connect}
	if err := link.RawAttachProgram(opts); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = link.RawDetachProgram(link.RawDetachProgramOptions{Target: opts.Target, Program: p, Attach: opts.Attach})
	}()
	c.env["SLUICE_CGROUP_PATH"] = child
	r = c.ctl("", "leftovers")
	if r.code != 1 || !strings.Contains(r.stdout, "breaking  cgroup  calico   cgroup "+child+" connect4") ||
		!strings.Contains(r.stdout, "holds the hook alone") {
		t.Errorf("with Calico's program alone on the cgroup's connect4: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
