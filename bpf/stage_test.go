package bpf

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/sluice-net/sluice/store"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The stage tests run the service stage as the agent runs it, against the real kernel: each
// test gets its own network namespace with host interfaces named as on a node (eth0, eth1)
// and workload interfaces (cali-w1, ...), a private bpffs for its pins, and a stage fed calc
// updates built by hand. Apply is called directly; the one test of Run's own behaviour waits
// on conditions with a bounded poll. Assertions read the kernel: the programs on each hook
// (BPF_PROG_QUERY), the pinned links and maps, and the maps' contents through OpenPinned.

const (
	stNodeName = "node-a"
	stPeerName = "node-b"
)

var (
	stHostIP = netip.MustParseAddr("192.0.2.11") // node-a, on eth0
	stPeerIP = netip.MustParseAddr("192.0.2.12") // node-b
	stPodA   = netip.MustParseAddr("10.65.0.5")  // on node-a, cali-w1
	stPodA2  = netip.MustParseAddr("10.65.0.6")  // on node-a, cali-w2
	stPodB   = netip.MustParseAddr("10.65.1.5")  // on node-b

	stSizes = MapSizes{Frontends: 64, Backends: 256, SourceRanges: 64, ClusterNets: 64, Affinity: 64, Conntrack: 1024}
)

// stEnv is one test's node: a network namespace the test's OS thread stays in, its
// interfaces, and a private bpffs holding the pin directory.
type stEnv struct {
	t   *testing.T
	ns  netns.NsHandle
	h   *netlink.Handle
	pin string
	// made are the interfaces the test made: all are deleted at the end, even on failure.
	made map[string]bool
}

// stNewEnv makes the namespace with eth0 (the node's address 192.0.2.11/24), eth1 and the
// workload interface cali-w1, and mounts bpffs. Everything is undone in cleanup, in order:
// stages closed (registered later, so run first), interfaces deleted, bpffs unmounted (which
// drops every pin left), the thread back in the test's namespace.
func stNewEnv(t *testing.T) *stEnv {
	t.Helper()
	nstest.NeedRoot(t, "the service stage (network namespaces, bpffs, eBPF programs)")
	ns := nstest.Enter(t)
	base := t.TempDir()
	fs := filepath.Join(base, "bpffs")
	if err := os.Mkdir(fs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", fs, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting bpffs on %s: %v", fs, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(fs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting bpffs: %v", err)
		}
	})
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	e := &stEnv{t: t, ns: ns, h: h, pin: filepath.Join(fs, "sluice"), made: map[string]bool{}}
	t.Cleanup(func() {
		defer h.Close()
		for name := range e.made {
			l, err := h.LinkByName(name)
			if err != nil {
				continue // deleted by the test
			}
			if err := h.LinkDel(l); err != nil {
				t.Errorf("deleting %s: %v", name, err)
			}
		}
	})
	e.hostIface("eth0", "192.0.2.11/24")
	e.hostIface("eth1", "198.51.100.11/24")
	e.workload("cali-w1")
	return e
}

func (e *stEnv) up(name string) netlink.Link {
	e.t.Helper()
	l, err := e.h.LinkByName(name)
	if err != nil {
		e.t.Fatalf("%s: %v", name, err)
	}
	if err := e.h.LinkSetUp(l); err != nil {
		e.t.Fatalf("setting %s up: %v", name, err)
	}
	return l
}

// hostIface adds a host interface with an address: one end of a veth whose other end
// (up-..., which no pattern matches) stands for the uplink (the dummy driver is not
// everywhere).
func (e *stEnv) hostIface(name, addr string) {
	e.t.Helper()
	e.made[name] = true
	peer := "up-" + name
	if err := e.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		e.t.Fatalf("adding %s: %v", name, err)
	}
	e.up(peer)
	l := e.up(name)
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.h.AddrAdd(l, a); err != nil {
		e.t.Fatalf("address %s on %s: %v", addr, name, err)
	}
}

// workload adds a workload interface: the host end of a veth whose other end stands for the
// pod (named pod-..., which no pattern matches).
func (e *stEnv) workload(name string) {
	e.t.Helper()
	peer := "pod" + strings.TrimPrefix(name, "cali")
	e.made[name] = true
	if err := e.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		e.t.Fatalf("adding %s: %v", name, err)
	}
	e.up(peer)
	e.up(name)
}

func (e *stEnv) del(name string) {
	e.t.Helper()
	l, err := e.h.LinkByName(name)
	if err != nil {
		e.t.Fatalf("%s: %v", name, err)
	}
	if err := e.h.LinkDel(l); err != nil {
		e.t.Fatalf("deleting %s: %v", name, err)
	}
}

func (e *stEnv) ifindex(name string) int {
	e.t.Helper()
	l, err := e.h.LinkByName(name)
	if err != nil {
		e.t.Fatalf("%s: %v", name, err)
	}
	return l.Attrs().Index
}

// stAttach is the attach mode the stage tests run in: SLUICE_BPF_ATTACH (auto, tcx or tc) as
// the agent reads it; `make test` runs them in both modes.
func stAttach() AttachMode {
	m, err := ParseAttachMode(os.Getenv("SLUICE_BPF_ATTACH"))
	if err != nil {
		panic("SLUICE_BPF_ATTACH: " + err.Error())
	}
	return m
}

func stConfig(pin string) StageConfig {
	return StageConfig{PinDir: pin, Sizes: stSizes, HostInterfaces: regexp.MustCompile(DefaultHostInterfaces),
		CgroupPath: "none", Timeouts: DefaultTimeouts, Attach: stAttach(), ipv4Programs: true,
		Services: Config{NodeName: stNodeName, VXLANPort: DefaultVXLANPort, VNI: DefaultVNI, PSNATMin: DefaultPSNATMin, PSNATMax: DefaultPSNATMax}}
}

// start starts a stage on the test's pin directory; it is closed at the end unless stop
// closed it before.
func (e *stEnv) start(cfg StageConfig) (*Stage, func()) {
	e.t.Helper()
	s, err := StartStage(cfg)
	if err != nil {
		e.t.Fatalf("starting the stage: %v", err)
	}
	var once sync.Once
	stop := func() { once.Do(s.Close) }
	e.t.Cleanup(stop)
	return s, stop
}

// apply runs one apply that must succeed and returns its writes.
func (e *stEnv) apply(s *Stage) int {
	e.t.Helper()
	n, err := s.Apply()
	if err != nil {
		e.t.Fatalf("apply: %v", err)
	}
	return n
}

// stWeb is a service with a cluster IP and a node port, one endpoint on this node (on
// cali-w1) and one on node-b.
func stWeb() []calc.Frontend {
	bes := []calc.Backend{{Addr: stPodA, Port: 8080, Node: stNodeName, NodeAddr: stHostIP},
		{Addr: stPodB, Port: 8080, Node: stPeerName, NodeAddr: stPeerIP}}
	return []calc.Frontend{
		{Key: calc.FrontendKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: store.ProtocolTCP},
			Kind: calc.FrontendClusterIP, Service: "default/web", ServiceID: 0x5eb0001, Backends: bes, LocalBackends: 1},
		{Key: calc.FrontendKey{Addr: netip.IPv4Unspecified(), Port: 30080, Protocol: store.ProtocolTCP},
			Kind: calc.FrontendNodePort, Service: "default/web", ServiceID: 0x5eb0001, Backends: bes, LocalBackends: 1},
	}
}

// stDNS is a UDP service with its endpoint on node-b.
func stDNS() calc.Frontend {
	return calc.Frontend{Key: calc.FrontendKey{Addr: netip.MustParseAddr("10.96.0.53"), Port: 53, Protocol: store.ProtocolUDP},
		Kind: calc.FrontendClusterIP, Service: "kube-system/dns", ServiceID: 0xd050001,
		Backends: []calc.Backend{{Addr: stPodB, Port: 53, Node: stPeerName, NodeAddr: stPeerIP}}}
}

// stClusterIP is a service "default/<name>" with one cluster IP port and a local endpoint.
func stClusterIP(name string, i int) calc.Frontend {
	return calc.Frontend{Key: calc.FrontendKey{Addr: netip.AddrFrom4([4]byte{10, 96, 1, byte(i)}), Port: 80, Protocol: store.ProtocolTCP},
		Kind: calc.FrontendClusterIP, Service: "default/" + name, ServiceID: 0x1000 + uint64(i), LocalBackends: 1,
		Backends: []calc.Backend{{Addr: stPodA, Port: 8080, Node: stNodeName, NodeAddr: stHostIP}}}
}

// stLong is a service of 20 endpoints on node-b: its list is long enough to be indexed.
func stLong() calc.Frontend {
	f := calc.Frontend{Key: calc.FrontendKey{Addr: netip.MustParseAddr("10.96.0.20"), Port: 80, Protocol: store.ProtocolTCP},
		Kind: calc.FrontendClusterIP, Service: "default/long", ServiceID: 0x10e0001, AffinityTimeout: 600}
	for i := range 20 {
		f.Backends = append(f.Backends, calc.Backend{Addr: netip.AddrFrom4([4]byte{10, 65, 2, byte(10 + i)}), Port: 8080, Node: stPeerName, NodeAddr: stPeerIP})
	}
	return f
}

// stUpdate is calc's whole desired state for the stage: the pool, the two nodes' addresses,
// the local workloads' routes (interface → pod address) and the frontends.
func stUpdate(weps map[string]netip.Addr, fronts ...calc.Frontend) *calc.Update {
	u := &calc.Update{Full: true}
	for _, n := range []calc.ClusterNet{{Prefix: netip.MustParsePrefix("10.65.0.0/16")},
		{Prefix: netip.PrefixFrom(stHostIP, 32), Host: true, Node: stNodeName},
		{Prefix: netip.PrefixFrom(stPeerIP, 32), Host: true, Node: stPeerName}} {
		u.Ops = append(u.Ops, calc.Op{ClusterNet: &n})
	}
	names := make([]string, 0, len(weps))
	for name := range weps {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		u.Ops = append(u.Ops, calc.Op{Route: &calc.Route{Dst: netip.PrefixFrom(weps[name], 32), Type: calc.RouteUnicast,
			Device: name, Reason: calc.ReasonLocalWorkload}})
	}
	for _, f := range fronts {
		u.Ops = append(u.Ops, calc.Op{Frontend: &f})
	}
	return u
}

func stStandard() *calc.Update {
	return stUpdate(map[string]netip.Addr{"cali-w1": stPodA}, append(stWeb(), stDNS())...)
}

