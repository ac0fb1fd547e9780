package store

import "sync"

// Tally counts, per kind, the objects the intake has delivered, with the newest revision
// seen: what an agent reports of its view (metrics, the in-sync log line) without holding a
// copy of every object. The agent needs no queryable copy: calc keeps what it computes from;
// the Index is for tools that query (sluicectl). A Tally keeps each object's ID only.
type Tally struct {
	mu       sync.Mutex
	ids      map[Kind]map[string]struct{}
	revision int64
}

// NewTally returns an empty tally.
func NewTally() *Tally { return &Tally{ids: map[Kind]map[string]struct{}{}} }

// OnEvents counts a batch.
func (t *Tally) OnEvents(batch []Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range batch {
		ev := &batch[i]
		t.revision = max(t.revision, ev.Revision)
		switch ev.Type {
		case EventUpsert:
			ids := t.ids[ev.Kind]
			if ids == nil {
				ids = map[string]struct{}{}
				t.ids[ev.Kind] = ids
			}
			ids[ev.ID] = struct{}{}
		case EventDelete:
			delete(t.ids[ev.Kind], ev.ID)
		}
	}
}

// Count is how many objects of kind k there are.
func (t *Tally) Count(k Kind) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ids[k])
}

// Revision is the etcd revision of the newest event counted.
func (t *Tally) Revision() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.revision
}
