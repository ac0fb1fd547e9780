package ipam_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	"github.com/sluice-net/sluice/store/ipam"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newIPAM(t *testing.T) (*ipam.IPAM, *clientv3.Client) {
	t.Helper()
	c := newClient(t, etcdtest.New(t))
	return ipam.New(c), c
}

func newClient(t *testing.T, srv *etcdtest.Server) *clientv3.Client {
	t.Helper()
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// separateIPAMs gives each of n writers its own IPAM on its own client, as separate
// sluicectl processes would have.
func separateIPAMs(t *testing.T, srv *etcdtest.Server, n int) []*ipam.IPAM {
	t.Helper()
	ms := make([]*ipam.IPAM, n)
	for k := range ms {
		ms[k] = ipam.New(newClient(t, srv))
	}
	return ms
}

func putPool(t *testing.T, c *clientv3.Client, name, cidr string, blockSize int, disabled bool) {
	t.Helper()
	r := store.IPPoolResource{
		TypeMeta: store.TypeMeta{Kind: "IPPool", APIVersion: store.CalicoAPIVersion},
		Metadata: store.ObjectMeta{Name: name},
		Spec:     store.IPPoolSpec{CIDR: cidr, BlockSize: blockSize, Disabled: disabled, VXLANMode: "Always"},
	}
	v, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	put(t, c, store.IPPoolPrefix+name, string(v))
}

func put(t *testing.T, c *clientv3.Client, key, value string) {
	t.Helper()
	if _, err := c.Put(context.Background(), key, value); err != nil {
		t.Fatal(err)
	}
}

// get returns the value under key, or "" when there is none.
func get(t *testing.T, c *clientv3.Client, key string) string {
	t.Helper()
	resp, err := c.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

func keys(t *testing.T, c *clientv3.Client, prefix string) []string {
	t.Helper()
	resp, err := c.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var ks []string
	for _, kv := range resp.Kvs {
		ks = append(ks, string(kv.Key))
	}
	return ks
}

func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr     { return netip.MustParseAddr(s) }

// checkStored checks every IPAM value in etcd: blocks and affinities decode with
// store.Decode, handles decode strictly, each block is internally consistent, and the
// handles count exactly the addresses the blocks give them. It returns the decoded blocks.
func checkStored(t *testing.T, c *clientv3.Client) map[netip.Prefix]*store.Block {
	t.Helper()
	ctx := context.Background()
	blocks := map[netip.Prefix]*store.Block{}
	fromBlocks := map[string]map[string]int{}
	resp, err := c.Get(ctx, store.BlockPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		obj, err := store.Decode(string(kv.Key), kv.Value)
		if err != nil {
			t.Errorf("stored block does not decode: %v", err)
			continue
		}
		b := obj.(*store.Block)
		blocks[b.CIDR] = b
		var raw store.AllocationBlock
		if err := json.Unmarshal(kv.Value, &raw); err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for _, o := range raw.Unallocated {
			if o < 0 || o >= len(raw.Allocations) || seen[o] || raw.Allocations[o] != nil {
				t.Errorf("block %s: unallocated entry %d is out of range, repeated or allocated", b.CIDR, o)
			}
			seen[o] = true
		}
		used := map[int]bool{}
		for o, a := range raw.Allocations {
			if a == nil {
				if !seen[o] {
					t.Errorf("block %s: free slot %d missing from unallocated", b.CIDR, o)
				}
				continue
			}
			used[*a] = true
			if _, ok := raw.SequenceNumberForAllocation[fmt.Sprint(o)]; !ok {
				t.Errorf("block %s: slot %d has no sequence number", b.CIDR, o)
			}
		}
		if len(raw.SequenceNumberForAllocation) != len(b.Allocations) {
			t.Errorf("block %s: %d sequence numbers for %d allocations", b.CIDR, len(raw.SequenceNumberForAllocation), len(b.Allocations))
		}
		if len(used) != len(raw.Attributes) {
			t.Errorf("block %s: %d attributes, %d of them referenced", b.CIDR, len(raw.Attributes), len(used))
		}
		for _, al := range b.Allocations {
			if fromBlocks[al.Handle] == nil {
				fromBlocks[al.Handle] = map[string]int{}
			}
			fromBlocks[al.Handle][b.CIDR.String()]++
		}
	}
	resp, err = c.Get(ctx, store.AffinityPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if _, err := store.Decode(string(kv.Key), kv.Value); err != nil {
			t.Errorf("stored affinity does not decode: %v", err)
		}
	}
	fromHandles := map[string]map[string]int{}
	resp, err = c.Get(ctx, store.HandlePrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		var h store.IPAMHandle
		dec := json.NewDecoder(bytes.NewReader(kv.Value))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&h); err != nil {
			t.Errorf("stored handle %s does not decode: %v", kv.Key, err)
		}
		if len(h.Block) == 0 || h.Deleted {
			t.Errorf("stored handle %s is empty or deleted: %s", kv.Key, kv.Value)
		}
		fromHandles[strings.TrimPrefix(string(kv.Key), store.HandlePrefix)] = h.Block
	}
	if !reflect.DeepEqual(fromBlocks, fromHandles) && (len(fromBlocks) > 0 || len(fromHandles) > 0) {
		t.Errorf("handles count %v, blocks hold %v", fromHandles, fromBlocks)
	}
	return blocks
}

func TestClaimBlockWritesCalicoLayout(t *testing.T) {
	m, c := newIPAM(t)
	ctx := context.Background()
	putPool(t, c, "pool-a", "10.65.0.0/16", 29, false)

	got, err := m.ClaimBlock(ctx, "node-a", "pool-a", netip.Prefix{})
	if err != nil || got != prefix("10.65.0.0/29") {
		t.Fatalf("first claim = %v, %v; want 10.65.0.0/29", got, err)
	}
	got, err = m.ClaimBlock(ctx, "node-b", "pool-a", netip.Prefix{})
	if err != nil || got != prefix("10.65.0.8/29") {
		t.Fatalf("second claim = %v, %v; want 10.65.0.8/29", got, err)
	}
	wantBlock := `{"cidr":"10.65.0.8/29","affinity":"host:node-b","strictAffinity":false,` +
		`"allocations":[null,null,null,null,null,null,null,null],"unallocated":[0,1,2,3,4,5,6,7],` +
		`"attributes":[],"deleted":false,"sequenceNumber":0,"sequenceNumberForAllocation":{}}`
	if v := get(t, c, "/calico/ipam/v2/assignment/ipv4/block/10.65.0.8-29"); v != wantBlock {
		t.Errorf("block value\n got %s\nwant %s", v, wantBlock)
	}
	wantAffinity := `{"state":"confirmed","deleted":false}`
	if v := get(t, c, "/calico/ipam/v2/host/node-b/ipv4/block/10.65.0.8-29"); v != wantAffinity {
		t.Errorf("affinity value\n got %s\nwant %s", v, wantAffinity)
	}
	blocks := checkStored(t, c)
	if b := blocks[prefix("10.65.0.8/29")]; b == nil || b.AffinityNode != "node-b" || len(b.Allocations) != 0 {
		t.Errorf("decoded block = %+v", b)
	}

	if _, err := m.ClaimBlock(ctx, "node-c", "pool-a", prefix("10.65.0.8/29")); !errors.Is(err, ipam.ErrBlockTaken) {
		t.Errorf("claiming a taken block: %v, want ErrBlockTaken", err)
	}
	got, err = m.ClaimBlock(ctx, "node-c", "pool-a", prefix("10.65.7.16/29"))
	if err != nil || got != prefix("10.65.7.16/29") {
		t.Errorf("claiming a wanted free block = %v, %v", got, err)
	}
	for _, bad := range []string{"10.65.0.16/28", "10.66.0.0/29", "10.65.0.17/29"} {
		_, err := m.ClaimBlock(ctx, "node-c", "pool-a", prefix(bad))
		if err == nil || errors.Is(err, ipam.ErrBlockTaken) || !strings.Contains(err.Error(), "pool-a") {
			t.Errorf("claiming %s: %v, want an error naming the pool", bad, err)
		}
	}
	if _, err := m.ClaimBlock(ctx, "node-c", "nope", netip.Prefix{}); !errors.Is(err, ipam.ErrNotFound) {
		t.Errorf("claiming from a missing pool: %v, want ErrNotFound", err)
	}
	putPool(t, c, "pool-off", "10.66.0.0/16", 26, true)
	if _, err := m.ClaimBlock(ctx, "node-c", "pool-off", netip.Prefix{}); !errors.Is(err, ipam.ErrPoolDisabled) {
		t.Errorf("claiming from a disabled pool: %v, want ErrPoolDisabled", err)
	}
	if _, err := m.ClaimBlock(ctx, "", "pool-a", netip.Prefix{}); err == nil {
		t.Error("claiming for no node succeeded")
	}
}

func TestClaimSameBlockConcurrently(t *testing.T) {
	srv := etcdtest.New(t)
	c := newClient(t, srv)
	putPool(t, c, "pool-a", "10.65.0.0/16", 26, false)
	want := prefix("10.65.0.64/26")
	const n = 8
	ms := separateIPAMs(t, srv, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			<-start
			_, errs[g] = ms[g].ClaimBlock(context.Background(), fmt.Sprintf("node-%d", g), "pool-a", want)
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for g, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Errorf("nodes %d and %d both claimed %s", winner, g, want)
			}
			winner = g
		case !errors.Is(err, ipam.ErrBlockTaken):
			t.Errorf("node-%d: %v, want ErrBlockTaken", g, err)
		}
	}
	if winner < 0 {
		t.Fatal("nobody claimed the block")
	}
	if b := keys(t, c, store.BlockPrefix); len(b) != 1 {
		t.Errorf("blocks in etcd: %v, want one", b)
	}
	if a := keys(t, c, store.AffinityPrefix); len(a) != 1 || a[0] != store.AffinityKey(fmt.Sprintf("node-%d", winner), want) {
		t.Errorf("affinities in etcd: %v, want only node-%d's", a, winner)
	}
	if b := checkStored(t, c)[want]; b == nil || b.AffinityNode != fmt.Sprintf("node-%d", winner) {
		t.Errorf("block = %+v, want affine to node-%d", b, winner)
	}
}

