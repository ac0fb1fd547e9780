package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/applyloop"
	"github.com/sluice-net/sluice/internal/tracker"
	"github.com/sluice-net/sluice/store"
)

// DefaultRestartTime is the graceful-restart time a session offers when calc names none
// (calico/node's BIRD offers 120 s).
const DefaultRestartTime = 120 * time.Second

// GoBGP's numbers for the families sluice speaks (its AfiSafiType order).
const (
	ipv4Unicast = 0
	ipv6Unicast = 1
)

// nextHopSets are the neighbour sets of BGPPeer's nextHopMode, each with its export action:
// Self makes this node the next hop of everything it sends the peer, Keep leaves the next hop
// it learned (Auto, the default, is BGP's own rule: kept over iBGP, this node over eBGP).
// GoBGP gives per-peer export policies to route-server clients only: one global policy per
// mode matches the peers in its set.
var nextHopSets = map[string]*api.NexthopAction{
	store.NextHopSelf: {Self: true},
	store.NextHopKeep: {Unchanged: true},
}

func nextHopSetName(mode string) string { return "sluice-next-hop-" + strings.ToLower(mode) }

// noNeighbor holds a set that must match nobody: GoBGP takes an empty neighbour set for
// every neighbour.
const noNeighbor = "0.0.0.0/32"

// addExportPolicies makes the next-hop sets (empty but for noNeighbor), their policies, and
// the export filter, and assigns them, in that order, to what the speaker sends every peer.
// The filter is calico/node's rule that a node is no transit: it sends its own announcements
// (calc's paths) and, a route reflector, what its iBGP peers sent it; never what it learned
// from an eBGP peer (a top-of-rack router's default route, say, to the other router or to
// the mesh).
func addExportPolicies(ctx context.Context, srv *server.BgpServer, reflector bool) error {
	var policies []*api.Policy
	for _, mode := range []string{store.NextHopSelf, store.NextHopKeep} {
		name := nextHopSetName(mode)
		if err := srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
			DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: name, List: []string{noNeighbor}}}); err != nil {
			return fmt.Errorf("the next-hop set %s: %w", name, err)
		}
		p := &api.Policy{Name: name, Statements: []*api.Statement{{Name: name,
			Conditions: &api.Conditions{NeighborSet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: name}},
			Actions:    &api.Actions{Nexthop: nextHopSets[mode]}}}}
		if err := srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: p}); err != nil {
			return fmt.Errorf("the next-hop policy %s: %w", name, err)
		}
		policies = append(policies, &api.Policy{Name: name})
	}
	filter := &api.Policy{Name: "sluice-export", Statements: []*api.Statement{{Name: "sluice-export-own",
		Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
		Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT}}}}
	if reflector {
		filter.Statements = append(filter.Statements, &api.Statement{Name: "sluice-export-reflected",
			Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_INTERNAL},
			Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT}})
	}
	if err := srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: filter}); err != nil {
		return fmt.Errorf("the export filter: %w", err)
	}
	policies = append(policies, &api.Policy{Name: filter.Name})
	return srv.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{Name: "",
		Direction: api.PolicyDirection_POLICY_DIRECTION_EXPORT, Policies: policies, DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT}})
}

// setNextHopMode puts peer a in the set of its mode (Auto: none), out of the others.
func (s *Speaker) setNextHopMode(ctx context.Context, a netip.Addr, mode string) error {
	member := netip.PrefixFrom(a, a.BitLen()).String()
	for m := range nextHopSets {
		set := &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: nextHopSetName(m), List: []string{member}}
		var err error
		if m == mode {
			err = s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: set})
		} else {
			err = s.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: set})
			if notFound(err) || (err != nil && strings.Contains(err.Error(), "not")) {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("next-hop mode %s: %w", mode, err)
		}
	}
	return nil
}

// RestartDeferral bounds how long a restarting speaker holds its paths back waiting for its
// peers' End-of-RIBs (GoBGP's own default is 360 s, a known pitfall).
const RestartDeferral = 30 * time.Second

// multihopTTL is the TTL of sessions to peers that are not directly connected: calico/node
// makes every session `multihop` (BIRD's default of 64 hops).
const multihopTTL = 64

