// Package bpf owns sluice's eBPF service NAT (cluster IPs, node ports, load-balancer and
// external IPs), written through cilium/ebpf: the C data path (c/, compiled by bpf2go), its
// loader and the kernel probes (what the running kernel has of what the programs use), the
// map driver (Services: calc's frontends and backends to map entries, declaratively), the
// attacher (TCX links or classic tc filters on host and workload interfaces, socket programs
// on the cgroup v2 root), the connection-table cleaner, and Stage, which runs them all for
// the agent.
package bpf
