package main

import (
	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

// planner runs the calc graph on the event stream and logs what the desired dataplane
// becomes; the dataplane stage will consume the same updates.
type planner struct {
	graph *calc.Graph
	log   zerolog.Logger
}

func (p *planner) OnEvents(batch []store.Event) {
	u := p.graph.OnEvents(batch)
	if u == nil {
		return
	}
	for _, pr := range u.Problems {
		p.log.Warn().Str("key", pr.Key).Str("reason", pr.Reason).Msg("cannot act on input")
	}
	var vteps, routes, frontends, health, removes int
	for _, op := range u.Ops {
		switch {
		case op.Remove:
			removes++
		case op.VTEP != nil:
			vteps++
		case op.Route != nil:
			routes++
		case op.Frontend != nil:
			frontends++
		case op.HealthCheck != nil:
			health++
		}
		if e := p.log.Debug(); e.Enabled() {
			e.Bool("remove", op.Remove).Str("object", describe(op)).Msg("desired change")
		}
	}
	msg := "desired state changed"
	if u.Full {
		msg = "desired state computed"
	}
	p.log.Info().Int("vteps", vteps).Int("routes", routes).Int("frontends", frontends).Int("health_checks", health).
		Int("removed", removes).Msg(msg)
}

func describe(op calc.Op) string {
	switch {
	case op.VTEP != nil:
		return "vtep " + op.VTEP.String()
	case op.Route != nil:
		return "route " + op.Route.String()
	case op.Frontend != nil:
		return "frontend " + op.Frontend.Key.String() + " " + op.Frontend.Service
	case op.HealthCheck != nil:
		return "health-check " + op.HealthCheck.Service
	}
	return ""
}