// Config configures a Speaker.
type Config struct {
	// SecretsDir holds the sessions' passwords: a secretKeyRef {name, key} is the file
	// SecretsDir/name/key (a Kubernetes secret mounted as a volume has this layout).
	SecretsDir string
	// Log receives GoBGP's own log (nil: discarded).
	Log *slog.Logger
	// OnSession hears each session's state changes (nil: none).
	OnSession func(SessionEvent)
	// OnApply hears each apply's outcome (nil: none).
	OnApply func(error)
	// OnLearned hears what the speaker learned and withdrew (best paths from peers; a prefix
	// whose best path becomes this node's own counts as withdrawn), from GoBGP's goroutine.
	OnLearned func([]calc.Learned)
	// Restarting says this start follows a run whose routes the kernel still holds (sluiced
	// kept its state): the first speaker's sessions offer graceful restart's restarting and
	// forwarding-state bits, so peers keep this node's routes until it has sent them again,
	// rather than drop them when the session comes back. GoBGP then holds its own paths back
	// until its peers' End-of-RIBs, at most RestartDeferral.
	Restarting bool
	// OnStale is called when the speaker stops (its configuration changed, or this node
	// speaks BGP no more): everything learned so far is stale, kept until OnSynced (nil:
	// none).
	OnStale func()
	// OnSynced is called once per start of the speaker, when every session has sent its
	// End-of-RIB or their restart time is over: what was learned before a restart and not
	// learned again may go.
	OnSynced func()
}

// SessionEvent is a session's change of state.
type SessionEvent struct {
	Peer  netip.Addr
	ASN   uint32
	State string // idle, connect, active, opensent, openconfirm, established
	Up    bool   // established
	// Reason says why a session went down ("" when it came up).
	Reason string
}

// Speaker is the BGP stage: desired state from calc's ops (OnUpdate, cheap, any goroutine),
// made real by Apply (the stage's loop, Run).
type Speaker struct {
	cfg  Config
	kick chan struct{}

	mu sync.Mutex
	// full is set once a whole desired state has come: nothing is started before it.
	full  bool
	want  *calc.BGPSpeaker
	peers *tracker.Tracker[netip.Addr, calc.BGPPeer]
	paths *tracker.Tracker[netip.Prefix, *calc.BGPPath]
	// The keys desired, for a full update to drop those it no longer names.
	peerKeys map[netip.Addr]bool
	pathKeys map[netip.Prefix]bool

	// The running speaker, on the loop's goroutine only.
	srv     *server.BgpServer
	running *calc.BGPSpeaker
	stopW   context.CancelFunc
	// started counts the speakers started: only the first is restarting (Config.Restarting).
	started int

	// What the speaker learned and OnLearned has not taken yet (under learnedMu): GoBGP's
	// watcher only queues (it never waits on the agent), and the delivery goroutine hands
	// over what has queued meanwhile in one call, so 20,000 prefixes arriving are a few
	// calls, not 20,000.
	learnedMu sync.Mutex
	learnedQ  []calc.Learned
	// multipath holds each prefix's multipath set, of the speaker of generation mpGen
	// only.
	multipath   *multipaths
	mpGen       int
	syncQ       bool // OnSynced is due, after what is queued
	staleQ      bool // OnStale is due, before what is queued
	learnedKick chan struct{}

	// End-of-RIB bookkeeping for OnSynced, under syncMu (GoBGP's goroutine and the loop's).
	syncMu sync.Mutex
	// gen numbers the speakers started: events of an earlier one (its watchers, its
	// deadline) are ignored by the next.
	gen int
	eor map[netip.Addr]bool
	// up holds the sessions of speaker gen that are established, as its watcher reported
	// them: counted without asking GoBGP (SessionCounts).
	up       map[netip.Addr]bool
	synced   bool
	deadline *time.Timer
}

// New returns a speaker stage that runs nothing until its first full update.
func New(cfg Config) *Speaker {
	return &Speaker{cfg: cfg, kick: make(chan struct{}, 1), learnedKick: make(chan struct{}, 1),
		peers:    tracker.New[netip.Addr, calc.BGPPeer](func(a, b calc.BGPPeer) bool { return a == b }),
		paths:    tracker.New[netip.Prefix, *calc.BGPPath](sameAnnouncement),
		peerKeys: map[netip.Addr]bool{}, pathKeys: map[netip.Prefix]bool{}}
}

// sameAnnouncement says whether two paths announce the same: prefix and communities (calc's
// reason for a path, a block or a borrowed address, is not on the wire: its change sends
// nothing).
func sameAnnouncement(a, b *calc.BGPPath) bool {
	return a.Prefix == b.Prefix && slices.Equal(a.Communities, b.Communities)
}

