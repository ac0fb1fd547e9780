package calc

import (
	"fmt"
	"net/netip"

	"github.com/sluice-net/sluice/store"
)

// Learned is what this node's BGP speaker learned of one prefix: its best path's next hop
// (invalid: the prefix was withdrawn).
type Learned struct {
	Prefix  netip.Prefix `json:"prefix"`
	NextHop netip.Addr   `json:"nextHop"`
}

// learnedRoute is a learned prefix as calc holds it. Stale: kept from the last run (a
// restart under graceful restart) and not learned again yet; SweepLearned drops it.
type learnedRoute struct {
	nextHop netip.Addr
	stale   bool
}

// OnLearned takes what the speaker learned and withdrew, and returns what changed in the
// desired state, as OnEvents does (nil before the first in-sync: the routes come with the
// first whole state).
func (g *Graph) OnLearned(ls []Learned) *Update {
	if !g.cfg.BGP {
		return nil
	}
	for _, l := range ls {
		if l.NextHop.IsValid() {
			g.learned[l.Prefix] = learnedRoute{nextHop: l.NextHop}
		} else {
			delete(g.learned, l.Prefix)
		}
		g.routes.dirtyDst.add(l.Prefix)
		g.routes.noteRecursive(l)
	}
	// A route reached through another learned route follows it.
	for p := range g.routes.recursive {
		g.routes.dirtyDst.add(p)
	}
	return g.compute(false)
}

// noteRecursive keeps the set of learned prefixes whose next hop is off this node's subnet.
func (rc *routeCalc) noteRecursive(l Learned) {
	if !l.NextHop.IsValid() {
		delete(rc.recursive, l.Prefix)
		return
	}
	if self := rc.nodes[rc.cfg.NodeName]; self != nil {
		if us := underlay(self, l.NextHop); us.IsValid() && us.Masked().Contains(l.NextHop) {
			delete(rc.recursive, l.Prefix)
			return
		}
	}
	if rc.recursive == nil {
		rc.recursive = set[netip.Prefix]{}
	}
	rc.recursive.add(l.Prefix)
}

// resolveLearned finds the gateway to next hop nh through the longest other learned prefix
// holding it whose own next hop is on this node's subnet us (BGP's recursive next hop, as
// BIRD's "gateway recursive" resolves it through its table).
func (rc *routeCalc) resolveLearned(dst netip.Prefix, nh netip.Addr, us netip.Prefix) (netip.Addr, bool) {
	for bits := nh.BitLen(); bits > 0; bits-- {
		p, _ := nh.Prefix(bits)
		if p == dst {
			continue
		}
		if via, ok := rc.learned[p]; ok && us.Masked().Contains(via.nextHop) && via.nextHop != us.Addr() {
			return via.nextHop, true
		}
	}
	return netip.Addr{}, false
}

// KeepLearned takes the routes learned before a restart (from the kept state) as stale: they
// stay in the desired state, so the kernel keeps them, until the speaker has heard again from
// its peers (SweepLearned) or learns them anew.
func (g *Graph) KeepLearned(ls []Learned) *Update {
	if !g.cfg.BGP {
		return nil
	}
	for _, l := range ls {
		if _, ok := g.learned[l.Prefix]; !ok && l.NextHop.IsValid() {
			g.learned[l.Prefix] = learnedRoute{nextHop: l.NextHop, stale: true}
			g.routes.dirtyDst.add(l.Prefix)
			g.routes.noteRecursive(l)
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
			out = append(out, Learned{Prefix: r.Dst, NextHop: r.Gateway})
		}
	}
	return out
}

// markLearned makes every learned prefix be decided again (this node, its pools, the
// service ranges or its blocks changed: what may be imported did).
func (rc *routeCalc) markLearned() {
	for p, l := range rc.learned {
		rc.dirtyDst.add(p)
		rc.noteRecursive(Learned{Prefix: p, NextHop: l.nextHop}) // this node's subnet may have moved
	}
}

func (rc *routeCalc) onBGPConfig(string, *store.BGPConfiguration) { rc.markLearned() }

// learnedRouteWhy is the route for a learned prefix, by calico/node's import rules: never a
// default route, never one inside a pool with encapsulation (VXLAN or IPIP: calc routes
// those), inside a block of this node's or inside a service range; the next hop must be on
// this node's subnet, or be reached through another learned route whose next hop is
// (recursive, one level). "-": none is due; another reason: none, and why (a problem).
func (rc *routeCalc) learnedRouteWhy(dst netip.Prefix) (Route, string) {
	l, ok := rc.learned[dst]
	self := rc.nodes[rc.cfg.NodeName]
	if !ok || !rc.cfg.BGP || self == nil || self.BGP == nil {
		return Route{}, "-"
	}
	if dst.Bits() == 0 {
		return Route{}, "-" // never a default route
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
	us := underlay(self, l.nextHop)
	switch {
	case us.Addr() == l.nextHop:
		return Route{}, "-" // this node's own
	case !us.IsValid():
		return Route{}, "this node has no address of its next hop's family (spec.bgp)"
	case !us.Masked().Contains(l.nextHop):
		gw, ok := rc.resolveLearned(dst, l.nextHop, us)
		if !ok {
			return Route{}, fmt.Sprintf("its next hop %s is off this node's subnet %s and no learned route leads there", l.nextHop, us.Masked())
		}
		return Route{Dst: dst, Type: RouteUnicast, Device: ParentDevice, Gateway: gw, OnLink: true, Reason: ReasonBGP}, ""
	}
	return Route{Dst: dst, Type: RouteUnicast, Device: ParentDevice, Gateway: l.nextHop, OnLink: true, Reason: ReasonBGP}, ""
}
