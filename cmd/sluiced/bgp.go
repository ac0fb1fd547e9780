package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sluice-net/sluice/bgp"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/cmd/internal/agent"
	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
)

// bgpStage is the BGP speaker as sluiced runs it: its sessions logged once as they come up
// and go down, counted, and shown (metrics, the status key, /bgp for sluicectl bgp).
type bgpStage struct {
	sp    *bgp.Speaker
	log   zerolog.Logger
	flaps prometheus.Counter

	mu sync.Mutex
	up map[netip.Addr]bool
	// synced is set once the speaker has been in sync with its peers (OnSynced).
	synced atomic.Bool
}

// startBGP runs the speaker until ctx ends and hands it calc's updates through plan. A peer
// down is not a reason for /readyz to fail; it shows everywhere else.
//
// With a state file from an earlier run (restarting), the kernel and the peers still hold
// what that run programmed and announced: the first sessions say so (graceful restart's
// restarting and forwarding-state bits).
//
// What the speaker learns counts for the collector's pace as etcd's events do (gc): 20,000
// routes from a route reflector are a bulk change like 20,000 keys.
func startBGP(ctx context.Context, c *agentconfig.Config, plan *agent.Planner, log zerolog.Logger, restarting bool, gc *gcPacer) (*bgpStage, func()) {
	st := &bgpStage{log: log, up: map[netip.Addr]bool{},
		flaps: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_bgp_session_flaps_total",
			Help: "BGP sessions that went down after being established."})}
	var lastErr time.Time
	st.sp = bgp.New(bgp.Config{SecretsDir: c.BGPSecretsDir, Log: slog.New(&zerologHandler{log: log}), Restarting: restarting,
		OnSession: st.heard,
		OnLearned: func(ls []calc.Learned) {
			gc.onEvents(len(ls), time.Now())
			plan.OnLearned(ls)
		},
		OnStale: plan.StaleLearned,
		OnSynced: func() {
			st.synced.Store(true)
			n := plan.SweepLearned()
			log.Info().Int("stale_removed", n).Msg("BGP in sync: every session sent its routes (or its restart time is over)")
		},
		OnApply: func(err error) {
			if err != nil && time.Since(lastErr) > 10*time.Second {
				lastErr = time.Now()
				log.Warn().Err(err).Msg("BGP apply failed; retrying with backoff")
			}
		}})
	plan.BGP = st.sp
	done := make(chan struct{})
	go func() { defer close(done); st.sp.Run(ctx) }()
	return st, func() { <-done }
}

// sweepIfNeverSynced removes the routes kept from the last run after the restart time if the
// speaker has not been in sync by then (it cannot start, say): graceful restart keeps them
// that long and no longer.
func (b *bgpStage) sweepIfNeverSynced(plan *agent.Planner) {
	time.AfterFunc(bgp.DefaultRestartTime, func() {
		if !b.synced.Load() {
			n := plan.SweepLearned()
			b.log.Warn().Int("stale_removed", n).Msg("BGP not in sync within the restart time: the routes kept from the last run are removed")
		}
	})
}

// heard logs a session coming up or going down (not every step of BGP's state machine).
func (b *bgpStage) heard(e bgp.SessionEvent) {
	b.mu.Lock()
	was := b.up[e.Peer]
	b.up[e.Peer] = e.Up
	b.mu.Unlock()
	switch {
	case e.Up && !was:
		b.log.Info().Stringer("peer", e.Peer).Uint32("asn", e.ASN).Msg("BGP session up")
	case !e.Up && was:
		b.flaps.Inc()
		b.log.Warn().Stringer("peer", e.Peer).Uint32("asn", e.ASN).Str("state", e.State).Str("reason", e.Reason).Msg("BGP session down")
	}
}

// sessions lists the speaker's sessions (none while it runs no speaker).
func (b *bgpStage) sessions() []bgp.Session {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := b.sp.Sessions(ctx)
	if err != nil {
		b.log.Debug().Err(err).Msg("listing BGP sessions")
	}
	return s
}

// BGPReport is what /bgp answers: the speaker's sessions and table.
type BGPReport struct {
	Sessions []bgp.Session `json:"sessions"`
	Routes   []bgp.Route   `json:"routes"`
}

func (b *bgpStage) serve(w http.ResponseWriter, _ *http.Request) {
	rib, err := b.sp.RIB()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(BGPReport{Sessions: b.sessions(), Routes: rib})
}

// Describe and Collect make the sessions metrics: sessions by state and prefixes by
// direction, read from the speaker at each scrape.
func (b *bgpStage) Describe(ch chan<- *prometheus.Desc) {
	ch <- bgpSessionsDesc
	ch <- bgpPrefixesDesc
	b.flaps.Describe(ch)
}

var (
	bgpSessionsDesc = prometheus.NewDesc("sluice_bgp_sessions", "BGP sessions by state (established, active, connect, idle, ...).", []string{"state"}, nil)
	bgpPrefixesDesc = prometheus.NewDesc("sluice_bgp_prefixes", "Prefixes over all BGP sessions: received, accepted of those, and advertised.", []string{"direction"}, nil)
	bgpStates       = []string{"idle", "connect", "active", "opensent", "openconfirm", "established"}
)

func (b *bgpStage) Collect(ch chan<- prometheus.Metric) {
	by := map[string]int{}
	var rx, acc, adv uint64
	for _, s := range b.sessions() {
		by[s.State]++
		rx, acc, adv = rx+s.Received, acc+s.Accepted, adv+s.Advertised
	}
	for _, st := range bgpStates {
		ch <- prometheus.MustNewConstMetric(bgpSessionsDesc, prometheus.GaugeValue, float64(by[st]), st)
	}
	ch <- prometheus.MustNewConstMetric(bgpPrefixesDesc, prometheus.GaugeValue, float64(rx), "received")
	ch <- prometheus.MustNewConstMetric(bgpPrefixesDesc, prometheus.GaugeValue, float64(acc), "accepted")
	ch <- prometheus.MustNewConstMetric(bgpPrefixesDesc, prometheus.GaugeValue, float64(adv), "advertised")
	b.flaps.Collect(ch)
}

// zerologHandler passes GoBGP's warnings and errors to sluiced's log (its info and debug
// lines are the speaker's own chatter, left out).
type zerologHandler struct {
	log   zerolog.Logger
	attrs []slog.Attr
}

func (h *zerologHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *zerologHandler) Handle(_ context.Context, r slog.Record) error {
	e := h.log.Warn()
	if r.Level >= slog.LevelError {
		e = h.log.Error()
	}
	e = e.Str("component", "gobgp")
	for _, a := range h.attrs {
		e = e.Str(a.Key, a.Value.String())
	}
	r.Attrs(func(a slog.Attr) bool {
		e = e.Str(a.Key, a.Value.String())
		return true
	})
	e.Msg(r.Message)
	return nil
}

func (h *zerologHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &zerologHandler{log: h.log, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *zerologHandler) WithGroup(string) slog.Handler { return h }