// OnUpdate takes calc's BGP ops (the others are not this stage's) and kicks the loop when
// it took any: an update of routes or services alone wakes nothing here.
func (s *Speaker) OnUpdate(u *calc.Update) {
	mine := u.Full
	for _, op := range u.Ops {
		switch op.Kind() {
		case calc.OpBGPSpeaker, calc.OpBGPPeer, calc.OpBGPPath:
			mine = true
		}
	}
	if !mine {
		return
	}
	s.mu.Lock()
	if u.Full {
		s.full = true
		s.want = nil
		wantPeers, wantPaths := map[netip.Addr]bool{}, map[netip.Prefix]bool{}
		for _, op := range u.Ops {
			switch op.Kind() {
			case calc.OpBGPPeer:
				wantPeers[op.BGPPeer.Addr] = true
			case calc.OpBGPPath:
				wantPaths[op.BGPPath.Prefix] = true
			}
		}
		s.dropDesiredBut(wantPeers, wantPaths)
	}
	for _, op := range u.Ops {
		switch op.Kind() {
		case calc.OpBGPSpeaker:
			if op.Remove {
				s.want = nil
			} else {
				sp := *op.BGPSpeaker
				s.want = &sp
			}
		case calc.OpBGPPeer:
			if op.Remove {
				s.peers.DeleteDesired(op.BGPPeer.Addr)
				delete(s.peerKeys, op.BGPPeer.Addr)
			} else {
				s.peers.SetDesired(op.BGPPeer.Addr, *op.BGPPeer)
				s.peerKeys[op.BGPPeer.Addr] = true
			}
		case calc.OpBGPPath:
			if op.Remove {
				s.paths.DeleteDesired(op.BGPPath.Prefix)
				delete(s.pathKeys, op.BGPPath.Prefix)
			} else {
				s.paths.SetDesired(op.BGPPath.Prefix, op.BGPPath)
				s.pathKeys[op.BGPPath.Prefix] = true
			}
		}
	}
	s.mu.Unlock()
	s.Kick()
}

// dropDesiredBut forgets the desired sessions and paths a full update no longer names.
func (s *Speaker) dropDesiredBut(peers map[netip.Addr]bool, paths map[netip.Prefix]bool) {
	for k := range s.peerKeys {
		if !peers[k] {
			s.peers.DeleteDesired(k)
			delete(s.peerKeys, k)
		}
	}
	for k := range s.pathKeys {
		if !paths[k] {
			s.paths.DeleteDesired(k)
			delete(s.pathKeys, k)
		}
	}
}

// Kick asks the loop for an apply.
func (s *Speaker) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run applies until ctx ends. It then leaves without a word to the peers: no Cease is sent
// (GoBGP's StopBgp sends one, and a peer that gets it flushes this node's routes at once);
// the connections close with the process, which peers with graceful restart take for a
// restart, keeping the routes while it comes back.
func (s *Speaker) Run(ctx context.Context) {
	go s.deliverLearned(ctx)
	loop := applyloop.Loop{Kick: s.kick, MinInterval: 10 * time.Millisecond, Apply: func() error {
		err := s.Apply(ctx)
		if s.cfg.OnApply != nil {
			s.cfg.OnApply(err)
		}
		return err
	}}
	loop.Run(ctx)
}