func TestClaimAnyConcurrently(t *testing.T) {
	srv := etcdtest.New(t)
	c := newClient(t, srv)
	putPool(t, c, "pool-a", "10.65.0.0/16", 26, false)
	const n = 8
	ms := separateIPAMs(t, srv, n)
	got := make([]netip.Prefix, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			<-start
			var err error
			got[g], err = ms[g].ClaimBlock(context.Background(), fmt.Sprintf("node-%d", g), "pool-a", netip.Prefix{})
			if err != nil {
				t.Errorf("node-%d: %v", g, err)
			}
		})
	}
	close(start)
	wg.Wait()
	// Nothing is ever skipped unless taken, so the claims fill the pool's first n blocks.
	var want []netip.Prefix
	for k := range n {
		want = append(want, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 65, byte(k / 4), byte(k % 4 * 64)}), 26))
	}
	sorted := slices.Clone(got)
	slices.SortFunc(sorted, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if !slices.Equal(sorted, want) {
		t.Errorf("claimed %v, want %v", sorted, want)
	}
	blocks := checkStored(t, c)
	if len(blocks) != n || len(keys(t, c, store.AffinityPrefix)) != n {
		t.Errorf("%d blocks and %d affinities in etcd, want %d of each", len(blocks), len(keys(t, c, store.AffinityPrefix)), n)
	}
	for g, p := range got {
		node := fmt.Sprintf("node-%d", g)
		if b := blocks[p]; b == nil || b.AffinityNode != node {
			t.Errorf("block %s = %+v, want affine to %s", p, b, node)
		}
		if get(t, c, store.AffinityKey(node, p)) == "" {
			t.Errorf("no affinity of %s for %s", node, p)
		}
	}
}

func TestAssignConcurrentlyAndRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	srv := etcdtest.New(t)
	c := newClient(t, srv)
	m := ipam.New(c)
	ctx := context.Background()
	putPool(t, c, "pool-a", "10.65.0.0/16", 26, false)
	const goroutines, perGoroutine = 10, 50
	ms := separateIPAMs(t, srv, goroutines)
	got := make([][]netip.Addr, goroutines)
	var handles []string
	for g := range goroutines {
		handles = append(handles, fmt.Sprintf("bulk-%d", g))
		for k := range perGoroutine / 2 {
			handles = append(handles, fmt.Sprintf("one-%d-%d", g, k))
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			<-start
			// Half in one request of 25 (it may span blocks), half one at a time.
			a, err := ms[g].Assign(ctx, ipam.AssignRequest{Handle: fmt.Sprintf("bulk-%d", g), Node: "node-a", Pool: "pool-a",
				Count: perGoroutine / 2, Attrs: map[string]string{"namespace": "ns", "pod": fmt.Sprintf("bulk-%d", g)}})
			if err != nil {
				t.Errorf("bulk-%d: %v", g, err)
			}
			got[g] = append(got[g], a...)
			for k := range perGoroutine / 2 {
				a, err := ms[g].Assign(ctx, ipam.AssignRequest{Handle: fmt.Sprintf("one-%d-%d", g, k), Node: "node-a", Count: 1})
				if err != nil || len(a) != 1 {
					t.Errorf("one-%d-%d: %v, %v", g, k, a, err)
				}
				got[g] = append(got[g], a...)
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	all := map[netip.Addr]bool{}
	for _, as := range got {
		for _, a := range as {
			if all[a] {
				t.Errorf("%s handed out twice", a)
			}
			if !prefix("10.65.0.0/16").Contains(a) {
				t.Errorf("%s is outside the pool", a)
			}
			all[a] = true
		}
	}
	if len(all) != goroutines*perGoroutine {
		t.Fatalf("%d distinct addresses, want %d", len(all), goroutines*perGoroutine)
	}
	blocks := checkStored(t, c) // also: handle counts match the blocks
	inUse := 0
	for p, b := range blocks {
		if b.AffinityNode != "node-a" {
			t.Errorf("block %s affine to %q", p, b.AffinityNode)
		}
		inUse += len(b.Allocations)
	}
	if inUse != len(all) || len(blocks) < 8 {
		t.Errorf("%d blocks hold %d addresses, want at least 8 holding %d", len(blocks), inUse, len(all))
	}
	for _, h := range handles {
		var v store.IPAMHandle
		if err := json.Unmarshal([]byte(get(t, c, store.HandleKey(h))), &v); err != nil {
			t.Fatalf("handle %s: %v", h, err)
		}
		sum := 0
		for _, n := range v.Block {
			sum += n
		}
		want := 1
		if strings.HasPrefix(h, "bulk-") {
			want = perGoroutine / 2
		}
		if sum != want {
			t.Errorf("handle %s counts %d addresses, want %d", h, sum, want)
		}
	}
	rows, err := m.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []ipam.UsageRow{{Pool: "pool-a", Node: "node-a", Blocks: len(blocks), InUse: len(all), Total: 64 * len(blocks)}}; !reflect.DeepEqual(rows, want) {
		t.Errorf("usage = %+v, want %+v", rows, want)
	}

	// Release every handle, concurrently.
	released := make([][]netip.Addr, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for n := g; n < len(handles); n += goroutines {
				a, err := ms[g].Release(ctx, handles[n])
				if err != nil {
					t.Errorf("releasing %s: %v", handles[n], err)
				}
				released[g] = append(released[g], a...)
			}
		})
	}
	wg.Wait()
	back := map[netip.Addr]bool{}
	for _, as := range released {
		for _, a := range as {
			back[a] = true
		}
	}
	if !maps.Equal(back, all) {
		t.Errorf("released %d addresses, want the %d assigned", len(back), len(all))
	}
	for p, b := range checkStored(t, c) {
		if len(b.Allocations) != 0 {
			t.Errorf("block %s still holds %v", p, b.Allocations)
		}
		var raw store.AllocationBlock
		if err := json.Unmarshal([]byte(get(t, c, store.BlockKey(p))), &raw); err != nil {
			t.Fatal(err)
		}
		if len(raw.Attributes) != 0 || len(raw.Unallocated) != 64 || len(raw.SequenceNumberForAllocation) != 0 || slices.ContainsFunc(raw.Allocations, func(a *int) bool { return a != nil }) {
			t.Errorf("block %s not all free: %+v", p, raw)
		}
	}
	if h := keys(t, c, store.HandlePrefix); len(h) != 0 {
		t.Errorf("handles left after release: %v", h)
	}
	if _, err := m.Release(ctx, "bulk-0"); !errors.Is(err, ipam.ErrNotFound) || !strings.Contains(err.Error(), "bulk-0") {
		t.Errorf("releasing a released handle: %v, want ErrNotFound naming it", err)
	}
}

