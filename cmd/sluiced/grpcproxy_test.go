package main

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitStatusKey polls node-a's status key, read from etcd directly, until cond holds.
func waitStatusKey(t *testing.T, cli *clientv3.Client, what string, cond func(*store.NodeStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond(statusOf(t, cli, "node-a")) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 20 s: %+v", what, statusOf(t, cli, "node-a"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const nodeE = `{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-e"},"spec":{"bgp":{"ipv4Address":"192.168.20.15/24"}}}`

// TestRunThroughGRPCProxy: the agent, given only the address of etcd's gRPC proxy, works as
// it does against etcd itself (issue #11, fan-out): the same objects in sync, changes written
// to etcd directly arrive through the proxy's shared watch, its status key is written,
// kept alive and released through the proxy, and it is ready.
func TestRunThroughGRPCProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (11 s): make test runs it")
	}
	srv, cli, counts := loadedEtcd(t)

	// Directly first: what the agent counts against etcd itself.
	direct := runAgent(t, srv.Endpoint())
	directSync := direct.logs.waitFor(t, "in sync with etcd", nil)
	if err := direct.stop(); err != nil {
		t.Fatalf("direct run returned %v", err)
	}
	if !reflect.DeepEqual(directSync["objects"], counts) {
		t.Fatalf("directly in sync with %v, want %v", directSync["objects"], counts)
	}

	px := etcdtest.NewGRPCProxy(t, srv.Endpoint())
	// Through the proxy a lease's keepalive answers come up to two thirds of its TTL apart
	// (directly: a third), and with the client's granularity (keepalives on 500 ms ticks, its
	// deadline checked every second) a 2 s lease lapses now and then on the agent's side,
	// which then revokes it and writes the key again under a new one. 5 s leaves room.
	const ttl = 5 * time.Second
	a := runAgent(t, px.Endpoint(), "--status-ttl", ttl.String(), "--etcd-liveness", "2s")
	if l := a.logs.waitFor(t, "starting", nil); !reflect.DeepEqual(l["etcd"], []any{px.Endpoint()}) {
		t.Fatalf("starting line %v; want the proxy as the only endpoint", l)
	}
	inSync := a.logs.waitFor(t, "in sync with etcd", nil)
	if !reflect.DeepEqual(inSync["objects"], directSync["objects"]) {
		t.Errorf("through the proxy in sync with %v; directly %v", inSync["objects"], directSync["objects"])
	}
	checkHealth(t, a.healthAddr)

	// Changes written to etcd itself, not through the proxy, reach the agent through the
	// proxy's watch.
	put, err := cli.Put(context.Background(), store.NodePrefix+"node-e", nodeE)
	if err != nil {
		t.Fatal(err)
	}
	up := a.logs.waitFor(t, "event", map[string]string{"event": "upsert", "kind": "Node", "key": store.NodePrefix + "node-e"})
	if up["revision"] != float64(put.Header.Revision) {
		t.Errorf("upsert of node-e at revision %v, written at %d", up["revision"], put.Header.Revision)
	}
	del, err := cli.Delete(context.Background(), store.NodePrefix+"node-e")
	if err != nil {
		t.Fatal(err)
	}
	gone := a.logs.waitFor(t, "event", map[string]string{"event": "delete", "kind": "Node", "key": store.NodePrefix + "node-e"})
	if gone["revision"] != float64(del.Header.Revision) {
		t.Errorf("delete of node-e at revision %v, written at %d", gone["revision"], del.Header.Revision)
	}

	// The status key, written through the proxy under a lease, read from etcd itself.
	waitStatusKey(t, cli, "ready status at the delete's revision", func(s *store.NodeStatus) bool {
		return s != nil && s.InSync && s.Ready && s.Revision >= del.Header.Revision
	})
	leaseOf := func() clientv3.LeaseID {
		t.Helper()
		resp, err := cli.Get(context.Background(), store.StatusPrefix+"node-a")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0
		}
		return clientv3.LeaseID(resp.Kvs[0].Lease)
	}
	lease := leaseOf()
	if lease == 0 {
		t.Fatal("the status key has no lease")
	}
	// Two TTLs later the key is still there under the same lease: the lease's keepalives
	// go through the proxy. The watch was quiet all along, for longer than the agent's
	// liveness time: the progress requests it writes then are not answered by the proxy
	// (etcd-io/etcd#19710), and the agent must not take that for a lost etcd.
	for range 2 {
		time.Sleep(ttl)
		if l := leaseOf(); l != lease {
			t.Fatalf("status key under lease %x, was %x: the lease was not kept alive through the proxy", l, lease)
		}
		ttlResp, err := cli.TimeToLive(context.Background(), lease)
		if err != nil {
			t.Fatal(err)
		}
		if ttlResp.TTL <= 0 {
			t.Fatalf("status lease %x TTL %d", lease, ttlResp.TTL)
		}
	}
	checkHealth(t, a.healthAddr)
	if v := metric(t, a.healthAddr, "sluice_etcd_silences_total"); v != "0" {
		t.Errorf("sluice_etcd_silences_total %s after a quiet watch through the proxy; want 0", v)
	}
	if v := metric(t, a.healthAddr, "sluice_etcd_retries_total"); v != "0" {
		t.Errorf("sluice_etcd_retries_total %s; want 0", v)
	}
	// The agent's liveness probe is a read the proxy serves, not a progress request it
	// refuses and logs (etcd-io/etcd#19710).
	if n := strings.Count(px.Log(), "not supported request type by gRPC proxy"); n != 0 {
		t.Errorf("the proxy logged %d requests it does not serve", n)
	}

	// Stopping releases the lease through the proxy: the key goes at once.
	if err := a.stop(); err != nil {
		t.Fatalf("run returned %v after cancel, want nil", err)
	}
	if s := statusOf(t, cli, "node-a"); s != nil {
		t.Errorf("status key %+v still there after the agent stopped", s)
	}
	if l := a.logs.matching(t, "could not release the status lease; it expires by itself", nil); len(l) != 0 {
		t.Errorf("the lease was not revoked through the proxy: %v", l)
	}
}

// TestRunThroughGRPCProxyCompacted: while the agent watches through the proxy, one link is
// cut, etcd changes and its history is compacted past the agent's revision; when the link
// is back the agent's watch is told of the compaction (through the proxy either way), it
// reads etcd again and has exactly what changed.
//
// Cut between the agent and the proxy, the agent sees the link go (not ready) as it would
// with etcd itself. Cut between the proxy and etcd, its own link stays up, and the proxy
// neither answers progress requests (etcd-io/etcd#19710) nor ends watches that asked for a
// leader (it reads that request from the outgoing metadata of an incoming stream, where it
// never is); the agent's liveness probe, a linearizable read, needs etcd's leader, so it
// fails, and the agent is not ready either way. Its status key expires too: the proxy cannot
// keep the lease alive.
func TestRunThroughGRPCProxyCompacted(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (8 s): make test runs it")
	}
	for _, tc := range []struct {
		name string
		// chain starts a proxy and a cuttable link in front of srv, in one order or the
		// other, and returns the agent's endpoint and the link.
		chain func(t *testing.T, srv *etcdtest.Server) (string, *etcdtest.Proxy)
	}{
		{"agent-proxy-link", func(t *testing.T, srv *etcdtest.Server) (string, *etcdtest.Proxy) {
			px := etcdtest.NewGRPCProxy(t, srv.Endpoint())
			link, err := etcdtest.NewProxy(px.Endpoint())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(link.Close)
			return link.Endpoint(), link
		}},
		{"proxy-etcd-link", func(t *testing.T, srv *etcdtest.Server) (string, *etcdtest.Proxy) {
			link, err := etcdtest.NewProxy(srv.Endpoint())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(link.Close)
			return etcdtest.NewGRPCProxy(t, link.Endpoint()).Endpoint(), link
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli, _ := loadedEtcd(t)
			endpoint, link := tc.chain(t, srv)
			a := runAgent(t, endpoint, "--status-ttl", "5s", "--etcd-liveness", "2s")
			first := a.logs.waitFor(t, "in sync with etcd", nil)
			checkHealth(t, a.healthAddr)
			waitStatusKey(t, cli, "ready status", func(s *store.NodeStatus) bool { return s != nil && s.Ready })

			link.Cut()
			// Either way the agent is not ready. Cut behind the proxy, its own link stays up: its
			// liveness probe, a read that needs etcd's leader, is what finds etcd gone.
			body := waitReadyz(t, a.healthAddr, 503, "", 30*time.Second)
			if tc.name == "proxy-etcd-link" {
				if !strings.Contains(body, "lost etcd") {
					t.Errorf("/readyz says %q; want that etcd is lost", body)
				}
				waitStatusKey(t, cli, "status key expiry while the proxy is cut off", func(s *store.NodeStatus) bool { return s == nil })
			}
			ctx := context.Background()
			if _, err := cli.Put(ctx, store.NodePrefix+"node-e", nodeE); err != nil {
				t.Fatal(err)
			}
			last, err := cli.Delete(ctx, store.NodePrefix+"node-b")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Compact(ctx, last.Header.Revision); err != nil {
				t.Fatal(err)
			}
			link.Restore()

			// Exactly what changed, and nothing read again that did not.
			var after []string
			var again map[string]any
			deadline := time.Now().Add(10 * time.Second)
			for again == nil {
				after, again = nil, nil
				syncs := 0
				for _, l := range a.logs.lines(t) {
					switch {
					case l["message"] == "in sync with etcd":
						if syncs++; syncs == 2 {
							again = l
						}
					case l["message"] == "event" && syncs == 1:
						after = append(after, fmt.Sprint(l["event"], " ", l["key"]))
					}
				}
				if again == nil && time.Now().After(deadline) {
					t.Fatal("no second in-sync after the compaction")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if want := []string{"upsert " + store.NodePrefix + "node-e", "delete " + store.NodePrefix + "node-b"}; !reflect.DeepEqual(after, want) {
				t.Errorf("events between the two in-syncs %q; want %q", after, want)
			}
			// node-e came, node-b went: as many of each kind as before.
			if rev, _ := again["revision"].(float64); !reflect.DeepEqual(again["objects"], first["objects"]) || rev < float64(last.Header.Revision) {
				t.Errorf("in sync again with %v at %v; want %v at %d or later", again["objects"], again["revision"], first["objects"], last.Header.Revision)
			}
			if v := metric(t, a.healthAddr, `sluice_etcd_resyncs_total{cause="compacted"}`); v != "1" {
				t.Errorf("resyncs for compaction %s; want 1", v)
			}
			retry := a.logs.waitFor(t, "etcd unavailable; reading again with backoff", nil)
			if !strings.Contains(retry["error"].(string), "watch revision compacted") {
				t.Errorf("retry line %v; want the compaction as the cause", retry)
			}
			checkHealth(t, a.healthAddr)
			waitStatusKey(t, cli, "ready status at the compacted revision", func(s *store.NodeStatus) bool {
				return s != nil && s.Ready && s.Revision >= last.Header.Revision
			})
		})
	}
}