// Apply makes the running speaker match the desired state: the speaker first, then the
// sessions, then the paths. A failed session or path stays dirty and is tried again; the
// others are applied regardless.
func (s *Speaker) Apply(ctx context.Context) error {
	s.mu.Lock()
	if !s.full {
		s.mu.Unlock()
		return nil
	}
	if err := s.applySpeaker(ctx); err != nil {
		s.mu.Unlock()
		return err
	}
	if s.srv == nil {
		s.mu.Unlock()
		return nil
	}
	// What differs is listed under the lock, written to GoBGP without it (OnUpdate, and the
	// planner and intake behind it, never wait on GoBGP), and recorded under it again.
	type peerWork struct {
		a   netip.Addr
		p   calc.BGPPeer
		del bool
		ok  bool
	}
	type pathWork struct {
		p    netip.Prefix
		path *calc.BGPPath
		del  bool
		ok   bool
	}
	var peers []peerWork
	var paths []pathWork
	s.peers.Pending(func(a netip.Addr, p calc.BGPPeer) tracker.Outcome {
		peers = append(peers, peerWork{a: a, p: p})
		return tracker.Queued
	}, func(a netip.Addr, _ calc.BGPPeer) tracker.Outcome {
		peers = append(peers, peerWork{a: a, del: true})
		return tracker.Queued
	})
	s.paths.Pending(func(p netip.Prefix, path *calc.BGPPath) tracker.Outcome {
		paths = append(paths, pathWork{p: p, path: path})
		return tracker.Queued
	}, func(p netip.Prefix, have *calc.BGPPath) tracker.Outcome {
		paths = append(paths, pathWork{p: p, path: have, del: true})
		return tracker.Queued
	})
	noPeers := len(s.peerKeys) == 0
	s.syncMu.Lock()
	gen := s.gen
	s.syncMu.Unlock()
	s.mu.Unlock()

	// s.srv and s.running change only on this goroutine (applySpeaker): read without the lock.
	var errs []error
	for i := range peers {
		w := &peers[i]
		var err error
		if w.del {
			if err = s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: w.a.String()}); notFound(err) {
				err = nil
			}
		} else {
			err = s.setPeer(ctx, w.p)
		}
		if w.ok = err == nil; !w.ok {
			errs = append(errs, fmt.Errorf("peer %s: %w", w.a, err))
		}
	}
	for i := range paths {
		w := &paths[i]
		var err error
		if w.del {
			err = s.deletePath(w.path)
		} else {
			err = s.addPath(w.path)
		}
		if w.ok = err == nil; !w.ok {
			errs = append(errs, fmt.Errorf("path %s: %w", w.p, err))
		}
	}

	s.mu.Lock()
	for _, w := range peers {
		if !w.ok {
			continue // stays dirty: tried again
		}
		if w.del {
			s.peers.DeleteActual(w.a)
		} else {
			s.peers.SetActual(w.a, w.p)
		}
		// Clean unless the desired state moved meanwhile (then the next apply writes it).
		if d, wanted := s.peers.Desired(w.a); (w.del && !wanted) || (!w.del && wanted && d == w.p) {
			s.peers.Clean(w.a)
		}
	}
	for _, w := range paths {
		if !w.ok {
			continue
		}
		if w.del {
			s.paths.DeleteActual(w.p)
		} else {
			s.paths.SetActual(w.p, w.path)
		}
		if d, wanted := s.paths.Desired(w.p); (w.del && !wanted) || (!w.del && wanted && sameAnnouncement(d, w.path)) {
			s.paths.Clean(w.p)
		}
	}
	s.peers.Settle()
	s.paths.Settle()
	s.mu.Unlock()
	if noPeers {
		go s.syncNow(gen) // no session to wait for (OnSynced may call back into OnUpdate)
	}
	return errors.Join(errs...)
}

// notFound: GoBGP has no such peer (it says "not found" or "can't delete a peer configuration").
func notFound(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "not found") || strings.Contains(err.Error(), "can't delete a peer configuration"))
}

