package dataplane

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/applyloop"
	"github.com/sluice-net/sluice/internal/tracker"
)

// Config configures the dataplane.
type Config struct {
	Routes RouteTableConfig
	VXLAN  VXLANConfig
	// NAT configures outgoing NAT (pools' natOutgoing; nat.go). It is programmed only
	// through a kernel that has nftables (the real one, the fake).
	NAT NATConfig
	// VXLANv6 configures the IPv6 device (IPv6 is set on it); its VNI and port default to
	// VXLAN's.
	VXLANv6 VXLANConfig
	// ParentAddr is this node's underlay address (of either family) when no local VTEP says
	// it (VXLAN off).
	ParentAddr netip.Addr
	// MinInterval is the least time between applies; default 1 ms. Changes that arrive
	// while an apply runs coalesce into the next one.
	MinInterval time.Duration
	// ResyncInterval is the period of the full safety-net resync; default 90 s.
	ResyncInterval time.Duration
	// Sysctl writes a sysctl (path under /proc/sys, value); nil means the real file.
	Sysctl func(path, value string) error
	// CleanConflicts lets sluice remove the leftovers it finds (see Leftover); without it
	// they are only reported.
	CleanConflicts bool
	// OnLeftover hears each leftover once (and again when it is removed).
	OnLeftover func(Leftover)
	// OnNetfilter, when set, has other products' netfilter chains read at each leftover pass
	// (through the kernel's nftables connection: a fake kernel has none) and hears each when it
	// appears, when it is removed, and when it goes (NetfilterLeftover.Gone).
	OnNetfilter func(NetfilterLeftover)
	// SocketProgramsOff says the service stage's socket programs are off (option
	// cgroup-path none, or no service stage): netfilter's service rules in nat OUTPUT then
	// take the node's own connections, and break them.
	SocketProgramsOff bool
	// OnKernelLatency, when set, hears, after each successful apply, how long the oldest
	// update it carried waited between arriving and being in the kernel.
	OnKernelLatency func(time.Duration)
	// OnRepair, when set, hears each object someone deleted that sluice puts back (kind:
	// route, nexthop, neighbour; what: the object, as `ip` would name it), from the kernel's
	// event, before the apply that repairs it. It is called with the dataplane's lock held:
	// it must not call back into the dataplane.
	OnRepair func(kind, what string)
	// OnApply, when set, hears the outcome of every apply that did something or failed,
	// and of the first apply after each full update even when it wrote nothing (the agent
	// logs, rate-limited); writes is how many kernel changes it made.
	OnApply func(err error, writes int, took time.Duration)
}

// Stats are the dataplane's counters.
type Stats struct {
	Applies, Failures, Resyncs, Writes int
	// Repairs counts drift put back: routes, nexthop objects (with their routes) and
	// neighbour or FDB entries deleted by someone.
	RouteRepairs, NexthopRepairs, NeighRepairs int
	// NATRepairs counts sluice's nftables table found changed or deleted and put back.
	NATRepairs int
	// DesiredRoutes and ProgrammedRoutes compare what calc wants with what the kernel holds;
	// DesiredNexthops and ProgrammedNexthops the same for nexthop objects.
	DesiredRoutes, ProgrammedRoutes     int
	DesiredNexthops, ProgrammedNexthops int
	// NAT is what sluice's outgoing-NAT table holds, as last read or written ("": none).
	NAT     string
	LastErr error
}

