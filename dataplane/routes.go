package dataplane

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/tracker"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// routeKey is a route's identity in one table: destination and metric (the kernel keeps
// routes to one destination with different metrics apart).
type routeKey struct {
	dst    netip.Prefix
	metric int
}

// kernelRoute is the part of a kernel route sluice decides.
//
// Its fields are as narrow as the kernel's (a type, a scope and a protocol are bytes, an
// interface index 32 bits): the route table holds two of these per route (desired and
// actual), 20,000 of each at 20,000 nodes.
type kernelRoute struct {
	gw   netip.Addr
	link int32
	// nh is the nexthop object the route goes through (link, gw and onlink are then unset:
	// they are the object's).
	nh uint32
	// mp numbers the route's multipath gateways (RouteTable.multipaths; 0: none), in the
	// gateways layout: link, gw and onlink are then unset, they are the paths'.
	mp       uint32
	typ      uint8
	scope    netlink.Scope
	protocol uint8
	onlink   bool
}

// RouteReporter hears what the route table does beyond its own routes.
type RouteReporter interface {
	// Conflict is called once for each foreign route that sat exactly where a sluice route
	// must go, once sluice's has replaced it (one that cannot be replaced yet, its route
	// unresolved or refused, is a leftover instead: Dataplane's OnLeftover).
	Conflict(dst netip.Prefix, metric int, protocol int)
	// NexthopConflict is called once for each nexthop object ID sluice held or picked that
	// another program's object turned out to hold; sluice's object moves to another ID.
	NexthopConflict(id uint32, protocol int)
}

// RouteTableConfig configures a RouteTable.
type RouteTableConfig struct {
	Table    int // default main (254)
	Protocol int // default DefaultRouteProtocol
	// ParentAddr is this node's IPv4 underlay address and ParentAddr6 its IPv6 one: the link
	// holding the address of a route's family is calc.ParentDevice for that route (the other
	// family's link when this one is not known: one NIC carries both on most nodes).
	ParentAddr, ParentAddr6 netip.Addr
	Reporter                RouteReporter
	// Nexthops sends every route with a gateway through a kernel nexthop object, one per
	// remote node and gateway (nexthops.go); off, each route carries its own gateway and
	// device (`via <gw> dev <dev> onlink`, as Felix lays them out).
	Nexthops bool
	// NodeName is this node's: its own host address among calc's cluster nets is its underlay
	// address (the parent), VXLAN or not.
	NodeName string
}

// RouteTable owns the routes in one table that carry sluice's protocol number.
//
// Ownership rule: a route is sluice's when its protocol is sluice's. Other routes are never
// removed or changed, except one sitting at exactly the destination and metric of a desired
// route, which is replaced (and reported). The table owns sluice's nexthop objects too (same
// rule, by the object's protocol; nexthops.go).
type RouteTable struct {
	k       Kernel
	cfg     RouteTableConfig
	tracker *tracker.Tracker[routeKey, kernelRoute]
	nh      *nexthops
	// routes holds the desired routes by destination, as calc gave them (resolved to their
	// kernel form at Apply time), with the nexthop object each goes through. One entry per
	// route: its key in the kernel (destination and metric) is its own.
	routes map[netip.Prefix]desiredRoute
	// links caches link names to indexes; refreshed when links may have changed.
	links      map[string]int
	linksStale bool
	// changed holds desired routes to resolve at the next Apply; unres those whose device
	// was missing at the last one.
	changed map[routeKey]bool
	unres   map[routeKey]bool
	// foreign holds the other programs' routes as of the last read, for the leftover scan.
	foreign  []Route
	needRead bool
	parent   int // index of the link holding ParentAddr, as of the last Apply
	parent6  int // and of the link holding ParentAddr6
	reported map[routeKey]bool
	// replacing holds the foreign routes at a desired route's key, as of the last read, until
	// sluice's replaces them: what stays after a write is in sluice's way.
	replacing  map[routeKey]Route
	writes     int
	unresolved int
	v6         int // how many desired routes are IPv6
	// multipaths numbers the sets of paths of multipath routes (kernelRoute.mp), desired or
	// read, so that a kernel route compares as one number: mpIndex by the set's text,
	// multipaths[i-1] the set.
	multipaths []multipath
	mpIndex    map[string]uint32
	// nodeDefault holds the keys where the node's own default route sits where a learned
	// default route would go, as of the last read: that route is not programmed.
	nodeDefault map[routeKey]bool
	// recursive holds the desired routes whose gateway the kernel's own routes decide
	// (calc.Route.Recursive): resolved again after every read of the table.
	recursive map[netip.Prefix]bool
	// anyRecursive is len(recursive) > 0, for the watch to read without the dataplane's lock
	// (which an apply holds throughout).
	anyRecursive atomic.Bool
}

// multipath is a multipath route's paths, sorted by gateway.
type multipath []mpath

