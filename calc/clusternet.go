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

// netWas is a cluster net as last computed (ok: there was one).
type netWas struct {
	c  ClusterNet
	ok bool
}

// markNet records that the cluster net at p may change, with its value as it stands: call it
// before changing the inputs (a node's underlay addresses, pools). A cluster net is a function
// of those inputs, so calc keeps no map of the ones it emitted, which would hold one per node's
// address (BenchmarkDataplane in cmd/sluiced reports the settled agent's memory at 20,000 nodes).
func (g *Graph) markNet(p netip.Prefix) {
	if _, ok := g.dirtyNet[p]; ok {
		return // marked before this batch's first change of p's inputs
	}
	c, _, ok := g.computeClusterNet(p)
	g.dirtyNet[p] = netWas{c, ok}
}

// recomputeClusterNets recomputes every dirty cluster net and queues what changed.
func (g *Graph) recomputeClusterNets() {
	for p, was := range g.dirtyNet {
		c, names, ok := g.computeClusterNet(p)
		key := "node-address/" + p.String()
		if len(names) > 1 {
			g.problem(key, "claimed by nodes "+strings.Join(names, ", ")+"; "+names[0]+" wins")
		} else {
			delete(g.problems, key)
		}
		if g.emitted {
			queueDiff(was.c, was.ok, c, ok, same[ClusterNet], &g.pending.netSets, &g.pending.netDels)
		}
	}
	reset(&g.dirtyNet, len(g.dirtyNet))
}

// clusterNets yields every cluster net: one per node address, one per pool CIDR no node
// claims.
func (g *Graph) clusterNets(yield func(ClusterNet) bool) {
	for p := range g.hostNets.one {
		if c, _, ok := g.computeClusterNet(p); ok && !yield(c) {
			return
		}
	}
	seen := set[netip.Prefix]{}
	for _, pool := range g.pools {
		_, host := g.hostNets.first(pool.CIDR)
		_, dup := seen[pool.CIDR]
		if host || dup {
			continue
		}
		seen.add(pool.CIDR)
		if c, _, ok := g.computeClusterNet(pool.CIDR); ok && !yield(c) {
			return
		}
	}
}
