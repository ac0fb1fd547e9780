package dataplane

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/tracker"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// VXLAN defaults, chosen so sluice nodes and Calico nodes can share a cluster (Calico's
// devices are vxlan.calico and vxlan-v6.calico, both on VNI 4096 and port 4789).
const (
	DefaultVXLANName   = calc.DefaultVXLANDevice
	DefaultVXLANNameV6 = calc.DefaultVXLANDeviceV6
	DefaultVNI         = 4096
	DefaultVXLANPort   = 4789
	// What VXLAN adds to a packet: outer IPv4 (20) or IPv6 (40), UDP (8), VXLAN (8) and the
	// inner Ethernet header (14).
	vxlanOverhead  = 50
	vxlanOverhead6 = 70
)

// VXLANConfig configures a VXLAN device: the IPv4 one, or with IPv6 set the IPv6 one (IPv6
// tunnel addresses over an IPv6 underlay, as Calico's vxlan-v6.calico).
type VXLANConfig struct {
	IPv6 bool
	Name string // default vxlan.sluice, or vxlan-v6.sluice with IPv6
	VNI  int    // default 4096
	Port int    // default 4789
	// MTU of the device; 0 means the parent's MTU minus 50 (IPv6: minus 70).
	MTU int
	// ParentAddr is this node's underlay address; the device is bound to the link holding it
	// and sends from it.
	ParentAddr netip.Addr
}

// VXLAN owns one of sluice's VXLAN devices (recognised by its name), its address, and every
// neighbour and FDB entry on it: the remote VTEPs, as permanent neighbour entries (tunnel
// address → MAC) and FDB entries (MAC → underlay address). Learning is off: nothing but sluice
// writes entries there.
type VXLAN struct {
	k     Kernel
	cfg   VXLANConfig
	local *calc.VTEP
	// remotes are the remote VTEPs by node; neigh: remote tunnel address → MAC; fdb: remote
	// MAC → underlay address.
	remotes  map[string]remoteVTEP
	neigh    *tracker.Tracker[netip.Addr, macAddr]
	fdb      *tracker.Tracker[macAddr, netip.Addr]
	needRead bool
	writes   int
	// index is the device's index as of the last Apply (0: none).
	index int
	// deviceChecked is set once the device was found (or made) as wanted; the device is
	// looked at again only after a change, a resync, or a link or address event (CheckDevice),
	// so an apply for one new route does not dump links and addresses.
	deviceChecked bool
	// created is the index of the device sluice made last, until the watch sees it up or
	// subscribes again (0: none): its creation's link event says it is down, which is no news
	// (Dataplane.quietOwnDevice).
	created int
	// Recreated counts devices sluice deleted because they did not match (wrong VNI, port,
	// learning, parent).
	Recreated int
}

// NewVXLAN returns the driver; nothing is touched until Apply.
func NewVXLAN(k Kernel, cfg VXLANConfig) *VXLAN {
	if cfg.Name == "" {
		cfg.Name = DefaultVXLANName
		if cfg.IPv6 {
			cfg.Name = DefaultVXLANNameV6
		}
	}
	if cfg.VNI == 0 {
		cfg.VNI = DefaultVNI
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultVXLANPort
	}
	eq := func(a, b macAddr) bool { return a == b }
	return &VXLAN{k: k, cfg: cfg, remotes: map[string]remoteVTEP{}, neigh: tracker.New[netip.Addr, macAddr](eq),
		fdb: tracker.New[macAddr, netip.Addr](func(a, b netip.Addr) bool { return a == b }), needRead: true}
}

