package calc_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// TestFrontendPresent: a frontend lists every endpoint its slices still name, used or not
// (ready, terminating and neither), so the service stage keeps flows to a draining endpoint
// and knows which flows lead nowhere; an endpoint removed from the slice leaves the list.
func TestFrontendPresent(t *testing.T) {
	g, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	svc := &store.Service{Namespace: "ns", Name: "web", UID: "u1", Type: store.ServiceClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Ports:      []store.ServicePortSpec{{Name: "http", Protocol: store.ProtocolTCP, Port: 80}}}
	slice := func(eps ...store.Endpoint) *store.EndpointSlice {
		return &store.EndpointSlice{Namespace: "ns", Name: "web-1", Service: "web", AddressType: "IPv4", Endpoints: eps,
			Ports: []store.EndpointPort{{Name: "http", Protocol: store.ProtocolTCP, Port: 8080}}}
	}
	ep := func(a string, ready, serving, terminating bool) store.Endpoint {
		return store.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(a)}, Ready: ready, Serving: serving, Terminating: terminating, NodeName: "node-b"}
	}
	ev := func(o store.Object, id string) store.Event {
		return store.Event{Type: store.EventUpsert, Kind: o.Kind(), ID: id, Object: o}
	}
	u := g.OnEvents([]store.Event{ev(svc, "ns/web"),
		ev(slice(ep("10.65.0.1", true, true, false), ep("10.65.0.2", false, true, true), ep("10.65.0.3", false, false, false)), "ns/web-1"),
		{Type: store.EventInSync}})
	front := func(u *calc.Update) calc.Frontend {
		for _, op := range u.Ops {
			if op.Frontend != nil && !op.Remove && op.Frontend.Key.Port == 80 {
				return *op.Frontend
			}
		}
		t.Fatalf("no frontend in %+v", u)
		return calc.Frontend{}
	}
	f := front(u)
	ap := func(a string) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(a), 8080) }
	if want := []netip.AddrPort{ap("10.65.0.1"), ap("10.65.0.2"), ap("10.65.0.3")}; !slices.Equal(f.Present, want) {
		t.Fatalf("present %v, want %v", f.Present, want)
	}
	if len(f.Backends) != 1 || f.Backends[0].Addr != netip.MustParseAddr("10.65.0.1") {
		t.Fatalf("backends %v, want only the ready one", f.Backends)
	}
	u = g.OnEvents([]store.Event{ev(slice(ep("10.65.0.1", true, true, false)), "ns/web-1")})
	if f = front(u); !slices.Equal(f.Present, []netip.AddrPort{ap("10.65.0.1")}) {
		t.Fatalf("after removing two endpoints present is %v", f.Present)
	}
}

// TestFrontendsShareEndpointLists: a port's frontends of one family and traffic policy are
// given one Backends slice, and those of one family one Present slice (read-only, as every
// frontend's): the service stage knows them for the same endpoints without comparing them.
func TestFrontendsShareEndpointLists(t *testing.T) {
	g, err := calc.New(calc.DefaultConfig("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	svc := &store.Service{Namespace: "ns", Name: "web", UID: "u1", Type: store.ServiceNodePort,
		ClusterIPs:            []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		ExternalIPs:           []netip.Addr{netip.MustParseAddr("203.0.113.5")},
		Ports:                 []store.ServicePortSpec{{Name: "http", Protocol: store.ProtocolTCP, Port: 80, NodePort: 30080}},
		ExternalTrafficPolicy: store.PolicyLocal, InternalTrafficPolicy: store.PolicyCluster}
	slice := &store.EndpointSlice{Namespace: "ns", Name: "web-1", Service: "web", AddressType: "IPv4",
		Endpoints: []store.Endpoint{
			{Addresses: []netip.Addr{netip.MustParseAddr("10.65.0.1")}, Ready: true, Serving: true, NodeName: "node-a"},
			{Addresses: []netip.Addr{netip.MustParseAddr("10.65.1.1")}, Ready: true, Serving: true, NodeName: "node-b"}},
		Ports: []store.EndpointPort{{Name: "http", Protocol: store.ProtocolTCP, Port: 8080}}}
	ev := func(o store.Object, id string) store.Event {
		return store.Event{Type: store.EventUpsert, Kind: o.Kind(), ID: id, Object: o}
	}
	u := g.OnEvents([]store.Event{
		ev(&store.Node{Name: "node-a", IPv4Address: netip.MustParsePrefix("192.0.2.1/24")}, "node-a"),
		ev(&store.Node{Name: "node-b", IPv4Address: netip.MustParsePrefix("192.0.2.2/24")}, "node-b"),
		ev(svc, "ns/web"), ev(slice, "ns/web-1"), {Type: store.EventInSync}})
	byAddr := map[string]calc.Frontend{}
	for _, op := range u.Ops {
		if op.Frontend != nil && !op.Remove {
			byAddr[op.Frontend.Key.Addr.String()] = *op.Frontend
		}
	}
	cluster, ext, node, wild := byAddr["10.96.0.1"], byAddr["203.0.113.5"], byAddr["192.0.2.1"], byAddr["0.0.0.0"]
	if len(byAddr) != 4 || len(cluster.Backends) != 2 || len(node.Backends) != 2 {
		t.Fatalf("frontends %v; want a cluster IP, an external IP and two node ports, each over both endpoints", byAddr)
	}
	same := func(a, b []calc.Backend) bool { return &a[0] == &b[0] }
	if !same(node.Backends, wild.Backends) || !same(node.Backends, ext.Backends) {
		t.Error("the port's local-policy frontends (node ports, external IP) hold copies of one list")
	}
	if &cluster.Present[0] != &node.Present[0] {
		t.Error("the port's frontends hold copies of one present list")
	}
}
