package calc

import (
	"net/netip"

	"github.com/sluice-net/sluice/store"
)

// fipCalc is the floating IPs' calculator: the floating IPs of this node's workloads
// (external to internal address, for the kernel's NAT), from the workload endpoints' ipNATs.
// Its index of the workloads naming each floating IP is also where the route calculator finds
// a floating IP's workload (the route goes where the workload is, on every node).
type fipCalc struct {
	*inputs
	*emitter
	// byAddr holds the workloads naming each floating IP (ipNATs' externalIP); fips the
	// floating IPs of this node's workloads as emitted; dirty those to recompute.
	byAddr multi[netip.Addr, string]
	fips   map[netip.Addr]FloatingIP
	dirty  set[netip.Addr]
}

func newFIPCalc(in *inputs, e *emitter) *fipCalc {
	return &fipCalc{inputs: in, emitter: e, byAddr: newMulti[netip.Addr, string](), fips: map[netip.Addr]FloatingIP{}, dirty: set[netip.Addr]{}}
}

func (fc *fipCalc) onWEP(id string, old, w *store.WorkloadEndpoint) {
	if old != nil {
		for _, n := range old.IPNATs {
			fc.byAddr.remove(n.ExternalIP, id)
			fc.dirty.add(n.ExternalIP)
		}
	}
	if w != nil {
		for _, n := range w.IPNATs {
			fc.byAddr.add(n.ExternalIP, id)
			fc.dirty.add(n.ExternalIP)
		}
	}
}

// internalOf is the internal address a workload's floating IP ext leads to: its first ipNATs
// entry of that external address.
func internalOf(w *store.WorkloadEndpoint, ext netip.Addr) (netip.Addr, bool) {
	for _, n := range w.IPNATs {
		if n.ExternalIP == ext {
			return n.InternalIP, true
		}
	}
	return netip.Addr{}, false
}

// recompute recomputes the dirty floating IPs of this node's workloads.
func (fc *fipCalc) recompute() {
	for ext := range fc.dirty {
		var f FloatingIP
		id, ok := fc.byAddr.first(ext)
		if ok {
			w := fc.weps[id]
			var in netip.Addr
			in, ok = internalOf(w, ext)
			ok = ok && fc.isLocal(w.Node)
			f = FloatingIP{External: ext, Internal: in, Workload: id}
		}
		settle(fc.fips, ext, f, ok, same[FloatingIP], fc.emitted, &fc.pending.fipSets, &fc.pending.fipDels)
	}
	clear(fc.dirty)
}
