package tracker

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// trackerKernel is a kernel of int keys whose writes a test can refuse.
type trackerKernel struct {
	held    map[int]string
	refuse  func(k int) bool
	sets    []int
	deletes []int
}

// pass runs one Pending against the kernel, recording every write tried.
func (kn *trackerKernel) pass(tr *Tracker[int, string]) {
	kn.sets, kn.deletes = nil, nil
	tr.Pending(func(k int, want string) Outcome {
		kn.sets = append(kn.sets, k)
		if kn.refuse != nil && kn.refuse(k) {
			return Failed
		}
		kn.held[k] = want
		tr.SetActual(k, want)
		return Done
	}, func(k int, _ string) Outcome {
		kn.deletes = append(kn.deletes, k)
		if kn.refuse != nil && kn.refuse(k) {
			return Failed
		}
		delete(kn.held, k)
		tr.DeleteActual(k)
		return Done
	})
	slices.Sort(kn.sets)
	slices.Sort(kn.deletes)
}

func newIntTracker() *Tracker[int, string] {
	return New[int, string](func(a, b string) bool { return a == b })
}

func TestTrackerTransitions(t *testing.T) {
	tr := newIntTracker()
	kn := &trackerKernel{held: map[int]string{}}

	// Empty to two keys: both written once, then nothing to do.
	tr.SetDesired(1, "a")
	tr.SetDesired(2, "b")
	kn.pass(tr)
	if !slices.Equal(kn.sets, []int{1, 2}) || kn.deletes != nil {
		t.Fatalf("first pass set %v deleted %v; want set [1 2]", kn.sets, kn.deletes)
	}
	kn.pass(tr)
	if kn.sets != nil || kn.deletes != nil || tr.DirtyLen() != 0 {
		t.Fatalf("second pass set %v deleted %v, %d dirty; want nothing", kn.sets, kn.deletes, tr.DirtyLen())
	}

	// The same value again dirties nothing; a changed value and a removal are one write each.
	tr.SetDesired(1, "a")
	if tr.DirtyLen() != 0 {
		t.Fatalf("setting an unchanged value made %d keys dirty", tr.DirtyLen())
	}
	tr.DeleteDesired(9) // never wanted: nothing
	tr.SetDesired(1, "a2")
	tr.DeleteDesired(2)
	kn.pass(tr)
	if !slices.Equal(kn.sets, []int{1}) || !slices.Equal(kn.deletes, []int{2}) {
		t.Fatalf("change pass set %v deleted %v; want set [1] deleted [2]", kn.sets, kn.deletes)
	}
	if want := map[int]string{1: "a2"}; !maps.Equal(kn.held, want) {
		t.Fatalf("kernel holds %v; want %v", kn.held, want)
	}

	// A refused write stays dirty and is the only one tried again.
	tr.SetDesired(3, "c")
	tr.SetDesired(4, "d")
	kn.refuse = func(k int) bool { return k == 4 }
	kn.pass(tr)
	if !slices.Equal(kn.sets, []int{3, 4}) || tr.DirtyLen() != 1 {
		t.Fatalf("pass with 4 refused set %v, %d dirty; want set [3 4], 1 dirty", kn.sets, tr.DirtyLen())
	}
	kn.refuse = nil
	kn.pass(tr)
	if !slices.Equal(kn.sets, []int{4}) || tr.DirtyLen() != 0 {
		t.Fatalf("retry set %v, %d dirty; want set [4], 0 dirty", kn.sets, tr.DirtyLen())
	}

	// Desired set back to what the kernel holds before any pass: nothing written.
	tr.SetDesired(3, "x")
	tr.SetDesired(3, "c")
	kn.pass(tr)
	if kn.sets != nil {
		t.Fatalf("a value changed and changed back wrote %v", kn.sets)
	}

	// A read of the kernel finds drift: a stale key, a wrong value, a missing key. Exactly
	// those are written; the matching one is left alone.
	kn.held = map[int]string{1: "a2", 3: "wrong", 7: "stale"}
	tr.ReplaceActual(maps.Clone(kn.held))
	if tr.DirtyLen() != 3+3 {
		t.Fatalf("after a read, DirtyLen %d; want desired+actual = 6", tr.DirtyLen())
	}
	kn.pass(tr)
	if !slices.Equal(kn.sets, []int{3, 4}) || !slices.Equal(kn.deletes, []int{7}) {
		t.Fatalf("repair set %v deleted %v; want set [3 4] deleted [7]", kn.sets, kn.deletes)
	}
	if want := map[int]string{1: "a2", 3: "c", 4: "d"}; !maps.Equal(kn.held, want) {
		t.Fatalf("after repair the kernel holds %v; want %v", kn.held, want)
	}
	kn.pass(tr)
	if kn.sets != nil || kn.deletes != nil {
		t.Fatalf("pass after repair set %v deleted %v; want nothing", kn.sets, kn.deletes)
	}

	// MarkDirty compares a key again (and writes it only if it differs).
	kn.held[1] = "changed behind our back"
	tr.SetActual(1, "changed behind our back")
	tr.MarkDirty(1)
	kn.pass(tr)
	if !slices.Equal(kn.sets, []int{1}) || kn.held[1] != "a2" {
		t.Fatalf("MarkDirty pass set %v, kernel has %q; want [1] and a2", kn.sets, kn.held[1])
	}
}