func TestReleaseRenumbersAttributesLikeCalico(t *testing.T) {
	m, c := newIPAM(t)
	ctx := context.Background()
	putPool(t, c, "pool-a", "10.65.0.0/16", 26, false)
	for _, r := range []struct {
		handle string
		n      int
	}{{"h1", 1}, {"h2", 2}, {"h3", 1}} {
		if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: r.handle, Node: "node-a", Pool: "pool-a", Count: r.n}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := m.Release(ctx, "h2")
	if err != nil || !slices.Equal(got, []netip.Addr{addr("10.65.0.1"), addr("10.65.0.2")}) {
		t.Fatalf("release h2 = %v, %v", got, err)
	}
	var b store.AllocationBlock
	if err := json.Unmarshal([]byte(get(t, c, "/calico/ipam/v2/assignment/ipv4/block/10.65.0.0-26")), &b); err != nil {
		t.Fatal(err)
	}
	zero, one := 0, 1
	want := store.AllocationBlock{CIDR: "10.65.0.0/26", Allocations: make([]*int, 64), SequenceNumber: 4,
		SequenceNumberForAllocation: map[string]uint64{"0": 0, "3": 2}}
	want.Affinity = b.Affinity
	want.Allocations[0], want.Allocations[3] = &zero, &one
	for o := 4; o < 64; o++ {
		want.Unallocated = append(want.Unallocated, o)
	}
	want.Unallocated = append(want.Unallocated, 1, 2)
	h1, h3 := "h1", "h3"
	want.Attributes = []store.AllocationAttribute{
		{HandleID: &h1, Secondary: map[string]string{"node": "node-a"}},
		{HandleID: &h3, Secondary: map[string]string{"node": "node-a"}},
	}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("block after release\n got %+v\nwant %+v", b, want)
	}
	if v := get(t, c, store.HandleKey("h1")); v != `{"block":{"10.65.0.0/26":1},"deleted":false}` {
		t.Errorf("handle h1 = %s", v)
	}
	if v := get(t, c, store.HandleKey("h2")); v != "" {
		t.Errorf("handle h2 still there: %s", v)
	}
	checkStored(t, c)
}

