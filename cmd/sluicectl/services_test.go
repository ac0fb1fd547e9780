package main

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/sluice-net/sluice/store"
	"golang.org/x/sys/unix"
)

// servicesLog is a recorded cluster with services of every kind; node-a's view of it has
// local and remote backends, node ports, affinity and source ranges.
const servicesLog = "../../testdata/calc/services/events.jsonl"

// privateBPFFS mounts a bpffs of the test's own on a fresh directory and returns it; the
// test is skipped where that is not allowed.
func privateBPFFS(t *testing.T) string {
	t.Helper()
	nstest.NeedRoot(t, "mounting bpffs and loading eBPF programs")
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		t.Skipf("cannot mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// firstFullUpdate replays an event log through calc for node and returns the full update of
// its first in-sync, as sluiced and sluicectl diff get it.
func firstFullUpdate(t *testing.T, log, node string) *calc.Update {
	t.Helper()
	g, err := calc.New(calc.DefaultConfig(node))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var full *calc.Update
	if err := store.Replay(f, store.HandlerFunc(func(b []store.Event) {
		if u := g.OnEvents(b); u != nil && u.Full && full == nil {
			full = u
		}
	})); err != nil {
		t.Fatal(err)
	}
	if full == nil {
		t.Fatalf("%s has no in-sync", log)
	}
	return full
}

func testServicesConfig(node string) bpf.Config {
	return bpf.Config{NodeName: node, TunnelMTU: 1450, VXLANPort: bpf.DefaultVXLANPort, VNI: bpf.DefaultVNI,
		PSNATMin: bpf.DefaultPSNATMin, PSNATMax: bpf.DefaultPSNATMax}
}

var testMapSizes = bpf.MapSizes{Frontends: 256, Backends: 256, SourceRanges: 64, ClusterNets: 64, Affinity: 64, Conntrack: 1024}

// agentMaps loads the maps pinned in dir and writes node-a's services into them, as sluiced
// does; the objects close at the end of the test.
func agentMaps(t *testing.T, dir string) *bpf.Objects {
	t.Helper()
	objs, err := bpf.Load(dir, testMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	svc := bpf.NewServices(bpf.KernelTables(objs), testServicesConfig("node-a"))
	svc.OnUpdate(firstFullUpdate(t, servicesLog, "node-a"))
	if err := svc.Apply(); err != nil {
		t.Fatal(err)
	}
	return objs
}

func addr(s string) uint32 { return bpf.NetAddr(netip.MustParseAddr(s)) }

// putFlows writes three flows into the connection table: a node-port flow forwarded to
// node-b (forward and reverse entry), a cluster-IP flow to a local backend, and a flow
// node-c forwarded here (a tunnel entry).
func putFlows(t *testing.T, objs *bpf.Objects) {
	t.Helper()
	now := bpf.Monotonic()
	sec := uint64(time.Second)
	fk := bpf.ConntrackKey{Src: addr("203.0.113.9"), Dst: addr("192.0.2.11"), Sport: bpf.NetPort(40000), Dport: bpf.NetPort(30080), Proto: bpf.ProtoTCP}
	fv := bpf.ConntrackValue{Created: now - 9*sec, LastSeen: now - 9*sec, Type: bpf.ConntrackFwd, Flags: bpf.ConntrackRemote | bpf.ConntrackPSNAT,
		NatAddr: addr("10.65.0.65"), TunAddr: addr("192.0.2.12"), NatPort: bpf.NetPort(8080), NatSport: bpf.NetPort(20001)}
	rv := bpf.ConntrackValue{Created: now - 9*sec, LastSeen: now - 2*sec, Type: bpf.ConntrackRev,
		Flags: bpf.ConntrackRemote | bpf.ConntrackPSNAT | bpf.ConntrackRedirect, Tcp: bpf.TCPSyn | bpf.TCPReplied, Ifindex: 1,
		NatAddr: addr("192.0.2.11"), TunAddr: addr("192.0.2.12"), NatPort: bpf.NetPort(30080), NatSport: bpf.NetPort(40000),
		MacLocal: [6]byte{2, 0, 0, 0, 0, 0x11}, MacPeer: [6]byte{2, 0, 0, 0, 0, 0xfe}}
	lk := bpf.ConntrackKey{Src: addr("10.65.0.2"), Dst: addr("10.96.0.10"), Sport: bpf.NetPort(50000), Dport: bpf.NetPort(80), Proto: bpf.ProtoTCP}
	lv := bpf.ConntrackValue{Created: now - sec, LastSeen: now - sec, Type: bpf.ConntrackFwd, NatAddr: addr("10.65.0.1"),
		NatPort: bpf.NetPort(8080), NatSport: bpf.NetPort(50000)}
	lr := bpf.ConntrackValue{Created: now - sec, LastSeen: now - sec, Type: bpf.ConntrackRev, Tcp: bpf.TCPSyn,
		NatAddr: addr("10.96.0.10"), NatPort: bpf.NetPort(80), NatSport: bpf.NetPort(50000)}
	tk := bpf.ConntrackKey{Src: addr("10.65.0.1"), Dst: addr("198.51.100.77"), Sport: bpf.NetPort(8080), Dport: bpf.NetPort(21000), Proto: bpf.ProtoTCP}
	tv := bpf.ConntrackValue{Created: now - 4*sec, LastSeen: now - sec, Type: bpf.ConntrackTun, Tcp: bpf.TCPSyn | bpf.TCPReplied,
		NatAddr: addr("198.51.100.13")}
	for _, e := range []struct {
		k bpf.ConntrackKey
		v bpf.ConntrackValue
	}{{fk, fv}, {bpf.PairKey(fk, fv), rv}, {lk, lv}, {bpf.PairKey(lk, lv), lr}, {tk, tv}} {
		if err := objs.SlCtV4.Put(&e.k, &e.v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestServicesHelpAndUsage: --help works without a node's maps; bad views and flags are
// usage errors (exit 2).
func TestServicesHelpAndUsage(t *testing.T) {
	c := &cluster{t: t, env: map[string]string{}}
	r := c.ctl("", "services", "--help")
	if r.code != 0 || !strings.Contains(r.stderr, "conntrack") || !strings.Contains(r.stderr, "-pin-dir") {
		t.Fatalf("services --help: exit %d\n%s", r.code, r.stderr)
	}
	for _, args := range [][]string{
		{"services", "routes"},
		{"services", "frontends", "extra"},
		{"services", "backends", "--forwarded"},
		{"services", "-o", "yaml"},
	} {
		if r := c.ctl("", args...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", args, r.code, r.stderr)
		}
	}
}

// TestServicesPinDirMissing: no maps at the pin directory is an error naming it and saying
// the stage seems off; with the configuration turning it off, it says so.
func TestServicesPinDirMissing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sluice")
	c := &cluster{t: t, env: map[string]string{"SLUICE_CONFIG": filepath.Join(t.TempDir(), "none.yaml")}}
	r := c.ctl("", "services", "--pin-dir", dir)
	if r.code != 1 || !strings.Contains(r.stderr, "service maps not found at "+dir) || !strings.Contains(r.stderr, "services=false") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	// SLUICE_CONFIG names a file that is not there: sluiced would refuse it, and so does this.
	if r := c.ctl("", "services"); r.code != 1 || !strings.Contains(r.stderr, "configuration file") {
		t.Fatalf("missing configuration file: exit %d: %s", r.code, r.stderr)
	}
	c.env = map[string]string{"SLUICE_BPF_PIN_DIR": dir, "SLUICE_SERVICES": "false", "SLUICE_NODE_NAME": "node-a"}
	r = c.ctl("", "services", "conntrack")
	if r.code != 1 || !strings.Contains(r.stderr, dir) || !strings.Contains(r.stderr, "configuration here turns the service stage off") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
}

// TestServicesViews: each view reads what an agent wrote into its pinned maps.
func TestServicesViews(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (3 s): make test runs it")
	}
	dir := privateBPFFS(t)
	objs := agentMaps(t, dir)
	putFlows(t, objs)
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	per := make([]uint64, cpus)
	per[0] = 2
	per[cpus-1] += 3
	if err := objs.SlCounters.Put(uint32(4), per); err != nil { // drop_no_local_endpoint
		t.Fatal(err)
	}
	c := &cluster{t: t, env: map[string]string{"SLUICE_BPF_PIN_DIR": dir, "SLUICE_NODE_NAME": "node-a",
		"SLUICE_CONFIG": "/dev/null"}}

	out := table(c.mustCtl("services"))
	t.Logf("frontends:\n%s", out)
	for _, want := range []string{
		"FRONTEND KIND SERVICE-ID BACKENDS AFFINITY",
		"0.0.0.0:30080/TCP node-port ",
		" local [] cluster [10.65.0.65:8080@192.0.2.12 10.65.0.129:8080@198.51.100.13] 600s\n",
		"10.96.0.10:80/TCP service,internal-local ",
		" local [10.65.0.1:8080] cluster [",
		"10.96.0.10 address-only ",
		"203.0.113.100:443/TCP service,external-local,source-ranges,source=203.0.113.0/24 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("frontends lack %q", want)
		}
	}
	if got := table(c.mustCtl("services", "frontends", "--pin-dir", dir)); got != out {
		t.Errorf("services frontends --pin-dir differs from services:\n%s", got)
	}
	var fr []frontendRow
	if err := json.Unmarshal([]byte(c.mustCtl("services", "-o", "json")), &fr); err != nil {
		t.Fatal(err)
	}
	if len(fr) == 0 || fr[0].Frontend != "0.0.0.0:30080/TCP" || len(fr[0].Cluster) != 2 || fr[0].Cluster[0].Node != "192.0.2.12" || fr[0].AffinitySeconds != 600 {
		t.Errorf("json frontends: %+v", fr)
	}

	out = table(c.mustCtl("services", "backends"))
	t.Logf("backends:\n%s", out)
	for _, want := range []string{"LIST # BACKEND NODE USED-BY", " 0 10.65.0.1:8080 local ", " 10.65.0.129:8080 198.51.100.13 "} {
		if !strings.Contains(out, want) {
			t.Errorf("backends lack %q", want)
		}
	}
	if strings.Contains(out, "left behind") {
		t.Errorf("an agent's lists are all used")
	}
	var br []backendRow
	if err := json.Unmarshal([]byte(c.mustCtl("services", "backends", "-o", "json")), &br); err != nil || len(br) == 0 || br[0].UsedBy == 0 {
		t.Errorf("json backends: %v %+v", err, br)
	}

	all := lines(c.mustCtl("services", "conntrack"))
	t.Logf("conntrack:\n%s", strings.Join(all, "\n"))
	if len(all) != 5 {
		t.Fatalf("conntrack: %d lines, want 5", len(all))
	}
	// Idle times and ages are as the clock found them; bpf's tests check their values.
	durations := regexp.MustCompile(`(idle|age) [0-9hms]+`)
	fwd := durations.ReplaceAllString(c.mustCtl("services", "conntrack", "--forwarded"), "$1 T")
	wantFwd := `forward TCP 203.0.113.9:40000 → 192.0.2.11:30080 dnat to 10.65.0.65:8080 via node 192.0.2.12 from port 20001 flags forwarded,psnat age T
reverse TCP 10.65.0.65:8080 → 203.0.113.9:20001 reply as 192.0.2.11:30080 to client port 40000 tunnelled from node 192.0.2.12 out ifindex 1 (lo) to 02:00:00:00:00:fe from 02:00:00:00:00:11 flags forwarded,redirect,psnat tcp syn,replied idle T age T
tunnel TCP 10.65.0.1:8080 → 198.51.100.77:21000 tunnel back to 198.51.100.13 tcp syn,replied idle T age T
`
	if fwd != wantFwd {
		t.Errorf("conntrack --forwarded:\n%s\nwant\n%s", fwd, wantFwd)
	}
	if !strings.HasPrefix(all[0], "forward TCP 10.65.0.2:50000 → 10.96.0.10:80 dnat to 10.65.0.1:8080 age") ||
		!strings.HasPrefix(all[1], "reverse TCP 10.65.0.1:8080 → 10.65.0.2:50000 reply as 10.96.0.10:80 to client port 50000 out by the kernel's route tcp syn idle") ||
		!strings.HasPrefix(all[2], "forward TCP 203.0.113.9:40000") || !strings.HasPrefix(all[3], "reverse TCP 10.65.0.65:8080") || !strings.HasPrefix(all[4], "tunnel ") {
		t.Errorf("not each forward entry followed by its reverse entry, then the tunnel entries:\n%s", strings.Join(all, "\n"))
	}
	var cr []conntrackRow
	if err := json.Unmarshal([]byte(c.mustCtl("services", "conntrack", "--forwarded", "-o", "json")), &cr); err != nil || len(cr) != 3 {
		t.Fatalf("json conntrack: %v %+v", err, cr)
	}
	if r := cr[1]; r.Kind != "reverse" || r.Node != "192.0.2.12" || r.Interface != "lo" || r.MACPeer != "02:00:00:00:00:fe" || r.ClientPort != 40000 ||
		r.IdleSeconds == nil || *r.IdleSeconds < 2 || r.AgeSeconds < 9 || cr[2].TunnelPeer != "198.51.100.13" {
		t.Errorf("json conntrack: %+v", cr)
	}

	out = table(c.mustCtl("services", "drops"))
	t.Logf("drops:\n%s", out)
	rows := lines(out)
	lastEvent := "" // drops come first, then rejects, then the other counters in order
	for _, n := range bpf.CounterNames {
		if !strings.HasPrefix(n, "drop_") && !strings.HasPrefix(n, "reject_") {
			lastEvent = n
		}
	}
	if rows[0] != "COUNTER VALUE MEANING" || !strings.HasPrefix(rows[1], "drop_") || !strings.Contains(out, "drop_no_local_endpoint 5 traffic policy Local") ||
		!strings.HasPrefix(rows[len(rows)-1], lastEvent+" 0") {
		t.Errorf("drops:\n%s", out)
	}
	var dr []counterRow
	if err := json.Unmarshal([]byte(c.mustCtl("services", "drops", "-o", "json")), &dr); err != nil || len(dr) != len(bpf.CounterNames) {
		t.Errorf("json drops: %v %+v", err, dr)
	}
}

// TestDiffServiceMaps: the pinned maps an agent wrote match the desired maps; a frontend
// removed and a cluster network added behind its back are a missing and an extra line; no
// maps at all is one missing line naming the directory.
func TestDiffServiceMaps(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (3 s): make test runs it")
	}
	dir := privateBPFFS(t)
	objs := agentMaps(t, dir)
	full := firstFullUpdate(t, servicesLog, "node-a")
	cfg := testServicesConfig("node-a")
	var warn strings.Builder
	missing, extra, err := diffServiceMaps(full, cfg, testMapSizes, dir, &warn)
	if err != nil || len(missing) != 0 || len(extra) != 0 || warn.Len() != 0 {
		t.Fatalf("an agent's maps differ: %v\nmissing %q\nextra %q\n%s", err, missing, extra, warn.String())
	}
	kt := bpf.KernelTables(objs)
	fe := bpf.FrontendKey{Addr: addr("10.96.0.10"), Port: bpf.NetPort(80), Proto: bpf.ProtoTCP}
	fv, err := kt.Frontends.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if err := kt.Frontends.Delete(fe); err != nil {
		t.Fatal(err)
	}
	stray := bpf.ClusterNetKey{Prefixlen: 24, Addr: addr("198.51.100.0")}
	if err := kt.ClusterNets.Put(stray, bpf.ClusterNetVal{Flags: bpf.ClusterNetPool}); err != nil {
		t.Fatal(err)
	}
	missing, extra, err = diffServiceMaps(full, cfg, testMapSizes, dir, &warn)
	if err != nil {
		t.Fatal(err)
	}
	wantMissing := "frontend " + bpf.FrontendString(fe, fv[fe])
	if len(missing) != 1 || missing[0] != wantMissing || len(extra) != 1 || extra[0] != "cluster-net 198.51.100.0/24 pool" {
		t.Errorf("missing %q (want %q)\nextra %q", missing, wantMissing, extra)
	}

	gone := filepath.Join(t.TempDir(), "sluice")
	missing, extra, err = diffServiceMaps(full, cfg, testMapSizes, gone, &warn)
	if err != nil || len(missing) != 1 || !strings.HasPrefix(missing[0], "service maps not found at "+gone) || len(extra) != 0 {
		t.Errorf("no maps: %v, missing %q, extra %q", err, missing, extra)
	}

	// Maps too small for the desired state: a warning, and what fits is compared.
	warn.Reset()
	small := testMapSizes
	small.Frontends = 2
	if _, _, err := diffServiceMaps(full, cfg, small, dir, &warn); err != nil || !strings.Contains(warn.String(), "bpf-map-size-frontends") {
		t.Errorf("small maps: %v, warning %q", err, warn.String())
	}
}

// TestDiffLeftoverPins: with the service stage off, what it pinned is extra.
func TestDiffLeftoverPins(t *testing.T) {
	dir := privateBPFFS(t)
	objs, err := bpf.Load(dir, testMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	objs.Close()
	got := leftoverPins(dir)
	if len(got) != len(bpf.PinnedMapNames) || !strings.HasPrefix(got[0], "pinned map "+filepath.Join(dir, "sl_fe_v4")) {
		t.Errorf("leftovers %q", got)
	}
	if got := leftoverPins(filepath.Join(dir, "none")); len(got) != 0 {
		t.Errorf("leftovers of nothing: %q", got)
	}
}

// TestDiffLines: lines of want not in have are missing, lines of have not in want extra.
func TestDiffLines(t *testing.T) {
	missing, extra := diffLines("a\nb\nb\nc", "b\nc\nd")
	if strings.Join(missing, ",") != "a,b" || strings.Join(extra, ",") != "d" {
		t.Errorf("missing %q extra %q", missing, extra)
	}
	if m, e := diffLines("", ""); len(m)+len(e) != 0 {
		t.Errorf("empty: %q %q", m, e)
	}
}

// TestDiffServicesOnNode: `sluicectl diff` on a node (a fresh network namespace) reports the
// service maps with the routes: none pinned, then pinned but empty, then the stage off with
// its pins left behind.
func TestDiffServicesOnNode(t *testing.T) {
	dir := privateBPFFS(t)
	c := newCluster(t)
	c.loadSample()
	c.env["SLUICE_BPF_PIN_DIR"] = dir
	c.env["SLUICE_CONFIG"] = "/dev/null"
	nstest.Enter(t)

	r := c.ctl("", "diff", "--node", "node-a")
	if r.code != 1 || !strings.Contains(r.stdout, "  missing: service maps not found at "+dir+": ") {
		t.Fatalf("no maps: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	objs, err := bpf.Load(dir, testMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	stray := bpf.ClusterNetKey{Prefixlen: 24, Addr: addr("198.51.100.0")}
	if err := bpf.KernelTables(objs).ClusterNets.Put(stray, bpf.ClusterNetVal{Flags: bpf.ClusterNetPool}); err != nil {
		t.Fatal(err)
	}
	r = c.ctl("", "diff", "--node", "node-a")
	t.Logf("empty maps:\n%s", r.stdout)
	for _, want := range []string{"  missing: frontend 10.96.0.10:80/TCP service ", "  missing: frontend 0.0.0.0:30080/TCP service ",
		"  missing: backend list ", "  missing: cluster-net 10.65.0.0/16 pool", "  extra:   cluster-net 198.51.100.0/24 pool"} {
		if r.code != 1 || !strings.Contains(r.stdout, want) {
			t.Errorf("empty maps: exit %d, output lacks %q", r.code, want)
		}
	}
	c.env["SLUICE_SERVICES"] = "false"
	r = c.ctl("", "diff", "--node", "node-a")
	if r.code != 1 || !strings.Contains(r.stdout, "  extra:   pinned map "+filepath.Join(dir, "sl_ct_v4")+" (option services is off") ||
		strings.Contains(r.stdout, "frontend") {
		t.Errorf("services off: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// TestServicesRowsHairpinUDPRouted: the JSON rows carry the facts the text does for a
// hairpinned flow (the source the backend sees, the client's own address), an answered UDP
// flow, and a backend on no node.
func TestServicesRowsHairpinUDPRouted(t *testing.T) {
	a := func(s string) uint32 { return bpf.NetAddr(netip.MustParseAddr(s)) }
	pod := a("10.65.0.7")
	vip := a("10.96.0.10")
	fk := bpf.ConntrackKey{Src: pod, Dst: vip, Sport: bpf.NetPort(40000), Dport: bpf.NetPort(80), Proto: bpf.ProtoTCP}
	fv := bpf.ConntrackValue{Type: bpf.ConntrackFwd, NatAddr: pod, NatPort: bpf.NetPort(8080), NatSport: bpf.NetPort(40000),
		NatSaddr: a(bpf.HairpinAddr), Created: 1, LastSeen: 1}
	rk := bpf.PairKey(fk, fv)
	rv := bpf.ConntrackValue{Type: bpf.ConntrackRev, NatAddr: vip, NatPort: bpf.NetPort(80), NatSport: bpf.NetPort(40000),
		NatSaddr: pod, Tcp: bpf.TCPSyn | bpf.TCPReplied, Created: 1, LastSeen: 1}
	uk := bpf.ConntrackKey{Src: a("10.65.0.5"), Dst: a("10.65.0.9"), Sport: bpf.NetPort(53), Dport: bpf.NetPort(5000), Proto: bpf.ProtoUDP}
	uv := bpf.ConntrackValue{Type: bpf.ConntrackRev, NatAddr: vip, NatPort: bpf.NetPort(53), NatSport: bpf.NetPort(5000),
		Tcp: bpf.TCPReplied, Created: 1, LastSeen: 1}
	rows := conntrackRows([]bpf.Flow{bpf.FlowOf(fk, fv), bpf.FlowOf(rk, rv), bpf.FlowOf(uk, uv)}, 2, false, func(int) string { return "" })
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3: %+v", len(rows), rows)
	}
	if r := rows[0]; r.Kind != "forward" || r.HairpinSource != bpf.HairpinAddr || r.HairpinClient != "" {
		t.Errorf("hairpin forward row %+v", r)
	}
	if r := rows[1]; r.Kind != "reverse" || r.HairpinClient != "10.65.0.7" || r.Source != "10.65.0.7:8080" || r.Dest != bpf.HairpinAddr+":40000" {
		t.Errorf("hairpin reverse row %+v", r)
	}
	if r := rows[2]; r.Protocol != "UDP" || !r.Replied || r.TCP != nil {
		t.Errorf("answered UDP row %+v", r)
	}
	uv.Tcp = 0
	if r := conntrackRows([]bpf.Flow{bpf.FlowOf(uk, uv)}, 2, false, func(int) string { return "" })[0]; r.Replied {
		t.Errorf("unanswered UDP row %+v", r)
	}

	var b backendRow
	b.describe(bpf.Backend{Addr: netip.MustParseAddrPort("198.18.0.10:6443"), Flags: bpf.BackendRouted})
	if !b.Routed || b.Local || b.Node != "" || b.String() != "198.18.0.10:6443@routed" {
		t.Errorf("routed backend row %+v %q", b, b.String())
	}
	b = backendRow{}
	b.describe(bpf.Backend{Addr: netip.MustParseAddrPort("10.65.1.5:80"), Node: netip.MustParseAddr("192.0.2.2")})
	if b.Routed || b.Local || b.String() != "10.65.1.5:80@192.0.2.2" {
		t.Errorf("remote backend row %+v %q", b, b.String())
	}
}

// TestServicesIPv6: the views read the IPv6 maps beside the IPv4 ones: an IPv6 frontend with
// its address-only entry, its backends (local and through the IPv6 tunnel), its source range,
// and an IPv6 flow's forward and reverse entries.
func TestServicesIPv6(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	dir := privateBPFFS(t)
	objs, err := bpf.Load(dir, testMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	vip := netip.MustParseAddr("fd00:96::10")
	fe := calc.Frontend{Key: calc.FrontendKey{Addr: vip, Port: 80, Protocol: store.ProtocolTCP}, Kind: calc.FrontendClusterIP,
		Service: "shop/web", ServiceID: 0x61, LocalBackends: 1,
		Backends: []calc.Backend{{Addr: netip.MustParseAddr("fd00:65::5"), Port: 8080, Node: "node-a"},
			{Addr: netip.MustParseAddr("fd00:65:1::5"), Port: 8080, Node: "node-b", NodeAddr: netip.MustParseAddr("2001:db8::2")}}}
	lb := fe
	lb.Key.Addr, lb.Kind = netip.MustParseAddr("2001:db8:200::10"), calc.FrontendLoadBalancer
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8:113::/64")}
	self := calc.ClusterNet{Prefix: netip.MustParsePrefix("2001:db8::1/128"), Host: true, Node: "node-a"}
	svc := bpf.NewServices(bpf.KernelTables(objs), testServicesConfig("node-a"))
	svc.OnUpdate(&calc.Update{Full: true, Ops: []calc.Op{{ClusterNet: &self}, {Frontend: &fe}, {Frontend: &lb}}})
	if err := svc.Apply(); err != nil {
		t.Fatal(err)
	}
	now := bpf.Monotonic()
	fk := bpf.ConntrackKey6{Src: bpf.NetAddr6(netip.MustParseAddr("fd00:65::7")), Dst: bpf.NetAddr6(vip), Sport: bpf.NetPort(40000),
		Dport: bpf.NetPort(80), Proto: bpf.ProtoTCP}
	fv := bpf.ConntrackValue6{Created: now, LastSeen: now, Type: bpf.ConntrackFwd, Flags: bpf.ConntrackLocal,
		NatAddr: bpf.NetAddr6(netip.MustParseAddr("fd00:65::5")), NatPort: bpf.NetPort(8080), NatSport: bpf.NetPort(40000)}
	rk := bpf.ConntrackKey6{Src: fv.NatAddr, Dst: fk.Src, Sport: fv.NatPort, Dport: fk.Sport, Proto: bpf.ProtoTCP}
	rv := bpf.ConntrackValue6{Created: now, LastSeen: now, Type: bpf.ConntrackRev, Flags: bpf.ConntrackLocal, Tcp: bpf.TCPSyn,
		NatAddr: fk.Dst, NatPort: fk.Dport, NatSport: fk.Sport}
	for _, e := range []struct {
		k bpf.ConntrackKey6
		v bpf.ConntrackValue6
	}{{fk, fv}, {rk, rv}} {
		if err := objs.SlCtV6.Put(&e.k, &e.v); err != nil {
			t.Fatal(err)
		}
	}
	c := &cluster{t: t, env: map[string]string{"SLUICE_BPF_PIN_DIR": dir, "SLUICE_NODE_NAME": "node-a", "SLUICE_CONFIG": "/dev/null"}}
	out := table(c.mustCtl("services"))
	for _, want := range []string{
		"[fd00:96::10]:80/TCP service 0000000000000061 local [[fd00:65::5]:8080] cluster [[fd00:65::5]:8080 [fd00:65:1::5]:8080@2001:db8::2]",
		"fd00:96::10 address-only 0000000000000061",
		"[2001:db8:200::10]:80/TCP service,source-ranges,source=2001:db8:113::/64 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("frontends lack %q:\n%s", want, out)
		}
	}
	out = table(c.mustCtl("services", "backends"))
	if !strings.Contains(out, " 1 [fd00:65:1::5]:8080 2001:db8::2 2 frontends") || !strings.Contains(out, " 0 [fd00:65::5]:8080 local 2 frontends") {
		t.Errorf("backends:\n%s", out)
	}
	out = c.mustCtl("services", "conntrack")
	for _, want := range []string{
		"forward TCP [fd00:65::7]:40000 → [fd00:96::10]:80 dnat to [fd00:65::5]:8080",
		"reverse TCP [fd00:65::5]:8080 → [fd00:65::7]:40000 reply as [fd00:96::10]:80 to client port 40000",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("conntrack lacks %q:\n%s", want, out)
		}
	}
}
