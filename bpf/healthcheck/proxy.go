package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// livezAnswer is the body of /livez, as kube-proxy writes it.
type livezAnswer struct {
	// LastUpdated is when the agent last reported itself healthy; while it is healthy,
	// the current time, as in kube-proxy.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
}

// healthzAnswer is the body of /healthz, as kube-proxy writes it. sluice knows nothing of
// nodes being drained for deletion, so the node is always eligible.
type healthzAnswer struct {
	livezAnswer
	NodeEligible bool `json:"nodeEligible"`
}

// ServeProxyHealth serves the proxy health check, like kube-proxy's :10256, on ln until ctx
// is done: /healthz and /livez answer 200 while s is healthy (SetHealthy) and 503 otherwise,
// with a JSON body. It closes ln and returns nil once ctx is done and every connection is
// closed; it returns an error if serving fails first. The listen address is the caller's to
// configure; with none configured the caller does not call this.
func ServeProxyHealth(ctx context.Context, ln net.Listener, s *Servers) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		ok, a := s.proxyHealth()
		writeJSON(w, ok, healthzAnswer{livezAnswer: a, NodeEligible: true})
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		ok, a := s.proxyHealth()
		writeJSON(w, ok, a)
	})
	var conns sync.WaitGroup
	srv := newHTTPServer(mux, &conns)
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	err := srv.Serve(ln)
	stop()
	_ = srv.Close() // Serve may have failed on its own, or ctx's Close may still be running
	conns.Wait()
	if ctx.Err() != nil && errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving proxy health on %s: %w", ln.Addr(), err)
}

// proxyHealth returns whether the agent is healthy, and the times to answer with.
func (s *Servers) proxyHealth() (bool, livezAnswer) {
	s.mu.Lock()
	healthy, last := s.healthy, s.lastHealthy
	s.mu.Unlock()
	now := s.now().UTC()
	if healthy {
		last = now
	}
	return healthy, livezAnswer{LastUpdated: last.UTC(), CurrentTime: now}
}