// family is the address family of the device's tunnel addresses and underlay.
func (x *VXLAN) family() int {
	if x.cfg.IPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// SetVTEP wants a VTEP of the device's family: this node's (the device) or a remote one
// (neighbour and FDB entry); VTEPs of the other family are the other device's.
func (x *VXLAN) SetVTEP(v calc.VTEP) {
	if v.TunnelAddr.Is6() != x.cfg.IPv6 {
		return
	}
	if v.Local {
		c := v
		x.local = &c
		x.deviceChecked = false
		return
	}
	if old, ok := x.remotes[v.Node]; ok && !old.is(v) {
		x.DeleteVTEP(old.vtep(v.Node)) // its MAC or addresses changed: the old entries are not wanted
	}
	x.remotes[v.Node] = remoteVTEP{tunnel: v.TunnelAddr, underlay: v.Underlay, mac: macOf(v.MAC)}
	x.neigh.SetDesired(v.TunnelAddr, macOf(v.MAC))
	x.fdb.SetDesired(macOf(v.MAC), v.Underlay)
}

// remoteVTEP is what the device needs of a remote VTEP: its addresses and MAC by value, not
// calc's VTEP (a copy of every node's, with its MAC as a slice, at 20,000 nodes).
type remoteVTEP struct {
	tunnel, underlay netip.Addr
	mac              macAddr
}

func (r remoteVTEP) is(v calc.VTEP) bool {
	return r.tunnel == v.TunnelAddr && r.underlay == v.Underlay && r.mac == macOf(v.MAC)
}

func (r remoteVTEP) vtep(node string) calc.VTEP {
	return calc.VTEP{Node: node, TunnelAddr: r.tunnel, Underlay: r.underlay, MAC: r.mac.hw()}
}

// DeleteVTEP withdraws a VTEP.
func (x *VXLAN) DeleteVTEP(v calc.VTEP) {
	if v.TunnelAddr.Is6() != x.cfg.IPv6 {
		return
	}
	if v.Local {
		x.local = nil
		x.deviceChecked = false // the device goes at the next Apply
		return
	}
	if old, ok := x.remotes[v.Node]; ok && old.is(v) {
		delete(x.remotes, v.Node)
	}
	if mac, ok := x.neigh.Desired(v.TunnelAddr); ok && mac == macOf(v.MAC) {
		x.neigh.DeleteDesired(v.TunnelAddr)
	}
	if u, ok := x.fdb.Desired(macOf(v.MAC)); ok && u == v.Underlay {
		x.fdb.DeleteDesired(macOf(v.MAC))
	}
}

// Full takes a full update's VTEPs of the device's family: those it lacks are deleted.
func (x *VXLAN) Full(u *calc.Update) {
	seen := map[calc.VTEPKey]bool{}
	for _, op := range u.Ops {
		if op.Kind() == calc.OpVTEP {
			seen[op.VTEP.Key()] = true
		}
	}
	for node, r := range x.remotes {
		if !seen[calc.VTEPKey{Node: node, IPv6: r.tunnel.Is6()}] {
			x.DeleteVTEP(r.vtep(node))
		}
	}
	if x.local != nil && !seen[x.local.Key()] {
		x.DeleteVTEP(*x.local)
	}
	for _, op := range u.Ops {
		x.OnOp(op)
	}
}

// OnOp takes a VTEP. This node's, with an underlay address of the device's family, binds the
// device to that address (whichever family its tunnel address is).
func (x *VXLAN) OnOp(op calc.Op) bool {
	if op.Kind() != calc.OpVTEP {
		return false
	}
	v := op.VTEP
	if op.Remove {
		x.DeleteVTEP(*v)
		return true
	}
	x.SetVTEP(*v)
	if v.Local && v.Underlay.IsValid() && v.Underlay.Is6() == x.cfg.IPv6 && x.cfg.ParentAddr != v.Underlay {
		x.cfg.ParentAddr = v.Underlay
		x.QueueResync()
	}
	return true
}

// Config is the device's configuration (its parent address as last taken from this node's
// VTEP).
func (x *VXLAN) Config() VXLANConfig { return x.cfg }

// ParentAddr is the underlay address the device is bound to.
func (x *VXLAN) ParentAddr() netip.Addr { return x.cfg.ParentAddr }

// AddrChanged hears that address a came or went on some link: the device bound to it is
// read again.
func (x *VXLAN) AddrChanged(a netip.Addr) {
	if a == x.cfg.ParentAddr {
		x.QueueResync()
	}
}

// Index is the device's index as of the last Apply (0: none).
func (x *VXLAN) Index() int { return x.index }

// NeighGone records that a neighbour (by IP) or FDB entry (AF_BRIDGE, by MAC)
// on the device was deleted by someone: the next Apply puts it back without a full read.
// It reports whether the entry is one sluice wants (a repair is due).
func (x *VXLAN) NeighGone(ip netip.Addr, mac macAddr, fdb bool) bool {
	if fdb {
		if _, ok := x.fdb.Desired(mac); ok {
			x.fdb.DeleteActual(mac)
			x.fdb.MarkDirty(mac)
			return true
		}
		return false
	}
	if _, ok := x.neigh.Desired(ip); ok {
		x.neigh.DeleteActual(ip)
		x.neigh.MarkDirty(ip)
		return true
	}
	return false
}

// QueueResync makes the next Apply read the device and its entries again.
func (x *VXLAN) QueueResync() { x.needRead, x.deviceChecked = true, false }

// CheckDevice makes the next Apply look at the device again (a link or address changed).
func (x *VXLAN) CheckDevice() { x.deviceChecked = false }

// Writes is how many changes Apply has made.
func (x *VXLAN) Writes() int { return x.writes }

// Name is the device's name.
func (x *VXLAN) Name() string { return x.cfg.Name }

// Apply makes the device and its entries match. Without a local VTEP (VXLAN off, or this
// node has no tunnel address yet) the device is removed.
func (x *VXLAN) Apply() error {
	if x.local == nil {
		if x.deviceChecked && x.index == 0 {
			return nil // known absent; a link event or a resync looks again
		}
		x.index = 0
		l, err := x.k.Link(x.cfg.Name)
		if err != nil {
			return err
		}
		if l != nil {
			if err := x.k.LinkDel(x.cfg.Name); err != nil {
				return err
			}
			x.writes++
		}
		x.deviceChecked = true
		return nil
	}
	idx := x.index
	if !x.deviceChecked || idx == 0 {
		var err error
		if idx, err = x.ensureDevice(); err != nil {
			x.needRead = true
			return err
		}
		x.index, x.deviceChecked = idx, true
	}
	if x.needRead {
		if err := x.read(idx); err != nil {
			return err
		}
	}
	var errs []error
	// New and changed entries go out as one packed batch, neighbours before FDB entries (each
	// in order); then deletes, which are rare, one by one.
	type entry struct {
		what string
		n    *netlink.Neigh
		ok   func()
	}
	var sets []entry
	var dels []func()
	x.neigh.Pending(func(ip netip.Addr, mac macAddr) tracker.Outcome {
		hw := mac.hw()
		sets = append(sets, entry{"setting neighbour " + ip.String(),
			&netlink.Neigh{LinkIndex: idx, Family: x.family(), State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: hw},
			func() { x.neigh.SetActual(ip, mac); x.neigh.Clean(ip) }})
		return tracker.Queued
	}, func(ip netip.Addr, mac macAddr) tracker.Outcome {
		dels = append(dels, func() {
			err := x.k.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: x.family(), IP: ip.AsSlice()})
			x.done(err, &errs, "deleting neighbour "+ip.String(), func() { x.neigh.DeleteActual(ip); x.neigh.Clean(ip) })
		})
		return tracker.Queued
	})
	slices.SortFunc(sets, func(a, b entry) int { return slices.Compare(a.n.IP, b.n.IP) })
	neighs := len(sets)
	x.fdb.Pending(func(mac macAddr, dst netip.Addr) tracker.Outcome {
		hw := mac.hw()
		sets = append(sets, entry{"setting FDB entry " + mac.String(),
			&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT, IP: dst.AsSlice(), HardwareAddr: hw},
			func() { x.fdb.SetActual(mac, dst); x.fdb.Clean(mac) }})
		return tracker.Queued
	}, func(mac macAddr, dst netip.Addr) tracker.Outcome {
		hw := mac.hw()
		dels = append(dels, func() {
			err := x.k.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, IP: dst.AsSlice(), HardwareAddr: hw})
			x.done(err, &errs, "deleting FDB entry "+mac.String(), func() { x.fdb.DeleteActual(mac); x.fdb.Clean(mac) })
		})
		return tracker.Queued
	})
	slices.SortFunc(sets[neighs:], func(a, b entry) int { return slices.Compare(a.n.HardwareAddr, b.n.HardwareAddr) })
	batch := make([]*netlink.Neigh, len(sets))
	for i, e := range sets {
		batch[i] = e.n
	}
	for i, err := range x.k.NeighSetMany(batch) {
		x.done(err, &errs, sets[i].what, sets[i].ok)
	}
	for _, del := range dels { // after the sets: a VTEP whose MAC changed is never left without an entry
		del()
	}
	if len(errs) > 0 {
		x.needRead = true
	}
	x.neigh.Settle()
	x.fdb.Settle()
	return joinErrors(errs)
}

