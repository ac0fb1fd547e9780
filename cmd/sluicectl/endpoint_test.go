package main

import (
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDialTarget: what the reachability check dials for each form of endpoint etcd's client
// takes.
func TestDialTarget(t *testing.T) {
	for _, c := range []struct{ ep, network, addr string }{
		{"http://10.0.0.1:2379", "tcp", "10.0.0.1:2379"},
		{"https://etcd.example:2380", "tcp", "etcd.example:2380"},
		{"http://[fd00::1]:2379", "tcp", "[fd00::1]:2379"},
		{"10.0.0.1:2379", "tcp", "10.0.0.1:2379"},
		{"10.0.0.1", "tcp", "10.0.0.1:2379"},
		{"unix:///run/etcd/etcd.sock", "unix", "/run/etcd/etcd.sock"},
		{"unixs:///run/etcd/etcd.sock", "unix", "/run/etcd/etcd.sock"},
		{"unix://localhost:12379", "unix", "localhost:12379"},
	} {
		if n, a := dialTarget(c.ep); n != c.network || a != c.addr {
			t.Errorf("dialTarget(%q) = %s %s, want %s %s", c.ep, n, a, c.network, c.addr)
		}
	}
}

// TestUnixSocketEndpoint: sluicectl works against etcd behind a unix socket (etcd's client
// takes unix:// endpoints; the reachability check used to dial them as TCP and refuse them).
func TestUnixSocketEndpoint(t *testing.T) {
	c := newCluster(t)
	c.loadSample()
	u, err := url.Parse(c.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "etcd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	// A relay from the socket to the test's etcd, connection by connection.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
			if err != nil {
				in.Close()
				continue
			}
			wg.Add(2)
			for _, p := range [][2]net.Conn{{in, out}, {out, in}} {
				go func() {
					defer wg.Done()
					_, _ = io.Copy(p[0], p[1])
					p[0].Close()
					p[1].Close()
				}()
			}
		}
	}()
	c.env["SLUICE_ETCD_ENDPOINTS"] = "unix://" + sock
	out := c.mustCtl("get", "nodes")
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if !strings.Contains(out, n) {
			t.Fatalf("get nodes through %s lacks %s:\n%s", sock, n, out)
		}
	}
	// And a socket nobody listens on is said to be unreachable, by its name.
	c.env["SLUICE_ETCD_ENDPOINTS"] = "unix://" + sock + ".gone"
	if r := c.ctl("", "get", "nodes"); r.code == 0 || !strings.Contains(r.stderr, "cannot reach etcd") || !strings.Contains(r.stderr, sock+".gone") {
		t.Fatalf("an absent socket: exit %d, stderr %q", r.code, r.stderr)
	}
}
