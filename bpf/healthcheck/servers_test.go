package healthcheck

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func serviceBody(ns, name string, endpoints int, healthy bool) string {
	return fmt.Sprintf(`{"service":{"namespace":%q,"name":%q},"localEndpoints":%d,"serviceProxyHealthy":%t}`,
		ns, name, endpoints, healthy)
}

func TestServiceAnswers(t *testing.T) {
	port := freePorts(t, 1)[0]
	s := newServers(t)
	s.SetNodeAddrs([]netip.Addr{lo1})
	s.SetService(port, "shop/web", 2)
	mustApply(t, s)
	ap := netip.AddrPortFrom(lo1, port)
	paths := []string{"/", "/healthz", "/any/path?with=query"}

	// Until the agent says it is healthy, no load balancer is sent here.
	for _, p := range paths {
		wantAnswer(t, ap, p, http.StatusServiceUnavailable, serviceBody("shop", "web", 2, false))
	}

	steps := []struct {
		endpoints int
		healthy   bool
		status    int
	}{
		{endpoints: 2, healthy: true, status: http.StatusOK},
		{endpoints: 0, healthy: true, status: http.StatusServiceUnavailable},
		{endpoints: 1, healthy: true, status: http.StatusOK},
		{endpoints: 1, healthy: false, status: http.StatusServiceUnavailable},
		{endpoints: 0, healthy: false, status: http.StatusServiceUnavailable},
		{endpoints: 5, healthy: true, status: http.StatusOK},
	}
	for _, st := range steps {
		s.SetService(port, "shop/web", st.endpoints)
		s.SetHealthy(st.healthy)
		for _, p := range paths {
			wantAnswer(t, ap, p, st.status, serviceBody("shop", "web", st.endpoints, st.healthy))
		}
	}
	wantListening(t, s, ap)
}

func TestCountAndNameChangeAnsweredWithoutReopen(t *testing.T) {
	port := freePorts(t, 1)[0]
	s := newServers(t)
	s.SetNodeAddrs([]netip.Addr{lo1})
	s.SetHealthy(true)
	s.SetService(port, "shop/web", 1)
	mustApply(t, s)
	ap := netip.AddrPortFrom(lo1, port)

	// One kept-alive connection throughout: had the port been reopened, it would be gone.
	c, err := net.Dial("tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	want := func(status int, body string) {
		t.Helper()
		got, err := askOn(c, r, "/", true)
		if err != nil {
			t.Fatalf("asking on the kept connection: %v", err)
		}
		if got.status != status || got.body != body {
			t.Fatalf("answered %d %s, want %d %s", got.status, got.body, status, body)
		}
	}
	want(http.StatusOK, serviceBody("shop", "web", 1, true))

	s.SetService(port, "shop/web", 3) // answered at once, before any Apply
	want(http.StatusOK, serviceBody("shop", "web", 3, true))
	s.SetService(port, "shop/web-v2", 0)
	want(http.StatusServiceUnavailable, serviceBody("shop", "web-v2", 0, true))

	mustApply(t, s)
	want(http.StatusServiceUnavailable, serviceBody("shop", "web-v2", 0, true))
	s.SetService(port, "shop/web-v2", 2)
	mustApply(t, s)
	want(http.StatusOK, serviceBody("shop", "web-v2", 2, true))
	wantListening(t, s, ap)
}

func TestDeleteServiceClosesPort(t *testing.T) {
	ports := freePorts(t, 2)
	s := newServers(t)
	s.SetNodeAddrs([]netip.Addr{lo1})
	s.SetHealthy(true)
	s.SetService(ports[0], "shop/web", 1)
	s.SetService(ports[1], "shop/api", 1)
	mustApply(t, s)
	web, api := netip.AddrPortFrom(lo1, ports[0]), netip.AddrPortFrom(lo1, ports[1])
	wantListening(t, s, web, api)

	// Deleted but not yet applied: the port still answers, and says not to come here.
	s.DeleteService(ports[0])
	wantAnswer(t, web, "/", http.StatusServiceUnavailable, serviceBody("shop", "web", 0, true))

	mustApply(t, s)
	wantRefused(t, web)
	wantAnswer(t, api, "/", http.StatusOK, serviceBody("shop", "api", 1, true))
	wantListening(t, s, api)

	// Deleting again, or deleting what was never set, changes nothing.
	s.DeleteService(ports[0])
	mustApply(t, s)
	wantListening(t, s, api)

	// Set again, the port opens again.
	s.SetService(ports[0], "shop/web", 4)
	mustApply(t, s)
	wantAnswer(t, web, "/", http.StatusOK, serviceBody("shop", "web", 4, true))

	// Deleted and set again before an Apply: the port answers throughout.
	s.DeleteService(ports[0])
	s.SetService(ports[0], "shop/web", 2)
	mustApply(t, s)
	wantAnswer(t, web, "/", http.StatusOK, serviceBody("shop", "web", 2, true))
	wantListening(t, s, web, api)
}