func (x *VXLAN) done(err error, errs *[]error, what string, ok func()) {
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s on %s: %w", what, x.cfg.Name, err))
		return
	}
	x.writes++
	ok()
}

// ensureDevice creates the device or corrects it, and returns its index.
func (x *VXLAN) ensureDevice() (int, error) {
	parent, err := x.k.LinkHoldingAddr(x.cfg.ParentAddr.AsSlice())
	if err != nil {
		return 0, err
	}
	if parent == 0 {
		return 0, fmt.Errorf("no interface holds this node's address %s: cannot bind %s", x.cfg.ParentAddr, x.cfg.Name)
	}
	mtu := x.cfg.MTU
	if mtu == 0 {
		pl, err := x.k.LinkByIndex(parent)
		if err != nil || pl == nil {
			return 0, fmt.Errorf("reading the parent interface %d: %v", parent, err)
		}
		mtu = pl.Attrs().MTU - vxlanOverhead
		if x.cfg.IPv6 {
			mtu = pl.Attrs().MTU - vxlanOverhead6
		}
	}
	want := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: x.cfg.Name, MTU: mtu, HardwareAddr: x.local.MAC},
		VxlanId: x.cfg.VNI, VtepDevIndex: parent, SrcAddr: x.cfg.ParentAddr.AsSlice(), Port: x.cfg.Port, Learning: false}
	l, err := x.k.Link(x.cfg.Name)
	if err != nil {
		return 0, err
	}
	if l != nil && !x.matches(l, parent) {
		// Sluice's device by name, but wrong in what cannot be changed in place.
		if err := x.k.LinkDel(x.cfg.Name); err != nil {
			return 0, fmt.Errorf("removing the mismatched %s: %w", x.cfg.Name, err)
		}
		x.writes++
		x.Recreated++
		l = nil
	}
	if l == nil {
		if err := x.k.LinkAdd(want); err != nil {
			return 0, fmt.Errorf("creating %s: %w", x.cfg.Name, err)
		}
		x.writes++
		x.needRead = true
		if l, err = x.k.Link(x.cfg.Name); err != nil || l == nil {
			return 0, fmt.Errorf("reading the new %s: %v", x.cfg.Name, err)
		}
		x.created = l.Attrs().Index
	}
	a := l.Attrs()
	if a.MTU != mtu {
		if err := x.k.LinkSetMTU(x.cfg.Name, mtu); err != nil {
			return 0, fmt.Errorf("setting %s's MTU: %w", x.cfg.Name, err)
		}
		x.writes++
	}
	if !bytes.Equal(a.HardwareAddr, x.local.MAC) {
		if err := x.k.LinkSetMAC(x.cfg.Name, x.local.MAC); err != nil {
			return 0, fmt.Errorf("setting %s's MAC: %w", x.cfg.Name, err)
		}
		x.writes++
	}
	if a.Flags&net.FlagUp == 0 {
		if err := x.k.LinkSetUp(x.cfg.Name); err != nil {
			return 0, fmt.Errorf("bringing %s up: %w", x.cfg.Name, err)
		}
		x.writes++
	}
	return a.Index, x.ensureAddr()
}

