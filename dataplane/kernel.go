package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/sluice-net/sluice/internal/nlutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
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
	RouteList(table int) ([]Route, error)
	RouteReplace(r *netlink.Route) error
	// RouteReplaceMany replaces many routes at once and returns one error per route.
	RouteReplaceMany(rs []*Route) []error
	RouteDel(r *netlink.Route) error
	// RouteDelMany deletes many routes at once and returns one error per route; a route
	// already gone is not an error.
	RouteDelMany(rs []*Route) []error
	// NexthopList lists every nexthop object (an error on kernels without them, before 5.3).
	NexthopList() ([]Nexthop, error)
	// NexthopSetMany writes nexthop objects and returns one error each: with replace it
	// replaces objects of those IDs; without it, it only creates, and an ID already taken
	// fails with EEXIST.
	NexthopSetMany(ns []Nexthop, replace bool) []error
	// NexthopDelMany deletes nexthop objects, and with them the routes through them, and
	// returns one error each; one already gone is not an error.
	NexthopDelMany(ids []uint32) []error
	// LinkIndexes maps every link's name to its index.
	LinkIndexes() (map[string]int, error)
	// Links lists every link with its attributes and type.
	Links() ([]netlink.Link, error)
	// LinkHoldingAddr returns the index of the link that holds addr, or 0.
	LinkHoldingAddr(addr []byte) (int, error)

	// Link returns the named link, or nil when there is none.
	Link(name string) (netlink.Link, error)
	// LinkByIndex returns the link with that index, or nil.
	LinkByIndex(index int) (netlink.Link, error)
	LinkAdd(l netlink.Link) error
	LinkDel(name string) error
	LinkSetUp(name string) error
	LinkSetMTU(name string, mtu int) error
	LinkSetMAC(name string, mac net.HardwareAddr) error
	// Addrs lists the addresses on the named link.
	Addrs(name string) ([]netip.Prefix, error)
	AddrReplace(name string, p netip.Prefix) error
	AddrDel(name string, p netip.Prefix) error
	// Neighs lists the neighbour (AF_INET, AF_INET6) or FDB (AF_BRIDGE) entries of a link.
	Neighs(linkIndex, family int) ([]Neighbour, error)
	NeighSet(n *netlink.Neigh) error
	// NeighSetMany creates or replaces many neighbour or FDB entries at once and returns one
	// error per entry.
	NeighSetMany(ns []*netlink.Neigh) []error
	NeighDel(n *netlink.Neigh) error
}

// netlinkKernel is the real Kernel over one netlink handle, plus a socket for batches.
type netlinkKernel struct {
	h     *netlink.Handle
	batch *batcher
}

// NewKernel returns the real Kernel for namespace ns (netns.None() for this one). Close it
// when done.
func NewKernel(ns netns.NsHandle) (*NetlinkKernel, error) {
	// Only the route family: a handle asked for none opens every family the library knows,
	// and a host without one of them (xfrm_user is a module many hosts never load) would
	// refuse to start the agent for a family it never uses.
	var h *netlink.Handle
	var err error
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, fmt.Errorf("opening netlink (NETLINK_ROUTE): %w", err)
	}
	b, err := newRouteBatcher(ns)
	if err != nil {
		h.Close()
		return nil, err
	}
	nat := nftNAT{}
	if ns.IsOpen() {
		nat.netnsFd = int(ns) // the caller keeps ns open while it uses the kernel
	}
	return &NetlinkKernel{netlinkKernel{h: h, batch: b}, nat}, nil
}

// NetlinkKernel is the real Kernel; it programs sluice's nftables table too (nat.go).
type NetlinkKernel struct {
	netlinkKernel
	nftNAT
}

// NATSupported says whether this kernel's nftables can be read (nil: yes): without
// nf_tables, outgoing NAT and floating IPs cannot be programmed.
func (k *NetlinkKernel) NATSupported() error {
	_, _, err := k.readNAT()
	return err
}

// NexthopsSupported says whether this kernel has nexthop objects (nil: yes; Linux 5.3 or
// later), without listing them: a dump filtered in the kernel to the loopback device, which
// holds only blackhole objects (usually none), whatever the number of others; before 5.3 the
// kernel refuses it. Only the kernel's answer counts: what it lists is not parsed.
func (k *NetlinkKernel) NexthopsSupported() error {
	_, err := k.batch.dump(nexthopDump(1), unix.RTM_NEWNEXTHOP)
	return err
}

// Close releases the netlink sockets.
func (k *NetlinkKernel) Close() {
	k.h.Close()
	k.batch.close()
}

func (k *netlinkKernel) RouteReplaceMany(rs []*Route) []error { return k.batch.replace(rs) }

func (k *netlinkKernel) RouteDelMany(rs []*Route) []error { return k.batch.remove(rs) }

