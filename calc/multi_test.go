package calc

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestMultiMatchesSets: a multi behaves as a map of sorted sets through any history of adds
// and removes (its first value inline, the rest aside).
func TestMultiMatchesSets(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	m := newMulti[int, string]()
	ref := map[int]map[string]bool{}
	vals := []string{"a", "b", "c", "d"}
	for step := range 5000 {
		k, v := r.IntN(6), vals[r.IntN(len(vals))]
		if r.IntN(2) == 0 {
			m.add(k, v)
			if ref[k] == nil {
				ref[k] = map[string]bool{}
			}
			ref[k][v] = true
		} else {
			m.remove(k, v)
			delete(ref[k], v)
			if len(ref[k]) == 0 {
				delete(ref, k)
			}
		}
		for k := range 6 {
			want := slices.Sorted(maps.Keys(ref[k]))
			got := m.get(k)
			f, ok := m.first(k)
			if !slices.Equal(got, want) || m.count(k) != len(want) || ok != (len(want) > 0) || (ok && f != want[0]) {
				t.Fatalf("step %d key %d: get %v count %d first %q %v; want %v", step, k, got, m.count(k), f, ok, want)
			}
			if all := slices.Collect(m.all(k)); !slices.Equal(all, want) {
				t.Fatalf("step %d key %d: all yields %v; want %v", step, k, all, want)
			}
			if _, spare := m.more[k]; spare && len(want) < 2 {
				t.Fatalf("step %d key %d: keeps a list for %d values", step, k, len(want))
			}
		}
		if len(m.one) != len(ref) {
			t.Fatalf("step %d: %d keys; want %d", step, len(m.one), len(ref))
		}
	}
}
