// Package applyloop runs a stage's applies, the same way for the dataplane and the service
// stage: one apply per kick (kicks that come while one is pending fold into it), at least
// MinInterval apart, backing off after a failure (100 ms doubling to 10 s; a kick meanwhile
// waits for the retry, which applies it too), with a heartbeat for the watchdog and periodic
// ticks (the resync, the connection-table cleaner) run between applies.
package applyloop

import (
	"context"
	"sync/atomic"
	"time"
)

// Backoff bounds: the first retry after a failure, and the longest wait between retries.
const (
	FirstRetry = 100 * time.Millisecond
	MaxRetry   = 10 * time.Second
)

// Tick is work done every Every between applies, on the loop's goroutine (never beside an
// apply). Do says whether an apply should follow.
type Tick struct {
	Every time.Duration
	Do    func() (apply bool)
}

// Loop is one stage's apply loop.
type Loop struct {
	// Kick asks for an apply (a buffered channel of one: a kick while one is pending is
	// folded into it).
	Kick <-chan struct{}
	// MinInterval is the least time from the start of one apply to the start of the next.
	MinInterval time.Duration
	// Apply applies once; an error makes the loop back off and try again.
	Apply func() error
	// Beat, when set, gets the time (Unix nanoseconds) every second and at each wake: what the
	// watchdog reads to tell a stuck loop.
	Beat *atomic.Int64
	// Ticks are the periodic work (a resync, a cleaner).
	Ticks []Tick
}

// Run runs the loop until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	beat := func() {
		if l.Beat != nil {
			l.Beat.Store(time.Now().UnixNano())
		}
	}
	heartbeat := time.NewTicker(time.Second)
	defer heartbeat.Stop()
	ticked := make(chan int)
	for i, t := range l.Ticks {
		tk := time.NewTicker(t.Every)
		defer tk.Stop()
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
					select {
					case ticked <- i:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
	beat()
	backoff := time.Duration(0)
	var retry <-chan time.Time
	last := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.Kick:
			if retry != nil {
				continue // backing off after a failure: the retry applies this change too
			}
		case i := <-ticked:
			if !l.Ticks[i].Do() || retry != nil {
				continue
			}
		case <-retry:
			retry = nil
		case <-heartbeat.C:
			beat()
			continue
		}
		beat()
		if wait := l.MinInterval - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		if err := l.Apply(); err != nil {
			backoff = min(max(backoff*2, FirstRetry), MaxRetry)
			retry = time.After(backoff)
			continue
		}
		backoff = 0
	}
}
