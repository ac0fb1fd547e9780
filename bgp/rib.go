package bgp

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/sluice-net/sluice/calc"
)

// Route is one prefix of the speaker's table: its best path's next hops (a learned prefix's
// multipath set: every equal path's) and where the best was learned (an invalid Peer: this
// node's own announcement).
type Route struct {
	Prefix   netip.Prefix `json:"prefix"`
	NextHops []netip.Addr `json:"nextHops"`
	Peer     netip.Addr   `json:"peer"`
	Stale    bool         `json:"stale,omitempty"`
}

func (r Route) String() string {
	from := "local"
	if r.Peer.IsValid() {
		from = "from " + r.Peer.String()
	}
	s := fmt.Sprintf("%s via %v %s", r.Prefix, r.NextHops, from)
	if r.Stale {
		s += " stale"
	}
	return s
}

// RIB lists the speaker's table (both families), best paths only, sorted by prefix; nil
// while no speaker runs.
func (s *Speaker) RIB() ([]Route, error) {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return nil, nil
	}
	var out []Route
	for _, fam := range []bgp.Family{bgp.RF_IPv4_UC, bgp.RF_IPv6_UC} {
		err := srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: fam},
			func(prefix bgp.NLRI, paths []*apiutil.Path) {
				p, ok := prefixOf(prefix)
				if !ok {
					return
				}
				r := Route{Prefix: p}
				for _, path := range paths {
					if !path.Best {
						continue
					}
					r.Peer, r.Stale = path.PeerAddress, path.Stale
					if nh := nextHop(path); nh.IsValid() {
						r.NextHops = append(r.NextHops, nh)
					}
				}
				out = append(out, r)
			})
		if err != nil {
			return nil, err
		}
	}
	s.learnedMu.Lock()
	for i, r := range out {
		if hops := s.multipath.hops(r.Prefix); r.Peer.IsValid() && len(hops) > 0 {
			out[i].NextHops = hops
		}
	}
	s.learnedMu.Unlock()
	slices.SortFunc(out, func(a, b Route) int { return calc.ComparePrefix(a.Prefix, b.Prefix) })
	return out, nil
}

// nextHop is a path's next hop: NEXT_HOP for IPv4, MP_REACH_NLRI's for IPv6.
func nextHop(p *apiutil.Path) netip.Addr {
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeNextHop:
			return a.Value
		case *bgp.PathAttributeMpReachNLRI:
			return a.Nexthop
		}
	}
	return netip.Addr{}
}
