package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/cmd/internal/agent"
	"github.com/sluice-net/sluice/cmd/internal/buildinfo"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
)

// agentState is what the health endpoints and metrics read: the intake (with its counts of
// objects) and the dataplane (nil when --dataplane=false).
type agentState struct {
	intake *store.Intake
	// freeOnce hands the cold start's garbage back to the system once: after the first apply
	// with a dataplane (the kernel has had its turn), else at the first in-sync.
	freeOnce sync.Once
	// gc sets the collector's target: settled after the cold start, busy under bulk changes.
	gc *gcPacer
	dp *dataplane.Dataplane
	// problems counts the inputs calc cannot act on (set by the planner); selfMissing is set
	// while this agent's own Node (nodeName) is not in etcd.
	problems    atomic.Int64
	selfMissing atomic.Bool
	nodeName    string
	svc         *agent.ServiceStage // nil with --services=false
	bgp         *bgpStage           // nil without --bgp
	// profiling serves Go's profiles under /debug/pprof/ (option profiling)
	profiling bool
	// restored is the etcd revision at which etcd was found to hold the keys the state kept
	// by the last run was computed from, once the dataplane has been handed that state (0:
	// none). It stands in for the intake's in-sync until the intake's first one, and only
	// while the intake's first read has not failed (an etcd lost straight after the check
	// makes the node not ready, as it would once in sync).
	restored atomic.Int64
	// fromCalc is set once calc's first update has been handed to the stages.
	fromCalc atomic.Bool
	// applied is closed when the dataplane's first apply is done (appliedOnce closes it).
	applied     chan struct{}
	appliedOnce sync.Once
	// stateFile counts what became of the state file, by outcome (restoreKept, saveKept).
	stateFile *prometheus.CounterVec
	// metrics fed by the agent as things happen
	events       *prometheus.CounterVec
	applySeconds prometheus.Histogram
	kernelDelay  prometheus.Histogram
	leftovers    *prometheus.CounterVec
	// leftoversPresent are other software's objects found in sluice's way, present now, by
	// kind (xdp, tcx, tc-filter, cgroup, netfilter), owner and effect; leftoverRemovals those
	// --clean-conflicts removed.
	leftoversPresent *prometheus.GaugeVec
	// leftoversBreaking and leftoversDormant are the gauge's sums by effect, for the status
	// key ("unknown" counts as dormant there).
	leftoversBreaking, leftoversDormant atomic.Int64
	// leftoverBreaks are the breaking ones present, named by /readyz.
	leftoverBreaks   breakingLeftovers
	leftoverRemovals *prometheus.CounterVec
	// service stage
	serviceErrors    prometheus.Counter
	conntrackDeleted prometheus.Counter
}

// stuckIntake is how long one handler call of the intake may last before the agent counts
// as hung: far longer than a whole cold start of 20,000 nodes takes (BenchmarkDataplane in
// cmd/sluiced measures it).
const stuckIntake = 2 * time.Minute

// live is what /livez and the systemd watchdog follow: the apply loops, and an intake not
// stuck in its handler. An agent cut off from etcd is live (restarting it would not help).
func (a *agentState) live() bool {
	st := a.svc.Running()
	return (a.dp == nil || a.dp.Alive(10*time.Second)) && (st == nil || st.Alive(10*time.Second)) && !a.intakeStuck()
}

func (a *agentState) intakeStuck() bool {
	if a.intake == nil {
		return false
	}
	since := a.intake.Stats().HandlerSince.Load()
	return since != 0 && time.Since(time.Unix(0, since)) > stuckIntake
}

func (a *agentState) ready() bool {
	ok, _ := a.readiness()
	return ok
}

// readiness says whether the node is ready and, when not, why: its routes (routesReadiness),
// with services on the service stage, and other software's leftovers that break one of
// sluice's paths. A node whose node ports are dead is not ready, though its routes are
// programmed: whatever watches /readyz must see it.
func (a *agentState) readiness() (bool, string) {
	if ok, why := a.routesReadiness(); !ok {
		return false, why
	}
	if a.svc != nil {
		if ok, _, why := a.svc.Status(); !ok {
			return false, "service stage not working (routes are programmed; node ports and cluster IPs are not): " + why
		}
	}
	if why := a.leftoverBreaks.why(); why != "" {
		return false, why
	}
	return true, ""
}

