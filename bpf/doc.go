// Package bpf will own sluice's eBPF programs and maps for service NAT (cluster IPs, node
// ports, load-balancer and external IPs), written through cilium/ebpf. Nothing is implemented
// yet.
package bpf
