package dataplane

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Neighbour is a kernel neighbour entry (family AF_INET or AF_INET6: `ip neigh`) or FDB entry
// (AF_BRIDGE: `bridge fdb`), as sluice reads it from a dump or an event.
type Neighbour struct {
	Family, LinkIndex int
	State             uint16
	// IP is the neighbour's address, or an FDB entry's remote (unmapped; invalid: none).
	IP netip.Addr
	// MAC is the link-layer address, when HasMAC (an FDB entry's all zeros: the flood
	// default).
	MAC    macAddr
	HasMAC bool
}

// parseNeighbour reads an RTM_NEWNEIGH or RTM_DELNEIGH message's data (a dump's or an
// event's); it allocates nothing.
func parseNeighbour(b []byte) (Neighbour, error) {
	if len(b) < unix.SizeofNdMsg {
		return Neighbour{}, fmt.Errorf("neighbour message: short (%d bytes)", len(b))
	}
	family, link := neighHeader(b)
	n := Neighbour{Family: family, LinkIndex: link, State: binary.NativeEndian.Uint16(b[8:10])}
	err := walkAttrs(b[unix.SizeofNdMsg:], func(typ uint16, val []byte) {
		switch typ {
		case unix.NDA_DST:
			if ip, ok := netip.AddrFromSlice(val); ok {
				n.IP = ip.Unmap()
			}
		case unix.NDA_LLADDR:
			n.MAC, n.HasMAC = macOf(val), true
		}
	})
	if err != nil {
		return Neighbour{}, fmt.Errorf("neighbour message: %w", err)
	}
	return n, nil
}

// neighbours dumps the neighbour (AF_INET, AF_INET6) or FDB (AF_BRIDGE) entries of a link.
// The kernel answers with every link's (it ignores the request's link without strict
// checking): another link's entries are passed over by their header, unparsed, so that one of
// them the parser refuses does not fail the read of sluice's device.
func (b *batcher) neighbours(linkIndex, family int) ([]Neighbour, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, unix.NLM_F_DUMP)
	req.AddData(&netlink.Ndmsg{Family: uint8(family), Index: uint32(linkIndex)})
	what := fmt.Sprintf("neighbours of link %d", linkIndex)
	if family == unix.AF_BRIDGE {
		what = fmt.Sprintf("FDB entries of link %d", linkIndex)
	}
	return dumpParsed(b, req, unix.RTM_NEWNEIGH, what, func(m []byte) bool {
		if len(m) < unix.SizeofNdMsg {
			return false // parseNeighbour says what is wrong with it
		}
		f, l := neighHeader(m)
		return f != family || l != linkIndex
	}, parseNeighbour, nil)
}

// neighHeader is the family and link of a neighbour message of at least SizeofNdMsg bytes.
func neighHeader(b []byte) (family, link int) {
	return int(b[0]), int(int32(binary.NativeEndian.Uint32(b[4:8])))
}
