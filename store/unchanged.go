package store

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// PrefixState is what a consumer of the intake holds of one watched prefix: etcd's keys under
// it as of Revision, summed up as how many there are (Keys) and the newest mod revision among
// them (Newest, 0 for none). Unchanged tells from it, with no value sent, whether etcd still
// holds the same keys with the same values.
type PrefixState struct {
	Prefix   string `json:"prefix"`
	Revision int64  `json:"revision"`
	Keys     int64  `json:"keys"`
	Newest   int64  `json:"newest"`
}

// Held returns, for each prefix, what the consumers hold of it, and whether they hold
// exactly etcd's keys as of the revisions given: false before the first in-sync and when a
// read was cut short while it delivered its pages. Each prefix's revision is the one through
// which its watch delivered (two watches run apart). Call it only after Run has returned.
// The counts are the intake's own (every key under a prefix, valid or not), so the answer
// needs no read of etcd, and holds even once etcd has compacted those revisions away.
func (in *Intake) Held() ([]PrefixState, bool) {
	if !in.held {
		return nil, false
	}
	out := make([]PrefixState, len(in.cfg.Prefixes))
	for i, p := range in.cfg.Prefixes {
		out[i] = PrefixState{Prefix: p, Revision: in.spanAt[in.spanOf[i]], Keys: int64(len(in.known[i]))}
		for _, st := range in.known[i] {
			out[i].Newest = max(out[i].Newest, st.modRev())
		}
	}
	return out, true
}

// Unchanged reports whether etcd holds, under each prefix, exactly the keys held (Held): in one
// transaction (one revision, which it returns) it counts each prefix and asks for the key
// written last. The proof: the newest key is no newer than the one held, itself no newer than
// the revision held at, so every key there now was last written at or before that revision
// and was there then with the value it has now (a key deleted and written again is newer); as
// many as then, so none is missing. An etcd restored from an older backup is refused while
// nothing has been written to it since, or when it was restored with --bump-revision (as etcd
// advises): any key that differs from what was held is then newer than the backup, so the
// newest key or the count differs. Restored without it and written to, its new writes can
// reuse revisions the lost history had, and the check can pass. etcd scans each prefix to sort it (before etcd 3.7, reading the values
// too), but only a count and one key cross the wire.
func Unchanged(ctx context.Context, cli *clientv3.Client, held []PrefixState) (bool, int64, error) {
	ops := make([]clientv3.Op, 0, 2*len(held))
	for _, h := range held {
		ops = append(ops, clientv3.OpGet(h.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()),
			clientv3.OpGet(h.Prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
				clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(1)))
	}
	resp, err := cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return false, 0, fmt.Errorf("checking the keys held: %w", err)
	}
	if len(resp.Responses) != len(ops) {
		return false, 0, fmt.Errorf("checking the keys held: %d answers to %d reads", len(resp.Responses), len(ops))
	}
	for i, h := range held {
		count, last := resp.Responses[2*i].GetResponseRange(), resp.Responses[2*i+1].GetResponseRange()
		newest := int64(0)
		if len(last.Kvs) > 0 {
			newest = last.Kvs[0].ModRevision
		}
		if count.Count != h.Keys || newest != h.Newest || h.Newest > h.Revision {
			return false, resp.Header.Revision, nil
		}
	}
	return true, resp.Header.Revision, nil
}