// mpath is one path of a multipath route.
type mpath struct {
	gw     netip.Addr
	link   int
	onlink bool
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// multipathOf numbers paths (any order).
func (t *RouteTable) multipathOf(paths multipath) uint32 {
	slices.SortFunc(paths, func(a, b mpath) int {
		return cmp.Or(a.gw.Compare(b.gw), cmp.Compare(a.link, b.link), cmpBool(a.onlink, b.onlink))
	})
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, "%s@%d/%t,", p.gw, p.link, p.onlink)
	}
	key := b.String()
	if i, ok := t.mpIndex[key]; ok {
		return i
	}
	if t.mpIndex == nil {
		t.mpIndex = map[string]uint32{}
	}
	t.multipaths = append(t.multipaths, paths)
	t.mpIndex[key] = uint32(len(t.multipaths))
	return uint32(len(t.multipaths))
}

// NewRouteTable returns a route table driver; nothing is read or written until Apply.
func NewRouteTable(k Kernel, cfg RouteTableConfig) *RouteTable {
	if cfg.Table == 0 {
		cfg.Table = unix.RT_TABLE_MAIN
	}
	if cfg.Protocol == 0 {
		cfg.Protocol = DefaultRouteProtocol
	}
	return &RouteTable{k: k, cfg: cfg, tracker: tracker.New[routeKey, kernelRoute](func(a, b kernelRoute) bool { return a == b }), nh: newNexthops(cfg.Protocol),
		routes: map[netip.Prefix]desiredRoute{}, needRead: true, reported: map[routeKey]bool{}, replacing: map[routeKey]Route{},
		linksStale: true, changed: map[routeKey]bool{}, unres: map[routeKey]bool{}, nodeDefault: map[routeKey]bool{}}
}

// desiredRoute is a desired route and the nexthop object it goes through (nil: none). The
// route is calc's own, kept as calc gave it and never changed (calc.Op): one copy of each
// route in the agent, not two (BenchmarkDataplane in cmd/sluiced reports the settled agent's
// memory at 20,000 nodes).
type desiredRoute struct {
	*calc.Route
	nh *nexthopRec
}

// kernelMetric is r's metric as the kernel keys it: it stores IPv6 metric 0 as 1024.
func kernelMetric(r *calc.Route) int {
	if r.Dst.Addr().Is6() && r.Metric == 0 {
		return 1024
	}
	return r.Metric
}

func (r *desiredRoute) key() routeKey { return routeKey{dst: r.Dst, metric: kernelMetric(r.Route)} }

// SetRoute wants r in the kernel (replacing any earlier desired route to r.Dst). The table
// keeps r: the caller must not change it afterwards.
func (t *RouteTable) SetRoute(r *calc.Route) {
	old, ok := t.routes[r.Dst]
	nr := desiredRoute{Route: r}
	if ok && old.key() != nr.key() {
		t.DeleteRoute(r.Dst) // another key in the kernel
		ok = false
	}
	if ok {
		nr.nh = old.nh
	}
	// Kept even when equal to the old one: calc has let the old copy go.
	t.routes[r.Dst] = nr // resolved to its kernel form (device index) at Apply
	if !ok && r.Dst.Addr().Is6() {
		t.v6++
	}
	if !ok || !old.Route.Equal(*r) {
		t.changed[nr.key()] = true
	}
	if r.Recursive {
		if t.recursive == nil {
			t.recursive = map[netip.Prefix]bool{}
		}
		if len(t.recursive) == 0 {
			// The other programs' routes were not followed while no route resolved through
			// them: read them before the first one does.
			t.needRead = true
		}
		t.recursive[r.Dst] = true
	} else {
		delete(t.recursive, r.Dst)
	}
	t.anyRecursive.Store(len(t.recursive) > 0)
}

// HasRecursive says whether a desired route's gateway is decided by the kernel's own routes:
// then a change of those (a default route replaced) calls for a read of the table.
// It may be called without the dataplane's lock.
func (t *RouteTable) HasRecursive() bool { return t.anyRecursive.Load() }

// maxErrors is how many of one apply's errors are spelled out; the rest are counted.
const maxErrors = 10

// joinErrors joins the first maxErrors errors and says how many more there were: a batch
// that fails as a whole (a link down) must not make a log line of 20,000 errors.
func joinErrors(errs []error) error {
	if len(errs) <= maxErrors {
		return errors.Join(errs...)
	}
	return errors.Join(append(errs[:maxErrors:maxErrors], fmt.Errorf("and %d more", len(errs)-maxErrors))...)
}

// Expect says about n routes are coming (a full update): an empty table sizes its maps once
// instead of growing them route by route.
func (t *RouteTable) Expect(n int) {
	if len(t.routes) == 0 && len(t.changed) == 0 {
		t.routes = make(map[netip.Prefix]desiredRoute, n)
		t.changed = make(map[routeKey]bool, n)
		t.tracker.Expect(n)
	}
}

