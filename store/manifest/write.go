package manifest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Action says what Apply did with one document.
type Action string

// Actions.
const (
	Created   Action = "created"
	Updated   Action = "updated"
	Unchanged Action = "unchanged"
)

// ErrConflict is returned when a key kept changing under a compare-and-swap write.
var ErrConflict = errors.New("key changed concurrently")

// ErrNotFound is returned when deleting a key that does not exist.
var ErrNotFound = errors.New("not found")

// casAttempts bounds the re-read and retry rounds of one compare-and-swap write.
//
// Hazard: a writer loses a round each time another writer's change lands between its read
// and its write, so n writers applying one object at once need up to n rounds; a bound of 8
// failed the ninth of sixteen concurrent applies. store/ipam allows 50, Calico 100.
const casAttempts = 50

// Apply writes one document as calicoctl would: create only if the key's CreateRevision is
// 0, update only if its ModRevision is unchanged since it was read, retrying on conflict.
// Resource metadata (uid, creationTimestamp) is kept from the stored version, or made new.
func Apply(ctx context.Context, cli *clientv3.Client, d Document, now time.Time) (Action, error) {
	for range casAttempts {
		resp, err := cli.Get(ctx, d.Key)
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", d.Key, err)
		}
		var old []byte
		var cmp clientv3.Cmp
		if len(resp.Kvs) == 0 {
			cmp = clientv3.Compare(clientv3.CreateRevision(d.Key), "=", 0)
		} else {
			old = resp.Kvs[0].Value
			cmp = clientv3.Compare(clientv3.ModRevision(d.Key), "=", resp.Kvs[0].ModRevision)
		}
		value, err := stamp(d.Kind, d.Value, old, now)
		if err != nil {
			return "", fmt.Errorf("%s: %w", d.Source, err)
		}
		if old != nil && bytes.Equal(old, value) {
			return Unchanged, nil
		}
		txn, err := cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(d.Key, string(value))).Commit()
		if err != nil {
			return "", fmt.Errorf("writing %s: %w", d.Key, err)
		}
		if txn.Succeeded {
			if old == nil {
				return Created, nil
			}
			return Updated, nil
		}
	}
	return "", fmt.Errorf("writing %s: %w after %d attempts", d.Key, ErrConflict, casAttempts)
}

// Delete removes key with a compare-and-swap on its ModRevision.
func Delete(ctx context.Context, cli *clientv3.Client, key string) error {
	for range casAttempts {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("reading %s: %w", key, err)
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("%s: %w", key, ErrNotFound)
		}
		txn, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpDelete(key)).Commit()
		if err != nil {
			return fmt.Errorf("deleting %s: %w", key, err)
		}
		if txn.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("deleting %s: %w after %d attempts", key, ErrConflict, casAttempts)
}

// metaOf returns a pointer to the metadata of a decoded resource, or nil for kinds without.
func newResource(k store.Kind) (any, func(any) *store.ObjectMeta) {
	switch k {
	case store.KindIPPool:
		return &store.IPPoolResource{}, func(v any) *store.ObjectMeta { return &v.(*store.IPPoolResource).Metadata }
	case store.KindNode:
		return &store.NodeResource{}, func(v any) *store.ObjectMeta { return &v.(*store.NodeResource).Metadata }
	case store.KindWorkloadEndpoint:
		return &store.WorkloadEndpointResource{}, func(v any) *store.ObjectMeta { return &v.(*store.WorkloadEndpointResource).Metadata }
	case store.KindService:
		return &store.ServiceResource{}, func(v any) *store.ObjectMeta { return &v.(*store.ServiceResource).Metadata }
	case store.KindEndpointSlice:
		return &store.EndpointSliceResource{}, func(v any) *store.ObjectMeta { return &v.(*store.EndpointSliceResource).Metadata }
	case store.KindBGPConfiguration:
		return &store.BGPConfigurationResource{}, func(v any) *store.ObjectMeta { return &v.(*store.BGPConfigurationResource).Metadata }
	case store.KindBGPPeer:
		return &store.BGPPeerResource{}, func(v any) *store.ObjectMeta { return &v.(*store.BGPPeerResource).Metadata }
	}
	return nil, nil
}

// stamp sets the uid and creation time of a resource value: the stored version's when there
// is one (so an update keeps the object's identity), else new ones.
func stamp(k store.Kind, value, old []byte, now time.Time) ([]byte, error) {
	res, metaOf := newResource(k)
	if res == nil {
		return value, nil
	}
	if err := json.Unmarshal(value, res); err != nil {
		return nil, err
	}
	m := metaOf(res)
	m.UID, m.CreationTimestamp = "", ""
	if old != nil {
		prev, prevMeta := newResource(k)
		if json.Unmarshal(old, prev) == nil {
			m.UID, m.CreationTimestamp = prevMeta(prev).UID, prevMeta(prev).CreationTimestamp
		}
	}
	if m.UID == "" {
		m.UID = newUID()
	}
	if m.CreationTimestamp == "" {
		m.CreationTimestamp = now.UTC().Format(time.RFC3339)
	}
	return json.Marshal(res)
}

// newUID returns a random version 4 UUID, as Kubernetes and calicoctl assign.
func newUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
