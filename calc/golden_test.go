package calc_test

import (
	"bytes"
	"encoding/gob"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/calc")

// model is what a consumer of calc's updates holds: it applies full states and deltas.
type model struct {
	vteps     map[calc.VTEPKey]calc.VTEP
	nets      map[netip.Prefix]calc.ClusterNet
	routes    map[netip.Prefix]calc.Route
	frontends map[calc.FrontendKey]calc.Frontend
	health    map[uint16]calc.HealthCheck
	fips      map[netip.Addr]calc.FloatingIP
	speaker   *calc.BGPSpeaker
	peers     map[netip.Addr]calc.BGPPeer
	paths     map[netip.Prefix]calc.BGPPath
}

func newModel() *model {
	return &model{vteps: map[calc.VTEPKey]calc.VTEP{}, nets: map[netip.Prefix]calc.ClusterNet{}, routes: map[netip.Prefix]calc.Route{},
		frontends: map[calc.FrontendKey]calc.Frontend{}, health: map[uint16]calc.HealthCheck{}, fips: map[netip.Addr]calc.FloatingIP{},
		peers: map[netip.Addr]calc.BGPPeer{}, paths: map[netip.Prefix]calc.BGPPath{}}
}

func (m *model) apply(t *testing.T, u *calc.Update) {
	t.Helper()
	if u.Full {
		*m = *newModel()
	}
	lastVTEPSet, firstRoute, lastRouteDel, firstVTEPDel := -1, len(u.Ops), -1, len(u.Ops)
	// Cluster nets: set after every VTEP set and before any other set; removed after
	// everything else.
	firstNetSet, lastNetSet, firstOtherSet, firstNetDel, lastOther := len(u.Ops), -1, len(u.Ops), len(u.Ops), -1
	for i, op := range u.Ops {
		if op.ClusterNet == nil {
			lastOther = i
			if !op.Remove && op.VTEP == nil {
				firstOtherSet = min(firstOtherSet, i)
			}
		}
		switch {
		case op.VTEP != nil && !op.Remove:
			lastVTEPSet = i
			m.vteps[op.VTEP.Key()] = *op.VTEP
		case op.VTEP != nil:
			firstVTEPDel = min(firstVTEPDel, i)
			delete(m.vteps, op.VTEP.Key())
		case op.ClusterNet != nil && !op.Remove:
			firstNetSet, lastNetSet = min(firstNetSet, i), i
			m.nets[op.ClusterNet.Prefix] = *op.ClusterNet
		case op.ClusterNet != nil:
			firstNetDel = min(firstNetDel, i)
			delete(m.nets, op.ClusterNet.Prefix)
		case op.Route != nil && !op.Remove:
			firstRoute = min(firstRoute, i)
			m.routes[op.Route.Dst] = *op.Route
		case op.Route != nil:
			firstRoute = min(firstRoute, i)
			lastRouteDel = i
			delete(m.routes, op.Route.Dst)
		case op.Frontend != nil && !op.Remove:
			m.frontends[op.Frontend.Key] = *op.Frontend
		case op.Frontend != nil:
			delete(m.frontends, op.Frontend.Key)
		case op.HealthCheck != nil && !op.Remove:
			m.health[op.HealthCheck.Port] = *op.HealthCheck
		case op.HealthCheck != nil:
			delete(m.health, op.HealthCheck.Port)
		case op.FloatingIP != nil && !op.Remove:
			if _, ok := m.routes[netip.PrefixFrom(op.FloatingIP.External, op.FloatingIP.External.BitLen())]; !ok {
				t.Fatalf("floating IP %s set before its route", op.FloatingIP)
			}
			m.fips[op.FloatingIP.External] = *op.FloatingIP
		case op.FloatingIP != nil:
			delete(m.fips, op.FloatingIP.External)
		case op.BGPSpeaker != nil && !op.Remove:
			sp := *op.BGPSpeaker
			m.speaker = &sp
		case op.BGPSpeaker != nil:
			m.speaker = nil
		case op.BGPPeer != nil && !op.Remove:
			m.peers[op.BGPPeer.Addr] = *op.BGPPeer
		case op.BGPPeer != nil:
			delete(m.peers, op.BGPPeer.Addr)
		case op.BGPPath != nil && !op.Remove:
			m.paths[op.BGPPath.Prefix] = *op.BGPPath
		case op.BGPPath != nil:
			delete(m.paths, op.BGPPath.Prefix)
		default:
			t.Fatalf("op %d sets nothing", i)
		}
	}
	if lastVTEPSet > firstRoute {
		t.Fatalf("a VTEP is added after a route in the same update")
	}
	if lastRouteDel > firstVTEPDel {
		t.Fatalf("a route is removed after a VTEP in the same update")
	}
	if lastVTEPSet > firstNetSet || lastNetSet > firstOtherSet {
		t.Fatalf("cluster nets are not set after the VTEPs and before everything else")
	}
	if lastOther > firstNetDel {
		t.Fatalf("a cluster net is removed before something else in the same update")
	}
}

func (m *model) text() string {
	s := &calc.State{}
	for _, v := range m.vteps {
		s.VTEPs = append(s.VTEPs, v)
	}
	for _, c := range m.nets {
		s.ClusterNets = append(s.ClusterNets, c)
	}
	for _, r := range m.routes {
		s.Routes = append(s.Routes, r)
	}
	for _, f := range m.frontends {
		s.Frontends = append(s.Frontends, f)
	}
	for _, h := range m.health {
		s.HealthChecks = append(s.HealthChecks, h)
	}
	for _, f := range m.fips {
		s.FloatingIPs = append(s.FloatingIPs, f)
	}
	s.BGPSpeaker = m.speaker
	for _, p := range m.peers {
		s.BGPPeers = append(s.BGPPeers, p)
	}
	for _, p := range m.paths {
		s.BGPPaths = append(s.BGPPaths, p)
	}
	return stateText(calc.SortState(s))
}

func stateText(s *calc.State) string {
	s = calc.SortState(&calc.State{VTEPs: s.VTEPs, ClusterNets: s.ClusterNets, Routes: s.Routes, Frontends: s.Frontends, HealthChecks: s.HealthChecks,
		FloatingIPs: s.FloatingIPs, BGPSpeaker: s.BGPSpeaker, BGPPeers: s.BGPPeers, BGPPaths: s.BGPPaths})
	var b bytes.Buffer
	if err := s.WriteText(&b); err != nil {
		panic(err)
	}
	return b.String()
}

// readBatches replays an event log into batches, each ending at an in-sync (the last may not).
func readBatches(t *testing.T, path string) [][]store.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var batches [][]store.Event
	err = store.Replay(f, store.HandlerFunc(func(b []store.Event) {
		batches = append(batches, append([]store.Event(nil), b...))
	}))
	if err != nil {
		t.Fatal(err)
	}
	return batches
}

