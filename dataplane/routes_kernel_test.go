package dataplane

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
)

// TestIPv6RoutesAreStable: IPv6 routes with metric 0 (stored by the kernel as 1024) and
// device routes (reported as scope universe) survive full resyncs without writes.
func TestIPv6RoutesAreStable(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("w0", "")
	rt := NewRouteTable(n.kernel(), RouteTableConfig{ParentAddr: nodeAddr})
	r6 := calc.Route{Dst: pfx("2001:db8::5/128"), Type: calc.RouteUnicast, Device: "w0", Reason: calc.ReasonLocalWorkload}
	apply(t, rt, r6)
	writes := rt.Writes()
	for range 3 {
		rt.QueueResync()
		if err := rt.Apply(); err != nil {
			t.Fatal(err)
		}
	}
	out, _ := exec.Command("ip", "-n", n.name, "-6", "route", "show", "proto", "83").CombinedOutput()
	if !strings.Contains(string(out), "2001:db8::5 dev w0") || rt.Writes() != writes {
		t.Fatalf("after resyncs (%d writes more):\n%s", rt.Writes()-writes, out)
	}
}

// TestLinkDownUpRestoresRoutes: the kernel drops routes through a link that goes down without
// a route event; the link event brings sluice back to put them in again.
func TestLinkDownUpRestoresRoutes(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	n.iface("cali-web-1", "")
	d, _ := runDataplane(t, n, false)
	waitFor(t, "sync", func() bool {
		return d.Synced() && strings.Contains(n.routes(DefaultRouteProtocol), "10.65.0.1/32 dev cali-web-1")
	})
	for _, state := range []string{"down", "up"} {
		if out, err := exec.Command("ip", "-n", n.name, "link", "set", "cali-web-1", state).CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
	}
	waitFor(t, "the workload route back after down/up", func() bool {
		return strings.Contains(n.routes(DefaultRouteProtocol), "10.65.0.1/32 dev cali-web-1")
	})
}
