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
func (vc *vtepCalc) vtepOf(node string, n *store.Node, ipv6 bool) (VTEP, bool) {
	if !vc.cfg.VXLAN || n == nil {
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
	return VTEP{Node: node, TunnelAddr: tunnel, MAC: mac, Underlay: under.Addr(), Local: vc.isLocal(node)}, true
}

func vtepEqual(a, b VTEP) bool {
	return a.Node == b.Node && a.TunnelAddr == b.TunnelAddr && bytes.Equal(a.MAC, b.MAC) && a.Underlay == b.Underlay && a.Local == b.Local
}

// vtepCalc is the VTEPs' calculator: one VTEP per node and family, from the node alone.
type vtepCalc struct {
	*inputs
	*emitter
	// dirty maps each node whose VTEPs may have changed to the Node they were last computed
	// from (nil: none).
	dirty map[string]*store.Node
}

func newVTEPCalc(in *inputs, e *emitter) *vtepCalc {
	return &vtepCalc{inputs: in, emitter: e, dirty: map[string]*store.Node{}}
}

func (vc *vtepCalc) onNode(id string, old, _ *store.Node) {
	if _, ok := vc.dirty[id]; !ok {
		vc.dirty[id] = old
	}
}

// expect sizes the empty dirty set for a batch of many nodes.
func (vc *vtepCalc) expect(b batchCount) {
	if n := b.of(store.KindNode); n >= 1024 && len(vc.dirty) == 0 {
		vc.dirty = make(map[string]*store.Node, n)
	}
}

func (vc *vtepCalc) shrink() { vc.dirty = map[string]*store.Node{} }

// recompute compares each changed node's VTEPs with those of the Node they were last
// computed from, and queues the differences.
func (vc *vtepCalc) recompute() {
	if vc.emitted {
		for node, was := range vc.dirty {
			for _, v6 := range []bool{false, true} {
				old, had := vc.vtepOf(node, was, v6)
				v, ok := vc.vtepOf(node, vc.nodes[node], v6)
				queueDiff(old, had, v, ok, vtepEqual, &vc.pending.vtepSets, &vc.pending.vtepDels)
			}
		}
	}
	reset(&vc.dirty, len(vc.dirty))
}

// all yields every VTEP of the current nodes.
func (vc *vtepCalc) all(yield func(VTEP) bool) {
	for node, n := range vc.nodes {
		for _, v6 := range []bool{false, true} {
			if v, ok := vc.vtepOf(node, n, v6); ok && !yield(v) {
				return
			}
		}
	}
}
