package calc_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// learnedRoutes returns the state's BGP routes ("dst via gw[,gw...]") and its bgp/ problems' keys.
func learnedRoutes(s *calc.State) []string {
	var out []string
	for _, r := range s.Routes {
		if r.Reason == calc.ReasonBGP {
			gws := make([]string, 0, 1+len(r.Multipath))
			for _, gw := range r.Gateways() {
				gws = append(gws, gw.String())
			}
			line := fmt.Sprintf("%s via %s", r.Dst, strings.Join(gws, ","))
			if r.Recursive {
				line += " recursive"
			}
			out = append(out, line)
		}
	}
	for _, p := range s.Problems {
		if strings.HasPrefix(p.Key, "bgp/route/") {
			out = append(out, "problem "+p.Key)
		}
	}
	return out
}

// TestBGPImportRules is one table for calico/node's import rules (its BIRD kernel filter):
// what node-a programs of what its speaker learned. Each case is run with the routes learned
// before etcd's first in-sync and after it; both must end the same.
func TestBGPImportRules(t *testing.T) {
	base := []string{bgpPool("routed", "10.80.0.0/16", false), bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.12/24"),
		fmt.Sprintf(`%svxlan {"spec":{"cidr":"10.65.0.0/16","vxlanMode":"Always"}}`, store.IPPoolPrefix),
		bgpBlock("10.80.0.0/26", "node-a"), bgpAffinity("node-a", "10.80.0.0/26", "confirmed"),
		bgpConfig("default", `"serviceClusterIPs":[{"cidr":"10.96.0.0/12"}]`)}
	l := func(p string, nhs ...string) calc.Learned {
		out := calc.Learned{Prefix: netip.MustParsePrefix(p)}
		for _, nh := range nhs {
			out.NextHops = append(out.NextHops, netip.MustParseAddr(nh))
		}
		return out
	}
	cases := []struct {
		rule    string
		learned []calc.Learned
		want    []string
	}{
		{"another node's block in a pool without encapsulation is programmed",
			[]calc.Learned{l("10.80.0.64/26", "192.0.2.12")}, []string{"10.80.0.64/26 via 192.0.2.12"}},
		{"a route of the fabric outside every pool is programmed",
			[]calc.Learned{l("198.18.0.0/24", "192.0.2.1")}, []string{"198.18.0.0/24 via 192.0.2.1"}},
		{"never a default route",
			[]calc.Learned{l("0.0.0.0/0", "192.0.2.1")}, nil},
		{"never a route inside a VXLAN pool (calc routes those)",
			[]calc.Learned{l("10.65.0.64/26", "192.0.2.12")}, nil},
		{"never a route inside this node's own block",
			[]calc.Learned{l("10.80.0.0/26", "192.0.2.12"), l("10.80.0.7/32", "192.0.2.12")}, nil},
		{"never a route inside a service range",
			[]calc.Learned{l("10.96.0.10/32", "192.0.2.12"), l("10.96.0.0/12", "192.0.2.12")}, nil},
		{"a next hop off this node's subnet, with no learned route to it: through the kernel's routes",
			[]calc.Learned{l("10.80.1.0/26", "198.51.100.9")}, []string{"10.80.1.0/26 via 198.51.100.9 recursive"}},
		{"a next hop of a family this node has no address of: a problem",
			[]calc.Learned{l("10.80.1.0/26", "2001:db8::1")}, []string{"problem bgp/route/10.80.1.0/26"}},
		{"a next hop off this node's subnet, reached through another learned route (recursive)",
			[]calc.Learned{l("10.80.1.0/26", "198.51.100.9"), l("198.51.100.0/24", "192.0.2.1")},
			[]string{"10.80.1.0/26 via 192.0.2.1", "198.51.100.0/24 via 192.0.2.1"}},
		{"this node's own address as next hop: nothing",
			[]calc.Learned{l("10.80.1.0/26", "192.0.2.11")}, nil},
		{"a withdrawal removes the route",
			[]calc.Learned{l("10.80.0.64/26", "192.0.2.12"), {Prefix: netip.MustParsePrefix("10.80.0.64/26")}}, nil},
		{"equal paths make one multipath route (BIRD's merge paths)",
			[]calc.Learned{l("10.80.0.64/26", "192.0.2.2", "192.0.2.1")}, []string{"10.80.0.64/26 via 192.0.2.1,192.0.2.2"}},
		{"one of the equal paths withdrawn leaves the other",
			[]calc.Learned{l("10.80.0.64/26", "192.0.2.1", "192.0.2.2"), l("10.80.0.64/26", "192.0.2.2")}, []string{"10.80.0.64/26 via 192.0.2.2"}},
		{"of equal paths, one off the subnet with no learned route to it: the others",
			[]calc.Learned{l("10.80.1.0/26", "192.0.2.1", "198.51.100.9")}, []string{"10.80.1.0/26 via 192.0.2.1"}},
		{"a next hop reached through a multipath route takes all its paths",
			[]calc.Learned{l("10.80.1.0/26", "198.51.100.9"), l("198.51.100.0/24", "192.0.2.2", "192.0.2.1")},
			[]string{"10.80.1.0/26 via 192.0.2.1,192.0.2.2", "198.51.100.0/24 via 192.0.2.1,192.0.2.2"}},
		{"equal paths all off the subnet, no learned route to them: through the kernel's routes, the lowest",
			[]calc.Learned{l("10.80.1.0/26", "198.51.100.9", "198.51.100.8")}, []string{"10.80.1.0/26 via 198.51.100.8 recursive"}},
		{"equal paths, one through this node's own address: nothing",
			[]calc.Learned{l("10.80.1.0/26", "192.0.2.1", "192.0.2.11")}, nil},
	}
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			evs := bgpEvents(t, base)
			var got [2][]string
			for i, learnFirst := range []bool{true, false} {
				g, err := calc.New(bgpCfg("node-a"))
				if err != nil {
					t.Fatal(err)
				}
				if learnFirst {
					if u := g.OnLearned(c.learned); u != nil {
						t.Fatalf("an update before etcd's in-sync: %+v", u)
					}
				}
				g.OnEvents(append(slices.Clone(evs), inSync()))
				if !learnFirst {
					g.OnLearned(c.learned)
				}
				got[i] = learnedRoutes(g.State())
			}
			if !slices.Equal(got[0], got[1]) {
				t.Fatalf("learned before in-sync %q, after %q", got[0], got[1])
			}
			if !slices.Equal(got[0], c.want) {
				t.Fatalf("programmed %q, want %q", got[0], c.want)
			}
		})
	}
	// With BGP off, nothing learned is taken.
	g, _ := calc.New(calc.DefaultConfig("node-a"))
	g.OnEvents(append(bgpEvents(t, base), inSync()))
	if u := g.OnLearned([]calc.Learned{l("198.18.0.0/24", "192.0.2.1")}); u != nil || len(learnedRoutes(g.State())) != 0 {
		t.Fatalf("BGP off took a learned route: %+v", u)
	}
}

