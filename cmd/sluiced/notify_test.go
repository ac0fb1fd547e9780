package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/cmd/internal/agentconfig"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store/etcdtest"
)

// fakeSystemd is a NOTIFY_SOCKET that keeps every datagram.
type fakeSystemd struct {
	conn *net.UnixConn
	mu   sync.Mutex
	msgs []string
}

func newFakeSystemd(t *testing.T) (*fakeSystemd, string) {
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSystemd{conn: c}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			f.mu.Lock()
			f.msgs = append(f.msgs, string(buf[:n]))
			f.mu.Unlock()
		}
	}()
	t.Cleanup(func() { c.Close() })
	return f, path
}

func (f *fakeSystemd) count(part string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, m := range f.msgs {
		if strings.Contains(m, part) {
			n++
		}
	}
	return n
}

func (f *fakeSystemd) index(part string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, m := range f.msgs {
		if strings.Contains(m, part) {
			return i
		}
	}
	return -1
}

func TestSystemdNotify(t *testing.T) {
	srv := etcdtest.New(t)
	sd, sock := newFakeSystemd(t)
	c, err := agentconfig.Parse([]string{"--etcd-endpoints", srv.Endpoint(), "--node-name", "node-a", "--dataplane=false", "--health-listen", ""},
		envOf(map[string]string{"NOTIFY_SOCKET": sock, "WATCHDOG_USEC": "200000"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Watchdog != 200*time.Millisecond {
		t.Fatalf("watchdog %v", c.Watchdog)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, c, zerolog.Nop()) }()
	deadline := time.Now().Add(10 * time.Second)
	for sd.count("READY=1") == 0 || sd.count("WATCHDOG=1") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("messages: %q", sd.msgs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if sd.count("READY=1") != 1 {
		t.Fatalf("READY=1 sent %d times", sd.count("READY=1"))
	}
	if i, j := sd.index("STATUS=reading etcd"), sd.index("READY=1"); i < 0 || j < i {
		t.Fatalf("STATUS before READY: %q", sd.msgs)
	}
	if !strings.Contains(sd.msgs[sd.index("READY=1")], "STATUS=ready: in sync at revision") {
		t.Fatalf("READY carries no status: %q", sd.msgs[sd.index("READY=1")])
	}
	for deadline := time.Now().Add(2 * time.Second); sd.count("STOPPING=1") == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if sd.count("STOPPING=1") != 1 {
		t.Fatalf("no STOPPING=1: %q", sd.msgs)
	}
	// Without a live apply loop there are no keepalives (a hung loop gets restarted).
	if agentconfig.WatchdogInterval("200000", "1", 2) != 0 || agentconfig.WatchdogInterval("x", "", 1) != 0 {
		t.Fatal("WATCHDOG_PID or a bad WATCHDOG_USEC accepted")
	}
}

// TestWatchdogStopsWhenLoopHangs: with a dataplane whose loop never ran, no keepalive is sent.
func TestWatchdogStopsWhenLoopHangs(t *testing.T) {
	sd, sock := newFakeSystemd(t)
	n, err := newNotifier(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer n.close()
	state := newAgentState()
	state.dp = newStalledDataplane()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	supervise(ctx, n, state, 100*time.Millisecond)
	if sd.count("WATCHDOG=1") != 0 {
		t.Fatalf("keepalives from a hung loop: %q", sd.msgs)
	}
}

func newStalledDataplane() *dataplane.Dataplane {
	return dataplane.New(dataplane.NewFakeKernel(), dataplane.Config{}) // never Run: never alive
}
