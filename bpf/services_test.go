package bpf

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// Unit tests of the service maps' driver over the in-memory fakes: no root, no kernel.
//
// Addresses: the pool is 10.244.0.0/16 (the test's own), cluster and load-balancer IPs and
// node addresses come from the documentation ranges. node-a is this node.

const svtNode = "node-a"

var (
	svtSizes  = MapSizes{Frontends: 64, Backends: 256, SourceRanges: 32, ClusterNets: 32}
	svtNodeA  = netip.MustParseAddr("192.0.2.1")
	svtNodeB  = netip.MustParseAddr("192.0.2.2")
	svtNodeB2 = netip.MustParseAddr("192.0.2.3") // node-b's address after it changed
)

func svtConfig() Config {
	return Config{NodeName: svtNode, TunnelMTU: 1450, VXLANPort: DefaultVXLANPort, VNI: DefaultVNI,
		PSNATMin: DefaultPSNATMin, PSNATMax: DefaultPSNATMax, NetnsCookie: 4096}
}

// svtBE is an endpoint on node, whose underlay address is nodeAddr (invalid: none).
func svtBE(ap, node string, nodeAddr netip.Addr) calc.Backend {
	a := netip.MustParseAddrPort(ap)
	return calc.Backend{Addr: a.Addr(), Port: a.Port(), Node: node, NodeAddr: nodeAddr}
}

// svtFE is a frontend as calc builds it for a cluster-policy service: the local endpoints
// first, then the rest; every endpoint present.
func svtFE(svc string, id uint64, kind calc.FrontendKind, ap string, proto store.Protocol, bes ...calc.Backend) calc.Frontend {
	a := netip.MustParseAddrPort(ap)
	f := calc.Frontend{Key: calc.FrontendKey{Addr: a.Addr(), Port: a.Port(), Protocol: proto}, Kind: kind, Service: svc,
		ServiceID: id, PortName: "p"}
	for _, b := range bes {
		if b.Node == svtNode {
			f.Backends = append(f.Backends, b)
			f.LocalBackends++
		}
	}
	for _, b := range bes {
		if b.Node != svtNode {
			f.Backends = append(f.Backends, b)
		}
	}
	for _, b := range bes {
		f.Present = append(f.Present, netip.AddrPortFrom(b.Addr, b.Port))
	}
	slices.SortFunc(f.Present, netip.AddrPort.Compare)
	return f
}

// svtWith returns f changed by edit.
func svtWith(f calc.Frontend, edit func(*calc.Frontend)) calc.Frontend {
	f.Backends = slices.Clone(f.Backends)
	f.SourceRanges = slices.Clone(f.SourceRanges)
	f.Present = slices.Clone(f.Present)
	edit(&f)
	return f
}

func svtPool(p string) calc.ClusterNet { return calc.ClusterNet{Prefix: netip.MustParsePrefix(p)} }

func svtHost(p, node string) calc.ClusterNet {
	return calc.ClusterNet{Prefix: netip.MustParsePrefix(p), Host: true, Node: node}
}

func svtWEP(dst, dev string) calc.Route {
	return calc.Route{Dst: netip.MustParsePrefix(dst), Type: calc.RouteUnicast, Device: dev, Reason: calc.ReasonLocalWorkload}
}

func svtRemote(dst string, gw netip.Addr, reason calc.RouteReason) calc.Route {
	return calc.Route{Dst: netip.MustParsePrefix(dst), Type: calc.RouteUnicast, Device: calc.DefaultVXLANDevice, Gateway: gw,
		OnLink: true, Reason: reason, Node: "node-b"}
}

// svtState is the desired state that a sequence of updates builds, keyed as calc keys it.
type svtState struct {
	nets   map[netip.Prefix]calc.ClusterNet
	routes map[netip.Prefix]calc.Route
	fronts map[calc.FrontendKey]calc.Frontend
}

func newSvtState() *svtState {
	return &svtState{nets: map[netip.Prefix]calc.ClusterNet{}, routes: map[netip.Prefix]calc.Route{},
		fronts: map[calc.FrontendKey]calc.Frontend{}}
}

func (s *svtState) clone() *svtState {
	return &svtState{nets: maps.Clone(s.nets), routes: maps.Clone(s.routes), fronts: maps.Clone(s.fronts)}
}

// apply folds one update into s.
func (s *svtState) apply(u *calc.Update) {
	if u.Full {
		*s = *newSvtState()
	}
	for _, op := range u.Ops {
		switch {
		case op.ClusterNet != nil && op.Remove:
			delete(s.nets, op.ClusterNet.Prefix)
		case op.ClusterNet != nil:
			s.nets[op.ClusterNet.Prefix] = *op.ClusterNet
		case op.Route != nil && op.Remove:
			delete(s.routes, op.Route.Dst)
		case op.Route != nil:
			s.routes[op.Route.Dst] = *op.Route
		case op.Frontend != nil && op.Remove:
			delete(s.fronts, op.Frontend.Key)
		case op.Frontend != nil:
			s.fronts[op.Frontend.Key] = *op.Frontend
		}
	}
}

// svtFold is the state a sequence of updates builds.
func svtFold(us []*calc.Update) *svtState {
	s := newSvtState()
	for _, u := range us {
		s.apply(u)
	}
	return s
}

func svtCmpPrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

func svtCmpFrontendKey(a, b calc.FrontendKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), strings.Compare(string(a.Protocol), string(b.Protocol)))
}

func svtSorted[K comparable, V any](m map[K]V, c func(a, b K) int) []V {
	keys := slices.SortedFunc(maps.Keys(m), c)
	out := make([]V, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}

// svtDiff is the update that takes a to b, in calc's apply order: cluster-net, route and
// frontend sets, then frontend, route and cluster-net removals carrying the old objects. With
// a nil, it is the full update of b.
func svtDiff(a, b *svtState) *calc.Update {
	u := &calc.Update{Full: a == nil}
	if a == nil {
		a = newSvtState()
	}
	for _, n := range svtSorted(b.nets, svtCmpPrefix) {
		if old, ok := a.nets[n.Prefix]; !ok || old != n {
			u.Ops = append(u.Ops, calc.Op{ClusterNet: &n})
		}
	}
	for _, r := range svtSorted(b.routes, svtCmpPrefix) {
		if old, ok := a.routes[r.Dst]; !ok || !reflect.DeepEqual(old, r) {
			u.Ops = append(u.Ops, calc.Op{Route: &r})
		}
	}
	for _, f := range svtSorted(b.fronts, svtCmpFrontendKey) {
		if old, ok := a.fronts[f.Key]; !ok || !reflect.DeepEqual(old, f) {
			u.Ops = append(u.Ops, calc.Op{Frontend: &f})
		}
	}
	for _, f := range svtSorted(a.fronts, svtCmpFrontendKey) {
		if _, ok := b.fronts[f.Key]; !ok {
			u.Ops = append(u.Ops, calc.Op{Remove: true, Frontend: &f})
		}
	}
	for _, r := range svtSorted(a.routes, svtCmpPrefix) {
		if _, ok := b.routes[r.Dst]; !ok {
			u.Ops = append(u.Ops, calc.Op{Remove: true, Route: &r})
		}
	}
	for _, n := range svtSorted(a.nets, svtCmpPrefix) {
		if _, ok := b.nets[n.Prefix]; !ok {
			u.Ops = append(u.Ops, calc.Op{Remove: true, ClusterNet: &n})
		}
	}
	return u
}

// svtDriver is a driver over fresh fakes.
type svtDriver struct {
	t      *testing.T
	s      *Services
	tables Tables
	fakes  *MemSet
}

func newSvtDriver(t *testing.T) *svtDriver {
	t.Helper()
	tables, fakes := MemTables(svtSizes)
	return &svtDriver{t: t, s: NewServices(tables, svtConfig()), tables: tables, fakes: fakes}
}

func (d *svtDriver) apply() {
	d.t.Helper()
	if err := d.s.Apply(); err != nil {
		d.t.Fatalf("Apply: %v", err)
	}
	// A whole apply leaves the backend index exactly the lists' (client-IP affinity reads it).
	if p := svtIndexProblems(d.fakes); len(p) > 0 {
		d.t.Fatalf("after an apply the backend index is wrong: %q", p)
	}
}

func (d *svtDriver) render() string {
	d.t.Helper()
	return svtRender(d.t, d.tables)
}

func svtRender(t *testing.T, tables Tables) string {
	t.Helper()
	out, err := Render(tables)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	return out
}

// writes counts the writes the fakes saw.
func (d *svtDriver) writes() int {
	f := d.fakes
	return f.Frontends.Writes + f.Backends.Writes + f.BackendIndex.Writes + f.SourceRanges.Writes + f.ClusterNets.Writes + f.Settings.Writes +
		f.Settings6.Writes + f.V6.Frontends.Writes + f.V6.Backends.Writes + f.V6.BackendIndex.Writes + f.V6.SourceRanges.Writes + f.V6.ClusterNets.Writes
}

// svtFresh is what a driver given only the full update of st programs.
func svtFresh(t *testing.T, st *svtState) (text string, problems map[string]string, workloads map[string]bool) {
	t.Helper()
	d := newSvtDriver(t)
	d.s.OnUpdate(svtDiff(nil, st))
	d.apply()
	return d.render(), d.s.Problems(), d.s.Workloads()
}

// svtDangling lists the frontends in the fakes that point at a missing backend entry: a
// packet there would meet a half-written service.
func svtDangling(f *MemSet) []string {
	fe, _ := f.Frontends.Dump()
	be, _ := f.Backends.Dump()
	var out []string
	for k, v := range fe {
		if v.Flags&FrontendAddrOnly != 0 {
			continue
		}
		for i := uint32(0); i < v.Count; i++ {
			if _, ok := be[BackendKey{ListId: v.ListId, Ordinal: i}]; !ok {
				out = append(out, fmt.Sprintf("%s lacks #%d", FrontendString(k, v), i))
			}
		}
	}
	slices.Sort(out)
	return out
}

// svtCheckText compares rendered text with the expected lines.
func svtCheckText(t *testing.T, what, got string, want []string) {
	t.Helper()
	w := slices.Clone(want)
	slices.Sort(w)
	if exp := strings.Join(w, "\n"); got != exp {
		t.Errorf("%s: the maps differ from what is expected\n%s", what, svtLineDiff(exp, got))
	}
}

// svtLineDiff shows the lines only in want (-) and only in got (+).
func svtLineDiff(want, got string) string {
	split := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			if l != "" {
				m[l] = true
			}
		}
		return m
	}
	w, g := split(want), split(got)
	var out []string
	for l := range w {
		if !g[l] {
			out = append(out, "-"+l)
		}
	}
	for l := range g {
		if !w[l] {
			out = append(out, "+"+l)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Or(strings.Compare(a[1:], b[1:]), strings.Compare(a, b)) })
	return strings.Join(out, "\n")
}

// svtChange applies "+line" and "-line" changes to the expected lines.
func svtChange(t *testing.T, lines []string, changes []string) []string {
	t.Helper()
	out := slices.Clone(lines)
	for _, c := range changes {
		l := c[1:]
		switch c[0] {
		case '+':
			if slices.Contains(out, l) {
				t.Fatalf("expectation adds a line it already has: %s", l)
			}
			out = append(out, l)
		case '-':
			i := slices.Index(out, l)
			if i < 0 {
				t.Fatalf("expectation removes a line it does not have: %s", l)
			}
			out = slices.Delete(out, i, i+1)
		default:
			t.Fatalf("expectation change %q: want + or -", c)
		}
	}
	return out
}

// The services of the transition sequence.
var (
	svtWebA   = svtBE("10.244.1.5:8080", svtNode, svtNodeA)
	svtWebA2  = svtBE("10.244.1.6:8080", svtNode, svtNodeA)
	svtWebB   = svtBE("10.244.2.7:8080", "node-b", svtNodeB)
	svtWebB2  = svtBE("10.244.2.7:8080", "node-b", svtNodeB2)
	svtDNSB   = svtBE("10.244.2.9:53", "node-b", svtNodeB)
	svtDNSB2  = svtBE("10.244.2.9:53", "node-b", svtNodeB2)
	svtDNSA   = svtBE("10.244.1.10:53", svtNode, svtNodeA)
	svtAPIA   = svtBE("10.244.1.8:8443", svtNode, svtNodeA)
	svtLegacy = svtBE("10.244.2.11:25", "node-b", svtNodeB)
)

// svtStep is one update of the transition sequence and what it changes in the maps.
type svtStep struct {
	name string
	// sets are calc.ClusterNet, calc.Route or calc.Frontend; dels are their keys:
	// svtNetKey, svtRouteKey or calc.FrontendKey.
	sets, dels []any
	changes    []string
	workloads  []string
}

type (
	svtNetKey   netip.Prefix
	svtRouteKey netip.Prefix
)

