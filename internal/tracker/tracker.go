// Package tracker holds, for each kind of kernel object a driver owns, what is desired and
// what the kernel holds, and which keys may differ: one diff for routes, nexthop objects,
// neighbours, FDB entries and the service maps' entries. It also turns repeated scans for
// other software's leftovers into reports (Sightings).
//
// A Tracker's key is in one of these states (desired: wanted by calc; actual: held by the
// kernel, as last read or written; dirty: to be compared at the next Pending):
//
//	                   desired
//	        ┌──────────────┴──────────────┐
//	actual == desired        actual != desired or missing
//	(clean once written)     (dirty: Pending calls set)
//
//	        not desired, actual held by the kernel
//	        (dirty: Pending calls del)
//
// How the actual state is held, in three modes:
//   - whole: after a read of the kernel, or on a new tracker, actual is a full copy;
//   - off: once settled (Settle, at the end of an apply), only the keys where the kernel
//     does not hold the desired value are kept, so a settled agent holds each object once;
//   - allDirty: every key counts as dirty without being listed (a cold start, a fresh read):
//     the next Pending walks everything once instead of copying every key into the dirty set.
//
// A key is clean only once the kernel confirmed the write: a failed write leaves it dirty, so
// the next Apply retries it without reading everything again. The callbacks of Pending say
// what they did with each key (Outcome).
package tracker

// Tracker holds the desired and the actual value of each key of one kind of kernel object,
// and which keys may differ.
//
// The actual state is held whole only between a read of the kernel (or a cold start) and
// the next Settle; after that only where it is not the desired state (off). A settled agent
// holds each object once, not twice (BenchmarkDataplane in cmd/sluiced reports the settled
// agent's memory at 20,000 nodes).
type Tracker[K comparable, V any] struct {
	equal   func(a, b V) bool
	desired map[K]V
	// actual is the kernel's whole state while whole is set (after a read, on a fresh
	// tracker); otherwise nil, and the kernel holds the desired value at every key not in off.
	actual map[K]V
	whole  bool
	// off holds, once settled, each key whose kernel value is not the desired one: what the
	// kernel holds there (held false: nothing).
	off   map[K]offValue[V]
	dirty map[K]struct{}
	// allDirty says every key (desired or actual) may differ, without listing them in dirty:
	// a cold start or a fresh read would otherwise copy every key into the dirty set, only to
	// empty it again in the first Pending.
	allDirty bool
	// dirtyPeak is the most keys dirty at once since the set was last replaced.
	dirtyPeak int
}

// offValue is what the kernel holds at a key where it does not hold the desired value.
type offValue[V any] struct {
	have V
	held bool
}

// Outcome is what a Pending callback did with one key: whether the key is clean afterwards
// (Done, Assumed, Skipped) or stays dirty (Failed, Queued, Later).
type Outcome uint8

const (
	// Failed: the write was refused; the key stays dirty and is tried at the next Pending.
	Failed Outcome = iota
	// Queued: handed to a batch the caller writes after Pending; the key stays dirty until
	// the caller records the kernel's answer (SetActual or DeleteActual, then Clean).
	Queued
	// Later: left for another Pending of the same apply (a pass that only deletes, say, to
	// make room first); the key stays dirty.
	Later
	// Done: written and recorded, or nothing to write; the key is clean.
	Done
	// Assumed: handed to a batch the caller writes after Pending; the key is clean now, and
	// the caller marks it dirty again if the write fails (MarkDirty).
	Assumed
	// Skipped: not sluice's to write or delete (another program's object at the key); the
	// key is clean.
	Skipped
)

// Clean says whether the key is clean after the outcome.
func (o Outcome) Clean() bool { return o >= Done }

// New returns an empty tracker comparing values with equal.
func New[K comparable, V any](equal func(a, b V) bool) *Tracker[K, V] {
	return &Tracker[K, V]{equal: equal, desired: map[K]V{}, actual: map[K]V{}, whole: true, dirty: map[K]struct{}{}}
}

// Expect sizes an empty tracker's maps for about n keys.
func (t *Tracker[K, V]) Expect(n int) {
	if len(t.desired) == 0 && len(t.dirty) == 0 {
		t.desired = make(map[K]V, n)
		if !t.allDirty { // an all-dirty tracker lists no key
			t.dirty = make(map[K]struct{}, n)
		}
	}
}