// stFakeRender is what a driver over in-memory tables makes of the updates: the maps the
// kernel must hold.
func stFakeRender(t *testing.T, cfg StageConfig, us ...*calc.Update) string {
	t.Helper()
	ft, _ := MemTables(MapSizes{Frontends: 1 << 16, Backends: 1 << 16, SourceRanges: 1 << 16, ClusterNets: 1 << 16})
	svc := NewServices(ft, cfg.Services)
	for _, u := range us {
		svc.OnUpdate(u)
	}
	if err := svc.Apply(); err != nil {
		t.Fatalf("fake apply: %v", err)
	}
	r, err := Render(ft)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// kernelRender reads the pinned maps as an operator's tool does.
func (e *stEnv) kernelRender() string {
	e.t.Helper()
	p, err := OpenPinned(e.pin)
	if err != nil {
		e.t.Fatalf("opening the pinned maps: %v", err)
	}
	defer p.Close()
	r, err := Render(p.Tables())
	if err != nil {
		e.t.Fatalf("reading the pinned maps: %v", err)
	}
	return r
}

func (e *stEnv) settings() Settings {
	e.t.Helper()
	p, err := OpenPinned(e.pin)
	if err != nil {
		e.t.Fatal(err)
	}
	defer p.Close()
	st, err := p.Tables().Settings.Dump()
	if err != nil {
		e.t.Fatal(err)
	}
	return st[0]
}

func (e *stEnv) conntrack() map[ConntrackKey]ConntrackValue {
	e.t.Helper()
	p, err := OpenPinned(e.pin)
	if err != nil {
		e.t.Fatal(err)
	}
	defer p.Close()
	ct, err := p.Conntrack()
	if err != nil {
		e.t.Fatal(err)
	}
	return ct
}

// stAttached is one program on a hook as the kernel reports it.
type stAttached struct {
	Name string
	Prog ebpf.ProgramID
	Link link.ID
}

func stProgName(t *testing.T, id ebpf.ProgramID) string {
	t.Helper()
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		t.Fatalf("program %d: %v", id, err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.Name
}

func stProgID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// stMode is the mode the stage tests' stages attach in, auto resolved for this kernel.
func stMode(t *testing.T) AttachMode {
	t.Helper()
	m, err := stAttach().Resolve()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// hook returns the programs on an interface's direction, in the order they run: the TCX
// programs (where the kernel has TCX), then the classic bpf filters by priority.
func (e *stEnv) hook(iface string, egress bool) []stAttached {
	e.t.Helper()
	attach := ebpf.AttachTCXIngress
	if egress {
		attach = ebpf.AttachTCXEgress
	}
	var out []stAttached
	if HaveTCX() == nil {
		res, err := link.QueryPrograms(link.QueryOptions{Target: e.ifindex(iface), Attach: attach})
		if err != nil {
			e.t.Fatalf("querying %s: %v", iface, err)
		}
		for _, p := range res.Programs {
			lid, _ := p.LinkID()
			out = append(out, stAttached{Name: stProgName(e.t, p.ID), Prog: p.ID, Link: lid})
		}
	}
	fs, err := tcFilters(Hook{Iface: iface, Ifindex: e.ifindex(iface), Egress: egress})
	if err != nil {
		e.t.Fatal(err)
	}
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].Priority < fs[j].Priority })
	for _, f := range fs {
		out = append(out, stAttached{Name: stProgName(e.t, f.ProgID), Prog: f.ProgID})
	}
	return out
}

// wantHooks checks the programs on every hook of every interface of the namespace: the hooks
// named in want ("eth0 ingress") hold exactly those programs, every other hook none.
func (e *stEnv) wantHooks(want map[string][]string) {
	e.t.Helper()
	links, err := e.h.LinkList()
	if err != nil {
		e.t.Fatal(err)
	}
	got := map[string][]string{}
	for _, l := range links {
		for _, egress := range []bool{false, true} {
			h := Hook{Iface: l.Attrs().Name, Egress: egress}.String()
			for _, p := range e.hook(l.Attrs().Name, egress) {
				got[h] = append(got[h], p.Name)
			}
		}
	}
	keys := map[string]bool{}
	for k := range got {
		keys[k] = true
	}
	for k := range want {
		keys[k] = true
	}
	for k := range keys {
		if !slices.Equal(got[k], want[k]) {
			e.t.Errorf("%s runs %v, want %v", k, got[k], want[k])
		}
	}
}

// stStandardHooks are the programs the standard update attaches.
var stStandardHooks = map[string][]string{
	"eth0 ingress":    {"sl_from_host"},
	"eth0 egress":     {"sl_to_host"},
	"eth1 ingress":    {"sl_from_host"},
	"eth1 egress":     {"sl_to_host"},
	"cali-w1 ingress": {"sl_from_wep"},
	"cali-w1 egress":  {"sl_to_wep"},
}

// linkPins returns the link pins under <pin>/links with the ID of each pinned link.
func (e *stEnv) linkPins() map[string]link.ID {
	e.t.Helper()
	dir := filepath.Join(e.pin, "links")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]link.ID{}
	for _, en := range entries {
		l, err := link.LoadPinnedLink(filepath.Join(dir, en.Name()), nil)
		if err != nil {
			e.t.Errorf("pin %s: %v", en.Name(), err)
			continue
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			e.t.Fatal(err)
		}
		out[en.Name()] = info.ID
	}
	return out
}

// wantPinnedHooks checks that every hook in want runs one program through the link pinned
// as <iface>_<direction>, and that no other link is pinned. It returns the link IDs by hook.
//
// In tc mode it checks instead that each runs sluice's classic filter (its slot, its
// program) and that no link is pinned; the IDs it returns are then all 0.
func (e *stEnv) wantPinnedHooks(want map[string][]string) map[string]link.ID {
	e.t.Helper()
	pins := e.linkPins()
	if stMode(e.t) == AttachTC {
		for h := range want {
			iface, dir, _ := strings.Cut(h, " ")
			fs, err := tcFilters(Hook{Iface: iface, Ifindex: e.ifindex(iface), Egress: dir == "egress"})
			if err != nil {
				e.t.Fatal(err)
			}
			if len(fs) != 1 || !fs[0].ours() {
				e.t.Errorf("%s has classic filters %v, want sluice's alone", h, fs)
			}
		}
		if len(pins) > 0 {
			e.t.Errorf("links pinned in tc mode: %v", pins)
		}
		return map[string]link.ID{}
	}
	ids := map[string]link.ID{}
	for h := range want {
		iface, dir, _ := strings.Cut(h, " ")
		ps := e.hook(iface, dir == "egress")
		pin := pinSafe(iface) + "_" + dir
		if len(ps) != 1 {
			e.t.Errorf("%s runs %d programs", h, len(ps))
			continue
		}
		if pins[pin] != ps[0].Link {
			e.t.Errorf("%s runs link %d, pinned %s is link %d", h, ps[0].Link, pin, pins[pin])
		}
		ids[h] = ps[0].Link
		delete(pins, pin)
	}
	if len(pins) > 0 {
		e.t.Errorf("links pinned for no wanted hook: %v", pins)
	}
	return ids
}

// 1. The first apply writes exactly the desired entries, then attaches the programs through
// pinned links.
func TestStageFirstApply(t *testing.T) {
	e := stNewEnv(t)
	cfg := stConfig(e.pin)
	s, _ := e.start(cfg)
	u := stStandard()
	s.OnUpdate(u)
	if n := e.apply(s); n == 0 {
		t.Error("the first apply wrote nothing")
	}
	want := stFakeRender(t, cfg, u)
	got := e.kernelRender()
	if got != want {
		t.Errorf("kernel maps\n%s\nwant\n%s", got, want)
	}
	if p := e.indexProblems(); len(p) > 0 {
		t.Errorf("the kernel's backend index: %q", p)
	}
	for _, line := range []string{"frontend 0.0.0.0:30080/TCP service 0000000005eb0001", "frontend 10.96.0.10:0/any service 0000000005eb0001 address-only",
		"frontend 10.96.0.53:53/UDP service 000000000d050001", "cluster-net 192.0.2.11/32 node,self", "cluster-net 10.65.0.0/16 pool"} {
		if !strings.Contains(got, line) {
			t.Errorf("kernel maps lack %q:\n%s", line, got)
		}
	}
	st := e.settings()
	if st.HostIp != NetAddr(stHostIP) || st.TunnelMtu != 1450 || st.Vni != DefaultVNI || st.VxlanPort != NetPort(DefaultVXLANPort) {
		t.Errorf("settings %+v: want host %s, tunnel MTU 1450 (eth0's 1500 less 50), VNI %#x, port %d", st, stHostIP, DefaultVNI, DefaultVXLANPort)
	}
	e.wantHooks(stStandardHooks)
	e.wantPinnedHooks(stStandardHooks)
	if got := fmt.Sprint(s.Hooks()); got != "[cali-w1 egress cali-w1 ingress eth0 egress eth0 ingress eth1 egress eth1 ingress]" {
		t.Errorf("stage holds hooks %s", got)
	}
	// The programs on the hooks are this stage's.
	if p := e.hook("eth0", false); len(p) == 1 && p[0].Prog != stProgID(t, s.Objs.SlFromHost) {
		t.Errorf("eth0 runs program %d, the stage loaded %d", p[0].Prog, stProgID(t, s.Objs.SlFromHost))
	}
	// A second apply of the same state writes nothing.
	if n := e.apply(s); n != 0 {
		t.Errorf("an apply with nothing changed wrote %d entries", n)
	}
}

// 2. Nothing is written or attached before the first full update.
func TestStageNothingBeforeFullUpdate(t *testing.T) {
	e := stNewEnv(t)
	s, _ := e.start(stConfig(e.pin))
	u := stStandard()
	u.Full = false
	s.OnUpdate(u)
	if n := e.apply(s); n != 0 {
		t.Errorf("apply before the first full update wrote %d entries", n)
	}
	if got := e.kernelRender(); got != "" {
		t.Errorf("maps written before the first full update:\n%s", got)
	}
	if st := e.settings(); st != (Settings{}) {
		t.Errorf("settings written before the first full update: %+v", st)
	}
	e.wantHooks(nil)
	if pins := e.linkPins(); len(pins) != 0 {
		t.Errorf("links pinned before the first full update: %v", pins)
	}
	if h := s.Hooks(); len(h) != 0 {
		t.Errorf("hooks held before the first full update: %v", h)
	}
	// The full update then programs everything.
	s.OnUpdate(stStandard())
	e.apply(s)
	e.wantHooks(stStandardHooks)
}

