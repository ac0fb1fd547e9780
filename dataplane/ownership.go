package dataplane

import "golang.org/x/sys/unix"

// Ownership: which kernel objects are sluice's, one rule per kind, in one place. The drivers,
// the kernel watches and the leftover scan ask these; none reads a protocol number itself.
// (The other kinds are sluice's by name: its VXLAN devices by their configured names, the
// neighbours and FDB entries on them, the nftables table inet sluice-nat; the service stage's
// programs by their sl_ prefix, in bpf.)

// routeOwner is whose a route in sluice's table is.
type routeOwner uint8

const (
	// routeSluice: sluice's protocol number. Sluice's to change and delete; one deleted by
	// someone else is put back.
	routeSluice routeOwner = iota
	// routeKernel: RTPROT_KERNEL, a connected subnet of an interface. The kernel's: never
	// touched, and never a leftover by itself.
	routeKernel
	// routeOther: another program's (Felix's 80, BIRD's, boot, static). Replaced, and
	// reported, only where it sits at exactly a desired route's destination and metric;
	// anywhere else never written, only judged as a possible leftover.
	routeOther
)

// ownerOfRoute says whose a route with protocol is, ours being sluice's protocol number.
func ownerOfRoute(protocol, ours int) routeOwner {
	switch protocol {
	case ours:
		return routeSluice
	case unix.RTPROT_KERNEL:
		return routeKernel
	}
	return routeOther
}

// ownedNexthop says whether a nexthop object with protocol is sluice's. Another program's
// object at an ID sluice wants is never touched: sluice's object moves to another ID.
func ownedNexthop(protocol, ours int) bool { return protocol == ours }
