package applyloop

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLoop: a kick applies; kicks folded while one is pending; a failure is retried after
// the first backoff, and kicks meanwhile wait for that retry; applies are MinInterval apart;
// a tick that asks for it applies; the heartbeat is kept; Run ends with its context.
func TestLoop(t *testing.T) {
	kick := make(chan struct{}, 1)
	var mu sync.Mutex
	var starts []time.Time
	var fail atomic.Int32 // failures still to give
	var beat atomic.Int64
	var ticks atomic.Int32
	tickApply := make(chan bool, 1)
	l := &Loop{Kick: kick, MinInterval: 50 * time.Millisecond, Beat: &beat,
		Apply: func() error {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			if fail.Load() > 0 {
				fail.Add(-1)
				return errors.New("refused")
			}
			return nil
		},
		Ticks: []Tick{{Every: 30 * time.Millisecond, Do: func() bool {
			ticks.Add(1)
			select {
			case a := <-tickApply:
				return a
			default:
				return false
			}
		}}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	applies := func() int { mu.Lock(); defer mu.Unlock(); return len(starts) }
	wait := func(what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait("the heartbeat", func() bool { return beat.Load() != 0 })
	kick <- struct{}{}
	wait("the first apply", func() bool { return applies() == 1 })

	// A failure, then kicks during the backoff: one retry about FirstRetry later, no more.
	fail.Store(1)
	kick <- struct{}{}
	wait("the failing apply", func() bool { return applies() == 2 })
	for range 3 {
		select {
		case kick <- struct{}{}:
		default:
		}
		time.Sleep(10 * time.Millisecond)
	}
	wait("the retry", func() bool { return applies() == 3 })
	mu.Lock()
	gap := starts[2].Sub(starts[1])
	mu.Unlock()
	if gap < FirstRetry {
		t.Errorf("retried %v after the failure, want at least %v", gap, FirstRetry)
	}
	time.Sleep(150 * time.Millisecond)
	if n := applies(); n != 3 {
		t.Errorf("%d applies after the retry, want 3: kicks during the backoff must fold into it", n)
	}

	// Two kicks in a row: applies at least MinInterval apart.
	kick <- struct{}{}
	wait("an apply", func() bool { return applies() == 4 })
	kick <- struct{}{}
	wait("the next apply", func() bool { return applies() == 5 })
	mu.Lock()
	if gap := starts[4].Sub(starts[3]); gap < l.MinInterval {
		t.Errorf("applies %v apart, want at least %v", gap, l.MinInterval)
	}
	mu.Unlock()

	// Ticks run; one that asks for an apply gets it.
	wait("ticks", func() bool { return ticks.Load() >= 2 })
	if n := applies(); n != 5 {
		t.Errorf("%d applies after ticks that asked for none, want 5", n)
	}
	tickApply <- true
	wait("the tick's apply", func() bool { return applies() == 6 })

	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not end with its context")
	}
}