// svtUpdates turns the steps into calc updates: the first is the full update of its sets,
// the rest deltas in calc's order, removals carrying the object as it was.
func svtUpdates(t *testing.T, steps []svtStep) []*calc.Update {
	t.Helper()
	st := newSvtState()
	var out []*calc.Update
	for i, step := range steps {
		next := st.clone()
		if i == 0 {
			next = newSvtState()
		}
		for _, o := range step.sets {
			switch o := o.(type) {
			case calc.ClusterNet:
				next.nets[o.Prefix] = o
			case calc.Route:
				next.routes[o.Dst] = o
			case calc.Frontend:
				next.fronts[o.Key] = o
			default:
				t.Fatalf("step %q: set of %T", step.name, o)
			}
		}
		for _, o := range step.dels {
			var ok bool
			switch o := o.(type) {
			case svtNetKey:
				_, ok = next.nets[netip.Prefix(o)]
				delete(next.nets, netip.Prefix(o))
			case svtRouteKey:
				_, ok = next.routes[netip.Prefix(o)]
				delete(next.routes, netip.Prefix(o))
			case calc.FrontendKey:
				_, ok = next.fronts[o]
				delete(next.fronts, o)
			default:
				t.Fatalf("step %q: removal of %T", step.name, o)
			}
			if !ok {
				t.Fatalf("step %q removes %v, which is not there", step.name, o)
			}
		}
		if i == 0 {
			out = append(out, svtDiff(nil, next))
		} else {
			out = append(out, svtDiff(st, next))
		}
		st = next
	}
	return out
}

