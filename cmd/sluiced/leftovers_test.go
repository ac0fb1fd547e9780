package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/bpf/healthcheck"
	"github.com/sluice-net/sluice/dataplane"
)

// TestReportHookLeftover: a program on a hook is logged when it appears (a warning with its
// fix when it breaks a path, information when dormant), when it goes and when it is removed;
// the gauge counts those present by kind, owner and effect, the counter the removals.
func TestReportHookLeftover(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	state := newAgentState()
	value := func(c prometheus.Collector) float64 {
		var m dto.Metric
		if err := c.(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		if m.Gauge != nil {
			return m.Gauge.GetValue()
		}
		return m.Counter.GetValue()
	}
	eth1 := bpf.Hook{Iface: "eth1", Ifindex: 3}
	cil := bpf.Conflict{Hook: eth1, Kind: bpf.KindTCX, What: "tcx program 7 cil_from_netdev", Owner: bpf.OwnerCilium, Breaking: true,
		Breaks: "node ports arriving on eth1", Fix: "bpftool link detach id 9"}
	op := bpf.Conflict{Hook: eth1, Kind: bpf.KindTCX, What: "tcx program 8 op_counter", Breaks: "dormant: ...", Fix: "bpftool link detach id 10"}
	breaking := state.leftoversPresent.WithLabelValues("tcx", "cilium", "breaking")
	dormant := state.leftoversPresent.WithLabelValues("tcx", "unknown", "dormant")
	removed := state.leftoverRemovals.WithLabelValues("tcx", "cilium")

	step := func(cf bpf.Conflict, level string, says []string, b, d, r float64) {
		t.Helper()
		buf.Reset()
		state.reportLeftover(log, hookLeftover(cf))
		line := buf.String()
		if !strings.Contains(line, `"level":"`+level+`"`) {
			t.Errorf("%s: logged %s, want level %s", cf, line, level)
		}
		for _, s := range says {
			if !strings.Contains(line, s) {
				t.Errorf("%s: logged %s, want it to say %q", cf, line, s)
			}
		}
		if value(breaking) != b || value(dormant) != d || value(removed) != r {
			t.Errorf("%s: gauge breaking %v dormant %v, removed %v; want %v %v %v", cf, value(breaking), value(dormant), value(removed), b, d, r)
		}
		// The status key's counts follow the gauge.
		if st := state.status("node-a", new(int64)); st.LeftoversBreaking != int(b) || st.LeftoversDormant != int(d) {
			t.Errorf("%s: status key counts %d breaking, %d dormant; want %v, %v", cf, st.LeftoversBreaking, st.LeftoversDormant, b, d)
		}
		// /readyz names a breaking one while it is there.
		if why := state.leftoverBreaks.why(); (why != "") != (b > 0) || b > 0 && !strings.Contains(why, "cil_from_netdev (cilium): node ports arriving on eth1") {
			t.Errorf("%s: /readyz would say %q with %v breaking", cf, why, b)
		}
	}
	step(cil, "warn", []string{"bpftool link detach id 9 (or run with --clean-conflicts)", `"owner":"cilium"`, "node ports arriving on eth1"}, 1, 0, 0)
	step(op, "info", []string{"present, dormant", `"owner":"unknown"`, "bpftool link detach id 10"}, 1, 1, 0)
	gone := cil
	gone.Gone = true
	step(gone, "info", []string{"is gone"}, 0, 1, 0)
	rm := cil
	rm.Removed = true
	step(rm, "warn", []string{"removed a leftover"}, 0, 1, 1)
	failed := cil
	failed.Err = errors.New("attached without a link")
	step(failed, "error", []string{"could not remove", "attached without a link"}, 1, 1, 1)
}

// TestProxyHealthPortHeld: the proxy health port held by another process (a leftover
// kube-proxy) is not given up on: the agent says who holds it, tries again, and serves once
// the port is free.
func TestProxyHealthPortHeld(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := held.Addr().String()
	var buf syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveProxyHealth(ctx, zerolog.New(&buf), addr, 20*time.Millisecond, healthcheck.New())
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "the holder named", 5*time.Second, func() bool {
		return strings.Contains(buf.String(), fmt.Sprintf("held by process %d (", os.Getpid()))
	})
	if n := strings.Count(buf.String(), "not served yet"); n != 1 {
		t.Errorf("logged %d times while the port stayed held, want once:\n%s", n, buf.String())
	}
	held.Close()
	waitUntil(t, "the proxy health check served once the port is free", 10*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusServiceUnavailable
	})
	if !strings.Contains(buf.String(), "proxy health check served") {
		t.Errorf("no line saying it is served now:\n%s", buf.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger on another goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReportRouteLeftover: a route, device or rule leftover counts in the gauge by kind and
// owner while present, and leaves it when gone; a removal is counted, not kept.
func TestReportRouteLeftover(t *testing.T) {
	var buf bytes.Buffer
	state := newAgentState()
	dev := dataplane.Leftover{Kind: "device", Key: "device vxlan.calico", Owner: "calico", What: "VXLAN device vxlan.calico ...", Fix: "ip link del vxlan.calico"}
	gauge := func() float64 {
		var m dto.Metric
		if err := state.leftoversPresent.WithLabelValues("device", "calico", "breaking").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.Gauge.GetValue()
	}
	state.reportLeftover(zerolog.New(&buf), routeLeftover(dev))
	if gauge() != 1 || state.leftoversBreaking.Load() != 1 || !strings.Contains(buf.String(), "ip link del vxlan.calico") {
		t.Fatalf("found: gauge %v, status %d, log %s", gauge(), state.leftoversBreaking.Load(), buf.String())
	}
	gone := dev
	gone.Gone = true
	state.reportLeftover(zerolog.New(&buf), routeLeftover(gone))
	if gauge() != 0 || state.leftoversBreaking.Load() != 0 || !strings.Contains(buf.String(), "is gone") {
		t.Fatalf("gone: gauge %v, status %d, log %s", gauge(), state.leftoversBreaking.Load(), buf.String())
	}
	removed := dev
	removed.Removed = true
	state.reportLeftover(zerolog.New(&buf), routeLeftover(removed))
	var m dto.Metric
	if err := state.leftoverRemovals.WithLabelValues("device", "calico").Write(&m); err != nil || m.Counter.GetValue() != 1 || gauge() != 0 {
		t.Fatalf("removed: counter %v, gauge %v (%v)", m.Counter.GetValue(), gauge(), err)
	}
}
