package main

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/dataplane"
)

// leftover is one object of other software in sluice's way as the agent reports it, whichever
// stage found it: a program on a hook the service stage holds (bpf.Conflict), another
// product's netfilter chains (dataplane.NetfilterLeftover), or a route, device or ip rule
// (dataplane.Leftover). Each stage says it once when it appears and once when it goes.
type leftover struct {
	key                              string // the same across the stage's passes
	kind, what, where, owner, effect string
	breaks, fix                      string
	removable, removed, gone         bool
	err                              error
}

func hookLeftover(c bpf.Conflict) leftover {
	return leftover{key: c.Key(), kind: c.Kind, what: c.What, where: c.Where(), owner: c.Owner, effect: c.Effect(),
		breaks: c.Breaks, fix: c.Fix, removable: c.Removable(), removed: c.Removed, gone: c.Gone, err: c.Err}
}

func netfilterLeftover(n dataplane.NetfilterLeftover) leftover {
	return leftover{key: n.Key(), kind: "netfilter", what: n.String(), where: n.Family + " " + n.Table, owner: n.Owner,
		effect: n.Effect(), breaks: strings.Join(n.Breaks, "; "), fix: n.Fix, removable: n.Removable(),
		removed: n.Removed, gone: n.Gone, err: n.Err}
}

func routeLeftover(l dataplane.Leftover) leftover {
	effect, breaks := "breaking", "sluice's routes"
	if l.Dormant {
		effect, breaks = "dormant", "dormant: it carries nothing of sluice's"
	}
	return leftover{key: l.Key, kind: l.Kind, what: l.What, owner: l.Owner, effect: effect, breaks: breaks, fix: l.Fix,
		removed: l.Removed, gone: l.Gone, err: l.Err}
}

// reportLeftover logs l (found, gone, removed, or not removable), keeps the gauge of those
// present and the removal counter, and the breaking ones that /readyz names.
func (a *agentState) reportLeftover(log zerolog.Logger, l leftover) {
	owner := l.owner
	if owner == "" {
		owner = "unknown"
	}
	ev := func(e *zerolog.Event) *zerolog.Event {
		e = e.Str("kind", l.kind).Str("what", l.what).Str("owner", owner).Str("effect", l.effect)
		if l.where != "" {
			e = e.Str("where", l.where)
		}
		return e.Str("breaks", l.breaks)
	}
	gauge := a.leftoverGauge(l.kind, owner, l.effect)
	switch {
	case l.gone:
		gauge.Dec()
		a.leftoverBreaks.drop(l.key)
		ev(log.Info()).Msg("a leftover of other software is gone")
	case l.removed:
		a.leftoverRemovals.WithLabelValues(l.kind, owner).Inc()
		a.leftoverBreaks.drop(l.key)
		ev(log.Warn()).Msg("removed a leftover of other software")
	default:
		gauge.Inc()
		if l.effect == "breaking" {
			a.leftoverBreaks.add(l.key, fmt.Sprintf("%s (%s): %s", l.what, owner, l.breaks))
		}
		switch {
		case l.err != nil:
			ev(log.Error()).Err(l.err).Str("fix", l.fix).Msg("could not remove a leftover of other software")
		case l.effect == "breaking":
			fix := l.fix
			if l.removable {
				fix += " (or run with --clean-conflicts)"
			}
			ev(log.Warn()).Str("fix", fix).Msg("a leftover of other software breaks sluice's paths")
		default:
			ev(log.Info()).Str("fix", l.fix).Msg("a leftover of other software is present, " + l.effect)
		}
	}
}

// leftoverGauge is the present-leftovers gauge of one kind, owner and effect, whose changes
// also move the status key's counts.
func (a *agentState) leftoverGauge(kind, owner, effect string) leftoverCount {
	c := &a.leftoversDormant
	if effect == "breaking" {
		c = &a.leftoversBreaking
	}
	return leftoverCount{a.leftoversPresent.WithLabelValues(kind, owner, effect), c}
}

type leftoverCount struct {
	g prometheus.Gauge
	n *atomic.Int64
}

func (c leftoverCount) Inc() { c.g.Inc(); c.n.Add(1) }
func (c leftoverCount) Dec() { c.g.Dec(); c.n.Add(-1) }

// breakingLeftovers are the breaking leftovers present, for /readyz: a node whose node ports or
// cluster IPs another product's leftover takes is not ready, whatever sluice programmed.
type breakingLeftovers struct {
	mu  sync.Mutex
	set map[string]string // key: what it is and what it breaks
}

func (b *breakingLeftovers) add(key, says string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.set == nil {
		b.set = map[string]string{}
	}
	b.set[key] = says
}

func (b *breakingLeftovers) drop(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.set, key)
}

// why says what /readyz says while some are present: how many, the first by key, and where to
// read them all; "" when none is.
func (b *breakingLeftovers) why() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.set) == 0 {
		return ""
	}
	keys := make([]string, 0, len(b.set))
	for k := range b.set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	more := ""
	if len(keys) > 1 {
		more = fmt.Sprintf(" and %d more", len(keys)-1)
	}
	return fmt.Sprintf("other software's leftovers break sluice's paths (sluicectl leftovers lists them): %s%s", b.set[keys[0]], more)
}