// DirtyLen is how many keys may differ (an upper bound on the writes of the next Pending).
func (t *Tracker[K, V]) DirtyLen() int {
	if t.allDirty {
		return len(t.desired) + t.ActualLen()
	}
	return len(t.dirty)
}

// DirtyAll makes every key, desired or actual, now or set later, be compared at the next
// Pending, at no cost per key: for a tracker about to be filled from scratch.
func (t *Tracker[K, V]) DirtyAll() {
	t.allDirty = true
	clear(t.dirty)
}

// ReserveActual sizes an empty actual map for n keys (about to be written at once): a map
// grown one key at a time to 100,000 copies itself a dozen times.
func (t *Tracker[K, V]) ReserveActual(n int) {
	if t.whole && len(t.actual) == 0 && n > 1024 {
		t.actual = make(map[K]V, n)
	}
}

// SetDesired wants v at k.
func (t *Tracker[K, V]) SetDesired(k K, v V) {
	if t.whole && t.allDirty && t.off == nil {
		// Filling from scratch (or after a read): nothing to record but the value, every
		// key being compared at the next Pending anyway.
		t.desired[k] = v
		return
	}
	old, ok := t.desired[k]
	if ok && t.equal(old, v) {
		return
	}
	t.keepActual(k, old, ok)
	t.desired[k] = v
	t.tidy(k)
	if t.allDirty {
		return
	}
	t.dirty[k] = struct{}{}
	if len(t.dirty) > t.dirtyPeak {
		t.dirtyPeak = len(t.dirty)
	}
}

// DeleteDesired wants nothing at k.
func (t *Tracker[K, V]) DeleteDesired(k K) {
	old, ok := t.desired[k]
	if !ok {
		return
	}
	t.keepActual(k, old, true)
	delete(t.desired, k)
	t.tidy(k)
	if !t.allDirty {
		t.dirty[k] = struct{}{}
	}
}

// Desired returns the desired value at k.
func (t *Tracker[K, V]) Desired(k K) (V, bool) {
	v, ok := t.desired[k]
	return v, ok
}

// keepActual records, before the desired value at k changes from old (held: there was one),
// what the kernel holds at k when that is implied by the desired value alone.
func (t *Tracker[K, V]) keepActual(k K, old V, held bool) {
	if t.whole {
		return
	}
	if _, ok := t.off[k]; !ok {
		t.setOff(k, offValue[V]{have: old, held: held})
	}
}

// tidy forgets what off says of k when the desired state now implies it.
func (t *Tracker[K, V]) tidy(k K) {
	o, ok := t.off[k]
	if !ok {
		return
	}
	if want, wanted := t.desired[k]; wanted == o.held && (!wanted || t.equal(want, o.have)) {
		delete(t.off, k)
	}
}

func (t *Tracker[K, V]) setOff(k K, o offValue[V]) {
	if t.off == nil {
		t.off = map[K]offValue[V]{}
	}
	t.off[k] = o
}

// Actual returns the value the kernel holds at k, as far as the tracker knows.
func (t *Tracker[K, V]) Actual(k K) (V, bool) {
	if t.whole {
		v, ok := t.actual[k]
		return v, ok
	}
	if o, ok := t.off[k]; ok {
		return o.have, o.held
	}
	v, ok := t.desired[k]
	return v, ok
}

// ActualLen is how many keys the kernel holds, as far as the tracker knows.
func (t *Tracker[K, V]) ActualLen() int {
	if t.whole {
		return len(t.actual)
	}
	n := len(t.desired)
	for k, o := range t.off {
		_, wanted := t.desired[k]
		switch {
		case wanted && !o.held:
			n--
		case !wanted && o.held:
			n++
		}
	}
	return n
}

// ReplaceActual records a fresh read of the kernel; every key becomes dirty. It returns the
// drift: how many keys the read finds other than the tracker knew the kernel to hold (what
// was last read or written: a change of the desired state alone is none), counted only when
// the tracker knew (not before its first Pending since a reset or a read).
func (t *Tracker[K, V]) ReplaceActual(actual map[K]V) (drift int) {
	if !t.allDirty {
		drift = t.drift(actual)
	}
	t.actual, t.whole, t.off = actual, true, nil
	t.DirtyAll()
	return drift
}

