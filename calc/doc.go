// Package calc will own the pure calculation graph: from the store's events and this node's
// name it computes the desired routes, blackholes, VTEPs and service NAT state, and emits only
// what changed. It will do no I/O and start no goroutines. Nothing is implemented yet.
package calc
