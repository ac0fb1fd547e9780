package dataplane

import (
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RenderNexthop prints a nexthop object like `ip nexthop` does, with the device by name.
func RenderNexthop(n Nexthop, names map[int]string) string {
	if n.Other {
		return fmt.Sprintf("id %d (a weighted or resilient group, blackhole or FDB nexthop) proto %d", n.ID, n.Protocol)
	}
	if n.Group != nil {
		return fmt.Sprintf("id %d group %s proto %d", n.ID, groupString(n.Group), n.Protocol)
	}
	dev := names[n.Link]
	if dev == "" {
		dev = fmt.Sprintf("if%d", n.Link)
	}
	line := fmt.Sprintf("id %d via %s dev %s proto %d", n.ID, n.Gw, dev, n.Protocol)
	if n.OnLink {
		line += " onlink"
	}
	return line
}

// RenderRoute prints a route like `ip route` does, with the device by name.
func RenderRoute(r Route, names map[int]string) string {
	var b strings.Builder
	switch r.Type {
	case unix.RTN_BLACKHOLE, unix.RTN_UNREACHABLE, unix.RTN_PROHIBIT:
		b.WriteString(routeTypeName(r.Type) + " ")
	}
	b.WriteString(r.Dst.String())
	if r.NH != 0 {
		fmt.Fprintf(&b, " nhid %d", r.NH)
	}
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
	if r.NH == 0 {
		for _, p := range r.MultiPath {
			n := names[p.LinkIndex]
			if n == "" {
				n = fmt.Sprintf("if%d", p.LinkIndex)
			}
			fmt.Fprintf(&b, " nexthop via %s dev %s", p.Gw, n)
			if p.Flags&unix.RTNH_F_ONLINK != 0 {
				b.WriteString(" onlink")
			}
		}
	}
	return b.String()
}

// routeTypeName is how ip route names a route's type.
func routeTypeName(t int) string {
	switch t {
	case unix.RTN_BLACKHOLE:
		return "blackhole"
	case unix.RTN_UNREACHABLE:
		return "unreachable"
	case unix.RTN_PROHIBIT:
		return "prohibit"
	case unix.RTN_LOCAL:
		return "local"
	}
	return "unicast"
}
