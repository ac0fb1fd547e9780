package agent

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bgp"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
)

// Planner runs the calc graph on the event stream, hands each update to the stages (the
// dataplane, and the service stage once it runs) and logs what the desired dataplane becomes.
// Set its exported fields before the first event; Dataplane before the intake starts.
type Planner struct {
	Graph     *calc.Graph
	Log       zerolog.Logger
	Dataplane *dataplane.Dataplane // nil with --dataplane=false
	BGP       *bgp.Speaker         // nil without --bgp
	// Problems is how many inputs calc cannot act on, for metrics and the status key.
	Problems *atomic.Int64
	// SelfMissing is set while, in sync, this agent's own Node is not in etcd.
	SelfMissing *atomic.Bool
	// FromCalc is set once calc's first update has been handed to the stages.
	FromCalc *atomic.Bool

	// mu orders the two sources of the stages' first update: the state kept by the last run
	// (Restore) and calc's. Once calc's first has been handed over (FromCalc, set under mu,
	// read by anyone), the kept one never is.
	mu sync.Mutex
	// svc is the service stage once it has started (set under mu: it may start at any time),
	// and kept the state restored from the last run, for a stage that starts before calc's
	// first update.
	svc  *bpf.Stage
	kept *calc.Update
}

func (p *Planner) OnEvents(batch []store.Event) {
	// Under mu: a service stage that starts now reads the graph's whole state.
	p.mu.Lock()
	u := p.Graph.OnEvents(batch)
	p.Problems.Store(int64(p.Graph.ProblemCount()))
	p.SelfMissing.Store(p.Graph.SelfMissing())
	if u == nil {
		p.mu.Unlock()
		return
	}
	p.FromCalc.Store(true)
	p.kept = nil
	p.handOver(u)
	p.mu.Unlock()
	for _, pr := range u.Problems {
		p.Log.Warn().Str("key", store.Clip(pr.Key, store.MaxMessage)).Str("reason", store.Clip(pr.Reason, store.MaxMessage)).Msg("cannot act on input")
	}
	var vteps, routes, frontends, health, nets, peers, paths, removes int
	for _, op := range u.Ops {
		switch kind := op.Kind(); {
		case op.Remove:
			removes++
		case kind == calc.OpVTEP:
			vteps++
		case kind == calc.OpRoute:
			routes++
		case kind == calc.OpFrontend:
			frontends++
		case kind == calc.OpHealthCheck:
			health++
		case kind == calc.OpClusterNet:
			nets++
		case kind == calc.OpBGPPeer:
			peers++
		case kind == calc.OpBGPPath:
			paths++
		}
		if e := p.Log.Debug(); e.Enabled() {
			e.Bool("remove", op.Remove).Str("object", op.String()).Msg("desired change")
		}
	}
	msg := "desired state changed"
	if u.Full {
		msg = "desired state computed"
	}
	e := p.Log.Info().Int("vteps", vteps).Int("routes", routes).Int("frontends", frontends).Int("health_checks", health).Int("cluster_nets", nets)
	if p.BGP != nil {
		e = e.Int("bgp_peers", peers).Int("bgp_paths", paths)
	}
	e.Int("removed", removes).Msg(msg)
}

// OnLearned gives calc what the BGP speaker learned and withdrew, and the stages what that
// changed (the routes, once calc's first update has gone).
func (p *Planner) OnLearned(ls []calc.Learned) {
	p.mu.Lock()
	u := p.Graph.OnLearned(ls)
	if u != nil {
		p.handOver(u)
	}
	p.mu.Unlock()
	if e := p.Log.Debug(); e.Enabled() {
		changes := 0
		if u != nil {
			changes = len(u.Ops)
		}
		e.Int("heard", len(ls)).Int("changes", changes).Msg("BGP routes heard")
	}
}

// KeepLearned gives calc the routes BGP had learned before this start (stale until the
// speaker is in sync again); before the intake's first read.
func (p *Planner) KeepLearned(ls []calc.Learned) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if u := p.Graph.KeepLearned(ls); u != nil {
		p.handOver(u)
	}
}

// StaleLearned makes everything BGP learned stale: its speaker stopped.
func (p *Planner) StaleLearned() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Graph.StaleLearned()
}

// SweepLearned drops what BGP had learned before this start and no peer announced again,
// and returns how many routes that removed.
func (p *Planner) SweepLearned() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := p.Graph.SweepLearned()
	if u == nil {
		return 0
	}
	p.handOver(u)
	return len(u.Ops)
}

// Vacant says whether calc knows a for an address of the pools that nothing holds
// (calc.Graph.Vacant): the service stage's cleaner asks it of the endpoints of connections
// whose endpoint left its service.
func (p *Planner) Vacant(a netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.Graph.Vacant(a)
}

// handOver gives u to the stages.
func (p *Planner) handOver(u *calc.Update) {
	if p.Dataplane != nil {
		p.Dataplane.OnUpdate(u)
	}
	if p.BGP != nil {
		p.BGP.OnUpdate(u)
	}
	if p.svc != nil {
		p.svc.OnUpdate(u)
	}
}

// Restore gives the stages u, the desired state kept by the last run and found current at
// revision checked, and records that revision in restored, unless calc's own first update has
// been handed over already. It reports whether it gave it.
func (p *Planner) Restore(u *calc.Update, checked int64, restored *atomic.Int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.FromCalc.Load() {
		return false
	}
	restored.Store(checked) // before the dataplane can have applied it
	p.kept = u
	p.handOver(u)
	return true
}

// attachServices hands a service stage that has just started the whole desired state as it
// stands (calc's, or the state kept by the last run before calc's first update; nothing
// before either), then every update that follows.
func (p *Planner) attachServices(st *bpf.Stage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.FromCalc.Load():
		st.OnUpdate(p.Graph.State().Update())
	case p.kept != nil:
		st.OnUpdate(p.kept)
	}
	p.svc = st
}