// TestTrackerAllDirty covers the cold start: every key compared without listing it, and
// what is left over after a pass that failed in part.
func TestTrackerAllDirty(t *testing.T) {
	const n = 5000
	fill := func(tr *Tracker[int, string]) {
		tr.Expect(n)
		for i := range n {
			tr.SetDesired(i, fmt.Sprint(i))
		}
	}
	for _, tc := range []struct {
		name      string
		refuse    func(k int) bool
		wantDirty int
	}{
		{"all written", func(int) bool { return false }, 0},
		{"ten refused", func(k int) bool { return k < 10 }, 10},
		{"2000 refused", func(k int) bool { return k < 2000 }, 2000},
		{"all refused", func(int) bool { return true }, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newIntTracker()
			kn := &trackerKernel{held: map[int]string{-1: "stale"}, refuse: tc.refuse}
			tr.ReplaceActual(maps.Clone(kn.held))
			fill(tr)
			if tr.DirtyLen() != n+1 {
				t.Fatalf("filled after a read: DirtyLen %d; want %d", tr.DirtyLen(), n+1)
			}
			kn.pass(tr)
			if len(kn.sets) != n {
				t.Fatalf("cold pass tried %d sets; want %d", len(kn.sets), n)
			}
			// The stale key is deleted unless refused.
			wantLeft := tc.wantDirty
			if tc.refuse(-1) {
				wantLeft++
			}
			if wantLeft < n && tr.DirtyLen() != wantLeft {
				t.Fatalf("after the cold pass DirtyLen %d; want %d", tr.DirtyLen(), wantLeft)
			}
			// The next pass tries exactly the refused keys, and once they go in, all is clean.
			kn.refuse = nil
			kn.pass(tr)
			if len(kn.sets) != tc.wantDirty {
				t.Fatalf("second pass tried %d sets; want %d", len(kn.sets), tc.wantDirty)
			}
			kn.pass(tr)
			if kn.sets != nil || kn.deletes != nil || tr.DirtyLen() != 0 {
				t.Fatalf("third pass set %d deleted %v with %d dirty; want nothing", len(kn.sets), kn.deletes, tr.DirtyLen())
			}
			if len(kn.held) != n || kn.held[-1] != "" || kn.held[n-1] != fmt.Sprint(n-1) {
				t.Fatalf("kernel holds %d keys (stale %q); want %d, no stale", len(kn.held), kn.held[-1], n)
			}
		})
	}
}

// TestTrackerAdoptDesired: after a cold write of everything, adopting the desired state
// leaves nothing to do, and later changes are written as usual.
func TestTrackerAdoptDesired(t *testing.T) {
	tr := newIntTracker()
	tr.DirtyAll()
	for i := range 3000 {
		tr.SetDesired(i, fmt.Sprint(i))
	}
	tr.AdoptDesired()
	kn := &trackerKernel{held: map[int]string{}}
	kn.pass(tr)
	if kn.sets != nil || kn.deletes != nil || tr.DirtyLen() != 0 || tr.ActualLen() != 3000 {
		t.Fatalf("after adoption: set %d deleted %d, %d dirty, %d actual; want nothing and 3000", len(kn.sets), len(kn.deletes), tr.DirtyLen(), tr.ActualLen())
	}
	// The actual map is a copy: changing the desired state does not change it.
	tr.DeleteDesired(5)
	tr.SetDesired(6, "six")
	if v, ok := tr.Actual(5); !ok || v != "5" {
		t.Fatalf("actual at 5 is %q %v after a desired change; want 5", v, ok)
	}
	kn.pass(tr)
	if !slices.Equal(kn.sets, []int{6}) || !slices.Equal(kn.deletes, []int{5}) {
		t.Fatalf("after adoption, a change set %v deleted %v; want [6] and [5]", kn.sets, kn.deletes)
	}
}

