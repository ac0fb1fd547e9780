package healthcheck

import (
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrClosed is returned by Apply after Close.
var ErrClosed = errors.New("health check servers closed")

// Servers serves the health-check node ports of this node: one HTTP server per (node
// address, port), each answering for the service that owns the port. Set... methods record
// the desired state and touch nothing; Apply opens and closes listeners to match. The answers
// (a service's name and local endpoint count, the agent's health) are read live on every
// request, so changing them never reopens a port. A Servers is safe for concurrent use.
//
// Hazards, each a real bug elsewhere (Calico #8112): listeners bound to a node address that
// went away were never closed, kept their goroutines, and the port later failed with "address
// in use". Here every listener is keyed by its address and port; Apply closes the listeners no
// longer wanted, and waits for their goroutines, before it opens any new one (so moving from
// the unspecified address to specific ones, or back, never collides with itself); a listener
// that cannot be opened (the port is taken by another process) is reported with its address,
// port and service and retried by the next Apply, while the others are opened regardless.
type Servers struct {
	now func() time.Time // the clock for the proxy health answer; tests replace it

	// applyMu serialises Apply and Close, which do the I/O. Handlers never take it, so
	// closing a listener (which waits for its handlers) while holding it cannot deadlock.
	applyMu sync.Mutex
	closed  bool

	mu        sync.Mutex
	nodeAddrs []netip.Addr             // desired; empty means the unspecified address
	services  map[uint16]serviceHealth // desired, by health-check node port
	healthy   bool
	// lastHealthy is when the agent last reported itself healthy.
	lastHealthy time.Time
	// listeners is what is open. It is written with both applyMu and mu held, so Apply
	// may read it holding applyMu alone.
	listeners map[netip.AddrPort]*listener
}

// serviceHealth is what a health-check node port answers for.
type serviceHealth struct {
	namespace, name string
	// local4 and local6 are the local ready endpoints by family: a check is answered with
	// the count of the family it came by.
	local4, local6 int
	// deleted marks a service removed since the last Apply: its port keeps answering 503
	// with no endpoints until Apply closes it, and is then forgotten.
	deleted bool
}

func (h serviceHealth) String() string { return h.namespace + "/" + h.name }

// New returns Servers with nothing to serve. The agent starts unhealthy: every port answers
// 503 until SetHealthy(true), so no load balancer is sent to a node whose dataplane is not
// programmed yet.
func New() *Servers {
	return &Servers{
		now:       time.Now,
		services:  map[uint16]serviceHealth{},
		listeners: map[netip.AddrPort]*listener{},
	}
}

// SetNodeAddrs sets the node's addresses that health-check node ports listen on. Empty means
// the unspecified address (every address of the node). Invalid addresses are ignored and
// IPv4-mapped IPv6 addresses are taken as IPv4.
func (s *Servers) SetNodeAddrs(addrs []netip.Addr) {
	norm := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			norm = append(norm, a.Unmap())
		}
	}
	slices.SortFunc(norm, netip.Addr.Compare)
	norm = slices.Compact(norm)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeAddrs = norm
}

// SetService sets the service ("namespace/name") whose health port is port, and how many
// ready endpoints it has on this node. A negative count is answered as 0. Port 0 means the
// service has no health check and is ignored. Ports are the key: Kubernetes allocates each
// health-check node port to one service.
func (s *Servers) SetService(port uint16, service string, localEndpoints int) {
	s.SetServiceFamilies(port, service, localEndpoints, localEndpoints)
}

