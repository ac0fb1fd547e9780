package dataplane

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestOwnership: each kernel kind's ownership rule, for sluice's default protocol and for
// another one an operator configured.
func TestOwnership(t *testing.T) {
	for _, c := range []struct {
		protocol, ours int
		route          routeOwner
		nexthop        bool
	}{
		{DefaultRouteProtocol, DefaultRouteProtocol, routeSluice, true},
		{unix.RTPROT_KERNEL, DefaultRouteProtocol, routeKernel, false},
		{unix.RTPROT_BOOT, DefaultRouteProtocol, routeOther, false},   // `ip route add`, and Felix's workload routes
		{unix.RTPROT_STATIC, DefaultRouteProtocol, routeOther, false}, // an operator's
		{80, DefaultRouteProtocol, routeOther, false},                 // Felix's blackholes and VXLAN routes
		{unix.RTPROT_BIRD, DefaultRouteProtocol, routeOther, false},   // Calico's BGP mode
		{200, 200, routeSluice, true},                                 // route-protocol 200 configured
		{DefaultRouteProtocol, 200, routeOther, false},                // then the default is another program's
	} {
		if got := ownerOfRoute(c.protocol, c.ours); got != c.route {
			t.Errorf("route of protocol %d (sluice's %d): owner %d, want %d", c.protocol, c.ours, got, c.route)
		}
		if got := ownedNexthop(c.protocol, c.ours); got != c.nexthop {
			t.Errorf("nexthop of protocol %d (sluice's %d): owned %v, want %v", c.protocol, c.ours, got, c.nexthop)
		}
	}
}