func readConfig(t *testing.T, path string) calc.Config {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c calc.Config
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	d := calc.DefaultConfig(c.NodeName)
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d
}

// run feeds batches to a new graph and a model of its consumer; at every in-sync it renders
// the state and checks that the consumer, fed only updates, holds the same.
func run(t *testing.T, cfg calc.Config, batches [][]store.Event) (checkpoints []string) {
	t.Helper()
	g, err := calc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := newModel()
	synced := false
	for _, b := range batches {
		u := g.OnEvents(b)
		endsInSync := len(b) > 0 && b[len(b)-1].Type == store.EventInSync
		synced = synced || endsInSync || hasInSync(b)
		if !synced && u != nil {
			t.Fatalf("an update before the first in-sync: %+v", u)
		}
		if u != nil {
			m.apply(t, u)
		}
		if endsInSync {
			want := stateText(g.State())
			if got := m.text(); got != want {
				t.Fatalf("the consumer's state differs from calc's:\n--- consumer\n%s\n--- calc\n%s", got, want)
			}
			checkpoints = append(checkpoints, want)
		}
	}
	return checkpoints
}

func hasInSync(b []store.Event) bool {
	for _, e := range b {
		if e.Type == store.EventInSync {
			return true
		}
	}
	return false
}

// finalObjects is everything the log leaves in the datastore, as upserts.
func finalObjects(batches [][]store.Event) []store.Event {
	idx := store.NewIndex()
	for _, b := range batches {
		idx.OnEvents(b)
	}
	snap := idx.Snapshot()
	var out []store.Event
	for _, k := range store.Kinds {
		for _, o := range snap.List(k) {
			key, _ := store.KeyFor(k, o.ID())
			out = append(out, store.Event{Type: store.EventUpsert, Kind: k, ID: o.ID(), Key: key, Object: o})
		}
	}
	return out
}

func inSync() store.Event { return store.Event{Type: store.EventInSync} }

func deleteOf(e store.Event) store.Event {
	return store.Event{Type: store.EventDelete, Kind: e.Kind, ID: e.ID, Key: e.Key}
}