func (x *VXLAN) matches(l netlink.Link, parent int) bool {
	vx, ok := l.(*netlink.Vxlan)
	return ok && vx.VxlanId == x.cfg.VNI && vx.Port == x.cfg.Port && !vx.Learning && vx.VtepDevIndex == parent &&
		net.IP(x.cfg.ParentAddr.AsSlice()).Equal(vx.SrcAddr)
}

// ensureAddr puts the tunnel address on the device, alone.
func (x *VXLAN) ensureAddr() error {
	want := netip.PrefixFrom(x.local.TunnelAddr, x.local.TunnelAddr.BitLen())
	have, err := x.k.Addrs(x.cfg.Name)
	if err != nil {
		return err
	}
	found := false
	for _, p := range have {
		if p == want {
			found = true
			continue
		}
		if p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
			continue
		}
		if err := x.k.AddrDel(x.cfg.Name, p); err != nil {
			return fmt.Errorf("removing %s from %s: %w", p, x.cfg.Name, err)
		}
		x.writes++
	}
	if !found {
		if err := x.k.AddrReplace(x.cfg.Name, want); err != nil {
			return fmt.Errorf("adding %s to %s: %w", want, x.cfg.Name, err)
		}
		x.writes++
	}
	return nil
}

// read loads the device's neighbour and FDB entries: all of them are sluice's.
func (x *VXLAN) read(idx int) error {
	ns, err := x.k.Neighs(idx, x.family())
	if err != nil {
		return fmt.Errorf("%s: %w", x.cfg.Name, err)
	}
	neigh := make(map[netip.Addr]macAddr, len(ns))
	for _, n := range ns {
		if n.IP.IsValid() && n.HasMAC && n.State&netlink.NUD_PERMANENT != 0 {
			neigh[n.IP] = n.MAC
		}
	}
	fs, err := x.k.Neighs(idx, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("%s: %w", x.cfg.Name, err)
	}
	fdb := make(map[macAddr]netip.Addr, len(fs))
	for _, n := range fs {
		if n.IP.IsValid() && n.HasMAC && n.MAC != (macAddr{}) { // not the flood default
			fdb[n.MAC] = n.IP
		}
	}
	x.neigh.ReplaceActual(neigh)
	x.fdb.ReplaceActual(fdb)
	x.needRead = false
	return nil
}

