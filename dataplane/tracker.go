package dataplane

import "maps"

// Tracker holds the desired and the actual (as last read or written) value of each key of
// one kind of kernel object, and which keys may differ. It is the one diff used for every
// kind: routes now; neighbours, FDB entries and map entries next.
//
// Hazard: a key is clean only once the kernel confirmed the write; a failed write leaves it
// dirty, so the next Apply retries it without rereading everything.
type Tracker[K comparable, V any] struct {
	equal   func(a, b V) bool
	desired map[K]V
	actual  map[K]V
	dirty   map[K]struct{}
	// allDirty says every key (desired or actual) may differ, without listing them in dirty:
	// a cold start or a fresh read would otherwise copy every key into the dirty set, only to
	// empty it again in the first Pending.
	allDirty bool
	// dirtyPeak is the most keys dirty at once since the set was last replaced.
	dirtyPeak int
}

// NewTracker returns an empty tracker comparing values with equal.
func NewTracker[K comparable, V any](equal func(a, b V) bool) *Tracker[K, V] {
	return &Tracker[K, V]{equal: equal, desired: map[K]V{}, actual: map[K]V{}, dirty: map[K]struct{}{}}
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
		return len(t.desired) + len(t.actual)
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
	if len(t.actual) == 0 && n > 1024 {
		t.actual = make(map[K]V, n)
	}
}

// SetDesired wants v at k.
func (t *Tracker[K, V]) SetDesired(k K, v V) {
	if old, ok := t.desired[k]; ok && t.equal(old, v) {
		return
	}
	t.desired[k] = v
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
	if _, ok := t.desired[k]; !ok {
		return
	}
	delete(t.desired, k)
	if !t.allDirty {
		t.dirty[k] = struct{}{}
	}
}

// Desired returns the desired value at k.
func (t *Tracker[K, V]) Desired(k K) (V, bool) {
	v, ok := t.desired[k]
	return v, ok
}

// Actual returns the value the kernel holds at k, as far as the tracker knows.
func (t *Tracker[K, V]) Actual(k K) (V, bool) {
	v, ok := t.actual[k]
	return v, ok
}

// ActualLen is how many keys the kernel holds, as far as the tracker knows.
func (t *Tracker[K, V]) ActualLen() int { return len(t.actual) }

// ReplaceActual records a fresh read of the kernel; every key becomes dirty.
func (t *Tracker[K, V]) ReplaceActual(actual map[K]V) {
	t.actual = actual
	t.DirtyAll()
}

// AdoptDesired records that the kernel now holds exactly the desired state (every key
// written, nothing else there): one copy of the desired map instead of a SetActual per key,
// for a cold start that wrote everything at once. Every key is clean afterwards.
func (t *Tracker[K, V]) AdoptDesired() {
	t.actual = maps.Clone(t.desired)
	t.allDirty = false
	t.dirty = map[K]struct{}{}
	t.dirtyPeak = 0
}

// SetActual records that the kernel now holds v at k.
func (t *Tracker[K, V]) SetActual(k K, v V) { t.actual[k] = v }

// DeleteActual records that the kernel holds nothing at k.
func (t *Tracker[K, V]) DeleteActual(k K) { delete(t.actual, k) }

// Pending calls set for each dirty key whose desired value the kernel lacks, then del for
// each dirty key the kernel holds but nobody wants (adds before deletes). Keys whose callback
// returns true are clean afterwards; the rest stay dirty.
func (t *Tracker[K, V]) Pending(set func(k K, want V) bool, del func(k K, have V) bool) {
	if t.allDirty {
		t.pendingAll(set, del)
		return
	}
	if len(t.dirty) > t.dirtyPeak {
		t.dirtyPeak = len(t.dirty)
	}
	for k := range t.dirty {
		want, wanted := t.desired[k]
		have, held := t.actual[k]
		switch {
		case wanted && (!held || !t.equal(want, have)):
			if set(k, want) {
				delete(t.dirty, k)
			}
		case !wanted && held:
			// second pass
		default:
			delete(t.dirty, k)
		}
	}
	for k := range t.dirty {
		have, held := t.actual[k]
		if _, wanted := t.desired[k]; !wanted && held && del(k, have) {
			delete(t.dirty, k)
		}
	}
	t.shrinkDirty()
}

// pendingAll is Pending over every key. The keys left dirty are listed only when they are
// few; when most are (a pass that only deletes, or one whose writes all failed), the tracker
// stays all-dirty instead of copying them.
func (t *Tracker[K, V]) pendingAll(set func(k K, want V) bool, del func(k K, have V) bool) {
	var left []K
	total := 0
	keep := func(k K) {
		total++
		if total <= 1024 {
			left = append(left, k)
		}
	}
	for k, want := range t.desired {
		if have, held := t.actual[k]; (!held || !t.equal(want, have)) && !set(k, want) {
			keep(k)
		}
	}
	for k, have := range t.actual {
		if _, wanted := t.desired[k]; !wanted && !del(k, have) {
			keep(k)
		}
	}
	if total > 1024 && total*2 > len(t.desired)+len(t.actual) {
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
		if have, held := t.actual[k]; !held || !t.equal(want, have) {
			t.dirty[k] = struct{}{}
		}
	}
	for k := range t.actual {
		if _, wanted := t.desired[k]; !wanted {
			t.dirty[k] = struct{}{}
		}
	}
}

// shrinkDirty replaces an emptied dirty set that once held many keys: a Go map never gives
// back its buckets, and ranging over it costs its capacity, so after a cold start every small
// change would walk the buckets of the whole table.
func (t *Tracker[K, V]) shrinkDirty() {
	n := len(t.dirty)
	if n > t.dirtyPeak {
		t.dirtyPeak = n
	}
	if n == 0 && t.dirtyPeak > 1024 {
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

// IsActual says whether the kernel holds v at k, as far as the tracker knows.
func (t *Tracker[K, V]) IsActual(k K, v V) bool {
	have, ok := t.actual[k]
	return ok && t.equal(have, v)
}

// emptied returns m emptied: cleared when it is small, a new map when it held many keys. A Go
// map never gives back its buckets, and ranging over it costs its capacity, so a set that held
// a cold start's 20,000 keys would make every later small apply walk 20,000 empty slots.
func emptied[K comparable, V any](m map[K]V) map[K]V {
	if len(m) > 1024 {
		return map[K]V{}
	}
	clear(m)
	return m
}
