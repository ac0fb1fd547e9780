package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// subscriptionBuffer is the receive buffer of each netlink subscription: bulk route changes
// (another program's, or sluice deleting 20,000 stale routes) must not overrun it.
const subscriptionBuffer = 16 << 20

// Watch subscribes to the kernel's route, link, address and neighbour changes in namespace
// ns (the current one when ns is not open) and reacts to those that may have undone sluice's
// work:
//   - one of sluice's routes deleted: put back from the event alone;
//   - one of sluice's nexthop objects deleted: put back, with every route through it, from
//     the event alone;
//   - a neighbour or FDB entry on the VXLAN device deleted: put back from the event alone;
//   - another program's route added: read the table again (at most once a second), since it
//     may sit where a sluice route goes or be a leftover;
//   - a link added: resolve devices again; a link removed or going down or up, or a VXLAN
//     device appearing or changing: read everything again (the kernel drops routes through a
//     link that goes down without telling), except sluice's own VXLAN device made or changed
//     while up, which is only looked at again (quietOwnDevice);
//   - an address added or removed: the parent interface may have changed.
//
// It returns when ctx ends, or with an error when a subscription is lost (events may have been
// dropped); the caller subscribes again, and every new subscription starts with a resync.
func (d *Dataplane) Watch(ctx context.Context, ns netns.NsHandle) error {
	lost := make(chan error, 4)
	onErr := func(err error) {
		select {
		case lost <- err:
		default:
		}
	}
	ev, stop, err := d.subscribe(ns, onErr)
	defer stop()
	if err != nil {
		return err
	}
	// Whatever happened before this subscription is unseen: read everything once. A device
	// sluice made before it is no longer new: its first event here may be a real "down".
	d.mu.Lock()
	for _, x := range d.devices() {
		x.created = 0
	}
	d.mu.Unlock()
	d.QueueResync()

	flags := map[int]net.Flags{}
	var foreignTimer <-chan time.Time
	lastForeign := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-lost:
			return err
		case u := <-ev.routes:
			if !d.onRoute(u) {
				continue
			}
			// Another program's route: resync, at most once a second.
			if since := time.Since(lastForeign); since >= time.Second {
				lastForeign = time.Now()
				d.QueueResync()
			} else if foreignTimer == nil {
				foreignTimer = time.After(time.Second - since)
			}
		case <-foreignTimer:
			foreignTimer = nil
			lastForeign = time.Now()
			d.QueueResync()
		case e, ok := <-ev.nat:
			if !ok {
				return errors.New("the nftables watch ended")
			}
			if err := d.onNAT(e); err != nil {
				return err
			}
		case id := <-ev.nexthops:
			d.onNexthopGone(id)
		case u := <-ev.links:
			d.onLink(u, flags)
		case u := <-ev.addrs:
			d.onAddr(u)
		case u := <-ev.neighs:
			d.onNeighGone(u)
		}
	}
}

// kernelEvents are the subscriptions Watch follows.
type kernelEvents struct {
	routes   chan netlink.RouteUpdate
	links    chan netlink.LinkUpdate
	addrs    chan netlink.AddrUpdate
	neighs   chan Neighbour
	nexthops chan uint32
	nat      chan *nftables.MonitorEvent // nil without a real NAT table
}

