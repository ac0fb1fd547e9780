package main

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/cmd/internal/agent"
	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// restoreKept runs before the intake's first read of etcd: it hands the stages the state kept
// by the last run when etcd still holds what it was computed from (and calc has not got there
// first), reports whether it did, and logs and counts what became of the file. It waits for
// etcd's answer for at most agent.KeptCheckTimeout: an etcd that cannot answer is left to the
// intake.
func restoreKept(ctx context.Context, path string, cli *clientv3.Client, build string, plan *agent.Planner, prefixes []string, state *agentState, log zerolog.Logger) (handed bool) {
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, agent.KeptCheckTimeout)
	defer cancel()
	u, kept, checked, err := agent.RestoreState(rctx, path, cli, build, plan.Graph.Config(), prefixes)
	var nc agent.NotCurrent
	outcome := "restored"
	switch {
	case errors.Is(err, agent.ErrNoKeptState):
		outcome = "missing"
		log.Info().Str("file", path).Msg("no state file: the desired state comes from etcd")
	case errors.As(err, &nc):
		outcome = "not-current"
		log.Info().Str("file", path).Str("why", nc.Error()).Msg("state file not used: the desired state comes from etcd")
	case errors.As(err, new(agent.EtcdUnanswered)):
		outcome = "etcd-unavailable"
		log.Info().Err(err).Str("file", path).Msg("state file not used: etcd could not say whether it is current; the desired state comes from etcd")
	case err != nil:
		outcome = "unreadable"
		log.Warn().Err(err).Str("file", path).Msg("state file unreadable: the desired state comes from etcd")
	case !plan.Restore(u, checked, &state.restored):
		outcome = "not-current"
		log.Info().Str("file", path).Msg("state file not used: calc's own desired state came first")
	default:
		log.Info().Str("file", path).Int64("revision", kept).Int64("checked_at", checked).Int("objects", len(u.Ops)).
			Dur("took", time.Since(start)).Msg("desired state restored: etcd holds the keys it was computed from")
	}
	state.stateFile.WithLabelValues(outcome).Inc()
	return outcome == "restored"
}

// saveKept keeps graph's desired state in path for the next start, with what the intake held
// of etcd; it runs as the agent stops, after the intake has ended (nothing else touches graph
// or the intake).
func saveKept(path, build string, graph *calc.Graph, intake *store.Intake, state *agentState, log zerolog.Logger) {
	held, whole := intake.Held()
	switch {
	case !whole:
		log.Info().Str("file", path).Msg("desired state not saved: the agent stopped before it had read etcd whole (the file of an earlier stop is kept)")
		return
	case !graph.InSync() || graph.SelfMissing():
		log.Info().Str("file", path).Msg("desired state not saved: this node is not in etcd")
		return
	}
	start := time.Now()
	size, err := agent.SaveState(path, build, graph.Config(), held, graph.State())
	if err != nil {
		state.stateFile.WithLabelValues("save-failed").Inc()
		log.Warn().Err(err).Str("file", path).Msg("desired state not saved: the next start reads etcd before it programs anything")
		return
	}
	state.stateFile.WithLabelValues("saved").Inc()
	log.Info().Str("file", path).Int64("revision", agent.HeldRevision(held)).Int64("bytes", size).Dur("took", time.Since(start)).Msg("desired state saved")
}