// Knows says whether the tracker knows what the kernel holds: not between a reset (DirtyAll)
// or a read and the next Pending. ReplaceActual counts drift only then.
func (t *Tracker[K, V]) Knows() bool { return !t.allDirty }

// drift counts the keys where read differs from what the tracker knows the kernel holds:
// changed, added or missing.
func (t *Tracker[K, V]) drift(read map[K]V) int {
	n := 0
	for k, v := range read {
		if have, ok := t.Actual(k); !ok || !t.equal(have, v) {
			n++
		}
	}
	missing := func(k K) {
		if _, ok := read[k]; !ok {
			n++
		}
	}
	if t.whole {
		for k := range t.actual {
			missing(k)
		}
		return n
	}
	for k := range t.desired {
		if o, ok := t.off[k]; !ok || o.held {
			missing(k)
		}
	}
	for k, o := range t.off {
		if _, wanted := t.desired[k]; !wanted && o.held {
			missing(k)
		}
	}
	return n
}

// AdoptDesired records that the kernel now holds exactly the desired state (every key
// written, nothing else there), for a cold start that wrote everything at once: nothing is
// copied. Every key is clean afterwards but those listed.
// The kernel does not hold the keys listed in unwritten (refused, or not tried): they stay
// dirty.
func (t *Tracker[K, V]) AdoptDesired(unwritten ...K) {
	t.actual, t.whole, t.off = nil, false, nil
	t.allDirty = false
	t.dirty = make(map[K]struct{}, len(unwritten))
	t.dirtyPeak = 0
	for _, k := range unwritten {
		if _, ok := t.desired[k]; ok {
			t.setOff(k, offValue[V]{})
			t.dirty[k] = struct{}{}
		}
	}
}

// Settle stops holding the kernel's state where it is the desired state: the whole copy
// kept since a read or a cold start becomes the few keys that differ. Owners call it at the
// end of an apply, once every write of it is recorded; the tracker works the same either way.
func (t *Tracker[K, V]) Settle() {
	if !t.whole {
		if len(t.off) == 0 {
			t.off = nil // a Go map never gives back its buckets; setOff makes a new one
		}
		return
	}
	var off map[K]offValue[V]
	add := func(k K, o offValue[V]) {
		if off == nil {
			off = map[K]offValue[V]{}
		}
		off[k] = o
	}
	for k, want := range t.desired {
		if have, held := t.actual[k]; !held || !t.equal(want, have) {
			add(k, offValue[V]{have: have, held: held})
		}
	}
	t.heldUnwanted(func(k K, have V) { add(k, offValue[V]{have: have, held: true}) })
	t.actual, t.whole, t.off = nil, false, off
}

// SetActual records that the kernel now holds v at k.
func (t *Tracker[K, V]) SetActual(k K, v V) {
	if t.whole {
		t.actual[k] = v
		return
	}
	if want, ok := t.desired[k]; ok && t.equal(want, v) {
		delete(t.off, k)
		return
	}
	t.setOff(k, offValue[V]{have: v, held: true})
}

// DeleteActual records that the kernel holds nothing at k.
func (t *Tracker[K, V]) DeleteActual(k K) {
	if t.whole {
		delete(t.actual, k)
		return
	}
	if _, ok := t.desired[k]; ok {
		t.setOff(k, offValue[V]{})
		return
	}
	delete(t.off, k)
}

// Pending calls set for each dirty key whose desired value the kernel lacks, then del for
// each dirty key the kernel holds but nobody wants (adds before deletes). Each callback's
// Outcome says whether its key is clean afterwards.
func (t *Tracker[K, V]) Pending(set func(k K, want V) Outcome, del func(k K, have V) Outcome) {
	if t.allDirty {
		t.pendingAll(set, del)
		return
	}
	if len(t.dirty) > t.dirtyPeak {
		t.dirtyPeak = len(t.dirty)
	}
	for k := range t.dirty {
		want, wanted := t.desired[k]
		have, held := t.Actual(k)
		switch {
		case wanted && (!held || !t.equal(want, have)):
			if set(k, want).Clean() {
				delete(t.dirty, k)
			}
		case !wanted && held:
			// second pass
		default:
			delete(t.dirty, k)
		}
	}
	for k := range t.dirty {
		have, held := t.Actual(k)
		if _, wanted := t.desired[k]; !wanted && held && del(k, have).Clean() {
			delete(t.dirty, k)
		}
	}
	t.shrinkDirty()
}