// Dataplane takes calc's updates and keeps the kernel matching them. Updates only change the
// drivers' desired state (cheap, under a lock); Run applies them, coalesced and rate-limited,
// and reads the kernel again after any failure, on every kernel change it is told of, and
// periodically.
type Dataplane struct {
	cfg Config

	mu      sync.Mutex
	routes  *RouteTable
	vxlan   *VXLAN
	vxlan6  *VXLAN         // the IPv6 device
	nat     *OutgoingNAT   // nil: the kernel has no nftables
	synced  bool           // a full update has arrived: writing is allowed
	v6dsts  int            // how many of the desired routes are IPv6
	locals  map[string]int // workload interfaces with local routes, and how many
	sysctls map[string]string
	stats   Stats
	// leftovers and netfilter are the leftovers reported and still there; removedLeftovers
	// when each was last removed (a program that puts its route back is not fought in a
	// tight loop).
	leftovers        tracker.Sightings[Leftover]
	netfilter        tracker.Sightings[NetfilterLeftover]
	removedLeftovers map[string]time.Time
	// vxlanIndex and vxlan6Index are the VXLAN devices' indexes as of the last apply (for
	// neighbour events).
	vxlanIndex, vxlan6Index int
	// table and protocol never change after New: read without the lock.
	table, protocol int

	kick chan struct{}
	// pendingSince is when the oldest update not yet in the kernel arrived (zero: none).
	pendingSince time.Time
	// fulls counts the full updates handed over; fullsApplied is fulls as the last apply
	// found it (under mu, with the state it applied), so that the apply after each full
	// update is announced.
	fulls, fullsApplied int
	// beat is when the apply loop last went round (unix nanoseconds), for liveness.
	beat atomic.Int64
}

// Alive reports whether the apply loop went round within the last d.
func (d *Dataplane) Alive(within time.Duration) bool {
	return time.Since(time.Unix(0, d.beat.Load())) < within
}

// New returns a dataplane over k; nothing is written before the first full update.
func New(k Kernel, cfg Config) *Dataplane {
	if cfg.MinInterval == 0 {
		cfg.MinInterval = time.Millisecond
	}
	if cfg.ResyncInterval == 0 {
		cfg.ResyncInterval = 90 * time.Second
	}
	if cfg.Sysctl == nil {
		cfg.Sysctl = writeSysctl
	}
	if cfg.ParentAddr.Is6() {
		cfg.Routes.ParentAddr6, cfg.VXLANv6.ParentAddr = cfg.ParentAddr, cfg.ParentAddr
	} else {
		cfg.Routes.ParentAddr, cfg.VXLAN.ParentAddr = cfg.ParentAddr, cfg.ParentAddr
	}
	cfg.VXLANv6.IPv6 = true
	if cfg.VXLANv6.VNI == 0 {
		cfg.VXLANv6.VNI = cfg.VXLAN.VNI
	}
	if cfg.VXLANv6.Port == 0 {
		cfg.VXLANv6.Port = cfg.VXLAN.Port
	}
	rt := NewRouteTable(k, cfg.Routes)
	d := &Dataplane{cfg: cfg, table: rt.cfg.Table, protocol: rt.cfg.Protocol, routes: rt, vxlan: NewVXLAN(k, cfg.VXLAN), vxlan6: NewVXLAN(k, cfg.VXLANv6),
		locals: map[string]int{}, sysctls: map[string]string{}, removedLeftovers: map[string]time.Time{},
		kick: make(chan struct{}, 1)}
	if nk, ok := k.(natKernel); ok && !cfg.NAT.Disabled {
		d.nat = newOutgoingNAT(nk, cfg.NAT)
	}
	return d
}

