package dataplane

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// FakeKernel is a stateful in-memory Kernel for unit tests: it keeps routes, links and
// addresses, counts writes, renders its state as sorted text, and can be told to fail any
// operation.
type FakeKernel struct {
	mu sync.Mutex
	// routes by table, then by "dst metric".
	routes map[int]map[string]Route
	// nexthop objects by ID
	nexthops map[uint32]Nexthop
	links    map[string]int
	addrs    map[netip.Addr]int
	// attrs of links made through LinkAdd (or given by SetLink), by name
	linkObj map[string]netlink.Link
	mtu     map[string]int
	up      map[string]bool
	// neighbours by link index, family, then IP (or MAC for FDB entries)
	neighs map[int]map[int]map[string]netlink.Neigh
	// fail decides, for an operation and its subject, whether it fails and with what.
	fail   func(op, subject string) error
	Writes int
	// nat is sluice's outgoing-NAT table (nil: none).
	nat *natRules
}

// NewFakeKernel returns an empty fake kernel.
func NewFakeKernel() *FakeKernel {
	return &FakeKernel{routes: map[int]map[string]Route{}, nexthops: map[uint32]Nexthop{}, links: map[string]int{}, addrs: map[netip.Addr]int{},
		linkObj: map[string]netlink.Link{}, mtu: map[string]int{}, up: map[string]bool{}, neighs: map[int]map[int]map[string]netlink.Neigh{}}
}

// FailWith installs a failure rule: f is asked about each operation ("route-replace",
// "route-del", "route-list", "link-list", "addr-list", "nat-read", "nat-write", ...) and the
// route destination or "" it
// concerns; a non-nil error fails it. nil clears the rule.
func (f *FakeKernel) FailWith(rule func(op, subject string) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = rule
}

func (f *FakeKernel) check(op, subject string) error {
	if f.fail == nil {
		return nil
	}
	return f.fail(op, subject)
}

// AddLink adds a link with the next free index and returns it.
func (f *FakeKernel) AddLink(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i, ok := f.links[name]; ok {
		return i
	}
	return f.addLinkLocked(name)
}

func (f *FakeKernel) addLinkLocked(name string) int {
	idx := 2 // 1 is lo
	for _, i := range f.links {
		idx = max(idx, i+1)
	}
	f.links[name] = idx
	f.mtu[name] = 1500
	return idx
}

// DelLink removes a link and, as the kernel does, every route through it.
func (f *FakeKernel) DelLink(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx := f.links[name]
	delete(f.links, name)
	delete(f.linkObj, name)
	delete(f.neighs, idx)
	for a, i := range f.addrs {
		if i == idx {
			delete(f.addrs, a)
		}
	}
	for id, n := range f.nexthops {
		if n.Link == idx && idx != 0 {
			f.delNexthopLocked(id)
		}
	}
	for _, t := range f.routes {
		for k, r := range t {
			if r.LinkIndex == idx && idx != 0 {
				delete(t, k)
			}
		}
	}
}

// delNexthopLocked removes a nexthop object and, as the kernel does, every route through it;
// a group loses it (and goes too when it was the last member).
func (f *FakeKernel) delNexthopLocked(id uint32) {
	delete(f.nexthops, id)
	for gid, g := range f.nexthops {
		if i := slices.Index(g.Group, id); i >= 0 {
			g.Group = slices.Delete(slices.Clone(g.Group), i, i+1)
			f.nexthops[gid] = g
			if len(g.Group) == 0 {
				f.delNexthopLocked(gid)
			}
		}
	}
	for _, t := range f.routes {
		for k, r := range t {
			if r.NH == id {
				delete(t, k)
			}
		}
	}
}

// PutNexthop installs a nexthop object as another program (or a person) would, without
// counting it as a write.
func (f *FakeKernel) PutNexthop(n Nexthop) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nexthops[n.ID] = n
}

// DeleteNexthop removes a nexthop object (and its routes) as a person would, without counting
// it as a write.
func (f *FakeKernel) DeleteNexthop(id uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delNexthopLocked(id)
}

func (f *FakeKernel) NexthopList() ([]Nexthop, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("nexthop-list", ""); err != nil {
		return nil, err
	}
	out := make([]Nexthop, 0, len(f.nexthops))
	for _, n := range f.nexthops {
		out = append(out, n)
	}
	return out, nil
}