// TestTrackerAdoptDesiredBut: a cold write that missed some keys adopts the rest; the missed
// ones are written at the next pass, and only they.
func TestTrackerAdoptDesiredBut(t *testing.T) {
	tr := newIntTracker()
	tr.DirtyAll()
	for i := range 3000 {
		tr.SetDesired(i, fmt.Sprint(i))
	}
	tr.AdoptDesired(7, 2999, 5000) // 5000 is not wanted: nothing to say of it
	if tr.DirtyLen() != 2 || tr.ActualLen() != 2998 {
		t.Fatalf("after adoption: %d dirty, %d actual; want 2 and 2998", tr.DirtyLen(), tr.ActualLen())
	}
	if _, ok := tr.Actual(7); ok {
		t.Fatal("the kernel holds key 7, which was not written")
	}
	kn := &trackerKernel{held: map[int]string{}}
	kn.pass(tr)
	slices.Sort(kn.sets)
	if !slices.Equal(kn.sets, []int{7, 2999}) || kn.deletes != nil || tr.DirtyLen() != 0 || tr.ActualLen() != 3000 {
		t.Fatalf("the next pass set %v deleted %v, left %d dirty and %d actual; want [7 2999], none, 0 and 3000", kn.sets, kn.deletes, tr.DirtyLen(), tr.ActualLen())
	}
}

// TestTrackerSettleChangesNothing drives two trackers through the same random history of
// desired changes, refused writes, drift and reads, one settled after every pass and one
// never: they must write the same keys and report the same kernel state at every step, and
// a settled tracker whose kernel matches holds no copy of it.
func TestTrackerSettleChangesNothing(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 7))
		settled, whole := newIntTracker(), newIntTracker()
		kns, knw := &trackerKernel{held: map[int]string{}}, &trackerKernel{held: map[int]string{}}
		const keys = 40
		for step := range 300 {
			switch op := r.IntN(10); {
			case op < 4:
				k, v := r.IntN(keys), fmt.Sprint(r.IntN(3))
				settled.SetDesired(k, v)
				whole.SetDesired(k, v)
			case op < 6:
				k := r.IntN(keys)
				settled.DeleteDesired(k)
				whole.DeleteDesired(k)
			case op == 6: // drift noticed: someone deleted a key
				k := r.IntN(keys)
				delete(kns.held, k)
				delete(knw.held, k)
				settled.DeleteActual(k)
				settled.MarkDirty(k)
				whole.DeleteActual(k)
				whole.MarkDirty(k)
			case op == 7: // drift found by a read: a changed value and a stale key
				k, stale := r.IntN(keys), keys+r.IntN(5)
				for _, kn := range []*trackerKernel{kns, knw} {
					kn.held[k], kn.held[stale] = "drift", "stale"
				}
				settled.ReplaceActual(maps.Clone(kns.held))
				whole.ReplaceActual(maps.Clone(knw.held))
			default:
				refused := r.IntN(keys + 5)
				kns.refuse = func(k int) bool { return k == refused }
				knw.refuse = kns.refuse
				kns.pass(settled)
				knw.pass(whole)
				settled.Settle()
				if !slices.Equal(kns.sets, knw.sets) || !slices.Equal(kns.deletes, knw.deletes) {
					t.Fatalf("seed %d step %d: settled tracker set %v deleted %v; whole one set %v deleted %v",
						seed, step, kns.sets, kns.deletes, knw.sets, knw.deletes)
				}
			}
			for k := range keys + 5 {
				vs, oks := settled.Actual(k)
				vw, okw := whole.Actual(k)
				if vs != vw || oks != okw {
					t.Fatalf("seed %d step %d: key %d actual %q %v settled, %q %v whole", seed, step, k, vs, oks, vw, okw)
				}
			}
			if settled.ActualLen() != whole.ActualLen() || settled.DirtyLen() > whole.DirtyLen() {
				t.Fatalf("seed %d step %d: actual %d/%d, dirty %d/%d (settled/whole)", seed, step,
					settled.ActualLen(), whole.ActualLen(), settled.DirtyLen(), whole.DirtyLen())
			}
		}
		// Everything written: the settled tracker holds the desired state only.
		kns.refuse, knw.refuse = nil, nil
		kns.pass(settled)
		settled.Settle()
		if settled.actual != nil || len(settled.off) != 0 || !maps.Equal(kns.held, settled.desired) {
			t.Fatalf("seed %d: in sync, the settled tracker keeps %d actual and %d off keys (kernel %v, desired %v)",
				seed, len(settled.actual), len(settled.off), kns.held, settled.desired)
		}
	}
}

