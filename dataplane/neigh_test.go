package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestNeighbourDumpMatchesNetlink reads a VXLAN device's neighbours and FDB entries (and
// another link's, which must not show) with sluice's dump and parser, and with the netlink
// library's, and wants the same entries from both.
func TestNeighbourDumpMatchesNetlink(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	if err := n.h.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vx"}, VxlanId: 4096, Port: 4789,
		SrcAddr: net.ParseIP("192.0.2.11"), VtepDevIndex: n.link("eth0").Attrs().Index}); err != nil {
		t.Fatal(err)
	}
	vx, eth0 := n.link("vx").Attrs().Index, n.link("eth0").Attrs().Index
	if err := n.h.LinkSetUp(n.link("vx")); err != nil {
		t.Fatal(err)
	}
	var set []*netlink.Neigh
	for i := 1; i <= 300; i++ {
		mac := net.HardwareAddr{0x66, 0, 0, 0, byte(i >> 8), byte(i)}
		set = append(set,
			&netlink.Neigh{LinkIndex: vx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT, IP: net.IPv4(10, 244, byte(i>>8), byte(i)), HardwareAddr: mac},
			&netlink.Neigh{LinkIndex: vx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF, IP: net.IPv4(192, 0, 2, byte(i%200+20)), HardwareAddr: mac})
	}
	set = append(set,
		&netlink.Neigh{LinkIndex: vx, Family: unix.AF_INET6, State: netlink.NUD_PERMANENT, IP: net.ParseIP("fd00::1"), HardwareAddr: net.HardwareAddr{0x66, 0, 0, 0, 0, 1}},
		&netlink.Neigh{LinkIndex: vx, Family: unix.AF_INET, State: netlink.NUD_REACHABLE, IP: net.IPv4(10, 244, 9, 9), HardwareAddr: net.HardwareAddr{0x66, 0, 0, 0, 9, 9}},
		&netlink.Neigh{LinkIndex: eth0, Family: unix.AF_INET, State: netlink.NUD_PERMANENT, IP: net.IPv4(192, 0, 2, 99), HardwareAddr: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}})
	for _, ne := range set {
		if err := n.h.NeighSet(ne); err != nil {
			t.Fatalf("%v: %v", ne, err)
		}
	}
	// The flood entry of the all-zeros MAC is appended, not set.
	if err := n.h.NeighAppend(&netlink.Neigh{LinkIndex: vx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF,
		IP: net.IPv4(192, 0, 2, 250), HardwareAddr: make(net.HardwareAddr, 6)}); err != nil {
		t.Fatal(err)
	}

	k := n.kernel()
	for _, c := range []struct {
		link, family, want int
	}{{vx, unix.AF_INET, 301}, {vx, unix.AF_INET6, 1}, {vx, unix.AF_BRIDGE, 301}, {eth0, unix.AF_INET, 1}} {
		got, err := k.Neighs(c.link, c.family)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := n.h.NeighList(c.link, c.family)
		if err != nil {
			t.Fatal(err)
		}
		// Entries the kernel makes of its own (IPv6 multicast neighbours, an unresolved one
		// for the flood entry's remote) may come between the two reads: not compared.
		written := func(state int) bool {
			return state&(netlink.NUD_PERMANENT|netlink.NUD_REACHABLE|netlink.NUD_STALE) != 0
		}
		var gotS, refS []string
		for _, g := range got {
			if written(int(g.State)) {
				gotS = append(gotS, fmt.Sprintf("%d %d %#x %s %s %v", g.Family, g.LinkIndex, g.State, g.IP, g.MAC, g.HasMAC))
			}
		}
		for _, r := range ref {
			if written(r.State) {
				ip, _ := netip.AddrFromSlice(r.IP)
				refS = append(refS, fmt.Sprintf("%d %d %#x %s %s %v", r.Family, r.LinkIndex, r.State, ip.Unmap(), macOf(r.HardwareAddr), r.HardwareAddr != nil))
			}
		}
		slices.Sort(gotS)
		slices.Sort(refS)
		if !slices.Equal(gotS, refS) {
			t.Errorf("link %d family %d: sluice read\n%v\nnetlink read\n%v", c.link, c.family, gotS, refS)
		}
		if len(gotS) != c.want {
			t.Errorf("link %d family %d: %d entries, want %d: %v", c.link, c.family, len(gotS), c.want, gotS)
		}
	}
}