func (k *netlinkKernel) NexthopList() ([]Nexthop, error) { return k.batch.nexthops(0) }

func (k *netlinkKernel) NexthopSetMany(ns []Nexthop, replace bool) []error {
	return k.batch.setNexthops(ns, replace)
}

func (k *netlinkKernel) NexthopDelMany(ids []uint32) []error { return k.batch.delNexthops(ids) }

func (k *netlinkKernel) NeighSetMany(ns []*netlink.Neigh) []error { return k.batch.setNeighs(ns) }

func (k *netlinkKernel) RouteList(table int) ([]Route, error) { return k.batch.routes(table) }

// ruleList lists the policy routing rules of both families (the leftover pass reads them;
// fake kernels have none).
func (k *netlinkKernel) ruleList() ([]netlink.Rule, error) { return k.h.RuleList(netlink.FAMILY_ALL) }

func (k *netlinkKernel) RouteReplace(r *netlink.Route) error { return k.h.RouteReplace(r) }

func (k *netlinkKernel) RouteDel(r *netlink.Route) error {
	err := k.h.RouteDel(r)
	if gone(err) {
		return nil // already gone: deleting is idempotent
	}
	return err
}

func (k *netlinkKernel) LinkIndexes() (map[string]int, error) {
	links, err := nlutil.DumpAgain(k.h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	out := make(map[string]int, len(links))
	for _, l := range links {
		out[l.Attrs().Name] = l.Attrs().Index
	}
	return out, nil
}

func (k *netlinkKernel) Links() ([]netlink.Link, error) { return nlutil.DumpAgain(k.h.LinkList) }

func (k *netlinkKernel) LinkHoldingAddr(addr []byte) (int, error) {
	addrs, err := nlutil.DumpAgain(func() ([]netlink.Addr, error) { return k.h.AddrList(nil, netlink.FAMILY_ALL) })
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

func (k *netlinkKernel) Link(name string) (netlink.Link, error) {
	l, err := k.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	return l, err
}

func (k *netlinkKernel) LinkByIndex(index int) (netlink.Link, error) {
	l, err := k.h.LinkByIndex(index)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	return l, err
}

func (k *netlinkKernel) LinkAdd(l netlink.Link) error { return k.h.LinkAdd(l) }

func (k *netlinkKernel) withLink(name string, f func(netlink.Link) error) error {
	l, err := k.h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	return f(l)
}

func (k *netlinkKernel) LinkDel(name string) error {
	l, err := k.Link(name)
	if err != nil || l == nil {
		return err
	}
	return k.h.LinkDel(l)
}

func (k *netlinkKernel) LinkSetUp(name string) error {
	return k.withLink(name, k.h.LinkSetUp)
}

func (k *netlinkKernel) LinkSetMTU(name string, mtu int) error {
	return k.withLink(name, func(l netlink.Link) error { return k.h.LinkSetMTU(l, mtu) })
}

func (k *netlinkKernel) LinkSetMAC(name string, mac net.HardwareAddr) error {
	return k.withLink(name, func(l netlink.Link) error { return k.h.LinkSetHardwareAddr(l, mac) })
}

func (k *netlinkKernel) Addrs(name string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	err := k.withLink(name, func(l netlink.Link) error {
		as, err := k.h.AddrList(l, netlink.FAMILY_ALL)
		for _, a := range as {
			ip, _ := netip.AddrFromSlice(a.IP)
			ones, _ := a.Mask.Size()
			out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
		}
		return err
	})
	return out, err
}

func toAddr(p netip.Prefix) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
}

// AddrReplace puts p on the named link. An IPv6 address skips duplicate address detection:
// sluice's addresses are tunnel addresses that IPAM made unique, and one left tentative would
// keep the tunnel from sending for a second.
func (k *netlinkKernel) AddrReplace(name string, p netip.Prefix) error {
	a := toAddr(p)
	if p.Addr().Is6() {
		a.Flags |= unix.IFA_F_NODAD
	}
	return k.withLink(name, func(l netlink.Link) error { return k.h.AddrReplace(l, a) })
}

func (k *netlinkKernel) AddrDel(name string, p netip.Prefix) error {
	return k.withLink(name, func(l netlink.Link) error { return k.h.AddrDel(l, toAddr(p)) })
}

func (k *netlinkKernel) Neighs(linkIndex, family int) ([]Neighbour, error) {
	return k.batch.neighbours(linkIndex, family)
}

func (k *netlinkKernel) NeighSet(n *netlink.Neigh) error { return k.h.NeighSet(n) }

func (k *netlinkKernel) NeighDel(n *netlink.Neigh) error {
	err := k.h.NeighDel(n)
	if gone(err) {
		return nil
	}
	return err
}

// gone reports an error that says the object to delete is not there: deleting is idempotent.
func gone(err error) bool { return err == unix.ESRCH || err == unix.ENOENT }