// DeleteRoute wants no sluice route to dst.
func (t *RouteTable) DeleteRoute(dst netip.Prefix) {
	r, ok := t.routes[dst]
	if !ok {
		return
	}
	k := r.key()
	delete(t.routes, dst)
	if dst.Addr().Is6() {
		t.v6--
	}
	delete(t.changed, k)
	delete(t.unres, k)
	delete(t.recursive, dst)
	t.anyRecursive.Store(len(t.recursive) > 0)
	t.tracker.DeleteDesired(k)
	t.nh.release(r.nh)
}

// Full takes a full update's routes: those it lacks are deleted. Sized for the routes alone:
// a full update also carries a VTEP and a cluster net per node, and maps sized for all of them
// held three times the room at 20,000 nodes.
func (t *RouteTable) Full(u *calc.Update) {
	n := 0
	for _, op := range u.Ops {
		if op.Kind() == calc.OpRoute {
			n++
		}
	}
	seen := make(map[netip.Prefix]bool, n)
	for _, op := range u.Ops {
		if op.Kind() == calc.OpRoute {
			seen[op.Route.Dst] = true
		}
	}
	t.Expect(n)
	for dst := range t.routes {
		if !seen[dst] {
			t.DeleteRoute(dst)
		}
	}
	for _, op := range u.Ops {
		t.OnOp(op)
	}
}

// OnOp takes a route, and this node's VTEP: its underlay address is the parent device of
// routes "via the parent" of its family.
func (t *RouteTable) OnOp(op calc.Op) bool {
	switch op.Kind() {
	case calc.OpRoute:
		if op.Remove {
			t.DeleteRoute(op.Route.Dst)
		} else {
			t.SetRoute(op.Route)
		}
		return true
	case calc.OpVTEP:
		if v := op.VTEP; !op.Remove && v.Local && v.Underlay.IsValid() {
			t.setParent(v.Underlay)
		}
		return true
	case calc.OpClusterNet:
		// This node's own address: the parent device's, without VXLAN too (a node routed by
		// BGP alone has no VTEP). Not the table's op: the other drivers take it as well.
		if c := op.ClusterNet; !op.Remove && c.Host && c.Node != "" && c.Node == t.cfg.NodeName && c.Prefix.IsSingleIP() {
			t.setParent(c.Prefix.Addr())
		}
	}
	return false
}

// setParent takes this node's underlay address of a's family.
func (t *RouteTable) setParent(a netip.Addr) {
	p := &t.cfg.ParentAddr
	if a.Is6() {
		p = &t.cfg.ParentAddr6
	}
	if *p != a {
		*p = a
		t.QueueResync()
	}
}

// ParentAddrs are this node's underlay addresses as the table knows them.
func (t *RouteTable) ParentAddrs() (v4, v6 netip.Addr) { return t.cfg.ParentAddr, t.cfg.ParentAddr6 }

// HasIPv6 says whether any IPv6 route is desired.
func (t *RouteTable) HasIPv6() bool { return t.v6 > 0 }

// ProgrammedLen is how many of sluice's routes the kernel holds, as last read or written.
func (t *RouteTable) ProgrammedLen() int { return t.tracker.ActualLen() }

// DesiredLen is how many routes are desired.
func (t *RouteTable) DesiredLen() int { return len(t.routes) }

// destinations are the desired routes' destinations, for the leftover pass.
func (t *RouteTable) destinations() []netip.Prefix {
	dsts := make([]netip.Prefix, 0, len(t.routes))
	for dst := range t.routes {
		dsts = append(dsts, dst)
	}
	return dsts
}

// foreignRoutes are the other programs' routes as of the last read.
func (t *RouteTable) foreignRoutes() []Route { return t.foreign }

// heldAtOurs are the foreign routes at a desired route's key, as of the last read, that
// sluice's has not replaced yet.
func (t *RouteTable) heldAtOurs() map[routeKey]Route { return t.replacing }

// unresolvedAt says whether the desired route at k could not be resolved at the last Apply
// (its device or gateway missing).
func (t *RouteTable) unresolvedAt(k routeKey) bool { return t.unres[k] }

// ReadPending says whether the next Apply reads the kernel again.
func (t *RouteTable) ReadPending() bool { return t.needRead }

// QueueResync makes the next Apply read the kernel again (drift, link changes, failures).
func (t *RouteTable) QueueResync() { t.needRead, t.linksStale = true, true }

// LinksChanged makes the next Apply look at the links again (one appeared or went).
func (t *RouteTable) LinksChanged() { t.linksStale = true }