func (f *FakeKernel) NexthopSetMany(ns []Nexthop, replace bool) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs := make([]error, len(ns))
	for i, n := range ns {
		if errs[i] = f.check("nexthop-set", fmt.Sprint(n.ID)); errs[i] != nil {
			continue
		}
		if _, taken := f.nexthops[n.ID]; taken && !replace {
			errs[i] = unix.EEXIST
			continue
		}
		if n.Group != nil {
			for _, m := range n.Group {
				if mn, ok := f.nexthops[m]; !ok || mn.Group != nil {
					errs[i] = unix.EINVAL // "Invalid nexthop id" / "Multipath group can not be a nexthop within a group"
				}
			}
			if errs[i] != nil {
				continue
			}
		} else if n.Link == 0 || !slices.Contains(slices.Collect(maps.Values(f.links)), n.Link) {
			errs[i] = unix.ENODEV
			continue
		}
		f.Writes++
		f.nexthops[n.ID] = n
	}
	return errs
}

func (f *FakeKernel) NexthopDelMany(ids []uint32) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs := make([]error, len(ids))
	for i, id := range ids {
		if errs[i] = f.check("nexthop-del", fmt.Sprint(id)); errs[i] != nil {
			continue
		}
		f.Writes++
		f.delNexthopLocked(id)
	}
	return errs
}

// RenderNexthops prints the nexthop objects like `ip nexthop` does, sorted by ID.
func (f *FakeKernel) RenderNexthops() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := map[int]string{}
	for n, i := range f.links {
		names[i] = n
	}
	ids := slices.Sorted(maps.Keys(f.nexthops))
	lines := make([]string, len(ids))
	for i, id := range ids {
		lines[i] = RenderNexthop(f.nexthops[id], names)
	}
	return strings.Join(lines, "\n")
}

// AddAddr puts addr on link.
func (f *FakeKernel) AddAddr(link string, addr netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addrs[addr] = f.links[link]
}

func routeID(r *Route) string {
	return fmt.Sprintf("%s %d", r.Dst, r.Priority)
}

// PutRoute installs a route as another program would (any protocol), without counting it
// as a write.
func (f *FakeKernel) PutRoute(r netlink.Route) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.put(&Route{Route: r})
}

func (f *FakeKernel) put(r *Route) {
	t := f.routes[r.Table]
	if t == nil {
		t = map[string]Route{}
		f.routes[r.Table] = t
	}
	t[routeID(r)] = *r
}

// RouteList lists the table's routes; one through a nexthop object carries that object's
// gateway, device and onlink flag too, as the kernel reports it (nexthop_compat_mode).
func (f *FakeKernel) RouteList(table int) ([]Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("route-list", ""); err != nil {
		return nil, err
	}
	var out []Route
	for _, r := range f.routes[table] {
		if n, ok := f.nexthops[r.NH]; ok && r.NH != 0 && n.Group != nil {
			r.MultiPath = nil
			for _, m := range n.Group {
				info := &netlink.NexthopInfo{Gw: f.nexthops[m].Gw.AsSlice(), LinkIndex: f.nexthops[m].Link}
				if f.nexthops[m].OnLink {
					info.Flags = unix.RTNH_F_ONLINK
				}
				r.MultiPath = append(r.MultiPath, info)
			}
		} else if ok && r.NH != 0 {
			r.Gw, r.LinkIndex, r.Flags = n.Gw.AsSlice(), n.Link, 0
			if n.OnLink {
				r.Flags = unix.RTNH_F_ONLINK
			}
		}
		out = append(out, r)
	}
	return out, nil
}

func (f *FakeKernel) RouteReplace(r *netlink.Route) error {
	return f.RouteReplaceMany([]*Route{{Route: *r}})[0]
}

func (f *FakeKernel) routeReplaceLocked(r *Route) error {
	if err := f.check("route-replace", r.Dst.String()); err != nil {
		return err
	}
	if r.NH != 0 {
		if _, ok := f.nexthops[r.NH]; !ok {
			return unix.EINVAL // "Nexthop id does not exist"
		}
	} else if r.Type == unix.RTN_UNICAST && r.LinkIndex == 0 && len(r.MultiPath) == 0 {
		return unix.ENODEV
	}
	for _, p := range r.MultiPath {
		if p.LinkIndex == 0 {
			return unix.ENODEV
		}
	}
	f.Writes++
	f.put(r)
	return nil
}

func (f *FakeKernel) RouteReplaceMany(rs []*Route) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs := make([]error, len(rs))
	for i, r := range rs {
		errs[i] = f.routeReplaceLocked(r)
	}
	return errs
}