// applySpeaker starts, restarts (its AS, router ID or port changed) or stops the speaker.
func (s *Speaker) applySpeaker(ctx context.Context) error {
	if s.running != nil && (s.want == nil || *s.want != *s.running) {
		s.stop()
	}
	if s.want == nil || s.running != nil {
		return nil
	}
	lvl := new(slog.LevelVar)
	log := s.cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := server.NewBgpServer(server.LoggerOption(log, lvl))
	go srv.Serve()
	w := s.want
	// Only the two families sluice speaks: by default GoBGP makes tables for every family it
	// knows (two sets of 2,048 shards each), 10 MB of heap before a single route.
	if err := srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: w.ASN, RouterId: w.RouterID.String(),
		ListenPort: int32(w.ListenPort), Families: []uint32{ipv4Unicast, ipv6Unicast},
		// Equal paths make one multipath route, as BIRD's `merge paths` in calico/node's
		// kernel protocol: the watcher then reports the multipath set's changes.
		UseMultiplePaths: true}}); err != nil {
		srv.Stop()
		return fmt.Errorf("starting the BGP speaker (AS %d, port %d): %w", w.ASN, w.ListenPort, err)
	}
	if err := addExportPolicies(ctx, srv, w.ClusterID.IsValid()); err != nil {
		srv.Stop()
		return err
	}
	s.syncMu.Lock()
	s.gen++
	gen := s.gen
	s.syncMu.Unlock()
	current := func() bool {
		s.syncMu.Lock()
		defer s.syncMu.Unlock()
		return s.gen == gen
	}
	s.learnedMu.Lock()
	s.multipath, s.mpGen = newMultipaths(), gen
	s.learnedMu.Unlock()
	onBest := func(p []*apiutil.Path, _ time.Time) {
		if current() {
			s.onBest(gen, p)
		}
	}
	onEOR := func(p *apiutil.Path, t time.Time) { s.onEOR(gen, p, t) }
	wctx, cancel := context.WithCancel(context.Background())
	if err := srv.WatchEvent(wctx, server.WatchEventMessageCallbacks{OnPeerUpdate: func(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) { s.onPeer(gen, ev) }}, server.WatchPeer()); err != nil {
		cancel()
		srv.Stop()
		return fmt.Errorf("watching the BGP speaker's sessions: %w", err)
	}
	// One watcher for the table and the End-of-RIBs: its events come in the order GoBGP
	// processed them, so a peer's End-of-RIB follows every path it sent before.
	if err := srv.WatchEvent(wctx, server.WatchEventMessageCallbacks{OnBestPath: onBest, OnPathEor: onEOR},
		server.WatchBestPath(true), server.WatchEor(true)); err != nil {
		cancel()
		srv.Stop()
		return fmt.Errorf("watching the BGP speaker's table: %w", err)
	}
	s.syncMu.Lock()
	s.eor, s.synced, s.up = map[netip.Addr]bool{}, false, map[netip.Addr]bool{}
	if s.deadline != nil {
		s.deadline.Stop()
	}
	// The longest restart time any session offers bounds the wait for End-of-RIBs.
	wait := DefaultRestartTime
	for a := range s.peerKeys {
		if p, ok := s.peers.Desired(a); ok {
			wait = max(wait, p.RestartTime)
		}
	}
	s.deadline = time.AfterFunc(wait, func() { s.syncNow(gen) })
	s.syncMu.Unlock()
	s.srv, s.running, s.stopW = srv, w, cancel
	s.started++
	// Everything is to be added again to the new speaker.
	s.peers.ReplaceActual(map[netip.Addr]calc.BGPPeer{})
	s.paths.ReplaceActual(map[netip.Prefix]*calc.BGPPath{})
	return nil
}

// onBest hears the changes of the multipath sets (paths that joined or changed, and paths
// that left) of speaker gen, and queues for calc each prefix touched: the next hops of its
// set, or none when it lost every path or this node's own is the best.
func (s *Speaker) onBest(gen int, paths []*apiutil.Path) {
	s.learnedMu.Lock()
	defer s.learnedMu.Unlock()
	if s.mpGen != gen {
		return
	}
	touched := make([]netip.Prefix, 0, len(paths))
	for _, p := range paths {
		prefix, ok := prefixOf(p.Nlri)
		if !ok {
			continue
		}
		s.multipath.set(prefix, p.PeerAddress, nextHop(p), p.Withdrawal)
		touched = append(touched, prefix)
	}
	if len(touched) == 0 {
		return
	}
	slices.SortFunc(touched, calc.ComparePrefix)
	for _, prefix := range slices.Compact(touched) {
		s.learnedQ = append(s.learnedQ, calc.Learned{Prefix: prefix, NextHops: s.multipath.hops(prefix)})
	}
	select {
	case s.learnedKick <- struct{}{}:
	default:
	}
}

// prefixOf is an IPv4 or IPv6 unicast NLRI's prefix (without printing and parsing it).
func prefixOf(n bgp.NLRI) (netip.Prefix, bool) {
	if p, ok := n.(*bgp.IPAddrPrefix); ok {
		return p.Prefix, true
	}
	p, err := netip.ParsePrefix(n.String())
	return p, err == nil
}

// deliverLearned hands what was learned to OnLearned, all that queued in one call, until ctx
// ends.
func (s *Speaker) deliverLearned(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.learnedKick:
		}
		s.learnedMu.Lock()
		batch, synced, stale := s.learnedQ, s.syncQ, s.staleQ
		s.learnedQ, s.syncQ, s.staleQ = nil, false, false
		s.learnedMu.Unlock()
		if stale && s.cfg.OnStale != nil {
			s.cfg.OnStale()
		}
		if len(batch) > 0 && s.cfg.OnLearned != nil {
			s.cfg.OnLearned(batch)
		}
		if synced && s.cfg.OnSynced != nil {
			s.cfg.OnSynced()
		}
	}
}

