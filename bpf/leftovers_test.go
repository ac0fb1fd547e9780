package bpf

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cloudflare/ipvs"
	"github.com/cloudflare/ipvs/netmask"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestHookViewClassify: which of another program's positions on a hook break sluice's path
// and which are dormant behind sluice's program, on the TCX and on the classic path, and
// whose each is.
func TestHookViewClassify(t *testing.T) {
	names := map[ebpf.ProgramID]string{1: "sl_from_host", 2: "cil_from_netdev", 3: "op_counter", 4: "calico_tc_main", 5: "ddos_xdp"}
	ours := func(id ebpf.ProgramID) bool { return id == 1 }
	owner := func(id ebpf.ProgramID) string { return names[id] }
	eth0 := Hook{Iface: "eth0", Ifindex: 2}
	sluiceTC := tcFilter{Hook: eth0, Priority: TCPriority, Handle: TCHandle, Name: "sl_from_host", ProgID: 1}
	calicoTC := tcFilter{Hook: eth0, Priority: 2, Handle: 1, Name: "calico_tc_main", ProgID: 4}
	cases := []struct {
		name string
		v    hookView
		want []string // "kind what: effect owner"
	}{
		{"tcx: one ahead of sluice's, one after; a classic filter behind them",
			hookView{mode: AttachTCX, tcx: []tcxProg{{id: 2, linkID: 7}, {id: 1}, {id: 3, linkID: 8}}, tc: []tcFilter{calicoTC}},
			[]string{"tcx tcx program 2 cil_from_netdev: breaking cilium", "tcx tcx program 3 op_counter: dormant ",
				"tc-filter tc filter pref 2 handle 0x1 bpf calico_tc_main: dormant calico"}},
		{"tcx mode with sluice's link missing: everything on the hook runs",
			hookView{mode: AttachTCX, tcx: []tcxProg{{id: 3}}, tc: []tcFilter{calicoTC}},
			[]string{"tcx tcx program 3 op_counter: breaking ", "tc-filter tc filter pref 2 handle 0x1 bpf calico_tc_main: breaking calico"}},
		{"classic path: every TCX program runs first; filters before sluice's break, after are dormant",
			hookView{mode: AttachTC, tcx: []tcxProg{{id: 3}}, tc: []tcFilter{{Hook: eth0, Priority: 1, Handle: 9, Name: "cil_early", ProgID: 2}, sluiceTC, calicoTC}},
			[]string{"tcx tcx program 3 op_counter: breaking ", "tc-filter tc filter pref 1 handle 0x9 bpf cil_early: breaking cilium",
				"tc-filter tc filter pref 2 handle 0x1 bpf calico_tc_main: dormant calico"}},
		{"an XDP program runs before tc: breaking on ingress",
			hookView{mode: AttachTCX, tcx: []tcxProg{{id: 1}}, xdp: &netlink.LinkXdp{Attached: true, ProgId: 5, AttachMode: xdpAttachedSKB}},
			[]string{"xdp xdp program 5 ddos_xdp: breaking "}},
		{"an XDP program is not an egress hook's",
			hookView{hook: Hook{Iface: "eth0", Ifindex: 2, Egress: true}, mode: AttachTCX, tcx: []tcxProg{{id: 1}}, xdp: &netlink.LinkXdp{Attached: true, ProgId: 5}},
			nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := c.v
			if v.hook.Iface == "" {
				v.hook = eth0
			}
			v.ours, v.owner = ours, owner
			var got []string
			for _, cf := range v.classify() {
				got = append(got, fmt.Sprintf("%s %s: %s %s", cf.Kind, cf.What, cf.Effect(), cf.Owner))
				if cf.Breaking && cf.Breaks == "" || !cf.Breaking && cf.Breaks == "" || cf.Fix == "" {
					t.Errorf("%s: says nothing of what it breaks (%q) or of its fix (%q)", cf.What, cf.Breaks, cf.Fix)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("classified\n%q\nwant\n%q", got, c.want)
			}
		})
	}
	for _, c := range []struct {
		name, owner string
	}{{"cil_from_netdev", OwnerCilium}, {"bpf_netdev.o:[from-netdev]", OwnerCilium}, {"calico_tc_main", OwnerCalico},
		{"cali_tc_preambl", OwnerCalico}, {"foreign", ""}, {"sl_from_host", ""}} {
		if got := programOwner(c.name); got != c.owner {
			t.Errorf("programOwner(%q) = %q, want %q", c.name, got, c.owner)
		}
	}
}