// Diff lists, without writing, how the device and its entries differ from the desired ones.
func (x *VXLAN) Diff() (missing, extra []string, err error) {
	if x.local == nil {
		l, err := x.k.Link(x.cfg.Name)
		if err == nil && l != nil {
			extra = append(extra, "device "+x.cfg.Name+" (no local VTEP of its family: VXLAN off, or no tunnel address)")
		}
		return nil, extra, err
	}
	l, err := x.k.Link(x.cfg.Name)
	if err != nil {
		return nil, nil, err
	}
	if l == nil {
		missing = append(missing, fmt.Sprintf("device %s (VNI %d, port %d, address %s, MAC %s)", x.cfg.Name, x.cfg.VNI, x.cfg.Port, x.local.TunnelAddr, x.local.MAC))
		x.neigh.Differences(func(ip netip.Addr, mac, _ macAddr, _ bool) {
			missing = append(missing, fmt.Sprintf("neighbour %s lladdr %s", ip, mac))
		}, func(netip.Addr, macAddr) {})
		return missing, nil, nil
	}
	parent, _ := x.k.LinkHoldingAddr(x.cfg.ParentAddr.AsSlice())
	if !x.matches(l, parent) {
		missing = append(missing, fmt.Sprintf("device %s as sluice makes it (VNI %d, port %d, learning off, bound to this node's address)", x.cfg.Name, x.cfg.VNI, x.cfg.Port))
	}
	if !bytes.Equal(l.Attrs().HardwareAddr, x.local.MAC) {
		missing = append(missing, fmt.Sprintf("device %s MAC %s (has %s)", x.cfg.Name, x.local.MAC, l.Attrs().HardwareAddr))
	}
	if err := x.read(l.Attrs().Index); err != nil {
		return nil, nil, err
	}
	x.neigh.Differences(func(ip netip.Addr, mac, _ macAddr, _ bool) {
		missing = append(missing, fmt.Sprintf("neighbour %s lladdr %s dev %s", ip, mac, x.cfg.Name))
	}, func(ip netip.Addr, mac macAddr) {
		extra = append(extra, fmt.Sprintf("neighbour %s lladdr %s dev %s", ip, mac, x.cfg.Name))
	})
	x.fdb.Differences(func(mac macAddr, dst, _ netip.Addr, _ bool) {
		missing = append(missing, fmt.Sprintf("fdb %s dst %s dev %s", mac, dst, x.cfg.Name))
	}, func(mac macAddr, dst netip.Addr) {
		extra = append(extra, fmt.Sprintf("fdb %s dst %s dev %s", mac, dst, x.cfg.Name))
	})
	return missing, extra, nil
}

// macAddr is an Ethernet address held by value: a VTEP's neighbour and FDB entries are keyed
// by it, and 20,000 of them as strings were 20,000 small allocations twice over.
type macAddr [6]byte

// macOf is hw as a macAddr (an address of another length is kept as far as it fits: it
// matches no VTEP's, so the entry holding it is replaced).
func macOf(hw net.HardwareAddr) macAddr {
	var m macAddr
	copy(m[:], hw)
	return m
}

func (m macAddr) hw() net.HardwareAddr { return net.HardwareAddr(m[:]) }

func (m macAddr) String() string { return m.hw().String() }
