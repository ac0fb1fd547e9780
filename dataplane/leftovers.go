package dataplane

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Leftover is something another networking program left on the node that can break sluice's
// routes: a route over a sluice destination through another device (flannel.1, cni0, another
// agent's), or a VXLAN device on sluice's VNI or UDP port. It is reported once with what to
// do, and removed only when the operator opted in (CleanConflicts).
type Leftover struct {
	// Key identifies the leftover, so each is reported once.
	Key string
	// What describes it; Fix says how to remove it by hand.
	What, Fix string
	// Kind is route, device or rule.
	Kind string
	// Dormant says it breaks nothing of sluice's by itself (another agent's device left
	// behind): reported, never removed.
	Dormant bool
	// Removed is set when sluice removed it (CleanConflicts); Gone when it was reported and
	// is no longer there.
	Removed, Gone bool
	// Err is set when removing it failed.
	Err error

	// Owner is the product that left it, when its name gives it away (calico, cilium,
	// flannel); only such a leftover is removed, with CleanConflicts.
	Owner string

	route *Route
	link  string
	// replaced: a foreign route at a desired route's key, which sluice's route replaces once
	// it can be written; never removed on its own.
	replaced bool
}

// protocolOwner names the product behind a route protocol number, when one is known: Felix
// writes its routes with protocol 80, and Calico's BGP mode has BIRD write the blackholes of
// a node's blocks.
func protocolOwner(protocol int) string {
	switch protocol {
	case 80, unix.RTPROT_BIRD:
		return "calico"
	}
	return ""
}

// findLeftovers lists the leftovers in the kernel now. Routes are judged against the desired
// destinations: a foreign route inside one (as or more specific) steals its traffic; a
// foreign route around one (less specific, e.g. a whole pool) through another device than
// the node's uplink (flannel.1, cni0, another agent's tunnel) catches the pool's traffic that
// sluice does not route. Default routes and wider routes out of the uplink are normal.
func (d *Dataplane) findLeftovers() ([]Leftover, error) {
	var out []Leftover
	names := map[int]string{}
	links, err := d.k.Links()
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	dsts := d.routes.destinations()
	for _, r := range d.routes.foreignRoutes() {
		k, ok := kernelKey(r)
		if !ok {
			continue
		}
		if k.dst.Bits() == 0 {
			continue
		}
		dev := names[r.LinkIndex]
		otherCNI := otherCNIDevice(dev)
		if ownerOfRoute(int(r.Protocol), d.protocol) == routeKernel && !otherCNI {
			continue // a connected subnet of one of the node's own interfaces
		}
		var hit netip.Prefix
		for _, dst := range dsts {
			if dst.Bits() == 0 {
				continue // a default route BGP learned: every other route is inside it
			}
			// Strictly more specific than a sluice route: it steals that route's traffic. (The
			// same destination at another metric is an operator's deliberate override.)
			inside := dst.Bits() < k.dst.Bits() && dst.Contains(k.dst.Addr())
			// Around a sluice route, through another networking program's device: it catches
			// the pool's traffic that sluice does not route.
			around := k.dst.Bits() < dst.Bits() && k.dst.Contains(dst.Addr()) && otherCNI
			if inside || around {
				hit = dst
				break
			}
		}
		if !hit.IsValid() {
			continue
		}
		rr := r
		if dev == "" {
			dev = "no device"
		}
		out = append(out, Leftover{
			Kind:  "route",
			Owner: deviceOwner(dev),
			Key:   fmt.Sprintf("route %s metric %d dev %s", k.dst, k.metric, dev),
			What:  fmt.Sprintf("route %s (protocol %d, metric %d) via %s overlaps sluice's route to %s", k.dst, r.Protocol, k.metric, dev, hit),
			Fix:   fmt.Sprintf("ip route del %s metric %d dev %s (or start sluiced with --clean-conflicts)", k.dst, k.metric, dev),
			route: &rr,
		})
	}
	// Foreign routes at exactly a desired route's destination and metric that the last write
	// could not replace (sluice's route unresolved: its device missing, say behind Calico's
	// vxlan.calico; or refused): they hold the destination meanwhile. Never removed: sluice's
	// own route replaces each once it can be written.
	for k, r := range d.routes.heldAtOurs() {
		why := "writing sluice's route failed (see the apply error)"
		if d.routes.unresolvedAt(k) {
			why = "sluice's route cannot be written yet: its device or gateway is missing"
		}
		kind := routeTypeName(r.Type)
		owner := deviceOwner(names[r.LinkIndex])
		if owner == "" {
			owner = protocolOwner(int(r.Protocol))
		}
		out = append(out, Leftover{
			Kind:  "route",
			Owner: owner,
			Key:   fmt.Sprintf("route %s metric %d at sluice's", k.dst, k.metric),
			What: fmt.Sprintf("%s route %s (protocol %d, metric %d) where sluice's route to %s goes; %s",
				kind, k.dst, r.Protocol, k.metric, k.dst, why),
			Fix:      "clear what keeps sluice's route out (a leftover device in its way is listed too); sluice's route then replaces this one",
			replaced: true,
		})
	}
	out = append(out, d.ruleLeftovers(dsts)...)
	for _, l := range links {
		vx, ok := l.(*netlink.Vxlan)
		name := l.Attrs().Name
		if !ok || name == d.vxlan.Name() || name == d.vxlan6.Name() {
			continue
		}
		if lo, ok := vxlanLeftover(vx, d.vxlan.Config(), d.vxlan6.Config()); ok {
			out = append(out, lo)
		}
	}
	// Other agents' own devices, left behind: dormant (their routes, when they overlap
	// sluice's, are leftovers of their own above).
	for _, l := range links {
		name := l.Attrs().Name
		switch name {
		case "cilium_host", "cilium_net", "bpfin.cali", "bpfout.cali":
			out = append(out, Leftover{Kind: "device", Key: "device " + name, Owner: deviceOwner(name), Dormant: true, link: name,
				What: fmt.Sprintf("%s's device %s, left by its agent: it carries nothing of sluice's", deviceOwner(name), name),
				Fix:  "ip link del " + name + " (once nothing of that product runs)"})
		}
	}
	return out, nil
}

