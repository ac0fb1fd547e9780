package bpf

import "sync"

// In-memory service tables: what the driver writes, held in Go maps.

// MemTable is an in-memory Table: it holds max entries like the kernel's and fails the
// operations Fail says. Tests use it in place of a kernel map; sluicectl diff runs the driver
// over it to tell what the driver would write.
type MemTable[K comparable, V any] struct {
	mu      sync.Mutex
	Entries map[K]V
	Size    int
	// Fail, when set, is asked before each operation ("put" or "delete") and its error
	// returned instead.
	Fail   func(op string, k K) error
	Writes int
}

// NewMemTable returns an empty table of size max.
func NewMemTable[K comparable, V any](max int) *MemTable[K, V] {
	return &MemTable[K, V]{Entries: map[K]V{}, Size: max}
}

func (t *MemTable[K, V]) Put(k K, v V) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.Fail != nil {
		if err := t.Fail("put", k); err != nil {
			return err
		}
	}
	if _, ok := t.Entries[k]; !ok && len(t.Entries) >= t.Size {
		return ErrMapFull
	}
	t.Entries[k] = v
	t.Writes++
	return nil
}

// PutBatch writes entries one by one, stopping at the first failure, as the kernel does.
func (t *MemTable[K, V]) PutBatch(keys []K, vals []V) (int, error) {
	for i := range keys {
		if err := t.Put(keys[i], vals[i]); err != nil {
			return i, err
		}
	}
	return len(keys), nil
}

func (t *MemTable[K, V]) Delete(k K) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.Fail != nil {
		if err := t.Fail("delete", k); err != nil {
			return err
		}
	}
	if _, ok := t.Entries[k]; ok {
		t.Writes++
	}
	delete(t.Entries, k)
	return nil
}

func (t *MemTable[K, V]) Dump() (map[K]V, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[K]V, len(t.Entries))
	for k, v := range t.Entries {
		out[k] = v
	}
	return out, nil
}

func (t *MemTable[K, V]) Len() int { t.mu.Lock(); defer t.mu.Unlock(); return len(t.Entries) }
func (t *MemTable[K, V]) Max() int { return t.Size }

// MemTables returns in-memory tables of the given sizes.
func MemTables(s MapSizes) (Tables, *MemSet) {
	f := &MemSet{
		Frontends:    NewMemTable[FrontendKey, FrontendValue](s.Frontends),
		Backends:     NewMemTable[BackendKey, BackendValue](s.Backends),
		BackendIndex: NewMemTable[BackendIndex, uint32](s.Backends),
		SourceRanges: NewMemTable[SourceRangeKey, uint32](s.SourceRanges),
		ClusterNets:  NewMemTable[ClusterNetKey, ClusterNetVal](s.ClusterNets),
		Settings:     NewMemTable[uint32, Settings](1),
		Settings6:    NewMemTable[uint32, Settings6](1),
		V6: MemSet6{
			Frontends:    NewMemTable[FrontendKey6, FrontendValue](s.Frontends),
			Backends:     NewMemTable[BackendKey, BackendValue6](s.Backends),
			BackendIndex: NewMemTable[BackendIndex6, uint32](s.Backends),
			SourceRanges: NewMemTable[SourceRangeKey6, uint32](s.SourceRanges),
			ClusterNets:  NewMemTable[ClusterNetKey6, ClusterNetVal](s.ClusterNets),
		},
	}
	return Tables{f.Frontends, f.Backends, f.BackendIndex, f.SourceRanges, f.ClusterNets, f.Settings,
		Tables6{f.V6.Frontends, f.V6.Backends, f.V6.BackendIndex, f.V6.SourceRanges, f.V6.ClusterNets}, f.Settings6}, f
}

// MemSet holds the tables behind MemTables.
type MemSet struct {
	Frontends    *MemTable[FrontendKey, FrontendValue]
	Backends     *MemTable[BackendKey, BackendValue]
	BackendIndex *MemTable[BackendIndex, uint32]
	SourceRanges *MemTable[SourceRangeKey, uint32]
	ClusterNets  *MemTable[ClusterNetKey, ClusterNetVal]
	Settings     *MemTable[uint32, Settings]
	Settings6    *MemTable[uint32, Settings6]
	V6           MemSet6
}

// MemSet6 holds the IPv6 tables behind MemTables.
type MemSet6 struct {
	Frontends    *MemTable[FrontendKey6, FrontendValue]
	Backends     *MemTable[BackendKey, BackendValue6]
	BackendIndex *MemTable[BackendIndex6, uint32]
	SourceRanges *MemTable[SourceRangeKey6, uint32]
	ClusterNets  *MemTable[ClusterNetKey6, ClusterNetVal]
}
