package calc

import (
	"bytes"
	"crypto/sha1"
	"net"

	"github.com/sluice-net/sluice/store"
)

// DeriveMAC returns the VTEP MAC Calico derives for a node without one: 0x66 followed by the
// first five bytes of the SHA-1 of the node name, so mixed clusters agree. For an IPv6 VTEP
// sluice hashes the name with "-v6" appended so the two MACs differ; that rule is sluice's own
// (Nodes written by Calico carry their IPv6 MAC, which is then used as it is).
func DeriveMAC(node string, ipv6 bool) net.HardwareAddr {
	name := node
	if ipv6 {
		name += "-v6"
	}
	sum := sha1.Sum([]byte(name))
	return net.HardwareAddr{0x66, sum[0], sum[1], sum[2], sum[3], sum[4]}
}

// vtepOf is the VTEP of node n for one address family (n nil: none). A VTEP is a function
// of its Node alone (and of the configuration), so calc keeps no map of the VTEPs it emitted:
// a changed node's old VTEP is computed again from the Node it replaced (such a map would hold
// one more copy of every node's tunnel address, MAC and underlay; BenchmarkDataplane in
// cmd/sluiced reports the settled agent's memory at 20,000 nodes).
func (g *Graph) vtepOf(node string, n *store.Node, ipv6 bool) (VTEP, bool) {
	if !g.cfg.VXLAN || n == nil {
		return VTEP{}, false
	}
	tunnel, mac, under := n.IPv4VXLANTunnelAddr, n.VXLANTunnelMAC, n.IPv4Address
	if ipv6 {
		tunnel, mac, under = n.IPv6VXLANTunnelAddr(), n.VXLANTunnelMACV6(), n.IPv6Address()
	}
	if !tunnel.IsValid() || !under.IsValid() {
		return VTEP{}, false
	}
	if mac == nil {
		mac = DeriveMAC(node, ipv6)
	}
	return VTEP{Node: node, TunnelAddr: tunnel, MAC: mac, Underlay: under.Addr(), Local: g.isLocal(node)}, true
}

func vtepEqual(a, b VTEP) bool {
	return a.Node == b.Node && a.TunnelAddr == b.TunnelAddr && bytes.Equal(a.MAC, b.MAC) && a.Underlay == b.Underlay && a.Local == b.Local
}

// recomputeVTEPs compares each changed node's VTEPs with those of the Node they were last
// computed from, and queues the differences.
func (g *Graph) recomputeVTEPs() {
	if g.emitted {
		for node, was := range g.dirtyVTEP {
			for _, v6 := range []bool{false, true} {
				old, had := g.vtepOf(node, was, v6)
				v, ok := g.vtepOf(node, g.nodes[node], v6)
				queueDiff(old, had, v, ok, vtepEqual, &g.pending.vtepSets, &g.pending.vtepDels)
			}
		}
	}
	reset(&g.dirtyVTEP, len(g.dirtyVTEP))
}

// vteps yields every VTEP of the current nodes.
func (g *Graph) vteps(yield func(VTEP) bool) {
	for node, n := range g.nodes {
		for _, v6 := range []bool{false, true} {
			if v, ok := g.vtepOf(node, n, v6); ok && !yield(v) {
				return
			}
		}
	}
}