// hookLeftoverWorld is the traffic world (benchTrafficWorldN) seen from node A's uplink eth1,
// where the hook leftover tests plant other software's programs: the node port of service 0
// (its endpoint on node A) from the client, and node A's stage restarted as an operator would
// after a migration.
type hookLeftoverWorld struct {
	w    *benchTraffic
	eth1 netlink.Link
	// reach connects to the node port from the client and reads the endpoint's answer.
	reach func() error
	// inA runs f in node A's namespace, failing the test on its error.
	inA func(f func() error)
	// prog loads a program that only returns ret, named name.
	prog func(name string, typ ebpf.ProgramType, ret int32) *ebpf.Program
	// restart starts node A's stage again (in mode, when set) and returns what it reported,
	// sorted by key.
	restart func(clean bool, mode AttachMode) []Conflict
	// render says each report on eth1's ingress as "kind effect owner removed=".
	render func(cs []Conflict) []string
}

func newHookLeftoverWorld(t *testing.T) *hookLeftoverWorld {
	// Services 0 and 1 carry the traffic; 10 keep the maps cheap to fill under emulation, and
	// the IPv4 programs alone are loaded (verifying the IPv6 ones is most of a load there).
	w := benchTrafficWorldN(t, 10, true)
	h := &hookLeftoverWorld{w: w}
	np := netip.AddrPortFrom(benchNodeAddr(0), uint16(benchNodePort)).String() // service 0: its endpoint on node A
	h.reach = func() error {
		return nstest.Run(w.client, func() error {
			c, err := net.DialTimeout("tcp", np, 700*time.Millisecond)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Second))
			if _, err := c.Write([]byte{'c'}); err != nil {
				return err
			}
			var b [1]byte
			_, err = io.ReadFull(c, b[:])
			return err
		})
	}
	h.inA = func(f func() error) {
		t.Helper()
		if err := nstest.Run(w.nodes[0], f); err != nil {
			t.Fatal(err)
		}
	}
	h.prog = func(name string, typ ebpf.ProgramType, ret int32) *ebpf.Program {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: typ, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, ret), asm.Return()}})
		if err != nil {
			t.Fatalf("loading %s: %v", name, err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	h.inA(func() (err error) { h.eth1, err = netlink.LinkByName("eth1"); return err })
	h.restart = func(clean bool, mode AttachMode) []Conflict {
		t.Helper()
		var mu sync.Mutex
		var got []Conflict
		cfg := w.cfgs[0]
		cfg.CleanConflicts = clean
		if mode != "" {
			cfg.Attach = mode
		}
		cfg.OnConflict = func(c Conflict) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, c)
		}
		w.stages[0].Close()
		h.inA(func() error {
			st, err := StartStage(cfg)
			if err != nil {
				return err
			}
			w.stages[0] = st
			t.Cleanup(st.Close)
			st.OnUpdate(w.updates[0])
			_, err = st.Apply()
			return err
		})
		mu.Lock()
		defer mu.Unlock()
		sort.Slice(got, func(i, j int) bool { return got[i].Key() < got[j].Key() })
		return got
	}
	h.render = func(cs []Conflict) []string {
		var out []string
		for _, c := range cs {
			if c.Hook.Iface == "eth1" && !c.Hook.Egress {
				out = append(out, fmt.Sprintf("%s %s %s removed=%v", c.Kind, c.Effect(), c.Owner, c.Removed))
			}
		}
		return out
	}
	return h
}

