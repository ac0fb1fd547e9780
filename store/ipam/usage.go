package ipam

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/store"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// UsageRow is how much of one pool one node holds: its blocks, the addresses of them in
// use and the addresses of them in total. Node is "" for blocks affine to no host; Pool is
// "" for blocks whose CIDR lies in no pool.
type UsageRow struct {
	Pool, Node           string
	Blocks, InUse, Total int
}

// Usage sums the blocks in etcd per pool and node, sorted by pool then node. Blocks whose
// values do not decode, and blocks marked deleted, are not counted.
func (i *IPAM) Usage(ctx context.Context) ([]UsageRow, error) {
	pools, err := i.pools(ctx)
	if err != nil {
		return nil, fmt.Errorf("summing IPAM usage: %w", err)
	}
	blocks, err := i.Blocks(ctx)
	if err != nil {
		return nil, fmt.Errorf("summing IPAM usage: %w", err)
	}
	rows := map[[2]string]*UsageRow{}
	for _, b := range blocks {
		var pool string
		if p := poolOfBlock(pools, b.CIDR); p != nil {
			pool = p.Name
		}
		k := [2]string{pool, b.AffinityNode}
		r := rows[k]
		if r == nil {
			r = &UsageRow{Pool: pool, Node: b.AffinityNode}
			rows[k] = r
		}
		r.Blocks++
		r.InUse += len(b.Allocations)
		r.Total += store.BlockSlots(b.CIDR)
	}
	out := make([]UsageRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b UsageRow) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Node, b.Node))
	})
	return out, nil
}

// poolOfBlock is the most specific pool that contains the whole block, or nil.
func poolOfBlock(pools []*store.IPPool, c netip.Prefix) *store.IPPool {
	var best *store.IPPool
	for _, p := range pools {
		if p.CIDR.Bits() <= c.Bits() && p.CIDR.Contains(c.Addr()) && (best == nil || p.CIDR.Bits() > best.CIDR.Bits()) {
			best = p
		}
	}
	return best
}

// Blocks lists the blocks in etcd, read in pages at one revision; blocks whose values do not
// decode, and blocks marked deleted, are left out.
func (i *IPAM) Blocks(ctx context.Context) ([]*store.Block, error) {
	var out []*store.Block
	err := i.list(ctx, store.BlockPrefix, false, func(kv *mvccpb.KeyValue) error {
		if obj, err := store.Decode(string(kv.Key), kv.Value); err == nil {
			if b, ok := obj.(*store.Block); ok && !b.Deleted {
				out = append(out, b)
			}
		}
		return nil
	})
	return out, err
}
