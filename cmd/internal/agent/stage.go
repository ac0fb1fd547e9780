package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/bpf/healthcheck"
)

// ServiceStage runs the eBPF service stage beside the rest of the agent, so that whatever the
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
type ServiceStage struct {
	cfg    bpf.StageConfig
	log    zerolog.Logger
	health *healthcheck.Servers
	plan   *Planner
	stage  atomic.Pointer[bpf.Stage]
	// RetryMin and RetryMax bound the backoff between start attempts (1 s and a minute).
	RetryMin, RetryMax time.Duration

	mu sync.Mutex
	// step is why the stage is not running ("" when it runs): the StartError's step, and
	// reason its message.
	step, reason string
	attempts     int
}

// The reasons the stage is not ready that are not a StartError's step (sluice_services_ready
// carries them).
const (
	ReasonStarting = "starting"
	ReasonDegraded = "degraded" // started, but an apply could not do the whole job (Stage.Status)
)

// NewServiceStage returns the supervisor of a stage of cfg, handed its state by plan.
func NewServiceStage(cfg bpf.StageConfig, plan *Planner, log zerolog.Logger) *ServiceStage {
	s := &ServiceStage{cfg: cfg, log: log, plan: plan, health: healthcheck.New(), RetryMin: time.Second, RetryMax: time.Minute,
		step: ReasonStarting, reason: "starting the service stage"}
	// Unhealthy until the stage has attached its programs: node ports do not work before.
	s.health.SetHealthy(false)
	s.cfg.Health = s.health
	return s
}

// Running returns the stage once it has started (nil before, or with services off).
func (s *ServiceStage) Running() *bpf.Stage {
	if s == nil {
		return nil
	}
	return s.stage.Load()
}

// Status says whether the service stage does its whole job, and when not, the reason's
// short name (for the metric's label) and why.
func (s *ServiceStage) Status() (ok bool, step, why string) {
	if st := s.Running(); st != nil {
		if ok, why := st.Status(); !ok {
			return false, ReasonDegraded, why
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
func (s *ServiceStage) start(retry time.Duration) bool {
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

// Run starts the stage unless it has started, with backoff until it starts, then runs it
// until ctx ends. It returns when everything it started has stopped; a stage that never
// started leaves nothing behind.
func (s *ServiceStage) Run(ctx context.Context) {
	backoff := s.RetryMin
	for s.Running() == nil {
		s.mu.Lock()
		tried := s.attempts > 0
		s.mu.Unlock()
		if tried {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, s.RetryMax)
		}
		s.start(backoff)
	}
	st := s.Running()
	st.Run(ctx)
	st.Close()
}

// Attempts is how many times the stage failed to start.
func (s *ServiceStage) Attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts
}

// Health is the health-check servers: the stage's, and the proxy health port's.
func (s *ServiceStage) Health() *healthcheck.Servers { return s.health }

// Sizes are the map sizes the stage is configured with.
func (s *ServiceStage) Sizes() bpf.MapSizes { return s.cfg.Sizes }