// TestBGPDefaultRouteAsked: a learned default route is programmed only when the agent asks
// (Config.BGPDefaultRouteMetric), at that metric, so it sits beside the node's own.
func TestBGPDefaultRouteAsked(t *testing.T) {
	def := calc.Learned{Prefix: netip.MustParsePrefix("0.0.0.0/0"), NextHops: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	for _, metric := range []int{0, 200} {
		cfg := bgpCfg("node-a")
		cfg.BGPDefaultRouteMetric = metric
		g, _ := calc.New(cfg)
		g.OnEvents(append(bgpEvents(t, []string{bgpNode("node-a", "192.0.2.11/24")}), inSync()))
		g.OnLearned([]calc.Learned{def})
		var got []string
		for _, r := range g.State().Routes {
			if r.Reason == calc.ReasonBGP {
				got = append(got, r.String())
			}
		}
		want := []string(nil)
		if metric != 0 {
			want = []string{"0.0.0.0/0 via 192.0.2.1 dev uplink onlink metric 200"}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("metric %d: %q, want %q", metric, got, want)
		}
	}
}

// TestBGPImportRulesIPv6: an IPv6 pool's blocks are routed through the IPv6 next hop on the
// node's IPv6 subnet (spec.bgp.ipv6Address); a node without an IPv6 address has a problem.
func TestBGPImportRulesIPv6(t *testing.T) {
	learned := []calc.Learned{{Prefix: netip.MustParsePrefix("fd00:80:0:1::/122"), NextHops: []netip.Addr{netip.MustParseAddr("2001:db8:2::12")}}}
	for _, c := range []struct {
		node string
		want []string
	}{
		{bgpNode("node-a", "192.0.2.11/24", `"ipv6Address":"2001:db8:2::11/64"`), []string{"fd00:80:0:1::/122 via 2001:db8:2::12"}},
		{bgpNode("node-a", "192.0.2.11/24"), []string{"problem bgp/route/fd00:80:0:1::/122"}},
	} {
		g, _ := calc.New(bgpCfg("node-a"))
		g.OnEvents(append(bgpEvents(t, []string{bgpPool("routed6", "fd00:80::/48", false), c.node}), inSync()))
		g.OnLearned(learned)
		if got := learnedRoutes(g.State()); !slices.Equal(got, c.want) {
			t.Fatalf("%s: %q, want %q", c.node, got, c.want)
		}
	}
}

// TestBGPLearnedTransitions: learned routes follow what changes around them, and a restart's
// stale routes stay until the speaker sweeps them, those learned again kept.
func TestBGPLearnedTransitions(t *testing.T) {
	g, err := calc.New(bgpCfg("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	base := []string{bgpPool("routed", "10.80.0.0/16", false), bgpNode("node-a", "192.0.2.11/24"), bgpNode("node-b", "192.0.2.12/24")}
	// A restart: routes kept from the last run, before etcd is read.
	kept := []calc.Learned{{Prefix: netip.MustParsePrefix("10.80.0.64/26"), NextHops: []netip.Addr{netip.MustParseAddr("192.0.2.12")}},
		{Prefix: netip.MustParsePrefix("10.80.0.128/26"), NextHops: []netip.Addr{netip.MustParseAddr("192.0.2.13")}}}
	g.KeepLearned(kept)
	u := g.OnEvents(append(bgpEvents(t, base), inSync()))
	if got := learnedRoutes(g.State()); !slices.Equal(got, []string{"10.80.0.64/26 via 192.0.2.12", "10.80.0.128/26 via 192.0.2.13"}) || !u.Full {
		t.Fatalf("after the restart's first update: %q", got)
	}
	// One is learned again (its next hop moved), the other not: the sweep removes only it.
	u = g.OnLearned([]calc.Learned{{Prefix: netip.MustParsePrefix("10.80.0.64/26"), NextHops: []netip.Addr{netip.MustParseAddr("192.0.2.14")}}})
	if u == nil || len(u.Ops) != 1 || u.Ops[0].Route == nil || u.Ops[0].Route.Gateway.String() != "192.0.2.14" {
		t.Fatalf("learned again with a new next hop: %+v", u)
	}
	u = g.SweepLearned()
	if u == nil || len(u.Ops) != 1 || !u.Ops[0].Remove || u.Ops[0].Route.Dst.String() != "10.80.0.128/26" {
		t.Fatalf("the sweep: %+v", u)
	}
	if u := g.SweepLearned(); u != nil {
		t.Fatalf("a second sweep changed %+v", u)
	}
	// The pool gets VXLAN: its learned routes go (calc routes it); back to none: they return.
	u = g.OnEvents(bgpEvents(t, []string{fmt.Sprintf(`%srouted {"spec":{"cidr":"10.80.0.0/16","vxlanMode":"Always"}}`, store.IPPoolPrefix)}))
	if got := learnedRoutes(g.State()); len(got) != 0 || u == nil {
		t.Fatalf("in a VXLAN pool: %q", got)
	}
	g.OnEvents(bgpEvents(t, []string{bgpPool("routed", "10.80.0.0/16", false)}))
	if got := learnedRoutes(g.State()); !slices.Equal(got, []string{"10.80.0.64/26 via 192.0.2.14"}) {
		t.Fatalf("back without encapsulation: %q", got)
	}
	// This node claims the block: the learned copy gives way to its blackhole.
	g.OnEvents(bgpEvents(t, []string{bgpBlock("10.80.0.64/26", "node-a"), bgpAffinity("node-a", "10.80.0.64/26", "confirmed")}))
	if got := learnedRoutes(g.State()); len(got) != 0 {
		t.Fatalf("inside this node's block: %q", got)
	}
	// This node stops speaking BGP (its spec.bgp goes): nothing learned is programmed, and the
	// remote blocks of pools without encapsulation are routed by calc again.
	g.OnEvents(bgpEvents(t, []string{`/calico/resources/v3/projectcalico.org/nodes/node-a {"spec":{"addresses":[{"address":"192.0.2.11/24","type":"InternalIP"}]}}`,
		bgpBlock("10.80.0.192/26", "node-b"), bgpAffinity("node-b", "10.80.0.192/26", "confirmed")}))
	s := g.State()
	if got := learnedRoutes(s); len(got) != 0 {
		t.Fatalf("without spec.bgp: %q", got)
	}
	if !slices.ContainsFunc(s.Routes, func(r calc.Route) bool {
		return r.Dst.String() == "10.80.0.192/26" && r.Reason == calc.ReasonRemoteBlock
	}) {
		t.Fatalf("without BGP, calc routes the remote block: %v", s.Routes)
	}
}

// TestBGPLearnedStaleOnStop: a speaker that stops makes what it learned stale; what the next
// one learns again stays, the rest goes at its sync.
func TestBGPLearnedStaleOnStop(t *testing.T) {
	g, _ := calc.New(bgpCfg("node-a"))
	g.OnEvents(append(bgpEvents(t, []string{bgpPool("routed", "10.80.0.0/16", false), bgpNode("node-a", "192.0.2.11/24")}), inSync()))
	l := func(p, nh string) calc.Learned {
		return calc.Learned{Prefix: netip.MustParsePrefix(p), NextHops: []netip.Addr{netip.MustParseAddr(nh)}}
	}
	g.OnLearned([]calc.Learned{l("10.80.0.64/26", "192.0.2.12"), l("10.80.0.128/26", "192.0.2.13")})
	g.StaleLearned()
	if got := learnedRoutes(g.State()); len(got) != 2 {
		t.Fatalf("stale routes are still programmed until the sync: %q", got)
	}
	g.OnLearned([]calc.Learned{l("10.80.0.64/26", "192.0.2.12")})
	if u := g.SweepLearned(); u == nil || len(u.Ops) != 1 || u.Ops[0].Route.Dst.String() != "10.80.0.128/26" {
		t.Fatalf("the sweep: %+v", u)
	}
	if got := learnedRoutes(g.State()); !slices.Equal(got, []string{"10.80.0.64/26 via 192.0.2.12"}) {
		t.Fatalf("after the sweep: %q", got)
	}
}

// TestBGPLearnedRecursive: a route whose next hop is reached through another learned route
// follows that route; without it, the kernel's routes lead there (a recursive route).
func TestBGPLearnedRecursive(t *testing.T) {
	g, _ := calc.New(bgpCfg("node-a"))
	g.OnEvents(append(bgpEvents(t, []string{bgpPool("routed", "10.80.0.0/16", false), bgpNode("node-a", "192.0.2.11/24")}), inSync()))
	l := func(p, nh string) calc.Learned {
		return calc.Learned{Prefix: netip.MustParsePrefix(p), NextHops: []netip.Addr{netip.MustParseAddr(nh)}}
	}
	g.OnLearned([]calc.Learned{l("10.80.1.0/26", "198.51.100.9")})
	if got := learnedRoutes(g.State()); !slices.Equal(got, []string{"10.80.1.0/26 via 198.51.100.9 recursive"}) {
		t.Fatalf("without a learned route to its next hop: %q", got)
	}
	g.OnLearned([]calc.Learned{l("198.51.100.0/24", "192.0.2.1")})
	if got := learnedRoutes(g.State()); !slices.Equal(got, []string{"10.80.1.0/26 via 192.0.2.1", "198.51.100.0/24 via 192.0.2.1"}) {
		t.Fatalf("with one: %q", got)
	}
	g.OnLearned([]calc.Learned{{Prefix: netip.MustParsePrefix("198.51.100.0/24")}})
	if got := learnedRoutes(g.State()); !slices.Equal(got, []string{"10.80.1.0/26 via 198.51.100.9 recursive"}) {
		t.Fatalf("once it is withdrawn: %q", got)
	}
	// The kept state keeps the next hop learned, not a gateway.
	if got := g.State().LearnedRoutes(); len(got) != 1 || got[0].NextHops[0] != netip.MustParseAddr("198.51.100.9") {
		t.Fatalf("kept: %+v", got)
	}
}
