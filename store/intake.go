package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// Reporter hears about trouble the intake meets. The intake itself never logs: the agent's
// Reporter counts, rate-limits and logs. Calls come from the intake's goroutine.
type Reporter interface {
	// BadValue is called once for each version of a key whose value is rejected.
	BadValue(err *BadValueError)
	// Retry is called for every failed list or broken watch before the intake waits delay
	// and reads again. attempt counts failures since the last success.
	Retry(err error, attempt int, delay time.Duration)
	// Silent is called once when etcd has not answered for quiet (at least the liveness
	// time) although the watch is still open; Heard when it answers again, outage after
	// it was last heard.
	Silent(quiet time.Duration)
	Heard(outage time.Duration)
}

// ResyncCause says why the intake read everything again.
type ResyncCause string

// Causes of a resync after the first read.
const (
	CauseCompacted ResyncCause = "compacted"  // the watch fell behind a compaction
	CauseWatchLost ResyncCause = "watch-lost" // the watch broke (leader lost, cancelled, etcd gone)
	CauseListError ResyncCause = "list-error" // a read failed and was tried again
	// CauseWatchStalled: a watch stayed behind the revision etcd reported for StallAfter
	// (served no more, without a word: seen behind etcd's gRPC proxy).
	CauseWatchStalled ResyncCause = "watch-stalled"
)

// ResyncCauses lists the causes, for metrics.
var ResyncCauses = []ResyncCause{CauseCompacted, CauseWatchLost, CauseListError, CauseWatchStalled}

// IntakeStats are the intake's counters, safe to read from any goroutine.
type IntakeStats struct {
	Events    atomic.Int64 // events delivered
	BadValues atomic.Int64 // values rejected
	Retries   atomic.Int64 // failed lists and broken watches
	Resyncs   atomic.Int64 // full reads after the first
	// ResyncsBy counts the resyncs by cause, in the order of ResyncCauses.
	ResyncsBy [4]atomic.Int64
	Revision  atomic.Int64 // newest revision delivered (or, in the watch, passed over)
	InSync    atomic.Bool  // true between an in-sync and the next failure or silence
	// Syncs counts the full reads delivered with their in-sync, each counted once InSync is
	// set: a consumer that stands in for the intake until its first in-sync sees one or the
	// other, never neither.
	Syncs atomic.Int64
	// Silent is set while etcd has not answered for the liveness time, with the watch open;
	// Silences counts the times it was set; LastHeard is when etcd last answered (Unix ns).
	Silent    atomic.Bool
	Silences  atomic.Int64
	LastHeard atomic.Int64
	// HandlerSince is when the handler call in progress began (Unix ns), 0 outside one: an
	// intake stuck in its handler is seen by how long this has been set.
	HandlerSince atomic.Int64
	// PageShrinks counts pages asked for again with half the keys because the answer was
	// larger than the client takes in one message.
	PageShrinks atomic.Int64
	// objects counts, by kind, the objects delivered and not deleted since: what an agent
	// reports of its view without holding a copy of it (the intake knows every key anyway).
	objects [KindSlots]atomic.Int64
}

// Objects is how many objects of kind k the consumers hold, as delivered so far.
func (s *IntakeStats) Objects(k Kind) int {
	if int(k) >= len(s.objects) {
		return 0
	}
	return int(s.objects[k].Load())
}

// DefaultPageSize is how many keys a range request of the intake asks for unless told.
const DefaultPageSize = 10_000

