package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The map entry types, named for the domain (the generated names follow the C structs).
type (
	FrontendKey    = sluiceFeKeyV4
	FrontendValue  = sluiceFeVal
	BackendKey     = sluiceBeKey
	BackendValue   = sluiceBeValV4
	BackendIndex   = sluiceBeIdxKeyV4
	SourceRangeKey = sluiceSrcKeyV4
	ClusterNetKey  = sluiceCnetKeyV4
	ClusterNetVal  = sluiceCnetVal
	ConntrackKey   = sluiceCtKeyV4
	ConntrackValue = sluiceCtValV4
	Settings       = sluiceCfg
)

// Flags, as in c/sluice.h.
const (
	FrontendExternalLocal = 1 << 0
	FrontendInternalLocal = 1 << 1
	FrontendSourceRanges  = 1 << 2
	FrontendAddrOnly      = 1 << 3
	FrontendNodePort      = 1 << 4

	BackendLocal  = 1 << 0
	BackendRouted = 1 << 1 // on no node of the cluster: plain DNAT, never tunnelled

	ClusterNetPool = 1 << 0
	ClusterNetHost = 1 << 1
	ClusterNetSelf = 1 << 2

	ConntrackFwd = 1
	ConntrackRev = 2
	ConntrackTun = 3

	ConntrackRemote   = 1 << 0
	ConntrackRedirect = 1 << 1
	ConntrackPSNAT    = 1 << 2
	ConntrackLocal    = 1 << 3 // the backend is a workload on this node

	TCPSyn     = 1 << 0
	TCPReplied = 1 << 1
	TCPFinFwd  = 1 << 2
	TCPFinRev  = 1 << 3
	TCPRst     = 1 << 4
	TCPLiveFwd = 1 << 5 // after an RST: a packet of the client's direction that was no RST
	TCPLiveRev = 1 << 6 // after an RST: a reply that was no RST
	TCPOpening = 1 << 7 // answered, the client's acknowledgement not seen yet (SYN_RECV)
)

// HairpinAddr is HAIRPIN_ADDR of c/sluice.h: the source a workload's flow to itself through
// a service is given towards it (Cilium's service loopback address), so that its answer
// leaves it and is translated back. Flows carrying it have NatSaddr set in their entries.
const HairpinAddr = "169.254.42.1"

// counters are the programs' counters in the order of enum counter in c/sluice.h, with what
// each counts (the header's comments), for operators.
var counters = []struct{ name, meaning string }{
	{"nat_new", "new flows translated"},
	{"nat_forward_remote", "new flows forwarded to another node"},
	{"tunnel_in", "tunnelled packets unwrapped (before the reply and collision checks)"},
	{"drop_forged_tunnel", "tunnel packet from an address that is no known node"},
	{"drop_no_local_endpoint", "traffic policy Local with no local endpoint"},
	{"drop_source_range", "client outside loadBalancerSourceRanges"},
	{"drop_conntrack_full", "connection table full"},
	{"drop_too_big", "too large for the tunnel and not allowed to fragment"},
	{"drop_tunnel_collision", "a flow's tuple is taken by a live one (another node's, or no free source port)"},
	{"drop_no_route", "no route for a translated or tunnelled packet (unreachable, or not forwarded)"},
	{"drop_malformed", "headers that could not be read or rewritten"},
	{"reject_no_endpoint", "service without usable endpoint: RST or ICMP unreachable"},
	{"reject_unknown_port", "cluster IP on a port the service does not have"},
	{"icmp_too_big_sent", "ICMP fragmentation-needed sent"},
	{"reply_translated", "replies translated back"},
	{"socket_connected", "host sockets connected straight to a backend"},
	{"reject_socket", "host sockets refused: no endpoint or unknown port"},
	{"conntrack_superseded", "a new connection (a SYN) took a tuple from a closed or unrelated flow's state"},
	{"fragment_split", "packets too large for the tunnel that may be fragmented, cut in two"},
	{"drop_route_blackhole", "the route to the destination is a blackhole"},
	{"drop_route_prohibit", "the route to the destination is prohibit"},
	{"drop_route_mtu", "larger than the route's interface carries: nodeport-tunnel-mtu past the underlay"},
	{"drop_route_other", "forwarding disabled on the interface, or a route the lookup cannot use"},
	{"conntrack_evicted", "flows not established when their young-flow slot came round: evicted (a SYN flood's share of the connection table is full)"},
}

// CounterNames are the counters' names, in the order of enum counter; CounterMeanings say
// what each counts.
var CounterNames, CounterMeanings = func() ([]string, map[string]string) {
	names, meanings := make([]string, len(counters)), make(map[string]string, len(counters))
	for i, c := range counters {
		names[i], meanings[c.name] = c.name, c.meaning
	}
	return names, meanings
}()

