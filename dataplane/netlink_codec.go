package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Route is a kernel route as the drivers read and write it: netlink's route, and the ID of
// the nexthop object it goes through (0: none; its gateway and device are its own). The
// kernel reports a route through a nexthop object with that object's gateway and device too
// (net.ipv4.nexthop_compat_mode, on by default); the drivers compare the ID alone.
type Route struct {
	netlink.Route
	NH uint32
}

// Nexthop is a kernel nexthop object (`ip nexthop`): one gateway on one device, or a group
// of such objects (equal-cost multipath), shared by every route that names its ID. Changing
// it moves all of them in one write; deleting it deletes them.
type Nexthop struct {
	ID       uint32
	Gw       netip.Addr
	Link     int
	OnLink   bool
	Protocol int
	// Group lists a group's members, sorted (each of weight 1); nil for a single gateway.
	Group []uint32
	// Other is set for a kind sluice never makes (a blackhole, an encapsulation, a group with
	// weights or of another type): only its ID and protocol matter to sluice.
	Other bool
}

const (
	// rtaNHID is RTA_NH_ID: a route's nexthop object.
	rtaNHID = 30
	// nhaFDB is NHA_FDB: a nexthop for VXLAN FDB entries, not routes.
	nhaFDB = 11
)

// nhmsg is struct nhmsg.
type nhmsg struct {
	family, scope, protocol, resvd uint8
	flags                          uint32
}

const sizeofNhmsg = 8

func (m *nhmsg) Len() int { return sizeofNhmsg }

func (m *nhmsg) Serialize() []byte {
	b := make([]byte, sizeofNhmsg)
	b[0], b[1], b[2], b[3] = m.family, m.scope, m.protocol, m.resvd
	binary.NativeEndian.PutUint32(b[4:], m.flags)
	return b
}

// nexthopRequest builds an RTM_NEWNEXTHOP for n: with replace it replaces the object of that
// ID (sluice's own), without it it fails with EEXIST when the ID is taken (a new object must
// never overwrite another program's).
func nexthopRequest(n Nexthop, replace bool) *nl.NetlinkRequest {
	flags := unix.NLM_F_CREATE | unix.NLM_F_EXCL
	if replace {
		flags = unix.NLM_F_CREATE | unix.NLM_F_REPLACE
	}
	req := nl.NewNetlinkRequest(unix.RTM_NEWNEXTHOP, flags)
	if n.Group != nil {
		// struct nexthop_grp per member: ID, weight-1 (0: weight 1), two reserved fields.
		grp := make([]byte, 8*len(n.Group))
		for i, id := range n.Group {
			binary.NativeEndian.PutUint32(grp[8*i:], id)
		}
		req.AddData(&nhmsg{family: unix.AF_UNSPEC, protocol: uint8(n.Protocol)})
		req.AddData(nl.NewRtAttr(unix.NHA_ID, nl.Uint32Attr(n.ID)))
		req.AddData(nl.NewRtAttr(unix.NHA_GROUP, grp))
		return req
	}
	m := &nhmsg{family: unix.AF_INET, protocol: uint8(n.Protocol)}
	gw := n.Gw.AsSlice()
	if n.Gw.Is6() {
		m.family = unix.AF_INET6
	}
	if n.OnLink {
		m.flags |= unix.RTNH_F_ONLINK
	}
	req.AddData(m)
	req.AddData(nl.NewRtAttr(unix.NHA_ID, nl.Uint32Attr(n.ID)))
	req.AddData(nl.NewRtAttr(unix.NHA_OIF, nl.Uint32Attr(uint32(n.Link))))
	req.AddData(nl.NewRtAttr(unix.NHA_GATEWAY, gw))
	return req
}

// nexthopDelRequest builds an RTM_DELNEXTHOP for the object id.
func nexthopDelRequest(id uint32) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_DELNEXTHOP, 0)
	req.AddData(&nhmsg{})
	req.AddData(nl.NewRtAttr(unix.NHA_ID, nl.Uint32Attr(id)))
	return req
}

