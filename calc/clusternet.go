package calc

import (
	"net/netip"
	"strings"
)

// computeClusterNet decides the cluster net at p from current inputs only: the nodes whose
// underlay address it is (the first by name wins), else a pool of that CIDR. It returns the
// nodes claiming p when there are several, for the clash report.
func (g *Graph) computeClusterNet(p netip.Prefix) (ClusterNet, []string, bool) {
	if node, ok := g.hostNets.first(p); ok {
		var clash []string
		if g.hostNets.count(p) > 1 {
			clash = g.hostNets.get(p)
		}
		keep := g.cfg.NATOutgoingExclusions == NATExcludePoolsAndHosts
		return ClusterNet{Prefix: p, Host: true, Node: node, KeepSource: keep}, clash, true
	}
	// Pools are few; a disabled pool is still inside the cluster, and still a pool for
	// outgoing NAT (its workloads keep their addresses, and keep being masqueraded).
	if masq, ok := g.poolNAT(p); ok {
		return ClusterNet{Prefix: p, Masquerade: masq, KeepSource: true}, nil, true
	}
	return ClusterNet{}, nil, false
}

// poolNAT reports whether a pool of CIDR p exists, and whether one such has natOutgoing.
func (g *Graph) poolNAT(p netip.Prefix) (masquerade, ok bool) {
	for _, pool := range g.pools {
		if pool.CIDR == p {
			ok = true
			masquerade = masquerade || pool.NATOutgoing
		}
	}
	return masquerade, ok
}

// recomputeClusterNets recomputes every dirty cluster net and records what changed.
func (g *Graph) recomputeClusterNets() {
	n := len(g.dirtyNet)
	g.nets = sized(g.nets, n)
	for p := range g.dirtyNet {
		c, names, ok := g.computeClusterNet(p)
		key := "node-address/" + p.String()
		if len(names) > 1 {
			g.problem(key, "claimed by nodes "+strings.Join(names, ", ")+"; "+names[0]+" wins")
		} else {
			delete(g.problems, key)
		}
		settle(g.nets, p, c, ok, same[ClusterNet], g.emitted, &g.pending.netSets, &g.pending.netDels)
	}
	reset(&g.dirtyNet, n)
}
