package store

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
)

// logLine is one line of an event log. Upserts keep the raw etcd value, so a replay goes
// through the same decoder as the live run.
type logLine struct {
	Rev   int64           `json:"rev"`
	Type  string          `json:"type"`
	Key   string          `json:"key,omitempty"`
	Value json.RawMessage `json:"value,omitempty"`
}

// Recorder is a Handler that writes every event as a JSON line with its etcd revision.
type Recorder struct {
	w   *bufio.Writer
	err error
}

// NewRecorder writes events to w. Call Flush when done.
func NewRecorder(w io.Writer) *Recorder {
	return &Recorder{w: bufio.NewWriterSize(w, 1<<16)}
}

// OnEvents writes the batch; the first write error sticks and is returned by Flush.
func (r *Recorder) OnEvents(batch []Event) {
	for i := range batch {
		if r.err != nil {
			return
		}
		ev := &batch[i]
		l := logLine{Rev: ev.Revision, Type: ev.Type.String(), Key: ev.Key}
		if ev.Type == EventUpsert {
			if json.Valid(ev.Value) {
				l.Value = ev.Value
			} else {
				// Decode accepted it, so it is JSON; keep the log well-formed regardless.
				b, _ := json.Marshal(string(ev.Value))
				l.Value = b
			}
		}
		b, err := json.Marshal(l)
		if err != nil {
			r.err = fmt.Errorf("encoding event for %s: %w", ev.Key, err)
			return
		}
		b = append(b, '\n')
		if _, err := r.w.Write(b); err != nil {
			r.err = fmt.Errorf("writing event log: %w", err)
		}
	}
	if r.err == nil && len(batch) > 0 && batch[len(batch)-1].Type == EventInSync {
		if err := r.w.Flush(); err != nil {
			r.err = fmt.Errorf("writing event log: %w", err)
		}
	}
}

// Flush writes out what is buffered and returns the first error met.
func (r *Recorder) Flush() error {
	if r.err != nil {
		return r.err
	}
	return r.w.Flush()
}

// Replay reads an event log and delivers its events to h, one batch per run of lines that
// ends at an in-sync (and one for whatever follows the last in-sync). An unreadable line
// stops the replay with an error naming the line.
func Replay(r io.Reader, h Handler) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 64<<20)
	var batch []Event
	n := 0
	for sc.Scan() {
		n++
		if len(sc.Bytes()) == 0 {
			continue
		}
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("event log line %d: %w", n, err)
		}
		switch l.Type {
		case "upsert":
			obj, err := Decode(l.Key, l.Value)
			if err != nil {
				return fmt.Errorf("event log line %d: %w", n, err)
			}
			batch = append(batch, Event{Type: EventUpsert, Kind: obj.Kind(), ID: obj.ID(), Key: l.Key, Revision: l.Rev, Object: obj, Value: l.Value})
		case "delete":
			kind, id, err := ParseKey(l.Key)
			if err != nil {
				return fmt.Errorf("event log line %d: key %s: %w", n, l.Key, err)
			}
			batch = append(batch, Event{Type: EventDelete, Kind: kind, ID: id, Key: l.Key, Revision: l.Rev})
		case "in-sync":
			batch = append(batch, Event{Type: EventInSync, Revision: l.Rev})
			h.OnEvents(batch)
			batch = batch[:0]
		default:
			return fmt.Errorf("event log line %d: unknown type %q: want upsert, delete or in-sync", n, l.Type)
		}
		if len(batch) >= 4096 {
			h.OnEvents(batch)
			batch = batch[:0]
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading event log after line %d: %w", n, err)
	}
	if len(batch) > 0 {
		h.OnEvents(batch)
	}
	return nil
}