// parseNexthop reads an RTM_NEWNEXTHOP message (a dump's or an event's).
func parseNexthop(b []byte) (Nexthop, error) {
	if len(b) < sizeofNhmsg {
		return Nexthop{}, fmt.Errorf("nexthop message: short (%d bytes)", len(b))
	}
	n := Nexthop{Protocol: int(b[2]), OnLink: binary.NativeEndian.Uint32(b[4:8])&unix.RTNH_F_ONLINK != 0}
	err := walkAttrs(b[sizeofNhmsg:], func(typ uint16, val []byte) {
		switch typ {
		case unix.NHA_ID:
			if len(val) == 4 {
				n.ID = binary.NativeEndian.Uint32(val)
			}
		case unix.NHA_OIF:
			if len(val) == 4 {
				n.Link = int(binary.NativeEndian.Uint32(val))
			}
		case unix.NHA_GATEWAY:
			if ip, ok := netip.AddrFromSlice(val); ok {
				n.Gw = ip.Unmap()
			}
		case unix.NHA_GROUP:
			for i := 0; i+8 <= len(val); i += 8 {
				if val[i+4] != 0 || val[i+5] != 0 { // a weight other than 1
					n.Other = true
				}
				n.Group = append(n.Group, binary.NativeEndian.Uint32(val[i:]))
			}
			slices.Sort(n.Group)
		case unix.NHA_GROUP_TYPE:
			if len(val) == 2 && binary.NativeEndian.Uint16(val) != 0 { // not multipath (a resilient group)
				n.Other = true
			}
		case unix.NHA_BLACKHOLE, unix.NHA_ENCAP, nhaFDB:
			n.Other = true
		}
	})
	if err != nil {
		return Nexthop{}, fmt.Errorf("nexthop message: %w", err)
	}
	if n.ID == 0 {
		return Nexthop{}, fmt.Errorf("nexthop message: no ID")
	}
	return n, nil
}

// parseRoute reads an RTM_NEWROUTE message of a dump: what the drivers and the leftover scan
// use (destination, gateway, device, metric, table, type, scope, protocol, flags, nexthop ID).
func parseRoute(b []byte) (Route, error) {
	if len(b) < unix.SizeofRtMsg {
		return Route{}, fmt.Errorf("route message: short (%d bytes)", len(b))
	}
	msg := nl.DeserializeRtMsg(b)
	r := Route{Route: netlink.Route{Family: int(msg.Family), Table: int(msg.Table), Protocol: netlink.RouteProtocol(msg.Protocol),
		Type: int(msg.Type), Scope: netlink.Scope(msg.Scope), Flags: int(msg.Flags)}}
	bits := 32
	if msg.Family == unix.AF_INET6 {
		bits = 128
	}
	err := walkAttrs(b[unix.SizeofRtMsg:], func(typ uint16, val []byte) {
		switch typ {
		case unix.RTA_DST:
			r.Dst = &net.IPNet{IP: net.IP(append([]byte(nil), val...)), Mask: net.CIDRMask(int(msg.Dst_len), bits)}
		case unix.RTA_GATEWAY:
			r.Gw = net.IP(append([]byte(nil), val...))
		case unix.RTA_OIF:
			if len(val) == 4 {
				r.LinkIndex = int(binary.NativeEndian.Uint32(val))
			}
		case unix.RTA_PRIORITY:
			if len(val) == 4 {
				r.Priority = int(binary.NativeEndian.Uint32(val))
			}
		case unix.RTA_TABLE:
			if len(val) == 4 {
				r.Table = int(binary.NativeEndian.Uint32(val))
			}
		case rtaNHID:
			if len(val) == 4 {
				r.NH = binary.NativeEndian.Uint32(val)
			}
		case unix.RTA_MULTIPATH:
			r.MultiPath = parseMultipath(val)
		}
	})
	if err != nil {
		return Route{}, fmt.Errorf("route message: %w", err)
	}
	if r.Dst == nil { // no RTA_DST: a default route
		r.Dst = &net.IPNet{IP: make(net.IP, bits/8), Mask: net.CIDRMask(0, bits)}
	}
	return r, nil
}

// parseMultipath reads RTA_MULTIPATH: one struct rtnexthop (length, flags, hops, interface)
// per path, each followed by its attributes (the gateway).
func parseMultipath(b []byte) []*netlink.NexthopInfo {
	var out []*netlink.NexthopInfo
	for len(b) >= unix.SizeofRtNexthop {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		if n < unix.SizeofRtNexthop || n > len(b) {
			break
		}
		info := &netlink.NexthopInfo{Flags: int(b[2]), Hops: int(b[3]), LinkIndex: int(int32(binary.NativeEndian.Uint32(b[4:8])))}
		_ = walkAttrs(b[unix.SizeofRtNexthop:n], func(typ uint16, val []byte) {
			if typ == unix.RTA_GATEWAY {
				info.Gw = net.IP(append([]byte(nil), val...))
			}
		})
		out = append(out, info)
		b = b[min(rtaAlign(n), len(b)):]
	}
	return out
}