// TestHookLeftoversClassic: on the classic tc path (kernels before 6.6, or attach-mode tc),
// filters run in the order the kernel lists them: by preference, and within sluice's
// preference newest first. Cilium's filter added at sluice's preference after sluice's runs
// first and, passing every packet up, breaks the node port; an operator's filter at a later
// preference, dropping everything, never runs (sluice's program returns a verdict) and is
// dormant. --clean-conflicts removes Cilium's only: the node port works and the operator's
// filter stays.
func TestHookLeftoversClassic(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (6 s): make test runs it")
	}
	nstest.NeedRoot(t, "network namespaces, bpffs, eBPF programs")
	h := newHookLeftoverWorld(t)
	if st := h.w.stages[0]; st.Mode() != AttachTC {
		h.restart(false, AttachTC)
	}
	if err := h.reach(); err != nil {
		t.Fatalf("the node port on the classic path, before any leftover: %v", err)
	}
	filter := func(name string, pref uint16, handle uint32, ret int32) {
		p := h.prog(name, ebpf.SchedCLS, ret)
		h.inA(func() error {
			return netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: h.eth1.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
				Handle: handle, Protocol: unix.ETH_P_ALL, Priority: pref}, Fd: p.FD(), Name: name, DirectAction: true})
		})
	}
	filter("op_drop", TCPriority+1, 1, 2 /* TC_ACT_SHOT */)
	if err := h.reach(); err != nil {
		t.Fatalf("the node port with an operator's dropping filter behind sluice's: %v", err)
	}
	filter("cil_from_netdev", TCPriority, 1, 0 /* TC_ACT_OK */)
	if err := h.reach(); err == nil {
		t.Fatal("the node port works with Cilium's filter passing every packet up ahead of sluice's")
	}
	want := []string{"tc-filter breaking cilium removed=false", "tc-filter dormant  removed=false"}
	if r := h.render(h.restart(false, AttachTC)); !slices.Equal(r, want) {
		t.Fatalf("reported on eth1 ingress %q, want %q", r, want)
	}
	var read []Conflict
	h.inA(func() (err error) { read, err = HookConflicts(); return err })
	if r := h.render(read); !slices.Equal(r, want) {
		t.Errorf("HookConflicts (sluicectl leftovers) on eth1 ingress %q, want %q", r, want)
	}
	if err := h.reach(); err == nil {
		t.Fatal("the node port works before the cleanup")
	}
	want = []string{"tc-filter breaking cilium removed=true", "tc-filter dormant  removed=false"}
	if r := h.render(h.restart(true, AttachTC)); !slices.Equal(r, want) {
		t.Fatalf("with --clean-conflicts, on eth1 ingress %q, want %q", r, want)
	}
	if err := h.reach(); err != nil {
		t.Fatalf("the node port after the cleanup: %v", err)
	}
	var names []string
	h.inA(func() error {
		fs, err := tcFilters(Hook{Iface: "eth1", Ifindex: h.eth1.Attrs().Index})
		for _, f := range fs {
			names = append(names, fmt.Sprintf("%s pref %d", f.Name, f.Priority))
		}
		return err
	})
	if !slices.Equal(names, []string{fmt.Sprintf("sl_from_host pref %d", TCPriority), fmt.Sprintf("op_drop pref %d", TCPriority+1)}) {
		t.Errorf("after the cleanup eth1 ingress holds %q; want sluice's filter, then the operator's", names)
	}
}

