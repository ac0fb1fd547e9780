package bgp

import (
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/calc"
)

// TestOnUpdateKicksOnlyForBGP: an update without BGP ops (routes, services) wakes the stage's
// loop for nothing; one with a path, or a full update, does.
func TestOnUpdateKicksOnlyForBGP(t *testing.T) {
	s := New(Config{})
	route := calc.Route{Dst: netip.MustParsePrefix("10.65.0.0/26"), Type: calc.RouteBlackhole}
	s.OnUpdate(&calc.Update{Ops: []calc.Op{{Route: &route}}})
	if len(s.kick) != 0 {
		t.Fatal("a route's update kicked the BGP stage")
	}
	s.OnUpdate(&calc.Update{Ops: []calc.Op{{BGPPath: &calc.BGPPath{Prefix: route.Dst, Reason: calc.AnnounceBlock}}}})
	if len(s.kick) != 1 {
		t.Fatal("a path's update did not kick the BGP stage")
	}
	<-s.kick
	s.OnUpdate(&calc.Update{Full: true})
	if len(s.kick) != 1 || !s.full {
		t.Fatal("a full update did not kick the BGP stage")
	}
}
