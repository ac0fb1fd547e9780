package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
)

// TestAsyncDeliversInOrder: every batch arrives, in order, with its own events even though the
// sender reuses its slice, and Close waits for the last one.
func TestAsyncDeliversInOrder(t *testing.T) {
	var got []int64
	a := store.NewAsync(store.HandlerFunc(func(b []store.Event) {
		for _, ev := range b {
			got = append(got, ev.Revision)
		}
	}), 2, false)
	buf := make([]store.Event, 0, 3)
	var want []int64
	for rev := int64(1); rev <= 300; rev += 3 {
		buf = buf[:0]
		for i := range int64(3) {
			buf = append(buf, store.Event{Type: store.EventUpsert, Revision: rev + i})
			want = append(want, rev+i)
		}
		a.OnEvents(buf)
		clear(buf) // as the intake does
	}
	a.OnEvents(nil)
	a.Close()
	a.Close() // twice is harmless
	if !slices.Equal(got, want) {
		t.Fatalf("delivered %v\nwant %v", got, want)
	}
}

// TestAsyncHeld: a held Async delivers nothing until Release, then everything in order; one
// whose queue fills releases itself instead of blocking the sender.
func TestAsyncHeld(t *testing.T) {
	got := make(chan int64, 10)
	h := store.HandlerFunc(func(b []store.Event) {
		for _, ev := range b {
			got <- ev.Revision
		}
	})
	a := store.NewAsync(h, 4, true)
	for rev := range int64(3) {
		a.OnEvents([]store.Event{{Revision: rev}})
	}
	select {
	case r := <-got:
		t.Fatalf("a held Async delivered revision %d", r)
	case <-time.After(50 * time.Millisecond):
	}
	a.Release()
	for want := range int64(3) {
		if r := <-got; r != want {
			t.Fatalf("got revision %d, want %d", r, want)
		}
	}
	a.Close()

	full := store.NewAsync(h, 2, true)
	done := make(chan struct{})
	go func() {
		for rev := range int64(5) { // more than the queue holds: must not block for ever
			full.OnEvents([]store.Event{{Revision: rev}})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a held Async with a full queue blocked its sender")
	}
	full.Close()
	for want := range int64(5) {
		if r := <-got; r != want {
			t.Fatalf("got revision %d, want %d", r, want)
		}
	}
}