// 3. A restart is invisible: the new stage adopts the maps (no write), swaps its programs
// into the same links (never detached), and the connections tracked before are still there.
func TestStageRestartInvisible(t *testing.T) {
	e := stNewEnv(t)
	cfg := stConfig(e.pin)
	s1, stop1 := e.start(cfg)
	s1.OnUpdate(stStandard())
	e.apply(s1)
	before := e.wantPinnedHooks(stStandardHooks)
	mapsBefore := e.kernelRender()
	now := Monotonic()
	fk, fv, rk, rv := pinnedFlow(now-5*uint64(time.Second), now-uint64(time.Second))
	for _, kv := range [][2]any{{&fk, &fv}, {&rk, &rv}} {
		if err := s1.Objs.SlCtV4.Put(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	oldProg := stProgID(t, s1.Objs.SlFromHost)
	stop1()
	// Stopped: the pins keep the programs on the hooks.
	e.wantHooks(stStandardHooks)

	s2, _ := e.start(cfg)
	s2.OnUpdate(stStandard())
	w0 := s2.Svc.Stats().Writes
	if n := e.apply(s2); n != 0 {
		t.Errorf("the restarted stage wrote %d entries", n)
	}
	if d := s2.Svc.Stats().Writes - w0; d != 0 {
		t.Errorf("the restarted stage's driver counted %d writes", d)
	}
	if got := e.kernelRender(); got != mapsBefore {
		t.Errorf("maps after the restart\n%s\nwant\n%s", got, mapsBefore)
	}
	after := e.wantPinnedHooks(stStandardHooks)
	for h, id := range before {
		if after[h] != id {
			t.Errorf("%s: link %d after the restart, %d before (detached and attached again)", h, after[h], id)
		}
	}
	if s2.att.Repairs != 0 {
		t.Errorf("the restart counted %d repairs", s2.att.Repairs)
	}
	newProg := stProgID(t, s2.Objs.SlFromHost)
	if p := e.hook("eth0", false); len(p) != 1 || p[0].Prog != newProg || newProg == oldProg {
		t.Errorf("eth0 runs %+v; the restarted stage's program is %d, the old one %d", p, newProg, oldProg)
	}
	ct := e.conntrack()
	if len(ct) != 2 || ct[fk] != fv || ct[rk] != rv {
		t.Errorf("connection table after the restart: %v", ct)
	}
}

// 4a. A program detached by someone else is attached again at the next apply and counted; a
// link pin removed by someone else is put back (the agent still holds the link).
func TestStageDriftProgramDetached(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (4 s): make test runs it")
	}
	t.Run("detached", func(t *testing.T) {
		e := stNewEnv(t)
		s, _ := e.start(stConfig(e.pin))
		s.OnUpdate(stStandard())
		e.apply(s)
		ids := e.wantPinnedHooks(stStandardHooks)
		for _, h := range []string{"eth0 ingress", "cali-w1 egress"} {
			if stMode(t) == AttachTC {
				// The classic filter deleted, as `tc filter del` would.
				iface, dir, _ := strings.Cut(h, " ")
				if err := delTCFilter(Hook{Iface: iface, Ifindex: e.ifindex(iface), Egress: dir == "egress"}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			l, err := link.NewFromID(ids[h])
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Detach(); err != nil {
				t.Fatalf("detaching %s: %v", h, err)
			}
			l.Close()
		}
		if p := e.hook("eth0", false); len(p) != 0 {
			t.Fatalf("eth0 still runs %v", p)
		}
		e.apply(s)
		e.wantHooks(stStandardHooks)
		again := e.wantPinnedHooks(stStandardHooks)
		for _, h := range []string{"eth0 ingress", "cali-w1 egress"} {
			if stMode(t) == AttachTCX && again[h] == ids[h] {
				t.Errorf("%s: still the detached link %d", h, ids[h])
			}
		}
		if again["eth1 ingress"] != ids["eth1 ingress"] {
			t.Error("eth1's link, which nobody touched, was replaced")
		}
		if s.att.Repairs != 2 {
			t.Errorf("%d repairs counted, want 2", s.att.Repairs)
		}
	})
	t.Run("IPv6 half", func(t *testing.T) {
		// The tail-call slots of the IPv6 programs emptied by hand: every hook would pass
		// IPv6 untouched. The next apply puts them back, counted as links repaired.
		e := stNewEnv(t)
		cfg := stConfig(e.pin)
		cfg.ipv4Programs = false
		s, _ := e.start(cfg)
		s.OnUpdate(stStandard())
		e.apply(s)
		before := s.Repairs().Links
		for _, i := range []uint32{0, 3} {
			if err := s.Objs.SlProgsV6.Delete(i); err != nil {
				t.Fatal(err)
			}
		}
		e.apply(s)
		for i, p := range []*ebpf.Program{s.Objs.SlFromHost6, s.Objs.SlFromWep6, s.Objs.SlToWep6, s.Objs.SlToHost6} {
			info, _ := p.Info()
			want, _ := info.ID()
			var have uint32
			if err := s.Objs.SlProgsV6.Lookup(uint32(i), &have); err != nil || ebpf.ProgramID(have) != want {
				t.Errorf("slot %d holds %d (%v), want program %d", i, have, err, want)
			}
		}
		if got := s.Repairs().Links - before; got != 2 {
			t.Errorf("%d links repaired, want 2", got)
		}
	})
	t.Run("unpinned", func(t *testing.T) {
		e := stNewEnv(t)
		if stMode(t) == AttachTC {
			t.Skip("tc mode: classic filters are held by the kernel, not by pins (TestStageTC covers its drift)")
		}
		cfg := stConfig(e.pin)
		s, stop := e.start(cfg)
		s.OnUpdate(stStandard())
		e.apply(s)
		ids := e.wantPinnedHooks(stStandardHooks)
		pin := filepath.Join(e.pin, "links", "eth0_ingress")
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unpin(); err != nil {
			t.Fatal(err)
		}
		l.Close()
		// The agent holds the link: the program stays, only the pin is gone.
		e.wantHooks(stStandardHooks)
		e.apply(s)
		if got := e.wantPinnedHooks(stStandardHooks); got["eth0 ingress"] != ids["eth0 ingress"] {
			t.Errorf("eth0 ingress: link %d, want the agent's %d pinned again", got["eth0 ingress"], ids["eth0 ingress"])
		}
		if s.att.Repairs != 1 {
			t.Errorf("%d repairs counted, want 1", s.att.Repairs)
		}
		// With the pin back, a restart keeps the same link.
		stop()
		e.wantHooks(stStandardHooks)
		s2, _ := e.start(cfg)
		s2.OnUpdate(stStandard())
		e.apply(s2)
		if got := e.wantPinnedHooks(stStandardHooks); got["eth0 ingress"] != ids["eth0 ingress"] {
			t.Errorf("after the restart eth0 ingress runs link %d, want %d", got["eth0 ingress"], ids["eth0 ingress"])
		}
	})
}

// 4b. Map entries changed, deleted or added by hand are put right by a resync.
func TestStageDriftMapEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	e := stNewEnv(t)
	cfg := stConfig(e.pin)
	s, _ := e.start(cfg)
	u := stUpdate(map[string]netip.Addr{"cali-w1": stPodA}, append(stWeb(), stDNS(), stLong())...)
	s.OnUpdate(u)
	e.apply(s)
	want := stFakeRender(t, cfg, u)

	m, err := ebpf.LoadPinnedMap(filepath.Join(e.pin, "sl_fe_v4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	np := FrontendMapKey(stWeb()[1].Key)
	dns := FrontendMapKey(stDNS().Key)
	alien := FrontendKey{Addr: NetAddr(netip.MustParseAddr("10.96.9.9")), Port: NetPort(99), Proto: ProtoTCP}
	var v FrontendValue
	if err := m.Lookup(&dns, &v); err != nil {
		t.Fatal(err)
	}
	v.Count = 0
	if err := m.Delete(&np); err != nil {
		t.Fatal(err)
	}
	if err := m.Put(&dns, &v); err != nil {
		t.Fatal(err)
	}
	if err := m.Put(&alien, &FrontendValue{ListId: 1, SvcId: 9, Count: 1}); err != nil {
		t.Fatal(err)
	}
	cn, err := ebpf.LoadPinnedMap(filepath.Join(e.pin, "sl_cnet_v4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	self := ClusterNetKey{Prefixlen: 32, Addr: NetAddr(stHostIP)}
	if err := cn.Delete(&self); err != nil {
		t.Fatal(err)
	}
	// The backend index: one entry lost, one stray.
	idx, err := ebpf.LoadPinnedMap(filepath.Join(e.pin, "sl_be_idx_v4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	var ik BackendIndex
	if err := idx.NextKey(nil, &ik); err != nil {
		t.Fatal(err)
	}
	if err := idx.Delete(&ik); err != nil {
		t.Fatal(err)
	}
	stray := BackendIndex{ListId: 0xbeef, Addr: NetAddr(netip.MustParseAddr("10.65.9.9")), Port: NetPort(80)}
	if err := idx.Put(&stray, uint32(2)); err != nil {
		t.Fatal(err)
	}
	if e.kernelRender() == want || len(e.indexProblems()) != 2 {
		t.Fatalf("the hand edits did not show: index %q", e.indexProblems())
	}
	s.Svc.QueueResync()
	if n := e.apply(s); n != 7 {
		t.Errorf("the resync wrote %d entries, want 7 (two frontends back, one deleted, one cluster net, a backend and its index entry, a stray index entry)", n)
	}
	if got := e.kernelRender(); got != want {
		t.Errorf("maps after the resync\n%s\nwant\n%s", got, want)
	}
	if p := e.indexProblems(); len(p) > 0 {
		t.Errorf("the backend index after the resync: %q", p)
	}
}

// indexProblems compares the pinned backend index with the pinned lists.
func (e *stEnv) indexProblems() []string {
	e.t.Helper()
	p, err := OpenPinned(e.pin)
	if err != nil {
		e.t.Fatal(err)
	}
	defer p.Close()
	be, err := p.Tables().Backends.Dump()
	if err != nil {
		e.t.Fatal(err)
	}
	idx, err := p.Tables().BackendIndex.Dump()
	if err != nil {
		e.t.Fatal(err)
	}
	return indexProblems(be, idx)
}

// 4c. A map pin removed by someone is put back: the same map, so a restart still finds the
// connections.
func TestStageDriftMapPin(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (3 s): make test runs it")
	}
	e := stNewEnv(t)
	cfg := stConfig(e.pin)
	s, stop := e.start(cfg)
	s.OnUpdate(stStandard())
	e.apply(s)
	now := Monotonic()
	fk, fv, rk, rv := pinnedFlow(now-5*uint64(time.Second), now-uint64(time.Second))
	for _, kv := range [][2]any{{&fk, &fv}, {&rk, &rv}} {
		if err := s.Objs.SlCtV4.Put(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"sl_ct_v4", "sl_fe_v4"} {
		if err := os.Remove(filepath.Join(e.pin, name)); err != nil {
			t.Fatal(err)
		}
	}
	e.apply(s)
	if s.Repins != 2 {
		t.Errorf("%d repins counted, want 2", s.Repins)
	}
	for name, m := range map[string]*ebpf.Map{"sl_ct_v4": s.Objs.SlCtV4, "sl_fe_v4": s.Objs.SlFeV4} {
		pm, err := ebpf.LoadPinnedMap(filepath.Join(e.pin, name), nil)
		if err != nil {
			t.Errorf("%s not pinned again: %v", name, err)
			continue
		}
		pinfo, _ := pm.Info()
		pm.Close()
		minfo, _ := m.Info()
		pid, _ := pinfo.ID()
		mid, _ := minfo.ID()
		if pid != mid {
			t.Errorf("%s pinned again as map %d, the stage's is %d", name, pid, mid)
		}
	}
	e.apply(s)
	if s.Repins != 2 {
		t.Errorf("%d repins counted after an apply with nothing removed, want 2", s.Repins)
	}
	stop()
	s2, _ := e.start(cfg)
	s2.OnUpdate(stStandard())
	if n := e.apply(s2); n != 0 {
		t.Errorf("the restart after the repin wrote %d entries", n)
	}
	if ct := e.conntrack(); len(ct) != 2 || ct[fk] != fv || ct[rk] != rv {
		t.Errorf("connection table after the repin and a restart: %v", ct)
	}
}

// TestStageDriftOnlyOthers: the map entries counted as drift are those a reread finds other
// than sluice left them, never the writes of an endpoint change that lands in the same apply
// as the periodic resync (#36): operators alert on sluice_drift_repairs_total. The stage's
// loop runs with a resync every 50 ms while an endpoint changes every 5 ms for a second;
// then one frontend is deleted by hand, and exactly that is counted.
func TestStageDriftOnlyOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	e := stNewEnv(t)
	cfg := stConfig(e.pin)
	cfg.MinInterval = 20 * time.Millisecond // each apply takes the changes of 20 ms
	cfg.ResyncInterval = 50 * time.Millisecond
	cfg.CleanupInterval = time.Hour
	s, _ := e.start(cfg)
	weps := map[string]netip.Addr{"cali-w1": stPodA}
	dns := func(i int) calc.Frontend {
		f := stDNS()
		f.Backends[0].Addr = netip.AddrFrom4([4]byte{10, 65, 1, byte(i % 2)})
		return f
	}
	s.OnUpdate(stUpdate(weps, append(stWeb(), dns(0))...))
	e.apply(s)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // the thread stays locked and ends with the goroutine
		if err := netns.Set(e.ns); err != nil {
			t.Errorf("entering the test's namespace: %v", err)
			return
		}
		s.Run(ctx)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	}()
	writes := s.Svc.Stats().Writes
	for i := 1; i <= 200; i++ {
		s.OnUpdate(stUpdate(weps, append(stWeb(), dns(i))...))
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the last change applied, a resync or two after it
	if w := s.Svc.Stats().Writes - writes; w < 20 {
		t.Fatalf("only %d writes for 200 endpoint changes", w)
	}
	if r := s.Repairs(); r.MapEntries != 0 {
		t.Errorf("200 endpoint changes under resyncs every 50 ms counted %d map entries as drift; want 0", r.MapEntries)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(e.pin, "sl_fe_v4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	np := FrontendMapKey(stWeb()[1].Key)
	if err := m.Delete(&np); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Repairs().MapEntries == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(150 * time.Millisecond) // more resyncs: counted once
	if r := s.Repairs(); r.MapEntries != 1 {
		t.Errorf("one frontend deleted by hand counted %d map entries as drift; want 1", r.MapEntries)
	}
	var v FrontendValue
	if err := m.Lookup(&np, &v); err != nil {
		t.Errorf("the deleted frontend was not put back: %v", err)
	}
}

// TestStageWorkloadGoneWhileAttaching: a workload interface deleted between the listing of
// the interfaces and the attach (a workload that lives a few seconds), whether new or held
// already, is neither an error (no warning, no backoff) nor drift (#36): before, the apply
// failed with "attach tcx link: no such device" and counted the held links as repaired.
func TestStageWorkloadGoneWhileAttaching(t *testing.T) {
	e := stNewEnv(t)
	s, _ := e.start(stConfig(e.pin))
	s.OnUpdate(stStandard())
	e.apply(s)
	e.wantPinnedHooks(stStandardHooks)
	before := s.Repairs()
	for _, c := range []struct {
		name  string
		iface string
	}{{"a new workload's interface", "cali-w9"}, {"a held workload's interface", "cali-w1"}} {
		if c.iface == "cali-w9" {
			e.workload("cali-w9")
			s.OnUpdate(stUpdate(map[string]netip.Addr{"cali-w1": stPodA, "cali-w9": netip.MustParseAddr("10.65.0.30")}, stWeb()...))
		}
		deleted := false
		s.att.beforeAttach = func(h Hook) {
			if h.Iface == c.iface && !deleted {
				deleted = true
				e.del(c.iface)
			}
		}
		_, err := s.Apply()
		s.att.beforeAttach = nil
		if !deleted {
			t.Fatalf("%s: never attached to", c.name)
		}
		if err != nil {
			t.Errorf("%s deleted while attaching: the apply failed: %v", c.name, err)
		}
		if got := s.Repairs(); got != before {
			t.Errorf("%s deleted while attaching: repairs %+v; want %+v (none)", c.name, got, before)
		}
		if ok, why := s.Status(); !ok {
			t.Errorf("%s deleted while attaching: the stage says %q", c.name, why)
		}
	}
	// The next apply lets go of both; the host interfaces keep theirs.
	e.apply(s)
	hostOnly := map[string][]string{"eth0 ingress": {"sl_from_host"}, "eth1 ingress": {"sl_from_host"},
		"eth0 egress": {"sl_to_host"}, "eth1 egress": {"sl_to_host"}}
	e.wantPinnedHooks(hostOnly)
}

// 4d. A workload interface that goes loses its links and pins; one that comes back (with a
// new ifindex) gets them again, also when it went and came back between two applies.
func TestStageWorkloadInterfaceGoneAndBack(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	e := stNewEnv(t)
	s, _ := e.start(stConfig(e.pin))
	s.OnUpdate(stStandard())
	e.apply(s)
	ids := e.wantPinnedHooks(stStandardHooks)
	hostOnly := map[string][]string{"eth0 ingress": {"sl_from_host"}, "eth1 ingress": {"sl_from_host"},
		"eth0 egress": {"sl_to_host"}, "eth1 egress": {"sl_to_host"}}

	e.del("cali-w1")
	e.apply(s)
	e.wantHooks(hostOnly)
	e.wantPinnedHooks(hostOnly)
	if got := fmt.Sprint(s.Hooks()); got != "[eth0 egress eth0 ingress eth1 egress eth1 ingress]" {
		t.Errorf("stage holds hooks %s", got)
	}
	for _, h := range []string{"cali-w1 ingress", "cali-w1 egress"} {
		if l, err := link.NewFromID(ids[h]); err == nil {
			l.Close()
			t.Errorf("%s: link %d still exists", h, ids[h])
		}
	}

	e.workload("cali-w1")
	e.apply(s)
	e.wantHooks(stStandardHooks)
	e.wantPinnedHooks(stStandardHooks)

	// Gone and back between two applies (a pod re-created under the same name).
	old := e.ifindex("cali-w1")
	e.del("cali-w1")
	e.workload("cali-w1")
	if e.ifindex("cali-w1") == old {
		t.Fatal("the re-created interface has the old ifindex")
	}
	e.apply(s)
	e.wantHooks(stStandardHooks)
	e.wantPinnedHooks(stStandardHooks)
	e.apply(s)
	e.wantPinnedHooks(stStandardHooks)
	if got := fmt.Sprint(s.Hooks()); got != "[cali-w1 egress cali-w1 ingress eth0 egress eth0 ingress eth1 egress eth1 ingress]" {
		t.Errorf("stage holds hooks %s", got)
	}

	// A route withdrawn while its interface stays: the interface is let go.
	s.OnUpdate(stUpdate(nil, append(stWeb(), stDNS())...))
	e.apply(s)
	e.wantHooks(hostOnly)
	e.wantPinnedHooks(hostOnly)
}

// 5. Turning the stage off leaves no pin and no program.
func TestStageRemoveAll(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (3 s): make test runs it")
	}
	e := stNewEnv(t)
	s, stop := e.start(stConfig(e.pin))
	s.OnUpdate(stStandard())
	e.apply(s)
	now := Monotonic()
	fk, fv, _, _ := pinnedFlow(now, now)
	if err := s.Objs.SlCtV4.Put(&fk, &fv); err != nil {
		t.Fatal(err)
	}
	e.wantHooks(stStandardHooks)
	if hooks, err := SluiceFilters(); err != nil || (len(hooks) == len(stStandardHooks)) != (stMode(t) == AttachTC) {
		t.Errorf("sluice's classic filters %v (%v) in %s mode", hooks, err, stMode(t))
	}
	stop()
	if err := RemoveAll(e.pin); err != nil {
		t.Fatalf("RemoveAll: %v", err)
	}
	if hooks, err := SluiceFilters(); err != nil || len(hooks) != 0 {
		t.Errorf("sluice's classic filters left after RemoveAll: %v (%v)", hooks, err)
	}
	entries, err := os.ReadDir(e.pin)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, en := range entries {
		left = append(left, en.Name())
	}
	if len(left) != 0 {
		t.Errorf("left in the pin directory: %v", left)
	}
	e.wantHooks(nil)
	if _, err := OpenPinned(e.pin); !errors.Is(err, ErrNotPinned) {
		t.Errorf("OpenPinned after RemoveAll: %v", err)
	}
	// Running it again (the agent restarted, still off) is fine.
	if err := RemoveAll(e.pin); err != nil {
		t.Errorf("RemoveAll again: %v", err)
	}
}

// stForeign loads a trivial tc program of "other software": it passes every packet on.
func stForeign(t *testing.T) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "foreign", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
	if err != nil {
		t.Fatalf("loading the foreign program: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// stClassicFilter adds a clsact qdisc and a classic tc bpf filter running p on ingress.
func (e *stEnv) stClassicFilter(iface string, p *ebpf.Program) {
	e.t.Helper()
	idx := e.ifindex(iface)
	q := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	if err := e.h.QdiscAdd(q); err != nil {
		e.t.Fatalf("adding clsact to %s: %v", iface, err)
	}
	f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.HANDLE_MIN_INGRESS, Handle: netlink.MakeHandle(0, 1),
		Protocol: unix.ETH_P_ALL, Priority: 1}, Fd: p.FD(), Name: "foreign", DirectAction: true}
	if err := e.h.FilterAdd(f); err != nil {
		e.t.Fatalf("adding a bpf filter to %s: %v", iface, err)
	}
}

func (e *stEnv) classicFilters(iface string) int {
	e.t.Helper()
	l, err := e.h.LinkByName(iface)
	if err != nil {
		e.t.Fatal(err)
	}
	fs, err := e.h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		e.t.Fatal(err)
	}
	return len(fs)
}

// 6. Other software's programs on a hook sluice uses are reported once, each breaking or
// dormant; programs whose owner cannot be recognised are never removed, with CleanConflicts
// neither (TestHookLeftoversTraffic removes recognisable ones and shows the traffic).
func TestStageConflicts(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	for _, clean := range []bool{false, true} {
		t.Run(fmt.Sprintf("clean=%v", clean), func(t *testing.T) {
			e := stNewEnv(t)
			foreign := stForeign(t)
			// A foreign TCX program too, where the kernel has TCX (6.6).
			tcx := HaveTCX() == nil
			if tcx {
				fl, err := link.AttachTCX(link.TCXOptions{Interface: e.ifindex("eth0"), Program: foreign, Attach: ebpf.AttachTCXIngress})
				if err != nil {
					t.Fatalf("attaching the foreign program: %v", err)
				}
				defer fl.Close()
			}
			e.stClassicFilter("eth0", foreign)
			fid := stProgID(t, foreign)

			var mu sync.Mutex
			var got []string
			cfg := stConfig(e.pin)
			cfg.CleanConflicts = clean
			cfg.OnConflict = func(c Conflict) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, c.String())
				if c.Err != nil || c.Removed {
					t.Errorf("conflict %s: removed %v, %v", c, c.Removed, c.Err)
				}
				if c.Breaks == "" || c.Fix == "" {
					t.Errorf("conflict %s says nothing of what it breaks (%q) or of its fix (%q)", c, c.Breaks, c.Fix)
				}
			}
			s, _ := e.start(cfg)
			s.OnUpdate(stStandard())
			e.apply(s)
			// The classic filter, added before sluice's at the same priority, runs after it
			// (and after sluice's TCX program's verdict): dormant either way. The TCX program
			// runs after sluice's (attached at the head) on the TCX path, and before sluice's
			// classic filter on the classic path.
			want := []string{"tc filter pref 1 handle 0x1 bpf foreign on eth0 ingress (dormant)"}
			if tcx {
				effect := "dormant"
				if stMode(t) == AttachTC {
					effect = "breaking"
				}
				want = append(want, fmt.Sprintf("tcx program %d foreign on eth0 ingress (%s)", fid, effect))
			}
			mu.Lock()
			sort.Strings(got)
			if !slices.Equal(got, want) {
				t.Errorf("conflicts reported %q, want %q", got, want)
			}
			got = nil
			mu.Unlock()

			var names []string
			for _, p := range e.hook("eth0", false) {
				names = append(names, p.Name)
			}
			// Sluice's own classic filter, in tc mode, is no conflict.
			if stMode(t) == AttachTC {
				// Left in place: the foreign TCX program, where there is one, runs first (TCX
				// before classic tc), then sluice's classic filter, added after the foreign
				// one at the same priority, then the foreign filter.
				want := []string{"sl_from_host", "foreign"}
				if tcx {
					want = append([]string{"foreign"}, want...)
				}
				if !slices.Equal(names, want) || e.classicFilters("eth0") != 2 {
					t.Errorf("eth0 ingress runs %v and %d classic filters, want %v and 2", names, e.classicFilters("eth0"), want)
				}
			} else if !slices.Equal(names, []string{"sl_from_host", "foreign", "foreign"}) || e.classicFilters("eth0") != 1 {
				// Left in place: sluice's TCX program at the head, then the foreign one; the
				// classic filter after both.
				t.Errorf("eth0 ingress runs %v and %d classic filters, want sluice's then the foreign one, and the filter", names, e.classicFilters("eth0"))
			}
			// Reported once, not at every apply.
			e.apply(s)
			mu.Lock()
			if len(got) != 0 {
				t.Errorf("reported again: %q", got)
			}
			mu.Unlock()
			// Gone: reported once more, as gone.
			if err := e.h.FilterDel(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: e.ifindex("eth0"), Parent: netlink.HANDLE_MIN_INGRESS,
				Handle: netlink.MakeHandle(0, 1), Protocol: unix.ETH_P_ALL, Priority: 1}}); err != nil {
				t.Fatal(err)
			}
			e.apply(s)
			mu.Lock()
			if want := []string{"tc filter pref 1 handle 0x1 bpf foreign on eth0 ingress (dormant) (gone)"}; !slices.Equal(got, want) {
				t.Errorf("after the filter went: %q, want %q", got, want)
			}
			mu.Unlock()
		})
	}
}

// 7. A frontend map too small: the apply fails naming the services and the option to raise,
// counts it, and leaves the services that were programmed alone; a restart with the larger
// size programs everything and keeps the rest.
func TestStageMapFull(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	e := stNewEnv(t)
	cfg := stConfig(e.pin)
	cfg.Sizes.Frontends = 16
	s, stop := e.start(cfg)
	first := stStandard() // 5 frontend entries
	s.OnUpdate(first)
	e.apply(s)
	before := e.kernelRender()
	e.wantHooks(stStandardHooks)

	// Eight more services of two entries each (the port and the cluster IP's address-only
	// entry): 21 entries for 16 places. A new workload comes too.
	fronts := append(stWeb(), stDNS())
	for i := range 8 {
		fronts = append(fronts, stClusterIP(fmt.Sprintf("svc-%d", i), i))
	}
	e.workload("cali-w2")
	full := stUpdate(map[string]netip.Addr{"cali-w1": stPodA, "cali-w2": stPodA2}, fronts...)
	s.OnUpdate(full)
	mf := s.Svc.Stats().MapFull
	_, err := s.Apply()
	if err == nil {
		t.Fatal("apply over a full frontend map succeeded")
	}
	for _, w := range []string{"bpf-map-size-frontends", "service default/svc-", "16 entries"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	if d := s.Svc.Stats().MapFull - mf; d < 5 {
		t.Errorf("%d map-full failures counted, want at least 5", d)
	}
	got := e.kernelRender()
	for _, line := range strings.Split(before, "\n") {
		if !strings.Contains(got, line) {
			t.Errorf("%q was lost", line)
		}
	}
	p, err := OpenPinned(e.pin)
	if err != nil {
		t.Fatal(err)
	}
	if n := p.Tables().Frontends.Len(); n != 16 {
		t.Errorf("%d frontend entries, want the map full with 16", n)
	}
	p.Close()
	// The services that fit work: the programs follow the workloads all the same.
	e.wantHooks(map[string][]string{"eth0 ingress": {"sl_from_host"}, "eth1 ingress": {"sl_from_host"},
		"eth0 egress": {"sl_to_host"}, "eth1 egress": {"sl_to_host"},
		"cali-w1 ingress": {"sl_from_wep"}, "cali-w1 egress": {"sl_to_wep"}, "cali-w2 ingress": {"sl_from_wep"}, "cali-w2 egress": {"sl_to_wep"}})

	// Restarted with the same size: the map still fails, and the programs found running are
	// swapped for the new stage's all the same.
	stop()
	s2, stop2 := e.start(cfg)
	s2.OnUpdate(full)
	if _, err := s2.Apply(); err == nil || !strings.Contains(err.Error(), "bpf-map-size-frontends") {
		t.Errorf("apply after a restart with the map still too small: %v", err)
	}
	if p := e.hook("eth0", false); len(p) != 1 || p[0].Prog != stProgID(t, s2.Objs.SlFromHost) {
		t.Errorf("eth0 runs %+v, want the restarted stage's program %d", p, stProgID(t, s2.Objs.SlFromHost))
	}

	// The fix the error names: a larger map, at the next start.
	stop2()
	cfg.Sizes.Frontends = 64
	var resized []string
	cfg.OnResized = func(m []string) { resized = m }
	s3, _ := e.start(cfg)
	// The option sizes the frontend map of both families.
	slices.Sort(resized)
	if !slices.Equal(resized, []string{"sl_fe_v4", "sl_fe_v6"}) {
		t.Errorf("resized %v, want sl_fe_v4 and sl_fe_v6", resized)
	}
	s3.OnUpdate(full)
	e.apply(s3)
	if got, want := e.kernelRender(), stFakeRender(t, cfg, full); got != want {
		t.Errorf("maps after the resize\n%s\nwant\n%s", got, want)
	}
}

// stFlow is one flow's entries in the connection table.
type stFlow struct {
	name string
	keys []ConntrackKey
	vals []ConntrackValue
}

func (f stFlow) put(t *testing.T, m *ebpf.Map) {
	t.Helper()
	for i := range f.keys {
		if err := m.Put(&f.keys[i], &f.vals[i]); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
	}
}

// stLocalFlow is a flow from a workload to a cluster IP served on this node: a forward and a
// reverse entry, last seen at seen with the given TCP state bits.
func stLocalFlow(name string, proto uint8, sport uint16, tcp uint8, seen uint64) stFlow {
	a := func(s string) uint32 { return NetAddr(netip.MustParseAddr(s)) }
	fk := ConntrackKey{Src: a("10.65.0.7"), Dst: a("10.96.0.10"), Sport: NetPort(sport), Dport: NetPort(80), Proto: proto}
	fv := ConntrackValue{Created: seen, LastSeen: seen, Type: ConntrackFwd, NatAddr: NetAddr(stPodA), NatPort: NetPort(8080), NatSport: NetPort(sport)}
	rk := PairKey(fk, fv)
	rv := ConntrackValue{Created: seen, LastSeen: seen, Type: ConntrackRev, Tcp: tcp, NatAddr: fk.Dst, NatPort: fk.Dport, NatSport: fk.Sport}
	return stFlow{name: name, keys: []ConntrackKey{fk, rk}, vals: []ConntrackValue{fv, rv}}
}

// 8. Connection cleanup judged at chosen times: each kind of flow lives exactly as long as its
// idle timeout, and a flow goes with its pair.
func TestStageConntrackCleanup(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	t.Run("cleaner-program", func(t *testing.T) { testConntrackCleanup(t, false) })
	// Kernels before 5.14 have no syscall programs: user space deletes, the same entries.
	t.Run("user-space", func(t *testing.T) { testConntrackCleanup(t, true) })
}

func testConntrackCleanup(t *testing.T, userSpace bool) {
	e := stNewEnv(t)
	s, _ := e.start(stConfig(e.pin))
	s.OnUpdate(stStandard())
	e.apply(s)
	if userSpace {
		s.CT.Cleaner, s.CT.Cleaner6 = nil, nil
	}
	// Idle timeouts alone: every endpoint counts as live here (TestStageConntrackStale
	// judges flows whose endpoint went).
	s.CT.Live = func(netip.Addr, uint16) bool { return true }
	sec := uint64(time.Second)
	to := DefaultTimeouts
	est := uint64(to.TCPEstablished)
	// The clock is the test's: entries are stamped and judged at chosen times, far enough
	// from zero for last-seen times days in the past (a machine up for minutes would
	// otherwise have them wrap). No packet touches them: the namespace carries no IPv4 traffic.
	t0 := 10 * est

	// Forwarded to node-b (this node is the ingress node): answered, last seen at t0.
	fk, fv, rk, rv := pinnedFlow(t0-60*sec, t0)
	fwd := stFlow{name: "forwarded", keys: []ConntrackKey{fk, rk}, vals: []ConntrackValue{fv, rv}}
	// Forwarded the same way, idle longer than the established timeout at the first cleanup.
	ofk, ofv, _, orv := pinnedFlow(t0-est-60*sec, t0-est-2*sec)
	ofk.Sport, ofv.NatSport = NetPort(40001), NetPort(20002)
	ork := PairKey(ofk, ofv)
	orv.NatSport = ofk.Sport
	old := stFlow{name: "forwarded, idle too long", keys: []ConntrackKey{ofk, ork}, vals: []ConntrackValue{ofv, orv}}
	// A flow forwarded here from node-c (this node is the backend's node): a tunnel entry.
	tk := ConntrackKey{Src: NetAddr(stPodA), Dst: NetAddr(netip.MustParseAddr("203.0.113.9")), Sport: NetPort(8080), Dport: NetPort(20003), Proto: ProtoTCP}
	tun := stFlow{name: "tunnel", keys: []ConntrackKey{tk}, vals: []ConntrackValue{{Created: t0 - 60*sec, LastSeen: t0, Type: ConntrackTun,
		Tcp: TCPSyn | TCPReplied, NatAddr: NetAddr(netip.MustParseAddr("192.0.2.13"))}}}
	syn := stLocalFlow("SYN only", ProtoTCP, 31000, TCPSyn, t0)
	opening := stLocalFlow("SYN-ACK, no ACK", ProtoTCP, 31005, TCPSyn|TCPReplied|TCPOpening, t0)
	udp := stLocalFlow("UDP", ProtoUDP, 31001, 0, t0)
	udpAnswered := stLocalFlow("UDP answered", ProtoUDP, 31002, TCPReplied, t0)
	// Forward entries whose reverse entry never came (a half-made pair): one older than the
	// grace period at the first cleanup, one younger.
	orphan := stLocalFlow("half-made", ProtoTCP, 31003, TCPSyn, t0-uint64(to.Grace))
	orphan.keys, orphan.vals = orphan.keys[:1], orphan.vals[:1]
	young := stLocalFlow("half-made, young", ProtoTCP, 31004, TCPSyn, t0)
	young.keys, young.vals = young.keys[:1], young.vals[:1]

	flows := []stFlow{fwd, old, tun, syn, opening, udp, udpAnswered, orphan, young}
	for _, f := range flows {
		f.put(t, s.Objs.SlCtV4)
	}
	alive := func(want ...string) {
		t.Helper()
		ct := e.conntrack()
		n := 0
		for _, f := range flows {
			in := slices.Contains(want, f.name)
			for i, k := range f.keys {
				v, ok := ct[k]
				switch {
				case in && !ok:
					t.Errorf("%s: entry %d gone", f.name, i)
				case in && v != f.vals[i]:
					t.Errorf("%s: entry %d changed to %+v", f.name, i, v)
				case !in && ok:
					t.Errorf("%s: entry %d still there", f.name, i)
				}
				if in {
					n++
				}
			}
		}
		if len(ct) != n {
			t.Errorf("%d entries, want %d", len(ct), n)
		}
	}
	clean := func(at uint64) CleanStats {
		t.Helper()
		st, err := s.CT.Clean(at)
		if err != nil {
			t.Fatalf("cleaning at t0%+ds: %v", int64(at-t0)/int64(sec), err)
		}
		return st
	}

	st := clean(t0 + sec)
	alive("forwarded", "tunnel", "SYN only", "SYN-ACK, no ACK", "UDP", "UDP answered", "half-made, young")
	// Deleted counts requests: a reverse entry's pair goes with it.
	if st.Expired != 2 || st.Deleted != 2 || st.Forwards != 3 || st.Entries != 15 {
		t.Errorf("first pass %+v: want 2 expired and deleted (the idle pair, the old half-made one), 3 forwarded flows of 15 entries", st)
	}
	clean(t0 + uint64(to.UDP) + sec)
	alive("forwarded", "tunnel", "SYN only", "SYN-ACK, no ACK", "UDP answered")
	if to.TCPSyn >= to.UDPStream {
		t.Fatalf("the handshake timeout %v is not below answered UDP's %v", to.TCPSyn, to.UDPStream)
	}
	clean(t0 + uint64(to.TCPSyn) + sec)
	alive("forwarded", "tunnel", "UDP answered")
	clean(t0 + uint64(to.UDPStream) + sec)
	alive("forwarded", "tunnel")
	// Any number of passes before the established timeout leave the forwarded flows alone.
	for i := uint64(0); i < 50; i++ {
		clean(t0 + uint64(to.TCPSyn) + i*(est-uint64(to.TCPSyn))/50)
	}
	clean(t0 + est)
	alive("forwarded", "tunnel")
	st = clean(t0 + est + sec)
	alive()
	if st.Expired != 2 || st.Deleted != 2 || st.Forwards != 2 {
		t.Errorf("last pass %+v: want the two forwarded flows (a pair, a tunnel entry) expired and deleted", st)
	}
}

// Run follows interfaces as they come (the link subscription, not the periodic resync) and
// cleans the connection table on its own interval.
func TestStageRunFollowsInterfaces(t *testing.T) {
	e := stNewEnv(t)
	cfg := stConfig(e.pin)
	cfg.MinInterval = 5 * time.Millisecond
	cfg.ResyncInterval = time.Hour // a new interface must be found without it
	cfg.CleanupInterval = 20 * time.Millisecond
	cfg.Timeouts.UDP = 100 * time.Millisecond
	cleaned := make(chan CleanStats, 100)
	cfg.OnClean = func(st CleanStats, err error) {
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		select {
		case cleaned <- st:
		default:
		}
	}
	s, _ := e.start(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Run in the test's namespace: the thread stays locked and ends with the goroutine.
		runtime.LockOSThread()
		if err := netns.Set(e.ns); err != nil {
			t.Errorf("entering the test's namespace: %v", err)
			return
		}
		s.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	attached := func(iface string) func() bool {
		return func() bool {
			in, eg := e.hook(iface, false), e.hook(iface, true)
			return len(in) == 1 && in[0].Name == "sl_from_wep" && len(eg) == 1 && eg[0].Name == "sl_to_wep"
		}
	}
	s.OnUpdate(stUpdate(map[string]netip.Addr{"cali-w1": stPodA, "cali-w2": stPodA2}, append(stWeb(), stDNS())...))
	waitFor("cali-w1 attached", attached("cali-w1"))
	e.workload("cali-w2")
	waitFor("cali-w2 attached", attached("cali-w2"))
	if stMode(t) == AttachTCX {
		waitFor("cali-w2 pinned", func() bool { _, ok := e.linkPins()["cali-w2_egress"]; return ok })
	}

	// Cleanup runs on the agent's clock: an unanswered UDP flow idle for longer than its
	// timeout goes.
	f := stLocalFlow("old", ProtoUDP, 31000, 0, Monotonic()-uint64(time.Second))
	f.put(t, s.Objs.SlCtV4)
	waitFor("the idle flow cleaned", func() bool { return len(e.conntrack()) == 0 })
	waitFor("a cleanup reported", func() bool {
		select {
		case st := <-cleaned:
			return st.Entries == 0
		default:
			return false
		}
	})
	if !s.Alive(time.Minute) {
		t.Error("the loop is not alive")
	}
}

// Socket programs pinned beside the interface links keep their pins through applies: a
// restart finds them (the same links), and RemoveAll detaches them.
func TestStageSocketHookPins(t *testing.T) {
	e := stNewEnv(t)
	if _, err := NetnsCookie(); errors.Is(err, unix.ENOPROTOOPT) {
		t.Skip("no SO_NETNS_COOKIE (before Linux 5.14): sluiced leaves the socket programs off there (TestStageWithoutNetnsCookie)")
	}
	cg := stCgroup(t)
	cfg := stConfig(e.pin)
	cfg.CgroupPath = cg
	t.Cleanup(func() {
		// After the stages closed: detach, before the cgroup is removed.
		if err := RemoveAll(e.pin); err != nil {
			t.Errorf("RemoveAll: %v", err)
		}
	})
	query := func() []stAttached {
		t.Helper()
		d, err := os.Open(cg)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		var out []stAttached
		for _, a := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP4Recvmsg} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: int(d.Fd()), Attach: a})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range res.Programs {
				out = append(out, stAttached{Name: stProgName(t, p.ID), Prog: p.ID})
			}
		}
		return out
	}
	s, stop := e.start(cfg)
	s.OnUpdate(stStandard())
	e.apply(s)
	e.apply(s)
	pins := e.linkPins()
	for _, h := range []string{"cgroup_connect4", "cgroup_sendmsg4", "cgroup_recvmsg4"} {
		if _, ok := pins[h]; !ok {
			t.Errorf("%s not pinned after two applies (pins %v)", h, pins)
		}
	}
	if got := query(); len(got) != 3 {
		t.Errorf("cgroup runs %v, want the three socket programs", got)
	}
	stop()
	s2, _ := e.start(cfg)
	s2.OnUpdate(stStandard())
	e.apply(s2)
	again := e.linkPins()
	for _, h := range []string{"cgroup_connect4", "cgroup_sendmsg4", "cgroup_recvmsg4"} {
		if again[h] == 0 || again[h] != pins[h] {
			t.Errorf("%s: link %d after the restart, %d before", h, again[h], pins[h])
		}
	}
	if got := query(); len(got) != 3 {
		t.Errorf("after the restart the cgroup runs %v, want the three socket programs", got)
	}
}

// TestStageConntrackStale: what the cleaner does with flows to an endpoint no service names
// any more (#36), as users of kube-proxy rely on: an established TCP connection keeps its
// endpoint (the kernel conntrack keeps kube-proxy's translation while the endpoint answers),
// unless its address is vacant (its pod deleted: the connection goes, and its next segment
// meets a reset); a TCP handshake and a UDP flow go at once, so the next SYN or datagram
// meets a live endpoint. Flows to endpoints in use, or named by the slice while terminating,
// stay.
func TestStageConntrackStale(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	e := stNewEnv(t)
	cfg := stConfig(e.pin)
	vacant := netip.MustParseAddr("10.65.0.98") // a deleted pod's address
	cfg.Vacant = func(a netip.Addr) bool { return a == vacant }
	s, _ := e.start(cfg)
	web := stWeb()
	// stPodA:8080 is in use; 10.65.0.9:8080 is named by the slice but not used (terminating
	// while a ready endpoint exists).
	draining := netip.AddrPortFrom(netip.MustParseAddr("10.65.0.9"), 8080)
	for i := range web {
		web[i].Present = []netip.AddrPort{netip.AddrPortFrom(stPodA, 8080), netip.AddrPortFrom(stPodB, 8080), draining}
	}
	u := stUpdate(map[string]netip.Addr{"cali-w1": stPodA}, web...)
	s.OnUpdate(u)
	e.apply(s)
	now := Monotonic()
	a := func(s string) uint32 { return NetAddr(netip.MustParseAddr(s)) }
	established, opening := uint8(TCPSyn|TCPReplied), uint8(TCPSyn)
	flow := func(name string, proto uint8, state uint8, backend netip.AddrPort, sport uint16) stFlow {
		fk := ConntrackKey{Src: a("10.65.0.7"), Dst: a("10.96.0.10"), Sport: NetPort(sport), Dport: NetPort(80), Proto: proto}
		fv := ConntrackValue{Created: now, LastSeen: now, Type: ConntrackFwd, NatAddr: NetAddr(backend.Addr()), NatPort: NetPort(backend.Port()), NatSport: NetPort(sport)}
		rk := PairKey(fk, fv)
		rv := ConntrackValue{Created: now, LastSeen: now, Type: ConntrackRev, Tcp: state, NatAddr: fk.Dst, NatPort: fk.Dport, NatSport: fk.Sport}
		return stFlow{name: name, keys: []ConntrackKey{fk, rk}, vals: []ConntrackValue{fv, rv}}
	}
	removed := netip.AddrPortFrom(netip.MustParseAddr("10.65.0.99"), 8080) // left its service, still answering
	flows := []struct {
		f    stFlow
		kept bool
	}{
		{flow("in use", ProtoTCP, established, netip.AddrPortFrom(stPodA, 8080), 41000), true},
		{flow("draining", ProtoTCP, established, draining, 41001), true},
		{flow("removed, established", ProtoTCP, established, removed, 41002), true},
		{flow("removed, handshake", ProtoTCP, opening|TCPReplied|(1<<7), removed, 41003), false},
		{flow("removed, UDP", ProtoUDP, TCPReplied, removed, 41004), false},
		{flow("removed, vacant", ProtoTCP, established, netip.AddrPortFrom(vacant, 8080), 41005), false},
	}
	for _, f := range flows {
		f.f.put(t, s.Objs.SlCtV4)
	}
	check := func(when string, st CleanStats, err error, stale int, kept func(i int) bool) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		ct := e.conntrack()
		for i, f := range flows {
			_, fwd := ct[f.f.keys[0]]
			_, rev := ct[f.f.keys[1]]
			if want := kept(i); fwd != want || rev != want {
				t.Errorf("%s: the %s flow's entries: forward %v, reverse %v; want %v", when, f.f.name, fwd, rev, want)
			} else if !want && (fwd || rev) {
				t.Errorf("%s: the %s flow half deleted", when, f.f.name)
			}
		}
		if st.Stale != stale {
			t.Errorf("%s: %d stale flows counted; want %d", when, st.Stale, stale)
		}
	}
	st, err := s.CT.Clean(now)
	check("after a cleanup", st, err, 3, func(i int) bool { return flows[i].kept })
	for _, f := range flows {
		if !f.kept {
			f.f.put(t, s.Objs.SlCtV4) // back, for the sweep
		}
	}
	n, err := s.CT.SweepStale()
	if want := 2 * 3; n != want || err != nil {
		t.Errorf("the sweep deleted %d entries, %v; want %d (three flows, both entries)", n, err, want)
	}
	check("after a sweep", CleanStats{Stale: 3}, nil, 3, func(i int) bool { return flows[i].kept })

	// The draining endpoint leaves the slice: its established connection stays, as the one
	// to the removed endpoint did.
	for i := range web {
		web[i].Present = web[i].Present[:2]
	}
	s.OnUpdate(stUpdate(map[string]netip.Addr{"cali-w1": stPodA}, web...))
	st, err = s.CT.Clean(now)
	check("after the draining endpoint left", st, err, 0, func(i int) bool { return flows[i].kept })

	// Its pod is deleted: its address vacant, the connection goes.
	vacant = draining.Addr()
	st, err = s.CT.Clean(now)
	check("after the draining endpoint's pod went", st, err, 1, func(i int) bool { return flows[i].kept && i != 1 })
}