// subscribe opens Watch's subscriptions in namespace ns (this one when ns is not open); their
// errors go to onErr. stop ends them all, whatever subscribe returned.
func (d *Dataplane) subscribe(ns netns.NsHandle, onErr func(error)) (ev *kernelEvents, stop func(), err error) {
	done := make(chan struct{})
	ev = &kernelEvents{
		routes: make(chan netlink.RouteUpdate, 256), // the socket's 16 MiB buffer holds the rest of a burst
		links:  make(chan netlink.LinkUpdate, 256), addrs: make(chan netlink.AddrUpdate, 256),
		neighs: make(chan Neighbour, 1024), nexthops: make(chan uint32, 1024),
	}
	var closers []func()
	stop = func() {
		for _, c := range closers {
			c()
		}
		close(done)
		// netlink's readers close their channels once done; drain until then so none is
		// left blocked on a send.
		go func() {
			for range ev.routes {
			}
		}()
		go func() {
			for range ev.links {
			}
		}()
		go func() {
			for range ev.addrs {
			}
		}()
		go func() {
			for range ev.neighs {
			}
		}()
		go func() {
			for range ev.nexthops {
			}
		}()
	}
	var nsp *netns.NsHandle
	if ns.IsOpen() {
		nsp = &ns
	}
	if err := subscribeRoutes(nsp, d.protocol, ev.routes, done, subscriptionBuffer, onErr); err != nil {
		return ev, stop, err
	}
	if err := subscribeNexthopDeletions(nsp, d.protocol, ev.nexthops, done, onErr); err != nil {
		return ev, stop, err
	}
	if err := netlink.LinkSubscribeWithOptions(ev.links, done, netlink.LinkSubscribeOptions{Namespace: nsp, ErrorCallback: onErr,
		ReceiveBufferSize: subscriptionBuffer, ReceiveBufferForceSize: true}); err != nil {
		return ev, stop, err
	}
	if err := netlink.AddrSubscribeWithOptions(ev.addrs, done, netlink.AddrSubscribeOptions{Namespace: nsp, ErrorCallback: onErr,
		ReceiveBufferSize: subscriptionBuffer, ReceiveBufferForceSize: true}); err != nil {
		return ev, stop, err
	}
	if err := subscribeNeighDeletions(nsp, ev.neighs, done, onErr); err != nil {
		return ev, stop, err
	}
	// Deletions in nftables (sluice's table, or anything in it): the NAT table is read again.
	if d.nat != nil {
		if nk, real := d.k.(*NetlinkKernel); real {
			c, err := nk.conn()
			if err != nil {
				return ev, stop, err
			}
			// Every event, filtered in onNAT: google/nftables' deletions-only filter passes
			// none (v0.3.0).
			mon := nftables.NewMonitor(nftables.WithMonitorAction(nftables.MonitorActionAny), nftables.WithMonitorObject(nftables.MonitorObjectAny))
			nat, err := c.AddMonitor(mon)
			if err != nil {
				return ev, stop, fmt.Errorf("watching nftables: %w", err)
			}
			ev.nat = nat
			closers = append(closers, func() { mon.Close() })
		}
	}
	return ev, stop, nil
}

// onNAT handles one nftables event: a deletion in sluice's table asks for an apply. An error
// ends the watch.
func (d *Dataplane) onNAT(ev *nftables.MonitorEvent) error {
	if ev.Error != nil {
		return fmt.Errorf("nftables watch: %w", ev.Error)
	}
	switch ev.Type {
	case nftables.MonitorEventTypeDelTable, nftables.MonitorEventTypeDelChain, nftables.MonitorEventTypeDelRule,
		nftables.MonitorEventTypeDelSet, nftables.MonitorEventTypeDelSetElem:
	default:
		return nil
	}
	d.mu.Lock()
	mine := d.nat.Changed(nftTableOf(ev.Data))
	d.mu.Unlock()
	if mine {
		d.Kick()
	}
	return nil
}

// onNexthopGone puts back one of sluice's nexthop objects someone deleted, with every route
// through it.
func (d *Dataplane) onNexthopGone(id uint32) {
	d.mu.Lock()
	repair := d.routes.NexthopGone(id)
	if repair {
		d.stats.NexthopRepairs++
		d.repairing("nexthop", fmt.Sprintf("nexthop object %d (and the routes through it)", id))
	}
	d.mu.Unlock()
	if repair { // not one sluice deleted itself
		d.Kick()
	}
}

// onAddr handles an address added or removed: the parent interface, its MTU or its
// addresses may have changed.
func (d *Dataplane) onAddr(u netlink.AddrUpdate) {
	d.mu.Lock()
	d.routes.LinksChanged()
	for _, x := range d.devices() {
		x.CheckDevice()
	}
	if a, ok := netip.AddrFromSlice(u.LinkAddress.IP); ok {
		for _, x := range d.devices() {
			x.AddrChanged(a.Unmap())
		}
	}
	d.mu.Unlock()
	d.Kick()
}

// onNeighGone puts back a neighbour or FDB entry of a VXLAN device someone deleted.
func (d *Dataplane) onNeighGone(u Neighbour) {
	d.mu.Lock()
	repair := false
	for _, x := range d.devices() {
		if x.Index() != 0 && u.LinkIndex == x.Index() {
			if x.NeighGone(u.IP, u.MAC, u.Family == unix.AF_BRIDGE) {
				d.stats.NeighRepairs++
				what := fmt.Sprintf("neighbour %s lladdr %s dev %s", u.IP, u.MAC, x.Name())
				if u.Family == unix.AF_BRIDGE {
					what = fmt.Sprintf("FDB entry %s dst %s dev %s", u.MAC, u.IP, x.Name())
				}
				d.repairing("neighbour", what)
				repair = true
			}
		}
	}
	d.mu.Unlock()
	if repair { // another interface's neighbour, or one sluice no longer wants: nothing to do
		d.Kick()
	}
}