// OnUpdate takes one calc update.
func (d *Dataplane) OnUpdate(u *calc.Update) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pendingSince.IsZero() {
		d.pendingSince = time.Now()
	}
	if u.Full {
		d.fulls++
		// Sized for the routes alone: a full update also carries a VTEP and a cluster net
		// per node, and maps sized for all of them held three times the room at 20,000 nodes.
		nRoutes := 0
		for _, op := range u.Ops {
			if op.Route != nil {
				nRoutes++
			}
		}
		seen := make(map[netip.Prefix]bool, nRoutes)
		seenV := map[calc.VTEPKey]bool{}
		d.routes.Expect(nRoutes)
		for _, op := range u.Ops {
			if op.Route != nil {
				seen[op.Route.Dst] = true
			}
			if op.VTEP != nil {
				seenV[op.VTEP.Key()] = true
			}
		}
		for dst := range d.routes.routes {
			if !seen[dst] {
				d.deleteRouteLocked(dst)
			}
		}
		if d.nat != nil {
			d.nat.reset() // the update's ops give back what is still wanted
		}
		// The VTEPs the devices hold that the update lacks (each device holds its family's).
		for _, x := range d.devices() {
			for node, r := range x.remotes {
				if !seenV[calc.VTEPKey{Node: node, IPv6: r.tunnel.Is6()}] {
					v := r.vtep(node)
					x.DeleteVTEP(v)
				}
			}
			if x.local != nil && !seenV[x.local.Key()] {
				x.DeleteVTEP(*x.local)
			}
		}
		d.synced = true
	}
	changed := u.Full
	for _, op := range u.Ops {
		if op.VTEP != nil || op.Route != nil {
			changed = true
		}
		if d.nat != nil && d.nat.OnOp(op) {
			changed = true
		}
		switch {
		case op.VTEP != nil && op.Remove:
			for _, x := range d.devices() { // each device takes its own family's VTEPs
				x.DeleteVTEP(*op.VTEP)
			}
		case op.VTEP != nil:
			for _, x := range d.devices() {
				x.SetVTEP(*op.VTEP)
			}
			if op.VTEP.Local && op.VTEP.Underlay.IsValid() {
				d.setParentLocked(op.VTEP.Underlay)
			}
		case op.Route != nil && op.Remove:
			d.deleteRouteLocked(op.Route.Dst)
		case op.Route != nil:
			d.dropLocalLocked(op.Route.Dst)
			if _, had := d.routes.routes[op.Route.Dst]; !had && op.Route.Dst.Addr().Is6() {
				d.v6dsts++
			}
			d.routes.SetRoute(op.Route)
			if op.Route.Reason == calc.ReasonLocalWorkload && op.Route.Device != "" {
				d.locals[op.Route.Device]++
			}
		}
	}
	if changed {
		// An update of services only is not the dataplane's: an apply for it would take the
		// CPU from the one that programs them.
		d.Kick()
	}
}

// deleteRouteLocked wants no route to dst any more.
func (d *Dataplane) deleteRouteLocked(dst netip.Prefix) {
	d.dropLocalLocked(dst)
	if _, had := d.routes.routes[dst]; had && dst.Addr().Is6() {
		d.v6dsts--
	}
	d.routes.DeleteRoute(dst)
}

// dropLocalLocked forgets the workload interface of the route now desired at dst, if any.
func (d *Dataplane) dropLocalLocked(dst netip.Prefix) {
	if r, ok := d.routes.routes[dst]; ok && r.Reason == calc.ReasonLocalWorkload {
		if d.locals[r.Device]--; d.locals[r.Device] <= 0 {
			delete(d.locals, r.Device)
		}
	}
}

// setParentLocked takes this node's underlay address from its VTEP: an IPv6 one binds the IPv6
// device and the IPv6 routes that go "via the parent"; an IPv4 one the IPv4 device and routes.
func (d *Dataplane) setParentLocked(a netip.Addr) {
	if a.Is6() {
		if d.vxlan6.cfg.ParentAddr != a {
			d.vxlan6.cfg.ParentAddr = a
			d.routes.cfg.ParentAddr6 = a
			d.routes.QueueResync()
			d.vxlan6.QueueResync()
		}
		return
	}
	if d.routes.cfg.ParentAddr != a {
		d.routes.cfg.ParentAddr = a
		d.vxlan.cfg.ParentAddr = a
		d.routes.QueueResync()
		d.vxlan.QueueResync()
	}
}

