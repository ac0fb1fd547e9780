package main

import (
	"os"
	"runtime/debug"
	"sync"
	"time"
)

// The collector's targets: settledGCPercent once the cold start is over (a settled agent's
// heap changes little, and at the default (100) the runtime would keep as much again as the
// live heap in reserve: BenchmarkDataplane in cmd/sluiced reports the settled agent's memory),
// busyGCPercent while changes come in bulk. A collection's cost is the live heap's, so at 25
// the runtime spends four times the CPU of the default on the same garbage: while thousands of
// services are written at once, that was a third of sluiced's CPU (BenchmarkServicesArriving
// in cmd/sluiced). GOGC in the environment overrides both.
const (
	settledGCPercent = 25
	busyGCPercent    = 100
	// busyEvents in busyWindow make the agent busy; busyQuiet without an event settles it.
	busyEvents = 200
	busyWindow = time.Second
	busyQuiet  = 5 * time.Second
)

// gcPacer sets the collector's target: settled after the cold start, busy while etcd's
// changes come in bulk, settled again (its garbage handed back) once they stop.
type gcPacer struct {
	mu        sync.Mutex
	fixed     bool // GOGC in the environment: never changed
	settled   bool
	busy      bool
	window    time.Time // the start of the window events are counted in
	events    int
	lastEvent time.Time
	quiet     *time.Timer
	// set is debug.SetGCPercent, free debug.FreeOSMemory (tests replace them).
	set  func(int) int
	free func()
}

func newGCPacer() *gcPacer {
	return &gcPacer{fixed: os.Getenv("GOGC") != "", set: debug.SetGCPercent, free: debug.FreeOSMemory}
}

// settle is the end of the cold start: the settled target from now on.
func (p *gcPacer) settle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settled = true
	if !p.fixed && !p.busy {
		p.set(settledGCPercent)
	}
}

// onEvents counts n events from etcd, arrived at now.
func (p *gcPacer) onEvents(n int, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fixed || !p.settled {
		return
	}
	p.lastEvent = now
	if p.busy {
		return
	}
	if now.Sub(p.window) > busyWindow {
		p.window, p.events = now, 0
	}
	if p.events += n; p.events < busyEvents {
		return
	}
	p.busy = true
	p.set(busyGCPercent)
	if p.quiet == nil {
		p.quiet = time.AfterFunc(busyQuiet, p.checkQuiet)
	} else {
		p.quiet.Reset(busyQuiet)
	}
}

// checkQuiet settles the agent once busyQuiet has passed without an event, and looks again
// later otherwise.
func (p *gcPacer) checkQuiet() {
	p.mu.Lock()
	if wait := busyQuiet - time.Since(p.lastEvent); wait > 0 {
		p.quiet.Reset(wait)
		p.mu.Unlock()
		return
	}
	p.busy = false
	p.window, p.events = time.Time{}, 0
	p.set(settledGCPercent)
	p.mu.Unlock()
	p.free() // what the busy spell left in reserve goes back to the system
}