// RouteGone records that the kernel lost one of sluice's routes (someone deleted it): the
// next Apply puts it back without reading the whole table. It reports whether the route was
// one sluice wants (a repair is due) rather than one it removed itself.
func (t *RouteTable) RouteGone(dst netip.Prefix, metric int) bool {
	k := routeKey{dst: dst, metric: metric}
	if r, ok := t.routes[dst]; ok && r.key() == k {
		t.tracker.DeleteActual(k)
		t.tracker.MarkDirty(k)
		return true
	}
	return false
}

// NexthopGone records that the kernel lost nexthop object id, and with it every route
// through it (the kernel tells of the object only). It reports whether sluice wants the object
// (a repair is due); the next Apply then reads the kernel again. (Not a repair from the event
// alone, as for a route: the event may be older than a read that already saw the object gone
// and put it back, and an object is only ever created where none is, so a stale event would
// make the next write fail.)
func (t *RouteTable) NexthopGone(id uint32) bool {
	if _, wanted := t.nh.tracker.Desired(id); !wanted {
		return false
	}
	t.needRead = true
	return true
}

// Nexthops is how many nexthop objects sluice wants and how many it holds in the kernel.
func (t *RouteTable) Nexthops() (desired, programmed int) {
	return t.nh.tracker.DesiredLen(), t.nh.tracker.ActualLen()
}

// Writes is how many routes Apply has written or deleted since the table was made.
func (t *RouteTable) Writes() int { return t.writes }

// Unresolved is how many desired routes the last Apply could not program because their
// device does not exist (yet): a workload interface that has not appeared.
func (t *RouteTable) Unresolved() int { return t.unresolved }

func routeType(t calc.RouteType) int {
	switch t {
	case calc.RouteBlackhole:
		return unix.RTN_BLACKHOLE
	case calc.RouteUnreachable:
		return unix.RTN_UNREACHABLE
	case calc.RouteProhibit:
		return unix.RTN_PROHIBIT
	}
	return unix.RTN_UNICAST
}

// resolve turns a calc route into its kernel form, or false when its device is missing.
func (t *RouteTable) resolve(r *calc.Route, links map[string]int, parent, parent6 int) (kernelRoute, bool) {
	kr := kernelRoute{typ: uint8(routeType(r.Type)), gw: r.Gateway, onlink: r.OnLink, protocol: uint8(t.cfg.Protocol)}
	if kr.typ != unix.RTN_UNICAST {
		return kr, true
	}
	if r.Recursive {
		return t.throughKernel(kr, r.Gateway)
	}
	switch r.Device {
	case "":
	case calc.ParentDevice:
		if r.Dst.Addr().Is6() {
			parent, parent6 = parent6, parent
		}
		kr.link = int32(parent)
		if kr.link == 0 {
			kr.link = int32(parent6)
		}
		if kr.link == 0 {
			return kr, false
		}
	default:
		idx, ok := links[r.Device]
		if !ok {
			return kr, false
		}
		kr.link = int32(idx)
	}
	if !r.Gateway.IsValid() && r.Dst.Addr().Is4() {
		kr.scope = netlink.SCOPE_LINK // IPv6 routes are always reported as scope universe
	}
	return kr, true
}

// throughKernel resolves a route to gateway gw through the kernel's own routes, as of the
// last read (the other programs' routes, and connected ones; never sluice's): the longest
// route holding gw gives the gateway and device (all its paths, when it has several), or, a
// route without a gateway (a connected subnet), the device to gw. False: no such route, or
// the longest is a blackhole, unreachable or prohibit route, as the kernel's lookup would
// find.
func (t *RouteTable) throughKernel(kr kernelRoute, gw netip.Addr) (kernelRoute, bool) {
	var best *Route
	bestBits := -1
	for i := range t.foreign {
		f := &t.foreign[i]
		if f.Table != t.cfg.Table {
			continue
		}
		k, ok := kernelKey(*f)
		if !ok || k.dst.Addr().Is4() != gw.Is4() || !k.dst.Contains(gw) {
			continue
		}
		if k.dst.Bits() > bestBits || (k.dst.Bits() == bestBits && f.Priority < best.Priority) {
			best, bestBits = f, k.dst.Bits()
		}
	}
	if best == nil || best.Type != unix.RTN_UNICAST {
		return kr, false // none, or the kernel's longest is a blackhole (or unreachable): so is the next hop
	}
	switch {
	case len(best.MultiPath) > 0:
		paths := make(multipath, 0, len(best.MultiPath))
		for _, p := range best.MultiPath {
			pgw, _ := netip.AddrFromSlice(p.Gw)
			if !pgw.IsValid() {
				pgw = gw
			}
			paths = append(paths, mpath{gw: pgw.Unmap(), link: p.LinkIndex, onlink: p.Flags&unix.RTNH_F_ONLINK != 0})
		}
		kr.mp, kr.gw, kr.link, kr.onlink = t.multipathOf(paths), netip.Addr{}, 0, false
	case best.Gw != nil:
		fgw, _ := netip.AddrFromSlice(best.Gw)
		kr.gw, kr.link, kr.onlink = fgw.Unmap(), int32(best.LinkIndex), best.Flags&unix.RTNH_F_ONLINK != 0
	default:
		kr.gw, kr.link, kr.onlink = gw, int32(best.LinkIndex), false
	}
	return kr, kr.link != 0 || kr.mp != 0
}

