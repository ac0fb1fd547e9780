package ipam

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/sluice-net/sluice/store"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// block is one IPAM block as read from etcd, held so that it can be changed and written
// back with a compare-and-swap on the ModRevision it was read at.
//
// Hazard: newer Calico writes fields that store.AllocationBlock does not know
// (affinityClaimTime at the top, owner attributes besides "secondary" inside attributes).
// Decoding into the struct and marshalling it back would silently drop them, so unknown
// top-level fields ride along in extra and every attribute read from etcd is written back
// byte for byte from raw.
type block struct {
	key  string
	cidr netip.Prefix
	rev  int64 // ModRevision when read; 0 for a block not in etcd yet
	// v holds the known fields; v.Attributes is unused (see attrs).
	v     store.AllocationBlock
	attrs []attribute
	extra map[string]json.RawMessage
}

// attribute is one entry of a block's attributes.
type attribute struct {
	handle    *string
	secondary map[string]string
	raw       json.RawMessage // as read from etcd, written back unchanged; nil for a new one
	plain     bool            // raw holds nothing beyond handle_id and secondary
}

var (
	blockFields     = jsonFieldNames(reflect.TypeFor[store.AllocationBlock]())
	attributeFields = jsonFieldNames(reflect.TypeFor[store.AllocationAttribute]())
	handleFields    = jsonFieldNames(reflect.TypeFor[store.IPAMHandle]())
)

// jsonFieldNames lists the JSON names of a struct's fields.
func jsonFieldNames(t reflect.Type) map[string]bool {
	names := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if name != "-" {
			names[name] = true
		}
	}
	return names
}

// newBlock is a block with every slot free, affine to node, as calico-ipam creates it.
func newBlock(cidr netip.Prefix, node string) *block {
	n := store.BlockSlots(cidr)
	affinity := "host:" + node
	b := &block{key: store.BlockKey(cidr), cidr: cidr, v: store.AllocationBlock{
		CIDR:                        cidr.String(),
		Affinity:                    &affinity,
		Allocations:                 make([]*int, n),
		Unallocated:                 make([]int, n),
		SequenceNumberForAllocation: map[string]uint64{},
	}}
	for i := range n {
		b.v.Unallocated[i] = i
	}
	return b
}

// parseBlock validates a stored block with store.Decode and keeps everything needed to
// write it back.
func parseBlock(kv *mvccpb.KeyValue) (*block, error) {
	obj, err := store.Decode(string(kv.Key), kv.Value)
	if err != nil {
		return nil, err
	}
	sb, ok := obj.(*store.Block)
	if !ok {
		return nil, fmt.Errorf("key %s: not an IPAM block", kv.Key)
	}
	b := &block{key: string(kv.Key), cidr: sb.CIDR, rev: kv.ModRevision}
	if err := json.Unmarshal(kv.Value, &b.v); err != nil {
		return nil, fmt.Errorf("key %s: %w", kv.Key, err)
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(kv.Value, &all); err != nil {
		return nil, fmt.Errorf("key %s: %w", kv.Key, err)
	}
	b.extra = unknownFields(all, blockFields)
	var raws []json.RawMessage
	if a := all["attributes"]; len(a) > 0 {
		if err := json.Unmarshal(a, &raws); err != nil {
			return nil, fmt.Errorf("key %s: field attributes: %w", kv.Key, err)
		}
	}
	if len(raws) != len(b.v.Attributes) {
		return nil, fmt.Errorf("key %s: field attributes: %d entries read as %d", kv.Key, len(raws), len(b.v.Attributes))
	}
	for i, a := range b.v.Attributes {
		var fields map[string]json.RawMessage
		plain := json.Unmarshal(raws[i], &fields) == nil && len(unknownFields(fields, attributeFields)) == 0
		b.attrs = append(b.attrs, attribute{handle: a.HandleID, secondary: a.Secondary, raw: raws[i], plain: plain})
	}
	b.v.Attributes = nil
	return b, nil
}

func unknownFields(all map[string]json.RawMessage, known map[string]bool) map[string]json.RawMessage {
	var extra map[string]json.RawMessage
	for k, v := range all {
		if !known[k] {
			if extra == nil {
				extra = map[string]json.RawMessage{}
			}
			extra[k] = v
		}
	}
	return extra
}

// encode renders the block as calico-ipam stores it.
func (b *block) encode() ([]byte, error) {
	v := b.v
	v.Attributes = []store.AllocationAttribute{}
	if v.SequenceNumberForAllocation == nil {
		v.SequenceNumberForAllocation = map[string]uint64{}
	}
	base, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var attrs bytes.Buffer
	attrs.WriteByte('[')
	for i, a := range b.attrs {
		if i > 0 {
			attrs.WriteByte(',')
		}
		raw := a.raw
		if raw == nil {
			if raw, err = json.Marshal(store.AllocationAttribute{HandleID: a.handle, Secondary: a.secondary}); err != nil {
				return nil, err
			}
		}
		attrs.Write(raw)
	}
	attrs.WriteByte(']')
	return spliceObject(base, map[string]json.RawMessage{"attributes": attrs.Bytes()}, b.extra)
}

// spliceObject rewrites the JSON object base keeping its key order, with the values in
// replace substituted and the fields of extra that base lacks appended in key order.
func spliceObject(base []byte, replace, extra map[string]json.RawMessage) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(base))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("splicing JSON: want an object, got %v (%v)", tok, err)
	}
	var out bytes.Buffer
	out.WriteByte('{')
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("splicing JSON: %w", err)
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, fmt.Errorf("splicing JSON: %w", err)
		}
		if r, ok := replace[key]; ok {
			val = r
		}
		writeField(&out, key, val, len(seen) > 0)
		seen[key] = true
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		if !seen[k] {
			writeField(&out, k, extra[k], len(seen) > 0)
			seen[k] = true
		}
	}
	out.WriteByte('}')
	return out.Bytes(), nil
}

