package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/bpf/healthcheck"
)

// serviceStage runs the eBPF service stage beside the rest of the agent, so that whatever the
// stage cannot do, routes, VXLAN, outgoing NAT and blackholes are programmed all the same. It
// starts the stage, and while the kernel refuses it (too old, a verifier refusal, no bpffs, a
// map that cannot be created) tries again with backoff: a module loaded or a mount made
// later brings services up without a restart. Until then, and whenever the running stage
// cannot attach its programs, it says why: one log line per new reason, the metric
// sluice_services_ready, /readyz, the status key, and a 503 on the proxy health port, so load
// balancers steer away from node ports that are dead.
//
// Hazard: the stage may start long after calc's first update; it must then be handed calc's
// whole desired state (planner.attachServices), not only the updates that follow.
type serviceStage struct {
	cfg    bpf.StageConfig
	log    zerolog.Logger
	health *healthcheck.Servers
	plan   *planner
	stage  atomic.Pointer[bpf.Stage]
	// retryMin and retryMax bound the backoff between start attempts.
	retryMin, retryMax time.Duration

	mu sync.Mutex
	// step is why the stage is not running ("" when it runs): the StartError's step, and
	// reason its message.
	step, reason string
	attempts     int
}

// The reasons sluice_services_ready carries while the stage is not ready.
const (
	reasonStarting = "starting"
	reasonDegraded = "degraded" // started, but an apply could not do the whole job (Stage.Status)
)

func newServiceStage(cfg bpf.StageConfig, plan *planner, log zerolog.Logger) *serviceStage {
	s := &serviceStage{cfg: cfg, log: log, plan: plan, health: healthcheck.New(), retryMin: time.Second, retryMax: time.Minute,
		step: reasonStarting, reason: "starting the service stage"}
	// Unhealthy until the stage has attached its programs: node ports do not work before.
	s.health.SetHealthy(false)
	s.cfg.Health = s.health
	return s
}

// running returns the stage once it has started (nil before, or with services off).
func (s *serviceStage) running() *bpf.Stage {
	if s == nil {
		return nil
	}
	return s.stage.Load()
}

// status says whether the service stage does its whole job, and when not, the reason's
// short name (for the metric's label) and why.
func (s *serviceStage) status() (ok bool, step, why string) {
	if st := s.running(); st != nil {
		if ok, why := st.Status(); !ok {
			return false, reasonDegraded, why
		}
		return true, "", ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return false, s.step, s.reason
}

// start makes one attempt at starting the stage: started, it is handed the desired state
// and kept; refused, the reason is kept, and logged when it is new (retry says when the next
// attempt comes). run makes the first attempt at once, beside the routes (never before
// them): a stage that starts after the first full update is handed the state as it is.
func (s *serviceStage) start(retry time.Duration) bool {
	st, err := bpf.StartStage(s.cfg)
	if err == nil {
		s.mu.Lock()
		s.step, s.reason = "", ""
		attempts := s.attempts
		s.mu.Unlock()
		s.stage.Store(st)
		s.plan.attachServices(st)
		ev := s.log.Info().Str("attach", string(st.Mode()))
		if attempts > 0 {
			ev = ev.Int("failed_attempts", attempts)
		}
		ev.Msg("service stage started")
		return true
	}
	step := "load"
	var se *bpf.StartError
	if errors.As(err, &se) {
		step = se.Step
	}
	s.mu.Lock()
	s.attempts++
	changed := s.reason != err.Error()
	s.step, s.reason = step, err.Error()
	s.mu.Unlock()
	if changed {
		// Once per reason: a kernel that refuses the programs refuses them every time.
		s.log.Error().Err(err).Str("step", step).Dur("retry_in", retry).
			Msg("the service stage cannot start: routes are programmed, services are not (node ports, cluster IPs); retrying with backoff")
	}
	return false
}

// run starts the stage unless it has started, with backoff until it starts, then runs it
// until ctx ends. It returns when everything it started has stopped; a stage that never
// started leaves nothing behind.
func (s *serviceStage) run(ctx context.Context) {
	backoff := s.retryMin
	for s.running() == nil {
		s.mu.Lock()
		tried := s.attempts > 0
		s.mu.Unlock()
		if tried {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, s.retryMax)
		}
		s.start(backoff)
	}
	st := s.running()
	st.Run(ctx)
	st.Close()
}

// readyCollector is sluice_services_ready: 1 with no label when the service stage does its
// whole job, else 0 with the reason's short name in the label reason (starting, attach-mode,
// bpffs, load, attach, degraded). One series at a time.
//
// It is unchecked (Describe sends nothing): the registry refuses two Descs of one name with
// different labels, and the series has a label only while the stage is not ready.
type readyCollector struct {
	status        func() (ok bool, step, why string)
	ready, reason *prometheus.Desc
}

func newReadyCollector(s *serviceStage) *readyCollector {
	return &readyCollector{status: s.status,
		ready:  prometheus.NewDesc("sluice_services_ready", servicesReadyHelp, nil, nil),
		reason: prometheus.NewDesc("sluice_services_ready", servicesReadyHelp, []string{"reason"}, nil)}
}

const servicesReadyHelp = "1 when the eBPF service stage runs and has attached its programs, else 0 with the reason: starting, attach-mode (the kernel lacks what option bpf-attach asks), bpffs, load (the kernel refused a map or program), attach, degraded (started, but programs or socket hooks could not be attached; /readyz says why)."

func (c *readyCollector) Describe(chan<- *prometheus.Desc) {}

func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	if ok, step, _ := c.status(); !ok {
		ch <- prometheus.MustNewConstMetric(c.reason, prometheus.GaugeValue, 0, step)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, 1)
}
