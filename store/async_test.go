package store_test

import (
	"slices"
	"testing"

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
	}), 2)
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
