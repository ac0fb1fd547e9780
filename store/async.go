package store

import "sync"

// Async delivers batches to a handler on a goroutine of its own, in order, so that a slow
// consumer that nothing waits for (the index, for one) stays off the path from etcd to the
// kernel. Each batch is copied, since the intake reuses its slice. At most queue batches
// wait; past that OnEvents blocks until the consumer catches up, so memory stays bounded.
type Async struct {
	ch   chan []Event
	done chan struct{}
	once sync.Once
}

// NewAsync starts delivering to h. Close it to stop, after the last OnEvents.
func NewAsync(h Handler, queue int) *Async {
	a := &Async{ch: make(chan []Event, queue), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for b := range a.ch {
			h.OnEvents(b)
		}
	}()
	return a
}

// OnEvents queues a copy of the batch.
func (a *Async) OnEvents(b []Event) {
	if len(b) > 0 {
		a.ch <- append([]Event(nil), b...)
	}
}

// Close delivers what is queued and waits for the handler to finish it. OnEvents must not be
// called after Close.
func (a *Async) Close() {
	a.once.Do(func() { close(a.ch) })
	<-a.done
}
