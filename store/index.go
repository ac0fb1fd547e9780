package store

import (
	"fmt"

	memdb "github.com/hashicorp/go-memdb"
)

// Index names beyond the primary "id" index.
const (
	indexID      = "id"
	IndexNode    = "node"    // blocks by affine node, affinities and workload endpoints by node
	IndexService = "service" // endpoint slices by "namespace/service"
)

const tableMeta = "meta"

// meta is the single row of the meta table: how far the index has got.
type meta struct {
	Revision int64
	InSync   bool
}

// strIndexer indexes objects by a string derived with fn; ok=false leaves the object out.
type strIndexer struct {
	fn func(any) (string, bool)
}

func (s strIndexer) FromObject(obj any) (bool, []byte, error) {
	v, ok := s.fn(obj)
	if !ok {
		return false, nil, nil
	}
	return true, append([]byte(v), 0), nil
}

func (s strIndexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("want one argument, got %d", len(args))
	}
	v, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("want a string argument, got %T", args[0])
	}
	return append([]byte(v), 0), nil
}

func byID() *memdb.IndexSchema {
	return &memdb.IndexSchema{Name: indexID, Unique: true,
		Indexer: strIndexer{func(o any) (string, bool) { return o.(Object).ID(), true }}}
}

func by(name string, fn func(any) (string, bool)) *memdb.IndexSchema {
	return &memdb.IndexSchema{Name: name, AllowMissing: true, Indexer: strIndexer{fn}}
}

func schema() *memdb.DBSchema {
	s := &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{}}
	for _, k := range Kinds {
		s.Tables[k.Plural()] = &memdb.TableSchema{Name: k.Plural(), Indexes: map[string]*memdb.IndexSchema{indexID: byID()}}
	}
	idx := func(k Kind, is *memdb.IndexSchema) { s.Tables[k.Plural()].Indexes[is.Name] = is }
	idx(KindBlock, by(IndexNode, func(o any) (string, bool) { n := o.(*Block).AffinityNode; return n, n != "" }))
	idx(KindBlockAffinity, by(IndexNode, func(o any) (string, bool) { return o.(*BlockAffinity).Node, true }))
	idx(KindWorkloadEndpoint, by(IndexNode, func(o any) (string, bool) { return o.(*WorkloadEndpoint).Node, true }))
	idx(KindEndpointSlice, by(IndexService, func(o any) (string, bool) { return o.(*EndpointSlice).ServiceID(), true }))
	s.Tables[tableMeta] = &memdb.TableSchema{Name: tableMeta, Indexes: map[string]*memdb.IndexSchema{
		indexID: {Name: indexID, Unique: true, Indexer: strIndexer{func(any) (string, bool) { return "meta", true }}},
	}}
	return s
}

// Index is the in-memory, queryable copy of everything the intake read. It is a Handler:
// feed it events. Readers take consistent snapshots that later writes do not change.
type Index struct {
	db *memdb.MemDB
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		panic(fmt.Sprintf("store: bad index schema: %v", err)) // a programming error, caught by every test
	}
	return &Index{db: db}
}

// OnEvents applies a batch of events in one transaction.
func (x *Index) OnEvents(batch []Event) {
	txn := x.db.Txn(true)
	defer txn.Abort()
	m := x.metaTxn(txn)
	for i := range batch {
		ev := &batch[i]
		var err error
		switch ev.Type {
		case EventUpsert:
			err = txn.Insert(ev.Kind.Plural(), ev.Object)
		case EventDelete:
			_, err = txn.DeleteAll(ev.Kind.Plural(), indexID, ev.ID)
		case EventInSync:
			m.InSync = true
		}
		if err != nil {
			panic(fmt.Sprintf("store: index write for %s: %v", ev.Key, err)) // only a schema bug gets here
		}
		m.Revision = max(m.Revision, ev.Revision)
	}
	if err := txn.Insert(tableMeta, &m); err != nil {
		panic(fmt.Sprintf("store: index meta write: %v", err))
	}
	txn.Commit()
}

func (x *Index) metaTxn(txn *memdb.Txn) meta {
	raw, _ := txn.First(tableMeta, indexID, "meta")
	if raw == nil {
		return meta{}
	}
	return *raw.(*meta)
}

// Snapshot returns a read-only view of the index as it is now.
func (x *Index) Snapshot() *Snapshot {
	return &Snapshot{txn: x.db.Txn(false)}
}

// Snapshot is a consistent, read-only view of the index.
type Snapshot struct {
	txn *memdb.Txn
}

// Revision is the etcd revision of the newest event the snapshot includes.
func (s *Snapshot) Revision() int64 {
	raw, _ := s.txn.First(tableMeta, indexID, "meta")
	if raw == nil {
		return 0
	}
	return raw.(*meta).Revision
}

// InSync reports whether the snapshot has seen at least one in-sync.
func (s *Snapshot) InSync() bool {
	raw, _ := s.txn.First(tableMeta, indexID, "meta")
	return raw != nil && raw.(*meta).InSync
}

// Get returns the object of kind k with the given ID, or nil.
func (s *Snapshot) Get(k Kind, id string) Object {
	raw, err := s.txn.First(k.Plural(), indexID, id)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(Object)
}

// List returns every object of kind k in ID order.
func (s *Snapshot) List(k Kind) []Object {
	return s.collect(s.txn.Get(k.Plural(), indexID))
}

// ListBy returns the objects of kind k whose index (IndexNode, IndexService) equals value.
func (s *Snapshot) ListBy(k Kind, index, value string) []Object {
	return s.collect(s.txn.Get(k.Plural(), index, value))
}

// Count returns how many objects of kind k the snapshot holds.
func (s *Snapshot) Count(k Kind) int {
	it, err := s.txn.Get(k.Plural(), indexID)
	if err != nil {
		return 0
	}
	n := 0
	for o := it.Next(); o != nil; o = it.Next() {
		n++
	}
	return n
}

func (s *Snapshot) collect(it memdb.ResultIterator, err error) []Object {
	if err != nil {
		return nil
	}
	var out []Object
	for o := it.Next(); o != nil; o = it.Next() {
		out = append(out, o.(Object))
	}
	return out
}

// BlocksOfNode returns the blocks whose affinity names node.
func (s *Snapshot) BlocksOfNode(node string) []*Block {
	return typed[*Block](s.ListBy(KindBlock, IndexNode, node))
}

// AffinitiesOfNode returns node's block affinities.
func (s *Snapshot) AffinitiesOfNode(node string) []*BlockAffinity {
	return typed[*BlockAffinity](s.ListBy(KindBlockAffinity, IndexNode, node))
}

// EndpointsOfNode returns the workload endpoints on node.
func (s *Snapshot) EndpointsOfNode(node string) []*WorkloadEndpoint {
	return typed[*WorkloadEndpoint](s.ListBy(KindWorkloadEndpoint, IndexNode, node))
}

// SlicesOfService returns the endpoint slices of the service "namespace/name".
func (s *Snapshot) SlicesOfService(serviceID string) []*EndpointSlice {
	return typed[*EndpointSlice](s.ListBy(KindEndpointSlice, IndexService, serviceID))
}

func typed[T Object](in []Object) []T {
	out := make([]T, len(in))
	for i, o := range in {
		out[i] = o.(T)
	}
	return out
}
