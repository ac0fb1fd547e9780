package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store/etcdtest"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// sampleDir is the sample cluster every test loads.
const sampleDir = "../../testdata/sample"

// cluster is one embedded etcd for a test, the environment sluicectl sees, and a raw client
// that checks what sluicectl wrote without going through sluice's code.
type cluster struct {
	t        *testing.T
	endpoint string
	// env is the whole environment run sees; nothing leaks in from the process's own.
	env map[string]string
	raw *clientv3.Client
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	srv := etcdtest.New(t)
	raw, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return &cluster{t: t, endpoint: srv.Endpoint(), raw: raw,
		env: map[string]string{"SLUICE_ETCD_ENDPOINTS": srv.Endpoint()}}
}

// result is what one sluicectl run printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

// ctl runs sluicectl in this process with stdin and the cluster's environment.
func (c *cluster) ctl(stdin string, args ...string) result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, strings.NewReader(stdin), &stdout, &stderr, func(k string) string { return c.env[k] })
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// mustCtl runs sluicectl and fails the test unless it exits 0; it returns standard output.
func (c *cluster) mustCtl(args ...string) string {
	c.t.Helper()
	r := c.ctl("", args...)
	if r.code != 0 {
		c.t.Fatalf("sluicectl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// loadSample applies the sample cluster.
func (c *cluster) loadSample() {
	c.t.Helper()
	c.mustCtl("apply", "-f", sampleDir)
}

// keys lists every key under prefix, in key order.
func (c *cluster) keys(prefix string) []string {
	c.t.Helper()
	resp, err := c.raw.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		c.t.Fatal(err)
	}
	ks := []string{}
	for _, kv := range resp.Kvs {
		ks = append(ks, string(kv.Key))
	}
	return ks
}

// kv returns the stored key-value at key; the test fails when there is none.
func (c *cluster) kv(key string) *mvccpb.KeyValue {
	c.t.Helper()
	resp, err := c.raw.Get(context.Background(), key)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		c.t.Fatalf("no key %s", key)
	}
	return resp.Kvs[0]
}

// value returns the stored value at key decoded as a generic JSON object.
func (c *cluster) value(key string) map[string]any {
	c.t.Helper()
	var m map[string]any
	if err := json.Unmarshal(c.kv(key).Value, &m); err != nil {
		c.t.Fatalf("value at %s: %v", key, err)
	}
	return m
}

func (c *cluster) put(key, value string) {
	c.t.Helper()
	if _, err := c.raw.Put(context.Background(), key, value); err != nil {
		c.t.Fatal(err)
	}
}

// revision is etcd's current revision.
func (c *cluster) revision() int64 {
	c.t.Helper()
	resp, err := c.raw.Get(context.Background(), "/")
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Header.Revision
}

// table normalises a table's padding: each line's cells joined by one space.
func table(out string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		b.WriteString(strings.Join(strings.Fields(line), " "))
		b.WriteByte('\n')
	}
	return b.String()
}

// lines splits output into its lines.
func lines(out string) []string {
	out = strings.TrimRight(out, "\n")
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// jsonEqual reports whether two JSON texts hold the same value.
func jsonEqual(t *testing.T, got any, want string) bool {
	t.Helper()
	g, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var gv, wv any
	if err := json.Unmarshal(g, &gv); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(want), &wv); err != nil {
		t.Fatalf("bad want %s: %v", want, err)
	}
	gb, _ := json.Marshal(gv)
	wb, _ := json.Marshal(wv)
	return bytes.Equal(gb, wb)
}
