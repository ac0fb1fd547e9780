package bpf

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net/netip"

	"github.com/sluice-net/sluice/calc"
)

// The IPv6 map entry types (c/sluice.h's _v6 structs); the value types shared by both
// families (FrontendValue, BackendKey, ClusterNetVal) have one name.
type (
	FrontendKey6    = sluiceFeKeyV6
	BackendValue6   = sluiceBeValV6
	BackendIndex6   = sluiceBeIdxKeyV6
	SourceRangeKey6 = sluiceSrcKeyV6
	ClusterNetKey6  = sluiceCnetKeyV6
	ConntrackKey6   = sluiceCtKeyV6
	ConntrackValue6 = sluiceCtValV6
	Addr6           = sluiceAddr6
	Settings6       = sluiceCfgV6
)

// NetAddr6 returns the map form of an address in an IPv6 entry: the 16 bytes in network
// order; an IPv4 address (a node's underlay in an IPv6 entry) is IPv4-mapped.
func NetAddr6(a netip.Addr) Addr6 {
	b := a.As16()
	var out Addr6
	for i := range out.W {
		out.W[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

// HostAddr6 is the inverse of NetAddr6 (an IPv4-mapped address comes back as IPv4).
func HostAddr6(v Addr6) netip.Addr {
	var b [16]byte
	for i, w := range v.W {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
	return netip.AddrFrom16(b).Unmap()
}

// hostAddr6 is HostAddr6 keeping an IPv4-mapped address as it is (a frontend's or backend's
// own address in an IPv6 map is always IPv6).
func hostAddr6(v Addr6) netip.Addr {
	var b [16]byte
	for i, w := range v.W {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
	return netip.AddrFrom16(b)
}

// Tables6 are the IPv6 service maps.
type Tables6 = famTables[FrontendKey6, BackendValue6, BackendIndex6, SourceRangeKey6, ClusterNetKey6]

// The two families' instances of the generic types.
type (
	tables4  = famTables[FrontendKey, BackendValue, BackendIndex, SourceRangeKey, ClusterNetKey]
	family4  = family[FrontendKey, BackendValue, BackendIndex, SourceRangeKey, ClusterNetKey]
	family6  = family[FrontendKey6, BackendValue6, BackendIndex6, SourceRangeKey6, ClusterNetKey6]
	famMaps4 = famMaps[FrontendKey, BackendValue, BackendIndex, SourceRangeKey, ClusterNetKey]
	famMaps6 = famMaps[FrontendKey6, BackendValue6, BackendIndex6, SourceRangeKey6, ClusterNetKey6]
)

// v4 returns the IPv4 maps of t as one family's.
func (t Tables) v4() tables4 {
	return tables4{t.Frontends, t.Backends, t.BackendIndex, t.SourceRanges, t.ClusterNets}
}

// famTables are one family's service maps (Tables holds IPv4's, its V6 field IPv6's).
type famTables[FK, BV, IK, SK, CK comparable] struct {
	Frontends    Table[FK, FrontendValue]
	Backends     Table[BackendKey, BV]
	BackendIndex Table[IK, uint32]
	SourceRanges Table[SK, uint32]
	ClusterNets  Table[CK, ClusterNetVal]
}

// family is what the service driver must know of one address family's map entries: how a
// calc frontend, backend, source range and cluster network become keys and values, and how
// they read for operators. v4 and v6 are its two.
type family[FK, BV, IK, SK, CK comparable] interface {
	name() string
	is(a netip.Addr) bool
	frontendKey(k calc.FrontendKey) FK
	addrKey(a netip.Addr) FK // a cluster IP's address-only entry
	backend(addr netip.Addr, port uint16, flags uint16, node netip.Addr) BV
	indexKey(list uint64, v BV) IK
	indexList(k IK) uint64
	indexString(k IK) string
	srcKey(fe FK, p netip.Prefix) SK
	cnetKey(p netip.Prefix) CK
	listID(bs []BV) uint64
	feView(k FK) (netip.Addr, uint16, uint8)
	beView(v BV) (addr netip.AddrPort, node netip.Addr)
	srcView(k SK) (fe FK, src netip.Prefix)
	feString(k FK, v FrontendValue) string
	beString(k BackendKey, v BV) string
	srcString(k SK) string
	cnetString(k CK, v ClusterNetVal) string
}

type v4 struct{}

func (v4) name() string                               { return "IPv4" }
func (v4) is(a netip.Addr) bool                       { return a.Is4() }
func (v4) frontendKey(k calc.FrontendKey) FrontendKey { return FrontendMapKey(k) }
func (v4) addrKey(a netip.Addr) FrontendKey           { return FrontendKey{Addr: NetAddr(a)} }
func (v4) backend(addr netip.Addr, port uint16, flags uint16, node netip.Addr) BackendValue {
	v := BackendValue{Addr: NetAddr(addr), Port: NetPort(port), Flags: flags}
	if node.Is4() {
		v.NodeAddr = NetAddr(node)
	}
	return v
}
func (v4) indexKey(list uint64, v BackendValue) BackendIndex { return indexKey(list, v) }
func (v4) indexList(k BackendIndex) uint64                   { return k.ListId }
func (v4) indexString(k BackendIndex) string {
	return fmt.Sprintf("%016x %v", k.ListId, netip.AddrPortFrom(HostAddr(k.Addr), HostPort(k.Port)))
}
func (v4) srcKey(fe FrontendKey, p netip.Prefix) SourceRangeKey {
	return SourceRangeKey{Prefixlen: uint32(64 + p.Bits()), FeAddr: fe.Addr, FePort: fe.Port, Proto: fe.Proto,
		Src: NetAddr(p.Masked().Addr())}
}
func (v4) cnetKey(p netip.Prefix) ClusterNetKey {
	return ClusterNetKey{Prefixlen: uint32(p.Bits()), Addr: NetAddr(p.Masked().Addr())}
}
func (v4) feView(k FrontendKey) (netip.Addr, uint16, uint8) {
	return HostAddr(k.Addr), HostPort(k.Port), k.Proto
}
func (v4) beView(v BackendValue) (netip.AddrPort, netip.Addr) {
	return netip.AddrPortFrom(HostAddr(v.Addr), HostPort(v.Port)), HostAddr(v.NodeAddr)
}
func (v4) srcView(k SourceRangeKey) (FrontendKey, netip.Prefix) {
	return FrontendKey{Addr: k.FeAddr, Port: k.FePort, Proto: k.Proto}, netip.PrefixFrom(HostAddr(k.Src), int(k.Prefixlen)-64)
}
func (v4) listID(bs []BackendValue) uint64                    { return listID(bs) }
func (v4) feString(k FrontendKey, v FrontendValue) string     { return FrontendString(k, v) }
func (v4) beString(k BackendKey, v BackendValue) string       { return BackendString(k, v) }
func (v4) srcString(k SourceRangeKey) string                  { return SourceRangeString(k) }
func (v4) cnetString(k ClusterNetKey, v ClusterNetVal) string { return ClusterNetString(k, v) }

type v6 struct{}

func (v6) name() string                                { return "IPv6" }
func (v6) is(a netip.Addr) bool                        { return a.Is6() && !a.Is4In6() }
func (v6) frontendKey(k calc.FrontendKey) FrontendKey6 { return FrontendMapKey6(k) }
func (v6) addrKey(a netip.Addr) FrontendKey6           { return FrontendKey6{Addr: NetAddr6(a)} }
func (v6) backend(addr netip.Addr, port uint16, flags uint16, node netip.Addr) BackendValue6 {
	v := BackendValue6{Addr: NetAddr6(addr), Port: NetPort(port), Flags: flags}
	if node.IsValid() {
		v.NodeAddr = NetAddr6(node)
	}
	return v
}
func (v6) indexKey(list uint64, v BackendValue6) BackendIndex6 {
	return BackendIndex6{ListId: list, Addr: v.Addr, Port: v.Port}
}
func (v6) indexList(k BackendIndex6) uint64 { return k.ListId }
func (v6) indexString(k BackendIndex6) string {
	return fmt.Sprintf("%016x %v", k.ListId, netip.AddrPortFrom(hostAddr6(k.Addr), HostPort(k.Port)))
}
func (v6) srcKey(fe FrontendKey6, p netip.Prefix) SourceRangeKey6 {
	return SourceRangeKey6{Prefixlen: uint32(160 + p.Bits()), FeAddr: fe.Addr, FePort: fe.Port, Proto: fe.Proto,
		Src: NetAddr6(p.Masked().Addr())}
}
func (v6) cnetKey(p netip.Prefix) ClusterNetKey6 {
	return ClusterNetKey6{Prefixlen: uint32(p.Bits()), Addr: NetAddr6(p.Masked().Addr())}
}
func (v6) listID(bs []BackendValue6) uint64 {
	h := fnv.New64a()
	var b [36]byte
	for _, v := range bs {
		for i, w := range v.Addr.W {
			binary.LittleEndian.PutUint32(b[4*i:], w)
		}
		for i, w := range v.NodeAddr.W {
			binary.LittleEndian.PutUint32(b[16+4*i:], w)
		}
		binary.LittleEndian.PutUint16(b[32:], v.Port)
		binary.LittleEndian.PutUint16(b[34:], v.Flags)
		h.Write(b[:])
	}
	return h.Sum64()
}
func (v6) feView(k FrontendKey6) (netip.Addr, uint16, uint8) {
	return hostAddr6(k.Addr), HostPort(k.Port), k.Proto
}
func (v6) beView(v BackendValue6) (netip.AddrPort, netip.Addr) {
	return netip.AddrPortFrom(hostAddr6(v.Addr), HostPort(v.Port)), HostAddr6(v.NodeAddr)
}
func (v6) srcView(k SourceRangeKey6) (FrontendKey6, netip.Prefix) {
	return FrontendKey6{Addr: k.FeAddr, Port: k.FePort, Proto: k.Proto}, netip.PrefixFrom(hostAddr6(k.Src), int(k.Prefixlen)-160)
}
func (v6) feString(k FrontendKey6, v FrontendValue) string {
	return frontendString(netip.AddrPortFrom(hostAddr6(k.Addr), HostPort(k.Port)), k.Proto, v)
}
func (v6) beString(k BackendKey, v BackendValue6) string {
	return backendString(k, netip.AddrPortFrom(hostAddr6(v.Addr), HostPort(v.Port)), HostAddr6(v.NodeAddr), v.Flags)
}
func (v6) srcString(k SourceRangeKey6) string {
	return fmt.Sprintf("%s/%s from %s", netip.AddrPortFrom(hostAddr6(k.FeAddr), HostPort(k.FePort)), ProtoName(k.Proto),
		netip.PrefixFrom(hostAddr6(k.Src), int(k.Prefixlen)-160))
}
func (v6) cnetString(k ClusterNetKey6, v ClusterNetVal) string {
	return clusterNetString(netip.PrefixFrom(hostAddr6(k.Addr), int(k.Prefixlen)), v)
}

// FrontendMapKey6 is the IPv6 frontend map's key for a calc frontend key.
func FrontendMapKey6(k calc.FrontendKey) FrontendKey6 {
	return FrontendKey6{Addr: NetAddr6(k.Addr), Port: NetPort(k.Port), Proto: protoNumber(k.Protocol)}
}

// Frontend is a frontend entry of either family with its source ranges, for operators'
// tools (sluicectl services).
type Frontend struct {
	Addr         netip.Addr
	Port         uint16
	Proto        uint8
	Value        FrontendValue
	SourceRanges []netip.Prefix
	IPv6         bool // in the IPv6 maps: its list is an IPv6 list
}

// Backend is a backend-list entry of either family.
type Backend struct {
	Key   BackendKey
	IPv6  bool
	Addr  netip.AddrPort
	Node  netip.Addr // the node of a remote backend (invalid when unset)
	Flags uint16
}

// Entries reads the frontends (with their source ranges) and the backend lists of both
// families.
func (t Tables) Entries() ([]Frontend, []Backend, error) {
	fe, be, err := entriesOf(family4(v4{}), t.v4(), false, func(v BackendValue) uint16 { return v.Flags })
	if err != nil || t.V6.Frontends == nil {
		return fe, be, err
	}
	fe6, be6, err := entriesOf(family6(v6{}), t.V6, true, func(v BackendValue6) uint16 { return v.Flags })
	return append(fe, fe6...), append(be, be6...), err
}

func entriesOf[FK, BV, IK, SK, CK comparable](fam family[FK, BV, IK, SK, CK], t famTables[FK, BV, IK, SK, CK], ipv6 bool,
	flags func(BV) uint16) ([]Frontend, []Backend, error) {
	fe, err := t.Frontends.Dump()
	if err != nil {
		return nil, nil, fmt.Errorf("reading the %s frontend map: %w", fam.name(), err)
	}
	be, err := t.Backends.Dump()
	if err != nil {
		return nil, nil, fmt.Errorf("reading the %s backend map: %w", fam.name(), err)
	}
	src, err := t.SourceRanges.Dump()
	if err != nil {
		return nil, nil, fmt.Errorf("reading the %s source-range map: %w", fam.name(), err)
	}
	ranges := map[FK][]netip.Prefix{}
	for k := range src {
		fk, p := fam.srcView(k)
		ranges[fk] = append(ranges[fk], p)
	}
	fes := make([]Frontend, 0, len(fe))
	for k, v := range fe {
		a, port, proto := fam.feView(k)
		fes = append(fes, Frontend{Addr: a, Port: port, Proto: proto, Value: v, SourceRanges: ranges[k], IPv6: ipv6})
	}
	bes := make([]Backend, 0, len(be))
	for k, v := range be {
		ap, node := fam.beView(v)
		b := Backend{Key: k, IPv6: ipv6, Addr: ap, Flags: flags(v)}
		if node.IsValid() && !node.IsUnspecified() {
			b.Node = node
		}
		bes = append(bes, b)
	}
	return fes, bes, nil
}
