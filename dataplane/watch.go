package dataplane

import (
	"context"
	"net/netip"

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
			d.onRoute(u)
		case u := <-links:
			d.onLink(u)
		case u := <-neighs:
			if u.Type == unix.RTM_DELNEIGH && d.onVXLAN(u.LinkIndex) {
				d.mu.Lock()
				ip, _ := netip.AddrFromSlice(u.IP)
				if d.vxlan.NeighGone(ip.Unmap(), u.HardwareAddr.String(), u.Family == unix.AF_BRIDGE) {
					d.stats.NeighRepairs++
				}
				d.mu.Unlock()
				d.Kick()
			}
		}
	}
}

// onRoute: one of sluice's routes deleted is put back at once (no full read); another
// program's new route may sit where ours goes or be a leftover: read the table again.
func (d *Dataplane) onRoute(u netlink.RouteUpdate) {
	d.mu.Lock()
	cfg := d.routes.cfg
	if u.Table != cfg.Table || u.Dst == nil {
		d.mu.Unlock()
		return
	}
	if int(u.Protocol) == cfg.Protocol {
		if u.Type == unix.RTM_DELROUTE {
			ip, _ := netip.AddrFromSlice(u.Dst.IP)
			ones, _ := u.Dst.Mask.Size()
			if d.routes.RouteGone(netip.PrefixFrom(ip.Unmap(), ones), u.Priority) {
				d.stats.RouteRepairs++
			}
			d.mu.Unlock()
			d.Kick()
			return
		}
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	if u.Type == unix.RTM_NEWROUTE {
		d.QueueResync()
	}
}

// onLink: a link came or went (a workload interface, the VXLAN device, the uplink).
func (d *Dataplane) onLink(u netlink.LinkUpdate) {
	if u.Header.Type == unix.RTM_DELLINK {
		d.ForgetInterface(u.Attrs().Name)
	}
	if u.Link != nil && u.Link.Type() == "vxlan" {
		d.QueueResync() // sluice's device changed, or another one that may be a leftover
		return
	}
	d.mu.Lock()
	d.routes.LinksChanged()
	d.mu.Unlock()
	d.Kick()
}

func (d *Dataplane) onVXLAN(index int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, err := d.vxlan.k.Link(d.vxlan.cfg.Name)
	return err == nil && l != nil && l.Attrs().Index == index
}