// Nothing is written before this node's own address is known: an agent whose view lacks its
// node would otherwise erase every node port for a moment (Calico #12192).
func TestStageWaitsForNodeAddress(t *testing.T) {
	e := stNewEnv(t)
	s, _ := e.start(stConfig(e.pin))
	full := stStandard()
	var without calc.Update
	without.Full = true
	for _, op := range full.Ops {
		if op.ClusterNet != nil && op.ClusterNet.Node == stNodeName {
			continue
		}
		without.Ops = append(without.Ops, op)
	}
	s.OnUpdate(&without)
	if n, err := s.Apply(); !errors.Is(err, ErrNoNodeAddress) || n != 0 {
		t.Fatalf("apply without the node's address: %d writes, %v; want none and ErrNoNodeAddress", n, err)
	}
	if fe, err := s.Svc.t.Frontends.Dump(); err != nil || len(fe) != 0 {
		t.Fatalf("frontends written before the node's address was known: %d, %v", len(fe), err)
	}
	if hooks := s.Hooks(); len(hooks) != 0 {
		t.Fatalf("programs attached before the node's address was known: %v", hooks)
	}
	s.OnUpdate(full)
	e.apply(s)
	if fe, err := s.Svc.t.Frontends.Dump(); err != nil || len(fe) == 0 {
		t.Fatalf("no frontends once the address is known: %v", err)
	}
}