// devices are the VXLAN drivers, IPv4 then IPv6.
func (d *Dataplane) devices() [2]*VXLAN { return [2]*VXLAN{d.vxlan, d.vxlan6} }

// resyncAllLocked makes the next apply read everything again.
func (d *Dataplane) resyncAllLocked() {
	d.routes.QueueResync()
	if d.nat != nil {
		d.nat.QueueResync()
	}
	for _, x := range d.devices() {
		x.QueueResync()
	}
}

// Kick asks for an apply soon.
func (d *Dataplane) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// QueueResync asks for a full read of the kernel at the next apply (the kernel changed
// under sluice), and kicks.
func (d *Dataplane) QueueResync() {
	d.mu.Lock()
	d.resyncAllLocked()
	d.stats.Resyncs++
	d.mu.Unlock()
	d.Kick()
}

// Stats returns the counters.
func (d *Dataplane) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats
	s.Writes = d.routes.Writes() + d.vxlan.Writes() + d.vxlan6.Writes()
	s.DesiredRoutes = len(d.routes.routes)
	s.ProgrammedRoutes = d.routes.tracker.ActualLen()
	s.DesiredNexthops, s.ProgrammedNexthops = d.routes.Nexthops()
	if d.nat != nil {
		s.Writes += d.nat.writes
		s.NAT = d.nat.Programmed()
	}
	return s
}

// AppliedOnce reports whether an apply ran after the first full update, whatever its outcome:
// the agent has started (failed items are retried; they must not hold the start).
func (d *Dataplane) AppliedOnce() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.synced && d.stats.Applies > 0
}

// Synced reports whether the last apply succeeded after a full update.
func (d *Dataplane) Synced() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.synced && d.stats.Applies > 0 && d.stats.LastErr == nil
}

// Apply writes what is pending now. Before the first full update it does nothing.
func (d *Dataplane) Apply() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.synced {
		return nil
	}
	d.fullsApplied = d.fulls
	var errs []error
	if err := d.applySysctls(); err != nil {
		errs = append(errs, err)
	}
	// VTEPs (device, neighbours) before the routes that use them.
	if err := d.vxlan.Apply(); err != nil {
		errs = append(errs, err)
	}
	if err := d.vxlan6.Apply(); err != nil {
		errs = append(errs, err)
	}
	if d.vxlan.index != d.vxlanIndex || d.vxlan6.index != d.vxlan6Index {
		// A new device (first, or recreated): routes through it must use its new index.
		d.vxlanIndex, d.vxlan6Index = d.vxlan.index, d.vxlan6.index
		d.routes.QueueResync()
	}
	scan := d.routes.needRead
	if err := d.routes.Apply(); err != nil {
		errs = append(errs, err)
	}
	// NAT's failures are its own: retried (the table is read again), but they make no other
	// driver read the kernel again.
	var natErr error
	if d.nat != nil {
		natErr = d.nat.Apply()
		if d.nat.repaired {
			d.stats.NATRepairs++
			d.repairing("nat", "nftables table "+NATTable)
		}
	}
	if scan && d.handleLeftovers() {
		d.resyncAllLocked()
		d.Kick()
	}
	routing := errors.Join(errs...)
	err := errors.Join(routing, natErr)
	d.stats.Applies++
	d.stats.LastErr = err
	if err == nil && !d.pendingSince.IsZero() {
		if f := d.cfg.OnKernelLatency; f != nil {
			f(time.Since(d.pendingSince))
		}
		d.pendingSince = time.Time{}
	}
	if err != nil {
		d.stats.Failures++
	}
	if routing != nil {
		d.resyncAllLocked() // a failure makes the next apply a full resync
	}
	return err
}