// IntakeConfig configures an Intake. Client and Handler are required.
type IntakeConfig struct {
	Client   *clientv3.Client
	Handler  Handler
	Reporter Reporter // nil: ignore
	// Prefixes to read; default WatchedPrefixes.
	Prefixes []string
	// PageSize is how many keys one range request returns; default 10,000. etcd's own work
	// per key falls as pages grow (BenchmarkRawRange100k in store measures it at several page
	// sizes). A page too large for one gRPC message (blocks full of allocations) is asked for
	// again with half the keys, and later pages of that read keep the smaller size.
	PageSize int64
	// RequestTimeout bounds each range request of a resync, so a member that lost quorum
	// cannot hold a resync forever; default 15 s.
	RequestTimeout time.Duration
	// Backoff between failed attempts: doubles from MinBackoff to MaxBackoff, jittered.
	// Defaults 100 ms and 10 s.
	MinBackoff, MaxBackoff time.Duration
	// Liveness bounds how long the intake takes to say it is no longer in sync when etcd
	// cannot be reached although the watch is still open: default 10 s, negative: never.
	// A cut link or a dead etcd leaves the watch open (the client resumes it when it
	// reconnects), so the sign is the client's connection: not ready for a quarter of
	// Liveness. An etcd killed breaks it at once; a link cut without a word breaks it when
	// written data goes unacknowledged for the client's keepalive timeout (gRPC sets
	// TCP_USER_TIMEOUT to it, 3 s), or when a keepalive ping goes unanswered (gRPC pings no
	// more often than every 10 s). So when the watch has been quiet for half of Liveness the
	// intake probes etcd: a linearizable read of one absent key, one small request per node
	// per 5 s of quiet (see watch). A progress notification cannot serve as the sign: etcd
	// sends none on a watch until the store moves past the revision it started at, so a quiet
	// cluster would look dead.
	Liveness time.Duration
	// StallAfter is how long a watch may stay behind the revision etcd reports (to the
	// liveness probe, which then runs at least every quarter of it) before the intake takes
	// it for lost and reads everything again; 0: never; it needs Liveness > 0. Each watch asks
	// for etcd's progress notifications, sent to an idle watch every 10 minutes (plus up to a
	// tenth) by default and passed on by the gRPC proxy; etcd skips one after a tick in which
	// the watch had events, and a full stream or a watch not yet synced misses one, so a
	// served watch can be 22 minutes behind and more after a missed tick: the agent's default
	// is an hour. A cluster with no writes at all moves no revision: nothing to catch up, no
	// cost.
	StallAfter time.Duration
}

// DefaultLiveness is the default IntakeConfig.Liveness.
const DefaultLiveness = 10 * time.Second

// Intake lists the watched prefixes at one revision, then watches from the next revision,
// and turns what it reads into typed events. After any failure (compaction, a cancelled
// watch, a lost leader, an unreachable or restarted etcd) it reads everything again and
// emits only what changed meanwhile, then in-sync again.
//
// Hazards that shaped it: a key deleted and re-created while the watch was down looks
// unchanged by name, so it compares mod revisions, not presence; a value that turns bad
// must read as a delete to consumers, or they keep the last good object forever.
type Intake struct {
	cfg   IntakeConfig
	stats IntakeStats
	// known is every key seen under the prefixes, one map per prefix (index in
	// cfg.Prefixes) by the rest of the key, with its state. Only the intake goroutine
	// touches it.
	known []map[string]keyState
	batch []Event
	// seenBuf is deliver's buffer of the revisions the answers of a batch reached.
	seenBuf []spanSeen
	// spans are the watches' ranges (WatchSpans of the prefixes) and spanOf each prefix's
	// span; fixed at NewIntake.
	spans  []Span
	spanOf []int
	// spanAt is, for each span, the revision through which its changes have been delivered
	// (the stalled-watch check follows the same); held says that the consumers hold exactly
	// etcd's keys as of those revisions (false before the first in-sync and while a read
	// delivers its pages, whose deletions come last). Only the intake goroutine touches them.
	spanAt []int64
	held   bool
}

// knownKey is a key as the intake remembers it: which watched prefix it is under, and the
// rest, in a string of its own: a settled agent holds every key, and each would otherwise
// repeat its shared prefix ("/calico/resources/v3/projectcalico.org/nodes/"). BenchmarkDataplane
// in cmd/sluiced reports the settled agent's memory at 20,000 nodes.
type knownKey struct {
	prefix uint8
	rest   string
}

// knownKeyOf returns the known form of key and whether it is under a watched prefix. The
// rest is copied out of key (a key comes in a page of etcd's answer, which must not stay
// alive for it).
func (in *Intake) knownKeyOf(key []byte) (knownKey, bool) {
	for i, p := range in.cfg.Prefixes {
		if bytes.HasPrefix(key, []byte(p)) {
			return knownKey{prefix: uint8(i), rest: string(key[len(p):])}, true
		}
	}
	return knownKey{}, false
}

// full returns the whole key.
func (in *Intake) full(k knownKey) string { return in.cfg.Prefixes[k.prefix] + k.rest }

// keyState is what the intake remembers of a key, in one word: its mod revision, whether its
// value was valid (consumers hold it) and whether the resync under way has seen it. (As three
// fields it took 16 bytes, and a map slot with its key 40: at 20,000 nodes there are 40,000
// to 60,000 keys.) A mod revision is positive and far below 2^62 (one outside that range
// would only compare unequal, its key decoded and emitted again at each resync).
type keyState uint64

func newKeyState(modRev int64, valid bool) keyState {
	s := keyState(modRev)<<2 | keySeen
	if valid {
		s |= keyValid
	}
	return s
}

