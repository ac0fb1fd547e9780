package healthcheck

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// testClock is a clock the test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func TestProxyHealth(t *testing.T) {
	t0 := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	clock := &testClock{now: t0}
	s := newServers(t)
	s.now = clock.Now

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort(ln.Addr().String())
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeProxyHealth(ctx, ln, s) }()
	stop := sync.OnceValue(func() error {
		cancel()
		return <-served
	})
	t.Cleanup(func() { _ = stop() })

	// Not yet healthy: never reported healthy, so lastUpdated is the zero time.
	wantAnswer(t, ap, "/healthz", http.StatusServiceUnavailable,
		`{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2025-03-04T05:06:07Z","nodeEligible":true}`)
	wantAnswer(t, ap, "/livez", http.StatusServiceUnavailable,
		`{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2025-03-04T05:06:07Z"}`)

	// Healthy: lastUpdated is the current time, as kube-proxy answers.
	s.SetHealthy(true)
	clock.Set(t0.Add(30 * time.Second))
	wantAnswer(t, ap, "/healthz", http.StatusOK,
		`{"lastUpdated":"2025-03-04T05:06:37Z","currentTime":"2025-03-04T05:06:37Z","nodeEligible":true}`)
	wantAnswer(t, ap, "/livez", http.StatusOK,
		`{"lastUpdated":"2025-03-04T05:06:37Z","currentTime":"2025-03-04T05:06:37Z"}`)

	// Unhealthy: lastUpdated is when the agent last said it was healthy.
	clock.Set(t0.Add(time.Minute))
	s.SetHealthy(false)
	wantAnswer(t, ap, "/healthz", http.StatusServiceUnavailable,
		`{"lastUpdated":"2025-03-04T05:06:07Z","currentTime":"2025-03-04T05:07:07Z","nodeEligible":true}`)
	wantAnswer(t, ap, "/livez", http.StatusServiceUnavailable,
		`{"lastUpdated":"2025-03-04T05:06:07Z","currentTime":"2025-03-04T05:07:07Z"}`)

	if got := ask(t, ap, "/other"); got.status != http.StatusNotFound {
		t.Errorf("/other answered %d, want 404", got.status)
	}

	if err := stop(); err != nil {
		t.Fatalf("ServeProxyHealth returned %v after cancel, want nil", err)
	}
	wantRefused(t, ap)
}

func TestProxyHealthListenerFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // closed under it: serving fails at once, and says so
	if err := ServeProxyHealth(context.Background(), ln, New()); err == nil {
		t.Fatal("ServeProxyHealth on a closed listener returned nil")
	}
}