// kernelKey is a kernel route's key (false: none of sluice's could be at it).
func kernelKey(r Route) (routeKey, bool) {
	if r.Dst == nil {
		return routeKey{}, false // a default route is never sluice's
	}
	ip, ok := netip.AddrFromSlice(r.Dst.IP)
	if !ok {
		return routeKey{}, false
	}
	ones, _ := r.Dst.Mask.Size()
	return routeKey{dst: netip.PrefixFrom(ip.Unmap(), ones), metric: r.Priority}, true
}

// fromKernel is a kernel route in the form sluice compares.
func (t *RouteTable) fromKernel(r Route) (routeKey, kernelRoute, bool) {
	k, ok := kernelKey(r)
	if !ok {
		return routeKey{}, kernelRoute{}, false
	}
	kr := kernelRoute{typ: uint8(r.Type), link: int32(r.LinkIndex), onlink: r.Flags&unix.RTNH_F_ONLINK != 0, scope: r.Scope, protocol: uint8(r.Protocol)}
	if r.Gw != nil {
		gw, _ := netip.AddrFromSlice(r.Gw)
		kr.gw = gw.Unmap()
	}
	if kr.typ != unix.RTN_UNICAST {
		kr.link, kr.scope = 0, netlink.SCOPE_UNIVERSE // the kernel reports the loopback device for these
	}
	switch {
	case r.NH != 0:
		// The kernel adds the object's gateway and device, or its group's paths
		// (nexthop_compat_mode): the object is compared on its own.
		kr.nh, kr.link, kr.gw, kr.onlink = r.NH, 0, netip.Addr{}, false
	case len(r.MultiPath) > 0:
		paths := make(multipath, len(r.MultiPath))
		for i, p := range r.MultiPath {
			gw, _ := netip.AddrFromSlice(p.Gw)
			paths[i] = mpath{gw: gw.Unmap(), link: p.LinkIndex, onlink: p.Flags&unix.RTNH_F_ONLINK != 0}
		}
		kr.mp, kr.link, kr.gw, kr.onlink = t.multipathOf(paths), 0, netip.Addr{}, false
	}
	return k, kr, true
}

func (t *RouteTable) toKernel(k routeKey, kr kernelRoute) *Route {
	bits := k.dst.Addr().BitLen()
	r := &netlink.Route{
		Dst:      &net.IPNet{IP: k.dst.Addr().AsSlice(), Mask: net.CIDRMask(k.dst.Bits(), bits)},
		Table:    t.cfg.Table,
		Protocol: netlink.RouteProtocol(kr.protocol),
		Priority: k.metric,
		Type:     int(kr.typ),
		Scope:    kr.scope,
	}
	if kr.typ == unix.RTN_UNICAST {
		r.LinkIndex = int(kr.link)
	}
	if kr.gw.IsValid() {
		r.Gw = kr.gw.AsSlice()
	}
	if kr.onlink {
		r.Flags |= unix.RTNH_F_ONLINK
	}
	if kr.mp != 0 {
		for _, p := range t.multipaths[kr.mp-1] {
			info := &netlink.NexthopInfo{LinkIndex: p.link, Gw: p.gw.AsSlice()}
			if p.onlink {
				info.Flags = unix.RTNH_F_ONLINK
			}
			r.MultiPath = append(r.MultiPath, info)
		}
	}
	return &Route{Route: *r, NH: kr.nh}
}

// Apply makes the table match: after a read of the kernel (first Apply, QueueResync, or a
// failure) it adopts routes that already match, replaces what differs and deletes sluice's
// own stale routes; otherwise it writes only what changed since the last Apply. Failures are
// joined; the failed routes stay pending.
func (t *RouteTable) Apply() error {
	if err := t.prepare(); err != nil {
		return err
	}
	return t.write()
}

