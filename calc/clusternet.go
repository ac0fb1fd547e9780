package calc

import (
	"net/netip"
	"strings"

	"github.com/sluice-net/sluice/store"
)

// netCalc is the cluster nets' calculator: one net per node underlay address, one per pool
// CIDR no node claims. A cluster net is a function of its inputs, so calc keeps no map of the
// ones it emitted, which would hold one per node's address (BenchmarkDataplane in cmd/sluiced
// reports the settled agent's memory at 20,000 nodes): a net is marked with its value before
// the first change of its inputs in a batch (markNet), and compared after. So it keeps the
// pools as it last heard them, apart from the graph's (already changed when it hears of it).
type netCalc struct {
	*inputs
	*emitter
	pools map[string]*store.IPPool
	// hostNets holds the nodes claiming each underlay address, as a /32 or /128.
	hostNets multi[netip.Prefix, string]
	// dirty maps each cluster net that may have changed to its value as last computed.
	dirty map[netip.Prefix]netWas
}

func newNetCalc(in *inputs, e *emitter) *netCalc {
	return &netCalc{inputs: in, emitter: e, pools: map[string]*store.IPPool{}, hostNets: newMulti[netip.Prefix, string](),
		dirty: map[netip.Prefix]netWas{}}
}

func (nc *netCalc) onPool(id string, old, p *store.IPPool) {
	for _, q := range []*store.IPPool{old, p} {
		if q != nil {
			nc.markNet(q.CIDR)
		}
	}
	put(nc.pools, id, p)
}

func (nc *netCalc) onNode(id string, old, n *store.Node) {
	if old != nil {
		for _, p := range hostNets(old) {
			nc.markNet(p)
			nc.hostNets.remove(p, id)
		}
	}
	if n != nil {
		for _, p := range hostNets(n) {
			nc.markNet(p)
			nc.hostNets.add(p, id)
		}
	}
}

// expect sizes the empty dirty set for a batch of many nodes and pools.
func (nc *netCalc) expect(b batchCount) {
	if n := b.of(store.KindNode, store.KindIPPool); n >= 1024 && len(nc.dirty) == 0 {
		nc.dirty = make(map[netip.Prefix]netWas, n)
	}
}

func (nc *netCalc) shrink() { nc.dirty = map[netip.Prefix]netWas{} }

// computeClusterNet decides the cluster net at p from current inputs only: the nodes whose
// underlay address it is (the first by name wins), else a pool of that CIDR. It returns the
// nodes claiming p when there are several, for the clash report.
func (nc *netCalc) computeClusterNet(p netip.Prefix) (ClusterNet, []string, bool) {
	if node, ok := nc.hostNets.first(p); ok {
		var clash []string
		if nc.hostNets.count(p) > 1 {
			clash = nc.hostNets.get(p)
		}
		keep := nc.cfg.NATOutgoingExclusions == NATExcludePoolsAndHosts
		return ClusterNet{Prefix: p, Host: true, Node: node, KeepSource: keep}, clash, true
	}
	// Pools are few; a disabled pool is still inside the cluster, and still a pool for
	// outgoing NAT (its workloads keep their addresses, and keep being masqueraded).
	if masq, ok := nc.poolNAT(p); ok {
		return ClusterNet{Prefix: p, Masquerade: masq, KeepSource: true}, nil, true
	}
	return ClusterNet{}, nil, false
}

// poolNAT reports whether a pool of CIDR p exists, and whether one such has natOutgoing.
func (nc *netCalc) poolNAT(p netip.Prefix) (masquerade, ok bool) {
	for _, pool := range nc.pools {
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
func (nc *netCalc) markNet(p netip.Prefix) {
	if _, ok := nc.dirty[p]; ok {
		return // marked before this batch's first change of p's inputs
	}
	c, _, ok := nc.computeClusterNet(p)
	nc.dirty[p] = netWas{c, ok}
}

// recompute recomputes every dirty cluster net and queues what changed.
func (nc *netCalc) recompute() {
	for p, was := range nc.dirty {
		c, names, ok := nc.computeClusterNet(p)
		key := "node-address/" + p.String()
		if len(names) > 1 {
			nc.problem(key, "claimed by nodes "+strings.Join(names, ", ")+"; "+names[0]+" wins")
		} else {
			delete(nc.problems, key)
		}
		if nc.emitted {
			queueDiff(was.c, was.ok, c, ok, same[ClusterNet], &nc.pending.netSets, &nc.pending.netDels)
		}
	}
	reset(&nc.dirty, len(nc.dirty))
}

// all yields every cluster net: one per node address, one per pool CIDR no node
// claims.
func (nc *netCalc) all(yield func(ClusterNet) bool) {
	for p := range nc.hostNets.one {
		if c, _, ok := nc.computeClusterNet(p); ok && !yield(c) {
			return
		}
	}
	seen := set[netip.Prefix]{}
	for _, pool := range nc.pools {
		_, host := nc.hostNets.first(pool.CIDR)
		_, dup := seen[pool.CIDR]
		if host || dup {
			continue
		}
		seen.add(pool.CIDR)
		if c, _, ok := nc.computeClusterNet(pool.CIDR); ok && !yield(c) {
			return
		}
	}
}

// hostNets returns a node's underlay addresses as single-address prefixes.
func hostNets(n *store.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []netip.Prefix{n.IPv4Address, n.IPv6Address()} {
		if p.IsValid() {
			out = append(out, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
		}
	}
	return out
}
