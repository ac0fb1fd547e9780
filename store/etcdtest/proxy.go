package etcdtest

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// Proxy is a TCP proxy on a free 127.0.0.1 port that forwards every
// connection to a target, and can cut the link on demand.
type Proxy struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	cut    bool
	closed bool
	conns  map[net.Conn]struct{}
	// silent holds every byte and every new connection, closing nothing (a link gone down
	// or a firewall dropping packets): only the peers' own timeouts notice. held wakes the
	// waiters when it ends.
	silent bool
	held   *sync.Cond

	wg sync.WaitGroup
}

// NewProxy starts a proxy to target, a host:port such as
// "127.0.0.1:2379". A URL such as "http://127.0.0.1:2379" is accepted
// too.
func NewProxy(target string) (*Proxy, error) {
	target = stripScheme(target)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("etcdtest: proxy listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.held = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

func stripScheme(target string) string {
	for _, prefix := range []string{"http://", "https://", "unix://", "tcp://"} {
		if len(target) > len(prefix) && target[:len(prefix)] == prefix {
			return target[len(prefix):]
		}
	}
	return target
}

// Endpoint returns "http://127.0.0.1:PORT". For a TLS target use
// "https://" + Addr(): the proxy forwards bytes and does not care.
func (p *Proxy) Endpoint() string {
	return "http://127.0.0.1:" + strconv.Itoa(p.ln.Addr().(*net.TCPAddr).Port)
}

// Cut closes every current connection and, until Restore, accepts new
// ones only to close them at once.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.closeConnsLocked()
}

// Silence holds the link without closing anything: bytes either way and new connections
// wait (as over a link that went down, where nothing answers and nothing is refused) until
// Restore, when what waited goes through, as TCP's retransmissions would deliver it.
func (p *Proxy) Silence() {
	p.mu.Lock()
	p.silent = true
	p.mu.Unlock()
}

// Restore lets traffic through again after Cut or Silence.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.silent = false
	p.held.Broadcast()
	p.mu.Unlock()
}

// wait blocks while the link is silenced; it reports false once the proxy is closed.
func (p *Proxy) wait() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.silent && !p.closed {
		p.held.Wait()
	}
	return !p.closed
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines to end. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	p.closeConnsLocked()
	p.held.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) closeConnsLocked() {
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// track registers c, unless the proxy is cut or closed, in which case it
// closes c and reports false.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(down net.Conn) {
	defer p.wg.Done()
	defer p.untrack(down)
	if !p.wait() {
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)

	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && (!p.wait() || writeAll(dst, buf[:n]) != nil) {
				return
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(up, down)
	go pipe(down, up)
	<-done
	// One side ended: end both, which also ends the other copy.
	down.Close()
	up.Close()
	<-done
}

func writeAll(w net.Conn, b []byte) error {
	for len(b) > 0 {
		n, err := w.Write(b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