func TestAssignExactIPBorrowed(t *testing.T) {
	m, c := newIPAM(t)
	ctx := context.Background()
	putPool(t, c, "pool-a", "10.65.0.0/16", 26, false)
	if got, err := m.Assign(ctx, ipam.AssignRequest{Handle: "a1", Node: "node-a", Pool: "pool-a", Count: 1}); err != nil || got[0] != addr("10.65.0.0") {
		t.Fatalf("assign on node-a = %v, %v; want 10.65.0.0 (every address is handed out)", got, err)
	}
	ip := addr("10.65.0.10")
	got, err := m.Assign(ctx, ipam.AssignRequest{Handle: "b1", Node: "node-b", IP: ip, Count: 1, Attrs: map[string]string{"pod": "p", "node": "ignored"}})
	if err != nil || !slices.Equal(got, []netip.Addr{ip}) {
		t.Fatalf("borrowing %s = %v, %v", ip, got, err)
	}
	b := checkStored(t, c)[prefix("10.65.0.0/26")]
	if b.AffinityNode != "node-a" || len(b.Allocations) != 2 || b.Allocations[1] != (store.Allocation{Addr: ip, Handle: "b1", Node: "node-b"}) {
		t.Errorf("block after borrowing = %+v", b)
	}
	if len(keys(t, c, store.AffinityPrefix+"node-b/")) != 0 {
		t.Error("borrowing gave node-b an affinity")
	}
	_, err = m.Assign(ctx, ipam.AssignRequest{Handle: "b2", Node: "node-b", IP: ip})
	if !errors.Is(err, ipam.ErrAddressInUse) || !strings.Contains(err.Error(), "10.65.0.10") {
		t.Errorf("assigning %s twice: %v, want ErrAddressInUse naming it", ip, err)
	}
	if get(t, c, store.HandleKey("b2")) != "" {
		t.Error("failed assign left handle b2")
	}

	// An exact address in a block nobody has claims that block for the requesting node.
	if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: "b3", Node: "node-b", IP: addr("10.65.3.7")}); err != nil {
		t.Fatal(err)
	}
	if get(t, c, store.AffinityKey("node-b", prefix("10.65.3.0/26"))) == "" {
		t.Error("exact assign in a new block did not claim it for node-b")
	}
	if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: "b4", Node: "node-b", IP: addr("192.0.2.1")}); !errors.Is(err, ipam.ErrNotFound) {
		t.Errorf("assigning an address in no pool: %v, want ErrNotFound", err)
	}
	if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: "b4", Node: "node-b", IP: addr("10.65.0.11"), Count: 2}); err == nil {
		t.Error("assigning one exact address with count 2 succeeded")
	}

	if err := m.ReleaseIP(ctx, ip); err != nil {
		t.Fatal(err)
	}
	if get(t, c, store.HandleKey("b1")) != "" {
		t.Error("handle b1 outlived its only address")
	}
	if err := m.ReleaseIP(ctx, ip); !errors.Is(err, ipam.ErrNotFound) {
		t.Errorf("releasing %s twice: %v, want ErrNotFound", ip, err)
	}
	if err := m.ReleaseIP(ctx, addr("198.51.100.1")); !errors.Is(err, ipam.ErrNotFound) {
		t.Errorf("releasing an address in no block: %v, want ErrNotFound", err)
	}
	blocks := checkStored(t, c)
	if b := blocks[prefix("10.65.0.0/26")]; len(b.Allocations) != 1 || b.Allocations[0].Handle != "a1" {
		t.Errorf("block after release = %+v", b)
	}
}

