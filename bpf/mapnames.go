package bpf

import "github.com/cilium/ebpf"

// pinnedMap is one map sluiced pins under its pin directory: the one list every user of the
// maps' names reads (the pins, the sizes, sluicectl's readers, the IPv6 tables).
type pinnedMap struct {
	name string
	// of is the map in loaded objects.
	of func(*Objects) *ebpf.Map
	// size is the option that sizes it (nil: its size is the object's).
	size func(MapSizes) int
	// read: sluicectl opens it (OpenPinned); v6: an IPv6 map, which an agent of an earlier
	// version did not pin; optional: the IPv6 tables do without it.
	read, v6, optional bool
}

var pinnedMaps = []pinnedMap{
	{name: "sl_fe_v4", of: func(o *Objects) *ebpf.Map { return o.SlFeV4 }, size: func(s MapSizes) int { return s.Frontends }, read: true},
	{name: "sl_be_v4", of: func(o *Objects) *ebpf.Map { return o.SlBeV4 }, size: func(s MapSizes) int { return s.Backends }, read: true},
	{name: "sl_be_idx_v4", of: func(o *Objects) *ebpf.Map { return o.SlBeIdxV4 }, size: func(s MapSizes) int { return s.Backends }, read: true},
	{name: "sl_src_v4", of: func(o *Objects) *ebpf.Map { return o.SlSrcV4 }, size: func(s MapSizes) int { return s.SourceRanges }, read: true},
	{name: "sl_cnet_v4", of: func(o *Objects) *ebpf.Map { return o.SlCnetV4 }, size: func(s MapSizes) int { return s.ClusterNets }, read: true},
	{name: "sl_aff_v4", of: func(o *Objects) *ebpf.Map { return o.SlAffV4 }, size: func(s MapSizes) int { return s.Affinity }, read: true},
	{name: "sl_ct_v4", of: func(o *Objects) *ebpf.Map { return o.SlCtV4 }, size: func(s MapSizes) int { return s.Conntrack }, read: true},
	{name: "sl_cfg", of: func(o *Objects) *ebpf.Map { return o.SlCfg }, read: true},
	{name: "sl_counters", of: func(o *Objects) *ebpf.Map { return o.SlCounters }, read: true},
	{name: "sl_sock_v4", of: func(o *Objects) *ebpf.Map { return o.SlSockV4 }, size: func(s MapSizes) int { return s.Sockets }},
	{name: "sl_sock_be_v4", of: func(o *Objects) *ebpf.Map { return o.SlSockBeV4 }, size: func(s MapSizes) int { return s.Sockets }},

	{name: "sl_fe_v6", of: func(o *Objects) *ebpf.Map { return o.SlFeV6 }, size: func(s MapSizes) int { return s.Frontends }, read: true, v6: true},
	{name: "sl_be_v6", of: func(o *Objects) *ebpf.Map { return o.SlBeV6 }, size: func(s MapSizes) int { return s.Backends }, read: true, v6: true},
	{name: "sl_be_idx_v6", of: func(o *Objects) *ebpf.Map { return o.SlBeIdxV6 }, size: func(s MapSizes) int { return s.Backends }, read: true, v6: true},
	{name: "sl_src_v6", of: func(o *Objects) *ebpf.Map { return o.SlSrcV6 }, size: func(s MapSizes) int { return s.SourceRanges }, read: true, v6: true},
	{name: "sl_cnet_v6", of: func(o *Objects) *ebpf.Map { return o.SlCnetV6 }, size: func(s MapSizes) int { return s.ClusterNets }, read: true, v6: true},
	{name: "sl_aff_v6", of: func(o *Objects) *ebpf.Map { return o.SlAffV6 }, size: func(s MapSizes) int { return s.Affinity }, read: true, v6: true, optional: true},
	{name: "sl_ct_v6", of: func(o *Objects) *ebpf.Map { return o.SlCtV6 }, size: func(s MapSizes) int { return s.Conntrack }, read: true, v6: true, optional: true},
	{name: "sl_cfg_v6", of: func(o *Objects) *ebpf.Map { return o.SlCfgV6 }, read: true, v6: true, optional: true},
	{name: "sl_progs_v6", of: func(o *Objects) *ebpf.Map { return o.SlProgsV6 }, v6: true},
	{name: "sl_sock_v6", of: func(o *Objects) *ebpf.Map { return o.SlSockV6 }, size: func(s MapSizes) int { return s.Sockets }, v6: true},
	{name: "sl_sock_be_v6", of: func(o *Objects) *ebpf.Map { return o.SlSockBeV6 }, size: func(s MapSizes) int { return s.Sockets }, v6: true},
}

// PinnedMapNames are the IPv4 and shared maps sluicectl reads under a pin directory, by name.
var PinnedMapNames = readNames(false)

// PinnedMapNames6 are the IPv6 maps sluicectl reads; an agent of an earlier version pinned
// none (read as no IPv6 state).
var PinnedMapNames6 = readNames(true)

func readNames(v6 bool) []string {
	var out []string
	for _, m := range pinnedMaps {
		if m.read && m.v6 == v6 {
			out = append(out, m.name)
		}
	}
	return out
}

// pinned returns the maps that are pinned, by name.
func (o *Objects) pinned() map[string]*ebpf.Map {
	out := make(map[string]*ebpf.Map, len(pinnedMaps))
	for _, m := range pinnedMaps {
		out[m.name] = m.of(o)
	}
	return out
}
