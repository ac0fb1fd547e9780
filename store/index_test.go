package store_test

import (
	"testing"

	"github.com/sluice-net/sluice/store"
)

// TestSnapshotIsolation: a snapshot keeps the state it was taken at while the index moves on.
func TestSnapshotIsolation(t *testing.T) {
	idx := store.NewIndex()
	up := func(key, value string, rev int64) store.Event {
		o, err := store.Decode(key, []byte(value))
		if err != nil {
			t.Fatal(err)
		}
		return store.Event{Type: store.EventUpsert, Kind: o.Kind(), ID: o.ID(), Key: key, Revision: rev, Object: o}
	}
	idx.OnEvents([]store.Event{
		up(nodeKey, nodeValue("node-a", "192.0.2.11/24", ""), 2),
		up(wepKey, wepValue("default", "node--a-k8s-web-eth0", "node-a", "cali1", "10.65.0.1/32"), 3),
		{Type: store.EventInSync, Revision: 3},
	})
	before := idx.Snapshot()
	idx.OnEvents([]store.Event{
		{Type: store.EventDelete, Kind: store.KindWorkloadEndpoint, ID: "default/node--a-k8s-web-eth0", Key: wepKey, Revision: 4},
		up(store.WorkloadEndpointPrefix+"default/w2", wepValue("default", "w2", "node-b", "cali2", "10.65.0.2/32"), 5),
	})
	after := idx.Snapshot()
	if before.Revision() != 3 || !before.InSync() || len(before.EndpointsOfNode("node-a")) != 1 || len(before.EndpointsOfNode("node-b")) != 0 {
		t.Fatalf("old snapshot changed: rev %d, node-a %d, node-b %d", before.Revision(), len(before.EndpointsOfNode("node-a")), len(before.EndpointsOfNode("node-b")))
	}
	if after.Revision() != 5 || len(after.EndpointsOfNode("node-a")) != 0 || len(after.EndpointsOfNode("node-b")) != 1 {
		t.Fatalf("new snapshot wrong: rev %d, node-a %d, node-b %d", after.Revision(), len(after.EndpointsOfNode("node-a")), len(after.EndpointsOfNode("node-b")))
	}
	// A delete of something absent is harmless.
	idx.OnEvents([]store.Event{{Type: store.EventDelete, Kind: store.KindNode, ID: "nobody", Revision: 6}})
	if idx.Snapshot().Count(store.KindNode) != 1 {
		t.Fatal("deleting an absent node changed the index")
	}
}