func TestPoolFull(t *testing.T) {
	m, c := newIPAM(t)
	ctx := context.Background()
	putPool(t, c, "tiny", "192.0.2.0/30", 30, false)
	got, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h1", Node: "node-a", Pool: "tiny", Count: 4})
	want := []netip.Addr{addr("192.0.2.0"), addr("192.0.2.1"), addr("192.0.2.2"), addr("192.0.2.3")}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("assign 4 = %v, %v; want %v", got, err, want)
	}
	if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h2", Node: "node-a", Pool: "tiny", Count: 1}); !errors.Is(err, ipam.ErrPoolFull) {
		t.Errorf("assign in a full pool: %v, want ErrPoolFull", err)
	}
	if _, err := m.ClaimBlock(ctx, "node-b", "tiny", netip.Prefix{}); !errors.Is(err, ipam.ErrPoolFull) {
		t.Errorf("claim in a full pool: %v, want ErrPoolFull", err)
	}
	for _, a := range want[1:3] {
		if err := m.ReleaseIP(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	// Three do not fit in the two free: the two taken are given back.
	if got, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h3", Node: "node-a", Count: 3}); !errors.Is(err, ipam.ErrPoolFull) {
		t.Errorf("assign 3 with 2 free = %v, %v; want ErrPoolFull", got, err)
	}
	if v := get(t, c, store.HandleKey("h3")); v != "" {
		t.Errorf("failed assign left handle h3: %s", v)
	}
	checkStored(t, c)
	got, err = m.Assign(ctx, ipam.AssignRequest{Handle: "h4", Node: "node-a", Count: 2})
	if err != nil || !slices.Equal(got, want[1:3]) {
		t.Errorf("assign 2 after the rollback = %v, %v; want %v", got, err, want[1:3])
	}
	if v := get(t, c, store.HandleKey("h1")); v != `{"block":{"192.0.2.0/30":2},"deleted":false}` {
		t.Errorf("handle h1 after releasing two of its four = %s", v)
	}

	putPool(t, c, "tiny", "192.0.2.0/30", 30, true)
	if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h5", Node: "node-a", Pool: "tiny", Count: 1}); !errors.Is(err, ipam.ErrPoolDisabled) {
		t.Errorf("assign from a disabled pool: %v, want ErrPoolDisabled", err)
	}
	if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h5", Node: "node-a", Count: 1}); !errors.Is(err, ipam.ErrNotFound) {
		t.Errorf("assign from any pool when all are disabled: %v, want ErrNotFound", err)
	}
	checkStored(t, c)
}

func TestIPv6(t *testing.T) {
	m, c := newIPAM(t)
	ctx := context.Background()
	putPool(t, c, "pool-6", "2001:db8:1::/64", 0, false) // default block size: /122
	got, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h6", Node: "node-a", Pool: "pool-6", Count: 70})
	if err != nil || len(got) != 70 {
		t.Fatalf("assign 70 = %d addresses, %v", len(got), err)
	}
	if got[0] != addr("2001:db8:1::") || got[69] != addr("2001:db8:1::45") {
		t.Errorf("got %s .. %s, want 2001:db8:1:: .. 2001:db8:1::45", got[0], got[69])
	}
	wantKeys := []string{"/calico/ipam/v2/assignment/ipv6/block/2001:db8:1::-122", "/calico/ipam/v2/assignment/ipv6/block/2001:db8:1::40-122"}
	if k := keys(t, c, store.BlockPrefix); !slices.Equal(k, wantKeys) {
		t.Errorf("block keys %v, want %v", k, wantKeys)
	}
	if get(t, c, "/calico/ipam/v2/host/node-a/ipv6/block/2001:db8:1::40-122") == "" {
		t.Error("no affinity for the second IPv6 block")
	}
	blocks := checkStored(t, c)
	if n := len(blocks[prefix("2001:db8:1::/122")].Allocations) + len(blocks[prefix("2001:db8:1::40/122")].Allocations); n != 70 {
		t.Errorf("blocks hold %d addresses, want 70", n)
	}
	if got, err := m.Assign(ctx, ipam.AssignRequest{Handle: "x6", Node: "node-b", IP: addr("2001:db8:1::1:5")}); err != nil || got[0] != addr("2001:db8:1::1:5") {
		t.Errorf("exact IPv6 assign = %v, %v", got, err)
	}
	if get(t, c, "/calico/ipam/v2/host/node-b/ipv6/block/2001:db8:1::1:0-122") == "" {
		t.Error("exact IPv6 assign did not claim its block")
	}

	// With an IPv4 pool too, "any pool" means IPv4 first.
	putPool(t, c, "pool-4", "10.65.0.0/16", 26, false)
	if got, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h4", Node: "node-a", Count: 1}); err != nil || !got[0].Is4() {
		t.Errorf("assign from any pool = %v, %v; want IPv4", got, err)
	}

	freed, err := m.Release(ctx, "h6")
	if err != nil || !slices.Equal(freed, got) {
		t.Errorf("release = %d addresses, %v; want the 70 assigned", len(freed), err)
	}
	if err := m.ReleaseIP(ctx, addr("2001:db8:1::1:5")); err != nil {
		t.Error(err)
	}
	checkStored(t, c)
}