func TestNodeAddressChangeMovesListeners(t *testing.T) {
	ports := freePorts(t, 2)
	waitServing(t, 0) // nothing left from earlier tests
	s := newServers(t)
	s.SetHealthy(true)
	s.SetService(ports[0], "shop/web", 1)
	s.SetService(ports[1], "shop/api", 1)
	at := func(a netip.Addr, i int) netip.AddrPort { return netip.AddrPortFrom(a, ports[i]) }

	s.SetNodeAddrs([]netip.Addr{lo2, lo1, lo1})
	mustApply(t, s)
	wantListening(t, s, at(lo1, 0), at(lo1, 1), at(lo2, 0), at(lo2, 1))
	waitServing(t, 4) // one server goroutine per listener
	wantAnswer(t, at(lo1, 0), "/", http.StatusOK, serviceBody("shop", "web", 1, true))
	wantAnswer(t, at(lo1, 1), "/", http.StatusOK, serviceBody("shop", "api", 1, true))

	// The node's address 127.0.0.1 goes away and 127.0.0.3 comes.
	s.SetNodeAddrs([]netip.Addr{lo2, lo3})
	mustApply(t, s)
	wantListening(t, s, at(lo2, 0), at(lo2, 1), at(lo3, 0), at(lo3, 1))
	waitServing(t, 4) // the old servers and their connections are gone
	for i := range ports {
		wantRefused(t, at(lo1, i))
		wantAnswer(t, at(lo2, i), "/", http.StatusOK, serviceBody("shop", []string{"web", "api"}[i], 1, true))
		wantAnswer(t, at(lo3, i), "/", http.StatusOK, serviceBody("shop", []string{"web", "api"}[i], 1, true))
	}

	// No addresses: the unspecified address, reached through any of the node's addresses.
	s.SetNodeAddrs(nil)
	mustApply(t, s)
	all := netip.IPv4Unspecified()
	wantListening(t, s, at(all, 0), at(all, 1))
	wantAnswer(t, at(lo1, 0), "/", http.StatusOK, serviceBody("shop", "web", 1, true))
	wantAnswer(t, at(lo3, 1), "/", http.StatusOK, serviceBody("shop", "api", 1, true))

	// And back to one address: the unspecified listeners must be closed before it binds.
	s.SetNodeAddrs([]netip.Addr{lo1})
	mustApply(t, s)
	wantListening(t, s, at(lo1, 0), at(lo1, 1))
	wantRefused(t, at(lo2, 0))
	wantRefused(t, at(lo3, 1))
	wantAnswer(t, at(lo1, 1), "/", http.StatusOK, serviceBody("shop", "api", 1, true))

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	waitServing(t, 0)
}

func TestPortTakenByAnotherProcess(t *testing.T) {
	port := freePorts(t, 1)[0]
	taken := netip.AddrPortFrom(lo1, port)
	other, err := net.Listen("tcp", taken.String())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	s := newServers(t)
	s.SetNodeAddrs([]netip.Addr{lo1, lo2})
	s.SetHealthy(true)
	s.SetService(port, "shop/web", 1)
	free := netip.AddrPortFrom(lo2, port)

	// Retried on every Apply while the port stays taken; the other address opens regardless.
	for range 2 {
		err := s.Apply()
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("applying: %v, want address in use", err)
		}
		for _, part := range []string{taken.String(), "shop/web"} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("error %q does not name %s", err, part)
			}
		}
		wantListening(t, s, free)
		wantAnswer(t, free, "/", http.StatusOK, serviceBody("shop", "web", 1, true))
	}

	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	mustApply(t, s)
	wantListening(t, s, taken, free)
	wantAnswer(t, taken, "/", http.StatusOK, serviceBody("shop", "web", 1, true))
}