// onRoute handles one route event; it returns true for another program's new route in
// sluice's table, and for any change of another's while a route resolves through them (the
// caller decides when to resync). Sluice's own new routes never get here:
// the subscription's socket filter drops them in the kernel (routewatch.go).
func (d *Dataplane) onRoute(u netlink.RouteUpdate) bool {
	owner := ownerOfRoute(int(u.Protocol), d.protocol)
	if u.Table != d.table {
		return false
	}
	if owner != routeSluice {
		// Routes that resolve through the kernel's own (a BGP next hop through the default
		// route) follow any change of those, connected ones included.
		if d.routes.HasRecursive() { // without the lock: an apply may hold it a while
			return true
		}
	}
	if owner == routeKernel {
		return false
	}
	ours := owner == routeSluice
	switch {
	case ours && u.Type == unix.RTM_DELROUTE:
		ip, _ := netip.AddrFromSlice(u.Dst.IP)
		ones, _ := u.Dst.Mask.Size()
		d.mu.Lock()
		dst := netip.PrefixFrom(ip.Unmap(), ones)
		repair := d.routes.RouteGone(dst, u.Priority)
		if repair {
			d.stats.RouteRepairs++
			d.repairing("route", fmt.Sprintf("route to %s metric %d", dst, u.Priority))
		}
		d.mu.Unlock()
		if repair { // not sluice's own delete of a route it no longer wants
			d.Kick()
		}
		return false
	case !ours && u.Type == unix.RTM_NEWROUTE:
		return true
	}
	return false
}

// onLink handles one link event; flags remembers each link's flags to see it go up or down.
func (d *Dataplane) onLink(u netlink.LinkUpdate, flags map[int]net.Flags) {
	a := u.Attrs()
	if u.Header.Type == unix.RTM_DELLINK {
		delete(flags, a.Index)
		d.ForgetInterface(a.Name)
		d.QueueResync() // the kernel dropped the routes through it
		return
	}
	old, known := flags[a.Index]
	flags[a.Index] = a.Flags
	vxlan := u.Link != nil && u.Link.Type() == "vxlan"
	switch {
	case vxlan && !d.quietOwnDevice(a, known):
		d.QueueResync() // sluice's device went down, or another one that may be a leftover
	case !vxlan && known && (old^a.Flags)&net.FlagUp != 0:
		d.QueueResync() // down or up: routes through it were dropped
	default:
		d.mu.Lock()
		d.routes.LinksChanged()
		for _, x := range d.devices() { // the parent's MTU or addresses may have changed
			x.CheckDevice()
		}
		d.mu.Unlock()
		d.Kick()
	}
}

// quietOwnDevice reports whether a VXLAN device's link event is one of sluice's devices as
// sluice made or adopted it (same name and index), up, or just made by sluice and not up yet:
// then nothing went with it, and the device is looked at again (CheckDevice) without reading
// every route, object and entry. (A cold start's own device creation read them all again and
// left that read's garbage behind: BenchmarkRestartRead in dataplane measures such a read.) A
// device going down drops its routes, nexthop objects and entries without a word: that,
// another program's VXLAN device (a leftover?), or a device sluice did not make, reads
// everything again.
func (d *Dataplane) quietOwnDevice(a *netlink.LinkAttrs, known bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, x := range d.devices() {
		if x.Name() != a.Name || x.Index() == 0 || x.Index() != a.Index {
			continue
		}
		if a.Flags&net.FlagUp != 0 {
			x.created = 0 // seen up: its creation's events are over
			return true
		}
		return !known && x.created == a.Index // the creation's own event, before it was set up
	}
	return false
}

// repairing tells the agent (Config.OnRepair) what someone deleted that sluice puts back.
func (d *Dataplane) repairing(kind, what string) {
	if f := d.cfg.OnRepair; f != nil {
		f(kind, what)
	}
}

// nftTableOf is the table an nftables event is about ("" when the event does not say).
func nftTableOf(data any) string {
	switch x := data.(type) {
	case *nftables.Table:
		return x.Name
	case *nftables.Chain:
		if x.Table != nil {
			return x.Table.Name
		}
	case *nftables.Rule:
		if x.Table != nil {
			return x.Table.Name
		}
	case *nftables.Set:
		if x.Table != nil {
			return x.Table.Name
		}
	}
	return ""
}
