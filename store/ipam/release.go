package ipam

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Release frees every address held by handle, in each block the handle counts addresses
// in, and deletes the handle with its last block. Attributes no longer referenced are
// dropped and the allocation indexes renumbered as calico-ipam does. It returns the freed
// addresses in address order; ErrNotFound when the handle does not exist.
func (i *IPAM) Release(ctx context.Context, handleID string) ([]netip.Addr, error) {
	what := "releasing handle " + handleID
	if err := checkName("handle", handleID); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	h, err := i.readHandle(ctx, handleID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if !h.exists() {
		return nil, fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	var freed []netip.Addr
	for _, key := range slices.Sorted(maps.Keys(h.v.Block)) {
		addrs, err := i.freeInBlock(ctx, key, func(b *block, ord int) bool { return b.handleOf(ord) == handleID }, handleID)
		freed = append(freed, addrs...)
		if err != nil {
			return freed, fmt.Errorf("%s: block %s: %w", what, key, err)
		}
	}
	// A handle that counted no block at all is deleted here; the others went with the
	// last of their blocks. One that gained a block meanwhile is left alone.
	if h, err = i.readHandle(ctx, handleID); err != nil {
		return freed, fmt.Errorf("%s: %w", what, err)
	}
	if h.exists() && len(h.v.Block) == 0 {
		if _, err := i.commit(ctx, []clientv3.Cmp{h.cmp()}, []clientv3.Op{clientv3.OpDelete(h.key)}); err != nil {
			return freed, fmt.Errorf("%s: %w", what, err)
		}
	}
	slices.SortFunc(freed, netip.Addr.Compare)
	return freed, nil
}

// ReleaseIP frees ip, whichever handle holds it, and takes it off that handle's count
// (deleting the handle when that was its last address). ErrNotFound when no block holds
// ip as allocated.
func (i *IPAM) ReleaseIP(ctx context.Context, ip netip.Addr) error {
	ip = ip.Unmap()
	what := fmt.Sprintf("releasing ip %s", ip)
	if !ip.IsValid() {
		return fmt.Errorf("releasing ip: no address given")
	}
	cidr, found, err := i.blockFor(ctx, ip)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if !found {
		return fmt.Errorf("%s: %w in any block", what, ErrNotFound)
	}
	freed, err := i.freeInBlock(ctx, cidr.String(), func(b *block, ord int) bool { return b.addr(ord) == ip }, "")
	if err != nil {
		return fmt.Errorf("%s: block %s: %w", what, cidr, err)
	}
	if len(freed) == 0 {
		return fmt.Errorf("%s: %w among the allocations of block %s", what, ErrNotFound, cidr)
	}
	return nil
}

// freeInBlock frees the allocated slots of block cidrKey that pick chooses, and in the
// same transaction takes them off their handles' counts. With dropFrom set, that handle's
// entry for the block goes entirely (it is being released), even when the block holds
// nothing of it any more or no longer exists. cidrKey is the block's CIDR as handles
// spell it.
func (i *IPAM) freeInBlock(ctx context.Context, cidrKey string, pick func(b *block, ord int) bool, dropFrom string) ([]netip.Addr, error) {
	cidr, perr := netip.ParsePrefix(cidrKey)
	valid := perr == nil && cidr.Masked() == cidr
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if attempt >= casAttempts {
				return nil, ErrConflict
			}
			if err := backoff(ctx, attempt); err != nil {
				return nil, err
			}
		}
		var b *block
		if valid {
			kvs, err := i.get(ctx, store.BlockKey(cidr))
			if err != nil {
				return nil, err
			}
			if kvs[0] != nil {
				if b, err = parseBlock(kvs[0]); err != nil {
					return nil, err
				}
			}
		}
		var ords []int
		ids := map[string]bool{}
		if dropFrom != "" {
			ids[dropFrom] = true
		}
		if b != nil {
			for o, a := range b.v.Allocations {
				if a != nil && pick(b, o) {
					ords = append(ords, o)
					if h := b.handleOf(o); h != "" {
						ids[h] = true
					}
				}
			}
		}
		handles, err := i.readHandles(ctx, slices.Sorted(maps.Keys(ids)))
		if err != nil {
			return nil, err
		}
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		var freed []netip.Addr
		changed := map[string]bool{}
		if len(ords) > 0 {
			for _, o := range ords {
				freed = append(freed, b.addr(o))
			}
			for id, n := range b.release(ords) {
				if h := handles[id]; h != nil && h.exists() {
					h.add(cidrKey, -n)
					changed[id] = true
				}
			}
			b.v.SequenceNumber++
			put, err := b.put()
			if err != nil {
				return nil, err
			}
			cmps, ops = append(cmps, b.cmp()), append(ops, put)
		}
		if h := handles[dropFrom]; h != nil && h.exists() {
			if _, ok := h.v.Block[cidrKey]; ok {
				delete(h.v.Block, cidrKey)
				changed[dropFrom] = true
			}
		}
		for _, id := range slices.Sorted(maps.Keys(changed)) {
			op, err := handles[id].op()
			if err != nil {
				return nil, err
			}
			cmps, ops = append(cmps, handles[id].cmp()), append(ops, op)
		}
		if len(ops) == 0 {
			return nil, nil
		}
		ok, err := i.commit(ctx, cmps, ops)
		if err != nil {
			return nil, err
		}
		if ok {
			return freed, nil
		}
	}
}

// readHandles reads handles at one revision.
func (i *IPAM) readHandles(ctx context.Context, ids []string) (map[string]*handle, error) {
	handles := map[string]*handle{}
	if len(ids) == 0 {
		return handles, nil
	}
	keys := make([]string, len(ids))
	for n, id := range ids {
		keys[n] = store.HandleKey(id)
	}
	kvs, err := i.get(ctx, keys...)
	if err != nil {
		return nil, err
	}
	for n, id := range ids {
		if handles[id], err = parseHandle(id, kvs[n]); err != nil {
			return nil, err
		}
	}
	return handles, nil
}