func rtaAlign(n int) int { return (n + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1) }

// walkAttrs hands the type (without the nested and byte-order flags) and value of each
// netlink attribute in b to f, in place: reading a dump of 20,000 routes allocates no slice of
// attributes per message. A malformed attribute ends the walk with an error.
func walkAttrs(b []byte, f func(typ uint16, val []byte)) error {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return fmt.Errorf("attribute of length %d in %d bytes", l, len(b))
		}
		f(binary.NativeEndian.Uint16(b[2:4])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[unix.SizeofRtAttr:l])
		b = b[min((l+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1), len(b)):]
	}
	return nil
}

// dump sends a dump request and returns the data of every answer of type want.
func (b *batcher) dump(req *nl.NetlinkRequest, want uint16) ([][]byte, error) {
	for attempt := 0; ; attempt++ {
		b.seq++
		req.Seq = b.seq
		if err := unix.Sendto(b.sock.GetFd(), req.Serialize(), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return nil, fmt.Errorf("sending to netlink: %w", err)
		}
		var out [][]byte
		interrupted := false
	read:
		for {
			msgs, _, err := b.sock.Receive()
			if err != nil {
				b.drain()
				return nil, fmt.Errorf("reading a netlink dump: %w", err)
			}
			for _, m := range msgs {
				if m.Header.Seq != b.seq {
					continue // an answer to an earlier, abandoned request
				}
				if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
					interrupted = true
				}
				switch m.Header.Type {
				case unix.NLMSG_DONE:
					break read
				case unix.NLMSG_ERROR:
					if len(m.Data) >= 4 {
						if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
							return nil, unix.Errno(-code)
						}
					}
					break read
				case want:
					out = append(out, m.Data)
				}
			}
		}
		// The table changed during the dump: its answers may be inconsistent. Ask again (a
		// table under constant change is taken as it came after a few tries).
		if !interrupted || attempt == 4 {
			return out, nil
		}
	}
}

// routes dumps every route of table, both families.
func (b *batcher) routes(table int) ([]Route, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETROUTE, unix.NLM_F_DUMP)
	req.AddData(nl.NewRtMsg())
	return dumpParsed(b, req, unix.RTM_NEWROUTE, fmt.Sprintf("routes of table %d", table), nil, parseRoute, func(r Route) bool { return r.Table == table })
}

// nexthops dumps every nexthop object, or, when oif is not 0, those through device oif (the
// kernel filters them).
func (b *batcher) nexthops(oif int) ([]Nexthop, error) {
	req := nexthopDump(oif)
	return dumpParsed(b, req, unix.RTM_NEWNEXTHOP, "nexthop objects", nil, parseNexthop, nil)
}

// nexthopDump is the request for every nexthop object, or those through device oif (not 0).
func nexthopDump(oif int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEXTHOP, unix.NLM_F_DUMP)
	req.AddData(&nhmsg{})
	if oif != 0 {
		req.AddData(nl.NewRtAttr(unix.NHA_OIF, nl.Uint32Attr(uint32(oif))))
	}
	return req
}

// dumpParsed sends a dump request and parses every answer of type want that skip does not
// pass over unparsed (nil: none), keeping those keep accepts (nil: all); what names the
// listing in errors.
func dumpParsed[T any](b *batcher, req *nl.NetlinkRequest, want uint16, what string, skip func([]byte) bool, parse func([]byte) (T, error), keep func(T) bool) ([]T, error) {
	msgs, err := b.dump(req, want)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", what, err)
	}
	out := make([]T, 0, len(msgs))
	for _, m := range msgs {
		if skip != nil && skip(m) {
			continue
		}
		v, err := parse(m)
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", what, err)
		}
		if keep == nil || keep(v) {
			out = append(out, v)
		}
	}
	return out, nil
}

// setNexthops writes nexthop objects (replacing, or creating only) and returns one error each.
func (b *batcher) setNexthops(ns []Nexthop, replace bool) []error {
	reqs := make([]*nl.NetlinkRequest, len(ns))
	for i, n := range ns {
		reqs[i] = nexthopRequest(n, replace)
	}
	return b.send(reqs)
}

// delNexthops deletes nexthop objects; one already gone is not an error.
func (b *batcher) delNexthops(ids []uint32) []error {
	reqs := make([]*nl.NetlinkRequest, len(ids))
	for i, id := range ids {
		reqs[i] = nexthopDelRequest(id)
	}
	errs := b.send(reqs)
	for i, err := range errs {
		if gone(err) {
			errs[i] = nil
		}
	}
	return errs
}