// prepare looks at links and the kernel as needed and resolves the desired routes.
func (t *RouteTable) prepare() error {
	all := t.linksStale // how a route resolves depends on the links only, not on a re-read
	if t.linksStale {
		links, err := t.k.LinkIndexes()
		if err != nil {
			t.needRead = true
			return err
		}
		var parents [2]int
		for i, a := range []netip.Addr{t.cfg.ParentAddr, t.cfg.ParentAddr6} {
			if a.IsValid() {
				if parents[i], err = t.k.LinkHoldingAddr(a.AsSlice()); err != nil {
					t.needRead = true
					return err
				}
			}
		}
		t.links, t.parent, t.parent6, t.linksStale = links, parents[0], parents[1], false
	}
	read := t.needRead
	if t.needRead {
		collided, err := t.read()
		if err != nil {
			return err
		}
		all = all || collided // a nexthop object changed its ID: its routes must follow
	}
	// Resolve desired routes against the links: all of them when links or the kernel may
	// have changed, else only the changed ones and those still waiting for their device.
	// Routes through nexthop objects are set once every object has its ID.
	type viaObject struct {
		k   routeKey
		kr  kernelRoute
		rec *nexthopRec
	}
	var via []viaObject
	resolve := func(dst netip.Prefix) {
		r, ok := t.routes[dst]
		if !ok {
			return
		}
		k := r.key()
		kr, ok := t.resolve(r.Route, t.links, t.parent, t.parent6)
		ok = ok && !t.nodeDefault[k]
		var rec *nexthopRec
		switch {
		case !ok:
			t.unres[k] = true
			t.tracker.DeleteDesired(k) // nothing to program until the device appears
		case t.cfg.Nexthops && kr.typ == unix.RTN_UNICAST && kr.gw.IsValid() && !r.Recursive:
			delete(t.unres, k)
			nk := nexthopKey{node: r.Node, link: int(kr.link), gw: kr.gw, onlink: kr.onlink}
			if len(r.Multipath) > 0 {
				nk = groupKey(int(kr.link), kr.onlink, r.Gateways())
			}
			rec = t.nh.use(r.nh, nk)
			via = append(via, viaObject{k, kernelRoute{typ: kr.typ, protocol: kr.protocol}, rec})
		case kr.typ == unix.RTN_UNICAST && len(r.Multipath) > 0:
			delete(t.unres, k)
			paths := make(multipath, 0, 1+len(r.Multipath))
			for _, gw := range r.Gateways() {
				paths = append(paths, mpath{gw: gw, link: int(kr.link), onlink: kr.onlink})
			}
			kr.mp, kr.link, kr.gw, kr.onlink = t.multipathOf(paths), 0, netip.Addr{}, false
			t.tracker.SetDesired(k, kr)
		default:
			delete(t.unres, k)
			t.tracker.SetDesired(k, kr)
		}
		if rec != r.nh {
			t.nh.release(r.nh)
			r.nh = rec
			t.routes[dst] = r
		}
	}
	if all {
		for dst := range t.routes {
			resolve(dst)
		}
	} else {
		for k := range t.changed {
			resolve(k.dst)
		}
		for k := range t.unres {
			resolve(k.dst)
		}
		if read {
			for dst := range t.recursive { // the kernel's routes may have moved
				resolve(dst)
			}
		}
	}
	t.nh.assign()
	for _, v := range via {
		v.kr.nh = v.rec.id
		t.tracker.SetDesired(v.k, v.kr)
	}
	t.changed = emptied(t.changed)
	t.unresolved = len(t.unres)
	return nil
}

// Diff reads the kernel and lists, without writing, what it lacks (or holds differently)
// and what it holds too much of, each line like `ip route` prints it.
func (t *RouteTable) Diff() (missing, extra []string, err error) {
	t.QueueResync()
	if err := t.prepare(); err != nil {
		return nil, nil, err
	}
	names := map[int]string{}
	for n, i := range t.links {
		names[i] = n
	}
	renderNH := func(id uint32, v nexthopValue) string {
		n := v.nexthop(id, t.cfg.Protocol)
		n.Other = v.link == 0 && v.group == ""
		return "nexthop " + RenderNexthop(n, names)
	}
	t.nh.tracker.Differences(func(id uint32, want, have nexthopValue, held bool) {
		line := renderNH(id, want)
		if held {
			line += "  (the kernel has: " + renderNH(id, have) + ")"
		}
		missing = append(missing, line)
	}, func(id uint32, have nexthopValue) {
		extra = append(extra, renderNH(id, have))
	})
	// A route through a nexthop object is shown with the object's gateway and device, as
	// `ip route` shows it: the one wanted, or the one the kernel has.
	render := func(k routeKey, kr kernelRoute, object func(uint32) (nexthopValue, bool)) string {
		r := t.toKernel(k, kr)
		if v, ok := object(kr.nh); ok && kr.nh != 0 {
			r.Gw, r.LinkIndex = v.gw.AsSlice(), v.link
			if v.onlink {
				r.Flags |= unix.RTNH_F_ONLINK
			}
		}
		return RenderRoute(*r, names)
	}
	t.tracker.Differences(func(k routeKey, want, have kernelRoute, held bool) {
		line := render(k, want, t.nh.tracker.Desired)
		if held {
			line += "  (the kernel has: " + render(k, have, t.nh.tracker.Actual) + ")"
		}
		missing = append(missing, line)
	}, func(k routeKey, have kernelRoute) {
		if ownerOfRoute(int(have.protocol), t.cfg.Protocol) == routeSluice {
			extra = append(extra, render(k, have, t.nh.tracker.Actual))
		}
	})
	for k := range t.unres {
		r, ok := t.routes[k.dst]
		if !ok {
			continue
		}
		why := fmt.Sprintf("its device %s does not exist", r.Device)
		switch {
		case t.nodeDefault[k]:
			why = "the node's own default route is at this metric, and sluice never replaces it: pick another (bgp-default-route-metric)"
		case r.Recursive:
			why = fmt.Sprintf("no route of the kernel's leads to its next hop %s", r.Gateway)
		case r.Device == calc.ParentDevice:
			why = "no interface holds this node's address"
		}
		missing = append(missing, fmt.Sprintf("%s (%s)", r.Route.String(), why))
	}
	slices.Sort(missing)
	slices.Sort(extra)
	return missing, extra, nil
}