// handleNetfilter reads other products' netfilter chains, reports each when it appears and
// when it goes, and, when allowed, removes the removable ones (NetfilterLeftover.Removable).
func (d *Dataplane) handleNetfilter() {
	nk, ok := d.k.(interface {
		conn() (*nftables.Conn, error)
	})
	if d.cfg.OnNetfilter == nil || !ok {
		return
	}
	c, err := nk.conn()
	if err != nil {
		return
	}
	found, _ := FindNetfilter(c, NetfilterView{SocketProgramsOff: d.cfg.SocketProgramsOff}) // what could be read is judged; a table that could not is left
	for i := range found {
		if n := &found[i]; d.cfg.CleanConflicts && n.Removable() {
			n.Err = n.Remove(c)
			n.Removed = n.Err == nil
		}
	}
	removed := func(n NetfilterLeftover) bool { return n.Removed }
	d.netfilter.Pass(found, NetfilterLeftover.Key, NetfilterLeftover.Effect, removed, func(n NetfilterLeftover, gone bool) {
		if gone {
			n.Gone, n.Err = true, nil
		}
		d.cfg.OnNetfilter(n)
	})
}

// handleLeftovers reports new leftovers and, when allowed, removes them. It returns whether
// anything was removed (the routes must then be read again).
func (d *Dataplane) handleLeftovers() bool {
	d.handleNetfilter()
	found, err := d.findLeftovers()
	if err != nil {
		return false
	}
	removed := false
	for i := range found {
		// A device is removed only when its owner is known (an unknown one may be someone's
		// on purpose); a route over sluice's destinations through another program's device
		// is by construction another program's.
		l := &found[i]
		if d.cfg.CleanConflicts && !l.Dormant && !l.replaced && (l.route != nil || l.Owner != "") && time.Since(d.removedLeftovers[l.Key]) > 10*time.Minute {
			d.removedLeftovers[l.Key] = time.Now()
			if l.route != nil {
				l.Err = d.k.RouteDelMany([]*Route{l.route})[0]
			} else {
				l.Err = d.k.LinkDel(l.link)
			}
			l.Removed = l.Err == nil
			removed = removed || l.Removed
		}
	}
	d.leftovers.Pass(found, func(l Leftover) string { return l.Key }, func(l Leftover) string { return fmt.Sprint(l.Dormant) },
		func(l Leftover) bool { return l.Removed },
		func(l Leftover, gone bool) {
			if gone {
				l.Gone, l.Err = true, nil
			}
			if d.cfg.OnLeftover != nil {
				d.cfg.OnLeftover(l)
			}
		})
	return removed
}