// stTCEvents records the classic filter events of the test's namespace (RTNLGRP_TC) until
// stop: the filters made (RTM_NEWTFILTER) and deleted (RTM_DELTFILTER) at sluice's slot.
func stTCEvents(t *testing.T) (stop func() (made, deleted int)) {
	t.Helper()
	sock, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_TC)
	if err != nil {
		t.Fatalf("subscribing to tc events: %v", err)
	}
	if err := sock.SetReceiveTimeout(&unix.Timeval{Usec: 100000}); err != nil {
		t.Fatal(err)
	}
	var made, deleted int
	done := make(chan struct{})
	var quit atomicBool
	go func() {
		defer close(done)
		for {
			msgs, _, err := sock.Receive()
			if err != nil {
				// The timeout: nothing queued. Stopped, every event is counted.
				if quit.get() {
					return
				}
				continue
			}
			for _, m := range msgs {
				if len(m.Data) < 20 {
					continue
				}
				handle := nl.NativeEndian().Uint32(m.Data[8:12])
				prio := nl.NativeEndian().Uint32(m.Data[16:20]) >> 16
				if handle != TCHandle || prio != TCPriority {
					continue
				}
				switch m.Header.Type {
				case unix.RTM_NEWTFILTER:
					made++
				case unix.RTM_DELTFILTER:
					deleted++
				}
			}
		}
	}()
	return func() (int, int) {
		quit.set()
		<-done
		sock.Close()
		return made, deleted
	}
}