// TestTrackerDifferences: Differences shows what Pending would write, in both ways of holding
// the dirty keys (all dirty after a read; listed once settled), and changes nothing: Pending
// afterwards still writes exactly that.
func TestTrackerDifferences(t *testing.T) {
	for _, settled := range []bool{false, true} {
		tr := newIntTracker()
		tr.ReplaceActual(map[int]string{1: "a", 2: "old", 3: "stray"})
		tr.SetDesired(1, "a")
		tr.SetDesired(2, "b")
		tr.SetDesired(4, "d")
		if settled {
			tr.Settle()
			tr.MarkDirty(1)
			tr.MarkDirty(2)
			tr.MarkDirty(3)
			tr.MarkDirty(4)
		}
		show := func() string {
			var want, extra []string
			tr.Differences(func(k int, w, have string, held bool) {
				want = append(want, fmt.Sprintf("%d=%s (held %v %s)", k, w, held, have))
			}, func(k int, have string) { extra = append(extra, fmt.Sprintf("%d=%s", k, have)) })
			slices.Sort(want)
			slices.Sort(extra)
			return fmt.Sprint(want, extra)
		}
		const wantShown = "[2=b (held true old) 4=d (held false )] [3=stray]"
		if got := show(); got != wantShown {
			t.Errorf("settled %v: shown %s, want %s", settled, got, wantShown)
		}
		if got := show(); got != wantShown {
			t.Errorf("settled %v: shown again %s: Differences changed the tracker", settled, got)
		}
		kn := &trackerKernel{held: map[int]string{1: "a", 2: "old", 3: "stray"}}
		kn.pass(tr)
		if !slices.Equal(kn.sets, []int{2, 4}) || !slices.Equal(kn.deletes, []int{3}) {
			t.Errorf("settled %v: Pending after Differences wrote %v, deleted %v", settled, kn.sets, kn.deletes)
		}
		if got := show(); got != "[] []" {
			t.Errorf("settled %v: after the writes shown %s", settled, got)
		}
	}
}

// TestTrackerDrift: a read counts as drift only what differs from what the tracker knew the
// kernel to hold (written or read), whatever the desired state did since: a change wanted and
// not yet written is no drift, nor is a key whose write failed and which the kernel still
// holds as before. Both holding modes (a whole copy after a read, off once settled) count
// alike, and nothing is counted while the tracker does not know the kernel (after a reset).
func TestTrackerDrift(t *testing.T) {
	for _, settle := range []bool{false, true} {
		tr := newIntTracker()
		kn := &trackerKernel{held: map[int]string{}}
		tr.ReplaceActual(map[int]string{}) // a fresh start: nothing known yet
		for i, v := range []string{"a", "b", "c", "d"} {
			tr.SetDesired(i+1, v)
		}
		kn.pass(tr)
		if settle {
			tr.Settle()
		}
		// Changes wanted, not written yet: a value changed, a key added, one removed.
		tr.SetDesired(1, "a2")
		tr.SetDesired(5, "e")
		tr.DeleteDesired(2)
		if d := tr.ReplaceActual(maps.Clone(kn.held)); d != 0 {
			t.Errorf("settled %v: a read matching what was written counts %d drift; want 0", settle, d)
		}
		kn.refuse = func(k int) bool { return k == 5 } // its write fails: the kernel lacks it, as known
		kn.pass(tr)
		if d := tr.ReplaceActual(maps.Clone(kn.held)); d != 0 {
			t.Errorf("settled %v: a read after a refused write counts %d drift; want 0", settle, d)
		}
		kn.refuse = nil
		kn.pass(tr)
		if settle {
			tr.Settle()
		}
		// Someone else: a value changed, a key deleted, a stray added.
		kn.held[3] = "changed"
		delete(kn.held, 4)
		kn.held[9] = "stray"
		tr.SetDesired(6, "f") // and a change wanted at the same time
		if d := tr.ReplaceActual(maps.Clone(kn.held)); d != 3 {
			t.Errorf("settled %v: three keys changed by hand count %d drift; want 3", settle, d)
		}
		kn.pass(tr)
		// A fresh reset: the tracker knows nothing, counts nothing.
		fresh := newIntTracker()
		fresh.DirtyAll()
		if d := fresh.ReplaceActual(maps.Clone(kn.held)); d != 0 {
			t.Errorf("settled %v: a tracker that knew nothing counts %d drift", settle, d)
		}
	}
}