func TestUsage(t *testing.T) {
	m, c := newIPAM(t)
	ctx := context.Background()
	putPool(t, c, "a", "10.65.0.0/16", 26, false)
	putPool(t, c, "b", "2001:db8:1::/64", 122, false)
	putPool(t, c, "off", "10.66.0.0/16", 26, true)
	for _, r := range []ipam.AssignRequest{
		{Handle: "a1", Node: "node-a", Pool: "a", Count: 70},
		{Handle: "b1", Node: "node-b", Pool: "a", Count: 3},
		{Handle: "a6", Node: "node-a", Pool: "b", Count: 5},
	} {
		if _, err := m.Assign(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// A block in no pool, and an unclaimed block of a disabled pool, as Calico might leave them.
	put(t, c, "/calico/ipam/v2/assignment/ipv4/block/198.51.100.0-30", `{"cidr":"198.51.100.0/30","affinity":"host:node-c",`+
		`"strictAffinity":false,"allocations":[0,null,null,null],"unallocated":[1,2,3],`+
		`"attributes":[{"handle_id":"stray","secondary":{"node":"node-c"}}],"deleted":false,"sequenceNumber":1,"sequenceNumberForAllocation":{"0":0}}`)
	put(t, c, store.HandleKey("stray"), `{"block":{"198.51.100.0/30":1},"deleted":false}`)
	put(t, c, "/calico/ipam/v2/assignment/ipv4/block/10.66.0.0-26", `{"cidr":"10.66.0.0/26","affinity":null,"strictAffinity":false,`+
		`"allocations":[`+strings.Repeat("null,", 63)+`null],"unallocated":[],"attributes":[],"deleted":false,"sequenceNumber":0,"sequenceNumberForAllocation":{}}`)
	put(t, c, "/calico/ipam/v2/assignment/ipv4/block/10.66.1.0-26", `{"cidr":"not even json`)

	rows, err := m.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []ipam.UsageRow{
		{Pool: "", Node: "node-c", Blocks: 1, InUse: 1, Total: 4},
		{Pool: "a", Node: "node-a", Blocks: 2, InUse: 70, Total: 128},
		{Pool: "a", Node: "node-b", Blocks: 1, InUse: 3, Total: 64},
		{Pool: "b", Node: "node-a", Blocks: 1, InUse: 5, Total: 64},
		{Pool: "off", Node: "", Blocks: 1, InUse: 0, Total: 64},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("usage\n got %+v\nwant %+v", rows, want)
	}
	if err := m.ReleaseIP(ctx, addr("198.51.100.0")); err != nil {
		t.Errorf("releasing from a block in no pool: %v", err)
	}
	if get(t, c, store.HandleKey("stray")) != "" {
		t.Error("handle stray outlived its address")
	}
}

func TestKeepsFieldsCalicoAdded(t *testing.T) {
	m, c := newIPAM(t)
	ctx := context.Background()
	putPool(t, c, "pool-a", "10.65.0.0/16", 26, false)
	alloc := `[0` + strings.Repeat(",null", 63) + `]`
	var unalloc []string
	for o := 1; o < 64; o++ {
		unalloc = append(unalloc, fmt.Sprint(o))
	}
	attr := `{"handle_id":"k8s-pod-network.abc","secondary":{"namespace":"ns","node":"node-a","pod":"p1"},"alternate":{"pod":"p2"}}`
	put(t, c, "/calico/ipam/v2/assignment/ipv4/block/10.65.0.0-26", `{"cidr":"10.65.0.0/26","affinity":"host:node-a",`+
		`"affinityClaimTime":"2026-01-02T03:04:05Z","strictAffinity":false,"allocations":`+alloc+`,"unallocated":[`+strings.Join(unalloc, ",")+`],`+
		`"attributes":[`+attr+`],"deleted":false,"sequenceNumber":7,"sequenceNumberForAllocation":{"0":6}}`)
	put(t, c, store.AffinityKey("node-a", prefix("10.65.0.0/26")), `{"state":"confirmed","deleted":false}`)
	put(t, c, store.HandleKey("k8s-pod-network.abc"), `{"block":{"10.65.0.0/26":1},"deleted":false,"note":"kept"}`)

	got, err := m.Assign(ctx, ipam.AssignRequest{Handle: "k8s-pod-network.abc", Node: "node-a", Pool: "pool-a", Count: 1,
		Attrs: map[string]string{"namespace": "ns", "pod": "p1"}})
	if err != nil || got[0] != addr("10.65.0.1") {
		t.Fatalf("assign into Calico's block = %v, %v; want 10.65.0.1", got, err)
	}
	v := get(t, c, "/calico/ipam/v2/assignment/ipv4/block/10.65.0.0-26")
	for _, s := range []string{`"affinityClaimTime":"2026-01-02T03:04:05Z"`, `"attributes":[` + attr + `,{"handle_id":"k8s-pod-network.abc","secondary":{"namespace":"ns","node":"node-a","pod":"p1"}}]`,
		`"allocations":[0,1,null`, `"sequenceNumber":8`, `"sequenceNumberForAllocation":{"0":6,"1":7}`} {
		if !strings.Contains(v, s) {
			t.Errorf("block lost %s:\n%s", s, v)
		}
	}
	if h := get(t, c, store.HandleKey("k8s-pod-network.abc")); h != `{"block":{"10.65.0.0/26":2},"deleted":false,"note":"kept"}` {
		t.Errorf("handle = %s", h)
	}
	freed, err := m.Release(ctx, "k8s-pod-network.abc")
	if err != nil || len(freed) != 2 {
		t.Fatalf("release = %v, %v", freed, err)
	}
	v = get(t, c, "/calico/ipam/v2/assignment/ipv4/block/10.65.0.0-26")
	if !strings.Contains(v, `"attributes":[]`) || !strings.Contains(v, `"affinityClaimTime"`) {
		t.Errorf("block after release: %s", v)
	}
	checkStored(t, c)
}

func TestLeftoverAffinity(t *testing.T) {
	m, c := newIPAM(t)
	ctx := context.Background()
	putPool(t, c, "pool-a", "10.65.0.0/16", 26, false)
	// Calico crashed between writing its pending affinity and the block.
	put(t, c, store.AffinityKey("node-a", prefix("10.65.0.0/26")), `{"state":"pending","deleted":false}`)

	if got, err := m.ClaimBlock(ctx, "node-a", "pool-a", netip.Prefix{}); err != nil || got != prefix("10.65.0.64/26") {
		t.Errorf("claim past a leftover affinity = %v, %v; want 10.65.0.64/26", got, err)
	}
	if got, err := m.ClaimBlock(ctx, "node-b", "pool-a", netip.Prefix{}); err != nil || got != prefix("10.65.0.0/26") {
		t.Errorf("another node's claim = %v, %v; want 10.65.0.0/26 (the block key decides)", got, err)
	}
	if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h", Node: "node-a", IP: addr("10.65.1.1")}); err != nil {
		t.Errorf("exact assign in a fresh block: %v", err)
	}
	put(t, c, store.AffinityKey("node-a", prefix("10.65.2.0/26")), `{"state":"pending","deleted":false}`)
	if _, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h2", Node: "node-a", IP: addr("10.65.2.1")}); !errors.Is(err, ipam.ErrBlockTaken) {
		t.Errorf("exact assign in a block only a leftover affinity names: %v, want ErrBlockTaken", err)
	}
	// Usage and assignment ignore the pending affinity; node-a's only usable blocks are its own.
	got, err := m.Assign(ctx, ipam.AssignRequest{Handle: "h3", Node: "node-a", Count: 1})
	if err != nil || !prefix("10.65.0.64/26").Contains(got[0]) {
		t.Errorf("assign = %v, %v; want from node-a's block 10.65.0.64/26", got, err)
	}
	checkStored(t, c)
}
