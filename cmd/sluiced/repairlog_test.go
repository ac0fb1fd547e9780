package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestRepairLogCountsTheRest: a burst of repairs logs its first ten one by one and the rest
// as one count at the end of that second, without waiting for another repair to come.
func TestRepairLogCountsTheRest(t *testing.T) {
	var buf logBuffer // the repair log's timer writes it while the test reads
	r := &repairLog{log: zerolog.New(&buf)}
	for i := range 25 {
		r.heard("route", fmt.Sprintf("route to 10.65.%d.0/26", i))
	}
	if n := len(buf.lines(t)); n != repairLines {
		t.Fatalf("%d lines at once, want %d: %v", n, repairLines, buf.lines(t))
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(buf.lines(t)) == repairLines && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	lines := buf.lines(t)
	if len(lines) != repairLines+1 {
		t.Fatalf("after the second: %d lines, want %d (the count of the rest): %v", len(lines), repairLines+1, lines)
	}
	if last := lines[repairLines]; last["count"] != float64(15) || !strings.Contains(fmt.Sprint(last["message"]), "not each logged") {
		t.Fatalf("the count line: %v", last)
	}
	// The next second starts afresh: its repairs are logged one by one again.
	r.heard("nexthop", "nexthop object 7")
	if lines := buf.lines(t); len(lines) != repairLines+2 || lines[repairLines+1]["object"] != "nexthop object 7" {
		t.Fatalf("a repair in the next second: %v", lines)
	}
}
