package bpf

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/internal/nstest"
	"golang.org/x/sys/unix"
)

// pinnedBPFFS mounts a private bpffs on a fresh directory for one test and unmounts it at
// the end; the test is skipped where that is not allowed.
func pinnedBPFFS(t *testing.T) string {
	t.Helper()
	nstest.NeedRoot(t, "mounting bpffs and loading eBPF programs")
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		t.Skipf("cannot mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// pinnedFlow is a node-port flow forwarded to another node, as seed 000 had it: client
// 203.0.113.7:40000 to node port 192.0.2.11:30090, backend 10.65.0.65:8080 on node
// 192.0.2.12, source port rewritten to 20001, replies out of ifindex 2.
func pinnedFlow(created, seen uint64) (fk ConntrackKey, fv ConntrackValue, rk ConntrackKey, rv ConntrackValue) {
	a := func(s string) uint32 { return NetAddr(netip.MustParseAddr(s)) }
	fk = ConntrackKey{Src: a("203.0.113.7"), Dst: a("192.0.2.11"), Sport: NetPort(40000), Dport: NetPort(30090), Proto: ProtoTCP}
	fv = ConntrackValue{Created: created, LastSeen: created, Type: ConntrackFwd, Flags: ConntrackRemote | ConntrackPSNAT,
		NatAddr: a("10.65.0.65"), TunAddr: a("192.0.2.12"), NatPort: NetPort(8080), NatSport: NetPort(20001)}
	rk = PairKey(fk, fv)
	rv = ConntrackValue{Created: created, LastSeen: seen, Type: ConntrackRev, Flags: ConntrackRemote | ConntrackPSNAT | ConntrackRedirect,
		Tcp: TCPSyn | TCPReplied, Ifindex: 2, NatAddr: a("192.0.2.11"), TunAddr: a("192.0.2.12"), NatPort: NetPort(30090),
		NatSport: NetPort(40000), MacLocal: [6]byte{2, 0, 0, 0, 0, 0x11}, MacPeer: [6]byte{2, 0, 0, 0, 0, 0xfe}}
	return
}

// TestPinnedConntrackString: each kind of entry says where its packets go.
func TestPinnedConntrackString(t *testing.T) {
	sec := uint64(time.Second)
	fk, fv, rk, rv := pinnedFlow(10*sec, 97*sec)
	tk := ConntrackKey{Src: NetAddr(netip.MustParseAddr("10.65.0.65")), Dst: NetAddr(netip.MustParseAddr("203.0.113.7")),
		Sport: NetPort(8080), Dport: NetPort(20001), Proto: ProtoTCP}
	tv := ConntrackValue{Created: 40 * sec, LastSeen: 99 * sec, Type: ConntrackTun, Tcp: TCPSyn | TCPReplied | TCPFinFwd,
		NatAddr: NetAddr(netip.MustParseAddr("192.0.2.13"))}
	uk := ConntrackKey{Src: NetAddr(netip.MustParseAddr("10.65.0.1")), Dst: NetAddr(netip.MustParseAddr("10.65.0.2")),
		Sport: NetPort(53), Dport: NetPort(33000), Proto: ProtoUDP}
	uv := ConntrackValue{Created: 95 * sec, LastSeen: 101 * sec, Type: ConntrackRev, NatAddr: NetAddr(netip.MustParseAddr("10.96.0.10")),
		NatPort: NetPort(53), NatSport: NetPort(33000)}
	uav := uv
	uav.Tcp = TCPReplied
	// A hairpin flow: 10.65.0.5:40000 to 10.96.0.60:80, whose backend is 10.65.0.5:8080.
	hk := ConntrackKey{Src: NetAddr(netip.MustParseAddr("10.65.0.5")), Dst: NetAddr(netip.MustParseAddr("10.96.0.60")),
		Sport: NetPort(40000), Dport: NetPort(80), Proto: ProtoTCP}
	hv := ConntrackValue{Created: 90 * sec, LastSeen: 90 * sec, Type: ConntrackFwd, NatAddr: NetAddr(netip.MustParseAddr("10.65.0.5")),
		NatPort: NetPort(8080), NatSport: NetPort(40000), NatSaddr: NetAddr(netip.MustParseAddr(HairpinAddr))}
	hrk := PairKey(hk, hv)
	hrv := ConntrackValue{Created: 90 * sec, LastSeen: 99 * sec, Type: ConntrackRev, Tcp: TCPSyn | TCPReplied,
		NatAddr: hk.Dst, NatPort: hk.Dport, NatSport: hk.Sport, NatSaddr: hk.Src}
	now := 100 * sec
	for _, c := range []struct {
		k    ConntrackKey
		v    ConntrackValue
		want string
	}{
		{fk, fv, "forward TCP 203.0.113.7:40000 → 192.0.2.11:30090 dnat to 10.65.0.65:8080 via node 192.0.2.12 from port 20001 flags forwarded,psnat age 1m30s"},
		{rk, rv, "reverse TCP 10.65.0.65:8080 → 203.0.113.7:20001 reply as 192.0.2.11:30090 to client port 40000 tunnelled from node 192.0.2.12 out ifindex 2 (eth9) to 02:00:00:00:00:fe from 02:00:00:00:00:11 flags forwarded,redirect,psnat tcp syn,replied idle 3s age 1m30s"},
		{tk, tv, "tunnel TCP 10.65.0.65:8080 → 203.0.113.7:20001 tunnel back to 192.0.2.13 tcp syn,replied,fin-fwd idle 1s age 1m0s"},
		{uk, uv, "reverse UDP 10.65.0.1:53 → 10.65.0.2:33000 reply as 10.96.0.10:53 to client port 33000 out by the kernel's route idle 0s age 5s"},
		{uk, uav, "reverse UDP 10.65.0.1:53 → 10.65.0.2:33000 reply as 10.96.0.10:53 to client port 33000 out by the kernel's route replied idle 0s age 5s"},
		{hk, hv, "forward TCP 10.65.0.5:40000 → 10.96.0.60:80 dnat to 10.65.0.5:8080 from 169.254.42.1:40000 (hairpin) age 10s"},
		{hrk, hrv, "reverse TCP 10.65.0.5:8080 → 169.254.42.1:40000 reply as 10.96.0.60:80 to client 10.65.0.5:40000 (hairpin) out by the kernel's route tcp syn,replied idle 1s age 10s"},
	} {
		got := ConntrackStringNamed(c.k, c.v, now, func(i int) string {
			if i == 2 {
				return "eth9"
			}
			return ""
		})
		if got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
	}
	if got := ConntrackString(rk, rv, now); !strings.Contains(got, "out ifindex 2 to 02:00:00:00:00:fe") {
		t.Errorf("without names: %s", got)
	}
}

// TestPinnedMissing: a missing pin directory or map is ErrNotPinned, naming the path.
func TestPinnedMissing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sluice")
	_, err := OpenPinned(dir)
	if !errors.Is(err, ErrNotPinned) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "services") {
		t.Fatalf("missing directory: %v", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err = OpenPinned(dir)
	if !errors.Is(err, ErrNotPinned) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "sl_fe_v4") {
		t.Fatalf("empty directory: %v", err)
	}
}

// TestPinnedReadsAgentMaps: what an agent wrote into its pinned maps reads back through
// OpenPinned, read-only.
func TestPinnedReadsAgentMaps(t *testing.T) {
	dir := pinnedBPFFS(t)
	objs, err := Load(dir, MapSizes{Frontends: 64, Backends: 64, SourceRanges: 64, ClusterNets: 64, Affinity: 64, Conntrack: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	kt := KernelTables(objs)
	a := func(s string) uint32 { return NetAddr(netip.MustParseAddr(s)) }
	fe := FrontendKey{Addr: a("192.0.2.11"), Port: NetPort(30090), Proto: ProtoTCP}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(kt.Backends.Put(BackendKey{ListId: 7, Ordinal: 0}, BackendValue{Addr: a("10.65.0.65"), NodeAddr: a("192.0.2.12"), Port: NetPort(8080)}))
	must(kt.Frontends.Put(fe, FrontendValue{ListId: 7, SvcId: 0xabc, Count: 1, Flags: FrontendNodePort | FrontendSourceRanges}))
	must(kt.SourceRanges.Put(SourceRangeKey{Prefixlen: 64 + 24, FeAddr: fe.Addr, FePort: fe.Port, Proto: ProtoTCP, Src: a("203.0.113.0")}, 1))
	must(kt.ClusterNets.Put(ClusterNetKey{Prefixlen: 32, Addr: a("192.0.2.12")}, ClusterNetVal{Flags: ClusterNetHost}))
	must(kt.Settings.Put(0, Settings{HostIp: a("192.0.2.11"), TunnelMtu: 1450}))
	now := Monotonic()
	fk, fv, rk, rv := pinnedFlow(now-5*uint64(time.Second), now-2*uint64(time.Second))
	must(objs.SlCtV4.Put(&fk, &fv))
	must(objs.SlCtV4.Put(&rk, &rv))
	cpus, err := ebpf.PossibleCPU()
	must(err)
	per := make([]uint64, cpus)
	per[0] = 3
	per[cpus-1] += 4
	must(objs.SlCounters.Put(uint32(5), per)) // drop_source_range

	p, err := OpenPinned(dir)
	must(err)
	defer p.Close()
	want, err := Render(kt)
	must(err)
	got, err := Render(p.Tables())
	must(err)
	if got != want || !strings.Contains(got, "frontend 192.0.2.11:30090/TCP service 0000000000000abc") {
		t.Errorf("pinned tables render\n%s\nwant\n%s", got, want)
	}
	ct, err := p.Conntrack()
	must(err)
	if len(ct) != 2 || ct[fk] != fv || ct[rk] != rv {
		t.Errorf("connection table %v", ct)
	}
	s := ConntrackString(rk, ct[rk], now)
	for _, w := range []string{"reverse TCP 10.65.0.65:8080 → 203.0.113.7:20001", "tunnelled from node 192.0.2.12", "out ifindex 2", "flags forwarded,redirect,psnat", "idle 2s", "age 5s"} {
		if !strings.Contains(s, w) {
			t.Errorf("%q lacks %q", s, w)
		}
	}
	counters, err := p.Counters()
	must(err)
	if len(counters) != len(CounterNames) || counters["drop_source_range"] != uint64(7) || counters["nat_new"] != 0 {
		t.Errorf("counters %v", counters)
	}
	if err := p.Tables().Frontends.Put(fe, FrontendValue{}); err == nil {
		t.Error("a pinned view wrote a frontend")
	}
	if err := p.Tables().Frontends.Delete(fe); err == nil {
		t.Error("a pinned view deleted a frontend")
	}
}

func TestCountCPUList(t *testing.T) {
	for list, want := range map[string]int{"0": 1, "0-3": 4, "0-3,6": 5, "0,2,4-5": 4, "": 0, "x": 0, "3-1": 0, "0-": 0} {
		if got := countCPUList(list); got != want {
			t.Errorf("countCPUList(%q) = %d, want %d", list, got, want)
		}
	}
	// This process may run on no more CPUs than are online.
	if n := onlineCPUs(); n < runtime.NumCPU() {
		t.Errorf("onlineCPUs() = %d, but this process may use %d", n, runtime.NumCPU())
	}
}
