package main

import (
	"slices"
	"testing"
	"time"
)

// TestGCPacer: the collector's target is the runtime's default through the cold start, the
// settled one after it, the busy one while changes come in bulk, and settled again (with the
// reserve handed back) once they stop; a few changes do not make the agent busy, and GOGC in
// the environment is never overridden.
func TestGCPacer(t *testing.T) {
	var set []int
	frees := 0
	p := &gcPacer{set: func(v int) int { set = append(set, v); return 0 }, free: func() { frees++ }}
	defer func() {
		if p.quiet != nil {
			p.quiet.Stop()
		}
	}()
	now := time.Now()
	p.onEvents(1000, now) // the cold start's read
	if len(set) != 0 {
		t.Fatalf("before the cold start ended: set %v", set)
	}
	p.settle()
	p.onEvents(busyEvents-1, now) // a few changes
	p.onEvents(busyEvents-1, now.Add(busyWindow+time.Millisecond))
	if want := []int{settledGCPercent}; !slices.Equal(set, want) {
		t.Fatalf("settled, then a few changes a second: set %v; want %v", set, want)
	}
	p.onEvents(1, now.Add(busyWindow+2*time.Millisecond)) // busyEvents within one window
	p.onEvents(busyEvents, now.Add(busyWindow+3*time.Millisecond))
	if want := []int{settledGCPercent, busyGCPercent}; !slices.Equal(set, want) {
		t.Fatalf("changes in bulk: set %v; want %v", set, want)
	}
	p.onEvents(1, time.Now()) // changes still coming: still busy
	p.checkQuiet()
	if want := []int{settledGCPercent, busyGCPercent}; !slices.Equal(set, want) || frees != 0 {
		t.Fatalf("a quiet check while changes come: set %v, %d frees", set, frees)
	}
	p.onEvents(1, time.Now().Add(-busyQuiet)) // the last change, busyQuiet ago
	p.checkQuiet()
	if want := []int{settledGCPercent, busyGCPercent, settledGCPercent}; !slices.Equal(set, want) || frees != 1 {
		t.Fatalf("quiet: set %v, %d frees; want %v, 1", set, frees, want)
	}

	fixed := &gcPacer{fixed: true, set: func(v int) int { t.Errorf("GOGC set in the environment, and the pacer set %d", v); return 0 }}
	fixed.settle()
	fixed.onEvents(10*busyEvents, time.Now())
}
