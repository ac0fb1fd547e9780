package calc

import (
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/store"
)

// Learned is what this node's BGP speaker learned of one prefix: the next hops of its best
// paths, several when paths are equal (equal-cost multipath, as BIRD's `merge paths`
// makes them), sorted; none: the prefix was withdrawn.
type Learned struct {
	Prefix   netip.Prefix `json:"prefix"`
	NextHops []netip.Addr `json:"nextHops"`
}

// learnedRoute is a learned prefix as calc holds it. Stale: kept from the last run (a
// restart under graceful restart) and not learned again yet; SweepLearned drops it.
type learnedRoute struct {
	nextHops []netip.Addr
	stale    bool
}

// OnLearned takes what the speaker learned and withdrew, and returns what changed in the
// desired state, as OnEvents does (nil before the first in-sync: the routes come with the
// first whole state).
func (g *Graph) OnLearned(ls []Learned) *Update {
	if !g.cfg.BGP {
		return nil
	}
	for _, l := range ls {
		if len(l.NextHops) > 0 {
			g.learned[l.Prefix] = learnedRoute{nextHops: l.NextHops}
		} else {
			delete(g.learned, l.Prefix)
		}
		g.routes.dirtyDst.add(l.Prefix)
		g.routes.noteRecursive(l.Prefix, l.NextHops)
	}
	// A route reached through another learned route follows it.
	for p := range g.routes.recursive {
		g.routes.dirtyDst.add(p)
	}
	return g.compute(false)
}

// noteRecursive keeps the set of learned prefixes with a next hop off this node's subnet.
func (rc *routeCalc) noteRecursive(p netip.Prefix, nhs []netip.Addr) {
	self := rc.nodes[rc.cfg.NodeName]
	off := false
	for _, nh := range nhs {
		if self == nil {
			off = true
			break
		}
		if us := underlay(self, nh); !us.IsValid() || !us.Masked().Contains(nh) {
			off = true
			break
		}
	}
	if !off {
		delete(rc.recursive, p)
		return
	}
	if rc.recursive == nil {
		rc.recursive = set[netip.Prefix]{}
	}
	rc.recursive.add(p)
}