// routesReadiness says whether the dataplane is programmed from etcd's state and, when not, why.
func (a *agentState) routesReadiness() (bool, string) {
	switch {
	case a.intake == nil:
		return false, "not started"
	case a.intake.Stats().Silent.Load():
		quiet := time.Since(time.Unix(0, a.intake.Stats().LastHeard.Load()))
		return false, fmt.Sprintf("lost etcd: no connection for %s (the dataplane is kept as it was)", quiet.Round(time.Second))
	case !a.synced():
		return false, "not in sync with etcd (reading it, or waiting for it)"
	case a.selfMissing.Load():
		return false, fmt.Sprintf("node %s is not in etcd: nothing to program for it (check the node name, option node-name)", a.nodeName)
	case a.dp != nil && !a.dp.Synced():
		return false, "the dataplane is not programmed yet"
	}
	return true, ""
}

// started is what READY=1 waits for: in sync with etcd and the first full apply done, even
// if some items failed (they are retried; one bad item must not keep systemd restarting us).
func (a *agentState) started() bool {
	if !a.synced() {
		return false
	}
	return a.dp == nil || a.dp.AppliedOnce()
}

// synced reports whether the desired state the agent acts on is etcd's: the intake is in
// sync, or, before its first in-sync, the state kept by the last run was found current.
func (a *agentState) synced() bool {
	_, ok := a.syncedAt()
	return ok
}

// syncedAt is the revision the desired state the agent acts on stands for, and whether it is
// etcd's (synced).
func (a *agentState) syncedAt() (int64, bool) {
	if a.intake == nil {
		return 0, false
	}
	st := a.intake.Stats()
	// Syncs before InSync: the intake sets InSync, then counts the sync, so one of the two
	// answers yes at every moment of its first in-sync.
	syncs := st.Syncs.Load()
	if st.InSync.Load() {
		return st.Revision.Load(), true
	}
	if r := a.restored.Load(); r != 0 && syncs == 0 && st.Retries.Load() == 0 {
		return r, true
	}
	return 0, false
}

func newAgentState() *agentState {
	return &agentState{
		applied: make(chan struct{}),
		gc:      newGCPacer(),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_events_total",
			Help: "Store events delivered, by kind and type."}, []string{"kind", "type"}),
		applySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_dataplane_apply_seconds",
			Help: "Time one dataplane apply took (only applies that changed something or failed).", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		kernelDelay: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_event_to_kernel_seconds",
			Help: "Time from an etcd change reaching sluiced to its effect being in the kernel.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		leftovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_leftovers_total",
			Help: "Other programs' objects met where sluice's go, by kind: route-replaced (a route at a desired route's destination and metric, replaced by sluice's), nexthop-moved (a nexthop object at an ID sluice used; sluice's moves). Leftovers that stay are sluice_leftovers_present."}, []string{"kind"}),
		leftoversPresent: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_leftovers_present",
			Help: "Other software's objects in sluice's way, present now: programs on the hooks sluice holds (xdp, tcx, tc-filter, cgroup), pins (pin), kube-proxy's IPVS state (ipvs), netfilter chains (netfilter), routes, devices and ip rules (route, device, rule), by owner (calico, cilium, flannel, kube-proxy, unknown) and effect (breaking: it breaks one of sluice's paths; dormant: it acts only if sluice's programs go; unknown)."},
			[]string{"kind", "owner", "effect"}),
		leftoverRemovals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_leftovers_removed_total",
			Help: "Other software's objects removed (--clean-conflicts: breaking and recognisably another product's), by kind and owner."},
			[]string{"kind", "owner"}),
		stateFile: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_state_file_total",
			Help: "What became of the state file (option state-file), by outcome: restored, not-current (etcd changed, another build or configuration), etcd-unavailable, missing, unreadable, saved, save-failed."}, []string{"outcome"}),
		serviceErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_service_apply_errors_total",
			Help: "Failed applies of the service stage (maps, program links, health-check servers)."}),
		conntrackDeleted: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_conntrack_deleted_total",
			Help: "Connection-tracking entries deleted by cleanup (expired and still idle when deleted)."}),
	}
}

// OnEvents counts events by kind and type (a store.Handler): summed over the batch first, so
// the labelled counter is looked up once per kind and type, not once per event. In-syncs have
// no kind and are not counted here (sluice_etcd_resyncs_total counts the reads they end).
func (a *agentState) OnEvents(batch []store.Event) {
	type kindType struct {
		kind store.Kind
		typ  store.EventType
	}
	counts := map[kindType]int{}
	for i := range batch {
		counts[kindType{batch[i].Kind, batch[i].Type}]++
	}
	for kt, n := range counts {
		if kt.typ == store.EventInSync {
			continue
		}
		a.events.WithLabelValues(kt.kind.String(), kt.typ.String()).Add(float64(n))
	}
}

