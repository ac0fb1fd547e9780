package store

import "sync"

// Async delivers batches to a handler on a goroutine of its own, in order, so that a consumer
// that nothing on the way from etcd to the kernel waits for (the index, for one) stays off
// that path. Each batch is copied, since the intake reuses its slice.
//
// An Async can start held: it queues without delivering until Release, so that a cold start
// spends the CPU on programming the kernel first and the held consumer catches up after. A
// held queue that reaches its limit is released at once, so a held consumer never stalls the
// intake. Once released, at most limit batches wait and OnEvents blocks past that, so memory
// stays bounded.
type Async struct {
	ch      chan []Event
	done    chan struct{}
	release chan struct{}
	once    sync.Once
	closing sync.Once
}

// NewAsync starts delivering to h, at once or, when held, after Release. Close it to stop,
// after the last OnEvents.
func NewAsync(h Handler, limit int, held bool) *Async {
	a := &Async{ch: make(chan []Event, limit), done: make(chan struct{}), release: make(chan struct{})}
	if !held {
		a.Release()
	}
	go func() {
		defer close(a.done)
		<-a.release
		for b := range a.ch {
			h.OnEvents(b)
		}
	}()
	return a
}

// Release starts delivery of a held Async; it does nothing after the first call.
func (a *Async) Release() { a.once.Do(func() { close(a.release) }) }

// OnEvents queues a copy of the batch.
func (a *Async) OnEvents(b []Event) {
	if len(b) == 0 {
		return
	}
	b = append([]Event(nil), b...)
	select {
	case a.ch <- b:
	default:
		a.Release() // full: never wait for a consumer that is held
		a.ch <- b
	}
}

// Close releases the consumer if it is held, delivers what is queued and waits for the
// handler to finish it. OnEvents must not be called after Close.
func (a *Async) Close() {
	a.Release()
	a.closing.Do(func() { close(a.ch) })
	<-a.done
}