func writeField(out *bytes.Buffer, key string, val json.RawMessage, comma bool) {
	if comma {
		out.WriteByte(',')
	}
	k, _ := json.Marshal(key)
	out.Write(k)
	out.WriteByte(':')
	out.Write(val)
}

// cmp guards a write of b: the block is unchanged since it was read, or still absent.
func (b *block) cmp() clientv3.Cmp {
	if b.rev == 0 {
		return clientv3.Compare(clientv3.CreateRevision(b.key), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(b.key), "=", b.rev)
}

func (b *block) put() (clientv3.Op, error) {
	val, err := b.encode()
	if err != nil {
		return clientv3.Op{}, fmt.Errorf("encoding block %s: %w", b.cidr, err)
	}
	return clientv3.OpPut(b.key, string(val)), nil
}

// hostAffinity reports whether the block's own affinity field names node.
func (b *block) hostAffinity(node string) bool {
	return b.v.Affinity != nil && *b.v.Affinity == "host:"+node
}

// addr is the address of slot ord.
func (b *block) addr(ord int) netip.Addr { return addrAdd(b.cidr.Addr(), uint64(ord)) }

// ordinal is the slot of a, if a is in the block.
func (b *block) ordinal(a netip.Addr) (int, bool) {
	if !b.cidr.Contains(a) {
		return 0, false
	}
	base, x := b.cidr.Addr().As16(), a.As16()
	return int(binary.BigEndian.Uint64(x[8:]) - binary.BigEndian.Uint64(base[8:])), true
}

// freeOrdinals lists the slots that can be handed out, in the order of unallocated
// (Calico hands them out front first and returns released ones to the back). Entries that
// are out of range, repeated or already allocated are skipped.
func (b *block) freeOrdinals() []int {
	seen := make(map[int]bool, len(b.v.Unallocated))
	var free []int
	for _, o := range b.v.Unallocated {
		if o < 0 || o >= len(b.v.Allocations) || seen[o] || b.v.Allocations[o] != nil {
			continue
		}
		seen[o] = true
		free = append(free, o)
	}
	return free
}

// attributeIndex finds the attribute {handle, secondary} or adds it, like Calico's
// findOrAddAttribute. An attribute carrying fields sluice does not know never matches.
func (b *block) attributeIndex(handle string, secondary map[string]string) int {
	for i, a := range b.attrs {
		if a.plain && a.handle != nil && *a.handle == handle && maps.Equal(a.secondary, secondary) {
			return i
		}
	}
	b.attrs = append(b.attrs, attribute{handle: &handle, secondary: maps.Clone(secondary)})
	return len(b.attrs) - 1
}

// assign gives the free slots ords to attribute attr, takes them off unallocated and
// stamps each with the block's current sequence number, as calico-ipam does.
func (b *block) assign(ords []int, attr int) {
	taking := make(map[int]bool, len(ords))
	if b.v.SequenceNumberForAllocation == nil {
		b.v.SequenceNumberForAllocation = map[string]uint64{}
	}
	for _, o := range ords {
		idx := attr
		b.v.Allocations[o] = &idx
		b.v.SequenceNumberForAllocation[strconv.Itoa(o)] = b.v.SequenceNumber
		taking[o] = true
	}
	b.v.Unallocated = slices.DeleteFunc(b.v.Unallocated, func(o int) bool { return taking[o] })
}

// handleOf is the handle holding slot ord, or "".
func (b *block) handleOf(ord int) string {
	a := b.v.Allocations[ord]
	if a == nil || *a < 0 || *a >= len(b.attrs) || b.attrs[*a].handle == nil {
		return ""
	}
	return *b.attrs[*a].handle
}

// release frees the allocated slots ords as Calico does: attributes no longer referenced
// are dropped and the remaining allocation indexes renumbered, the slots go to the back of
// unallocated and lose their sequence numbers. It returns how many slots each handle lost.
func (b *block) release(ords []int) map[string]int {
	ords = slices.Clone(ords)
	sort.Ints(ords)
	lost := map[string]int{}
	releasing := map[int]int{} // attribute index -> slots of it being freed
	for _, o := range ords {
		releasing[*b.v.Allocations[o]]++
		if h := b.handleOf(o); h != "" {
			lost[h]++
		}
	}
	refs := map[int]int{}
	for _, a := range b.v.Allocations {
		if a != nil {
			refs[*a]++
		}
	}
	drop := map[int]bool{}
	for idx, n := range releasing {
		if refs[idx] == n {
			drop[idx] = true
		}
	}
	if len(drop) > 0 {
		renumber := make([]int, len(b.attrs))
		var kept []attribute
		for i, a := range b.attrs {
			renumber[i] = len(kept)
			if !drop[i] {
				kept = append(kept, a)
			}
		}
		b.attrs = kept
		for o, a := range b.v.Allocations {
			if a != nil && !drop[*a] {
				idx := renumber[*a]
				b.v.Allocations[o] = &idx
			}
		}
	}
	for _, o := range ords {
		b.v.Allocations[o] = nil
		b.v.Unallocated = append(b.v.Unallocated, o)
		delete(b.v.SequenceNumberForAllocation, strconv.Itoa(o))
	}
	return lost
}

// handle is one IPAM handle as read from etcd (or about to be created).
type handle struct {
	id    string
	key   string
	rev   int64 // ModRevision when read; 0 when absent
	v     store.IPAMHandle
	extra map[string]json.RawMessage
}

func newHandle(id string) *handle {
	return &handle{id: id, key: store.HandleKey(id), v: store.IPAMHandle{Block: map[string]int{}}}
}

// parseHandle reads a stored handle; kv nil means there is none yet.
func parseHandle(id string, kv *mvccpb.KeyValue) (*handle, error) {
	h := newHandle(id)
	if kv == nil {
		return h, nil
	}
	h.rev = kv.ModRevision
	if err := json.Unmarshal(kv.Value, &h.v); err != nil {
		return nil, fmt.Errorf("key %s: %w", kv.Key, err)
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(kv.Value, &all); err != nil {
		return nil, fmt.Errorf("key %s: %w", kv.Key, err)
	}
	h.extra = unknownFields(all, handleFields)
	if h.v.Block == nil {
		h.v.Block = map[string]int{}
	}
	return h, nil
}

func (h *handle) exists() bool { return h.rev != 0 }

// add changes the handle's count for block cidr by n, dropping the entry at zero.
func (h *handle) add(cidr string, n int) {
	if c := h.v.Block[cidr] + n; c > 0 {
		h.v.Block[cidr] = c
	} else {
		delete(h.v.Block, cidr)
	}
}

func (h *handle) cmp() clientv3.Cmp {
	if h.rev == 0 {
		return clientv3.Compare(clientv3.CreateRevision(h.key), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(h.key), "=", h.rev)
}

// op writes the handle back, or deletes it once it holds nothing.
func (h *handle) op() (clientv3.Op, error) {
	if len(h.v.Block) == 0 {
		return clientv3.OpDelete(h.key), nil
	}
	base, err := json.Marshal(h.v)
	if err != nil {
		return clientv3.Op{}, fmt.Errorf("encoding handle %s: %w", h.id, err)
	}
	val, err := spliceObject(base, nil, h.extra)
	if err != nil {
		return clientv3.Op{}, fmt.Errorf("encoding handle %s: %w", h.id, err)
	}
	return clientv3.OpPut(h.key, string(val)), nil
}

// addrAdd is a+n. Past the end of a's family the result is not of a's family (or, for
// IPv6, wraps), which callers catch with Prefix.Contains or Compare.
func addrAdd(a netip.Addr, n uint64) netip.Addr {
	x := a.As16()
	hi, lo := binary.BigEndian.Uint64(x[:8]), binary.BigEndian.Uint64(x[8:])
	sum := lo + n
	if sum < lo {
		hi++
	}
	binary.BigEndian.PutUint64(x[:8], hi)
	binary.BigEndian.PutUint64(x[8:], sum)
	r := netip.AddrFrom16(x)
	if a.Is4() {
		return r.Unmap()
	}
	return r
}

// checkName rejects names that cannot be a single etcd key segment.
func checkName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s name is empty", what)
	}
	if strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%s name %q contains '/'", what, name)
	}
	return nil
}
