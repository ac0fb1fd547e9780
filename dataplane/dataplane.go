package dataplane

import (
	"context"
	"errors"
	"net/netip"
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
	k   Kernel // for the leftover pass; each driver has its own use of it

	mu      sync.Mutex
	routes  *RouteTable
	vxlan   *VXLAN
	vxlan6  *VXLAN       // the IPv6 device
	nat     *OutgoingNAT // nil: the kernel has no nftables
	sysctls *Sysctls
	// drivers are the above in apply order: sysctls, the VXLAN devices (the VTEPs before
	// the routes that use them), routes, NAT.
	drivers []driver
	synced  bool // a full update has arrived: writing is allowed
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
	var readSys func(string) (string, error)
	if cfg.Sysctl == nil {
		cfg.Sysctl, readSys = writeSysctl, readSysctl
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
	d := &Dataplane{cfg: cfg, k: k, table: rt.cfg.Table, protocol: rt.cfg.Protocol, routes: rt, vxlan: NewVXLAN(k, cfg.VXLAN), vxlan6: NewVXLAN(k, cfg.VXLANv6),
		sysctls: newSysctls(cfg.Sysctl, readSys, rt.HasIPv6), removedLeftovers: map[string]time.Time{}, kick: make(chan struct{}, 1)}
	d.drivers = []driver{d.sysctls, d.vxlan, d.vxlan6, d.routes}
	if nk, ok := k.(natKernel); ok && !cfg.NAT.Disabled {
		d.nat = newOutgoingNAT(nk, cfg.NAT)
		d.drivers = append(d.drivers, d.nat)
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
	changed := u.Full
	if u.Full {
		d.fulls++
		for _, dr := range d.drivers {
			dr.Full(u)
		}
		d.synced = true
	} else {
		for _, op := range u.Ops {
			for _, dr := range d.drivers {
				if dr.OnOp(op) {
					changed = true
				}
			}
		}
	}
	if changed {
		// An update of services only is not the dataplane's: an apply for it would take the
		// CPU from the one that programs them.
		d.Kick()
	}
}

// devices are the VXLAN drivers, IPv4 then IPv6.
func (d *Dataplane) devices() [2]*VXLAN { return [2]*VXLAN{d.vxlan, d.vxlan6} }

// resyncAllLocked makes the next apply read everything again.
func (d *Dataplane) resyncAllLocked() {
	for _, dr := range d.drivers {
		dr.QueueResync()
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
	s.DesiredRoutes = d.routes.DesiredLen()
	s.ProgrammedRoutes = d.routes.ProgrammedLen()
	s.DesiredNexthops, s.ProgrammedNexthops = d.routes.Nexthops()
	if d.nat != nil {
		s.Writes += d.nat.Writes()
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
	if err := d.sysctls.Apply(); err != nil {
		errs = append(errs, err)
	}
	// VTEPs (device, neighbours) before the routes that use them.
	if err := d.vxlan.Apply(); err != nil {
		errs = append(errs, err)
	}
	if err := d.vxlan6.Apply(); err != nil {
		errs = append(errs, err)
	}
	if d.vxlan.Index() != d.vxlanIndex || d.vxlan6.Index() != d.vxlan6Index {
		// A new device (first, or recreated): routes through it must use its new index.
		d.vxlanIndex, d.vxlan6Index = d.vxlan.Index(), d.vxlan6.Index()
		d.routes.QueueResync()
	}
	scan := d.routes.ReadPending()
	if err := d.routes.Apply(); err != nil {
		errs = append(errs, err)
	}
	// NAT's failures are its own: retried (the table is read again), but they make no other
	// driver read the kernel again.
	var natErr error
	if d.nat != nil {
		natErr = d.nat.Apply()
		if d.nat.Repaired() {
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

// ForgetInterface drops what sluice remembers writing for a workload interface (it went, and
// a new one of the same name needs its sysctls again).
func (d *Dataplane) ForgetInterface(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sysctls.ForgetInterface(name)
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
	for _, dr := range d.drivers {
		m, e, err := dr.Diff()
		if err != nil {
			return nil, nil, err
		}
		missing, extra = append(missing, m...), append(extra, e...)
	}
	return missing, extra, nil
}