// TestHookLeftoversTraffic: programs other software leaves on the interface a node port's
// clients come in by (node A's eth1), planted as Cilium and Calico leave them, beside an
// operator's own: each is shown with traffic to break the node port or to be dormant, is
// reported as such, and --clean-conflicts removes exactly the breaking ones whose owner is
// recognisable; the node port then works and the operator's program is still there.
func TestHookLeftoversTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (3 s): make test runs it")
	}
	nstest.NeedRoot(t, "network namespaces, bpffs, eBPF programs")
	if err := HaveTCX(); err != nil {
		t.Skipf("the TCX half needs TCX (Linux 6.6): %v; the classic path's are TestHookLeftoversClassic's", err)
	}
	h := newHookLeftoverWorld(t)
	w, reach, inA, prog, eth1, restart, render := h.w, h.reach, h.inA, h.prog, h.eth1, h.restart, h.render
	if err := reach(); err != nil {
		t.Fatalf("the node port before any leftover: %v", err)
	}
	tcx := func(p *ebpf.Program, anchor link.Anchor) link.Link {
		var l link.Link
		inA(func() (err error) {
			l, err = link.AttachTCX(link.TCXOptions{Interface: eth1.Attrs().Index, Program: p, Attach: ebpf.AttachTCXIngress, Anchor: anchor})
			return err
		})
		t.Cleanup(func() { l.Close() })
		return l
	}

	// 1. Cilium's XDP program, dropping (a DDoS rule, or its node-port acceleration with
	// another cluster's view): nothing reaches sluice's program.
	xdp := prog("cil_xdp_entry", ebpf.XDP, 1 /* XDP_DROP */)
	inA(func() error { return netlink.LinkSetXdpFdWithFlags(eth1, xdp.FD(), unix.XDP_FLAGS_SKB_MODE) })
	t.Cleanup(func() {
		_ = nstest.Run(w.nodes[0], func() error { return netlink.LinkSetXdpFdWithFlags(eth1, -1, unix.XDP_FLAGS_SKB_MODE) })
	})
	if err := reach(); err == nil {
		t.Fatal("the node port works with an XDP program dropping every packet of eth1")
	}
	inA(func() error { return netlink.LinkSetXdpFdWithFlags(eth1, -1, unix.XDP_FLAGS_SKB_MODE) })
	if err := reach(); err != nil {
		t.Fatalf("the node port without the XDP program: %v", err)
	}

	// 2. Cilium's TCX program placed ahead of sluice's, passing every packet up (TC_ACT_OK):
	// sluice's never sees them, the node port meets no listener.
	tcx(prog("cil_from_netdev", ebpf.SchedCLS, 0 /* TC_ACT_OK */), link.Head())
	if err := reach(); err == nil {
		t.Fatal("the node port works with a program ahead of sluice's passing every packet up")
	}

	// 3. An operator's TCX program after sluice's (it would drop everything), and Calico's
	// classic filter dropping everything: both dormant, sluice's verdict comes first.
	operator := tcx(prog("op_counter", ebpf.SchedCLS, 2 /* TC_ACT_SHOT */), link.Tail())
	calico := prog("calico_tc_main", ebpf.SchedCLS, 2 /* TC_ACT_SHOT */)
	inA(func() error {
		q := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: eth1.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
		if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		return netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: eth1.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
			Handle: netlink.MakeHandle(0, 1), Protocol: unix.ETH_P_ALL, Priority: 5}, Fd: calico.FD(), Name: "calico_tc_main", DirectAction: true})
	})
	// And Cilium's XDP program back, passing (XDP_PASS): breaking still, as anything that
	// runs first (sluice cannot know what it does to the packets it sees).
	inA(func() error {
		return netlink.LinkSetXdpFdWithFlags(eth1, prog("cil_xdp_entry", ebpf.XDP, 2 /* XDP_PASS */).FD(), unix.XDP_FLAGS_SKB_MODE)
	})

	got := restart(false, "")
	want := []string{"tc-filter dormant calico removed=false", "tcx breaking cilium removed=false", "tcx dormant  removed=false",
		"xdp breaking cilium removed=false"}
	if r := render(got); !slices.Equal(r, want) {
		t.Fatalf("reported on eth1 ingress %q, want %q (all: %v)", r, want, got)
	}
	for _, c := range got {
		if c.Breaking && c.Hook.Iface == "eth1" && c.Breaks != hookBreaks(c.Hook, false) {
			t.Errorf("%s: breaks %q", c, c.Breaks)
		}
	}
	if err := reach(); err == nil {
		t.Fatal("the node port works before the cleanup")
	}
	// What `sluicectl leftovers` reads on the node, without the agent: the same.
	var read []Conflict
	inA(func() (err error) { read, err = HookConflicts(); return err })
	if r := render(read); !slices.Equal(r, want) {
		t.Errorf("HookConflicts on eth1 ingress %q, want %q", r, want)
	}

	got = restart(true, "")
	want = []string{"tc-filter dormant calico removed=false", "tcx breaking cilium removed=true", "tcx dormant  removed=false",
		"xdp breaking cilium removed=true"}
	if r := render(got); !slices.Equal(r, want) {
		t.Fatalf("with --clean-conflicts, on eth1 ingress %q, want %q", r, want)
	}
	for _, c := range got {
		if c.Err != nil {
			t.Errorf("%s: %v", c, c.Err)
		}
	}
	if err := reach(); err != nil {
		t.Fatalf("the node port after the cleanup: %v", err)
	}
	// The dormant ones are still there, byte for byte: the operator's link and program, and
	// Calico's filter.
	info, err := operator.Info()
	if err != nil {
		t.Fatalf("the operator's link after the cleanup: %v", err)
	}
	var names []string
	var filters int
	inA(func() error {
		res, err := link.QueryPrograms(link.QueryOptions{Target: eth1.Attrs().Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		for _, p := range res.Programs {
			names = append(names, programName(p.ID))
		}
		fs, err := tcFilters(Hook{Iface: "eth1", Ifindex: eth1.Attrs().Index})
		for _, f := range fs {
			if f.Name == "calico_tc_main" && f.Priority == 5 {
				filters++
			}
		}
		l, _ := netlink.LinkByIndex(eth1.Attrs().Index)
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			return fmt.Errorf("xdp program %d still on eth1", x.ProgId)
		}
		return err
	})
	if !slices.Equal(names, []string{"sl_from_host", "op_counter"}) || filters != 1 || info.ID == 0 {
		t.Errorf("after the cleanup eth1 ingress runs %v and holds %d of Calico's filters; want sluice's then the operator's, and the filter", names, filters)
	}

	// A cleaned leftover that comes back is found by the next apply, and removed again.
	tcx(prog("cil_from_netdev", ebpf.SchedCLS, 0), link.Head())
	var again []Conflict
	var mu sync.Mutex
	w.stages[0].cfg.OnConflict = func(c Conflict) { mu.Lock(); again = append(again, c); mu.Unlock() }
	inA(func() error { _, err := w.stages[0].Apply(); return err })
	mu.Lock()
	defer mu.Unlock()
	if r := render(again); !slices.Equal(r, []string{"tcx breaking cilium removed=true"}) {
		t.Errorf("the program back: %q", r)
	}
	if err := reach(); err != nil {
		t.Fatalf("the node port after the program came back and went: %v", err)
	}
}