// resolveLearned finds the gateways to next hop nh: the next hops on this node's subnet us of
// the longest other learned prefix holding nh that has any (BGP's recursive next hop, as
// BIRD's "gateway recursive" resolves it through its table).
func (rc *routeCalc) resolveLearned(dst netip.Prefix, nh netip.Addr, us netip.Prefix) []netip.Addr {
	for bits := nh.BitLen(); bits > 0; bits-- {
		p, _ := nh.Prefix(bits)
		if p == dst {
			continue
		}
		via, ok := rc.learned[p]
		if !ok {
			continue
		}
		var out []netip.Addr
		for _, gw := range via.nextHops {
			if us.Masked().Contains(gw) && gw != us.Addr() {
				out = append(out, gw)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// KeepLearned takes the routes learned before a restart (from the kept state) as stale: they
// stay in the desired state, so the kernel keeps them, until the speaker has heard again from
// its peers (SweepLearned) or learns them anew.
func (g *Graph) KeepLearned(ls []Learned) *Update {
	if !g.cfg.BGP {
		return nil
	}
	for _, l := range ls {
		if _, ok := g.learned[l.Prefix]; !ok && len(l.NextHops) > 0 {
			g.learned[l.Prefix] = learnedRoute{nextHops: l.NextHops, stale: true}
			g.routes.dirtyDst.add(l.Prefix)
			g.routes.noteRecursive(l.Prefix, l.NextHops)
		}
	}
	return g.compute(false)
}

// StaleLearned makes everything learned so far stale: the speaker stopped (its configuration
// changed), and the next one's sync removes what its peers do not send again. Nothing
// changes in the desired state until then.
func (g *Graph) StaleLearned() {
	for p, l := range g.learned {
		l.stale = true
		g.learned[p] = l
	}
}

// SweepLearned drops the stale routes no peer announced again: the speaker calls it once
// every session has sent its End-of-RIB (or their restart time is over).
func (g *Graph) SweepLearned() *Update {
	for p, l := range g.learned {
		if l.stale {
			delete(g.learned, p)
			delete(g.routes.recursive, p)
			g.routes.dirtyDst.add(p)
		}
	}
	for p := range g.routes.recursive {
		g.routes.dirtyDst.add(p)
	}
	return g.compute(false)
}

// LearnedRoutes lists the state's routes that came from BGP, as the speaker learned them: an
// agent keeps them across a restart (KeepLearned).
func (s *State) LearnedRoutes() []Learned {
	var out []Learned
	for _, r := range s.Routes {
		if r.Reason == ReasonBGP {
			out = append(out, Learned{Prefix: r.Dst, NextHops: r.Gateways()})
		}
	}
	return out
}

// markLearned makes every learned prefix be decided again (this node, its pools, the
// service ranges or its blocks changed: what may be imported did).
func (rc *routeCalc) markLearned() {
	for p, l := range rc.learned {
		rc.dirtyDst.add(p)
		rc.noteRecursive(p, l.nextHops) // this node's subnet may have moved
	}
}

func (rc *routeCalc) onBGPConfig(string, *store.BGPConfiguration) { rc.markLearned() }

// learnedRouteWhy is the route for a learned prefix, by calico/node's import rules: never a
// default route (unless Config.BGPDefaultRouteMetric asks for one, at that metric), never one inside a pool with encapsulation (VXLAN or IPIP: calc routes
// those), inside a block of this node's or inside a service range. A next hop on this node's
// subnet is the gateway; one off it is reached through another learned route whose next hop
// is (recursive, one level), else through the kernel's own routes (a Recursive route: the
// dataplane resolves it, as BIRD resolves through the kernel routes it learns). Equal paths
// make one multipath route. "-": none is due; another reason: none, and why (a problem).
func (rc *routeCalc) learnedRouteWhy(dst netip.Prefix) (Route, string) {
	l, ok := rc.learned[dst]
	self := rc.nodes[rc.cfg.NodeName]
	if !ok || !rc.cfg.BGP || self == nil || self.BGP == nil {
		return Route{}, "-"
	}
	metric := 0
	if dst.Bits() == 0 {
		if rc.cfg.BGPDefaultRouteMetric == 0 {
			return Route{}, "-" // never a default route, unless asked
		}
		metric = rc.cfg.BGPDefaultRouteMetric
	}
	if pool := rc.poolFor(dst); pool != nil && (pool.VXLANMode != store.EncapNever || pool.IPIPMode != store.EncapNever) {
		return Route{}, "-"
	}
	if b := rc.blockFor(dst.Addr()); b != nil && rc.isLocal(b.AffinityNode) && b.CIDR.Bits() <= dst.Bits() {
		return Route{}, "-"
	}
	if g := rc.bgpConfigs["default"]; g != nil {
		for _, ranges := range [][]netip.Prefix{g.ServiceClusterIPs, g.ServiceExternalIPs, g.ServiceLoadBalancerIPs} {
			for _, r := range ranges {
				if r.Bits() <= dst.Bits() && r.Contains(dst.Addr()) {
					return Route{}, "-"
				}
			}
		}
	}
	var gws, far []netip.Addr
	why := ""
	for _, nh := range l.nextHops {
		us := underlay(self, nh)
		switch {
		case us.Addr() == nh:
			return Route{}, "-" // this node's own
		case !us.IsValid():
			why = "this node has no address of its next hop's family (spec.bgp)"
		case !us.Masked().Contains(nh):
			via := rc.resolveLearned(dst, nh, us)
			if len(via) == 0 {
				far = append(far, nh)
			}
			gws = append(gws, via...)
		default:
			gws = append(gws, nh)
		}
	}
	if len(gws) == 0 && len(far) > 0 {
		// Reached through the kernel's own routes, whichever leads there (the dataplane
		// looks): through the lowest such next hop.
		return Route{Dst: dst, Type: RouteUnicast, Gateway: slices.MinFunc(far, netip.Addr.Compare), Recursive: true, Metric: metric, Reason: ReasonBGP}, ""
	}
	if len(gws) == 0 {
		return Route{}, why
	}
	slices.SortFunc(gws, netip.Addr.Compare)
	gws = slices.Compact(gws)
	r := Route{Dst: dst, Type: RouteUnicast, Device: ParentDevice, Gateway: gws[0], OnLink: true, Metric: metric, Reason: ReasonBGP}
	if len(gws) > 1 {
		r.Multipath = gws[1:]
	}
	return r, ""
}
