// Package store owns sluice's view of etcd: the typed model of every key sluice reads
// (Calico's IP pools, nodes, IPAM blocks and affinities, workload endpoints, and sluice's own
// services and endpoint slices), the intake that lists and watches those keys and turns them
// into upsert, delete and in-sync events, the event log that records and replays them, and
// the go-memdb index, which only sluicectl replay builds from a log (sluiced keeps none). It
// never touches the kernel.
package store