func TestCloseClosesAll(t *testing.T) {
	ports := freePorts(t, 2)
	s := newServers(t)
	s.SetNodeAddrs([]netip.Addr{lo1, lo2})
	s.SetService(ports[0], "shop/web", 1)
	s.SetService(ports[1], "shop/api", 0)
	mustApply(t, s)
	var open []netip.AddrPort
	for _, a := range []netip.Addr{lo1, lo2} {
		for _, p := range ports {
			ap := netip.AddrPortFrom(a, p)
			open = append(open, ap)
			ask(t, ap, "/")
		}
	}
	slices.SortFunc(open, netip.AddrPort.Compare)
	wantListening(t, s, open...)

	if err := s.Close(); err != nil {
		t.Fatalf("closing: %v", err)
	}
	wantListening(t, s)
	for _, ap := range open {
		wantRefused(t, ap)
	}
	waitServing(t, 0)

	if err := s.Apply(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close: %v, want %v", err, ErrClosed)
	}
	wantListening(t, s)
	if err := s.Close(); err != nil {
		t.Fatalf("closing twice: %v", err)
	}
}

// TestConcurrentUse runs setters, Apply and requests at once (for the race detector) and
// checks that the end state is served and that Close leaves nothing behind.
func TestConcurrentUse(t *testing.T) {
	ports := freePorts(t, 3)
	s := newServers(t)
	s.SetHealthy(true)
	addrSets := [][]netip.Addr{{lo1}, {lo1, lo2}, {lo3}, nil}

	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 40 {
				p := ports[(w+i)%len(ports)]
				switch i % 4 {
				case 0:
					s.SetNodeAddrs(addrSets[(w+i)%len(addrSets)])
				case 1:
					s.SetService(p, "shop/web", i)
				case 2:
					s.DeleteService(p)
				case 3:
					s.SetHealthy(i%8 == 3)
				}
				// Workers race each other for ports on overlapping addresses; only the
				// final Apply below must succeed.
				_ = s.Apply()
				for _, ap := range s.Listening() {
					if c, err := net.Dial("tcp", ap.String()); err == nil {
						_, _ = askOn(c, bufio.NewReader(c), "/", false)
						c.Close()
					}
				}
			}
		})
	}
	wg.Wait()

	s.SetNodeAddrs([]netip.Addr{lo1})
	s.SetHealthy(true)
	for _, p := range ports {
		s.SetService(p, "shop/web", 1)
	}
	mustApply(t, s)
	for _, p := range ports {
		wantAnswer(t, netip.AddrPortFrom(lo1, p), "/", http.StatusOK, serviceBody("shop", "web", 1, true))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	waitServing(t, 0)
}

// TestServiceAnswersByFamily: a check is answered with the local endpoints of the family it
// came by, on one port serving both (a node with IPv4 endpoints only must not draw IPv6
// connections it cannot forward).
func TestServiceAnswersByFamily(t *testing.T) {
	port := freePorts(t, 1)[0]
	s := newServers(t)
	lo6 := netip.IPv6Loopback()
	s.SetNodeAddrs([]netip.Addr{lo1, lo6})
	s.SetHealthy(true)
	s.SetServiceFamilies(port, "shop/web", 2, 0)
	mustApply(t, s)
	v4, v6 := netip.AddrPortFrom(lo1, port), netip.AddrPortFrom(lo6, port)
	wantAnswer(t, v4, "/", http.StatusOK, serviceBody("shop", "web", 2, true))
	wantAnswer(t, v6, "/", http.StatusServiceUnavailable, serviceBody("shop", "web", 0, true))
	s.SetServiceFamilies(port, "shop/web", 0, 1)
	wantAnswer(t, v4, "/", http.StatusServiceUnavailable, serviceBody("shop", "web", 0, true))
	wantAnswer(t, v6, "/", http.StatusOK, serviceBody("shop", "web", 1, true))
}
