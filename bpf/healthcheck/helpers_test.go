package healthcheck

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Loopback addresses: on Linux the whole of 127.0.0.0/8 is local, so each stands for one
// address of the node.
var (
	lo1 = netip.MustParseAddr("127.0.0.1")
	lo2 = netip.MustParseAddr("127.0.0.2")
	lo3 = netip.MustParseAddr("127.0.0.3")
)

// freePorts returns n distinct TCP ports that were free a moment ago, in ascending order.
func freePorts(t *testing.T, n int) []uint16 {
	t.Helper()
	var lns []net.Listener
	var ports []uint16
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("picking a free port: %v", err)
		}
		lns = append(lns, ln)
		ports = append(ports, uint16(ln.Addr().(*net.TCPAddr).Port))
	}
	for _, ln := range lns {
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(ports)
	return ports
}

// newServers returns Servers that the test closes at its end, checking nothing is left open.
func newServers(t *testing.T) *Servers {
	t.Helper()
	s := New()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing: %v", err)
		}
		if l := s.Listening(); len(l) != 0 {
			t.Errorf("still listening after Close: %v", l)
		}
	})
	return s
}

func mustApply(t *testing.T, s *Servers) {
	t.Helper()
	if err := s.Apply(); err != nil {
		t.Fatalf("applying: %v", err)
	}
}

func wantListening(t *testing.T, s *Servers, want ...netip.AddrPort) {
	t.Helper()
	if got := s.Listening(); !slices.Equal(got, want) {
		t.Fatalf("listening on %v, want %v", got, want)
	}
}

// answer is one HTTP answer as a load balancer sees it.
type answer struct {
	status      int
	contentType string
	nosniff     string
	body        string
}

// ask sends one request for path to ap on a fresh connection. It uses a bare connection, not
// an http.Client, so that no client goroutine outlives it.
func ask(t *testing.T, ap netip.AddrPort, path string) answer {
	t.Helper()
	c, err := net.Dial("tcp", ap.String())
	if err != nil {
		t.Fatalf("connecting to %s: %v", ap, err)
	}
	defer c.Close()
	a, err := askOn(c, bufio.NewReader(c), path, false)
	if err != nil {
		t.Fatalf("asking %s%s: %v", ap, path, err)
	}
	return a
}

// askOn sends one request for path on c, keeping the connection open if keepAlive.
func askOn(c net.Conn, r *bufio.Reader, path string, keepAlive bool) (answer, error) {
	// A deadline so that a hung server fails the test instead of hanging it.
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return answer{}, err
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+c.RemoteAddr().String()+path, nil)
	if err != nil {
		return answer{}, err
	}
	req.Close = !keepAlive
	if err := req.Write(c); err != nil {
		return answer{}, err
	}
	resp, err := http.ReadResponse(r, req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{
		status:      resp.StatusCode,
		contentType: resp.Header.Get("Content-Type"),
		nosniff:     resp.Header.Get("X-Content-Type-Options"),
		body:        string(body),
	}, nil
}

// wantAnswer asks ap for path and checks the status, both headers and the exact body.
func wantAnswer(t *testing.T, ap netip.AddrPort, path string, status int, body string) {
	t.Helper()
	want := answer{status: status, contentType: "application/json", nosniff: "nosniff", body: body}
	if got := ask(t, ap, path); got != want {
		t.Fatalf("%s%s answered\n%+v\nwant\n%+v", ap, path, got, want)
	}
}

// wantRefused checks that nothing listens on ap.
func wantRefused(t *testing.T, ap netip.AddrPort) {
	t.Helper()
	c, err := net.Dial("tcp", ap.String())
	if err == nil {
		c.Close()
		t.Fatalf("%s accepted a connection, want refused", ap)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connecting to %s: %v, want connection refused", ap, err)
	}
}

// servingGoroutines counts the goroutines of health-check node port servers: one per open
// listener, one per connection. It returns them with the stacks of all goroutines.
func servingGoroutines() (int, string) {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "healthcheck.(*Servers).listen") || strings.Contains(g, "net/http.(*conn).serve") {
			count++
		}
	}
	return count, string(buf)
}

// waitServing waits until exactly want server goroutines are left, and fails with all
// stacks if that does not happen within a generous bound. A goroutine that has signalled
// it is done still takes a moment to return, hence the wait rather than a single look.
func waitServing(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, stacks := servingGoroutines()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d server goroutines, want %d:\n%s", got, want, stacks)
		}
		time.Sleep(time.Millisecond)
	}
}
