// Package dataplane makes this node's kernel match calc's desired state through netlink, and
// keeps it matching: routes in sluice's table marked with sluice's route protocol number, the
// nexthop objects they go through, the VXLAN devices with their neighbour and FDB entries,
// outgoing NAT and floating IPs in the nftables table inet sluice-nat, and the sysctls
// forwarding needs. Drivers are declarative: Set calls are cheap and touch nothing; Apply does
// the I/O, adopts what already matches, writes only the difference and deletes only sluice's
// own stale objects (ownership.go says what is sluice's). A failed operation stays pending and
// forces the next Apply to read the kernel again. Kernel watches find what someone else
// changes, and a leftover scan finds other software's routes, devices, ip rules and netfilter
// chains in sluice's way (reported; removed only with CleanConflicts).
package dataplane
