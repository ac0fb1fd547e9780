package dataplane

import (
	"fmt"
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
	routes map[int]map[string]netlink.Route
	links  map[string]int
	addrs  map[netip.Addr]int
	// fail decides, for an operation and its subject, whether it fails and with what.
	fail   func(op, subject string) error
	Writes int
}

// NewFakeKernel returns an empty fake kernel.
func NewFakeKernel() *FakeKernel {
	return &FakeKernel{routes: map[int]map[string]netlink.Route{}, links: map[string]int{}, addrs: map[netip.Addr]int{}}
}

// FailWith installs a failure rule: f is asked about each operation ("route-replace",
// "route-del", "route-list", "link-list", "addr-list") and the route destination or "" it
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
	idx := len(f.links) + 2 // 1 is lo
	f.links[name] = idx
	return idx
}

// DelLink removes a link and, as the kernel does, every route through it.
func (f *FakeKernel) DelLink(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx := f.links[name]
	delete(f.links, name)
	for _, t := range f.routes {
		for k, r := range t {
			if r.LinkIndex == idx && idx != 0 {
				delete(t, k)
			}
		}
	}
}

// AddAddr puts addr on link.
func (f *FakeKernel) AddAddr(link string, addr netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addrs[addr] = f.links[link]
}

func routeID(r *netlink.Route) string {
	return fmt.Sprintf("%s %d", r.Dst, r.Priority)
}

// PutRoute installs a route as another program would (any protocol), without counting it
// as a write.
func (f *FakeKernel) PutRoute(r netlink.Route) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.put(&r)
}

func (f *FakeKernel) put(r *netlink.Route) {
	t := f.routes[r.Table]
	if t == nil {
		t = map[string]netlink.Route{}
		f.routes[r.Table] = t
	}
	t[routeID(r)] = *r
}

func (f *FakeKernel) RouteList(table int) ([]netlink.Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("route-list", ""); err != nil {
		return nil, err
	}
	var out []netlink.Route
	for _, r := range f.routes[table] {
		out = append(out, r)
	}
	return out, nil
}

func (f *FakeKernel) RouteReplace(r *netlink.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("route-replace", r.Dst.String()); err != nil {
		return err
	}
	if r.Type == unix.RTN_UNICAST && r.LinkIndex == 0 {
		return unix.ENODEV
	}
	f.Writes++
	f.put(r)
	return nil
}

func (f *FakeKernel) RouteDel(r *netlink.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("route-del", r.Dst.String()); err != nil {
		return err
	}
	f.Writes++
	delete(f.routes[r.Table], routeID(r))
	return nil
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
		lines = append(lines, RenderRoute(r, names))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// RenderRoute prints a route like `ip route` does, with the device by name.
func RenderRoute(r netlink.Route, names map[int]string) string {
	var b strings.Builder
	switch r.Type {
	case unix.RTN_BLACKHOLE:
		b.WriteString("blackhole ")
	case unix.RTN_UNREACHABLE:
		b.WriteString("unreachable ")
	case unix.RTN_PROHIBIT:
		b.WriteString("prohibit ")
	}
	b.WriteString(r.Dst.String())
	if r.Gw != nil {
		b.WriteString(" via " + r.Gw.String())
	}
	if r.Type == unix.RTN_UNICAST && r.LinkIndex != 0 {
		n := names[r.LinkIndex]
		if n == "" {
			n = fmt.Sprintf("if%d", r.LinkIndex)
		}
		b.WriteString(" dev " + n)
	}
	fmt.Fprintf(&b, " proto %d", r.Protocol)
	if r.Scope == netlink.SCOPE_LINK {
		b.WriteString(" scope link")
	}
	if r.Priority != 0 {
		fmt.Fprintf(&b, " metric %d", r.Priority)
	}
	if r.Flags&unix.RTNH_F_ONLINK != 0 {
		b.WriteString(" onlink")
	}
	return b.String()
}
