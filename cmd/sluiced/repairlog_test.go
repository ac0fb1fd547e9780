package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// lockedBuffer is a log sink the repair log's timer and the test may use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if s != "" && json.Unmarshal([]byte(s), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// TestRepairLogCountsTheRest: a burst of repairs logs its first ten one by one and the rest
// as one count at the end of that second, without waiting for another repair to come.
func TestRepairLogCountsTheRest(t *testing.T) {
	var buf lockedBuffer
	r := &repairLog{log: zerolog.New(&buf)}
	for i := range 25 {
		r.heard("route", fmt.Sprintf("route to 10.65.%d.0/26", i))
	}
	if n := len(buf.lines()); n != repairLines {
		t.Fatalf("%d lines at once, want %d: %v", n, repairLines, buf.lines())
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(buf.lines()) == repairLines && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	lines := buf.lines()
	if len(lines) != repairLines+1 {
		t.Fatalf("after the second: %d lines, want %d (the count of the rest): %v", len(lines), repairLines+1, lines)
	}
	if last := lines[repairLines]; last["count"] != float64(15) || !strings.Contains(fmt.Sprint(last["message"]), "not each logged") {
		t.Fatalf("the count line: %v", last)
	}
	// The next second starts afresh: its repairs are logged one by one again.
	r.heard("nexthop", "nexthop object 7")
	if lines := buf.lines(); len(lines) != repairLines+2 || lines[repairLines+1]["object"] != "nexthop object 7" {
		t.Fatalf("a repair in the next second: %v", lines)
	}
}
