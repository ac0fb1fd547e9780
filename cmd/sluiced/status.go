package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// revisionEvery is the least time between status writes that only move revisions.
const revisionEvery = 5 * time.Second

// reportStatus keeps this node's status key in etcd under a lease until ctx ends, then
// revokes the lease so the key goes at once. If the agent dies, the lease expires after ttl
// and etcd removes the key. It rewrites the key when the status changes (at most every
// 500 ms), and grants a new lease whenever the old one is lost.
func reportStatus(ctx context.Context, cli *clientv3.Client, node string, ttl time.Duration, state *agentState, log zerolog.Logger) {
	key := store.StatusPrefix + node
	var lease clientv3.LeaseID
	var last, lastRaw []byte
	var lastWrite time.Time
	applied := int64(0)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if lease == 0 {
			gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			g, err := cli.Grant(gctx, int64(max(ttl/time.Second, 1)))
			cancel()
			if err == nil {
				ka, err := cli.KeepAlive(ctx, g.ID)
				if err == nil {
					lease, last = g.ID, nil
					go func(id clientv3.LeaseID) {
						for range ka { // drained until the lease is lost or ctx ends
						}
					}(g.ID)
				}
			}
		}
		if lease != 0 {
			s := state.status(node, &applied)
			raw, _ := json.Marshal(s)
			// What changed decides how soon to write: readiness, sync, counts or errors at
			// once; revisions alone at most every revisionEvery (every etcd change moves every
			// node's revision: writing each would multiply the cluster's writes by its nodes).
			s.Updated = time.Time{}
			revRaw, _ := json.Marshal(s)
			s.Revision, s.AppliedRevision = 0, 0
			cmpRaw, _ := json.Marshal(s)
			if string(cmpRaw) != string(last) || (string(revRaw) != string(lastRaw) && time.Since(lastWrite) >= revisionEvery) {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := cli.Put(pctx, key, string(raw), clientv3.WithLease(lease))
				cancel()
				if err != nil {
					lease = 0 // lost or expired: grant a new one
				} else {
					last, lastRaw, lastWrite = cmpRaw, revRaw, time.Now()
				}
			}
		}
		select {
		case <-ctx.Done():
			if lease != 0 {
				rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if _, err := cli.Revoke(rctx, lease); err != nil {
					log.Warn().Err(err).Str("key", key).Msg("could not release the status lease; it expires by itself")
				}
				cancel()
			}
			return
		case <-t.C:
		}
	}
}

// status is the node's status now; applied keeps the revision of the last ready moment.
func (a *agentState) status(node string, applied *int64) store.NodeStatus {
	s := store.NodeStatus{Node: node, Updated: time.Now().UTC()}
	if a.intake != nil {
		st := a.intake.Stats()
		s.Revision, s.InSync, s.BadValues = st.Revision.Load(), st.InSync.Load(), st.BadValues.Load()
	}
	s.Ready = a.ready()
	if s.Ready {
		*applied = s.Revision
	}
	s.AppliedRevision = *applied
	if a.dp != nil {
		ds := a.dp.Stats()
		s.RoutesDesired, s.RoutesProgrammed = ds.DesiredRoutes, ds.ProgrammedRoutes
		if ds.LastErr != nil {
			s.LastError = ds.LastErr.Error()
		}
	}
	return s
}