// TestCgroupLeftovers: a connect-time load balancer left on the cgroup sluice's socket
// programs use, attached as old Calico versions attach theirs (alone, without
// BPF_F_ALLOW_MULTI). sluice's attach fails and says which program holds the hook and how to
// remove it, and a process of that cgroup cannot reach a cluster IP; --clean-conflicts
// detaches it, sluice's programs attach and the connection reaches the backend. An operator's
// program attached after sluice's is dormant and stays.
func TestCgroupLeftovers(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	nstest.NeedRoot(t, "attaching cgroup socket programs")
	root := skCgroupRoot(t)
	child := filepath.Join(root, fmt.Sprintf("sluice-test-leftovers-%d", os.Getpid()))
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(child); err != nil {
			t.Errorf("removing the test's cgroup: %v", err)
		}
	})
	cg, err := os.Open(child)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Close() })

	nstest.Enter(t)
	cookie, err := NetnsCookie()
	if err != nil {
		t.Skipf("no SO_NETNS_COOKIE: %v", err)
	}
	ln := skHello(t, "tcp4", "127.0.0.1:0", nil)
	o, err := Load("", MapSizes{Frontends: 64, Backends: 64, SourceRanges: 64, ClusterNets: 64, Affinity: 64, Conntrack: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	backend := ln.Addr().(*net.TCPAddr).AddrPort()
	for _, err := range []error{
		o.SlCfg.Put(uint32(0), sluiceCfg{NetnsCookie: cookie}),
		o.SlFeV4.Put(sluiceFeKeyV4{Addr: tpA(skVIP), Port: tpP(80), Proto: tpProtoTCP}, sluiceFeVal{ListId: 1, SvcId: 1, Count: 1, Local: 1}),
		o.SlFeV4.Put(sluiceFeKeyV4{Addr: tpA(skVIP)}, sluiceFeVal{SvcId: 1, Flags: tpFeAddrOnly}),
		o.SlBeV4.Put(sluiceBeKey{ListId: 1}, tpBackend(backend, tpNodeA, true)),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	pin := t.TempDir()
	if err := unix.Mount("bpf", pin, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(pin, unix.MNT_DETACH) })

	// A process of the cgroup, in this namespace, reaching the cluster IP: this test binary
	// again, as helperDial (the kernel matrix's guests have no shell tools).
	reach := func() (string, error) {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "SLUICE_HELPER_DIAL="+netip.AddrPortFrom(skVIP, 80).String())
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		out, err := cmd.Output()
		if i := strings.Index(string(out), "answer:"); i >= 0 {
			return strings.TrimSpace(string(out)[i+len("answer:"):][:5]), err
		}
		return string(out), err
	}
	prog := func(name string, attach ebpf.AttachType) *ebpf.Program {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.CGroupSockAddr, AttachType: attach, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
		if err != nil {
			t.Fatalf("loading %s: %v", name, err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	calico := prog("calico_connect_v4", ebpf.AttachCGroupInet4Connect)
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: int(cg.Fd()), Program: calico, Attach: ebpf.AttachCGroupInet4Connect}); err != nil {
		t.Fatalf("attaching Calico's program alone: %v", err)
	}
	t.Cleanup(func() {
		_ = link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(cg.Fd()), Program: calico, Attach: ebpf.AttachCGroupInet4Connect})
	})

	h, err := NewSocketHooks(pin, child, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	found, err := h.Sync()
	if err == nil {
		t.Fatal("sluice's socket programs attached beside a program holding connect4 alone")
	}
	for _, want := range []string{"connect4 on cgroup " + child, "calico_connect_", "without BPF_F_ALLOW_MULTI", "bpftool cgroup detach " + child + " connect4 id", "--clean-conflicts"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the attach error does not say %q: %v", want, err)
		}
	}
	if len(found) != 1 || found[0].Kind != KindCgroup || !found[0].Breaking || found[0].Owner != OwnerCalico || found[0].Removed ||
		found[0].Where() != "cgroup "+child+" connect4" {
		t.Fatalf("found %v; want Calico's connect4 program, breaking, not removed", found)
	}
	if out, err := reach(); err == nil {
		t.Fatalf("the cluster IP answered %q with Calico's program in sluice's place", out)
	}

	h.CleanConflicts = true
	found, err = h.Sync()
	if err != nil {
		t.Fatalf("after removing Calico's program: %v", err)
	}
	if len(found) != 1 || !found[0].Removed || found[0].Err != nil {
		t.Fatalf("found %v; want Calico's program removed", found)
	}
	if out, err := reach(); err != nil || out != "hello" {
		t.Fatalf("the cluster IP from the cgroup after the cleanup: %q, %v", out, err)
	}

	// An operator's program on getpeername4 after sluice's: dormant, kept.
	audit := prog("op_audit", ebpf.AttachCgroupInet4GetPeername)
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: int(cg.Fd()), Program: audit, Attach: ebpf.AttachCgroupInet4GetPeername,
		Flags: unix.BPF_F_ALLOW_MULTI}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(cg.Fd()), Program: audit, Attach: ebpf.AttachCgroupInet4GetPeername})
	})
	found, err = h.Sync()
	if err != nil || len(found) != 1 || found[0].Breaking || found[0].Removed || found[0].Owner != "" {
		t.Fatalf("with an operator's program after sluice's: %v, %v; want it dormant and kept", found, err)
	}
	_, ids, err := cgroupQuery(int(cg.Fd()), ebpf.AttachCgroupInet4GetPeername)
	if err != nil || len(ids) != 2 {
		t.Fatalf("getpeername4 holds %v (%v); want sluice's and the operator's", ids, err)
	}
	if out, err := reach(); err != nil || out != "hello" {
		t.Fatalf("the cluster IP with the operator's program there: %q, %v", out, err)
	}
}