const (
	keyValid keyState = 1 << iota
	keySeen
)

func (s keyState) modRev() int64 { return int64(s >> 2) }
func (s keyState) valid() bool   { return s&keyValid != 0 }
func (s keyState) seen() bool    { return s&keySeen != 0 }

// knownCount is how many keys the intake knows.
func (in *Intake) knownCount() int {
	n := 0
	for _, m := range in.known {
		n += len(m)
	}
	return n
}

// NewIntake validates cfg and returns an Intake ready to Run.
func NewIntake(cfg IntakeConfig) (*Intake, error) {
	if cfg.Client == nil || cfg.Handler == nil {
		return nil, errors.New("intake needs a client and a handler")
	}
	if len(cfg.Prefixes) == 0 {
		cfg.Prefixes = WatchedPrefixes
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 15 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(10*time.Second, cfg.MinBackoff)
	}
	if cfg.Liveness == 0 {
		cfg.Liveness = DefaultLiveness
	}
	if len(cfg.Prefixes) > 255 {
		return nil, fmt.Errorf("intake watches at most 255 prefixes, not %d", len(cfg.Prefixes))
	}
	known := make([]map[string]keyState, len(cfg.Prefixes))
	for i := range known {
		known[i] = map[string]keyState{}
	}
	in := &Intake{cfg: cfg, known: known, spans: WatchSpans(cfg.Prefixes)}
	in.spanOf = make([]int, len(cfg.Prefixes))
	for i, p := range cfg.Prefixes {
		for s, sp := range in.spans {
			if p >= sp.Start && p < sp.End {
				in.spanOf[i] = s
			}
		}
	}
	in.spanAt = make([]int64, len(in.spans))
	return in, nil
}

// Stats returns the live counters.
func (in *Intake) Stats() *IntakeStats { return &in.stats }

// Run reads and watches until ctx ends; it returns ctx's error.
func (in *Intake) Run(ctx context.Context) error {
	attempt := 0
	first := true
	cause := CauseWatchLost
	for ctx.Err() == nil {
		rev, err := in.resync(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			attempt++
			if !first {
				cause = CauseListError
			}
			in.retry(ctx, fmt.Errorf("reading etcd: %w", err), attempt)
			continue
		}
		if !first {
			in.stats.Resyncs.Add(1)
			in.stats.ResyncsBy[slices.Index(ResyncCauses, cause)].Add(1)
		}
		first = false
		started := time.Now()
		err = in.watch(ctx, rev+1)
		in.stats.InSync.Store(false)
		in.stats.Silent.Store(false)
		if ctx.Err() != nil {
			break
		}
		// Only a watch that stayed up resets the backoff: one that fails straight after
		// every good read (no permission, no leader) must not relist at full speed.
		if time.Since(started) >= stableWatch {
			attempt = 0
		}
		cause = CauseWatchLost
		switch {
		case errors.Is(err, errCompacted):
			cause = CauseCompacted
		case errors.Is(err, errStalled):
			cause = CauseWatchStalled
		}
		attempt++
		in.retry(ctx, err, attempt)
	}
	return ctx.Err()
}

