// Package bpf owns sluice's eBPF service NAT (cluster IPs, node ports, load-balancer and
// external IPs), written through cilium/ebpf: the C data path (c/, compiled by bpf2go), its
// loader and the kernel probes (what the running kernel has of what the programs use), the
// map driver (Services: calc's frontends and backends to map entries, declaratively), the
// attacher (Attacher: TCX links or classic tc filters on host and workload interfaces), the
// socket hooks (SocketHooks: socket programs on the cgroup v2 root), the connection-table
// cleaner (Conntrack), the leftover scan (Conflict: other software's programs on the hooks
// sluice holds and on the cgroup's socket hooks, other products' pins, kube-proxy's IPVS
// state), and Stage, which runs them all for the agent.
package bpf
