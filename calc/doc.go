// Package calc is sluice's pure calculation graph. It takes the store's events, this node's
// name and the agent's configuration, and computes this node's desired dataplane: routes
// (local workloads, remote blocks through VXLAN or directly, borrowed addresses, floating IPs,
// blackholes for local blocks), VTEPs, cluster nets (pool CIDRs and node addresses), the
// floating IPs of this node's workloads (external to internal address, for the kernel's NAT),
// and service NAT frontends with their backends and health-check ports.
// It hands the next stage only what changed: nothing before the first in-sync, then one full
// state, then deltas.
//
// Graph is a dispatcher over calculators, one per kind of output (routeCalc, vtepCalc,
// netCalc, fipCalc, serviceCalc): it keeps the inputs and hands each event to the calculators
// that hear its kind; each owns its indexes, its dirty sets and what it emitted.
//
// It does no I/O and starts no goroutines, takes no locks and reads no clock. Its output depends
// only on its current inputs, never on the order they arrived in, so replaying an event log
// always gives the same state. Each change recomputes only the destinations, VTEPs, cluster
// nets, floating IPs and services that the changed object can touch, so the cost of one change
// does not grow with the cluster.
package calc