// driftHelp is sluice_drift_repairs_total's help, one for every kind.
const driftHelp = "Drift someone made that sluice put back, by kind: route, nexthop (an object deleted, with its routes), neighbour (and FDB entries), nat (sluice's nftables table), bpf-map-entry, bpf-link, bpf-pin."

// registry builds the Prometheus registry: counters fed by the agent, gauges read from the
// intake, index and dataplane when scraped, and the Go runtime's (go_*) and the process's
// (process_*: resident memory, open descriptors, CPU) figures, where a leak shows.
func (a *agentState) registry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r.MustRegister(a.events, a.applySeconds, a.kernelDelay, a.leftovers, a.leftoversPresent, a.leftoverRemovals, a.serviceErrors, a.conntrackDeleted, a.stateFile)
	gauge := func(name, help string, f func() float64) {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	counter := func(name, help string, f func() float64) {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
	}
	st := func() *store.IntakeStats { return a.intake.Stats() }
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	gauge("sluice_etcd_in_sync", "1 when the intake is in sync with etcd, 0 while it reads again or waits for etcd.", func() float64 { return b2f(st().InSync.Load()) })
	gauge("sluice_etcd_revision", "Newest etcd revision delivered.", func() float64 { return float64(st().Revision.Load()) })
	counter("sluice_etcd_bad_values_total", "Values rejected (each bad version once).", func() float64 { return float64(st().BadValues.Load()) })
	counter("sluice_etcd_retries_total", "Failed reads and broken watches.", func() float64 { return float64(st().Retries.Load()) })
	counter("sluice_etcd_silences_total", "Times etcd stopped answering for the liveness time (option etcd-liveness) with the watch open.", func() float64 { return float64(st().Silences.Load()) })
	gauge("sluice_etcd_last_heard_seconds", "Seconds since etcd last answered (or the connection to it was seen ready).", func() float64 {
		return time.Since(time.Unix(0, st().LastHeard.Load())).Seconds()
	})
	counter("sluice_etcd_page_shrinks_total", "Range pages asked for again with half the keys because the answer was larger than one gRPC message.", func() float64 { return float64(st().PageShrinks.Load()) })
	for i, cause := range store.ResyncCauses {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_etcd_resyncs_total",
			Help: "Full reads of etcd after the first, by cause.", ConstLabels: prometheus.Labels{"cause": string(cause)}},
			func() float64 { return float64(st().ResyncsBy[i].Load()) }))
	}
	for _, k := range store.Kinds {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_objects", Help: "Objects read from etcd, by kind.",
			ConstLabels: prometheus.Labels{"kind": k.String()}}, func() float64 { return float64(a.intake.Stats().Objects(k)) }))
	}
	bi := buildinfo.Read()
	r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_build_info", Help: "Always 1: the build, in its labels.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion}}, func() float64 { return 1 }))
	gauge("sluice_problems", "Inputs sluice cannot act on: each is logged once with its key and shown by sluicectl plan under PROBLEMS.", func() float64 { return float64(a.problems.Load()) })
	gauge("sluice_ready", "1 when /readyz answers 200.", func() float64 { return b2f(a.ready()) })
	errorKinds := map[string]func() float64{ // rejected values: sluice_etcd_bad_values_total
		"etcd": func() float64 { return float64(st().Retries.Load() + st().Silences.Load()) },
		"apply": func() float64 {
			if a.dp == nil {
				return 0
			}
			return float64(a.dp.Stats().Failures)
		},
	}
	for kind, f := range errorKinds {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_errors_total",
			Help: "Errors by kind: failed etcd reads or watches and silences, failed dataplane applies.", ConstLabels: prometheus.Labels{"kind": kind}}, f))
	}
	if a.dp != nil {
		ds := func() dataplane.Stats { return a.dp.Stats() }
		counter("sluice_dataplane_applies_total", "Dataplane applies.", func() float64 { return float64(ds().Applies) })
		counter("sluice_dataplane_resyncs_total", "Full reads of the kernel asked for (kernel changes, periodic, failures).", func() float64 { return float64(ds().Resyncs) })
		counter("sluice_dataplane_writes_total", "Kernel changes made.", func() float64 { return float64(ds().Writes) })
		for kind, f := range map[string]func() int{
			"route":     func() int { return ds().RouteRepairs },
			"nexthop":   func() int { return ds().NexthopRepairs },
			"neighbour": func() int { return ds().NeighRepairs },
			"nat":       func() int { return ds().NATRepairs },
		} {
			r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_drift_repairs_total", Help: driftHelp,
				ConstLabels: prometheus.Labels{"kind": kind}}, func() float64 { return float64(f()) }))
		}
		gauge("sluice_routes_desired", "Routes calc wants.", func() float64 { return float64(ds().DesiredRoutes) })
		gauge("sluice_routes_programmed", "Routes sluice knows the kernel holds.", func() float64 { return float64(ds().ProgrammedRoutes) })
		gauge("sluice_nexthops_desired", "Nexthop objects sluice wants (one per remote node and gateway, in the nexthop route layout).", func() float64 { return float64(ds().DesiredNexthops) })
		gauge("sluice_nexthops_programmed", "Nexthop objects sluice knows the kernel holds.", func() float64 { return float64(ds().ProgrammedNexthops) })
	}
	if a.bgp != nil {
		r.MustRegister(a.bgp)
	}
	if a.svc != nil {
		r.MustRegister(newReadyCollector(a.svc))
		a.registerServices(r)
	}
	return r
}