// TestNexthopsSupportedProbe asks the kernel whether it has nexthop objects while it holds
// some, and wants yes without those listed: the probe filters to the loopback device, which
// holds a blackhole object only.
func TestNexthopsSupportedProbe(t *testing.T) {
	n := newTestNode(t)
	n.iface("eth0", "192.0.2.11/24")
	eth0 := n.link("eth0").Attrs().Index
	k := n.kernel()
	var nhs []Nexthop
	for i := range 3 {
		nhs = append(nhs, Nexthop{ID: uint32(100 + i), Gw: netip.AddrFrom4([4]byte{192, 0, 2, byte(21 + i)}), Link: eth0, Protocol: DefaultRouteProtocol})
	}
	if errs := k.NexthopSetMany(nhs, false); errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatal(errs)
	}
	if out, err := exec.Command("ip", "-n", n.name, "nexthop", "add", "id", "200", "blackhole").CombinedOutput(); err != nil {
		t.Fatalf("ip nexthop add blackhole: %v: %s", err, out)
	}
	nk := k.(*NetlinkKernel)
	if err := nk.NexthopsSupported(); err != nil {
		t.Fatalf("nexthops supported: %v", err)
	}
	for _, c := range []struct{ oif, want int }{{0, 4}, {eth0, 3}, {1, 1}} {
		got, err := nk.batch.nexthops(c.oif)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != c.want {
			t.Errorf("nexthop dump through link %d: %d objects, want %d", c.oif, len(got), c.want)
		}
	}
}

// attr is one netlink attribute as the kernel lays it out (length, type, value, padding).
func attr(typ uint16, val []byte) []byte {
	b := binary.NativeEndian.AppendUint16(nil, uint16(unix.SizeofRtAttr+len(val)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for len(b)%unix.NLA_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

// TestParsersReadAttributesInPlace feeds the neighbour, route and nexthop parsers crafted
// messages: attributes are found whatever their order and flags, and a malformed one is an
// error naming the message, not a panic or a silently short entry.
func TestParsersReadAttributesInPlace(t *testing.T) {
	nd := make([]byte, unix.SizeofNdMsg)
	nd[0] = unix.AF_INET
	binary.NativeEndian.PutUint32(nd[4:8], 7)
	binary.NativeEndian.PutUint16(nd[8:10], netlink.NUD_PERMANENT)
	mac := []byte{0x66, 1, 2, 3, 4, 5}
	msg := slices.Concat(nd, attr(unix.NDA_LLADDR, mac), attr(unix.NDA_CACHEINFO, make([]byte, 16)), attr(unix.NDA_DST, []byte{10, 0, 0, 9}))
	n, err := parseNeighbour(msg)
	if err != nil || n.LinkIndex != 7 || n.Family != unix.AF_INET || n.State != netlink.NUD_PERMANENT ||
		n.IP != netip.MustParseAddr("10.0.0.9") || n.MAC != macOf(mac) || !n.HasMAC {
		t.Errorf("neighbour: %+v, %v", n, err)
	}

	rt := make([]byte, unix.SizeofRtMsg)
	rt[0], rt[1], rt[4], rt[5], rt[6], rt[7] = unix.AF_INET, 26, unix.RT_TABLE_MAIN, 83, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST
	u32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	route := slices.Concat(rt, attr(unix.RTA_TABLE, u32(254)), attr(unix.RTA_DST, []byte{10, 244, 1, 0}), attr(unix.RTA_PRIORITY, u32(20)), attr(rtaNHID, u32(4242)))
	r, err := parseRoute(route)
	if err != nil || r.Dst.String() != "10.244.1.0/26" || r.Priority != 20 || r.NH != 4242 || r.Table != 254 || r.Protocol != 83 {
		t.Errorf("route: %+v, %v", r, err)
	}

	nh := make([]byte, sizeofNhmsg)
	nh[0], nh[2] = unix.AF_INET, 83
	object := slices.Concat(nh, attr(unix.NHA_ID, u32(9)), attr(unix.NHA_OIF, u32(3)), attr(unix.NHA_GATEWAY, []byte{192, 0, 2, 1}),
		attr(unix.NHA_ENCAP|unix.NLA_F_NESTED, attr(1, u32(0))))
	o, err := parseNexthop(object)
	if err != nil || o.ID != 9 || o.Link != 3 || o.Gw != netip.MustParseAddr("192.0.2.1") || !o.Other || o.Protocol != 83 {
		t.Errorf("nexthop (a nested encapsulation is another program's kind): %+v, %v", o, err)
	}

	for _, c := range []struct {
		what  string
		parse func([]byte) error
		head  []byte
	}{
		{"neighbour", func(b []byte) error { _, err := parseNeighbour(b); return err }, nd},
		{"route", func(b []byte) error { _, err := parseRoute(b); return err }, rt},
		{"nexthop", func(b []byte) error { _, err := parseNexthop(b); return err }, nh},
	} {
		long := attr(1, u32(1))
		binary.NativeEndian.PutUint16(long, 64) // says 64 bytes, holds 8
		short := attr(1, u32(1))
		binary.NativeEndian.PutUint16(short, 2) // shorter than its own header
		for name, b := range map[string][]byte{"short header": c.head[:len(c.head)-1], "attribute past the end": slices.Concat(c.head, long),
			"attribute shorter than its header": slices.Concat(c.head, short)} {
			if err := c.parse(b); err == nil || !strings.Contains(err.Error(), c.what+" message") {
				t.Errorf("%s, %s: %v, want an error naming the %s message", c.what, name, err, c.what)
			}
		}
	}
}
