package dataplane

import (
	"context"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Watch subscribes to the kernel's route, link and neighbour changes in namespace ns (the
// current one when ns is not open) and asks for a resync whenever one may have undone
// sluice's work: one of its routes deleted, another program's route put where a sluice route
// goes, a link added or removed (a workload interface, the VXLAN device), a neighbour or FDB
// entry on the VXLAN device removed. It returns when ctx ends.
func (d *Dataplane) Watch(ctx context.Context, ns netns.NsHandle) error {
	done := make(chan struct{})
	defer close(done)
	routes := make(chan netlink.RouteUpdate, 1024)
	links := make(chan netlink.LinkUpdate, 256)
	neighs := make(chan netlink.NeighUpdate, 1024)
	lost := make(chan error, 3)
	onErr := func(err error) {
		select {
		case lost <- err:
		default:
		}
	}
	var nsp *netns.NsHandle
	if ns.IsOpen() {
		nsp = &ns
	}
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: nsp, ErrorCallback: onErr}); err != nil {
		return err
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{Namespace: nsp, ErrorCallback: onErr}); err != nil {
		return err
	}
	if err := netlink.NeighSubscribeWithOptions(neighs, done, netlink.NeighSubscribeOptions{Namespace: nsp, ErrorCallback: onErr}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-lost:
			// A lost subscription (e.g. an overrun socket) may have dropped events: read
			// everything again; the caller restarts the watch.
			d.QueueResync()
			return err
		case u := <-routes:
			if d.routeMatters(u) {
				d.QueueResync()
			}
		case u := <-links:
			if u.Header.Type == unix.RTM_DELLINK {
				d.ForgetInterface(u.Attrs().Name)
			}
			d.QueueResync()
		case u := <-neighs:
			if u.Type == unix.RTM_DELNEIGH && d.onVXLAN(u.LinkIndex) {
				d.QueueResync()
			}
		}
	}
}

func (d *Dataplane) routeMatters(u netlink.RouteUpdate) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	cfg := d.routes.cfg
	if u.Table != cfg.Table || u.Dst == nil {
		return false
	}
	if int(u.Protocol) == cfg.Protocol {
		return u.Type == unix.RTM_DELROUTE // one of ours removed
	}
	// Another program's new route: where ours goes, or a leftover to look at.
	return u.Type == unix.RTM_NEWROUTE
}

func (d *Dataplane) onVXLAN(index int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, err := d.vxlan.k.Link(d.vxlan.cfg.Name)
	return err == nil && l != nil && l.Attrs().Index == index
}
