package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// paceEvery is the least time between status writes that only move revisions or counts:
// every etcd change moves every node's revision (and, with routes from workloads, its route
// counts), so writing each at once would multiply the cluster's writes by its nodes.
const paceEvery = 5 * time.Second

// statusLease is one lease the status key is written under, with its keepalive.
type statusLease struct {
	id     clientv3.LeaseID
	cancel context.CancelFunc
	lost   chan struct{} // closed when the keepalive ends: expired, revoked, or etcd gone
}

func grantStatusLease(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (*statusLease, error) {
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	g, err := cli.Grant(gctx, int64(max(ttl/time.Second, 1)))
	cancel()
	if err != nil {
		return nil, err
	}
	kctx, kcancel := context.WithCancel(ctx)
	ka, err := cli.KeepAlive(kctx, g.ID)
	if err != nil {
		kcancel()
		return nil, err
	}
	l := &statusLease{id: g.ID, cancel: kcancel, lost: make(chan struct{})}
	go func() {
		for range ka {
		}
		close(l.lost)
	}()
	return l, nil
}

// drop stops the keepalive and revokes the lease (best effort: it expires by itself anyway).
func (l *statusLease) drop(cli *clientv3.Client) {
	l.cancel()
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = cli.Revoke(rctx, l.id)
}

// reportStatus keeps this node's status key in etcd under a lease until ctx ends, then
// revokes the lease so the key goes at once. If the agent dies, the lease expires after ttl
// and etcd removes the key. A lease lost while the agent lives (etcd unreachable for longer
// than ttl, or revoked) is replaced at once and the key written again. Changes of readiness,
// sync or error are written at once; revisions and counts at most every paceEvery.
func reportStatus(ctx context.Context, cli *clientv3.Client, node string, ttl time.Duration, state *agentState, log zerolog.Logger) {
	key := store.StatusPrefix + node
	// Once per start, without a lease: this node runs an agent (sluicectl status tells a
	// stopped agent from none). Best effort: etcd may be unreachable now; the next start says it.
	if _, err := cli.Put(ctx, store.SeenPrefix+node, time.Now().UTC().Format(time.RFC3339)); err != nil {
		log.Debug().Err(err).Msg("could not record that this node runs an agent")
	}
	var lease *statusLease
	var lastState, lastFull []byte
	var lastWrite time.Time
	applied := int64(0)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if lease == nil {
			if l, err := grantStatusLease(ctx, cli, ttl); err == nil {
				lease, lastState, lastFull = l, nil, nil // a new lease: write the key again
			}
		}
		if lease != nil {
			s := state.status(node, &applied)
			raw, _ := json.Marshal(s)
			s.Updated = time.Time{}
			full, _ := json.Marshal(s)
			s.Revision, s.AppliedRevision, s.RoutesDesired, s.RoutesProgrammed, s.BadValues = 0, 0, 0, 0, 0
			stateOnly, _ := json.Marshal(s)
			if string(stateOnly) != string(lastState) || (string(full) != string(lastFull) && time.Since(lastWrite) >= paceEvery) {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := cli.Put(pctx, key, string(raw), clientv3.WithLease(lease.id))
				cancel()
				if err != nil {
					lease.drop(cli)
					lease = nil // grant a new one next round
				} else {
					lastState, lastFull, lastWrite = stateOnly, full, time.Now()
				}
			}
		}
		var lost chan struct{}
		if lease != nil {
			lost = lease.lost
		}
		select {
		case <-ctx.Done():
			if lease != nil {
				lease.cancel()
				rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if _, err := cli.Revoke(rctx, lease.id); err != nil {
					log.Warn().Err(err).Str("key", key).Msg("could not release the status lease; it expires by itself")
				}
				cancel()
			}
			return
		case <-lost:
			lease.drop(cli)
			lease = nil
		case <-t.C:
		}
	}
}

// status is the node's status now; applied keeps the revision of the last ready moment.
func (a *agentState) status(node string, applied *int64) store.NodeStatus {
	s := store.NodeStatus{Node: node, Updated: time.Now().UTC()}
	if a.intake != nil {
		st := a.intake.Stats()
		s.Revision, s.BadValues = st.Revision.Load(), st.BadValues.Load()
		s.InSync = a.synced() // the intake's, or a kept state found current before its first
	}
	s.Ready = a.ready()
	if ok, _ := a.routesReadiness(); ok {
		// The routes are etcd's at this revision even while the service stage is down.
		*applied, _ = a.syncedAt() // the kept state's revision, before the intake's first in-sync
	}
	if a.svc != nil {
		s.Services = "running"
		if ok, _, why := a.svc.Status(); !ok {
			s.Services = "down: " + why
		}
	}
	if a.bgp != nil {
		s.BGPSessions, s.BGPSessionsUp = a.bgp.sp.SessionCounts()
	}
	s.AppliedRevision = *applied
	s.Problems = int(a.problems.Load())
	s.LeftoversBreaking, s.LeftoversDormant = int(a.leftoversBreaking.Load()), int(a.leftoversDormant.Load())
	if a.dp != nil {
		ds := a.dp.Stats()
		s.RoutesDesired, s.RoutesProgrammed = ds.DesiredRoutes, ds.ProgrammedRoutes
		if ds.LastErr != nil {
			s.LastError = ds.LastErr.Error()
		}
	}
	return s
}