func svtSteps() []svtStep {
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	webNP := svtFE("default/web", 0xa1, calc.FrontendNodePort, "0.0.0.0:30080", store.ProtocolTCP, svtWebA, svtWebB)
	webNP.AffinityTimeout = 10800
	dnsU := svtFE("kube-system/dns", 0xd1, calc.FrontendClusterIP, "198.51.100.53:53", store.ProtocolUDP, svtDNSB)
	dnsT := svtFE("kube-system/dns", 0xd1, calc.FrontendClusterIP, "198.51.100.53:53", store.ProtocolTCP, svtDNSB)
	api := svtFE("default/api", 0xb1, calc.FrontendClusterIP, "198.51.100.20:443", store.ProtocolTCP, svtAPIA)
	apiLB := svtFE("default/api", 0xb1, calc.FrontendLoadBalancer, "203.0.113.10:443", store.ProtocolTCP, svtAPIA)
	apiLB.ExternalLocal = true
	apiLB.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.128/25"),
		netip.MustParsePrefix("2001:db8::/32")}
	legacy := svtFE("default/legacy", 0xe1, calc.FrontendClusterIP, "198.51.100.53:25", store.ProtocolTCP, svtLegacy)
	setBackends := func(f calc.Frontend, bes ...calc.Backend) calc.Frontend {
		g := svtFE(f.Service, f.ServiceID, f.Kind, netip.AddrPortFrom(f.Key.Addr, f.Key.Port).String(), f.Key.Protocol, bes...)
		return svtWith(f, func(f *calc.Frontend) {
			f.Backends, f.LocalBackends, f.Present = g.Backends, g.LocalBackends, g.Present
		})
	}
	webTerm := func(f calc.Frontend) calc.Frontend {
		// 10.244.1.6 terminates: ready endpoints remain, so it leaves the backends and
		// stays present (its flows drain).
		return svtWith(setBackends(f, svtWebA, svtWebB), func(f *calc.Frontend) {
			f.Present = []netip.AddrPort{netip.MustParseAddrPort("10.244.1.5:8080"), netip.MustParseAddrPort("10.244.1.6:8080"),
				netip.MustParseAddrPort("10.244.2.7:8080")}
		})
	}
	apiTerm := svtWith(api, func(f *calc.Frontend) { f.Backends[0].Terminating = true }) // the only endpoint: kept
	pfx := netip.MustParsePrefix
	return []svtStep{
		{
			name: "full",
			sets: []any{svtPool("10.244.0.0/16"), svtHost("192.0.2.1/32", svtNode), svtHost("192.0.2.2/32", "node-b"),
				svtHost("2001:db8::2/128", "node-b"), svtWEP("10.244.1.5/32", "cali1"),
				svtRemote("10.244.2.0/26", svtNodeB, calc.ReasonRemoteBlock), web, webNP, dnsU, dnsT},
			changes: []string{
				"+backend list 108e0c30356bb979 #0 10.244.1.5:8080 node 0.0.0.0 local",
				"+backend list 108e0c30356bb979 #1 10.244.2.7:8080 node 192.0.2.2",
				"+backend list f091067cdf60b429 #0 10.244.2.9:53 node 192.0.2.2",
				"+cluster-net 10.244.0.0/16 pool",
				"+cluster-net 192.0.2.1/32 node,self",
				"+cluster-net 192.0.2.2/32 node",
				"+cluster-net 2001:db8::2/128 node",
				"+frontend 0.0.0.0:30080/TCP service 00000000000000a1 list 108e0c30356bb979 backends 2 local 1 cluster-from 0 affinity 10800s node-port",
				"+frontend 198.51.100.10:0/any service 00000000000000a1 address-only",
				"+frontend 198.51.100.10:80/TCP service 00000000000000a1 list 108e0c30356bb979 backends 2 local 1 cluster-from 0",
				"+frontend 198.51.100.53:0/any service 00000000000000d1 address-only",
				"+frontend 198.51.100.53:53/TCP service 00000000000000d1 list f091067cdf60b429 backends 1 local 0 cluster-from 0",
				"+frontend 198.51.100.53:53/UDP service 00000000000000d1 list f091067cdf60b429 backends 1 local 0 cluster-from 0",
			},
			workloads: []string{"cali1"},
		},
		{
			name: "a service added",
			sets: []any{api, svtWEP("10.244.1.8/32", "cali2")},
			changes: []string{
				"+backend list 4d91eec5b1cbbed6 #0 10.244.1.8:8443 node 0.0.0.0 local",
				"+frontend 198.51.100.20:0/any service 00000000000000b1 address-only",
				"+frontend 198.51.100.20:443/TCP service 00000000000000b1 list 4d91eec5b1cbbed6 backends 1 local 1 cluster-from 0",
			},
			workloads: []string{"cali1", "cali2"},
		},
		{
			name: "an endpoint added to a service",
			sets: []any{setBackends(web, svtWebA, svtWebA2, svtWebB), setBackends(webNP, svtWebA, svtWebA2, svtWebB),
				svtWEP("10.244.1.6/32", "cali3")},
			changes: []string{
				"-backend list 108e0c30356bb979 #0 10.244.1.5:8080 node 0.0.0.0 local",
				"-backend list 108e0c30356bb979 #1 10.244.2.7:8080 node 192.0.2.2",
				"+backend list f1a607edbb845512 #0 10.244.1.5:8080 node 0.0.0.0 local",
				"+backend list f1a607edbb845512 #1 10.244.1.6:8080 node 0.0.0.0 local",
				"+backend list f1a607edbb845512 #2 10.244.2.7:8080 node 192.0.2.2",
				"-frontend 0.0.0.0:30080/TCP service 00000000000000a1 list 108e0c30356bb979 backends 2 local 1 cluster-from 0 affinity 10800s node-port",
				"+frontend 0.0.0.0:30080/TCP service 00000000000000a1 list f1a607edbb845512 backends 3 local 2 cluster-from 0 affinity 10800s node-port",
				"-frontend 198.51.100.10:80/TCP service 00000000000000a1 list 108e0c30356bb979 backends 2 local 1 cluster-from 0",
				"+frontend 198.51.100.10:80/TCP service 00000000000000a1 list f1a607edbb845512 backends 3 local 2 cluster-from 0",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name: "an endpoint turned terminating",
			sets: []any{webTerm(web), webTerm(webNP), apiTerm},
			changes: []string{
				"+backend list 108e0c30356bb979 #0 10.244.1.5:8080 node 0.0.0.0 local",
				"+backend list 108e0c30356bb979 #1 10.244.2.7:8080 node 192.0.2.2",
				"-backend list f1a607edbb845512 #0 10.244.1.5:8080 node 0.0.0.0 local",
				"-backend list f1a607edbb845512 #1 10.244.1.6:8080 node 0.0.0.0 local",
				"-backend list f1a607edbb845512 #2 10.244.2.7:8080 node 192.0.2.2",
				"+frontend 0.0.0.0:30080/TCP service 00000000000000a1 list 108e0c30356bb979 backends 2 local 1 cluster-from 0 affinity 10800s node-port",
				"-frontend 0.0.0.0:30080/TCP service 00000000000000a1 list f1a607edbb845512 backends 3 local 2 cluster-from 0 affinity 10800s node-port",
				"+frontend 198.51.100.10:80/TCP service 00000000000000a1 list 108e0c30356bb979 backends 2 local 1 cluster-from 0",
				"-frontend 198.51.100.10:80/TCP service 00000000000000a1 list f1a607edbb845512 backends 3 local 2 cluster-from 0",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name: "a local endpoint beside a remote one",
			sets: []any{setBackends(dnsU, svtDNSA, svtDNSB), setBackends(dnsT, svtDNSA, svtDNSB)},
			changes: []string{
				"+backend list b04985bc16b11cea #0 10.244.1.10:53 node 0.0.0.0 local",
				"+backend list b04985bc16b11cea #1 10.244.2.9:53 node 192.0.2.2",
				"-backend list f091067cdf60b429 #0 10.244.2.9:53 node 192.0.2.2",
				"+frontend 198.51.100.53:53/TCP service 00000000000000d1 list b04985bc16b11cea backends 2 local 1 cluster-from 0",
				"-frontend 198.51.100.53:53/TCP service 00000000000000d1 list f091067cdf60b429 backends 1 local 0 cluster-from 0",
				"+frontend 198.51.100.53:53/UDP service 00000000000000d1 list b04985bc16b11cea backends 2 local 1 cluster-from 0",
				"-frontend 198.51.100.53:53/UDP service 00000000000000d1 list f091067cdf60b429 backends 1 local 0 cluster-from 0",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name: "a frontend removed",
			dels: []any{webNP.Key},
			changes: []string{
				"-frontend 0.0.0.0:30080/TCP service 00000000000000a1 list 108e0c30356bb979 backends 2 local 1 cluster-from 0 affinity 10800s node-port",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name: "a second service on a cluster IP, on a lower port",
			sets: []any{legacy},
			changes: []string{
				"+backend list 56e3ccee05de72ff #0 10.244.2.11:25 node 192.0.2.2",
				"-frontend 198.51.100.53:0/any service 00000000000000d1 address-only",
				"+frontend 198.51.100.53:0/any service 00000000000000e1 address-only",
				"+frontend 198.51.100.53:25/TCP service 00000000000000e1 list 56e3ccee05de72ff backends 1 local 0 cluster-from 0",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name: "the lower one removed: the address stays, naming the other",
			dels: []any{legacy.Key},
			changes: []string{
				"-backend list 56e3ccee05de72ff #0 10.244.2.11:25 node 192.0.2.2",
				"+frontend 198.51.100.53:0/any service 00000000000000d1 address-only",
				"-frontend 198.51.100.53:0/any service 00000000000000e1 address-only",
				"-frontend 198.51.100.53:25/TCP service 00000000000000e1 list 56e3ccee05de72ff backends 1 local 0 cluster-from 0",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name: "source ranges added",
			sets: []any{apiLB},
			changes: []string{
				"+frontend 203.0.113.10:443/TCP service 00000000000000b1 list 4d91eec5b1cbbed6 backends 1 local 1 cluster-from 0 external-local,source-ranges",
				"+source-range 203.0.113.10:443/TCP from 192.0.2.0/24",
				"+source-range 203.0.113.10:443/TCP from 198.51.100.128/25",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name: "a source range removed",
			sets: []any{svtWith(apiLB, func(f *calc.Frontend) {
				f.SourceRanges = []netip.Prefix{pfx("192.0.2.0/24"), pfx("2001:db8::/32")}
			})},
			changes: []string{
				"-source-range 203.0.113.10:443/TCP from 198.51.100.128/25",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name: "every source range removed",
			sets: []any{svtWith(apiLB, func(f *calc.Frontend) { f.SourceRanges = nil })},
			changes: []string{
				"+frontend 203.0.113.10:443/TCP service 00000000000000b1 list 4d91eec5b1cbbed6 backends 1 local 1 cluster-from 0 external-local",
				"-frontend 203.0.113.10:443/TCP service 00000000000000b1 list 4d91eec5b1cbbed6 backends 1 local 1 cluster-from 0 external-local,source-ranges",
				"-source-range 203.0.113.10:443/TCP from 192.0.2.0/24",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name: "a pool added and a node's address changed",
			sets: []any{svtPool("10.245.0.0/16"), svtHost("192.0.2.3/32", "node-b"),
				setBackends(webTerm(web), svtWebA, svtWebB2),
				setBackends(dnsU, svtDNSA, svtDNSB2),
				setBackends(dnsT, svtDNSA, svtDNSB2),
				svtRemote("10.244.2.0/26", svtNodeB2, calc.ReasonRemoteBlock)},
			dels: []any{svtNetKey(pfx("192.0.2.2/32"))},
			changes: []string{
				"-backend list 108e0c30356bb979 #0 10.244.1.5:8080 node 0.0.0.0 local",
				"-backend list 108e0c30356bb979 #1 10.244.2.7:8080 node 192.0.2.2",
				"+backend list 5e07661de6c12656 #0 10.244.1.5:8080 node 0.0.0.0 local",
				"+backend list 5e07661de6c12656 #1 10.244.2.7:8080 node 192.0.2.3",
				"+backend list 8a8ed8906932051d #0 10.244.1.10:53 node 0.0.0.0 local",
				"+backend list 8a8ed8906932051d #1 10.244.2.9:53 node 192.0.2.3",
				"-backend list b04985bc16b11cea #0 10.244.1.10:53 node 0.0.0.0 local",
				"-backend list b04985bc16b11cea #1 10.244.2.9:53 node 192.0.2.2",
				"+cluster-net 10.245.0.0/16 pool",
				"-cluster-net 192.0.2.2/32 node",
				"+cluster-net 192.0.2.3/32 node",
				"-frontend 198.51.100.10:80/TCP service 00000000000000a1 list 108e0c30356bb979 backends 2 local 1 cluster-from 0",
				"+frontend 198.51.100.10:80/TCP service 00000000000000a1 list 5e07661de6c12656 backends 2 local 1 cluster-from 0",
				"+frontend 198.51.100.53:53/TCP service 00000000000000d1 list 8a8ed8906932051d backends 2 local 1 cluster-from 0",
				"-frontend 198.51.100.53:53/TCP service 00000000000000d1 list b04985bc16b11cea backends 2 local 1 cluster-from 0",
				"+frontend 198.51.100.53:53/UDP service 00000000000000d1 list 8a8ed8906932051d backends 2 local 1 cluster-from 0",
				"-frontend 198.51.100.53:53/UDP service 00000000000000d1 list b04985bc16b11cea backends 2 local 1 cluster-from 0",
			},
			workloads: []string{"cali1", "cali2", "cali3"},
		},
		{
			name:      "a workload moved away and one gone",
			sets:      []any{svtRemote("10.244.1.5/32", svtNodeB2, calc.ReasonRemoteWorkload)},
			dels:      []any{svtRouteKey(pfx("10.244.1.8/32"))},
			changes:   nil, // nothing in the maps changes
			workloads: []string{"cali3"},
		},
		{
			name: "the last service on a cluster IP removed, and a pool",
			dels: []any{dnsU.Key, dnsT.Key, svtNetKey(pfx("10.245.0.0/16"))},
			changes: []string{
				"-backend list 8a8ed8906932051d #0 10.244.1.10:53 node 0.0.0.0 local",
				"-backend list 8a8ed8906932051d #1 10.244.2.9:53 node 192.0.2.3",
				"-cluster-net 10.245.0.0/16 pool",
				"-frontend 198.51.100.53:0/any service 00000000000000d1 address-only",
				"-frontend 198.51.100.53:53/TCP service 00000000000000d1 list 8a8ed8906932051d backends 2 local 1 cluster-from 0",
				"-frontend 198.51.100.53:53/UDP service 00000000000000d1 list 8a8ed8906932051d backends 2 local 1 cluster-from 0",
			},
			workloads: []string{"cali3"},
		},
	}
}

// svtExpect is what each step of a sequence should leave: the text the steps' changes build
// and what a fresh driver given the step's state as one full update programs.
type svtExpect struct {
	steps     []svtStep
	updates   []*calc.Update
	states    []*svtState
	want      [][]string
	fresh     []string
	problems  []map[string]string
	workloads []map[string]bool
}

func newSvtExpect(t *testing.T, steps []svtStep) *svtExpect {
	t.Helper()
	e := &svtExpect{steps: steps, updates: svtUpdates(t, steps)}
	var lines []string
	for i := range steps {
		st := svtFold(e.updates[:i+1])
		lines = svtChange(t, lines, steps[i].changes)
		text, problems, workloads := svtFresh(t, st)
		e.states = append(e.states, st)
		e.want = append(e.want, lines)
		e.fresh = append(e.fresh, text)
		e.problems = append(e.problems, problems)
		e.workloads = append(e.workloads, workloads)
	}
	return e
}

// check compares the driver after it took the updates up to step i with what is expected.
func (e *svtExpect) check(t *testing.T, d *svtDriver, i int, how string) {
	t.Helper()
	what := fmt.Sprintf("%s, step %d (%s)", how, i, e.steps[i].name)
	got := d.render()
	svtCheckText(t, what, got, e.want[i])
	if got != e.fresh[i] {
		t.Errorf("%s: the maps differ from a fresh driver's given the state as one full update\n%s", what, svtLineDiff(e.fresh[i], got))
	}
	if p := d.s.Problems(); !maps.Equal(p, e.problems[i]) {
		t.Errorf("%s: problems %v; a fresh driver has %v", what, p, e.problems[i])
	}
	w := d.s.Workloads()
	if !maps.Equal(w, e.workloads[i]) {
		t.Errorf("%s: workloads %v; a fresh driver has %v", what, w, e.workloads[i])
	}
	if want := e.steps[i].workloads; !slices.Equal(slices.Sorted(maps.Keys(w)), want) {
		t.Errorf("%s: workloads %v; want %v", what, slices.Sorted(maps.Keys(w)), want)
	}
	if dl := svtDangling(d.fakes); len(dl) > 0 {
		t.Errorf("%s: frontends point at missing backends: %v", what, dl)
	}
}

func TestServicesTransitions(t *testing.T) {
	e := newSvtExpect(t, svtSteps())
	last := len(e.steps) - 1
	for i := range e.steps {
		if len(e.problems[i]) > 0 {
			t.Errorf("step %d (%s): problems %v; want none", i, e.steps[i].name, e.problems[i])
		}
	}

	t.Run("forward", func(t *testing.T) {
		d := newSvtDriver(t)
		for i, u := range e.updates {
			d.s.OnUpdate(u)
			d.apply()
			e.check(t, d, i, "forward")
			before := d.s.Stats().Writes
			d.apply()
			if w := d.s.Stats().Writes - before; w != 0 {
				t.Errorf("step %d (%s): a second Apply wrote %d entries; want none", i, e.steps[i].name, w)
			}
		}
	})

	// A reread at any step, with the step's changes not yet written (the periodic resync
	// landing in the same apply as a change), finds the maps as the driver left them: no
	// drift. Then an entry changed by hand is found, and only it.
	t.Run("resync with each step", func(t *testing.T) {
		d := newSvtDriver(t)
		for i, u := range e.updates {
			d.s.OnUpdate(u)
			if i > 0 {
				d.s.QueueResync()
			}
			before := d.s.Stats().Drift
			d.apply()
			e.check(t, d, i, "resync with each step")
			if n := d.s.Stats().Drift - before; n != 0 {
				t.Errorf("step %d (%s): a resync with the step's changes counted %d drift; want 0", i, e.steps[i].name, n)
			}
		}
	})

	t.Run("each delta twice", func(t *testing.T) {
		d := newSvtDriver(t)
		for i, u := range e.updates {
			d.s.OnUpdate(u)
			if i > 0 {
				d.s.OnUpdate(u)
			}
			d.apply()
			e.check(t, d, i, "each delta twice")
		}
	})

	t.Run("each op twice", func(t *testing.T) {
		d := newSvtDriver(t)
		for i, u := range e.updates {
			dup := &calc.Update{Full: u.Full}
			for _, op := range u.Ops {
				dup.Ops = append(dup.Ops, op, op)
			}
			d.s.OnUpdate(dup)
			d.apply()
			e.check(t, d, i, "each op twice")
		}
	})

	t.Run("applied every third update", func(t *testing.T) {
		d := newSvtDriver(t)
		for i, u := range e.updates {
			d.s.OnUpdate(u)
			if i%3 == 2 || i == last {
				d.apply()
				e.check(t, d, i, "applied every third update")
			}
		}
	})

	for k := range e.steps {
		t.Run(fmt.Sprintf("full update at step %d", k), func(t *testing.T) {
			d := newSvtDriver(t)
			d.s.OnUpdate(svtDiff(nil, e.states[k]))
			d.apply()
			e.check(t, d, k, "full first")
			for i := k + 1; i <= last; i++ {
				d.s.OnUpdate(e.updates[i])
				d.apply()
				e.check(t, d, i, "after a later full update")
			}
		})

		t.Run(fmt.Sprintf("deltas before the full update at step %d", k), func(t *testing.T) {
			d := newSvtDriver(t)
			for i := 1; i <= k; i++ {
				d.s.OnUpdate(e.updates[i])
				d.apply()
			}
			if w := d.writes(); w != 0 || d.render() != "" || d.s.Ready() {
				t.Fatalf("before the first full update: %d writes, ready %v, maps %q; want nothing", w, d.s.Ready(), d.render())
			}
			d.s.OnUpdate(svtDiff(nil, e.states[k]))
			d.apply()
			e.check(t, d, k, "full after deltas")
			for i := k + 1; i <= last; i++ {
				d.s.OnUpdate(e.updates[i])
				d.apply()
				e.check(t, d, i, "full after deltas")
			}
		})

		t.Run(fmt.Sprintf("full update again at step %d", k), func(t *testing.T) {
			d := newSvtDriver(t)
			for i := 0; i <= last; i++ {
				d.s.OnUpdate(e.updates[i])
				d.apply()
				if i == k {
					before := d.writes()
					d.s.OnUpdate(svtDiff(nil, e.states[k]))
					d.apply()
					if w := d.writes() - before; w != 0 {
						t.Errorf("a full update of the state the maps hold wrote %d entries; want none", w)
					}
				}
				e.check(t, d, i, "full again")
			}
		})
	}

	t.Run("reversed", func(t *testing.T) {
		d := newSvtDriver(t)
		d.s.OnUpdate(svtDiff(nil, e.states[last]))
		d.apply()
		for i := last; i > 0; i-- {
			d.s.OnUpdate(svtDiff(e.states[i], e.states[i-1]))
			d.apply()
			e.check(t, d, i-1, "reversed")
		}
	})

	t.Run("jumps", func(t *testing.T) {
		order := []int{0, last, 3, 8, 1, last - 1, 6, 2, last, 0, 9, 5}
		d := newSvtDriver(t)
		d.s.OnUpdate(svtDiff(nil, e.states[order[0]]))
		d.apply()
		for j := 1; j < len(order); j++ {
			d.s.OnUpdate(svtDiff(e.states[order[j-1]], e.states[order[j]]))
			d.apply()
			e.check(t, d, order[j], fmt.Sprintf("jump from step %d", order[j-1]))
		}
	})
}

// svtWatched is a table that checks the maps after each write.
type svtWatched[K comparable, V any] struct {
	Table[K, V]
	after func()
}

func (w svtWatched[K, V]) Put(k K, v V) error {
	err := w.Table.Put(k, v)
	w.after()
	return err
}

func (w svtWatched[K, V]) Delete(k K) error {
	err := w.Table.Delete(k)
	w.after()
	return err
}

// svtRecorder logs every operation the driver asks of the fakes, in order, failing the ones
// fail says; after each write it checks that no frontend points at a missing backend.
type svtRecorder struct {
	log        []string
	violations []string
	fail       func(op, table, key string) error
}

func (r *svtRecorder) hook(op, table, key string) error {
	var err error
	if r.fail != nil {
		err = r.fail(op, table, key)
	}
	entry := op + " " + table + ": " + key
	if err != nil {
		entry += " (failed)"
	}
	r.log = append(r.log, entry)
	return err
}

func svtFEKey(k FrontendKey) string {
	return netip.AddrPortFrom(HostAddr(k.Addr), HostPort(k.Port)).String() + "/" + ProtoName(k.Proto)
}

func svtBEKey(k BackendKey) string { return fmt.Sprintf("list %016x #%d", k.ListId, k.Ordinal) }

// newSvtRecorded is a driver whose fakes record into r.
func newSvtRecorded(t *testing.T, r *svtRecorder) *svtDriver {
	t.Helper()
	d := newSvtDriver(t)
	f := d.fakes
	f.Frontends.Fail = func(op string, k FrontendKey) error { return r.hook(op, "frontend", svtFEKey(k)) }
	f.Backends.Fail = func(op string, k BackendKey) error { return r.hook(op, "backend", svtBEKey(k)) }
	f.SourceRanges.Fail = func(op string, k SourceRangeKey) error { return r.hook(op, "source-range", SourceRangeString(k)) }
	f.ClusterNets.Fail = func(op string, k ClusterNetKey) error {
		return r.hook(op, "cluster-net", netip.PrefixFrom(HostAddr(k.Addr), int(k.Prefixlen)).String())
	}
	f.Settings.Fail = func(op string, k uint32) error { return r.hook(op, "settings", fmt.Sprint(k)) }
	check := func() {
		if dl := svtDangling(f); len(dl) > 0 {
			r.violations = append(r.violations, fmt.Sprintf("after %q: %v", r.log[len(r.log)-1], dl))
		}
	}
	d.tables = Tables{
		Frontends:    svtWatched[FrontendKey, FrontendValue]{f.Frontends, check},
		Backends:     svtWatched[BackendKey, BackendValue]{f.Backends, check},
		BackendIndex: svtWatched[BackendIndex, uint32]{f.BackendIndex, check},
		SourceRanges: svtWatched[SourceRangeKey, uint32]{f.SourceRanges, check},
		ClusterNets:  svtWatched[ClusterNetKey, ClusterNetVal]{f.ClusterNets, check},
		Settings:     svtWatched[uint32, Settings]{f.Settings, check},
	}
	d.s = NewServices(d.tables, svtConfig())
	return d
}

// phases groups the log into runs of one operation on one table, each run sorted (the order
// within a run is the order of a map walk).
func (r *svtRecorder) phases() []string {
	var out []string
	var run []string
	head := ""
	flush := func() {
		if len(run) > 0 {
			slices.Sort(run)
			out = append(out, head+": "+strings.Join(run, ", "))
		}
		run = nil
	}
	for _, e := range r.log {
		h, k, _ := strings.Cut(e, ": ")
		if h != head {
			flush()
			head = h
		}
		run = append(run, k)
	}
	flush()
	r.log = nil
	return out
}

func (d *svtDriver) listOf(k calc.FrontendKey) string {
	return fmt.Sprintf("%016x", d.fakes.Frontends.Entries[FrontendMapKey(k)].ListId)
}

// svtNamed puts the lists' IDs for their names ("{A}") in the expected phases.
func svtNamed(phases []string, ids map[string]string) []string {
	out := slices.Clone(phases)
	for i := range out {
		for name, id := range ids {
			out[i] = strings.ReplaceAll(out[i], name, id)
		}
	}
	return out
}

func TestServicesWriteOrder(t *testing.T) {
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	webNP := svtFE("default/web", 0xa1, calc.FrontendNodePort, "0.0.0.0:30080", store.ProtocolTCP, svtWebA, svtWebB)
	api := svtFE("default/api", 0xb1, calc.FrontendClusterIP, "198.51.100.20:443", store.ProtocolTCP, svtAPIA)
	shop := svtFE("default/shop", 0xc1, calc.FrontendLoadBalancer, "203.0.113.10:443", store.ProtocolTCP,
		svtBE("10.244.1.12:8443", svtNode, svtNodeA))
	shop.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	moved := func(f calc.Frontend, bes ...calc.Backend) calc.Frontend {
		g := svtFE(f.Service, f.ServiceID, f.Kind, netip.AddrPortFrom(f.Key.Addr, f.Key.Port).String(), f.Key.Protocol, bes...)
		g.SourceRanges = f.SourceRanges
		return g
	}

	r := &svtRecorder{}
	d := newSvtRecorded(t, r)
	st := newSvtState()
	st.nets[netip.MustParsePrefix("10.244.0.0/16")] = svtPool("10.244.0.0/16")
	for _, f := range []calc.Frontend{web, webNP, api} {
		st.fronts[f.Key] = f
	}
	step := func(edit func(next *svtState)) (*svtState, error) {
		next := st.clone()
		edit(next)
		d.s.OnUpdate(svtDiff(st, next))
		st = next
		return next, d.s.Apply()
	}
	d.s.OnUpdate(svtDiff(nil, st))
	d.apply()
	listA, listAPI := d.listOf(web.Key), d.listOf(api.Key)
	if got, want := r.phases(), svtNamed([]string{
		"put settings: 0",
		"put cluster-net: 10.244.0.0/16",
		"put backend: list {A} #0, list {A} #1, list {API} #0",
		"put frontend: 0.0.0.0:30080/TCP, 198.51.100.10:0/any, 198.51.100.10:80/TCP, 198.51.100.20:0/any, 198.51.100.20:443/TCP",
	}, map[string]string{"{A}": listA, "{API}": listAPI}); !slices.Equal(got, want) {
		t.Errorf("the first apply wrote\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A changed list is written beside the old one, the frontends move, then the old goes.
	if _, err := step(func(n *svtState) {
		n.fronts[web.Key] = moved(web, svtWebA, svtWebA2, svtWebB)
		n.fronts[webNP.Key] = moved(webNP, svtWebA, svtWebA2, svtWebB)
	}); err != nil {
		t.Fatal(err)
	}
	listB := d.listOf(web.Key)
	if got, want := r.phases(), svtNamed([]string{
		"put backend: list {B} #0, list {B} #1, list {B} #2",
		"put frontend: 0.0.0.0:30080/TCP, 198.51.100.10:80/TCP",
		"delete backend: list {A} #0, list {A} #1",
	}, map[string]string{"{A}": listA, "{B}": listB}); !slices.Equal(got, want) {
		t.Errorf("moving a service to a new list wrote\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A service removed and one added: the removed frontends first (room in a full map),
	// lists and source ranges before the frontend that uses them, the old list last.
	if _, err := step(func(n *svtState) {
		delete(n.fronts, api.Key)
		n.fronts[shop.Key] = shop
	}); err != nil {
		t.Fatal(err)
	}
	listShop := d.listOf(shop.Key)
	if got, want := r.phases(), svtNamed([]string{
		"delete frontend: 198.51.100.20:0/any, 198.51.100.20:443/TCP",
		"put backend: list {S} #0",
		"put source-range: 203.0.113.10:443/TCP from 192.0.2.0/24",
		"put frontend: 203.0.113.10:443/TCP",
		"delete backend: list {API} #0",
	}, map[string]string{"{API}": listAPI, "{S}": listShop}); !slices.Equal(got, want) {
		t.Errorf("replacing a service wrote\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Source ranges lifted: the frontend drops its flag before the ranges go.
	if _, err := step(func(n *svtState) {
		n.fronts[shop.Key] = moved(svtWith(shop, func(f *calc.Frontend) { f.SourceRanges = nil }), shop.Backends...)
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := r.phases(), []string{
		"put frontend: 203.0.113.10:443/TCP",
		"delete source-range: 203.0.113.10:443/TCP from 192.0.2.0/24",
	}; !slices.Equal(got, want) {
		t.Errorf("lifting source ranges wrote\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Moving one frontend fails: its old list stays until it moved.
	r.fail = func(op, table, key string) error {
		if op == "put" && table == "frontend" && key == "198.51.100.10:80/TCP" {
			return errors.New("injected")
		}
		return nil
	}
	_, err := step(func(n *svtState) {
		n.fronts[web.Key] = moved(web, svtWebA2, svtWebB)
		n.fronts[webNP.Key] = moved(webNP, svtWebA2, svtWebB)
	})
	if err == nil || !strings.Contains(err.Error(), "198.51.100.10:80/TCP") || !strings.Contains(err.Error(), "injected") {
		t.Errorf("Apply with a failing frontend: %v; want the frontend's failure", err)
	}
	listC := d.listOf(webNP.Key)
	if got, want := r.phases(), svtNamed([]string{
		"put backend: list {C} #0, list {C} #1",
		"put frontend: 0.0.0.0:30080/TCP, 198.51.100.10:80/TCP (failed)",
	}, map[string]string{"{B}": listB, "{C}": listC}); !slices.Equal(got, want) {
		t.Errorf("moving with a failure wrote\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := d.listOf(web.Key); got != listB {
		t.Errorf("the failed frontend points at list %s; want the old list %s", got, listB)
	}
	r.fail = nil
	d.apply()
	if got, want := r.phases(), svtNamed([]string{
		"put frontend: 198.51.100.10:80/TCP",
		"delete backend: list {B} #0, list {B} #1, list {B} #2",
	}, map[string]string{"{B}": listB}); !slices.Equal(got, want) {
		t.Errorf("the retry wrote\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(r.violations) > 0 {
		t.Errorf("a frontend pointed at a missing backend:\n%s", strings.Join(r.violations, "\n"))
	}
	fresh, _, _ := svtFresh(t, st)
	if got := d.render(); got != fresh {
		t.Errorf("the maps differ from a fresh driver's\n%s", svtLineDiff(fresh, got))
	}
}

// svtRun gives a fresh driver the full update of st and applies it.
func svtRun(t *testing.T, st *svtState) *svtDriver {
	t.Helper()
	d := newSvtDriver(t)
	d.s.OnUpdate(svtDiff(nil, st))
	d.apply()
	return d
}

// svtStateOf is the state holding the frontends and this node's pool and address.
func svtStateOf(fronts ...calc.Frontend) *svtState {
	st := newSvtState()
	for _, n := range []calc.ClusterNet{svtPool("10.244.0.0/16"), svtHost("192.0.2.1/32", svtNode)} {
		st.nets[n.Prefix] = n
	}
	for _, f := range fronts {
		st.fronts[f.Key] = f
	}
	return st
}

// update moves the driver from st to next and applies.
func (d *svtDriver) update(st, next *svtState) error {
	d.s.OnUpdate(svtDiff(st, next))
	return d.s.Apply()
}

func TestServicesSharedLists(t *testing.T) {
	e1 := svtBE("10.244.1.20:80", svtNode, svtNodeA)
	e2 := svtBE("10.244.2.20:80", "node-b", svtNodeB)
	e3 := svtBE("10.244.2.21:80", "node-b", svtNodeB)
	a := svtFE("default/a", 0x1a, calc.FrontendClusterIP, "198.51.100.61:80", store.ProtocolTCP, e1, e2)
	b := svtFE("default/b", 0x1b, calc.FrontendClusterIP, "198.51.100.62:80", store.ProtocolTCP, e1, e2)
	shared := []string{
		"backend list ba15d26083737357 #0 10.244.1.20:80 node 0.0.0.0 local",
		"backend list ba15d26083737357 #1 10.244.2.20:80 node 192.0.2.2",
		"cluster-net 10.244.0.0/16 pool",
		"cluster-net 192.0.2.1/32 node,self",
		"frontend 198.51.100.61:0/any service 000000000000001a address-only",
		"frontend 198.51.100.61:80/TCP service 000000000000001a list ba15d26083737357 backends 2 local 1 cluster-from 0",
		"frontend 198.51.100.62:0/any service 000000000000001b address-only",
		"frontend 198.51.100.62:80/TCP service 000000000000001b list ba15d26083737357 backends 2 local 1 cluster-from 0",
	}
	st := svtStateOf(a, b)
	d := svtRun(t, st)
	svtCheckText(t, "two frontends with the same endpoints", d.render(), shared)
	if got := d.s.Counts()["backends"]; got != [2]int{2, 2} {
		t.Errorf("backend entries (desired, programmed) %v; want one list of 2", got)
	}

	// b's endpoints change: b gets a list of its own, a keeps the one it had.
	split := st.clone()
	split.fronts[b.Key] = svtFE("default/b", 0x1b, calc.FrontendClusterIP, "198.51.100.62:80", store.ProtocolTCP, e1, e2, e3)
	before := d.s.Stats().Writes
	if err := d.update(st, split); err != nil {
		t.Fatal(err)
	}
	svtCheckText(t, "one frontend's endpoints changed", d.render(), svtChange(t, shared, []string{
		"+backend list f6a40ce3f28e3268 #0 10.244.1.20:80 node 0.0.0.0 local",
		"+backend list f6a40ce3f28e3268 #1 10.244.2.20:80 node 192.0.2.2",
		"+backend list f6a40ce3f28e3268 #2 10.244.2.21:80 node 192.0.2.2",
		"-frontend 198.51.100.62:80/TCP service 000000000000001b list ba15d26083737357 backends 2 local 1 cluster-from 0",
		"+frontend 198.51.100.62:80/TCP service 000000000000001b list f6a40ce3f28e3268 backends 3 local 1 cluster-from 0",
	}))
	if w := d.s.Stats().Writes - before; w != 4 {
		t.Errorf("changing one frontend's endpoints wrote %d entries; want 4 (3 backends, 1 frontend)", w)
	}

	// Back to the same endpoints: one list again, b's own list deleted.
	before = d.s.Stats().Writes
	if err := d.update(split, st); err != nil {
		t.Fatal(err)
	}
	svtCheckText(t, "the same endpoints again", d.render(), shared)
	if w := d.s.Stats().Writes - before; w != 4 {
		t.Errorf("sharing again wrote %d entries; want 4 (1 frontend, 3 backends deleted)", w)
	}

	// The first frontend removed: the list stays for the second.
	only := st.clone()
	delete(only.fronts, a.Key)
	if err := d.update(st, only); err != nil {
		t.Fatal(err)
	}
	svtCheckText(t, "one of the two removed", d.render(), svtChange(t, shared, []string{
		"-frontend 198.51.100.61:0/any service 000000000000001a address-only",
		"-frontend 198.51.100.61:80/TCP service 000000000000001a list ba15d26083737357 backends 2 local 1 cluster-from 0",
	}))
}

// svtWithout is text without the line that starts with prefix.
func svtWithout(t *testing.T, text, prefix string) string {
	t.Helper()
	var out []string
	n := 0
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
			continue
		}
		out = append(out, l)
	}
	if n != 1 {
		t.Fatalf("%d lines start with %q; want 1", n, prefix)
	}
	return strings.Join(out, "\n")
}

// svtIndexProblems compares the backend index with the lists: every entry's address names
// its first ordinal, and nothing else is there.
func svtIndexProblems(f *MemSet) []string {
	return indexProblems(f.Backends.Entries, f.BackendIndex.Entries)
}

func indexProblems(be map[BackendKey]BackendValue, idx map[BackendIndex]uint32) []string {
	want := map[BackendIndex]uint32{}
	length := map[uint64]int{}
	for k := range be {
		length[k.ListId]++
	}
	for k, v := range be {
		if length[k.ListId] <= AffinityScan {
			continue
		}
		ik := BackendIndex{ListId: k.ListId, Addr: v.Addr, Port: v.Port}
		if o, ok := want[ik]; !ok || k.Ordinal < o {
			want[ik] = k.Ordinal
		}
	}
	var out []string
	for k, o := range want {
		if got, ok := idx[k]; !ok || got != o {
			out = append(out, fmt.Sprintf("%016x %v: %d, %v; want %d", k.ListId, HostAddr(k.Addr), got, ok, o))
		}
	}
	for k, o := range idx {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("%016x %v: %d, not in a list", k.ListId, HostAddr(k.Addr), o))
		}
	}
	slices.Sort(out)
	return out
}

// writesBy counts the fakes' writes per table.
func (d *svtDriver) writesBy() [6]int {
	f := d.fakes
	return [6]int{f.Frontends.Writes, f.Backends.Writes, f.BackendIndex.Writes, f.SourceRanges.Writes, f.ClusterNets.Writes, f.Settings.Writes}
}

func svtSub(a, b [6]int) [6]int {
	for i := range a {
		a[i] -= b[i]
	}
	return a
}

func TestServicesFailureContained(t *testing.T) {
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	dns := svtFE("kube-system/dns", 0xd1, calc.FrontendClusterIP, "198.51.100.53:53", store.ProtocolUDP, svtDNSB)
	api := svtFE("default/api", 0xb1, calc.FrontendClusterIP, "198.51.100.20:443", store.ProtocolTCP, svtAPIA)
	apiLB := svtFE("default/api", 0xb1, calc.FrontendLoadBalancer, "203.0.113.10:443", store.ProtocolTCP, svtAPIA)
	apiLB.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	base := svtStateOf(web, dns)
	next := svtStateOf(web, dns, api, apiLB)
	want, _, _ := svtFresh(t, next)

	d := svtRun(t, base)
	failing := FrontendMapKey(api.Key)
	d.fakes.Frontends.Fail = func(op string, k FrontendKey) error {
		if op == "put" && k == failing {
			return errors.New("injected")
		}
		return nil
	}
	err := d.update(base, next)
	if err == nil {
		t.Fatal("Apply with a failing frontend succeeded")
	}
	for _, s := range []string{"frontend 198.51.100.20:443/TCP", "of service default/api", "injected"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Apply: %v; want it to name %q", err, s)
		}
	}
	if n := len(strings.Split(err.Error(), "\n")); n != 1 {
		t.Errorf("Apply: %d errors (%v); want the one", n, err)
	}
	// Everything else is written: the address-only entry, the load balancer, its source
	// range, the list.
	svtCheckText(t, "with one frontend failing", d.render(), strings.Split(svtWithout(t, want, "frontend 198.51.100.20:443/TCP "), "\n"))

	// Still failing: tried again, nothing else written.
	before, beforeStats := d.writesBy(), d.s.Stats()
	if err := d.s.Apply(); err == nil || !strings.Contains(err.Error(), "198.51.100.20:443/TCP") {
		t.Errorf("Apply, still failing: %v; want the frontend's failure", err)
	}
	if w := svtSub(d.writesBy(), before); w != [6]int{} {
		t.Errorf("Apply, still failing, wrote %v; want nothing", w)
	}
	if st := d.s.Stats(); st.Failures != beforeStats.Failures+1 || st.Writes != beforeStats.Writes {
		t.Errorf("stats %+v after %+v; want one more failure and no write", st, beforeStats)
	}

	// The failure cleared: the pending frontend alone is written.
	d.fakes.Frontends.Fail = nil
	before, beforeStats = d.writesBy(), d.s.Stats()
	d.apply()
	if w := svtSub(d.writesBy(), before); w != [6]int{1, 0, 0, 0, 0, 0} {
		t.Errorf("the retry wrote %v (frontends, backends, source ranges, cluster nets, settings); want the one frontend", w)
	}
	if w := d.s.Stats().Writes - beforeStats.Writes; w != 1 {
		t.Errorf("the retry counted %d writes; want 1", w)
	}
	if got := d.render(); got != want {
		t.Errorf("after the retry\n%s", svtLineDiff(want, got))
	}

	// A failed delete: the frontend stays, and so does its list until it is gone.
	failing = FrontendMapKey(dns.Key)
	d.fakes.Frontends.Fail = func(op string, k FrontendKey) error {
		if op == "delete" && k == failing {
			return errors.New("injected")
		}
		return nil
	}
	gone := svtStateOf(web, api, apiLB)
	err = d.update(next, gone)
	if err == nil || !strings.Contains(err.Error(), "deleting frontend 198.51.100.53:53/UDP") {
		t.Errorf("Apply with a failing delete: %v; want the frontend named", err)
	}
	if dl := svtDangling(d.fakes); len(dl) > 0 {
		t.Errorf("frontends point at missing backends: %v", dl)
	}
	if !strings.Contains(d.render(), "backend list f091067cdf60b429 #0 10.244.2.9:53") {
		t.Errorf("the list of the frontend that could not be deleted is gone:\n%s", d.render())
	}
	d.fakes.Frontends.Fail = nil
	before = d.writesBy()
	d.apply()
	if w := svtSub(d.writesBy(), before); w != [6]int{1, 1, 0, 0, 0, 0} {
		t.Errorf("the retry wrote %v; want the frontend and its list's one entry deleted", w)
	}
	if want, _, _ := svtFresh(t, gone); d.render() != want {
		t.Errorf("after the retry\n%s", svtLineDiff(want, d.render()))
	}
}

func TestServicesMapFull(t *testing.T) {
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	dns := svtFE("kube-system/dns", 0xd1, calc.FrontendClusterIP, "198.51.100.53:53", store.ProtocolUDP, svtDNSB)
	shop := svtFE("default/shop", 0xc1, calc.FrontendLoadBalancer, "203.0.113.10:443", store.ProtocolTCP,
		svtBE("10.244.1.12:8443", svtNode, svtNodeA))
	base := svtStateOf(web, dns)
	next := svtStateOf(web, dns, shop)
	sizes := svtSizes
	sizes.Frontends = 4 // web's and dns's entries, each with its address-only entry
	tables, fakes := MemTables(sizes)
	d := &svtDriver{t: t, s: NewServices(tables, svtConfig()), tables: tables, fakes: fakes}
	d.s.OnUpdate(svtDiff(nil, base))
	d.apply()
	programmed := d.render()

	err := d.update(base, next)
	if err == nil {
		t.Fatal("Apply into a full map succeeded")
	}
	for _, s := range []string{"frontend 203.0.113.10:443/TCP", "of service default/shop", "map full", "(4 entries; raise option bpf-map-size-frontends)"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Apply: %v; want it to say %q", err, s)
		}
	}
	if !errors.Is(err, ErrMapFull) {
		t.Errorf("Apply: %v; want ErrMapFull", err)
	}
	if st := d.s.Stats(); st.MapFull != 1 || st.Failures != 1 {
		t.Errorf("stats %+v; want one failure, map full", st)
	}
	// The others are as they were; the new service's list is written, not its frontend.
	svtCheckText(t, "the frontend map full", d.render(), svtChange(t, strings.Split(programmed, "\n"), []string{
		"+backend list 8221573623f1c20a #0 10.244.1.12:8443 node 0.0.0.0 local",
	}))

	// Room made (in the same Apply: the removed frontends go first): the pending frontend goes in.
	room := svtStateOf(web, shop)
	if err := d.update(next, room); err != nil {
		t.Fatal(err)
	}
	if want, _, _ := svtFresh(t, room); d.render() != want {
		t.Errorf("with room made\n%s", svtLineDiff(want, d.render()))
	}
}

// TestServicesColdStartMapFull: a cold start into a frontend map too small writes what fits,
// names what did not, and writes the rest once there is room; no frontend points at a list
// that is not there.
func TestServicesColdStartMapFull(t *testing.T) {
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	dns := svtFE("kube-system/dns", 0xd1, calc.FrontendClusterIP, "198.51.100.53:53", store.ProtocolUDP, svtDNSB)
	shop := svtFE("default/shop", 0xc1, calc.FrontendLoadBalancer, "203.0.113.10:443", store.ProtocolTCP,
		svtBE("10.244.1.12:8443", svtNode, svtNodeA))
	all := svtStateOf(web, dns, shop)
	sizes := svtSizes
	sizes.Frontends = 4 // of the 5 entries (two cluster IPs with their address-only entries, one LB)
	tables, fakes := MemTables(sizes)
	d := &svtDriver{t: t, s: NewServices(tables, svtConfig()), tables: tables, fakes: fakes}
	d.s.OnUpdate(svtDiff(nil, all))
	err := d.s.Apply()
	if !errors.Is(err, ErrMapFull) {
		t.Fatalf("a cold start into a full frontend map: %v; want ErrMapFull", err)
	}
	if n := len(fakes.Frontends.Entries); n != 4 {
		t.Errorf("%d frontends written; want the 4 that fit", n)
	}
	svtConsistent(t, fakes)
	if st := d.s.Stats(); st.MapFull != 1 || st.Failures != 1 {
		t.Errorf("stats %+v; want one failure, map full", st)
	}
	// The same state applied again: the refused one is tried again (and refused), nothing
	// written is rewritten.
	before := fakes.Frontends.Writes
	if err := d.s.Apply(); !errors.Is(err, ErrMapFull) {
		t.Fatalf("a second apply: %v; want ErrMapFull again", err)
	}
	if w := fakes.Frontends.Writes - before; w != 0 {
		t.Errorf("the second apply wrote %d frontends; want none (the refused one is still refused)", w)
	}
	// Room made: the pending frontend goes in and the driver programs what a fresh one would.
	room := svtStateOf(web, shop)
	if err := d.update(all, room); err != nil {
		t.Fatal(err)
	}
	if want, _, _ := svtFresh(t, room); d.render() != want {
		t.Errorf("with room made\n%s", svtLineDiff(want, d.render()))
	}
}

// TestServicesReusedEndpointsReleased: a frontend naming the very endpoints (the same
// slice) of a list its service let go gets that list written again, not a pointer to a list
// no longer there.
func TestServicesReusedEndpointsReleased(t *testing.T) {
	np := svtFE("default/multi", 0xe1, calc.FrontendNodePort, "0.0.0.0:30081", store.ProtocolTCP, svtWebB)
	cip := svtFE("default/multi", 0xe1, calc.FrontendClusterIP, "198.51.100.70:80", store.ProtocolTCP, svtWebA, svtWebB)
	both := svtStateOf(np, cip)
	d := svtRun(t, both)
	only := svtStateOf(np) // the cluster IP's list goes; the service stays (its node port)
	if err := d.update(both, only); err != nil {
		t.Fatal(err)
	}
	if err := d.update(only, both); err != nil { // the same frontend again: the same slices
		t.Fatal(err)
	}
	svtConsistent(t, d.fakes)
	if want, _, _ := svtFresh(t, both); d.render() != want {
		t.Errorf("the cluster IP back\n%s", svtLineDiff(want, d.render()))
	}
}

func TestServicesAdoption(t *testing.T) {
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	webNP := svtFE("default/web", 0xa1, calc.FrontendNodePort, "0.0.0.0:30080", store.ProtocolTCP, svtWebA, svtWebB)
	dns := svtFE("kube-system/dns", 0xd1, calc.FrontendClusterIP, "198.51.100.53:53", store.ProtocolUDP, svtDNSB)
	apiLB := svtFE("default/api", 0xb1, calc.FrontendLoadBalancer, "203.0.113.10:443", store.ProtocolTCP, svtAPIA)
	apiLB.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	st := svtStateOf(web, webNP, dns, apiLB)
	st.nets[netip.MustParsePrefix("192.0.2.2/32")] = svtHost("192.0.2.2/32", "node-b")
	full := svtDiff(nil, st)
	first := svtRun(t, st)
	want := first.render()

	// A restarted driver over the maps its predecessor filled writes nothing.
	d := &svtDriver{t: t, s: NewServices(first.tables, svtConfig()), tables: first.tables, fakes: first.fakes}
	before := d.writesBy()
	d.s.OnUpdate(full)
	d.apply()
	if w := d.s.Stats().Writes; w != 0 {
		t.Errorf("adopting maps that hold the desired state counted %d writes; want 0", w)
	}
	if w := svtSub(d.writesBy(), before); w != [6]int{} {
		t.Errorf("adopting maps that hold the desired state wrote %v; want nothing", w)
	}
	if got := d.render(); got != want {
		t.Errorf("after adoption\n%s", svtLineDiff(want, got))
	}

	// Stale entries and wrong values: exactly the difference is written.
	f := first.fakes
	f.Frontends.Entries[FrontendKey{Addr: NetAddr(netip.MustParseAddr("198.51.100.99")), Port: NetPort(80), Proto: ProtoTCP}] =
		FrontendValue{ListId: 0xdead, SvcId: 0x99, Count: 1}
	f.Backends.Entries[BackendKey{ListId: 0xdead}] = BackendValue{Addr: NetAddr(netip.MustParseAddr("10.244.9.9")), Port: NetPort(80)}
	f.SourceRanges.Entries[SourceRangeKey{Prefixlen: 64 + 8, FeAddr: NetAddr(netip.MustParseAddr("203.0.113.10")), FePort: NetPort(443),
		Proto: ProtoTCP, Src: NetAddr(netip.MustParseAddr("10.0.0.0"))}] = 1
	f.ClusterNets.Entries[ClusterNetKey{Prefixlen: 16, Addr: NetAddr(netip.MustParseAddr("10.99.0.0"))}] = ClusterNetVal{Flags: ClusterNetPool}
	wk := FrontendMapKey(web.Key)
	v := f.Frontends.Entries[wk]
	v.Count = 1 // wrong value
	f.Frontends.Entries[wk] = v
	for k, v := range f.Backends.Entries {
		if v.NodeAddr != 0 && k.ListId != 0xdead {
			v.NodeAddr = NetAddr(netip.MustParseAddr("192.0.2.200")) // wrong value
			f.Backends.Entries[k] = v
			break
		}
	}
	s := f.Settings.Entries[0]
	s.TunnelMtu = 9000 // wrong value
	f.Settings.Entries[0] = s

	d = &svtDriver{t: t, s: NewServices(first.tables, svtConfig()), tables: first.tables, fakes: first.fakes}
	before = d.writesBy()
	d.s.OnUpdate(full)
	d.apply()
	// frontends: 1 stale deleted, 1 corrected; backends: 1 stale deleted, 1 corrected; one
	// source range and one cluster net deleted; the settings corrected.
	if w := svtSub(d.writesBy(), before); w != [6]int{2, 2, 0, 1, 1, 1} {
		t.Errorf("repairing the maps wrote %v (frontends, backends, backend index, source ranges, cluster nets, settings); want [2 2 0 1 1 1]", w)
	}
	if w := d.s.Stats().Writes; w != 7 {
		t.Errorf("repairing the maps counted %d writes; want 7", w)
	}
	if got := d.render(); got != want {
		t.Errorf("after the repair\n%s", svtLineDiff(want, got))
	}
	if got := f.Settings.Entries[0].TunnelMtu; got != 1450 {
		t.Errorf("the settings' tunnel MTU is %d; want 1450", got)
	}

	// Drift found by a queued resync is repaired the same way.
	delete(f.Frontends.Entries, wk)
	d.s.QueueResync()
	before = d.writesBy()
	d.apply()
	if w := svtSub(d.writesBy(), before); w != [6]int{1, 0, 0, 0, 0, 0} {
		t.Errorf("repairing a lost frontend wrote %v; want the one frontend", w)
	}
	if got := d.render(); got != want {
		t.Errorf("after the resync\n%s", svtLineDiff(want, got))
	}
}

func TestServicesIdentityClash(t *testing.T) {
	one := svtFE("default/one", 0x77, calc.FrontendClusterIP, "198.51.100.30:80", store.ProtocolTCP, svtBE("10.244.1.40:80", svtNode, svtNodeA))
	two := svtFE("default/two", 0x77, calc.FrontendClusterIP, "198.51.100.31:80", store.ProtocolTCP, svtBE("10.244.1.41:80", svtNode, svtNodeA))
	both := svtStateOf(one, two)
	d := svtRun(t, both)
	svtCheckText(t, "two services of one identity", d.render(), []string{
		"backend list c0412867d7223e5b #0 10.244.1.40:80 node 0.0.0.0 local",
		"cluster-net 10.244.0.0/16 pool",
		"cluster-net 192.0.2.1/32 node,self",
		"frontend 198.51.100.30:0/any service 0000000000000077 address-only",
		"frontend 198.51.100.30:80/TCP service 0000000000000077 list c0412867d7223e5b backends 1 local 1 cluster-from 0",
	})
	wantProblem := func(key, owner, refused string) {
		t.Helper()
		p := d.s.Problems()
		if len(p) != 1 || !strings.Contains(p[key], owner) || !strings.Contains(p[key], refused) ||
			!strings.Contains(p[key], "0000000000000077") {
			t.Errorf("problems %v; want %s naming %s and %s", p, key, owner, refused)
		}
	}
	wantProblem("frontend/198.51.100.31:80/TCP", "default/one", "default/two")

	// The first removed: the second is let in by the same update.
	onlyTwo := svtStateOf(two)
	if err := d.update(both, onlyTwo); err != nil {
		t.Fatal(err)
	}
	if want, _, _ := svtFresh(t, onlyTwo); d.render() != want {
		t.Errorf("with the first service gone\n%s", svtLineDiff(want, d.render()))
	}
	if p := d.s.Problems(); len(p) != 0 {
		t.Errorf("problems %v; want none", p)
	}

	// The first back: the one programmed keeps its identity (a fresh driver would pick the
	// lower frontend; taking a working service's identity away would flap it).
	programmed := d.render()
	if err := d.update(onlyTwo, both); err != nil {
		t.Fatal(err)
	}
	if got := d.render(); got != programmed {
		t.Errorf("a clashing service arriving changed the maps\n%s", svtLineDiff(programmed, got))
	}
	wantProblem("frontend/198.51.100.30:80/TCP", "default/two", "default/one")

	// The refused one removed: its problem goes.
	if err := d.update(both, onlyTwo); err != nil {
		t.Fatal(err)
	}
	if p := d.s.Problems(); len(p) != 0 {
		t.Errorf("problems %v; want none", p)
	}
}

func TestServicesNothingBeforeFullUpdate(t *testing.T) {
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	st := svtStateOf(web)
	st.routes[netip.MustParsePrefix("10.244.1.5/32")] = svtWEP("10.244.1.5/32", "cali1")
	d := newSvtDriver(t)
	d.s.OnUpdate(svtDiff(newSvtState(), st)) // a delta, not a full update
	d.s.SetTunnelMTU(1400)
	d.s.QueueResync()
	d.apply()
	if d.s.Ready() {
		t.Error("ready before the first full update")
	}
	if w := d.writes(); w != 0 || d.s.Stats().Writes != 0 || d.render() != "" || len(d.fakes.Settings.Entries) != 0 {
		t.Errorf("before the first full update: %d writes, maps %q, settings %v; want nothing", w, d.render(), d.fakes.Settings.Entries)
	}
	d.s.OnUpdate(svtDiff(nil, st))
	d.apply()
	if want, _, _ := svtFresh(t, st); d.render() != want || !d.s.Ready() {
		t.Errorf("after the full update (ready %v)\n%s", d.s.Ready(), svtLineDiff(want, d.render()))
	}
	if got := d.fakes.Settings.Entries[0]; got.TunnelMtu != 1400 || got.HostIp != NetAddr(svtNodeA) || got.Vni != DefaultVNI {
		t.Errorf("settings %+v; want the tunnel MTU set before, this node's address, the VNI", got)
	}
}

func TestServicesNotProgrammed(t *testing.T) {
	v6 := svtFE("default/v6", 0x61, calc.FrontendClusterIP, "[2001:db8::10]:80", store.ProtocolTCP,
		svtBE("[2001:db8:1::5]:8080", svtNode, netip.MustParseAddr("2001:db8::1")))
	sctp := svtFE("default/diameter", 0x62, calc.FrontendClusterIP, "198.51.100.40:3868", store.ProtocolSCTP,
		svtBE("10.244.1.30:3868", svtNode, svtNodeA))
	cNoAddr := func(ap string) calc.Backend { return svtBE(ap, "node-c", netip.Addr{}) }
	far := svtFE("default/far", 0x63, calc.FrontendClusterIP, "198.51.100.41:80", store.ProtocolTCP,
		svtBE("10.244.1.31:80", svtNode, svtNodeA), svtBE("10.244.2.31:80", "node-b", svtNodeB), cNoAddr("10.244.3.31:80"))
	// externalTrafficPolicy Local with only a terminating local endpoint: the local set is
	// that one (before ClusterStart), the cluster set the ready remote ones.
	farNP := svtFE("default/far", 0x63, calc.FrontendNodePort, "0.0.0.0:30090", store.ProtocolTCP,
		svtBE("10.244.1.32:80", svtNode, svtNodeA), svtBE("10.244.2.32:80", "node-b", svtNodeB), cNoAddr("10.244.3.32:80"))
	farNP.ExternalLocal, farNP.ClusterStart, farNP.Backends[0].Terminating = true, 1, true
	onlyFar := svtFE("default/only-far", 0x64, calc.FrontendClusterIP, "198.51.100.42:80", store.ProtocolTCP, cNoAddr("10.244.3.33:80"))
	st := svtStateOf(v6, sctp, far, farNP, onlyFar)
	d := svtRun(t, st)
	svtCheckText(t, "frontends not programmed, endpoints left out", d.render(), []string{
		// IPv6 frontends are programmed in the IPv6 maps, alongside.
		"backend list 5c2da58f2516b035 #0 [2001:db8:1::5]:8080 node :: local",
		"frontend [2001:db8::10]:0/any service 0000000000000061 address-only",
		"frontend [2001:db8::10]:80/TCP service 0000000000000061 list 5c2da58f2516b035 backends 1 local 1 cluster-from 0",
		"backend list adff1e9caa249a0f #0 10.244.1.32:80 node 0.0.0.0 local",
		"backend list adff1e9caa249a0f #1 10.244.2.32:80 node 192.0.2.2",
		"backend list cdd6d559a5aeeea7 #0 10.244.1.31:80 node 0.0.0.0 local",
		"backend list cdd6d559a5aeeea7 #1 10.244.2.31:80 node 192.0.2.2",
		"cluster-net 10.244.0.0/16 pool",
		"cluster-net 192.0.2.1/32 node,self",
		"frontend 0.0.0.0:30090/TCP service 0000000000000063 list adff1e9caa249a0f backends 2 local 1 cluster-from 1 external-local,node-port",
		"frontend 198.51.100.41:0/any service 0000000000000063 address-only",
		"frontend 198.51.100.41:80/TCP service 0000000000000063 list cdd6d559a5aeeea7 backends 2 local 1 cluster-from 0",
		"frontend 198.51.100.42:0/any service 0000000000000064 address-only",
		// Every endpoint left out: an empty list (no entries), which rejects.
		"frontend 198.51.100.42:80/TCP service 0000000000000064 list cbf29ce484222325 backends 0 local 0 cluster-from 0",
	})
	if p, want := d.s.Problems(), map[string]string{
		"frontend/198.51.100.40:3868/SCTP": "only TCP and UDP services are programmed",
		"frontend/198.51.100.41:80/TCP":    `endpoint 10.244.3.31 is on node "node-c", which has no IPv4 address; not used`,
		"frontend/0.0.0.0:30090/TCP":       `endpoint 10.244.3.32 is on node "node-c", which has no IPv4 address; not used`,
		"frontend/198.51.100.42:80/TCP":    `endpoint 10.244.3.33 is on node "node-c", which has no IPv4 address; not used`,
	}; !maps.Equal(p, want) {
		t.Errorf("problems\n%v\nwant\n%v", p, want)
	}
	svtConsistent(t, d.fakes)

	// Frontends removed take their problems along.
	next := st.clone()
	delete(next.fronts, v6.Key)
	delete(next.fronts, onlyFar.Key)
	if err := d.update(st, next); err != nil {
		t.Fatal(err)
	}
	if p := d.s.Problems(); len(p) != 3 || p["frontend/[2001:db8::10]:80/TCP"] != "" || p["frontend/198.51.100.42:80/TCP"] != "" {
		t.Errorf("problems %v; want the removed frontends' gone", p)
	}

	// node-c gets an IPv4 address: its endpoints are used.
	last := next.clone()
	withC := func(f calc.Frontend) calc.Frontend {
		return svtWith(f, func(f *calc.Frontend) {
			for i := range f.Backends {
				if f.Backends[i].Node == "node-c" {
					f.Backends[i].NodeAddr = netip.MustParseAddr("192.0.2.4")
				}
			}
		})
	}
	last.fronts[far.Key], last.fronts[farNP.Key] = withC(far), withC(farNP)
	if err := d.update(next, last); err != nil {
		t.Fatal(err)
	}
	if want, _, _ := svtFresh(t, last); d.render() != want {
		t.Errorf("with node-c's address\n%s", svtLineDiff(want, d.render()))
	}
	if p := d.s.Problems(); len(p) != 1 || p["frontend/198.51.100.40:3868/SCTP"] == "" {
		t.Errorf("problems %v; want only the SCTP frontend's", p)
	}
	svtConsistent(t, d.fakes)
}

// svtConsistent checks every frontend's counts against its list: the local set and the
// cluster set lie inside the list, and every entry exists.
func svtConsistent(t *testing.T, f *MemSet) {
	t.Helper()
	for k, v := range f.Frontends.Entries {
		if v.Flags&FrontendAddrOnly == 0 && (v.ClusterStart > v.Local || v.Local > v.Count) {
			t.Errorf("frontend %s: want cluster-from <= local <= backends", FrontendString(k, v))
		}
	}
	if dl := svtDangling(f); len(dl) > 0 {
		t.Errorf("frontends point at missing backends: %v", dl)
	}
}

// TestServicesRoutedEndpoint: an endpoint on no node (a slice written by hand for an address
// outside the cluster) is used, flagged routed (DNAT and the FIB, never the tunnel), and no
// problem; once its slice names a node it is tunnelled to that node like any other.
func TestServicesRoutedEndpoint(t *testing.T) {
	ext := svtFE("default/ext", 0x71, calc.FrontendClusterIP, "198.51.100.71:443", store.ProtocolTCP,
		svtBE("10.244.1.71:443", svtNode, svtNodeA), svtBE("203.0.113.71:443", "", netip.Addr{}))
	st := svtStateOf(ext)
	d := svtRun(t, st)
	svtCheckText(t, "an endpoint on no node", d.render(), []string{
		"backend list 408c842877aaec03 #0 10.244.1.71:443 node 0.0.0.0 local",
		"backend list 408c842877aaec03 #1 203.0.113.71:443 node 0.0.0.0 routed",
		"cluster-net 10.244.0.0/16 pool",
		"cluster-net 192.0.2.1/32 node,self",
		"frontend 198.51.100.71:0/any service 0000000000000071 address-only",
		"frontend 198.51.100.71:443/TCP service 0000000000000071 list 408c842877aaec03 backends 2 local 1 cluster-from 0",
	})
	if p := d.s.Problems(); len(p) != 0 {
		t.Errorf("problems %v; want none", p)
	}
	svtConsistent(t, d.fakes)

	next := st.clone()
	onB := svtWith(ext, func(f *calc.Frontend) { f.Backends[1].Node, f.Backends[1].NodeAddr = "node-b", svtNodeB })
	next.fronts[onB.Key] = onB
	if err := d.update(st, next); err != nil {
		t.Fatal(err)
	}
	if want, _, _ := svtFresh(t, next); d.render() != want {
		t.Errorf("the endpoint on node-b\n%s", svtLineDiff(want, d.render()))
	}
	if !strings.Contains(d.render(), "203.0.113.71:443 node 192.0.2.2\n") || strings.Contains(d.render(), "routed") {
		t.Errorf("the endpoint on node-b is not tunnelled to it:\n%s", d.render())
	}
}

// TestServicesColdStartFailure: a frontend refused in the very first apply (the cold path,
// which adopts the desired state in one copy when every write succeeds) is retried alone; the
// others are known to be written, and a removal of one of them deletes it.
func TestServicesColdStartFailure(t *testing.T) {
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	dns := svtFE("kube-system/dns", 0xd1, calc.FrontendClusterIP, "198.51.100.53:53", store.ProtocolUDP, svtDNSB)
	api := svtFE("default/api", 0xb1, calc.FrontendClusterIP, "198.51.100.20:443", store.ProtocolTCP, svtAPIA)
	st := svtStateOf(web, dns, api)
	want, _, _ := svtFresh(t, st)

	d := newSvtDriver(t)
	failing := FrontendMapKey(api.Key)
	d.fakes.Frontends.Fail = func(op string, k FrontendKey) error {
		if op == "put" && k == failing {
			return errors.New("injected")
		}
		return nil
	}
	d.s.OnUpdate(svtDiff(nil, st))
	if err := d.s.Apply(); err == nil || !strings.Contains(err.Error(), "198.51.100.20:443/TCP") {
		t.Fatalf("cold Apply with a failing frontend: %v; want its failure", err)
	}
	svtCheckText(t, "cold, one frontend refused", d.render(), strings.Split(svtWithout(t, want, "frontend 198.51.100.20:443/TCP "), "\n"))

	d.fakes.Frontends.Fail = nil
	before := d.writesBy()
	d.apply()
	if w := svtSub(d.writesBy(), before); w != [6]int{1, 0, 0, 0, 0, 0} {
		t.Errorf("the retry wrote %v; want the one frontend", w)
	}
	if got := d.render(); got != want {
		t.Errorf("after the retry\n%s", svtLineDiff(want, got))
	}
	// The frontends written in the cold apply are known as written: removing one deletes it.
	next := svtStateOf(web, api)
	if err := d.update(st, next); err != nil {
		t.Fatal(err)
	}
	if want, _, _ := svtFresh(t, next); d.render() != want {
		t.Errorf("after removing dns\n%s", svtLineDiff(want, d.render()))
	}
	svtConsistent(t, d.fakes)
}

// Lists longer than AffinityScan carry an index (address → first ordinal) for client-IP
// affinity: written with the list, gone with it, never for short lists, repaired on adoption;
// a list whose index could not be written is not pointed at.
func TestServicesBackendIndex(t *testing.T) {
	eps := func(from, to int) []calc.Backend {
		var out []calc.Backend
		for i := from; i < to; i++ {
			node, addr := svtNode, svtNodeA
			if i%2 == 1 {
				node, addr = "node-b", svtNodeB
			}
			out = append(out, svtBE(fmt.Sprintf("10.244.%d.%d:80", 1+i%2, 10+i), node, addr))
		}
		return out
	}
	count := func(d *svtDriver) map[uint64]int {
		out := map[uint64]int{}
		for k := range d.fakes.BackendIndex.Entries {
			out[k.ListId]++
		}
		return out
	}
	listOf := func(d *svtDriver, f calc.Frontend) uint64 {
		return d.fakes.Frontends.Entries[FrontendMapKey(f.Key)].ListId
	}
	// 20 endpoints, one of them listed twice: 20 index entries, the twice-listed one at its
	// first ordinal; a service of 5: none.
	big := svtWith(svtFE("default/big", 0xb1, calc.FrontendClusterIP, "198.51.100.71:80", store.ProtocolTCP, eps(0, 20)...),
		func(f *calc.Frontend) { f.Backends = append(f.Backends, f.Backends[3]) })
	small := svtFE("default/small", 0x5a, calc.FrontendClusterIP, "198.51.100.72:80", store.ProtocolTCP, eps(20, 25)...)
	st := svtStateOf(big, small)
	d := svtRun(t, st)
	if got := count(d); len(got) != 1 || got[listOf(d, big)] != 20 {
		t.Fatalf("index entries by list %v; want 20 for the long list %016x only", got, listOf(d, big))
	}
	dup := big.Backends[3]
	if o := d.fakes.BackendIndex.Entries[BackendIndex{ListId: listOf(d, big), Addr: NetAddr(dup.Addr), Port: NetPort(dup.Port)}]; o != 3 {
		t.Errorf("the endpoint listed at 3 and 20 is indexed at %d", o)
	}

	// One endpoint replaced: the new list indexed, the old one's entries gone with it.
	next := st.clone()
	next.fronts[big.Key] = svtFE("default/big", 0xb1, calc.FrontendClusterIP, "198.51.100.71:80", store.ProtocolTCP, eps(1, 21)...)
	if err := d.update(st, next); err != nil {
		t.Fatal(err)
	}
	if p := svtIndexProblems(d.fakes); len(p) > 0 {
		t.Errorf("after a list changed: %q", p)
	}
	if got := count(d); len(got) != 1 || got[listOf(d, next.fronts[big.Key])] != 20 {
		t.Errorf("index entries by list %v; want 20 for the new list only", got)
	}
	// Down to AffinityScan endpoints: no index at all.
	st, next = next, next.clone()
	next.fronts[big.Key] = svtFE("default/big", 0xb1, calc.FrontendClusterIP, "198.51.100.71:80", store.ProtocolTCP, eps(1, 1+AffinityScan)...)
	if err := d.update(st, next); err != nil {
		t.Fatal(err)
	}
	if n := len(d.fakes.BackendIndex.Entries); n != 0 {
		t.Errorf("%d index entries for lists of %d or fewer", n, AffinityScan)
	}

	// An index entry refused: the frontend stays on its old list until the retry.
	st, next = next, next.clone()
	next.fronts[big.Key] = svtFE("default/big", 0xb1, calc.FrontendClusterIP, "198.51.100.71:80", store.ProtocolTCP, eps(0, 30)...)
	d.fakes.BackendIndex.Fail = func(op string, k BackendIndex) error {
		if op == "put" && HostAddr(k.Addr) == netip.MustParseAddr("10.244.2.37") {
			return errors.New("injected")
		}
		return nil
	}
	old := listOf(d, big)
	err := d.update(st, next)
	if err == nil || !strings.Contains(err.Error(), "backend list") || !strings.Contains(err.Error(), "default/big") {
		t.Errorf("Apply with an index entry refused: %v; want the list and its service named", err)
	}
	if got := listOf(d, big); got != old {
		t.Errorf("the frontend moved to list %016x, whose index is incomplete", got)
	}
	d.fakes.BackendIndex.Fail = nil
	d.apply()
	if got := count(d); got[listOf(d, big)] != 30 || listOf(d, big) == old {
		t.Errorf("after the retry: index entries by list %v, frontend on %016x", got, listOf(d, big))
	}

	// Adoption: an index entry lost, one wrong, one stray; exactly those are mended (the two
	// backends rewritten with their index entries).
	f := d.fakes
	id := listOf(d, big)
	var lost, wrong BackendIndex
	for k := range f.BackendIndex.Entries {
		if lost == (BackendIndex{}) {
			lost = k
		} else if wrong == (BackendIndex{}) {
			wrong = k
		}
	}
	delete(f.BackendIndex.Entries, lost)
	f.BackendIndex.Entries[wrong] = (f.BackendIndex.Entries[wrong] + 1) % 30
	f.BackendIndex.Entries[BackendIndex{ListId: id ^ 1, Addr: NetAddr(netip.MustParseAddr("10.244.9.9")), Port: NetPort(80)}] = 1
	d2 := &svtDriver{t: t, s: NewServices(d.tables, svtConfig()), tables: d.tables, fakes: f}
	before := d2.writesBy()
	d2.s.OnUpdate(svtDiff(nil, next))
	d2.apply()
	if w := svtSub(d2.writesBy(), before); w != [6]int{0, 2, 3, 0, 0, 0} {
		t.Errorf("adopting maps with a damaged index wrote %v; want [0 2 3 0 0 0] (2 backends, 2 index entries and a stray)", w)
	}
}

// A long list read with entries lost (one in the middle, or its tail) is mended whole on
// adoption, its index with it: the entries read beyond the map's count stay (they are the
// list's own), and the index entries the apply rewrites are not then deleted as strays.
func TestServicesListDriftMended(t *testing.T) {
	var eps []calc.Backend
	for i := range 20 {
		eps = append(eps, svtBE(fmt.Sprintf("10.244.2.%d:80", 10+i), "node-b", svtNodeB))
	}
	big := svtFE("default/big", 0xb1, calc.FrontendClusterIP, "198.51.100.71:80", store.ProtocolTCP, eps...)
	st := svtStateOf(big)
	want, _, _ := svtFresh(t, st)
	for _, lost := range [][]uint32{{5}, {16, 17, 18, 19}, {0, 19}} {
		d := svtRun(t, st)
		id := d.fakes.Frontends.Entries[FrontendMapKey(big.Key)].ListId
		for _, o := range lost {
			delete(d.fakes.Backends.Entries, BackendKey{ListId: id, Ordinal: o})
		}
		d2 := &svtDriver{t: t, s: NewServices(d.tables, svtConfig()), tables: d.tables, fakes: d.fakes}
		d2.s.OnUpdate(svtDiff(nil, st))
		d2.apply() // checks the whole index
		if got := d2.render(); got != want {
			t.Errorf("entries %v lost: after adoption\n%s", lost, svtLineDiff(want, got))
		}
		if n := len(d.fakes.BackendIndex.Entries); n != 20 {
			t.Errorf("entries %v lost: %d index entries after adoption, want 20", lost, n)
		}
	}
}

// TestServicesDualStack: a dual-stack service's IPv6 frontends go to the IPv6 maps by the
// same rules (lists, address-only entries, source ranges, cluster networks), the IPv6 tunnel's
// settings follow this node's IPv6 address, a remote IPv6 endpoint whose node has no IPv6
// address is left out and said, and the IPv6 maps are adopted after a restart and repaired
// after drift as the IPv4 ones are.
func TestServicesDualStack(t *testing.T) {
	web4 := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP,
		svtBE("10.244.1.5:8080", svtNode, svtNodeA))
	web6 := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "[fd00:96::10]:80", store.ProtocolTCP,
		svtBE("[fd00:65::5]:8080", svtNode, netip.MustParseAddr("2001:db8::1")),
		svtBE("[fd00:65:1::5]:8080", "node-b", netip.MustParseAddr("2001:db8::2")),
		svtBE("[fd00:65:2::5]:8080", "node-c", netip.Addr{}))
	web6.LocalBackends = 1
	lb6 := svtFE("default/web", 0xa1, calc.FrontendLoadBalancer, "[2001:db8:200::10]:80", store.ProtocolTCP,
		svtBE("[fd00:65::5]:8080", svtNode, netip.MustParseAddr("2001:db8::1")))
	lb6.SourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8:113::/64"), netip.MustParsePrefix("203.0.113.0/24")}
	st := svtStateOf(web4, web6, lb6)
	for _, n := range []calc.ClusterNet{svtPool("fd00:65::/48"), svtHost("2001:db8::1/128", svtNode), svtHost("2001:db8::2/128", "node-b")} {
		st.nets[n.Prefix] = n
	}
	d := svtRun(t, st)
	text := d.render()
	for _, want := range []string{
		" #0 [fd00:65::5]:8080 node :: local",
		"frontend [fd00:96::10]:0/any service 00000000000000a1 address-only",
		"source-range [2001:db8:200::10]:80/TCP from 2001:db8:113::/64",
		"cluster-net 2001:db8::1/128 node,self",
		"cluster-net fd00:65::/48 pool",
		"frontend 198.51.100.10:80/TCP service 00000000000000a1 list",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("maps lack %q:\n%s", want, text)
		}
	}
	if !strings.Contains(text, "[fd00:65:1::5]:8080 node 2001:db8::2") || strings.Contains(text, "fd00:65:2::5") {
		t.Errorf("the remote IPv6 endpoint must be there with its node, the one on a node without IPv6 not:\n%s", text)
	}
	if p := d.s.Problems()["frontend/[fd00:96::10]:80/TCP"]; p != `endpoint fd00:65:2::5 is on node "node-c", which has no IPv6 address; not used` {
		t.Errorf("problem %q", p)
	}
	if strings.Contains(text, "source-range [2001:db8:200::10]:80/TCP from 203.0.113.0/24") {
		t.Errorf("an IPv4 source range in the IPv6 map:\n%s", text)
	}
	set6, _ := d.fakes.Settings6.Dump()
	if v := set6[0]; HostAddr6(v.HostIp) != netip.MustParseAddr("2001:db8::1") || v.TunnelMtu != 1430 {
		t.Errorf("IPv6 settings %+v, want host 2001:db8::1 and MTU 1430 (1450 less 20)", v)
	}
	if w := d.writes(); w == 0 {
		t.Fatal("nothing written")
	}
	before := d.writes()
	d.apply()
	if w := d.writes() - before; w != 0 {
		t.Errorf("a second apply wrote %d entries", w)
	}

	// Drift in the IPv6 maps: an entry of each kind lost, a stray frontend added.
	fe6, _ := d.fakes.V6.Frontends.Dump()
	be6, _ := d.fakes.V6.Backends.Dump()
	for k := range fe6 {
		d.fakes.V6.Frontends.Delete(k)
		break
	}
	for k := range be6 {
		d.fakes.V6.Backends.Delete(k)
		break
	}
	d.fakes.V6.Frontends.Put(FrontendKey6{Addr: NetAddr6(netip.MustParseAddr("fd00:96::99")), Port: NetPort(9), Proto: ProtoTCP}, FrontendValue{SvcId: 9})
	d.s.QueueResync()
	before = d.writes()
	d.apply()
	if got := d.render(); got != text {
		t.Errorf("after drift repair the maps differ:\n%s\nwant\n%s", got, text)
	}
	if w := d.writes() - before; w != 3 {
		t.Errorf("drift repair wrote %d entries, want 3 (two put back, one deleted)", w)
	}

	// A restarted driver adopts both families' maps: nothing written.
	d2 := &svtDriver{t: t, s: NewServices(d.tables, svtConfig()), tables: d.tables, fakes: d.fakes}
	d2.s.OnUpdate(svtDiff(nil, st))
	before = d2.writes()
	d2.apply()
	if w := d2.writes() - before; w != 0 {
		t.Errorf("adoption wrote %d entries, want 0", w)
	}

	// The IPv6 frontends removed: their entries go, the IPv4 ones stay.
	next := st.clone()
	delete(next.fronts, web6.Key)
	delete(next.fronts, lb6.Key)
	if err := d2.update(st, next); err != nil {
		t.Fatal(err)
	}
	if fe, _ := d.fakes.V6.Frontends.Dump(); len(fe) != 0 {
		t.Errorf("IPv6 frontends left: %v", fe)
	}
	if be, _ := d.fakes.V6.Backends.Dump(); len(be) != 0 {
		t.Errorf("IPv6 backends left: %v", be)
	}
	if fe, _ := d.fakes.Frontends.Dump(); len(fe) != 2 {
		t.Errorf("IPv4 frontends %v, want the cluster IP and its address-only entry", fe)
	}
}

// TestServicesEndpointsGone: the stage sweeps the connection table only when an endpoint has
// left every service, not at every change of an endpoint set. A service's slice arriving, an
// endpoint added, or a frontend rewritten with the same endpoints (as every change of a
// service rewrites it) leaves no endpoint gone; an endpoint dropped by its only service, or
// a service removed, does; one still named by another service does not. Before, every set
// let go counted as gone, and each change of a bulk apply read the whole connection table
// (BenchmarkServicesArriving in cmd/sluiced).
func TestServicesEndpointsGone(t *testing.T) {
	webNone := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP)
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA)
	webNP := svtFE("default/web", 0xa1, calc.FrontendNodePort, "0.0.0.0:30080", store.ProtocolTCP, svtWebA)
	webMore := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	webMoreNP := svtFE("default/web", 0xa1, calc.FrontendNodePort, "0.0.0.0:30080", store.ProtocolTCP, svtWebA, svtWebB)
	webMoved := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA2, svtWebB)
	webMovedNP := svtFE("default/web", 0xa1, calc.FrontendNodePort, "0.0.0.0:30080", store.ProtocolTCP, svtWebA2, svtWebB)
	webOnlyA2 := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA2)
	other := svtFE("default/other", 0xb2, calc.FrontendClusterIP, "198.51.100.20:80", store.ProtocolTCP, svtWebB)
	otherAffinity := svtWith(other, func(f *calc.Frontend) { f.AffinityTimeout = 60 })
	webA := netip.AddrPortFrom(svtWebA.Addr, svtWebA.Port)
	webA2 := netip.AddrPortFrom(svtWebA2.Addr, svtWebA2.Port)
	webB := netip.AddrPortFrom(svtWebB.Addr, svtWebB.Port)

	d := svtRun(t, svtStateOf(webNone))
	d.s.EndpointsGone() // the first full update
	steps := []struct {
		name       string
		from, to   *svtState
		gone       bool
		live, dead []netip.AddrPort
	}{
		{"the slice arrives", svtStateOf(webNone), svtStateOf(web, webNP), false, []netip.AddrPort{webA}, nil},
		{"an endpoint added", svtStateOf(web, webNP), svtStateOf(webMore, webMoreNP, other), false, []netip.AddrPort{webA, webB}, nil},
		{"rewritten, same endpoints", svtStateOf(webMore, webMoreNP, other), svtStateOf(webMore, webMoreNP, otherAffinity), false, []netip.AddrPort{webA, webB}, nil},
		{"an endpoint replaced", svtStateOf(webMore, webMoreNP, otherAffinity), svtStateOf(webMoved, webMovedNP, otherAffinity), true, []netip.AddrPort{webA2, webB}, []netip.AddrPort{webA}},
		{"dropped, named by another still", svtStateOf(webMoved, webMovedNP, otherAffinity), svtStateOf(webOnlyA2, otherAffinity), false, []netip.AddrPort{webA2, webB}, []netip.AddrPort{webA}},
		{"a service removed", svtStateOf(webOnlyA2, otherAffinity), svtStateOf(otherAffinity), true, []netip.AddrPort{webB}, []netip.AddrPort{webA, webA2}},
		{"the last service naming it", svtStateOf(otherAffinity), svtStateOf(), true, nil, []netip.AddrPort{webA, webA2, webB}},
	}
	for _, st := range steps {
		if err := d.update(st.from, st.to); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := d.s.EndpointsGone(); got != st.gone {
			t.Errorf("%s: EndpointsGone %v; want %v", st.name, got, st.gone)
		}
		if d.s.EndpointsGone() {
			t.Errorf("%s: EndpointsGone said true twice", st.name)
		}
		for _, ap := range st.live {
			if !d.s.LiveEndpoint(ap.Addr(), ap.Port()) {
				t.Errorf("%s: %v not live", st.name, ap)
			}
		}
		for _, ap := range st.dead {
			if d.s.LiveEndpoint(ap.Addr(), ap.Port()) {
				t.Errorf("%s: %v still live", st.name, ap)
			}
		}
	}
}

// TestServicesResyncNoDrift: a reread of maps the driver wrote finds no drift, whatever the
// frontends hold: a service with no endpoint yet (or a node port of the family its endpoints
// lack) has an empty backend list, which the maps hold as no entry at all. Every dual-stack
// node's IPv6 node ports of IPv4-only services have one; the lab's agents counted it as a
// backend list someone deleted at every periodic resync.
func TestServicesResyncNoDrift(t *testing.T) {
	none := svtFE("default/new", 0xc1, calc.FrontendClusterIP, "198.51.100.30:80", store.ProtocolTCP)
	noneNP := svtFE("default/new", 0xc1, calc.FrontendNodePort, "0.0.0.0:30031", store.ProtocolTCP)
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	d := svtRun(t, svtStateOf(none, noneNP, web))
	for i := range 3 {
		d.s.QueueResync()
		before := d.s.Stats().Drift
		d.apply()
		if n := d.s.Stats().Drift - before; n != 0 {
			t.Errorf("resync %d: %d drift found in maps only the driver wrote (%v); want none", i, n, d.s.TakeDrift())
		}
	}
}

// TestServicesDiff: Diff reads the maps and names what they lack, hold differently or hold
// too much of, writing nothing; a driver given only the full update (as sluicectl builds one)
// finds nothing once another has applied it.
func TestServicesDiff(t *testing.T) {
	web := svtFE("default/web", 0xa1, calc.FrontendClusterIP, "198.51.100.10:80", store.ProtocolTCP, svtWebA, svtWebB)
	full := func() *calc.Update { return &calc.Update{Full: true, Ops: []calc.Op{{Frontend: &web}}} }
	d := newSvtDriver(t)
	var _ interface {
		Full(*calc.Update)
		OnOp(calc.Op) bool
		Apply() error
		QueueResync()
		Diff() ([]string, []string, error)
	} = d.s
	d.s.Full(full())
	missing, extra, err := d.s.Diff()
	if err != nil {
		t.Fatal(err)
	}
	// The frontend, the cluster IP's address-only entry, the backend list, both settings.
	if len(missing) != 5 || len(extra) != 0 || d.writes() != 0 {
		t.Fatalf("before any apply: missing %q, extra %q, %d writes", missing, extra, d.writes())
	}
	d.apply()
	fresh := func() (missing, extra []string) {
		t.Helper()
		s := NewServices(d.tables, svtConfig())
		s.Full(full())
		before := d.writes()
		m, e, err := s.Diff()
		if err != nil || d.writes() != before {
			t.Fatalf("Diff: %v, %d writes", err, d.writes()-before)
		}
		return m, e
	}
	if m, e := fresh(); len(m) != 0 || len(e) != 0 {
		t.Fatalf("after the apply: missing %q, extra %q", m, e)
	}
	// Someone deletes the frontend and leaves another of their own: both are named.
	k := FrontendMapKey(web.Key)
	v := d.fakes.Frontends.Entries[k]
	delete(d.fakes.Frontends.Entries, k)
	stray := FrontendMapKey(calc.FrontendKey{Addr: netip.MustParseAddr("198.51.100.99"), Port: 80, Protocol: store.ProtocolTCP})
	d.fakes.Frontends.Entries[stray] = v
	m, e := fresh()
	if len(m) != 1 || !strings.Contains(m[0], "198.51.100.10:80") || len(e) != 1 || !strings.Contains(e[0], "198.51.100.99:80") {
		t.Fatalf("after a frontend was deleted and another added: missing %q, extra %q", m, e)
	}
}
