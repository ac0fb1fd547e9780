// Package ipam claims IPAM blocks for nodes and assigns and releases workload addresses in
// calico-ipam's own etcd layout, with compare-and-swap transactions, so Calico's tools and
// sluice can share one datastore.
//
// Every write is guarded: a key is created only if its CreateRevision is 0 and changed or
// deleted only if its ModRevision is the one read. A block and the handle counting its
// addresses change in the same transaction, so a crash never leaves a handle that
// undercounts (Release would then miss addresses) or overcounts.
package ipam

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/sluice-net/sluice/store"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sentinel errors callers branch on; returned errors wrap them.
var (
	// ErrBlockTaken: the wanted block exists already (or the node's affinity for it does).
	ErrBlockTaken = errors.New("block already claimed")
	// ErrNotFound: the pool, handle or address is not in etcd.
	ErrNotFound = errors.New("not found")
	// ErrPoolFull: no block of the pool is free and the node's blocks have no room.
	ErrPoolFull = errors.New("pool is full")
	// ErrPoolDisabled: the pool is disabled and hands out nothing.
	ErrPoolDisabled = errors.New("pool is disabled")
	// ErrAddressInUse: the exact address asked for is assigned already.
	ErrAddressInUse = errors.New("address already assigned")
	// ErrConflict: a key kept changing under the compare-and-swap writes.
	ErrConflict = errors.New("keys changed concurrently")
)

// casAttempts bounds the re-read and retry rounds of one compare-and-swap write.
//
// Hazard: compare-and-swap is not fair. With ten writers on one block, a writer that lost
// and backed off competes with ones that just won and came straight back; 15 to 17 rounds
// were needed in tests, so a bound of 10 fails real requests. Calico allows 100.
const casAttempts = 50

// listPage is how many keys one range request returns.
const listPage = 500

// IPAM reads and writes Calico's IPAM keys through one etcd client. It keeps no state
// between calls and takes no locks: etcd's compare-and-swap is the only arbiter, so any
// number of IPAMs in any number of processes, and Calico's own tools, can share one
// datastore.
//
// Hazard: Calico claims a block in three writes (a pending affinity, the block, then the
// affinity confirmed), so an affinity without its block is normal for a moment and a
// leftover one after a crash. Only the block key decides who owns a block: every claim is
// guarded on it, and a node's affinities count only once confirmed and matched by the
// block's own affinity field.
type IPAM struct {
	client *clientv3.Client
}

// New returns an IPAM that uses c; the caller keeps ownership of c.
func New(c *clientv3.Client) *IPAM { return &IPAM{client: c} }

// ClaimBlock claims a free block of pool for node: exactly want when it is valid, else the
// first block-sized CIDR of the pool that has no block key. The block (affine to
// "host:<node>", every slot free) and the node's affinity (state confirmed) are created in
// one transaction guarded by both keys being absent, so of two claimers of one block only
// one wins: the other gets ErrBlockTaken when it wanted that block, or moves on to the next
// free one. ErrPoolFull when no block is free.
func (i *IPAM) ClaimBlock(ctx context.Context, node, pool string, want netip.Prefix) (netip.Prefix, error) {
	what := "claiming a block of pool " + pool + " for node " + node
	if want.IsValid() {
		what = fmt.Sprintf("claiming block %s of pool %s for node %s", want, pool, node)
	}
	if err := checkName("node", node); err != nil {
		return netip.Prefix{}, fmt.Errorf("%s: %w", what, err)
	}
	p, err := i.pool(ctx, pool)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s: %w", what, err)
	}
	if p.Disabled {
		return netip.Prefix{}, fmt.Errorf("%s: %w", what, ErrPoolDisabled)
	}
	got, err := i.claim(ctx, node, p, want)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s: %w", what, err)
	}
	return got, nil
}

// claim is ClaimBlock for a pool already read.
func (i *IPAM) claim(ctx context.Context, node string, p *store.IPPool, want netip.Prefix) (netip.Prefix, error) {
	if want.IsValid() {
		if want.Bits() != p.BlockSize || want.Masked() != want || !p.CIDR.Contains(want.Addr()) {
			return netip.Prefix{}, fmt.Errorf("%s is not a /%d block inside %s", want, p.BlockSize, p.CIDR)
		}
		ok, err := i.createBlock(ctx, node, want)
		if err != nil {
			return netip.Prefix{}, err
		}
		if !ok {
			return netip.Prefix{}, ErrBlockTaken
		}
		return want, nil
	}
	taken := map[netip.Prefix]bool{}
	var odd []netip.Prefix // blocks of another size that overlap the pool
	err := i.list(ctx, store.BlockPrefix+family(p.CIDR.Addr())+"/block/", true, func(kv *mvccpb.KeyValue) error {
		kind, id, err := store.ParseKey(string(kv.Key))
		if err != nil || kind != store.KindBlock {
			return nil // not a block key: cannot collide with one
		}
		c := netip.MustParsePrefix(id)
		if c.Bits() == p.BlockSize {
			taken[c] = true
		} else if c.Overlaps(p.CIDR) {
			odd = append(odd, c)
		}
		return nil
	})
	if err != nil {
		return netip.Prefix{}, err
	}
	step := uint64(store.BlockSlots(netip.PrefixFrom(p.CIDR.Addr(), p.BlockSize)))
	for c := netip.PrefixFrom(p.CIDR.Addr(), p.BlockSize); ; {
		if !taken[c] && !slices.ContainsFunc(odd, c.Overlaps) {
			ok, err := i.createBlock(ctx, node, c)
			if err != nil {
				return netip.Prefix{}, err
			}
			if ok {
				return c, nil
			}
			// Someone else took it between the listing and now: try the next one.
		}
		next := addrAdd(c.Addr(), step)
		if !p.CIDR.Contains(next) || next.Compare(c.Addr()) <= 0 {
			return netip.Prefix{}, ErrPoolFull
		}
		c = netip.PrefixFrom(next, p.BlockSize)
	}
}