// orders are the order expanders: the same final objects reached in different ways.
func orders(objs []store.Event) map[string][][]store.Event {
	rev := append([]store.Event(nil), objs...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	var dup, recreate []store.Event
	for _, e := range objs {
		dup = append(dup, e, e)
		recreate = append(recreate, e, deleteOf(e), e)
	}
	out := map[string][][]store.Event{
		"forward":               {append(append([]store.Event(nil), objs...), inSync())},
		"reversed":              {append(rev, inSync())},
		"duplicated":            {append(dup, inSync())},
		"deleted-and-recreated": {append(recreate, inSync())},
		"in-sync-first":         {{inSync()}, objs},
		"one-per-batch":         {{inSync()}},
	}
	for _, e := range objs {
		out["one-per-batch"] = append(out["one-per-batch"], []store.Event{e})
	}
	half := len(objs) / 2
	out["in-sync-midway"] = [][]store.Event{append(append([]store.Event(nil), rev[:half]...), inSync()), rev[half:]}
	for seed := range uint64(3) {
		sh := append([]store.Event(nil), objs...)
		r := rand.New(rand.NewPCG(seed, 42))
		r.Shuffle(len(sh), func(i, j int) { sh[i], sh[j] = sh[j], sh[i] })
		out[fmt.Sprintf("shuffled-%d", seed)] = [][]store.Event{append(sh, inSync())}
	}
	return out
}

// finalState runs batches and returns the state the graph ends in, checking the consumer too.
func finalState(t *testing.T, cfg calc.Config, batches [][]store.Event) string {
	t.Helper()
	g, err := calc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := newModel()
	for _, b := range batches {
		if u := g.OnEvents(b); u != nil {
			m.apply(t, u)
		}
	}
	want := stateText(g.State())
	if got := m.text(); got != want {
		t.Fatalf("the consumer's state differs from calc's:\n--- consumer\n%s\n--- calc\n%s", got, want)
	}
	return want
}

func TestGolden(t *testing.T) {
	logs, _ := filepath.Glob("../testdata/calc/*/events.jsonl")
	if len(logs) == 0 {
		t.Fatal("no golden cases found")
	}
	for _, log := range logs {
		dir := filepath.Dir(log)
		configs, _ := filepath.Glob(filepath.Join(dir, "*.config.json"))
		if len(configs) == 0 {
			t.Fatalf("%s has no *.config.json", dir)
		}
		batches := readBatches(t, log)
		for _, cfgPath := range configs {
			name := strings.TrimSuffix(filepath.Base(cfgPath), ".config.json")
			t.Run(filepath.Base(dir)+"/"+name, func(t *testing.T) {
				cfg := readConfig(t, cfgPath)
				cps := run(t, cfg, batches)
				if len(cps) == 0 {
					t.Fatal("the log has no in-sync")
				}
				var b strings.Builder
				for i, cp := range cps {
					fmt.Fprintf(&b, "=== after in-sync %d\n%s\n", i+1, cp)
				}
				wantPath := filepath.Join(dir, name+".want.txt")
				if *update {
					if err := os.WriteFile(wantPath, []byte(b.String()), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(wantPath)
				if err != nil {
					t.Fatalf("%v (run with -update to write it)", err)
				}
				if b.String() != string(want) {
					t.Fatalf("%s differs:\n--- got\n%s\n--- want\n%s", wantPath, b.String(), want)
				}
				final := cps[len(cps)-1]
				objs := finalObjects(batches)
				for oname, o := range orders(objs) {
					if got := finalState(t, cfg, o); got != final {
						t.Errorf("order %q ends in a different state:\n--- got\n%s\n--- want\n%s", oname, got, final)
					}
				}
				// An event that changes nothing produces no output at all.
				g, _ := calc.New(cfg)
				g.OnEvents(append(objs, inSync()))
				for _, e := range objs {
					if u := g.OnEvents([]store.Event{e}); u != nil {
						t.Fatalf("re-sending %s produced an update: %+v", e.Key, u)
					}
				}
			})
		}
	}
}

// TestStateUpdateIsTheFirstUpdate: the desired state of every golden case, written with gob
// and read back (as an agent keeps it across a restart), gives as its Update the very ops
// calc's first update of the same inputs carries, in the same order.
func TestStateUpdateIsTheFirstUpdate(t *testing.T) {
	logs, _ := filepath.Glob("../testdata/calc/*/events.jsonl")
	for _, log := range logs {
		dir := filepath.Dir(log)
		configs, _ := filepath.Glob(filepath.Join(dir, "*.config.json"))
		objs := finalObjects(readBatches(t, log))
		for _, cfgPath := range configs {
			t.Run(filepath.Base(dir)+"/"+strings.TrimSuffix(filepath.Base(cfgPath), ".config.json"), func(t *testing.T) {
				cfg := readConfig(t, cfgPath)
				g, err := calc.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				first := g.OnEvents(append(objs, inSync()))
				if first == nil || !first.Full {
					t.Fatalf("calc's first update is not full: %+v", first)
				}
				var raw bytes.Buffer
				if err := gob.NewEncoder(&raw).Encode(g.State()); err != nil {
					t.Fatal(err)
				}
				var kept calc.State
				if err := gob.NewDecoder(&raw).Decode(&kept); err != nil {
					t.Fatal(err)
				}
				got := kept.Update()
				if !got.Full || len(got.Ops) == 0 {
					t.Fatalf("the kept state's update: full %v, %d ops", got.Full, len(got.Ops))
				}
				if a, b := opsJSON(t, got.Ops), opsJSON(t, first.Ops); a != b {
					t.Errorf("the kept state's ops differ from calc's first update:\n--- kept\n%s\n--- calc\n%s", a, b)
				}
			})
		}
	}
}

// opsJSON writes ops one per line, what each points at spelled out.
func opsJSON(t *testing.T, ops []calc.Op) string {
	t.Helper()
	var b strings.Builder
	for _, op := range ops {
		line, err := json.Marshal(op)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}