type atomicBool struct {
	mu sync.Mutex
	v  bool
}

func (b *atomicBool) set() { b.mu.Lock(); b.v = true; b.mu.Unlock() }
func (b *atomicBool) get() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.v
}

// TestStageTC covers what only the classic tc path does, in both test passes: a restart
// replaces each filter's program in place (the kernel says so: filters made, none deleted,
// and the hooks run the new stage's programs); another program's filter at sluice's slot is
// refused by name and left; the service stage switched from TCX to tc and back leaves only
// the current mode's objects (where the kernel has TCX).
func TestStageTC(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (6 s): make test runs it")
	}
	t.Run("restart-in-place", func(t *testing.T) {
		e := stNewEnv(t)
		cfg := stConfig(e.pin)
		cfg.Attach = AttachTC
		s1, stop1 := e.start(cfg)
		s1.OnUpdate(stStandard())
		e.apply(s1)
		e.wantHooks(stStandardHooks)
		old := stProgID(t, s1.Objs.SlFromHost)
		stop1()
		e.wantHooks(stStandardHooks) // the kernel holds the filters

		events := stTCEvents(t)
		s2, _ := e.start(cfg)
		s2.OnUpdate(stStandard())
		e.apply(s2)
		made, deleted := events()
		if made != len(stStandardHooks) || deleted != 0 {
			t.Errorf("the restart made %d filters and deleted %d at sluice's slot, want %d replaced in place and none deleted", made, deleted, len(stStandardHooks))
		}
		e.wantHooks(stStandardHooks)
		if p := e.hook("eth0", false); len(p) != 1 || p[0].Prog != stProgID(t, s2.Objs.SlFromHost) || p[0].Prog == old {
			t.Errorf("eth0 ingress runs %+v after the restart; the new stage's program is %d, the old one %d", p, stProgID(t, s2.Objs.SlFromHost), old)
		}
		if s2.att.Repairs != 0 {
			t.Errorf("the restart counted %d repairs", s2.att.Repairs)
		}
		// Nothing changed: another apply makes no filter.
		events = stTCEvents(t)
		e.apply(s2)
		if made, deleted := events(); made != 0 || deleted != 0 {
			t.Errorf("an apply with nothing changed made %d and deleted %d filters", made, deleted)
		}
	})
	t.Run("foreign-at-our-slot", func(t *testing.T) {
		e := stNewEnv(t)
		foreign := stForeign(t)
		h := Hook{Iface: "eth0", Ifindex: e.ifindex("eth0")}
		if err := ensureClsact(h.Ifindex); err != nil {
			t.Fatal(err)
		}
		if err := setTCFilter(h, foreign, "foreign"); err != nil {
			t.Fatal(err)
		}
		cfg := stConfig(e.pin)
		cfg.Attach = AttachTC
		s, _ := e.start(cfg)
		s.OnUpdate(stStandard())
		_, err := s.Apply()
		if err == nil || !strings.Contains(err.Error(), "tc filter pref 1 handle 0x5c1 bpf foreign") {
			t.Errorf("apply: %v, want the foreign filter at sluice's slot named", err)
		}
		if ok, why := s.Status(); ok || !strings.Contains(why, "foreign") {
			t.Errorf("status %v %q, want not ready naming the foreign filter", ok, why)
		}
		if p := e.hook("eth0", false); len(p) != 1 || p[0].Name != "foreign" {
			t.Errorf("eth0 ingress runs %+v, want the foreign filter left", p)
		}
		if p := e.hook("eth1", false); len(p) != 1 || p[0].Name != "sl_from_host" {
			t.Errorf("eth1 ingress runs %+v, want sluice's filter (one hook's failure is contained)", p)
		}
	})
	t.Run("mode-switch", func(t *testing.T) {
		if err := HaveTCX(); err != nil {
			t.Skip(err)
		}
		e := stNewEnv(t)
		cfg := stConfig(e.pin)
		for _, mode := range []AttachMode{AttachTCX, AttachTC, AttachTCX} {
			cfg.Attach = mode
			s, stop := e.start(cfg)
			s.OnUpdate(stStandard())
			e.apply(s)
			e.wantHooks(stStandardHooks)
			pins := e.linkPins()
			filters := 0
			for _, iface := range []string{"eth0", "eth1", "cali-w1"} {
				for _, eg := range []bool{false, true} {
					fs, err := tcFilters(Hook{Iface: iface, Ifindex: e.ifindex(iface), Egress: eg})
					if err != nil {
						t.Fatal(err)
					}
					filters += len(fs)
				}
			}
			if mode == AttachTC && (len(pins) != 0 || filters != 6) {
				t.Errorf("tc mode after tcx: %d link pins and %d classic filters, want 0 and 6", len(pins), filters)
			}
			if mode == AttachTCX && (len(pins) != 6 || filters != 0) {
				t.Errorf("tcx mode: %d link pins and %d classic filters, want 6 and 0", len(pins), filters)
			}
			stop()
		}
	})
}