// write sends what is pending.
func (t *RouteTable) write() error {
	var errs []error
	failed := false
	// Adds and changes go out as one packed batch, then deletes as another, each in order of
	// destination (the kernel's route trie takes sorted inserts faster: BenchmarkRouteWrite in
	// dataplane measures packed against packed-shuffled).
	type change struct {
		k routeKey
		v kernelRoute
	}
	var sets, dels []change
	t.tracker.Pending(func(k routeKey, want kernelRoute) tracker.Outcome {
		sets = append(sets, change{k, want})
		return tracker.Queued
	}, func(k routeKey, have kernelRoute) tracker.Outcome {
		if ownerOfRoute(int(have.protocol), t.cfg.Protocol) != routeSluice {
			return tracker.Skipped // not ours: never deleted
		}
		dels = append(dels, change{k, have})
		return tracker.Queued
	})
	byDst := func(a, b change) int {
		return cmp.Or(a.k.dst.Addr().Compare(b.k.dst.Addr()), cmp.Compare(a.k.dst.Bits(), b.k.dst.Bits()), cmp.Compare(a.k.metric, b.k.metric))
	}
	slices.SortFunc(sets, byDst)
	slices.SortFunc(dels, byDst)
	kernelRoutes := func(cs []change) []*Route {
		out := make([]*Route, len(cs))
		for i, c := range cs {
			out[i] = t.toKernel(c.k, c.v)
		}
		return out
	}
	// Nexthop objects before the routes through them. A route whose object failed waits
	// with it: the ID may be another program's object now.
	if refused, err := t.writeNexthops(); err != nil {
		errs = append(errs, err)
		failed = true
		sets = slices.DeleteFunc(sets, func(c change) bool { return refused[c.v.nh] })
	}
	for i, err := range t.k.RouteReplaceMany(kernelRoutes(sets)) {
		c := sets[i]
		if err != nil {
			errs = append(errs, fmt.Errorf("replacing route to %s: %w", c.k.dst, err))
			failed = true
			continue
		}
		t.writes++
		t.tracker.SetActual(c.k, c.v)
		t.tracker.Clean(c.k)
		if r, ok := t.replacing[c.k]; ok {
			delete(t.replacing, c.k)
			if !t.reported[c.k] && t.cfg.Reporter != nil {
				t.cfg.Reporter.Conflict(c.k.dst, c.k.metric, int(r.Protocol))
			}
			t.reported[c.k] = true
		}
	}
	for i, err := range t.k.RouteDelMany(kernelRoutes(dels)) {
		c := dels[i]
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting route to %s: %w", c.k.dst, err))
			failed = true
			continue
		}
		t.writes++
		t.tracker.DeleteActual(c.k)
		t.tracker.Clean(c.k)
	}
	// Nexthop objects no route needs, once the routes moved off them: deleting an object the
	// kernel still has routes through would take those with it.
	if !failed {
		if err := t.deleteNexthops(); err != nil {
			errs = append(errs, err)
			failed = true
		}
	}
	if failed {
		t.needRead = true
	}
	t.tracker.Settle()
	t.nh.tracker.Settle()
	return joinErrors(errs)
}