func (f *FakeKernel) RouteDel(r *netlink.Route) error {
	return f.RouteDelMany([]*Route{{Route: *r}})[0]
}

func (f *FakeKernel) RouteDelMany(rs []*Route) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs := make([]error, len(rs))
	for i, r := range rs {
		if errs[i] = f.check("route-del", r.Dst.String()); errs[i] != nil {
			continue
		}
		f.Writes++
		delete(f.routes[r.Table], routeID(r))
	}
	return errs
}

func (f *FakeKernel) NeighSetMany(ns []*netlink.Neigh) []error {
	errs := make([]error, len(ns))
	for i, n := range ns {
		errs[i] = f.NeighSet(n)
	}
	return errs
}

// DeleteRoute removes a route as a person would, without counting it as a write.
func (f *FakeKernel) DeleteRoute(table int, dst string, metric int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, n, _ := net.ParseCIDR(dst)
	delete(f.routes[table], fmt.Sprintf("%s %d", n, metric))
}

func (f *FakeKernel) LinkIndexes() (map[string]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("link-list", ""); err != nil {
		return nil, err
	}
	out := make(map[string]int, len(f.links))
	for k, v := range f.links {
		out[k] = v
	}
	return out, nil
}

func (f *FakeKernel) Links() ([]netlink.Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netlink.Link
	for name := range f.links {
		out = append(out, f.linkLocked(name))
	}
	return out, nil
}

func (f *FakeKernel) LinkHoldingAddr(addr []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("addr-list", ""); err != nil {
		return 0, err
	}
	a, _ := netip.AddrFromSlice(addr)
	return f.addrs[a.Unmap()], nil
}