func (in *Intake) retry(ctx context.Context, err error, attempt int) {
	in.stats.Retries.Add(1)
	d := in.cfg.MinBackoff << min(attempt-1, 20)
	d = min(d, in.cfg.MaxBackoff)
	d = d/2 + rand.N(d/2+1) // jitter in [d/2, d]
	if in.cfg.Reporter != nil {
		in.cfg.Reporter.Retry(err, attempt, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// page is one range response of a resync.
type page struct {
	kvs []*mvccpb.KeyValue
	// decoded holds Decode's result for each of kvs when the fetcher decoded them.
	decoded []decoded
	err     error
}

type decoded struct {
	obj Object
	err error
}

// fetch reads every prefix at one revision, page by page, into out, and closes it. The first
// page fixes the revision, stored in *rev before that page is sent. It runs one page ahead of
// the decoder, so fetching and decoding overlap while at most three pages are alive.
//
// With decode set it also decodes every value, so that on a first read (when every key is
// new) decoding runs beside the consumers instead of before them.
func (in *Intake) fetch(ctx context.Context, out chan<- page, rev *int64, decode bool) {
	defer close(out)
	send := func(p page) bool {
		select {
		case out <- p:
			return true
		case <-ctx.Done():
			return false
		}
	}
	limit := in.cfg.PageSize
	for _, prefix := range in.cfg.Prefixes {
		start, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
		for {
			opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(limit)}
			if *rev != 0 {
				opts = append(opts, clientv3.WithRev(*rev))
			}
			rctx, cancel := context.WithTimeout(ctx, in.cfg.RequestTimeout)
			resp, err := in.cfg.Client.Get(rctx, start, opts...)
			cancel()
			if tooLarge(err) && limit > 1 {
				// The page was larger than the client takes in one message (blocks full of
				// allocations are tens of kilobytes each): ask again for half as many keys.
				limit = max(1, limit/2)
				in.stats.PageShrinks.Add(1)
				continue
			}
			if err != nil {
				send(page{err: err})
				return
			}
			if *rev == 0 {
				*rev = resp.Header.Revision
			}
			p := page{kvs: resp.Kvs}
			if decode {
				p.decoded = make([]decoded, len(resp.Kvs))
				for i, kv := range resp.Kvs {
					p.decoded[i].obj, p.decoded[i].err = Decode(string(kv.Key), kv.Value)
				}
			}
			if !send(p) {
				return
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
}

// tooLarge reports whether a range failed because its answer was larger than the client
// takes in one message (and not, say, because a proxy limited the rate).
func tooLarge(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "larger than max")
}

// resync reads every prefix at one revision, emits what differs from what consumers already
// hold, sweeps keys that vanished, and emits in-sync.
func (in *Intake) resync(ctx context.Context) (int64, error) {
	in.held = false // the consumers' view is a mix of two reads until the in-sync
	// Nothing seen yet by this read.
	for _, m := range in.known {
		for k, st := range m {
			m[k] = st &^ keySeen
		}
	}
	var rev int64
	fctx, cancel := context.WithCancel(ctx)
	pages := make(chan page, 1)
	cold := in.knownCount() == 0 // every key is new: decoded by the fetcher, each an event
	go in.fetch(fctx, pages, &rev, cold)
	defer func() {
		cancel()
		for range pages { // let the fetcher finish before returning
		}
	}()
	for p := range pages {
		if p.err != nil {
			return 0, p.err
		}
		if cold {
			in.batch = slices.Grow(in.batch, len(p.kvs)) // grown once a page, not doubled ten times
		}
		for i, kv := range p.kvs {
			var d *decoded
			if p.decoded != nil {
				d = &p.decoded[i]
			}
			k, ok := in.knownKeyOf(kv.Key)
			if !ok {
				continue // under a prefix's range but not the prefix (never, as read)
			}
			in.observe(k, kv.Value, kv.ModRevision, d)
		}
		in.flush()
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	// Sweep: keys consumers hold that the read did not find.
	var gone []knownKey
	for i, m := range in.known {
		for rest, st := range m {
			if !st.seen() {
				if st.valid() {
					gone = append(gone, knownKey{prefix: uint8(i), rest: rest})
				}
				delete(m, rest)
			}
		}
	}
	slices.SortFunc(gone, func(a, b knownKey) int { // in key order
		return cmp.Or(strings.Compare(in.cfg.Prefixes[a.prefix], in.cfg.Prefixes[b.prefix]), strings.Compare(a.rest, b.rest))
	})
	for _, key := range gone {
		in.emitDelete(key, rev)
	}
	in.batch = append(in.batch, Event{Type: EventInSync, Revision: rev})
	in.flush()
	for i := range in.spanAt {
		in.spanAt[i] = rev
	}
	in.held = true
	in.stats.InSync.Store(true)
	in.stats.Syncs.Add(1)
	return rev, nil
}

// observe handles one key's current value: new or changed versions are decoded (or taken
// from d, when the fetcher decoded them already) and emitted, unchanged ones only marked as
// seen.
func (in *Intake) observe(kk knownKey, value []byte, modRev int64, d *decoded) {
	known := in.known[kk.prefix]
	st, had := known[kk.rest]
	if had && st.modRev() == modRev {
		known[kk.rest] = st | keySeen
		return
	}
	key := in.full(kk)
	var obj Object
	var err error
	if d != nil {
		obj, err = d.obj, d.err
	} else {
		obj, err = Decode(key, value)
	}
	if err != nil {
		var bv *BadValueError
		if !errors.As(err, &bv) {
			bv = newBadValue(key, "", err.Error())
		}
		in.stats.BadValues.Add(1)
		if in.cfg.Reporter != nil {
			in.cfg.Reporter.BadValue(bv)
		}
		if had && st.valid() {
			in.emitDelete(kk, modRev)
		}
		known[kk.rest] = newKeyState(modRev, false)
		return
	}
	known[kk.rest] = newKeyState(modRev, true)
	if !had || !st.valid() {
		in.stats.objects[obj.Kind()].Add(1)
	}
	in.batch = append(in.batch, Event{Type: EventUpsert, Kind: obj.Kind(), ID: obj.ID(), Key: key, Revision: modRev, Object: obj, Value: value})
}

func (in *Intake) emitDelete(kk knownKey, rev int64) {
	key := in.full(kk)
	kind, id, err := ParseKey(key)
	if err != nil {
		return // never valid, so never emitted
	}
	in.stats.objects[kind].Add(-1)
	in.batch = append(in.batch, Event{Type: EventDelete, Kind: kind, ID: id, Key: key, Revision: rev})
}

func (in *Intake) flush() {
	if len(in.batch) == 0 {
		return
	}
	for _, ev := range in.batch {
		if ev.Revision > in.stats.Revision.Load() {
			in.stats.Revision.Store(ev.Revision)
		}
	}
	in.stats.Events.Add(int64(len(in.batch)))
	in.stats.HandlerSince.Store(time.Now().UnixNano())
	in.cfg.Handler.OnEvents(in.batch)
	in.stats.HandlerSince.Store(0)
	if cap(in.batch) > 4096 {
		in.batch = nil // a cold start's batch: not kept for the small ones after it
		return
	}
	clear(in.batch)
	in.batch = in.batch[:0]
}

// stableWatch is how long a watch must stay up before a failure counts as a new first one.
const stableWatch = 10 * time.Second

// Span is a range of keys [Start, End) one watch follows.
type Span struct{ Start, End string }

// WatchSpans are the ranges the intake watches for prefixes, in the order of their roots'
// first prefixes: one per first path segment ("/calico/", "/sluice/"), from the least of its
// prefixes to the end of the greatest.
func WatchSpans(prefixes []string) []Span {
	var spans []Span
	at := map[string]int{} // root: index in spans
	for _, p := range prefixes {
		root := p
		if i := strings.IndexByte(p[1:], '/'); i >= 0 {
			root = p[:i+2]
		}
		end := clientv3.GetPrefixRangeEnd(p)
		if i, ok := at[root]; ok {
			spans[i] = Span{min(spans[i].Start, p), max(spans[i].End, end)}
			continue
		}
		at[root] = len(spans)
		spans = append(spans, Span{p, end})
	}
	return spans
}

// errCompacted marks a watch that fell behind a compaction.
var errCompacted = errors.New("watch revision compacted")

// errStalled marks a watch that stayed behind etcd's revision for StallAfter.
var errStalled = errors.New("watch stalled")

// watch follows the prefixes from rev until a watch fails or ctx ends. Prefixes that share a
// first path segment ("/calico/", "/sluice/") are followed by one watch over the range that
// spans them, so events within each arrive in revision order; keys in a range outside the
// prefixes (IPAM handles, other Calico resources) are skipped. Keeping the ranges per root
// keeps another application's keys in a shared etcd out of the stream.
func (in *Intake) watch(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	w := in.openWatches(wctx, rev, done)
	l := in.newLiveness(ctx, wctx)
	defer l.stop()
	var got []spanResponse
	var lastDelivered time.Time
	holdTimer := time.NewTimer(time.Hour)
	holdTimer.Stop()
	for {
		var resp clientv3.WatchResponse
		var from int // which watch answered: its index in spans
		var ch <-chan clientv3.WatchResponse
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.closed:
			return errors.New("watch lost: the watch channel closed")
		case now := <-l.tick:
			if err := l.onTick(now); err != nil {
				return err
			}
			continue
		case o := <-w.opened:
			w.direct[o.span] = o.ch
			continue
		case r := <-w.merged:
			resp, from = r.WatchResponse, r.span
		case r, ok := <-w.direct[0]:
			if !ok {
				return errors.New("watch lost: the watch channel closed")
			}
			resp, from, ch = r, 0, w.direct[0]
		case r, ok := <-w.direct[1]: // nil (never ready) when there is one root
			if !ok {
				return errors.New("watch lost: the watch channel closed")
			}
			resp, from, ch = r, 1, w.direct[1]
		}
		// The answers the same watch has ready behind this one go to the consumers with it, in
		// one batch: while writes come faster than they are handled (a bulk apply), each batch
		// costs the consumers once, not once per answer (BenchmarkServicesArriving in
		// cmd/sluiced).
		// The client hands its buffered answers over one at a time, from a goroutine of its
		// own: one that finds none ready yields once for it before the batch is closed. While
		// answers keep coming (this one came within busyWithin of the last delivery), the batch
		// is held open for batchHold: a bulk apply's writes then reach the consumers a few
		// milliseconds' worth at a time, not one each (a service and its slice, written one
		// after the other, computed and programmed once), which took a third of sluiced's CPU
		// off such a write. An answer after a quiet spell is delivered at once.
		got = append(got[:0], spanResponse{resp, from})
		var hold <-chan time.Time
		if ch != nil && time.Since(lastDelivered) < busyWithin {
			holdTimer.Reset(batchHold)
			hold = holdTimer.C
		}
		for more, yielded := true, false; more && ch != nil && len(got) < maxAnswersBatched; {
			if hold != nil {
				select {
				case r, ok := <-ch:
					if more = ok; ok {
						got = append(got, spanResponse{r, from})
					}
				case <-hold:
					more, hold = false, nil
				}
				continue
			}
			select {
			case r, ok := <-ch:
				if more = ok; ok {
					got = append(got, spanResponse{r, from})
					yielded = false
				}
			default:
				more = !yielded
				yielded = true
				if more {
					runtime.Gosched()
				}
			}
		}
		holdTimer.Stop() // no stale tick after Stop (Go 1.23 timers)
		for _, r := range got {
			// Heard again: in sync once more, unless this answer ends the watch (a compaction
			// while cut off), and then the resync says when.
			l.onResponse(r.Err() == nil && r.CompactRevision == 0 && !r.Canceled)
		}
		err := in.deliver(got, rev, l.stall)
		lastDelivered = time.Now()
		clear(got)
		if err != nil {
			return err
		}
	}
}

// busyWithin and batchHold: an answer that comes within busyWithin of the last delivery
// holds its batch open for batchHold. 50 ms, not 5: while 10,000 services arrive, sluiced's
// CPU over the write went from 2.4-2.6x a bare watcher's to 2.0-2.1x
// (BenchmarkServicesArriving), each change waiting at most 50 ms more under such a load
// (kube-proxy's own minimum between syncs is a second); a change after a quiet spell is
// delivered at once (BenchmarkServiceEndpointChange p50 1.9 ms).
const (
	busyWithin = 5 * time.Millisecond
	batchHold  = 50 * time.Millisecond
)

// maxAnswersBatched bounds the watch answers delivered in one batch.
const maxAnswersBatched = 256

// watches are the intake's open watches, one per span.
type watches struct {
	// direct are the first two watches (sluice reads two roots, /calico/ and /sluice/), read
	// directly by the loop once opened; any further one comes through a goroutine into
	// merged. A goroutine between each watch and the loop would be one more hand-off, and one
	// more thread woken, per change (BenchmarkDataplane in cmd/sluiced measures the CPU per
	// change).
	direct [2]clientv3.WatchChan
	opened chan openedWatch
	merged chan spanResponse
	closed chan struct{} // a merged watch ended
}

type openedWatch struct {
	span int
	ch   clientv3.WatchChan
}

type spanResponse struct {
	clientv3.WatchResponse
	span int // index in spans
}

// openWatches opens a watch per span from rev, each beside the loop: the client hands a watch
// over only once etcd has confirmed it, and a link that goes silent before then would hold
// the loop, liveness check included, until it came back (the agent ready all along).
func (in *Intake) openWatches(wctx context.Context, rev int64, done <-chan struct{}) *watches {
	w := &watches{opened: make(chan openedWatch, len(in.spans)), merged: make(chan spanResponse), closed: make(chan struct{}, len(in.spans))}
	for i, sp := range in.spans {
		go func() {
			wch := in.cfg.Client.Watch(wctx, sp.Start, clientv3.WithRange(sp.End), clientv3.WithRev(rev), clientv3.WithProgressNotify())
			if i < len(w.direct) {
				w.opened <- openedWatch{i, wch}
				return
			}
			for resp := range wch {
				select {
				case w.merged <- spanResponse{resp, i}:
				case <-done:
					return
				}
			}
			w.closed <- struct{}{} // the watch is over, whatever the reason
		}()
	}
	return w
}

// liveness tells a lost etcd while the watch stays open. A response, or the connection seen
// ready while the last probe succeeded, is etcd heard; otherwise, a quarter of the liveness
// time later, silence: not in sync until etcd answers again. The watch stays open: the client
// resumes it from its revision as soon as it reconnects. The probe, written when the watch is
// quiet for half the liveness time, is a linearizable read of one absent key: it is a write on
// the connection (a link cut without a word then ends it through TCP_USER_TIMEOUT), and it
// needs a leader with a quorum, so it fails when etcd is lost behind a gRPC proxy (whose own
// connection stays ready) or has lost its quorum. (A watch progress request would do the
// first only, and a proxy refuses it, logging an error each time: etcd-io/etcd#19710.) The
// probe's revision also feeds the stalled-watch check.
type liveness struct {
	in        *Intake
	ctx, wctx context.Context
	live      time.Duration
	tick      <-chan time.Time // nil: liveness off
	ticker    *time.Ticker
	heard     time.Time // etcd last heard
	lastData  time.Time // the watch's last response
	probed    time.Time // the last probe sent
	silent    bool
	probing   atomic.Bool
	failed    atomic.Bool  // the last probe failed
	probeRev  atomic.Int64 // the last probe's revision of etcd, not yet looked at
	stall     *stallCheck  // each watch's newest revision against the newest one probed
}

func (in *Intake) newLiveness(ctx, wctx context.Context) *liveness {
	now := time.Now()
	l := &liveness{in: in, ctx: ctx, wctx: wctx, live: in.cfg.Liveness, heard: now, lastData: now, probed: now,
		stall: newStallCheck(in.cfg.StallAfter, in.spanAt)} // each from the read's revision, rev-1
	if l.live > 0 {
		l.ticker = time.NewTicker(max(l.live/20, 10*time.Millisecond))
		l.tick = l.ticker.C
	}
	in.stats.LastHeard.Store(now.UnixNano())
	return l
}

func (l *liveness) stop() {
	if l.ticker != nil {
		l.ticker.Stop()
	}
}

// onTick probes etcd when due, checks for a stalled watch (its error ends the watch), and
// says whether etcd is heard or silent.
func (l *liveness) onTick(now time.Time) error {
	in, live := l.in, l.live
	due := now.Sub(l.lastData) >= live/2 && now.Sub(l.probed) >= live/2
	due = due || l.stall.after > 0 && now.Sub(l.probed) >= l.stall.after/4 // a busy watch too
	if due && l.probing.CompareAndSwap(false, true) {
		l.probed = now
		go l.probe()
	}
	if r := l.probeRev.Swap(0); r != 0 {
		l.stall.etcdAt(r, now)
	}
	if i, ok := l.stall.stalled(now); ok {
		w := l.stall.watches[i]
		return fmt.Errorf("%w: the watch of %s… delivered up to revision %d, etcd was at %d %v ago",
			errStalled, in.spans[i].Start, l.stall.at[i], w.target, now.Sub(w.since).Round(time.Second))
	}
	if in.connected() && !l.failed.Load() {
		last := l.heard
		l.heard = now
		in.stats.LastHeard.Store(now.UnixNano())
		if l.silent {
			l.heardAgain(last, true)
		}
		return nil
	}
	if quiet := now.Sub(l.heard); quiet >= live/4 && !l.silent {
		l.silent = true
		in.stats.InSync.Store(false)
		in.stats.Silent.Store(true)
		in.stats.Silences.Add(1)
		if in.cfg.Reporter != nil {
			in.cfg.Reporter.Silent(quiet)
		}
	}
	return nil
}

// probe reads one absent key's count (linearizable) within a quarter of the liveness time.
func (l *liveness) probe() {
	defer l.probing.Store(false)
	pctx, cancel := context.WithTimeout(l.wctx, l.live/4)
	defer cancel()
	resp, err := l.in.cfg.Client.Get(pctx, l.in.cfg.Prefixes[0], clientv3.WithCountOnly())
	l.failed.Store(err != nil && l.ctx.Err() == nil)
	if err == nil {
		l.probeRev.Store(resp.Header.Revision)
	}
}

// onResponse records a watch response as etcd heard; ok says whether it leaves the watch
// going (in sync once more, when it was silent).
func (l *liveness) onResponse(ok bool) {
	last := l.heard
	l.heard = time.Now()
	l.lastData = l.heard
	l.in.stats.LastHeard.Store(l.heard.UnixNano())
	// A response after a failed probe is etcd heard: a probe that timed out while the watch
	// was busy (the stalled-watch check probes then too) is not silence.
	l.failed.Store(false)
	if l.silent {
		l.heardAgain(last, ok)
	}
}

func (l *liveness) heardAgain(last time.Time, ok bool) {
	l.silent = false
	l.in.stats.Silent.Store(false)
	if ok {
		l.in.stats.InSync.Store(true)
	}
	if l.in.cfg.Reporter != nil {
		l.in.cfg.Reporter.Heard(l.heard.Sub(last))
	}
}

// deliver hands the events of watch answers to the consumers in one batch and moves each
// watch's revision on; an answer that ends the watch (compacted, cancelled, failed) returns
// its error once the answers before it are delivered.
func (in *Intake) deliver(got []spanResponse, rev int64, stall *stallCheck) error {
	var err error
	seen := in.seenBuf[:0]
	for _, r := range got {
		s, e := in.take(r.WatchResponse, rev)
		if e != nil {
			err = e // what came before it is delivered all the same
			break
		}
		seen = append(seen, spanSeen{r.span, s})
	}
	in.flush()
	for _, s := range seen {
		stall.delivered(s.span, s.rev) // moves in.spanAt[s.span] on
		if s.rev > in.stats.Revision.Load() {
			in.stats.Revision.Store(s.rev)
		}
	}
	in.seenBuf = seen[:0]
	return err
}

// spanSeen is the newest revision one watch answer delivered, and its watch.
type spanSeen struct {
	span int
	rev  int64
}

// take queues the events of one watch answer for the consumers and returns the newest
// revision it delivers.
func (in *Intake) take(resp clientv3.WatchResponse, rev int64) (int64, error) {
	if resp.CompactRevision != 0 {
		return 0, fmt.Errorf("%w: watch at %d, compacted to %d", errCompacted, rev, resp.CompactRevision)
	}
	if err := resp.Err(); err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return 0, fmt.Errorf("%w: %v", errCompacted, err)
		}
		return 0, fmt.Errorf("watch lost: %w", err)
	}
	if resp.Canceled {
		return 0, errors.New("watch lost: cancelled by the server")
	}
	seen := int64(0)
	for _, ev := range resp.Events {
		seen = max(seen, ev.Kv.ModRevision)
		key, ok := in.knownKeyOf(ev.Kv.Key)
		if !ok {
			continue
		}
		switch ev.Type {
		case clientv3.EventTypePut:
			in.observe(key, ev.Kv.Value, ev.Kv.ModRevision, nil)
		case clientv3.EventTypeDelete:
			if st, had := in.known[key.prefix][key.rest]; had {
				delete(in.known[key.prefix], key.rest)
				if st.valid() {
					in.emitDelete(key, ev.Kv.ModRevision)
				}
			}
		}
	}
	// A skipped key (another node's affinity, say) still moves the stream on: the consumers
	// hold etcd as of that revision, as far as the prefixes go. So does a progress
	// notification: every event up to its revision has been delivered.
	if resp.IsProgressNotify() {
		seen = max(seen, resp.Header.Revision)
	}
	return seen, nil
}

// stallCheck finds a watch etcd no longer serves though it stays open: behind the revision
// the probe saw etcd at for longer than after. Each watch is followed by the newest revision
// it delivered (an event's, or a progress notification's).
type stallCheck struct {
	after   time.Duration // 0: never stalled
	at      []int64       // each watch's newest revision delivered: the intake's spanAt
	watches []watchProgress
}

type watchProgress struct {
	target int64     // a revision of etcd's not reached yet (0: none)
	since  time.Time // when the probe saw etcd at target
}

// newStallCheck follows the watches whose newest revisions delivered are at (each the
// revision of the read before them, at first), and moves them on.
func newStallCheck(after time.Duration, at []int64) *stallCheck {
	return &stallCheck{after: after, at: at, watches: make([]watchProgress, len(at))}
}

// delivered records that watch i delivered everything up to rev.
func (c *stallCheck) delivered(i int, rev int64) {
	c.at[i] = max(c.at[i], rev)
	if w := &c.watches[i]; w.target != 0 && c.at[i] >= w.target {
		w.target = 0
	}
}

// etcdAt records that etcd was at rev when probed at now: each watch behind it must reach it
// (a watch already behind an older revision keeps that one, and its time).
func (c *stallCheck) etcdAt(rev int64, now time.Time) {
	for i := range c.watches {
		if w := &c.watches[i]; c.at[i] < rev && w.target == 0 {
			w.target, w.since = rev, now
		}
	}
}

// stalled returns a watch that has stayed behind for longer than after.
func (c *stallCheck) stalled(now time.Time) (int, bool) {
	if c.after <= 0 {
		return 0, false
	}
	for i, w := range c.watches {
		if w.target != 0 && now.Sub(w.since) >= c.after {
			return i, true
		}
	}
	return 0, false
}

// connected reports whether the client's connection to etcd is ready.
func (in *Intake) connected() bool {
	conn := in.cfg.Client.ActiveConnection()
	return conn != nil && conn.GetState() == connectivity.Ready
}
