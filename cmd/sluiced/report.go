package main

import (
	"runtime/debug"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/store"
)

// reporter logs what the intake meets: every rejected value once (the intake reports each
// bad version once), and connection trouble as a rate-limited summary instead of a line per
// retry.
type reporter struct {
	log   zerolog.Logger
	every time.Duration
	now   func() time.Time

	mu sync.Mutex
	// Retries since the last summary line, the newest error, and when that line was written.
	pending     int
	lastErr     error
	lastSummary time.Time
}

func newReporter(log zerolog.Logger) *reporter {
	return &reporter{log: log, every: 30 * time.Second, now: time.Now}
}

func (r *reporter) BadValue(err *store.BadValueError) {
	ev := r.log.Warn().Str("key", err.Key).Str("reason", err.Reason)
	if err.Field != "" {
		ev = ev.Str("field", err.Field)
	}
	ev.Msg("skipping invalid value")
}

func (r *reporter) Retry(err error, attempt int, delay time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending++
	r.lastErr = err
	now := r.now()
	// Limited by time alone: a flapping etcd (each list succeeds, each watch then breaks)
	// retries every 100 ms or so with attempt 1 each time.
	if now.Sub(r.lastSummary) < r.every {
		return
	}
	r.log.Warn().Str("error", store.Clip(err.Error(), store.MaxMessage)).Int("retries", r.pending).Int("attempt", attempt).Dur("next_in", delay).
		Msg("etcd unavailable; reading again with backoff")
	r.pending, r.lastSummary = 0, now
}

// Silent logs once that etcd stopped answering: the agent keeps the dataplane as it is and
// reports not ready until etcd answers again.
func (r *reporter) Silent(quiet time.Duration) {
	r.log.Error().Dur("quiet", quiet).Msg("etcd has not answered; not ready until it does (the dataplane stays as it is)")
}

// Heard logs that etcd answers again, with how long it was silent.
func (r *reporter) Heard(outage time.Duration) {
	r.log.Warn().Dur("outage", outage).Msg("etcd answers again; catching up from the last revision")
}

// eventLogger logs in-syncs with the intake's counts, and each event at debug level.
type eventLogger struct {
	log       zerolog.Logger
	state     *agentState
	dataplane bool // with a dataplane, the first apply frees the cold start's garbage
}

// freeColdStart hands the cold start's garbage (pages read, values decoded, the first full
// update) back to the system once it is dead, rather than hold it for minutes, and lowers the
// collector's target (BenchmarkDataplane in cmd/sluiced reports the settled resident memory).
//
// It does so twice: at once, and again a second later, when what the first apply's callers
// still held (the update it applied, the intake's last pages) is dead too. Returned at once
// only, settled RSS varied between runs of the same build; after the second, it does not
// (the runtime's scavenger, which keeps about a tenth more than the collector's target, gives
// back nothing it retained below that).
func freeColdStart(gc *gcPacer) {
	gc.settle()
	debug.FreeOSMemory()
	time.AfterFunc(time.Second, debug.FreeOSMemory)
}

func (e *eventLogger) OnEvents(batch []store.Event) {
	e.state.gc.onEvents(len(batch), time.Now())
	for i := range batch {
		ev := &batch[i]
		if ev.Type != store.EventInSync {
			e.log.Debug().Str("event", ev.Type.String()).Str("kind", ev.Kind.String()).Str("key", ev.Key).Int64("revision", ev.Revision).Msg("event")
			continue
		}
		d := zerolog.Dict()
		for _, k := range store.Kinds {
			d = d.Int(k.Plural(), e.state.intake.Stats().Objects(k))
		}
		e.log.Info().Int64("revision", ev.Revision).Dict("objects", d).Msg("in sync with etcd")
		if !e.dataplane {
			e.state.freeOnce.Do(func() { freeColdStart(e.state.gc) })
		}
	}
}