// applySysctls sets what forwarding to workloads needs: IPv4 forwarding (IPv6 forwarding too
// once any IPv6 route is desired), and on each local
// workload's interface proxy ARP (workloads route via a link-local gateway the host answers
// for), no proxy delay, and forwarding. Values are written only when they differ from what
// sluice last wrote.
func (d *Dataplane) applySysctls() error {
	want := map[string]string{"net/ipv4/ip_forward": "1"}
	if d.v6dsts > 0 {
		// IPv6 routes to route: the host must forward IPv6 too. (On a host that configures
		// its own uplink by router advertisements, accept_ra=2 keeps them working.)
		want["net/ipv6/conf/all/forwarding"] = "1"
	}
	for dev := range d.locals {
		want["net/ipv4/conf/"+dev+"/proxy_arp"] = "1"
		want["net/ipv4/neigh/"+dev+"/proxy_delay"] = "0"
		want["net/ipv4/conf/"+dev+"/forwarding"] = "1"
	}
	var errs []error
	for path, v := range want {
		if d.sysctls[path] == v {
			continue
		}
		if err := d.cfg.Sysctl(path, v); err != nil {
			if errors.Is(err, os.ErrNotExist) && (strings.Contains(path, "/conf/") || strings.Contains(path, "/neigh/")) {
				continue // the interface is not there yet; its link event brings us back
			}
			errs = append(errs, err)
			continue
		}
		d.sysctls[path] = v
	}
	return errors.Join(errs...)
}

func writeSysctl(path, value string) error {
	p := filepath.Join("/proc/sys", path)
	cur, err := os.ReadFile(p)
	if err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err != nil {
		return err
	}
	return os.WriteFile(p, []byte(value), 0o644)
}

// ForgetInterface drops what sluice remembers writing for a workload interface (it went, and
// a new one of the same name needs its sysctls again).
func (d *Dataplane) ForgetInterface(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for p := range d.sysctls {
		if strings.Contains(p, "/"+name+"/") {
			delete(d.sysctls, p)
		}
	}
}

// Run applies whenever kicked, at most every MinInterval, retries failures with backoff
// (100 ms doubling to 10 s) and resyncs every ResyncInterval, until ctx ends. Stopping leaves
// the dataplane in place.
func (d *Dataplane) Run(ctx context.Context) {
	announced := 0 // the full updates whose apply was announced
	loop := applyloop.Loop{Kick: d.kick, MinInterval: d.cfg.MinInterval, Beat: &d.beat,
		Ticks: []applyloop.Tick{{Every: d.cfg.ResyncInterval, Do: func() bool { d.QueueResync(); return false }}},
		Apply: func() error {
			start := time.Now()
			before := d.Stats().Writes
			err := d.Apply()
			if f := d.cfg.OnApply; f != nil {
				// The first apply after a full update is always told, writes or not: a
				// restart that finds the kernel right writes nothing, and that is news too.
				d.mu.Lock()
				fulls := d.fullsApplied
				d.mu.Unlock()
				afterFull := fulls != announced && d.AppliedOnce()
				if w := d.Stats().Writes - before; w > 0 || err != nil || afterFull {
					f(err, w, time.Since(start))
				}
				if afterFull {
					announced = fulls
				}
			}
			return err
		}}
	loop.Run(ctx)
}

// Diff compares the kernel with the desired state given by a full update, writing nothing:
// what the kernel lacks or holds differently, and what sluice-owned state it holds too much of.
func Diff(k Kernel, cfg Config, u *calc.Update) (missing, extra []string, err error) {
	d := New(k, cfg)
	d.OnUpdate(u)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, x := range d.devices() {
		xm, xe, err := x.Diff()
		if err != nil {
			return nil, nil, err
		}
		missing, extra = append(missing, xm...), append(extra, xe...)
	}
	rm, re, err := d.routes.Diff()
	if err != nil {
		return nil, nil, err
	}
	if d.nat != nil {
		nd, err := d.nat.Diff()
		if err != nil {
			return nil, nil, err
		}
		if nd != "" {
			missing = append(missing, nd)
		}
	}
	return append(missing, rm...), append(extra, re...), nil
}
