package store

// EventType says what happened to a key.
type EventType uint8

// Event types. InSync says every event up to Revision has been delivered: the consumer's
// view now matches etcd at that revision.
const (
	EventUpsert EventType = iota + 1
	EventDelete
	EventInSync
)

func (t EventType) String() string {
	switch t {
	case EventUpsert:
		return "upsert"
	case EventDelete:
		return "delete"
	case EventInSync:
		return "in-sync"
	}
	return "unknown"
}

// Event is one typed change. Upserts carry the parsed Object and the raw Value it came from;
// deletes carry only Kind, ID and Key.
type Event struct {
	Type     EventType
	Kind     Kind
	ID       string
	Key      string
	Revision int64
	Object   Object
	Value    []byte
}

// Handler consumes batches of events, in order, from one goroutine. A Handler must not keep
// the batch slice after returning (the objects in it it may keep).
type Handler interface {
	OnEvents(batch []Event)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func([]Event)

// OnEvents calls f.
func (f HandlerFunc) OnEvents(b []Event) { f(b) }

// Fanout delivers every batch to each handler in turn.
type Fanout []Handler

// OnEvents hands the batch to every handler.
func (f Fanout) OnEvents(b []Event) {
	for _, h := range f {
		h.OnEvents(b)
	}
}
