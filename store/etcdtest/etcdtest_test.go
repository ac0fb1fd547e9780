package etcdtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	ServeChild() // serves and exits when this binary is an etcdtest child
	os.Exit(m.Run())
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// client(t)(x.Client()) fails the test on error and closes the client
// at cleanup.
func client(t *testing.T) func(*clientv3.Client, error) *clientv3.Client {
	return func(c *clientv3.Client, err error) *clientv3.Client {
		t.Helper()
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

func mustPut(t *testing.T, c *clientv3.Client, k, v string) {
	t.Helper()
	if _, err := c.Put(ctxT(t, 10*time.Second), k, v); err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
}

func mustGet(t *testing.T, c *clientv3.Client, k, want string) {
	t.Helper()
	resp, err := c.Get(ctxT(t, 10*time.Second), k)
	if err != nil {
		t.Fatalf("get %s: %v", k, err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != want {
		t.Fatalf("get %s = %v, want %q", k, resp.Kvs, want)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func TestSingleServerPutGet(t *testing.T) {
	s := New(t)
	c := client(t)(s.Client())
	mustPut(t, c, "k", "v")
	mustGet(t, c, "k", "v")
	if got, want := s.Endpoint()[:17], "http://127.0.0.1:"; got != want {
		t.Errorf("endpoint %q", s.Endpoint())
	}
	if !exists(filepath.Join(s.Dir(), "member", "wal")) {
		t.Errorf("no WAL in %s", s.Dir())
	}
}

func TestStopRestartKeepsData(t *testing.T) {
	s, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	dir, ep := s.Dir(), s.Endpoint()
	c := client(t)(s.Client())
	mustPut(t, c, "persist", "yes")

	s.Stop()
	if _, err := c.Get(ctxT(t, 300*time.Millisecond), "persist"); err == nil {
		t.Fatal("get succeeded while stopped")
	}
	if !exists(dir) {
		t.Fatal("Stop removed the data dir")
	}
	if err := s.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if s.Endpoint() != ep {
		t.Fatalf("endpoint changed: %s -> %s", ep, s.Endpoint())
	}
	mustGet(t, c, "persist", "yes")

	s.Close()
	s.Close() // idempotent
	if exists(dir) {
		t.Fatalf("Close left %s", dir)
	}
	if err := s.Restart(); err == nil {
		t.Fatal("Restart after Close succeeded")
	}
}

func TestCallerDirIsKept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s, err := Start(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if !exists(filepath.Join(dir, "member")) {
		t.Fatal("Close removed a caller's data dir")
	}
}

func TestClusterSurvivesOneMemberDown(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (5 s): make test runs it")
	}
	cl := NewCluster(t, 3)
	if len(cl.Endpoints()) != 3 {
		t.Fatalf("endpoints %v", cl.Endpoints())
	}
	c := client(t)(cl.Client())
	mustPut(t, c, "a", "1")

	// Stop the leader, the harder case.
	leader := 0
	for i, m := range cl.Members {
		st, err := c.Status(ctxT(t, 5*time.Second), m.Endpoint())
		if err != nil {
			t.Fatalf("status %s: %v", m.Endpoint(), err)
		}
		if st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	stopped := cl.Members[leader]
	stopped.Stop()

	mustPut(t, c, "b", "2")
	mustGet(t, c, "a", "1")
	mustGet(t, c, "b", "2")

	if err := stopped.Restart(); err != nil {
		t.Fatalf("restart member: %v", err)
	}
	one := client(t)(stopped.Client())
	mustGet(t, one, "b", "2") // linearizable read through the rejoined member
	mustPut(t, one, "c", "3")
	mustGet(t, c, "c", "3")

	// A crash (no leadership handover) of whichever member leads now.
	var killed *Server
	for _, m := range cl.Members {
		st, err := c.Status(ctxT(t, 5*time.Second), m.Endpoint())
		if err == nil && st.Leader == st.Header.MemberId {
			killed = m
		}
	}
	if killed == nil {
		t.Fatal("no leader")
	}
	killed.Kill()
	mustPut(t, c, "d", "4")
	if err := killed.Restart(); err != nil {
		t.Fatalf("restart killed member: %v", err)
	}
	mustGet(t, client(t)(killed.Client()), "d", "4")
}

func TestTLSRequiresClientCert(t *testing.T) {
	files, err := WriteTLSFiles(filepath.Join(t.TempDir(), "tls"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Options{TLS: files})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if s.Endpoint()[:8] != "https://" {
		t.Fatalf("endpoint %q", s.Endpoint())
	}

	noCert, err := files.CAConfig()
	if err != nil {
		t.Fatal(err)
	}
	bare := client(t)(clientv3.New(clientv3.Config{
		Endpoints: []string{s.Endpoint()}, DialTimeout: time.Second, TLS: noCert, Logger: zap.NewNop(),
	}))
	if _, err := bare.Get(ctxT(t, time.Second), "k"); err == nil {
		t.Fatal("server accepted a client without a certificate")
	}

	c := client(t)(s.Client())
	mustPut(t, c, "k", "tls")
	mustGet(t, c, "k", "tls")
}

func TestAuthRejectsWrongPassword(t *testing.T) {
	s := New(t)
	if err := EnableAuth(s, "secret"); err != nil {
		t.Fatal(err)
	}
	_, err := clientv3.New(clientv3.Config{
		Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second,
		Username: "root", Password: "wrong", Logger: zap.NewNop(),
	})
	if err == nil {
		t.Fatal("wrong password accepted")
	}

	anon := client(t)(clientv3.New(clientv3.Config{
		Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
	}))
	if _, err := anon.Put(ctxT(t, 5*time.Second), "k", "v"); err == nil {
		t.Fatal("anonymous put accepted with auth on")
	}

	c := client(t)(s.Client()) // logs in as root
	mustPut(t, c, "k", "auth")
	mustGet(t, c, "k", "auth")
}

func TestProxyCutAndRestore(t *testing.T) {
	s := New(t)
	p, err := NewProxy(s.Endpoint()[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)

	c := client(t)(newClient([]string{p.Endpoint()}, nil, "", ""))
	mustPut(t, c, "k", "before")

	p.Cut()
	if _, err := c.Get(ctxT(t, 300*time.Millisecond), "k"); err == nil {
		t.Fatal("get succeeded through a cut proxy")
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("cut error: %v", err)
	}

	p.Restore()
	start := time.Now()
	mustGet(t, c, "k", "before")
	t.Logf("first get after Restore took %v", time.Since(start).Round(time.Millisecond))
	mustPut(t, c, "k", "after")

	p.Close()
	p.Close() // idempotent
}

func TestChildServesAndCleansUp(t *testing.T) {
	ch, err := StartChild(Options{})
	if err != nil {
		t.Fatal(err)
	}
	pid, dir := ch.Pid(), ch.Dir()
	if pid == os.Getpid() {
		t.Fatal("child is this process")
	}
	c := client(t)(newClient([]string{ch.Endpoint()}, nil, "", ""))
	mustPut(t, c, "child", "ok")
	mustGet(t, c, "child", "ok")
	if !exists(filepath.Join(dir, "member")) {
		t.Fatalf("child data dir %s has no member dir", dir)
	}

	ch.Close()
	ch.Close() // idempotent
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("child %d still there after Close (kill 0: %v)", pid, err)
	}
	if exists(dir) {
		t.Fatalf("child Close left %s", dir)
	}
}
