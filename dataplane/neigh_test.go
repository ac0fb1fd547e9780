package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
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
				gotS = append(gotS, fmt.Sprintf("%d %d %#x %s %s", g.Family, g.LinkIndex, g.State, g.IP, g.MAC))
			}
		}
		for _, r := range ref {
			if written(r.State) {
				ip, _ := netip.AddrFromSlice(r.IP)
				refS = append(refS, fmt.Sprintf("%d %d %#x %s %s", r.Family, r.LinkIndex, r.State, ip.Unmap(), macOf(r.HardwareAddr)))
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

// TestNexthopsSupportedReadsNone asks the kernel whether it has nexthop objects while it holds
// some, and wants yes without any of them listed: the probe filters to the loopback device.
func TestNexthopsSupportedReadsNone(t *testing.T) {
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
	nk := k.(*NetlinkKernel)
	if err := nk.NexthopsSupported(); err != nil {
		t.Fatalf("nexthops supported: %v", err)
	}
	for _, c := range []struct{ oif, want int }{{0, 3}, {eth0, 3}, {1, 0}} {
		got, err := nk.batch.nexthops(c.oif)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != c.want {
			t.Errorf("nexthop dump through link %d: %d objects, want %d", c.oif, len(got), c.want)
		}
	}
}