// registerServices adds the service stage's figures: map fill, tracked flows, drops by reason.
// The stage may start after the registry is built (or never): each figure reads it when
// scraped, 0 while it is not running.
func (a *agentState) registerServices(r *prometheus.Registry) {
	of := func(f func(*bpf.Stage) float64) func() float64 {
		return func() float64 {
			if st := a.svc.Running(); st != nil {
				return f(st)
			}
			return 0
		}
	}
	for _, name := range bpf.TableNames {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_bpf_map_entries",
			Help: "Entries sluice knows each service map holds.", ConstLabels: prometheus.Labels{"map": name}},
			of(func(st *bpf.Stage) float64 { return float64(st.Svc.Counts()[name][1]) })))
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_bpf_map_desired_entries",
			Help: "Entries calc wants in each service map.", ConstLabels: prometheus.Labels{"map": name}},
			of(func(st *bpf.Stage) float64 { return float64(st.Svc.Counts()[name][0]) })))
	}
	sizes := a.svc.Sizes()
	for name, m := range map[string]int{"frontends": sizes.Frontends, "backends": sizes.Backends,
		"conntrack": sizes.Conntrack, "affinity": sizes.Affinity} {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_bpf_map_max_entries",
			Help: "Size of each service map (options bpf-map-size-*).", ConstLabels: prometheus.Labels{"map": name}},
			func() float64 { return float64(m) }))
	}
	for kind, f := range map[string]func(bpf.Repairs) int{
		"bpf-map-entry": func(r bpf.Repairs) int { return r.MapEntries },
		"bpf-link":      func(r bpf.Repairs) int { return r.Links },
		"bpf-pin":       func(r bpf.Repairs) int { return r.Pins },
	} {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_drift_repairs_total",
			Help: driftHelp, ConstLabels: prometheus.Labels{"kind": kind}},
			of(func(st *bpf.Stage) float64 { return float64(f(st.Repairs())) })))
	}
	r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_bpf_map_full_total",
		Help: "Service map writes refused because the map was full."}, of(func(st *bpf.Stage) float64 { return float64(st.Svc.Stats().MapFull) })))
	for _, typ := range []string{"forward", "reverse", "tunnel"} {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_conntrack_entries",
			Help: "Connection-tracking entries at the last cleanup, by kind.", ConstLabels: prometheus.Labels{"kind": typ}},
			of(func(st *bpf.Stage) float64 { return float64(st.LastClean().ByType[typ]) })))
	}
	r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_conntrack_forwarded_flows",
		Help: "Live flows forwarded to or from another node at the last cleanup."}, of(func(st *bpf.Stage) float64 { return float64(st.LastClean().Forwards) })))
	for _, name := range bpf.CounterNames {
		metric, label := "sluice_bpf_packets_total", "event"
		if strings.HasPrefix(name, "drop_") || strings.HasPrefix(name, "reject_") {
			metric, label = "sluice_bpf_drops_total", "reason"
		}
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metric,
			Help: "Packets counted by the service programs, by " + label + ".", ConstLabels: prometheus.Labels{label: name}},
			of(func(st *bpf.Stage) float64 {
				c, err := bpf.Counters(st.Objs)
				if err != nil {
					return 0
				}
				return float64(c[name])
			})))
	}
}

// serveHealth serves /livez, /readyz and /metrics on ln until ctx ends.
func (a *agentState) serveHealth(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	answer := func(ok bool, w http.ResponseWriter) {
		if ok {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ok\n"))
	}
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { answer(a.live(), w) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := a.readiness(); !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ok: " + why + "\n"))
			return
		}
		answer(true, w)
	})
	mux.Handle("/metrics", promhttp.HandlerFor(a.registry(), promhttp.HandlerOpts{}))
	if a.bgp != nil {
		mux.HandleFunc("/bgp", a.bgp.serve)
	}
	if a.profiling {
		// Go's profiles, as kube-proxy's enableProfiling: on the health address only.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
