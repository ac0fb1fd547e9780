package store

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// CountKeys returns how many keys each prefix held at revision rev (0: now), with the
// revision counted at. With UnchangedSince it tells whether anything under the prefixes moved
// since rev, without reading a value.
func CountKeys(ctx context.Context, cli *clientv3.Client, prefixes []string, rev int64) ([]int64, int64, error) {
	ops := make([]clientv3.Op, len(prefixes))
	for i, p := range prefixes {
		ops[i] = clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(rev))
	}
	resp, err := cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("counting the keys at revision %d: %w", rev, err)
	}
	counts := make([]int64, len(prefixes))
	for i, r := range resp.Responses {
		counts[i] = r.GetResponseRange().Count
	}
	at := rev
	if at == 0 {
		at = resp.Header.Revision
	}
	return counts, at, nil
}

// UnchangedSince reports whether the keys under prefixes are exactly those etcd held at
// revision since, with the same values, given counts, how many each prefix held then
// (CountKeys). It reads no value: in one transaction (one revision, which it returns) it counts
// each prefix and asks for one key written after since. The proof: every key there now was
// last written at or before since, so it was there then with the value it has now (a key
// deleted and written again has a newer revision); as many as then, so none is missing.
// etcd scans the prefix either way (its revision filters run after the read), but only the
// counts cross the wire.
func UnchangedSince(ctx context.Context, cli *clientv3.Client, prefixes []string, since int64, counts []int64) (bool, int64, error) {
	if len(counts) != len(prefixes) {
		return false, 0, fmt.Errorf("%d counts for %d prefixes", len(counts), len(prefixes))
	}
	ops := make([]clientv3.Op, 0, 2*len(prefixes))
	for _, p := range prefixes {
		ops = append(ops, clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithCountOnly()),
			clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMinModRev(since+1), clientv3.WithLimit(1)))
	}
	resp, err := cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return false, 0, fmt.Errorf("checking the keys against revision %d: %w", since, err)
	}
	for i := range prefixes {
		count, newer := resp.Responses[2*i].GetResponseRange(), resp.Responses[2*i+1].GetResponseRange()
		if count.Count != counts[i] || len(newer.Kvs) > 0 {
			return false, resp.Header.Revision, nil
		}
	}
	return true, resp.Header.Revision, nil
}