// onEOR hears a peer's End-of-RIB; once every desired session has sent one, the speaker is
// in sync.
func (s *Speaker) onEOR(gen int, p *apiutil.Path, _ time.Time) {
	s.syncMu.Lock()
	if s.eor == nil || s.synced || s.gen != gen {
		s.syncMu.Unlock()
		return
	}
	s.eor[p.PeerAddress] = true
	s.syncMu.Unlock()
	s.mu.Lock()
	all := true
	for a := range s.peerKeys {
		if !s.eorFrom(a) {
			all = false
		}
	}
	s.mu.Unlock()
	if all {
		s.syncNow(gen)
	}
}

func (s *Speaker) eorFrom(a netip.Addr) bool {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	return s.eor[a]
}

// syncNow calls OnSynced once per start: for speaker gen, if it is still the current one.
func (s *Speaker) syncNow(gen int) {
	s.syncMu.Lock()
	if s.synced || s.gen != gen {
		s.syncMu.Unlock()
		return
	}
	s.synced = true
	if s.deadline != nil {
		s.deadline.Stop()
	}
	s.syncMu.Unlock()
	// Through the delivery goroutine: after every path learned before it.
	s.learnedMu.Lock()
	s.syncQ = true
	s.learnedMu.Unlock()
	select {
	case s.learnedKick <- struct{}{}:
	default:
	}
}

// stop stops the running speaker (a configuration change: its peers see a Cease). What it
// learned is stale from now: the next speaker's sync removes what its peers do not send
// again, or, with no speaker to come, it goes at once.
func (s *Speaker) stop() {
	if s.stopW != nil {
		s.stopW()
	}
	s.srv.Stop()
	s.srv, s.running, s.stopW = nil, nil, nil
	// What its watchers still hand over is no longer anybody's: a new generation, and no
	// multipath set taken (generations start at 1).
	s.syncMu.Lock()
	s.gen++
	s.syncMu.Unlock()
	s.learnedMu.Lock()
	s.mpGen = 0
	s.staleQ = true
	if s.want == nil {
		s.syncQ = true
	}
	s.learnedMu.Unlock()
	select {
	case s.learnedKick <- struct{}{}:
	default:
	}
}

func (s *Speaker) onPeer(gen int, ev *apiutil.WatchEventMessage_PeerEvent) {
	if ev.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	st := ev.Peer.State
	state := strings.TrimPrefix(strings.ToLower(bgp.FSMState(st.SessionState).String()), "bgp_fsm_")
	e := SessionEvent{Peer: ev.Peer.Conf.NeighborAddress, ASN: ev.Peer.Conf.PeerASN, State: state,
		Up: st.SessionState == bgp.BGP_FSM_ESTABLISHED}
	if !e.Up {
		e.Reason = st.DisconnectReason.String()
	}
	s.syncMu.Lock()
	if s.gen == gen && s.up != nil {
		s.up[e.Peer] = e.Up
	}
	s.syncMu.Unlock()
	if s.cfg.OnSession != nil {
		s.cfg.OnSession(e)
	}
}

