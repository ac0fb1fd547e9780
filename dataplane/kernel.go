// Package dataplane makes this node's kernel match calc's desired state through netlink, and
// keeps it matching: routes in sluice's table marked with sluice's route protocol number
// (and, next, the VXLAN device, its neighbours and FDB entries). Drivers are declarative: Set
// calls are cheap and touch nothing; Apply does the I/O, adopts what already matches, writes
// only the difference and deletes only sluice's own stale objects. A failed operation stays
// pending and forces the next Apply to read the kernel again.
package dataplane

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultRouteProtocol is sluice's route protocol number: one that no common routing daemon
// uses (Calico's Felix uses 80, BIRD 12, zebra 11). `make install` names it "sluice" in
// /etc/iproute2/rt_protos.d/.
const DefaultRouteProtocol = 83

// Kernel is the narrow netlink surface the drivers use: the real one talks to a namespace's
// kernel, the fake (fake.go) keeps state in memory and can be told to fail any operation.
type Kernel interface {
	// RouteList lists every route of one table, both families.
	RouteList(table int) ([]netlink.Route, error)
	RouteReplace(r *netlink.Route) error
	RouteDel(r *netlink.Route) error
	// LinkIndexes maps every link's name to its index.
	LinkIndexes() (map[string]int, error)
	// LinkHoldingAddr returns the index of the link that holds addr, or 0.
	LinkHoldingAddr(addr []byte) (int, error)
}

// netlinkKernel is the real Kernel over one netlink handle.
type netlinkKernel struct {
	h *netlink.Handle
}

// NewKernel returns the real Kernel over h (netlink.NewHandle for this namespace,
// netlink.NewHandleAt for another).
func NewKernel(h *netlink.Handle) Kernel { return &netlinkKernel{h: h} }

func (k *netlinkKernel) RouteList(table int) ([]netlink.Route, error) {
	rs, err := k.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes of table %d: %w", table, err)
	}
	return rs, nil
}

func (k *netlinkKernel) RouteReplace(r *netlink.Route) error { return k.h.RouteReplace(r) }

func (k *netlinkKernel) RouteDel(r *netlink.Route) error {
	err := k.h.RouteDel(r)
	if err == unix.ESRCH || err == unix.ENOENT {
		return nil // already gone: deleting is idempotent
	}
	return err
}

func (k *netlinkKernel) LinkIndexes() (map[string]int, error) {
	links, err := k.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	out := make(map[string]int, len(links))
	for _, l := range links {
		out[l.Attrs().Name] = l.Attrs().Index
	}
	return out, nil
}

func (k *netlinkKernel) LinkHoldingAddr(addr []byte) (int, error) {
	addrs, err := k.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return 0, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IP.Equal(addr) {
			return a.LinkIndex, nil
		}
	}
	return 0, nil
}