// otherCNIDevice recognises the devices other container and cloud networking programs make:
// Flannel's, the CNI bridge plugin's, Calico's, Weave's, Cilium's, kube-router's.
func otherCNIDevice(name string) bool {
	for _, p := range []string{"flannel.", "cni", "vxlan.calico", "vxlan-v6.calico", "tunl", "weave", "cilium_", "kube-bridge"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// vxlanLeftover judges another program's VXLAN device against sluice's two (IPv4 and IPv6).
// Two devices of one family on one UDP port share its socket, told apart by VNI: one on
// sluice's VNI and port keeps sluice's from being created (the kernel refuses a second), and
// a flow-based ("external", collect-metadata) one on sluice's port needs a socket of its own
// there, so sluice's cannot open the port. A device on another VNI, or another port, coexists
// and is no leftover.
func vxlanLeftover(vx *netlink.Vxlan, v4, v6 VXLANConfig) (Leftover, bool) {
	name := vx.Attrs().Name
	ipv6 := (vx.SrcAddr != nil && vx.SrcAddr.To4() == nil) || (vx.Group != nil && vx.Group.To4() == nil)
	own := v4
	if ipv6 {
		own = v6
	}
	lo := Leftover{Kind: "device", Key: "device " + name, Owner: deviceOwner(name), link: name,
		Fix: fmt.Sprintf("ip link del %s", name)}
	switch {
	case vx.FlowBased && vx.Port == own.Port:
		lo.What = fmt.Sprintf("flow-based (external) VXLAN device %s takes UDP port %d for every VNI; sluice's %s needs that port", name, vx.Port, own.Name)
	case vx.VxlanId == own.VNI && vx.Port == own.Port:
		lo.What = fmt.Sprintf("VXLAN device %s uses VNI %d on UDP port %d, which sluice's %s needs (the kernel allows one device per VNI and port)", name, vx.VxlanId, vx.Port, own.Name)
	default:
		return Leftover{}, false
	}
	if lo.Owner != "" {
		lo.Fix += " (or start sluiced with --clean-conflicts)"
	}
	return lo, true
}

// deviceOwner recognises the devices other products make by name: Calico's vxlan.calico and
// vxlan-v6.calico, Cilium's cilium_*, Flannel's flannel.N; "" otherwise.
func deviceOwner(name string) string {
	switch {
	case strings.HasSuffix(name, ".calico"):
		return "calico"
	case strings.HasPrefix(name, "cilium_"):
		return "cilium"
	case strings.HasSuffix(name, ".cali"):
		return "calico"
	case strings.HasPrefix(name, "flannel."), strings.HasPrefix(name, "flannel-v6."):
		return "flannel"
	}
	return ""
}

// ruleLeftovers lists the ip rules ahead of the main table (a priority below 32766) that send
// packets to another table holding a route over one of sluice's destinations: that route wins
// over sluice's for the packets the rule selects (Cilium's and the AWS CNI's rules are left
// so). A rule that selects by firewall mark is dormant (sluice marks nothing) and not listed.
// Their owners cannot be told from the kernel: they are reported with their fix, never removed.
func (d *Dataplane) ruleLeftovers(dsts []netip.Prefix) []Leftover {
	rk, ok := d.k.(interface {
		ruleList() ([]netlink.Rule, error)
	})
	if !ok || len(dsts) == 0 {
		return nil
	}
	rules, err := rk.ruleList()
	if err != nil {
		return nil
	}
	var out []Leftover
	tables := map[int][]Route{}
	for _, r := range rules {
		if r.Priority < 0 || r.Priority >= 32766 || r.Table == unix.RT_TABLE_MAIN || r.Table == unix.RT_TABLE_LOCAL || r.Table == unix.RT_TABLE_DEFAULT ||
			r.Table <= 0 || r.Mark != 0 || r.Invert || (r.Type != 0 && r.Type != unix.FR_ACT_TO_TBL) {
			continue
		}
		rs, seen := tables[r.Table]
		if !seen {
			rs, _ = d.k.RouteList(r.Table)
			tables[r.Table] = rs
		}
		for _, rt := range rs {
			k, ok := kernelKey(rt)
			if !ok {
				continue
			}
			var hit netip.Prefix
			for _, dst := range dsts {
				if dst.Overlaps(k.dst) && k.dst.Bits() > 0 && dst.Bits() > 0 {
					hit = dst
					break
				}
			}
			if !hit.IsValid() {
				continue
			}
			sel := "all"
			if r.Src != nil {
				sel = "from " + r.Src.String()
			}
			if r.Dst != nil {
				sel += " to " + r.Dst.String()
			}
			out = append(out, Leftover{
				Kind: "rule",
				Key:  fmt.Sprintf("rule %d table %d", r.Priority, r.Table),
				What: fmt.Sprintf("ip rule %d (%s lookup %d) sends packets to table %d, whose route %s overlaps sluice's route to %s", r.Priority, sel, r.Table, r.Table, k.dst, hit),
				Fix:  fmt.Sprintf("ip rule del priority %d (and ip route flush table %d, if nothing else uses it)", r.Priority, r.Table),
			})
			break
		}
	}
	return out
}