// TestLoadWithoutSyscallPrograms: on a kernel without syscall programs (before 5.14, stood in
// for by the probe) every program but the cleaner loads, and the stage programs its maps,
// attaches, and cleans the connection table from user space.
func TestLoadWithoutSyscallPrograms(t *testing.T) {
	e := stNewEnv(t)
	probe := haveSyscallPrograms
	haveSyscallPrograms = func() error { return ebpf.ErrNotSupported }
	defer func() { haveSyscallPrograms = probe }()
	s, _ := e.start(stConfig(e.pin))
	if s.Objs.SlCtClean != nil || s.CT.Cleaner != nil || s.Objs.SlCtClean6 != nil || s.CT.Cleaner6 != nil {
		t.Error("a cleaner program was loaded")
	}
	for name, p := range map[string]*ebpf.Program{"sl_from_host": s.Objs.SlFromHost, "sl_to_host": s.Objs.SlToHost,
		"sl_from_wep": s.Objs.SlFromWep, "sl_to_wep": s.Objs.SlToWep, "sl_sock_connect4": s.Objs.SlSockConnect4,
		"sl_sock_sendmsg4": s.Objs.SlSockSendmsg4, "sl_sock_recvmsg4": s.Objs.SlSockRecvmsg4} {
		if p == nil {
			t.Errorf("%s not loaded", name)
		}
	}
	s.OnUpdate(stStandard())
	e.apply(s)
	e.wantHooks(stStandardHooks)
	s.CT.Live = func(netip.Addr, uint16) bool { return true }
	now := Monotonic()
	f := stLocalFlow("old", ProtoUDP, 31000, 0, now)
	f.put(t, s.Objs.SlCtV4)
	st, err := s.CT.Clean(now + uint64(DefaultTimeouts.UDP) + uint64(time.Second))
	if err != nil || st.Deleted != 1 || len(e.conntrack()) != 0 {
		t.Errorf("clean: %+v %v, %d entries left; want the idle flow deleted from user space", st, err, len(e.conntrack()))
	}
}

// stCgroup makes a cgroup for the test under the cgroup v2 root, mounting a private hierarchy
// where none is (cgroup v1 hosts, a bare VM) as sluiced would; all removed at the end, after
// the cleanups the test registers later.
func stCgroup(t *testing.T) string {
	t.Helper()
	root, err := CgroupV2Root()
	if errors.Is(err, ErrNoCgroup2) {
		root = filepath.Join(t.TempDir(), "cgroup2")
		if err := os.Mkdir(root, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("cgroup2", root, "cgroup2", 0, ""); err != nil {
			t.Fatalf("mounting cgroup2: %v", err)
		}
		t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	} else if err != nil {
		t.Fatal(err)
	}
	cg, err := os.MkdirTemp(root, "sluice-test-")
	if err != nil {
		t.Fatalf("making a cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Errorf("removing cgroup %s: %v", cg, err)
		}
	})
	return cg
}

// TestStageWithoutNetnsCookie: a kernel that cannot name the agent's network namespace to the
// socket programs (SO_NETNS_COOKIE, before 5.14; stood in for here) still runs the stage: its
// maps written, its tc programs attached, the socket programs left off, and Status says why.
func TestStageWithoutNetnsCookie(t *testing.T) {
	e := stNewEnv(t)
	cfg := stConfig(e.pin)
	cfg.CgroupPath = stCgroup(t)
	t.Cleanup(func() { _ = RemoveAll(e.pin) })
	real := netnsCookie
	netnsCookie = func() (uint64, error) { return 0, unix.ENOPROTOOPT }
	defer func() { netnsCookie = real }()
	s, _ := e.start(cfg)
	s.OnUpdate(stStandard())
	// Not an apply error: the loop would retry it, rereading every map, for as long as it runs.
	e.apply(s)
	e.wantHooks(stStandardHooks)
	if got, want := e.kernelRender(), stFakeRender(t, cfg, stStandard()); got != want {
		t.Errorf("kernel maps\n%s\nwant\n%s", got, want)
	}
	if ok, why := s.Status(); ok || !strings.Contains(why, "own connections to services are not handled") || !strings.Contains(why, "SO_NETNS_COOKIE") {
		t.Errorf("status %v %q, want not ready saying the node's own connections are not handled, and why", ok, why)
	}
	if s.sock != nil {
		t.Error("socket programs set up without the cookie")
	}
}