// TestCgroupConflictsClassify: on a cgroup hook, programs before sluice's break, after are
// dormant, one holding the hook alone breaks; another sluice agent's (agents of several
// namespaces share the cgroup) is none.
func TestCgroupConflictsClassify(t *testing.T) {
	names := map[ebpf.ProgramID]string{1: "sl_sock_connect", 2: "calico_connect_", 3: "sl_sock_connect", 4: "op_audit"}
	ours := func(id ebpf.ProgramID) bool { return id == 1 }
	name := func(id ebpf.ProgramID) string { return names[id] }
	render := func(cs []Conflict) (out []string) {
		for _, c := range cs {
			out = append(out, fmt.Sprintf("%s %s %s", c.What, c.Effect(), c.Owner))
		}
		return out
	}
	got := render(cgroupConflicts("/cg", "connect4", ebpf.AttachCGroupInet4Connect, unix.BPF_F_ALLOW_MULTI, []ebpf.ProgramID{2, 3, 1, 4}, ours, name))
	want := []string{"connect4 program 2 calico_connect_ breaking calico", "connect4 program 4 op_audit dormant "}
	if !slices.Equal(got, want) {
		t.Errorf("multi: %q, want %q", got, want)
	}
	got = render(cgroupConflicts("/cg", "connect4", ebpf.AttachCGroupInet4Connect, 0, []ebpf.ProgramID{2}, ours, name))
	if want := []string{"connect4 program 2 calico_connect_ breaking calico"}; !slices.Equal(got, want) {
		t.Errorf("alone: %q, want %q", got, want)
	}
}

// helperDial is TestCgroupLeftovers' process in the test cgroup (the test binary run again,
// with SLUICE_HELPER_DIAL set: TestMain calls it instead of the tests): it connects to that
// address and prints what the server says first.
func helperDial(addr string) int {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	b := make([]byte, 5)
	if _, err := io.ReadFull(c, b); err != nil {
		fmt.Println("read:", err)
		return 1
	}
	fmt.Printf("answer:%s\n", b)
	return 0
}

