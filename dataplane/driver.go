package dataplane

import "github.com/sluice-net/sluice/calc"

// driver keeps one kind of kernel state matching its part of calc's desired state: routes
// (with their nexthop objects), one VXLAN device (IPv4's or IPv6's), outgoing NAT, sysctls.
// The Dataplane hands every update to every driver and takes no decision of theirs: each
// picks the ops of its kinds, handles a full update itself, and knows what it wrote.
//
// Each method is called with the Dataplane's lock held.
type driver interface {
	// Full replaces the desired state with u's, a full update: what u lacks is no longer
	// wanted (it goes at the next Apply).
	Full(u *calc.Update)
	// OnOp takes one change and reports whether it changed this driver's desired state.
	OnOp(op calc.Op) bool
	// Apply writes the difference between the desired state and the kernel's.
	Apply() error
	// QueueResync makes the next Apply read the kernel again before it writes.
	QueueResync()
	// Diff reads the kernel and says what it lacks or holds differently (missing) and what
	// of sluice's it holds too much of (extra), writing nothing.
	Diff() (missing, extra []string, err error)
}
