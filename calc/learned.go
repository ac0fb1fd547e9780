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
	}
	return g.compute(false)
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
			g.routes.dirtyDst.add(p)
		}
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
	for p := range rc.learned {
		rc.dirtyDst.add(p)
	}
}

func (rc *routeCalc) onBGPConfig(string, *store.BGPConfiguration) { rc.markLearned() }

// learnedRouteWhy is the route for a learned prefix, by calico/node's import rules: never a
// default route, never one inside a pool with encapsulation (VXLAN or IPIP: calc routes
// those), inside a block of this node's or inside a service range; the next hop must be on
// this node's subnet (recursive next hops are not resolved). "-": none is due; another
// reason: none, and why (a problem).
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
	case !us.IsValid() || !us.Masked().Contains(l.nextHop):
		return Route{}, fmt.Sprintf("its next hop %s is not on this node's subnet %s: recursive next hops are not resolved", l.nextHop, us.Masked())
	}
	return Route{Dst: dst, Type: RouteUnicast, Device: ParentDevice, Gateway: l.nextHop, OnLink: true, Reason: ReasonBGP}, ""
}