// createBlock writes a new block for node and node's confirmed affinity to it in one
// transaction, if neither exists. It reports whether it did.
func (i *IPAM) createBlock(ctx context.Context, node string, cidr netip.Prefix) (bool, error) {
	b := newBlock(cidr, node)
	put, err := b.put()
	if err != nil {
		return false, err
	}
	aff, err := json.Marshal(store.BlockAffinityValue{State: string(store.AffinityConfirmed)})
	if err != nil {
		return false, err
	}
	ak := store.AffinityKey(node, cidr)
	return i.commit(ctx, []clientv3.Cmp{b.cmp(), clientv3.Compare(clientv3.CreateRevision(ak), "=", 0)},
		[]clientv3.Op{put, clientv3.OpPut(ak, string(aff))})
}

// pool reads and decodes one pool.
func (i *IPAM) pool(ctx context.Context, name string) (*store.IPPool, error) {
	if err := checkName("pool", name); err != nil {
		return nil, err
	}
	key := store.IPPoolPrefix + name
	resp, err := i.client.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("pool %s: %w", name, ErrNotFound)
	}
	obj, err := store.Decode(key, resp.Kvs[0].Value)
	if err != nil {
		return nil, err
	}
	return obj.(*store.IPPool), nil
}

// pools reads every pool that decodes, IPv4 before IPv6, each in name order. Pools whose
// values are invalid are left out, as the agent leaves them out.
func (i *IPAM) pools(ctx context.Context) ([]*store.IPPool, error) {
	var pools []*store.IPPool
	err := i.list(ctx, store.IPPoolPrefix, false, func(kv *mvccpb.KeyValue) error {
		if obj, err := store.Decode(string(kv.Key), kv.Value); err == nil {
			pools = append(pools, obj.(*store.IPPool))
		}
		return nil
	})
	slices.SortFunc(pools, func(a, b *store.IPPool) int {
		if a.CIDR.Addr().Is4() != b.CIDR.Addr().Is4() {
			if a.CIDR.Addr().Is4() {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return pools, err
}

// list calls fn for every key under prefix, page by page, all pages read at the revision
// of the first.
func (i *IPAM) list(ctx context.Context, prefix string, keysOnly bool, fn func(*mvccpb.KeyValue) error) error {
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		if keysOnly {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		resp, err := i.client.Get(ctx, from, opts...)
		if err != nil {
			return fmt.Errorf("listing %s: %w", prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if err := fn(kv); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// get reads keys at one revision; a missing key gives nil.
func (i *IPAM) get(ctx context.Context, keys ...string) ([]*mvccpb.KeyValue, error) {
	ops := make([]clientv3.Op, len(keys))
	for n, k := range keys {
		ops[n] = clientv3.OpGet(k)
	}
	resp, err := i.client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", keys[0], err)
	}
	kvs := make([]*mvccpb.KeyValue, len(keys))
	for n, r := range resp.Responses {
		if rr := r.GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			kvs[n] = rr.Kvs[0]
		}
	}
	return kvs, nil
}

// readBlock reads the block cidr; nil when it does not exist.
func (i *IPAM) readBlock(ctx context.Context, cidr netip.Prefix) (*block, error) {
	kvs, err := i.get(ctx, store.BlockKey(cidr))
	if err != nil || kvs[0] == nil {
		return nil, err
	}
	return parseBlock(kvs[0])
}

// readHandle reads a handle; one that does not exist comes back empty with rev 0.
func (i *IPAM) readHandle(ctx context.Context, id string) (*handle, error) {
	kvs, err := i.get(ctx, store.HandleKey(id))
	if err != nil {
		return nil, err
	}
	return parseHandle(id, kvs[0])
}

// commit runs one compare-and-swap transaction and reports whether the comparisons held.
func (i *IPAM) commit(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (bool, error) {
	resp, err := i.client.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, fmt.Errorf("writing: %w", err)
	}
	return resp.Succeeded, nil
}

// backoff sleeps a random while, growing with the attempt, so that writers that lost a
// compare-and-swap do not collide again at once.
func backoff(ctx context.Context, attempt int) error {
	d := rand.N(time.Millisecond << min(attempt, 4))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// blockFor finds the block holding a: the most specific existing block key containing it.
func (i *IPAM) blockFor(ctx context.Context, a netip.Addr) (netip.Prefix, bool, error) {
	var best netip.Prefix
	err := i.list(ctx, store.BlockPrefix+family(a)+"/block/", true, func(kv *mvccpb.KeyValue) error {
		kind, id, err := store.ParseKey(string(kv.Key))
		if err != nil || kind != store.KindBlock {
			return nil
		}
		if c := netip.MustParsePrefix(id); c.Contains(a) && c.Bits() > best.Bits() {
			best = c
		}
		return nil
	})
	return best, best.IsValid(), err
}

// poolFor is the most specific of pools containing a, or nil.
func poolFor(pools []*store.IPPool, a netip.Addr) *store.IPPool {
	var best *store.IPPool
	for _, p := range pools {
		if p.CIDR.Contains(a) && (best == nil || p.CIDR.Bits() > best.CIDR.Bits()) {
			best = p
		}
	}
	return best
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "ipv4"
	}
	return "ipv6"
}