// TestIPVSServiceLeftover: kube-proxy's IPVS mode left behind, with kube-ipvs0 holding the
// cluster IP and a virtual service on it leading to the endpoint it last knew, takes the
// node's own connections to that cluster IP (sluice's socket programs off): the connection
// reaches the stale endpoint. The report names the service as breaking and a decoy service on
// another address as dormant; the cleanup removes the service and the address on sluice's
// frontend only, after which the cluster IP leads nowhere and the decoy still works. It runs
// where ip_vs can be loaded (the kernel matrix's guests load it); elsewhere it says why not.
func TestIPVSServiceLeftover(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces")
	node, backend := benchNewNS(t), benchNewNS(t)
	n := &benchNet{b: t, handles: map[netns.NsHandle]*netlink.Handle{}}
	if err := nstest.Run(node, func() error {
		c, err := ipvs.New()
		if err != nil {
			return err
		}
		closeIPVS(c)
		return nil
	}); err != nil {
		t.Skipf("IPVS is not available here (the ip_vs module cannot be loaded on this machine): %v", err)
	}
	n.veth(node, "eth0", nil, backend, "eth0", nil, 1500)
	n.addr(node, "eth0", "10.99.0.1/24")
	n.addr(backend, "eth0", "10.99.0.2/24")
	n.route(backend, "default", "eth0", netip.MustParseAddr("10.99.0.1"))
	if err := n.h(node).LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kube-ipvs0"}, PeerName: "kube-ipvs0-p"}); err != nil {
		t.Fatal(err)
	}
	n.addr(node, "kube-ipvs0", "10.96.0.10/32")
	n.addr(node, "kube-ipvs0", "10.96.9.9/32")
	var wg sync.WaitGroup
	var ln net.Listener
	if err := nstest.Run(backend, func() (err error) {
		ln, err = net.Listen("tcp4", "10.99.0.2:8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go benchServer(ln, &wg)
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	vip := ipvs.Service{Address: netip.MustParseAddr("10.96.0.10"), Port: 80, Family: ipvs.INET, Protocol: ipvs.TCP, Scheduler: "rr",
		Netmask: netmask.MaskFrom(32, 32)} // as kube-proxy makes them
	decoy := vip
	decoy.Address = netip.MustParseAddr("10.96.9.9")
	if err := nstest.Run(node, func() error {
		c, err := ipvs.New()
		if err != nil {
			return err
		}
		defer closeIPVS(c)
		for _, s := range []ipvs.Service{vip, decoy} {
			if err := c.CreateService(s); err != nil {
				return fmt.Errorf("IPVS service %s: %w", ipvsServiceName(s), err)
			}
			if err := c.CreateDestination(s, ipvs.Destination{Address: netip.MustParseAddr("10.99.0.2"), Port: 8080,
				Family: ipvs.INET, FwdMethod: ipvs.Masquerade, Weight: 1}); err != nil {
				return fmt.Errorf("IPVS destination: %w", err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	reach := func(addr string) error {
		return nstest.Run(node, func() error {
			c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte{'c'}); err != nil {
				return err
			}
			_, err = io.ReadFull(c, make([]byte, 1))
			return err
		})
	}
	if err := reach("10.96.0.10:80"); err != nil {
		t.Fatalf("the stale IPVS service does not take the node's connection (so it shows nothing): %v", err)
	}
	frontends := func() map[netip.Addr]bool { return map[netip.Addr]bool{netip.MustParseAddr("10.96.0.10"): true} }
	var found []Conflict
	_ = nstest.Run(node, func() error { found = KubeIPVS(frontends); return nil })
	byWhat := map[string]Conflict{}
	for _, c := range found {
		byWhat[c.What] = c
	}
	svc, ok := byWhat["IPVS virtual service TCP 10.96.0.10:80"]
	if !ok || !svc.Breaking || !svc.Removable() || svc.Fix != "ipvsadm -D -t 10.96.0.10:80" || svc.Where() != "ip_vs" {
		t.Fatalf("the service on sluice's frontend: %+v (found %v)", svc, found)
	}
	if d, ok := byWhat["IPVS virtual service TCP 10.96.9.9:80"]; !ok || d.Breaking || d.Removable() {
		t.Fatalf("the decoy: %+v (found %v)", d, found)
	}
	if len(found) != 3 {
		t.Fatalf("found %d, want the device and two services: %v", len(found), found)
	}
	if err := nstest.Run(node, func() error {
		for _, c := range found {
			if c.Removable() {
				if err := c.remove(); err != nil {
					return fmt.Errorf("removing %s: %w", c.What, err)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := reach("10.96.0.10:80"); err == nil {
		t.Error("after the cleanup the cluster IP still reaches the stale endpoint")
	}
	if err := reach("10.96.9.9:80"); err != nil {
		t.Errorf("the decoy service no longer works: %v", err)
	}
	_ = nstest.Run(node, func() error { found = KubeIPVS(frontends); return nil })
	for _, c := range found {
		if c.Breaking {
			t.Errorf("after the cleanup: %+v", c)
		}
	}
	if len(found) != 2 {
		t.Errorf("after the cleanup found %v; want the dormant device and decoy", found)
	}
}

// TestKubeIPVSLeftover: kube-proxy's kube-ipvs0 holding one of sluice's cluster IPs makes it
// the node's own address (the kernel routes it locally); the cleanup removes that address
// only, and the device once it holds none of sluice's is dormant.
func TestKubeIPVSLeftover(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces")
	nstest.Enter(t)
	// kube-proxy makes it a dummy device; a veth stands in (the kernels sluice targets may
	// lack the dummy driver).
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kube-ipvs0"}, PeerName: "kube-ipvs0-p"}); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName("kube-ipvs0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.96.0.10/32", "10.96.9.9/32"} {
		addr, _ := netlink.ParseAddr(a)
		if err := netlink.AddrAdd(l, addr); err != nil {
			t.Fatal(err)
		}
	}
	local := func(a string) bool {
		rs, err := netlink.RouteGet(net.ParseIP(a))
		return err == nil && len(rs) == 1 && rs[0].Type == unix.RTN_LOCAL
	}
	if !local("10.96.0.10") {
		t.Fatal("the kernel does not take kube-ipvs0's address as the node's own")
	}
	frontends := map[netip.Addr]bool{netip.MustParseAddr("10.96.0.10"): true}
	found := KubeIPVS(func() map[netip.Addr]bool { return frontends })
	if len(found) != 1 || !found[0].Breaking || found[0].Owner != "kube-proxy" || !strings.Contains(found[0].What, "1 of them sluice's frontends: 10.96.0.10") ||
		found[0].Where() != "kube-ipvs0" {
		t.Fatalf("found %v", found)
	}
	if err := found[0].remove(); err != nil {
		t.Fatal(err)
	}
	if local("10.96.0.10") || !local("10.96.9.9") {
		t.Errorf("after the cleanup 10.96.0.10 local %v (want not), 10.96.9.9 local %v (want kept)", local("10.96.0.10"), local("10.96.9.9"))
	}
	if found := KubeIPVS(func() map[netip.Addr]bool { return frontends }); len(found) != 1 || found[0].Breaking {
		t.Errorf("with none of sluice's addresses left: %v; want it dormant", found)
	}
}

// TestXDPLinkLeftoverRemoved: Cilium's XDP program attached through a bpf link (as newer
// Cilium attaches it) is removed through its link when netlink cannot detach it.
func TestXDPLinkLeftoverRemoved(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces and eBPF programs")
	nstest.Enter(t)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0-p"}); err != nil {
		t.Fatal(err)
	}
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "cil_xdp_entry", Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	l, err := link.AttachXDP(link.XDPOptions{Program: p, Interface: eth0.Attrs().Index, Flags: link.XDPGenericMode})
	if err != nil {
		t.Skipf("attaching XDP through a link: %v", err)
	}
	defer l.Close()
	eth0, _ = netlink.LinkByName("eth0")
	v := hookView{hook: Hook{Iface: "eth0", Ifindex: eth0.Attrs().Index}, mode: AttachTCX, xdp: eth0.Attrs().Xdp,
		ours: func(ebpf.ProgramID) bool { return false }, owner: programNames()}
	found := v.classify()
	if len(found) != 1 || found[0].Kind != KindXDP || !found[0].Removable() {
		t.Fatalf("found %v; want Cilium's XDP program, removable", found)
	}
	if err := found[0].remove(); err != nil {
		t.Fatalf("removing it: %v", err)
	}
	eth0, _ = netlink.LinkByName("eth0")
	if x := eth0.Attrs().Xdp; x != nil && x.Attached {
		t.Fatalf("xdp program %d still on eth0", x.ProgId)
	}
}