// SessionCounts says how many sessions the running speaker has configured and how many of
// them are established, from what its watcher reported: unlike Sessions, it asks GoBGP
// nothing (whose listing counts every table and holds up its loop), so the status key can
// ask twice a second while 20,000 routes arrive. (It waits only, and rarely, while a speaker
// starts or stops.)
func (s *Speaker) SessionCounts() (configured, up int) {
	s.mu.Lock()
	running := s.srv != nil
	peers := make([]netip.Addr, 0, len(s.peerKeys))
	for a := range s.peerKeys {
		peers = append(peers, a)
	}
	s.mu.Unlock()
	if !running {
		return 0, 0
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	for _, a := range peers {
		if s.up[a] {
			up++
		}
	}
	return len(peers), up
}

// password reads a session's password from its secret's file.
func (s *Speaker) password(p calc.BGPPeer) (string, error) {
	if p.Password.Name == "" {
		return "", nil
	}
	file := filepath.Join(s.cfg.SecretsDir, p.Password.Name, p.Password.Key)
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("password (secret %s key %s): %w", p.Password.Name, p.Password.Key, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func family(a netip.Addr) (*api.Family, bgp.Family) {
	if a.Is4() {
		return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}, bgp.RF_IPv4_UC
	}
	return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}, bgp.RF_IPv6_UC
}

// restarting says whether sessions made now offer the restarting bits: with
// Config.Restarting, for the first speaker until it is in sync.
func (s *Speaker) restarting() bool {
	if !s.cfg.Restarting || s.started != 1 {
		return false
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	return !s.synced
}

// setPeer adds a session, or replaces one whose settings changed.
func (s *Speaker) setPeer(ctx context.Context, p calc.BGPPeer) error {
	// Settings changed, or an earlier attempt stopped half-way: the session is made anew.
	if err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: p.Addr.String()}); err != nil && !notFound(err) {
		return err
	}
	pw, err := s.password(p)
	if err != nil {
		return err
	}
	fam, _ := family(p.Addr)
	restart := p.RestartTime
	if restart == 0 {
		restart = DefaultRestartTime
	}
	peer := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Addr.String(), PeerAsn: p.ASN, LocalAsn: p.LocalASN, AuthPassword: pw,
			Description: p.Origin},
		Transport: &api.Transport{PassiveMode: p.Passive, RemotePort: uint32(p.Port)},
		Timers:    &api.Timers{Config: &api.TimersConfig{ConnectRetry: 5}},
		GracefulRestart: &api.GracefulRestart{Enabled: true, RestartTime: uint32(restart / time.Second),
			// Only the session's own family is offered, so no family the peer lacks defers
			// the first update (GoBGP waits 360 s for one); a restarting speaker waits for
			// its peers' End-of-RIBs at most RestartDeferral.
			DeferralTime: uint32(RestartDeferral / time.Second), LocalRestarting: s.restarting()},
		AfiSafis: []*api.AfiSafi{{Config: &api.AfiSafiConfig{Family: fam, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}}},
	}
	if p.SourceAddr.IsValid() {
		peer.Transport.LocalAddress = p.SourceAddr.String()
	}
	if p.TTLSecurity != 0 {
		peer.TtlSecurity = &api.TtlSecurity{Enabled: true, TtlMin: uint32(256 - int(p.TTLSecurity))}
	} else if p.ASN != p.LocalASN {
		peer.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: multihopTTL}
	}
	if p.RRClient && s.running.ClusterID.IsValid() {
		peer.RouteReflector = &api.RouteReflector{RouteReflectorClient: true, RouteReflectorClusterId: s.running.ClusterID.String()}
	}
	// Its next-hop mode first: what is sent once the session is up goes through it.
	if err := s.setNextHopMode(ctx, p.Addr, p.NextHop); err != nil {
		return err
	}
	return s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: peer})
}

// pathOf builds the BGP path announcing p: origin IGP, this node's own address as next hop,
// its communities.
func (s *Speaker) pathOf(p *calc.BGPPath) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(p.Prefix)
	if err != nil {
		return nil, err
	}
	_, fam := family(p.Prefix.Addr())
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	if p.Prefix.Addr().Is4() {
		if !s.running.Addr4.IsValid() {
			return nil, fmt.Errorf("this node has no IPv4 address to announce it from (spec.bgp.ipv4Address)")
		}
		nh, err := bgp.NewPathAttributeNextHop(s.running.Addr4)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, nh)
	} else {
		if !s.running.Addr6.IsValid() {
			return nil, fmt.Errorf("this node has no IPv6 address to announce it from (spec.bgp.ipv6Address)")
		}
		mp, err := bgp.NewPathAttributeMpReachNLRI(fam, []bgp.PathNLRI{{NLRI: nlri}}, s.running.Addr6)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, mp)
	}
	var std []uint32
	var large []*bgp.LargeCommunity
	for _, c := range p.Communities {
		if c.Large {
			large = append(large, bgp.NewLargeCommunity(c.A, c.B, c.C))
		} else {
			std = append(std, c.A<<16|c.B)
		}
	}
	if len(std) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(std))
	}
	if len(large) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeLargeCommunities(large))
	}
	return &apiutil.Path{Family: fam, Nlri: nlri, Attrs: attrs}, nil
}

func (s *Speaker) addPath(p *calc.BGPPath) error {
	path, err := s.pathOf(p)
	if err != nil {
		return err
	}
	resp, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{path}})
	if err == nil && len(resp) > 0 && resp[0].Error != nil {
		err = resp[0].Error
	}
	return err
}

func (s *Speaker) deletePath(p *calc.BGPPath) error {
	path, err := s.pathOf(p)
	if err != nil {
		return nil // never announced
	}
	return s.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{path}})
}
