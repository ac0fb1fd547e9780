package calc

import (
	"bytes"
	"crypto/sha1"
	"net"
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

func (g *Graph) computeVTEP(node string, ipv6 bool) (VTEP, bool) {
	if !g.cfg.VXLAN {
		return VTEP{}, false
	}
	n := g.nodes[node]
	if n == nil {
		return VTEP{}, false
	}
	tunnel, mac, under := n.IPv4VXLANTunnelAddr, n.VXLANTunnelMAC, n.IPv4Address
	if ipv6 {
		tunnel, mac, under = n.IPv6VXLANTunnelAddr, n.VXLANTunnelMACV6, n.IPv6Address
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

func (g *Graph) recomputeVTEPs() {
	n := len(g.dirtyVTEP)
	g.vteps = sized(g.vteps, n)
	for node := range g.dirtyVTEP {
		for _, v6 := range []bool{false, true} {
			v, ok := g.computeVTEP(node, v6)
			settle(g.vteps, VTEPKey{Node: node, IPv6: v6}, v, ok, vtepEqual, g.emitted, &g.pending.vtepSets, &g.pending.vtepDels)
		}
	}
	reset(&g.dirtyVTEP, n)
}