// sumCounters reads the per-CPU counter map and sums each counter over the CPUs, by name.
func sumCounters(m *ebpf.Map) (map[string]uint64, error) {
	out := make(map[string]uint64, len(CounterNames))
	for i, name := range CounterNames {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("reading counter %s: %w", name, err)
		}
		var sum uint64
		for _, n := range per {
			sum += n
		}
		out[name] = sum
	}
	return out, nil
}

// NetAddr returns the map form of an IPv4 address: the uint32 whose memory holds the
// address's bytes in network order.
func NetAddr(a netip.Addr) uint32 {
	b := a.As4()
	return binary.LittleEndian.Uint32(b[:])
}

// HostAddr is the inverse of NetAddr.
func HostAddr(v uint32) netip.Addr {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// NetPort returns the map form of a port (network order in memory).
func NetPort(p uint16) uint16 { return p<<8 | p>>8 }

// HostPort is the inverse of NetPort.
func HostPort(p uint16) uint16 { return p<<8 | p>>8 }

// Protocol numbers.
const (
	ProtoTCP  = 6
	ProtoUDP  = 17
	ProtoSCTP = 132
)

// ProtoName names a protocol number.
func ProtoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	case 0:
		return "any"
	}
	return fmt.Sprint(p)
}

// ErrMapFull is returned for a write refused because the map holds max entries.
var ErrMapFull = errors.New("map full")

// Table is the narrow interface over one BPF map: the real one over an *ebpf.Map and a
// stateful in-memory fake that can be told to fail.
type Table[K comparable, V any] interface {
	Put(k K, v V) error
	// Delete removes k; a key already gone is success.
	Delete(k K) error
	Dump() (map[K]V, error)
	Len() int
	Max() int
}

// BatchTable is a Table that also writes many entries in one call (BPF_MAP_UPDATE_BATCH): a
// cold start writes 140,000 entries for 10,000 services, and one system call each costs
// several times the kernel's work.
type BatchTable[K comparable, V any] interface {
	Table[K, V]
	// PutBatch writes keys[i]=vals[i] in order and stops at the first failure, returning
	// how many were written.
	PutBatch(keys []K, vals []V) (int, error)
}

// putAll writes entries through PutBatch when t has it (in chunks), else one by one. It calls
// done for each written entry and failed for each that was refused, carrying on past it.
func putAll[K comparable, V any](t Table[K, V], keys []K, vals []V, done func(i int), failed func(i int, err error)) {
	bt, batch := t.(BatchTable[K, V])
	// Chunks bound one system call's copy; the kernel yields between elements, and fewer,
	// larger calls are faster (BenchmarkServicesColdApply in bpf measures the cold start).
	const chunk = 1 << 16
	for i := 0; i < len(keys); {
		if !batch {
			if err := t.Put(keys[i], vals[i]); err != nil {
				failed(i, err)
			} else {
				done(i)
			}
			i++
			continue
		}
		end := min(i+chunk, len(keys))
		n, err := bt.PutBatch(keys[i:end], vals[i:end])
		for j := i; j < i+n; j++ {
			done(j)
		}
		i += n
		if err != nil && i < end {
			// The refused one is written alone, for its own error; the batch goes on after it.
			if err := t.Put(keys[i], vals[i]); err != nil {
				failed(i, err)
			} else {
				done(i)
			}
			i++
		}
	}
}

// MapTable is a Table over a kernel map.
type MapTable[K comparable, V any] struct {
	Map *ebpf.Map
}

func (t MapTable[K, V]) Put(k K, v V) error { return mapError(t.Map.Put(&k, &v)) }

// mapError turns the kernel's refusal of a new key in a full map (E2BIG from a hash, ENOSPC
// from an LPM trie) into ErrMapFull.
func mapError(err error) error {
	if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("%w: %v", ErrMapFull, err)
	}
	return err
}

// PutBatch writes entries with one BPF_MAP_UPDATE_BATCH call.
func (t MapTable[K, V]) PutBatch(keys []K, vals []V) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	n, err := t.Map.BatchUpdate(keys, vals, nil)
	return n, mapError(err)
}