// writeNexthops creates or replaces the nexthop objects that differ; it returns the IDs the
// kernel refused.
func (t *RouteTable) writeNexthops() (map[uint32]bool, error) {
	// Single objects, then the groups of them.
	var fresh, changed, freshGroups, changedGroups []Nexthop
	t.nh.tracker.Pending(func(id uint32, want nexthopValue) tracker.Outcome {
		n := want.nexthop(id, t.cfg.Protocol)
		_, held := t.nh.tracker.Actual(id)
		switch {
		case held && n.Group != nil:
			changedGroups = append(changedGroups, n)
		case held:
			changed = append(changed, n)
		case n.Group != nil:
			freshGroups = append(freshGroups, n)
		default:
			fresh = append(fresh, n)
		}
		return tracker.Queued
	}, func(uint32, nexthopValue) tracker.Outcome { return tracker.Later }) // deleted after the routes
	var errs []error
	refused := map[uint32]bool{}
	for i, batch := range []struct {
		ns      []Nexthop
		replace bool
	}{{fresh, false}, {changed, true}, {freshGroups, false}, {changedGroups, true}} {
		if i >= 2 {
			// A group naming a member the kernel refused (its ID another program's now) would
			// take that program's object: it waits with its member for the next read.
			batch.ns = slices.DeleteFunc(batch.ns, func(n Nexthop) bool {
				if slices.ContainsFunc(n.Group, func(id uint32) bool { return refused[id] }) {
					refused[n.ID] = true
					return true
				}
				return false
			})
		}
		slices.SortFunc(batch.ns, func(a, b Nexthop) int { return cmp.Compare(a.ID, b.ID) })
		for i, err := range t.k.NexthopSetMany(batch.ns, batch.replace) {
			n := batch.ns[i]
			if err != nil {
				// EEXIST: another program took the ID since the last read; the read that
				// follows a failure gives sluice's object another.
				what := "via " + n.Gw.String()
				if n.Group != nil {
					what = "group " + groupString(n.Group)
				}
				errs = append(errs, fmt.Errorf("writing nexthop object %d %s: %w", n.ID, what, err))
				refused[n.ID] = true
				continue
			}
			t.writes++
			v, _ := t.nh.tracker.Desired(n.ID)
			t.nh.tracker.SetActual(n.ID, v)
			t.nh.tracker.Clean(n.ID)
		}
	}
	return refused, joinErrors(errs)
}

// deleteNexthops deletes sluice's nexthop objects that nothing wants.
func (t *RouteTable) deleteNexthops() error {
	// Groups before their members: a member deleted first would leave the group without it.
	var ids, groups []uint32
	t.nh.tracker.Pending(func(uint32, nexthopValue) tracker.Outcome { return tracker.Later }, func(id uint32, have nexthopValue) tracker.Outcome {
		if have.group != "" {
			groups = append(groups, id)
		} else {
			ids = append(ids, id)
		}
		return tracker.Queued
	})
	slices.Sort(ids)
	slices.Sort(groups)
	ids = append(groups, ids...)
	var errs []error
	for i, err := range t.k.NexthopDelMany(ids) {
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting nexthop object %d: %w", ids[i], err))
			continue
		}
		t.writes++
		t.nh.tracker.DeleteActual(ids[i])
		t.nh.tracker.Clean(ids[i])
	}
	return joinErrors(errs)
}

// read loads the table: sluice's routes, and foreign routes sitting exactly where a desired
// route goes (those are replaced by the write, and reported once when they are).
func (t *RouteTable) read() (collided bool, err error) {
	nhs, err := t.k.NexthopList()
	if err != nil && t.cfg.Nexthops {
		return false, err
	}
	// Without the nexthop layout a kernel without nexthop objects (before 5.3) is fine: none
	// of sluice's can be there. With it, sluice's objects from an earlier run are deleted.
	collided = t.nh.replaceActual(nhs, t.cfg.Protocol, func(id uint32, protocol int) {
		if t.cfg.Reporter != nil {
			t.cfg.Reporter.NexthopConflict(id, protocol)
		}
	})
	rs, err := t.k.RouteList(t.cfg.Table)
	if err != nil {
		return false, err
	}
	actual := make(map[routeKey]kernelRoute, max(len(rs), len(t.routes))) // room for what is wanted too: it will be written
	t.foreign = t.foreign[:0]
	clear(t.replacing)
	clear(t.nodeDefault)
	for _, r := range rs {
		k, kr, ok := t.fromKernel(r)
		if !ok {
			continue
		}
		owner := ownerOfRoute(int(kr.protocol), t.cfg.Protocol)
		if owner == routeSluice {
			actual[k] = kr
			continue
		}
		want, wanted := t.routes[k.dst]
		wanted = wanted && want.key() == k
		if wanted && owner == routeOther && k.dst.Bits() == 0 {
			// The node's own default route where a learned one would go (the same metric):
			// never replaced (a withdrawal would leave the node without one), reported.
			t.nodeDefault[k] = true
			t.foreign = append(t.foreign, r)
			continue
		}
		if !wanted {
			t.foreign = append(t.foreign, r)
		}
		if wanted && owner == routeOther {
			actual[k] = kr
			t.replacing[k] = r
		}
	}
	t.tracker.ReplaceActual(actual)
	t.needRead = false
	return collided, nil
}

// Routes returns the desired routes, sorted, for diagnostics.
func (t *RouteTable) Routes() []calc.Route {
	out := make([]calc.Route, 0, len(t.routes))
	for _, r := range t.routes {
		out = append(out, *r.Route)
	}
	slices.SortFunc(out, func(a, b calc.Route) int { return a.Dst.Addr().Compare(b.Dst.Addr()) })
	return out
}