// Differences calls want for each dirty key whose desired value the kernel lacks (with what
// the kernel holds there, if anything), then extra for each dirty key the kernel holds but
// nobody wants. It changes nothing: it is how a diff is shown.
func (t *Tracker[K, V]) Differences(want func(k K, want V, have V, held bool), extra func(k K, have V)) {
	differs := func(k K) (V, bool) { // the desired value at k, when the kernel lacks it
		w, wanted := t.desired[k]
		if !wanted {
			return w, false
		}
		have, held := t.Actual(k)
		return w, !held || !t.equal(w, have)
	}
	if t.allDirty {
		for k := range t.desired {
			if w, ok := differs(k); ok {
				have, held := t.Actual(k)
				want(k, w, have, held)
			}
		}
		t.heldUnwanted(extra)
		return
	}
	for k := range t.dirty {
		if w, ok := differs(k); ok {
			have, held := t.Actual(k)
			want(k, w, have, held)
		}
	}
	for k := range t.dirty {
		if _, wanted := t.desired[k]; !wanted {
			if have, held := t.Actual(k); held {
				extra(k, have)
			}
		}
	}
}

// pendingAll is Pending over every key. The keys left dirty are listed only when they are
// few; when most are (a pass that only deletes, or one whose writes all failed), the tracker
// stays all-dirty instead of copying them.
func (t *Tracker[K, V]) pendingAll(set func(k K, want V) Outcome, del func(k K, have V) Outcome) {
	var left []K
	total := 0
	keep := func(k K) {
		total++
		if total <= 1024 {
			left = append(left, k)
		}
	}
	for k, want := range t.desired {
		if have, held := t.Actual(k); (!held || !t.equal(want, have)) && !set(k, want).Clean() {
			keep(k)
		}
	}
	t.heldUnwanted(func(k K, have V) {
		if !del(k, have).Clean() {
			keep(k)
		}
	})
	if total > 1024 && total*2 > len(t.desired)+t.ActualLen() {
		return // most keys still differ: stay all-dirty
	}
	t.allDirty = false
	t.dirty = make(map[K]struct{}, total)
	t.dirtyPeak = 0
	if total <= 1024 {
		for _, k := range left {
			t.dirty[k] = struct{}{}
		}
		return
	}
	// More than 1024 but fewer than half: one more pass lists them.
	for k, want := range t.desired {
		if have, held := t.Actual(k); !held || !t.equal(want, have) {
			t.dirty[k] = struct{}{}
		}
	}
	t.heldUnwanted(func(k K, _ V) { t.dirty[k] = struct{}{} })
}

// heldUnwanted calls f for each key the kernel holds and nobody wants.
func (t *Tracker[K, V]) heldUnwanted(f func(k K, have V)) {
	if t.whole {
		for k, have := range t.actual {
			if _, wanted := t.desired[k]; !wanted {
				f(k, have)
			}
		}
		return
	}
	for k, o := range t.off {
		if _, wanted := t.desired[k]; !wanted && o.held {
			f(k, o.have)
		}
	}
}

// shrinkDirty replaces an emptied dirty set that once held many keys: a Go map never gives
// back its buckets, and ranging over it costs its capacity, so after a cold start every small
// change would walk the buckets of the whole table.
func (t *Tracker[K, V]) shrinkDirty() {
	if len(t.dirty) == 0 && t.dirtyPeak > 1024 { // the peak as Pending began
		t.dirty = map[K]struct{}{}
		t.dirtyPeak = 0
	}
}

// Clean records that k now matches (after a write confirmed out of band of Pending). It is
// a no-op while every key is dirty.
func (t *Tracker[K, V]) Clean(k K) { delete(t.dirty, k) }

// MarkDirty makes k be compared again at the next Pending.
func (t *Tracker[K, V]) MarkDirty(k K) {
	if !t.allDirty {
		t.dirty[k] = struct{}{}
	}
}

// DesiredLen is how many keys are wanted.
func (t *Tracker[K, V]) DesiredLen() int { return len(t.desired) }