func (t MapTable[K, V]) Delete(k K) error {
	if err := t.Map.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

func (t MapTable[K, V]) Dump() (map[K]V, error) {
	out := map[K]V{}
	err := walk(t.Map, func(k K, v V) { out[k] = v })
	return out, err
}

// Len counts the entries (a walk of the map).
func (t MapTable[K, V]) Len() int {
	n := 0
	_ = walk(t.Map, func(K, V) { n++ })
	return n
}

// walk hands every entry of m to fn: 4,096 per system call where the kernel has batch lookups
// for the map's type (hash maps), else one at a time (LPM tries; two system calls an entry).
// The connection table is walked at every cleanup and at applies that remove an endpoint: one
// at a time, a large table holds an apply up for far longer (BenchmarkConntrackWalk in bpf
// measures both ways).
func walk[K comparable, V any](m *ebpf.Map, fn func(K, V)) error {
	const chunk = 4096
	keys, vals := make([]K, chunk), make([]V, chunk)
	var cursor ebpf.MapBatchCursor
	for first := true; ; first = false {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(keys[i], vals[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case err != nil && first && n == 0 && (errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL)):
			var k K
			var v V
			it := m.Iterate()
			for it.Next(&k, &v) {
				fn(k, v)
			}
			return it.Err()
		case err != nil:
			return err
		}
	}
}

func (t MapTable[K, V]) Max() int { return int(t.Map.MaxEntries()) }

// Tables are the service maps the driver writes.
type Tables struct {
	Frontends Table[FrontendKey, FrontendValue]
	Backends  Table[BackendKey, BackendValue]
	// BackendIndex gives each backend's ordinal in its list by address (client-IP
	// affinity's lookup); written and repaired with the lists, not rendered.
	BackendIndex Table[BackendIndex, uint32]
	SourceRanges Table[SourceRangeKey, uint32]
	ClusterNets  Table[ClusterNetKey, ClusterNetVal]
	Settings     Table[uint32, Settings]
	// V6 are the IPv6 maps (the settings are shared), Settings6 the IPv6 tunnel's.
	V6        Tables6
	Settings6 Table[uint32, Settings6]
}

// KernelTables returns the tables over loaded objects.
func KernelTables(o *Objects) Tables { return tablesOf(o.pinned()) }

// tablesOf returns the tables over maps by their pinned names.
func tablesOf(m map[string]*ebpf.Map) Tables {
	return Tables{
		Frontends:    MapTable[FrontendKey, FrontendValue]{m["sl_fe_v4"]},
		Backends:     MapTable[BackendKey, BackendValue]{m["sl_be_v4"]},
		BackendIndex: MapTable[BackendIndex, uint32]{m["sl_be_idx_v4"]},
		SourceRanges: MapTable[SourceRangeKey, uint32]{m["sl_src_v4"]},
		ClusterNets:  MapTable[ClusterNetKey, ClusterNetVal]{m["sl_cnet_v4"]},
		Settings:     MapTable[uint32, Settings]{m["sl_cfg"]},
		V6:           tables6Of(m),
		Settings6:    settings6Of(m),
	}
}

// settings6Of is the IPv6 settings table, none where the map is not there.
func settings6Of(m map[string]*ebpf.Map) Table[uint32, Settings6] {
	if m["sl_cfg_v6"] == nil {
		return nil
	}
	return MapTable[uint32, Settings6]{m["sl_cfg_v6"]}
}

// tables6Of returns the IPv6 tables over maps by their pinned names; none (nil tables) when
// the maps are not all there (pinned by an agent of an earlier version).
func tables6Of(m map[string]*ebpf.Map) Tables6 {
	for _, pm := range pinnedMaps {
		if pm.read && pm.v6 && !pm.optional && m[pm.name] == nil {
			return Tables6{}
		}
	}
	return Tables6{
		Frontends:    MapTable[FrontendKey6, FrontendValue]{m["sl_fe_v6"]},
		Backends:     MapTable[BackendKey, BackendValue6]{m["sl_be_v6"]},
		BackendIndex: MapTable[BackendIndex6, uint32]{m["sl_be_idx_v6"]},
		SourceRanges: MapTable[SourceRangeKey6, uint32]{m["sl_src_v6"]},
		ClusterNets:  MapTable[ClusterNetKey6, ClusterNetVal]{m["sl_cnet_v6"]},
	}
}

// Render returns the tables as sorted text, one entry a line, for transition tests and
// `sluicectl diff`.
func Render(t Tables) (string, error) {
	lines, err := renderFam(family4(v4{}), t.v4())
	if err != nil {
		return "", err
	}
	if t.V6.Frontends != nil {
		v6lines, err := renderFam(family6(v6{}), t.V6)
		if err != nil {
			return "", err
		}
		lines = append(lines, v6lines...)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n"), nil
}

// renderFam renders one family's tables as Render does.
func renderFam[FK, BV, IK, SK, CK comparable](fam family[FK, BV, IK, SK, CK], t famTables[FK, BV, IK, SK, CK]) ([]string, error) {
	var lines []string
	fe, err := t.Frontends.Dump()
	if err != nil {
		return nil, err
	}
	for k, v := range fe {
		lines = append(lines, "frontend "+fam.feString(k, v))
	}
	be, err := t.Backends.Dump()
	if err != nil {
		return nil, err
	}
	for k, v := range be {
		lines = append(lines, "backend "+fam.beString(k, v))
	}
	sr, err := t.SourceRanges.Dump()
	if err != nil {
		return nil, err
	}
	for k := range sr {
		lines = append(lines, "source-range "+fam.srcString(k))
	}
	cn, err := t.ClusterNets.Dump()
	if err != nil {
		return nil, err
	}
	for k, v := range cn {
		lines = append(lines, "cluster-net "+fam.cnetString(k, v))
	}
	return lines, nil
}

// FrontendString describes a frontend entry.
func FrontendString(k FrontendKey, v FrontendValue) string {
	return frontendString(netip.AddrPortFrom(HostAddr(k.Addr), HostPort(k.Port)), k.Proto, v)
}

// frontendString describes a frontend entry of either family.
func frontendString(ap netip.AddrPort, proto uint8, v FrontendValue) string {
	var fl []string
	for _, f := range []struct {
		bit  uint32
		name string
	}{{FrontendExternalLocal, "external-local"}, {FrontendInternalLocal, "internal-local"},
		{FrontendSourceRanges, "source-ranges"}, {FrontendAddrOnly, "address-only"}, {FrontendNodePort, "node-port"}} {
		if v.Flags&f.bit != 0 {
			fl = append(fl, f.name)
		}
	}
	s := fmt.Sprintf("%s/%s service %016x", ap, ProtoName(proto), v.SvcId)
	if v.Flags&FrontendAddrOnly == 0 {
		s += fmt.Sprintf(" list %016x backends %d local %d cluster-from %d", v.ListId, v.Count, v.Local, v.ClusterStart)
	}
	if v.AffinitySec != 0 {
		s += fmt.Sprintf(" affinity %ds", v.AffinitySec)
	}
	if len(fl) > 0 {
		s += " " + strings.Join(fl, ",")
	}
	return s
}

// BackendString describes a backend entry.
func BackendString(k BackendKey, v BackendValue) string {
	return backendString(k, netip.AddrPortFrom(HostAddr(v.Addr), HostPort(v.Port)), HostAddr(v.NodeAddr), v.Flags)
}

// backendString describes a backend entry of either family.
func backendString(k BackendKey, ap netip.AddrPort, node netip.Addr, flags uint16) string {
	s := fmt.Sprintf("list %016x #%d %s node %s", k.ListId, k.Ordinal, ap, node)
	if flags&BackendLocal != 0 {
		s += " local"
	}
	if flags&BackendRouted != 0 {
		s += " routed"
	}
	return s
}

// SourceRangeString describes a source-range entry.
func SourceRangeString(k SourceRangeKey) string {
	return fmt.Sprintf("%s/%s from %s", netip.AddrPortFrom(HostAddr(k.FeAddr), HostPort(k.FePort)), ProtoName(k.Proto),
		netip.PrefixFrom(HostAddr(k.Src), int(k.Prefixlen)-64))
}

// ClusterNetString describes a cluster-network entry.
func ClusterNetString(k ClusterNetKey, v ClusterNetVal) string {
	return clusterNetString(netip.PrefixFrom(HostAddr(k.Addr), int(k.Prefixlen)), v)
}

// clusterNetString describes a cluster-network entry of either family.
func clusterNetString(p netip.Prefix, v ClusterNetVal) string {
	var fl []string
	if v.Flags&ClusterNetPool != 0 {
		fl = append(fl, "pool")
	}
	if v.Flags&ClusterNetHost != 0 {
		fl = append(fl, "node")
	}
	if v.Flags&ClusterNetSelf != 0 {
		fl = append(fl, "self")
	}
	return fmt.Sprintf("%s %s", p, strings.Join(fl, ","))
}

// listID names a backend list by its content, so frontends with the same endpoints share one
// list, a restarted agent finds the same IDs with nothing stored, and a changed list is
// written beside the old one before any frontend points at it.
func listID(bs []BackendValue) uint64 {
	h := fnv.New64a()
	var b [16]byte
	for _, v := range bs {
		binary.LittleEndian.PutUint32(b[0:], v.Addr)
		binary.LittleEndian.PutUint32(b[4:], v.NodeAddr)
		binary.LittleEndian.PutUint16(b[8:], v.Port)
		binary.LittleEndian.PutUint16(b[10:], v.Flags)
		h.Write(b[:12])
	}
	return h.Sum64()
}