// SetServiceFamilies is SetService with the local ready endpoints counted by family: a check
// that comes by IPv4 is answered with local4, one by IPv6 with local6.
func (s *Servers) SetServiceFamilies(port uint16, service string, local4, local6 int) {
	if port == 0 {
		return
	}
	ns, name, ok := strings.Cut(service, "/")
	if !ok {
		ns, name = "", service
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.services[port] = serviceHealth{namespace: ns, name: name, local4: max(local4, 0), local6: max(local6, 0)}
}

// DeleteService removes the health check on port. Until the next Apply closes the port, it
// answers 503 with no local endpoints.
func (s *Servers) DeleteService(port uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.services[port]; ok {
		h.deleted, h.local4, h.local6 = true, 0, 0
		s.services[port] = h
	}
}

// SetHealthy sets whether the agent itself is healthy (serviceProxyHealthy in the answers).
// It is answered at once; no Apply is needed.
func (s *Servers) SetHealthy(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.healthy = ok
	if ok {
		s.lastHealthy = s.now()
	}
}

// Apply opens and closes listeners to match the desired state. It first closes every
// listener no longer wanted and waits for its goroutines, then opens the missing ones.
// Failures do not stop it: each is reported in the joined error, naming the address, port
// and service, and retried by the next Apply.
func (s *Servers) Apply() error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if s.closed {
		return ErrClosed
	}

	var errs []error
	var stale []netip.AddrPort
	s.mu.Lock()
	want := s.wantedLocked()
	var gone []uint16
	for port, h := range s.services {
		if h.deleted {
			gone = append(gone, port)
		}
	}
	for ap, l := range s.listeners {
		if _, ok := want[ap]; !ok || l.exited() {
			stale = append(stale, ap)
		}
	}
	s.mu.Unlock()

	slices.SortFunc(stale, netip.AddrPort.Compare)
	for _, ap := range stale {
		l := s.listeners[ap]
		s.mu.Lock()
		delete(s.listeners, ap)
		s.mu.Unlock()
		// A listener whose server stopped on its own is reopened below if still wanted.
		if l.exited() && l.serveErr != nil && !errors.Is(l.serveErr, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("serving health check node port %s: %w", ap, l.serveErr))
		}
		if err := l.close(); err != nil {
			errs = append(errs, fmt.Errorf("closing health check node port %s: %w", ap, err))
		}
	}

	// The ports of deleted services are closed now; forget them unless set again meanwhile.
	s.mu.Lock()
	for _, port := range gone {
		if s.services[port].deleted {
			delete(s.services, port)
		}
	}
	s.mu.Unlock()

	missing := make([]netip.AddrPort, 0, len(want))
	for ap := range want {
		if _, ok := s.listeners[ap]; !ok {
			missing = append(missing, ap)
		}
	}
	slices.SortFunc(missing, netip.AddrPort.Compare)
	for _, ap := range missing {
		l, err := s.listen(ap)
		if err != nil {
			// Retried at the next apply; a port another process holds (a leftover
			// kube-proxy) is named with it.
			if who := PortHolder(ap.Port()); who != "" && errors.Is(err, syscall.EADDRINUSE) {
				err = fmt.Errorf("%w: held by %s", err, who)
			}
			errs = append(errs, fmt.Errorf("opening health check node port %s for service %s: %w", ap, want[ap], err))
			continue
		}
		s.mu.Lock()
		s.listeners[ap] = l
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// wantedLocked returns the listeners the desired state asks for, each with its service.
func (s *Servers) wantedLocked() map[netip.AddrPort]string {
	addrs := s.nodeAddrs
	if len(addrs) == 0 {
		// Go listens dual-stack on the IPv4 unspecified address where the host allows it.
		addrs = []netip.Addr{netip.IPv4Unspecified()}
	}
	want := make(map[netip.AddrPort]string, len(s.services)*len(addrs))
	for port, h := range s.services {
		if h.deleted {
			continue
		}
		for _, a := range addrs {
			want[netip.AddrPortFrom(a, port)] = h.String()
		}
	}
	return want
}

// Listening returns the addresses and ports open now, sorted.
func (s *Servers) Listening() []netip.AddrPort {
	s.mu.Lock()
	out := slices.Collect(maps.Keys(s.listeners))
	s.mu.Unlock()
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// Close closes every listener and waits for their goroutines. Apply fails with ErrClosed
// afterwards. It does not stop ServeProxyHealth, whose context does.
func (s *Servers) Close() error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.closed = true
	s.mu.Lock()
	open := s.listeners
	s.listeners = map[netip.AddrPort]*listener{}
	s.mu.Unlock()

	var errs []error
	for _, ap := range slices.SortedFunc(maps.Keys(open), netip.AddrPort.Compare) {
		if err := open[ap].close(); err != nil {
			errs = append(errs, fmt.Errorf("closing health check node port %s: %w", ap, err))
		}
	}
	return errors.Join(errs...)
}

// listener is one open health-check node port on one address.
type listener struct {
	srv   *http.Server
	conns sync.WaitGroup // the server's connections, each a goroutine
	done  chan struct{}  // closed when Serve returns
	// serveErr is why Serve returned; read it only after done is closed.
	serveErr error
}

// listen opens ap and serves the health check of the service on its port.
func (s *Servers) listen(ap netip.AddrPort) (*listener, error) {
	ln, err := net.Listen("tcp", ap.String())
	if err != nil {
		return nil, err
	}
	l := &listener{done: make(chan struct{})}
	l.srv = newHTTPServer(s.serviceHandler(ap.Port()), &l.conns)
	go func() {
		defer close(l.done)
		l.serveErr = l.srv.Serve(ln)
	}()
	return l, nil
}

// exited reports whether the listener's server has stopped.
func (l *listener) exited() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// close closes the listener and its connections, and returns once the server goroutine and
// every connection goroutine have finished.
func (l *listener) close() error {
	err := l.srv.Close()
	<-l.done
	l.conns.Wait()
	return err
}

// discardLog takes the net/http server's own messages: this package does not log.
var discardLog = log.New(io.Discard, "", 0)

// newHTTPServer returns a server for h that counts its connections in conns, so its owner
// can wait for their goroutines after closing it. Health checks are short; the timeouts keep
// a slow or silent client from holding a goroutine.
func newHTTPServer(h http.Handler, conns *sync.WaitGroup) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          discardLog,
		// StateNew is reported by Serve's own goroutine before it can return, so every
		// Add happens before the owner's Wait.
		ConnState: func(_ net.Conn, state http.ConnState) {
			switch state {
			case http.StateNew:
				conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				conns.Done()
			}
		},
	}
}
