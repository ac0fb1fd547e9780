package calc_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// TestFrontendClash: two services claim one cluster IP and port; the one whose
// "namespace/name" sorts first wins and the clash is a problem. Once the other leaves the
// problem is gone from the state; when it comes back it is said again.
func TestFrontendClash(t *testing.T) {
	g, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	svc := func(name string) *store.Service {
		return &store.Service{Namespace: "ns", Name: name, UID: name, Type: store.ServiceClusterIP,
			ClusterIPs:            []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Ports:                 []store.ServicePortSpec{{Name: "http", Protocol: store.ProtocolTCP, Port: 80}},
			ExternalTrafficPolicy: store.PolicyCluster, InternalTrafficPolicy: store.PolicyCluster}
	}
	clash := func() []calc.Problem {
		var out []calc.Problem
		for _, p := range g.State().Problems {
			if strings.HasPrefix(p.Key, "frontend/") {
				out = append(out, p)
			}
		}
		return out
	}
	g.OnEvents([]store.Event{up(svc("b")), {Type: store.EventInSync}})
	if p := clash(); len(p) != 0 {
		t.Fatalf("one service: problems %v", p)
	}
	u := g.OnEvents([]store.Event{up(svc("a"))})
	if len(u.Problems) != 1 || !strings.Contains(u.Problems[0].Reason, "ns/a wins") || len(clash()) != 1 {
		t.Fatalf("a second service on the same frontend: update's problems %v, state's %v", u.Problems, clash())
	}
	key, _ := store.KeyFor(store.KindService, "ns/a")
	g.OnEvents([]store.Event{{Type: store.EventDelete, Kind: store.KindService, ID: "ns/a", Key: key}})
	if p := clash(); len(p) != 0 {
		t.Fatalf("after the winner left: problems %v", p)
	}
	u = g.OnEvents([]store.Event{up(svc("a"))})
	if len(u.Problems) != 1 || len(clash()) != 1 {
		t.Fatalf("the clash again: update's problems %v, state's %v", u.Problems, clash())
	}
}