// A UDP service's only endpoint is replaced while a client keeps sending from one source port
// (a DNS resolver): the apply that removes the endpoint deletes its flow at once, so the next
// datagram reaches the new endpoint; it would otherwise keep going to the removed one until
// the flow idles out (kube-proxy deletes such entries at the same sync).
func TestStageUDPEndpointSwap(t *testing.T) {
	e := stNewEnv(t)
	s, _ := e.start(stConfig(e.pin))
	vip := netip.MustParseAddr("10.96.0.53")
	dns := func(ep netip.Addr) calc.Frontend {
		return calc.Frontend{Key: calc.FrontendKey{Addr: vip, Port: 53, Protocol: store.ProtocolUDP},
			Kind: calc.FrontendClusterIP, Service: "kube-system/dns", ServiceID: 0xd050001, LocalBackends: 1,
			Backends: []calc.Backend{{Addr: ep, Port: 53, Node: stNodeName, NodeAddr: stHostIP}},
			Present:  []netip.AddrPort{netip.AddrPortFrom(ep, 53)}}
	}
	weps := map[string]netip.Addr{"cali-w1": stPodA}
	s.OnUpdate(stUpdate(weps, dns(stPodA)))
	e.apply(s)
	client := netip.AddrPortFrom(netip.MustParseAddr("10.65.0.7"), 5353)
	query := func() netip.Addr {
		t.Helper()
		f := tpUDPFrame(tpMACPodA7, tpMACWepA1, client, netip.AddrPortFrom(vip, 53), []byte("query"))
		out := make([]byte, 4096)
		opts := &ebpf.RunOptions{Data: f.build(), DataOut: out, Context: tpSkb{Ifindex: uint32(e.ifindex("cali-w1"))}}
		rc, err := s.Objs.SlFromWep.Run(opts)
		if err != nil || rc != tpOK {
			t.Fatalf("query: verdict %d, %v", rc, err)
		}
		got, bad, err := tpDecode(opts.DataOut, tpVXLANPort)
		if err != nil || len(bad) > 0 {
			t.Fatalf("query: %v %v", err, bad)
		}
		return got.IP.Dst
	}
	for range 3 {
		if got := query(); got != stPodA {
			t.Fatalf("query went to %s, want the endpoint %s", got, stPodA)
		}
	}
	// The endpoint is replaced by another; one apply later the next query reaches it.
	s.OnUpdate(stUpdate(weps, dns(stPodA2)))
	e.apply(s)
	if got := query(); got != stPodA2 {
		t.Fatalf("the first query after the endpoint was replaced went to %s, want the new endpoint %s", got, stPodA2)
	}
	for k, v := range e.conntrack() {
		if v.Type == ConntrackRev && HostAddr(k.Src) == stPodA {
			t.Errorf("a flow to the removed endpoint stayed: %v %+v", k, v)
		}
	}
}

// An interface whose name has a dot (a VLAN device, eth0.100; sluice's own vxlan.sluice) gets
// its programs and pins like any other (bpffs refuses dots in file names: the pins' names
// escape them), and the overlay's VXLAN devices get the host program on egress only.
func TestStageDottedAndTunnelInterfaces(t *testing.T) {
	e := stNewEnv(t)
	e.hostIface("eth2.7", "203.0.113.7/24")
	e.hostIface("vxlan.t", "203.0.114.7/24") // stands for the overlay device
	cfg := stConfig(e.pin)
	cfg.TunnelDevices = []string{"vxlan.t"}
	s, _ := e.start(cfg)
	s.OnUpdate(stStandard())
	e.apply(s)
	want := maps.Clone(stStandardHooks)
	want["eth2.7 ingress"] = []string{"sl_from_host"}
	want["eth2.7 egress"] = []string{"sl_to_host"}
	want["vxlan.t egress"] = []string{"sl_to_host"}
	e.wantHooks(want)
	e.wantPinnedHooks(want)
	if stMode(t) == AttachTC {
		return // classic tc filters have no pins
	}
	pins := e.linkPins()
	for _, p := range []string{"eth2%2e7_ingress", "eth2%2e7_egress", "vxlan%2et_egress"} {
		if _, ok := pins[p]; !ok {
			t.Errorf("no link pin %s among %v", p, pins)
		}
	}
	if pinSafe("a%2eb") == pinSafe("a.b") {
		t.Error("pin names of a%2eb and a.b meet")
	}
}

// The tunnel MTU option is used when the underlay carries it, and refused (the most the
// underlay carries used instead, and the stage says why) when it does not.
func TestStageTunnelMTUOption(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (6 s): make test runs it")
	}
	for _, tc := range []struct {
		option, want int
		problem      bool
	}{{0, 1450, false}, {1400, 1400, false}, {1450, 1450, false}, {1451, 1450, true}, {9000, 1450, true}} {
		t.Run(fmt.Sprint(tc.option), func(t *testing.T) {
			e := stNewEnv(t)
			cfg := stConfig(e.pin)
			cfg.TunnelMTU = tc.option
			s, _ := e.start(cfg)
			s.OnUpdate(stStandard())
			e.apply(s)
			if got := e.settings().TunnelMtu; int(got) != tc.want {
				t.Errorf("tunnel MTU %d, want %d (eth0 carries 1500)", got, tc.want)
			}
			ok, why := s.Status()
			if tc.problem != (!ok && strings.Contains(why, "nodeport-tunnel-mtu")) {
				t.Errorf("status %v %q; want a complaint about the option: %v", ok, why, tc.problem)
			}
		})
	}
}

// The node-port range is added to the namespace's ip_local_reserved_ports, keeping what
// other software reserved there, and written once.
func TestStageReservesNodePorts(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	e := stNewEnv(t) // a namespace of its own: its own setting
	if err := os.WriteFile(reservedPortsFile, []byte("8080,9000-9001"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := stConfig(e.pin)
	cfg.ReservePorts = [2]uint16{30000, 32767}
	s, _ := e.start(cfg)
	s.OnUpdate(stStandard())
	e.apply(s)
	got, err := os.ReadFile(reservedPortsFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != "8080,9000-9001,30000-32767" {
		t.Errorf("reserved ports %q, want 8080,9000-9001,30000-32767", got)
	}
	if !portsCover("1,29990-32767", 30000, 32767) || portsCover("30000-32766", 30000, 32767) {
		t.Error("portsCover misjudges a list")
	}
	if ok, why := s.Status(); !ok {
		t.Errorf("status: %s", why)
	}
}

// A host interface enslaved to another (a bond's slave; a bridge named like a bond stands for
// one here, this kernel having no bonding) gets no programs; its master does. Released, it
// gets them at the next sync.
func TestStageEnslavedInterfaces(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	e := stNewEnv(t)
	e.hostIface("eth3", "203.0.113.3/24")
	e.made["bond9"] = true
	if err := e.h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "bond9"}}); err != nil {
		t.Fatalf("adding bond9: %v", err)
	}
	master := e.up("bond9")
	slave, err := e.h.LinkByName("eth3")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.h.LinkSetMaster(slave, master); err != nil {
		t.Fatalf("enslaving eth3: %v", err)
	}
	cfg := stConfig(e.pin)
	s, _ := e.start(cfg)
	s.OnUpdate(stStandard())
	e.apply(s)
	want := maps.Clone(stStandardHooks)
	want["bond9 ingress"] = []string{"sl_from_host"}
	want["bond9 egress"] = []string{"sl_to_host"}
	e.wantHooks(want)
	e.wantPinnedHooks(want)
	// ProgramsOn (the lab's hooks tool) says the same.
	for iface, wantNames := range map[string]string{"bond9": "[sl_from_host]", "eth3": "[]"} {
		if got, err := ProgramsOn(e.ifindex(iface), false); err != nil || fmt.Sprint(got) != wantNames {
			t.Errorf("ProgramsOn(%s ingress) = %v, %v; want %s", iface, got, err, wantNames)
		}
	}

	if err := e.h.LinkSetNoMaster(slave); err != nil {
		t.Fatal(err)
	}
	s.OnUpdate(stStandard())
	e.apply(s)
	want["eth3 ingress"] = []string{"sl_from_host"}
	want["eth3 egress"] = []string{"sl_to_host"}
	e.wantHooks(want)
	e.wantPinnedHooks(want)
}

// A cleanup that finds the table nearly full (PressureShare) expires unestablished flows idle
// past PressureIdle (a UDP flood's, a TCP flood's left behind the ring); established flows and
// a one-way stream that keeps sending stay. Below the share the same flows keep their
// timeouts.
func TestStageConntrackPressure(t *testing.T) {
	e := stNewEnv(t)
	s, _ := e.start(stConfig(e.pin))
	s.OnUpdate(stStandard())
	e.apply(s)
	s.CT.Live = func(netip.Addr, uint16) bool { return true }
	size := int(s.Objs.SlCtV4.MaxEntries())
	sec := uint64(time.Second)
	t0 := 1000 * sec
	est := stLocalFlow("established", ProtoTCP, 30000, TCPSyn|TCPReplied, t0-5*sec)
	stream := stLocalFlow("one-way UDP, sending", ProtoUDP, 30001, 0, t0-sec/2)
	opening := stLocalFlow("SYN-ACK, no ACK", ProtoTCP, 30002, TCPSyn|TCPReplied|TCPOpening, t0-2*sec)
	for _, f := range []stFlow{est, stream, opening} {
		f.put(t, s.Objs.SlCtV4)
	}
	// A UDP flood: one datagram a source, 2 s ago, filling the table to share.
	flood := func(from, n int) {
		for i := from; i < from+n; i++ {
			f := stLocalFlow("flood", ProtoUDP, uint16(31000+i%30000), 0, t0-2*sec)
			f.keys[0].Src = NetAddr(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}))
			f.keys[1] = PairKey(f.keys[0], f.vals[0])
			f.vals[1].NatSport = f.keys[0].Sport
			f.put(t, s.Objs.SlCtV4)
		}
	}
	// Below the share: nothing is younger than its timeout, nothing goes.
	below := (size*8/10 - 6) / 2
	flood(0, below)
	st, err := s.CT.Clean(t0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Expired != 0 || st.Early != 0 {
		t.Fatalf("at %d of %d entries the cleanup expired %d (%d early); want none", st.Entries, size, st.Expired, st.Early)
	}
	// Past it: the flood and the unacknowledged handshake go; the rest stays.
	flood(below, size*95/100/2-below-3)
	st, err = s.CT.Clean(t0)
	if err != nil {
		t.Fatal(err)
	}
	if want := size*95/100/2 - 3 + 1; st.Early != want || st.Deleted != want {
		t.Errorf("at %d of %d entries: %d expired early, %d deleted; want %d (the flood and the unacknowledged handshake)", st.Entries, size, st.Early, st.Deleted, want)
	}
	ct := e.conntrack()
	for _, f := range []stFlow{est, stream} {
		for i, k := range f.keys {
			if _, ok := ct[k]; !ok {
				t.Errorf("%s: entry %d gone", f.name, i)
			}
		}
	}
	if _, ok := ct[opening.keys[1]]; ok {
		t.Error("the unacknowledged handshake stayed")
	}
	if len(ct) != 4 {
		t.Errorf("%d entries left; want 4 (two flows)", len(ct))
	}
}
