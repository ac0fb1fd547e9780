package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/cmd/internal/agentconfig"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func statusOf(t *testing.T, cli *clientv3.Client, node string) *store.NodeStatus {
	t.Helper()
	resp, err := cli.Get(context.Background(), store.StatusPrefix+node)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var s store.NodeStatus
	if err := json.Unmarshal(resp.Kvs[0].Value, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// TestStatusKeyLifecycle runs the real binary: its status key appears (in sync, ready, at the
// current revision), goes at once on SIGTERM (the lease is released), and goes by lease
// expiry after kill -9.
func TestStatusKeyLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (12 s): make test runs it")
	}
	srv, cli := newEtcd(t)
	rev, err := cli.Put(context.Background(), store.NodePrefix+"node-a", `{"spec":{"bgp":{"ipv4Address":"192.0.2.11/24"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "sluiced")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "--etcd-endpoints", srv.Endpoint(), "--node-name", "node-a", "--dataplane=false",
			"--health-listen", "", "--status-ttl", "2s", "--log-format", "json")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	waitStatus := func(what string, cond func(*store.NodeStatus) bool) time.Duration {
		t.Helper()
		begin := time.Now()
		for !cond(statusOf(t, cli, "node-a")) {
			if time.Since(begin) > 15*time.Second {
				t.Fatalf("timed out waiting for %s: %+v", what, statusOf(t, cli, "node-a"))
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Since(begin)
	}

	cmd := start()
	waitStatus("a ready status", func(s *store.NodeStatus) bool {
		return s != nil && s.InSync && s.Ready && s.Revision >= rev.Header.Revision && s.AppliedRevision == s.Revision
	})
	_ = cmd.Process.Signal(syscall.SIGTERM)
	took := waitStatus("the key released on SIGTERM", func(s *store.NodeStatus) bool { return s == nil })
	if took > time.Second {
		t.Fatalf("the key outlived a clean stop by %v (the lease was not released)", took)
	}
	_ = cmd.Wait()

	cmd = start()
	waitStatus("a ready status again", func(s *store.NodeStatus) bool { return s != nil && s.Ready })
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	took = waitStatus("the key gone by lease expiry after kill -9", func(s *store.NodeStatus) bool { return s == nil })
	t.Logf("status key gone %v after kill -9 (lease 2s)", took)
}

// TestStatusLeaseLostIsReplaced: a lease lost while the agent lives (here revoked from
// outside, as an expiry during an etcd outage would) is replaced and the key written again.
func TestStatusLeaseLostIsReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (1 s): make test runs it")
	}
	srv, cli := newEtcd(t)
	c, err := agentconfig.Parse([]string{"--etcd-endpoints", srv.Endpoint(), "--node-name", "node-a", "--dataplane=false", "--health-listen", "", "--status-ttl", "2s"},
		envOf(map[string]string{"NOTIFY_SOCKET": "/nonexistent/notify.sock"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, c, zerolog.Nop()) }() // an unreachable NOTIFY_SOCKET must not stop it
	defer func() { cancel(); <-done }()
	leaseOf := func() clientv3.LeaseID {
		resp, err := cli.Get(context.Background(), store.StatusPrefix+"node-a")
		if err != nil || len(resp.Kvs) == 0 {
			return 0
		}
		return clientv3.LeaseID(resp.Kvs[0].Lease)
	}
	deadline := time.Now().Add(10 * time.Second)
	for leaseOf() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no status key")
		}
		time.Sleep(20 * time.Millisecond)
	}
	first := leaseOf()
	if _, err := cli.Revoke(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	for l := leaseOf(); l == 0 || l == first; l = leaseOf() {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatal("the status key was not written again under a new lease")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHealthPortInUse: a taken health port stops the start, naming the option.
func TestHealthPortInUse(t *testing.T) {
	srv := etcdtest.New(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := agentconfig.Parse([]string{"--etcd-endpoints", srv.Endpoint(), "--node-name", "node-a", "--dataplane=false", "--health-listen", l.Addr().String()},
		envOf(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), c, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "option health-listen") {
		t.Fatalf("run = %v, want an error naming health-listen", err)
	}
}