// Render prints one table's routes like `ip route`, one per line, sorted.
func (f *FakeKernel) Render(table int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := map[int]string{}
	for n, i := range f.links {
		names[i] = n
	}
	var lines []string
	for _, r := range f.routes[table] {
		if n, ok := f.nexthops[r.NH]; ok && r.NH != 0 { // shown as the kernel reports it
			r.Gw, r.LinkIndex = n.Gw.AsSlice(), n.Link
			if n.OnLink {
				r.Flags |= unix.RTNH_F_ONLINK
			}
		}
		lines = append(lines, RenderRoute(r, names))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func (f *FakeKernel) linkLocked(name string) netlink.Link {
	idx, ok := f.links[name]
	if !ok {
		return nil
	}
	l := f.linkObj[name]
	if l == nil {
		l = &netlink.Device{}
	}
	a := l.Attrs()
	a.Name, a.Index, a.MTU = name, idx, f.mtu[name]
	if f.up[name] {
		a.Flags |= net.FlagUp
	}
	return l
}

func (f *FakeKernel) Link(name string) (netlink.Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("link-get", name); err != nil {
		return nil, err
	}
	return f.linkLocked(name), nil
}

func (f *FakeKernel) LinkByIndex(index int) (netlink.Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for n, i := range f.links {
		if i == index {
			return f.linkLocked(n), nil
		}
	}
	return nil, nil
}

// SetMTU sets a link's MTU as another program would.
func (f *FakeKernel) SetMTU(name string, mtu int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mtu[name] = mtu
}

func (f *FakeKernel) LinkAdd(l netlink.Link) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := l.Attrs().Name
	if err := f.check("link-add", name); err != nil {
		return err
	}
	if _, ok := f.links[name]; ok {
		return unix.EEXIST
	}
	f.Writes++
	f.addLinkLocked(name)
	if l.Attrs().MTU != 0 {
		f.mtu[name] = l.Attrs().MTU
	}
	f.linkObj[name] = l
	return nil
}

func (f *FakeKernel) LinkDel(name string) error {
	f.mu.Lock()
	if err := f.check("link-del", name); err != nil {
		f.mu.Unlock()
		return err
	}
	_, ok := f.links[name]
	if ok {
		f.Writes++
	}
	f.mu.Unlock()
	if ok {
		f.DelLink(name)
	}
	return nil
}

func (f *FakeKernel) LinkSetUp(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("link-up", name); err != nil {
		return err
	}
	if _, ok := f.links[name]; !ok {
		return unix.ENODEV
	}
	if !f.up[name] {
		f.Writes++
	}
	f.up[name] = true
	return nil
}

func (f *FakeKernel) LinkSetMTU(name string, mtu int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("link-mtu", name); err != nil {
		return err
	}
	f.Writes++
	f.mtu[name] = mtu
	return nil
}

func (f *FakeKernel) LinkSetMAC(name string, mac net.HardwareAddr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("link-mac", name); err != nil {
		return err
	}
	f.Writes++
	if l := f.linkObj[name]; l != nil {
		l.Attrs().HardwareAddr = mac
	}
	return nil
}

func (f *FakeKernel) Addrs(name string) ([]netip.Prefix, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netip.Prefix
	idx := f.links[name]
	for a, i := range f.addrs {
		if i == idx {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out, nil
}

func (f *FakeKernel) AddrReplace(name string, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("addr-replace", name); err != nil {
		return err
	}
	f.Writes++
	f.addrs[p.Addr()] = f.links[name]
	return nil
}

func (f *FakeKernel) AddrDel(name string, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Writes++
	delete(f.addrs, p.Addr())
	return nil
}

func neighID(n *netlink.Neigh) string {
	if n.Family == unix.AF_BRIDGE {
		return n.HardwareAddr.String()
	}
	return n.IP.String()
}

func (f *FakeKernel) Neighs(linkIndex, family int) ([]Neighbour, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("neigh-list", ""); err != nil {
		return nil, err
	}
	var out []Neighbour
	for _, n := range f.neighs[linkIndex][family] {
		ip, _ := netip.AddrFromSlice(n.IP)
		out = append(out, Neighbour{Family: n.Family, LinkIndex: n.LinkIndex, State: uint16(n.State), IP: ip.Unmap(), MAC: macOf(n.HardwareAddr), HasMAC: n.HardwareAddr != nil})
	}
	return out, nil
}

func (f *FakeKernel) NeighSet(n *netlink.Neigh) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("neigh-set", neighID(n)); err != nil {
		return err
	}
	f.Writes++
	byFam := f.neighs[n.LinkIndex]
	if byFam == nil {
		byFam = map[int]map[string]netlink.Neigh{}
		f.neighs[n.LinkIndex] = byFam
	}
	if byFam[n.Family] == nil {
		byFam[n.Family] = map[string]netlink.Neigh{}
	}
	byFam[n.Family][neighID(n)] = *n
	return nil
}

func (f *FakeKernel) NeighDel(n *netlink.Neigh) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("neigh-del", neighID(n)); err != nil {
		return err
	}
	f.Writes++
	delete(f.neighs[n.LinkIndex][n.Family], neighID(n))
	return nil
}

// RenderLink prints a link, its addresses, neighbours and FDB entries, sorted.
func (f *FakeKernel) RenderLink(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.linkLocked(name)
	if l == nil {
		return name + " absent"
	}
	var lines []string
	head := fmt.Sprintf("%s mtu %d up %t mac %s", name, f.mtu[name], f.up[name], l.Attrs().HardwareAddr)
	if vx, ok := l.(*netlink.Vxlan); ok {
		head += fmt.Sprintf(" vxlan id %d port %d learning %t local %s dev %d", vx.VxlanId, vx.Port, vx.Learning, vx.SrcAddr, vx.VtepDevIndex)
	}
	for a, i := range f.addrs {
		if i == l.Attrs().Index {
			lines = append(lines, "addr "+a.String())
		}
	}
	for fam, ns := range f.neighs[l.Attrs().Index] {
		for _, n := range ns {
			if fam == unix.AF_BRIDGE {
				lines = append(lines, fmt.Sprintf("fdb %s dst %s", n.HardwareAddr, n.IP))
			} else {
				lines = append(lines, fmt.Sprintf("neigh %s lladdr %s", n.IP, n.HardwareAddr))
			}
		}
	}
	slices.Sort(lines)
	return strings.Join(append([]string{head}, lines...), "\n")
}

// readNAT and writeNAT keep sluice's outgoing-NAT table in memory ("nat-read", "nat-write"
// can be failed).
func (f *FakeKernel) readNAT() (natRules, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("nat-read", ""); err != nil {
		return natRules{}, false, err
	}
	if f.nat == nil {
		return natRules{}, false, nil
	}
	return *f.nat, true, nil
}

func (f *FakeKernel) writeNAT(r *natRules) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("nat-write", ""); err != nil {
		return err
	}
	f.Writes++
	if r == nil {
		f.nat = nil
		return nil
	}
	c := *r
	f.nat = &c
	return nil
}

// NAT renders sluice's outgoing-NAT table ("" when there is none).
func (f *FakeKernel) NAT() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nat == nil {
		return ""
	}
	return f.nat.String()
}

// DeleteNAT removes the table, as someone else would.
func (f *FakeKernel) DeleteNAT() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nat = nil
}
