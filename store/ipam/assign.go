package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/store"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// AssignRequest asks for workload addresses held under one handle on one node.
type AssignRequest struct {
	// Handle is the IPAM handle the addresses are held under (calico-ipam uses
	// "k8s-pod-network.<container id>").
	Handle string
	// Node is the node the workload runs on.
	Node string
	// Pool is the pool to assign from; "" means any enabled pool that allows workloads,
	// IPv4 pools first, then by name. One request never mixes address families.
	Pool string
	// IP, when valid, is the one exact address wanted; Count must then be 0 or 1.
	IP netip.Addr
	// Count is how many addresses to assign when IP is not set.
	Count int
	// Attrs are stored in the allocation's "secondary" attributes, where "node" is
	// always Node.
	Attrs map[string]string
}

// allocated is an address Assign has written, with its block.
type allocated struct {
	addr netip.Addr
	cidr netip.Prefix
}

// Assign gives req.Count addresses, or exactly req.IP, to req.Handle on req.Node.
//
// Addresses come from the blocks affine to the node in the pool, first block first; when
// none has room a new block is claimed (ClaimBlock), and ErrPoolFull is returned when
// there is none left. Every address of a block is handed out, network and broadcast
// addresses too, as calico-ipam does. An exact address may lie in a block affine to
// another node ("borrowed"); its attributes then name the requesting node. Each block
// changes together with the handle's count for it, in one compare-and-swap transaction.
// A request that cannot be met in full gives back the addresses it had taken and
// returns none.
func (i *IPAM) Assign(ctx context.Context, req AssignRequest) ([]netip.Addr, error) {
	of := "any pool"
	if req.Pool != "" {
		of = "pool " + req.Pool
	}
	what := fmt.Sprintf("assigning %d addresses of %s to handle %s on node %s", req.Count, of, req.Handle, req.Node)
	if req.IP.IsValid() {
		what = fmt.Sprintf("assigning %s of %s to handle %s on node %s", req.IP, of, req.Handle, req.Node)
	}
	if err := checkName("handle", req.Handle); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := checkName("node", req.Node); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if req.IP.IsValid() && req.Count > 1 {
		return nil, fmt.Errorf("%s: count %d with an exact address: want 0 or 1", what, req.Count)
	}
	if !req.IP.IsValid() && req.Count < 1 {
		return nil, fmt.Errorf("%s: want a count of at least 1", what)
	}
	pools, err := i.candidatePools(ctx, req.Pool)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	secondary := maps.Clone(req.Attrs)
	if secondary == nil {
		secondary = map[string]string{}
	}
	secondary["node"] = req.Node

	if req.IP.IsValid() {
		a, err := i.assignIP(ctx, req.IP.Unmap(), req.Handle, req.Node, secondary, pools)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		return []netip.Addr{a}, nil
	}
	got, err := i.assignAuto(ctx, req.Handle, req.Node, secondary, pools, req.Count)
	if err != nil {
		if len(got) > 0 {
			// Give back what was taken; even if ctx is what failed.
			if uerr := i.unassign(context.WithoutCancel(ctx), req.Handle, got); uerr != nil {
				err = errors.Join(err, fmt.Errorf("returning the %d addresses already assigned: %w", len(got), uerr))
			}
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	addrs := make([]netip.Addr, len(got))
	for n, g := range got {
		addrs[n] = g.addr
	}
	return addrs, nil
}

// candidatePools is the named pool, or every enabled pool that allows workloads.
func (i *IPAM) candidatePools(ctx context.Context, name string) ([]*store.IPPool, error) {
	if name != "" {
		p, err := i.pool(ctx, name)
		if err != nil {
			return nil, err
		}
		if p.Disabled {
			return nil, fmt.Errorf("pool %s: %w", name, ErrPoolDisabled)
		}
		return []*store.IPPool{p}, nil
	}
	all, err := i.pools(ctx)
	if err != nil {
		return nil, err
	}
	var pools []*store.IPPool
	for _, p := range all {
		if !p.Disabled && (len(p.AllowedUses) == 0 || slices.Contains(p.AllowedUses, "Workload")) {
			pools = append(pools, p)
		}
	}
	if len(pools) == 0 {
		return nil, fmt.Errorf("enabled pool for workloads: %w", ErrNotFound)
	}
	return pools, nil
}

// assignIP assigns exactly ip, claiming its block for node if the block does not exist.
func (i *IPAM) assignIP(ctx context.Context, ip netip.Addr, handleID, node string, secondary map[string]string, pools []*store.IPPool) (netip.Addr, error) {
	pool := poolFor(pools, ip)
	if pool == nil {
		return netip.Addr{}, fmt.Errorf("no candidate pool contains %s: %w", ip, ErrNotFound)
	}
	cidr, found, err := i.blockFor(ctx, ip)
	if err != nil {
		return netip.Addr{}, err
	}
	if !found {
		cidr = netip.PrefixFrom(ip, pool.BlockSize).Masked()
	}
	createLost := false
	for attempt := range casAttempts {
		if attempt > 0 {
			if err := backoff(ctx, attempt); err != nil {
				return netip.Addr{}, err
			}
		}
		kvs, err := i.get(ctx, store.BlockKey(cidr), store.HandleKey(handleID))
		if err != nil {
			return netip.Addr{}, err
		}
		if kvs[0] == nil {
			if createLost {
				// The block is still absent, so what failed the create was node's own
				// affinity for it: a leftover that only an operator should clear.
				return netip.Addr{}, fmt.Errorf("block %s does not exist but node %s has an affinity for it: %w", cidr, node, ErrBlockTaken)
			}
			// No block yet: claim it for the requesting node, then read back whoever's it is.
			ok, err := i.createBlock(ctx, node, cidr)
			if err != nil {
				return netip.Addr{}, err
			}
			createLost = !ok
			continue
		}
		b, err := parseBlock(kvs[0])
		if err != nil {
			return netip.Addr{}, err
		}
		h, err := parseHandle(handleID, kvs[1])
		if err != nil {
			return netip.Addr{}, err
		}
		if b.v.Deleted {
			return netip.Addr{}, fmt.Errorf("block %s is marked deleted", cidr)
		}
		ord, _ := b.ordinal(ip)
		if b.v.Allocations[ord] != nil {
			return netip.Addr{}, ErrAddressInUse
		}
		b.assign([]int{ord}, b.attributeIndex(handleID, secondary))
		b.v.SequenceNumber++
		h.add(cidr.String(), 1)
		ok, err := i.writeBlockAndHandle(ctx, b, h)
		if err != nil {
			return netip.Addr{}, err
		}
		if ok {
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("block %s: %w", cidr, ErrConflict)
}

// assignAuto takes count addresses from node's blocks, claiming blocks as needed, pool by
// pool: a later pool is used only once the earlier ones are full. On error it returns
// what it had assigned so far, for the caller to give back.
func (i *IPAM) assignAuto(ctx context.Context, handleID, node string, secondary map[string]string, pools []*store.IPPool, count int) ([]allocated, error) {
	var got []allocated
	for len(got) < count {
		if err := ctx.Err(); err != nil {
			return got, err
		}
		if len(got) > 0 {
			// Stay in the family of the first address.
			is4 := got[0].addr.Is4()
			pools = slices.DeleteFunc(slices.Clone(pools), func(p *store.IPPool) bool { return p.CIDR.Addr().Is4() != is4 })
		}
		b, err := i.blockWithRoom(ctx, node, pools)
		if err != nil {
			return got, err
		}
		more, err := i.assignInBlock(ctx, b, handleID, node, secondary, count-len(got))
		got = append(got, more...)
		if err != nil {
			return got, err
		}
	}
	return got, nil
}

// blockWithRoom is, in the first pool that has one, the first block affine to node with a
// free slot, or else a block newly claimed for node. ErrPoolFull when no pool has either.
func (i *IPAM) blockWithRoom(ctx context.Context, node string, pools []*store.IPPool) (*block, error) {
	for _, p := range pools {
		b, err := i.affineBlockWithRoom(ctx, node, p)
		if err != nil || b != nil {
			return b, err
		}
		cidr, err := i.claim(ctx, node, p, netip.Prefix{})
		if errors.Is(err, ErrPoolFull) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("claiming a block of pool %s: %w", p.Name, err)
		}
		return i.readBlock(ctx, cidr)
	}
	return nil, ErrPoolFull
}

// affineBlockWithRoom finds the first block of pool p, in address order, that node holds
// a confirmed affinity for, that is affine to node itself and has a free slot.
func (i *IPAM) affineBlockWithRoom(ctx context.Context, node string, p *store.IPPool) (*block, error) {
	var cands []netip.Prefix
	err := i.list(ctx, store.AffinityPrefix+node+"/", false, func(kv *mvccpb.KeyValue) error {
		obj, err := store.Decode(string(kv.Key), kv.Value)
		if err != nil {
			return nil // a broken affinity is not an affinity
		}
		a := obj.(*store.BlockAffinity)
		if a.Node == node && a.State == store.AffinityConfirmed && !a.Deleted &&
			a.CIDR.Bits() >= p.CIDR.Bits() && p.CIDR.Contains(a.CIDR.Addr()) {
			cands = append(cands, a.CIDR)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(cands, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	for _, c := range cands {
		kvs, err := i.get(ctx, store.BlockKey(c))
		if err != nil {
			return nil, err
		}
		if kvs[0] == nil {
			continue
		}
		b, err := parseBlock(kvs[0])
		if err != nil {
			continue // a block that does not decode is left alone
		}
		if !b.v.Deleted && b.hostAffinity(node) && len(b.freeOrdinals()) > 0 {
			return b, nil
		}
	}
	return nil, nil
}

// assignInBlock takes up to n free slots of b, re-reading b after each lost
// compare-and-swap. It returns nothing, without error, once b is full, gone or no longer
// affine to node.
func (i *IPAM) assignInBlock(ctx context.Context, b *block, handleID, node string, secondary map[string]string, n int) ([]allocated, error) {
	for attempt := 0; ; attempt++ {
		if b == nil || b.v.Deleted || !b.hostAffinity(node) {
			return nil, nil
		}
		free := b.freeOrdinals()
		if len(free) == 0 {
			return nil, nil
		}
		h, err := i.readHandle(ctx, handleID)
		if err != nil {
			return nil, err
		}
		take := free[:min(n, len(free))]
		b.assign(take, b.attributeIndex(handleID, secondary))
		b.v.SequenceNumber++
		h.add(b.cidr.String(), len(take))
		ok, err := i.writeBlockAndHandle(ctx, b, h)
		if err != nil {
			return nil, err
		}
		if ok {
			got := make([]allocated, len(take))
			for n, o := range take {
				got[n] = allocated{b.addr(o), b.cidr}
			}
			return got, nil
		}
		if attempt+1 >= casAttempts {
			return nil, fmt.Errorf("block %s: %w", b.cidr, ErrConflict)
		}
		if err := backoff(ctx, attempt); err != nil {
			return nil, err
		}
		// The block read before is spoiled by the changes above: read it afresh.
		kvs, err := i.get(ctx, b.key)
		if err != nil {
			return nil, err
		}
		if kvs[0] == nil {
			return nil, nil
		}
		if b, err = parseBlock(kvs[0]); err != nil {
			return nil, err
		}
	}
}

// writeBlockAndHandle writes b and h in one transaction guarded by both revisions.
func (i *IPAM) writeBlockAndHandle(ctx context.Context, b *block, h *handle) (bool, error) {
	bop, err := b.put()
	if err != nil {
		return false, err
	}
	hop, err := h.op()
	if err != nil {
		return false, err
	}
	return i.commit(ctx, []clientv3.Cmp{b.cmp(), h.cmp()}, []clientv3.Op{bop, hop})
}

// unassign gives back addresses this handle was just given.
func (i *IPAM) unassign(ctx context.Context, handleID string, got []allocated) error {
	byBlock := map[netip.Prefix]map[netip.Addr]bool{}
	for _, g := range got {
		if byBlock[g.cidr] == nil {
			byBlock[g.cidr] = map[netip.Addr]bool{}
		}
		byBlock[g.cidr][g.addr] = true
	}
	var errs []error
	for cidr, addrs := range byBlock {
		_, err := i.freeInBlock(ctx, cidr.String(), func(b *block, ord int) bool {
			return addrs[b.addr(ord)] && b.handleOf(ord) == handleID
		}, "")
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
