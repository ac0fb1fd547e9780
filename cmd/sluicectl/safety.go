package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/ipam"
	"github.com/sluice-net/sluice/store/manifest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// calicoctl's safety nets: each of these caused outages for Calico users when a tool let it
// through.

// checkPools refuses, before anything is written, an IP pool whose CIDR has host bits set
// (10.83.0.1/16: which network was meant?) and pools that overlap another pool, in etcd or in
// the same apply (addresses would belong to two pools), naming both.
func checkPools(ctx context.Context, cli *clientv3.Client, docs []manifest.Document) error {
	type pool struct {
		name, source string
		cidr         netip.Prefix
	}
	var applied []pool
	for _, d := range docs {
		if d.Kind != store.KindIPPool {
			continue
		}
		var raw struct {
			Spec struct {
				CIDR string `json:"cidr"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(d.Value, &raw); err != nil {
			return fmt.Errorf("%s: %w", d.Source, err)
		}
		p, err := netip.ParsePrefix(raw.Spec.CIDR)
		if err != nil {
			continue // the decoder has said so already
		}
		if p != p.Masked() {
			return fmt.Errorf("%s: ippools/%s: spec.cidr %s has host bits set (its network is %s); nothing was written", d.Source, d.ID, p, p.Masked())
		}
		applied = append(applied, pool{d.ID, d.Source, p})
	}
	if len(applied) == 0 {
		return nil
	}
	resp, err := cli.Get(ctx, store.IPPoolPrefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	var existing []pool
	for _, kv := range resp.Kvs {
		o, err := store.Decode(string(kv.Key), kv.Value)
		if err != nil {
			continue
		}
		p := o.(*store.IPPool)
		if !slices.ContainsFunc(applied, func(a pool) bool { return a.name == p.Name }) { // replaced by this apply
			existing = append(existing, pool{p.Name, "etcd", p.CIDR})
		}
	}
	for i, a := range applied {
		for _, b := range append(existing, applied[i+1:]...) {
			if a.name != b.name && a.cidr.Overlaps(b.cidr) {
				return fmt.Errorf("%s: ippools/%s (%s) overlaps ippools/%s (%s, in %s); nothing was written", a.source, a.name, a.cidr, b.name, b.cidr, b.source)
			}
		}
	}
	return nil
}

// orphans lists what deleting the object at key would leave behind: for an IP pool, the
// blocks inside it (with their node and how many addresses are assigned); for a node, the
// blocks affine to it, its affinities and its workload endpoints. Empty: nothing.
func orphans(ctx context.Context, cli *clientv3.Client, kind store.Kind, id string) ([]string, error) {
	var out []string
	switch kind {
	case store.KindIPPool:
		key, err := store.KeyFor(kind, id)
		if err != nil {
			return nil, err
		}
		resp, err := cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) == 0 {
			return nil, err
		}
		o, err := store.Decode(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
		if err != nil {
			return nil, nil // an invalid pool holds nothing sluice can see
		}
		cidr := o.(*store.IPPool).CIDR
		blocks, err := ipam.New(cli).Blocks(ctx)
		if err != nil {
			return nil, err
		}
		for _, b := range blocks {
			if cidr.Overlaps(b.CIDR) {
				out = append(out, describeBlock(b))
			}
		}
	case store.KindNode:
		blocks, err := ipam.New(cli).Blocks(ctx)
		if err != nil {
			return nil, err
		}
		for _, b := range blocks {
			if b.AffinityNode == id {
				out = append(out, describeBlock(b))
			}
		}
		aff, err := cli.Get(ctx, store.AffinityPrefix+id+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return nil, err
		}
		if aff.Count > 0 {
			out = append(out, fmt.Sprintf("%d block affinities", aff.Count))
		}
		weps, err := cli.Get(ctx, store.WorkloadEndpointPrefix, clientv3.WithPrefix())
		if err != nil {
			return nil, err
		}
		n := 0
		for _, kv := range weps.Kvs {
			if o, err := store.Decode(string(kv.Key), kv.Value); err == nil && o.(*store.WorkloadEndpoint).Node == id {
				n++
			}
		}
		if n > 0 {
			out = append(out, fmt.Sprintf("%d workload endpoints", n))
		}
	}
	return out, nil
}

func describeBlock(b *store.Block) string {
	s := "block " + b.CIDR.String()
	if b.AffinityNode != "" {
		s += " of " + b.AffinityNode
	}
	if n := len(b.Allocations); n > 0 {
		s += fmt.Sprintf(" (%d addresses assigned)", n)
	}
	return s
}

// orphanError says what deleting kind/id would orphan, and how to go on.
func orphanError(kind store.Kind, id string, what []string) error {
	shown := what
	if len(shown) > 10 {
		shown = append(shown[:10:10], fmt.Sprintf("and %d more", len(what)-10))
	}
	return fmt.Errorf("%s/%s still holds %s: deleting it would leave them orphaned (remote nodes drop their routes to them); release them first (sluicectl ipam release), or delete with --force",
		kind.Plural(), id, strings.Join(shown, ", "))
}
