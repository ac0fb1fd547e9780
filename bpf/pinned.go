package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"
)

// ErrNotPinned is returned by OpenPinned when the pin directory or one of its maps does not
// exist: the service stage is off (option services), or sluiced has not started it here.
var ErrNotPinned = errors.New("service maps not found")

// Pinned is a read-only view of the maps a running sluiced pinned, for operators' tools
// (sluicectl services, sluicectl diff). It never writes: the maps are opened read-only, so
// the Tables it returns refuse Put and Delete.
//
// Hazards: the connection table changes under the reader (the programs add and refresh
// entries per packet, the cleaner deletes), so a dump is a moment's picture, not a
// consistent snapshot; and a pinned map of another layout (a sluicectl of another version)
// would be read as garbage, so every map's layout is checked against this build's object.
type Pinned struct {
	Dir  string
	maps map[string]*ebpf.Map // by pinned name
}

// OpenPinned opens the maps pinned under pinDir read-only. A missing directory or map is
// ErrNotPinned, with the path and what it suggests.
func OpenPinned(pinDir string) (*Pinned, error) {
	if _, err := os.Stat(pinDir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w at %s: the directory does not exist (the service stage seems off: option services=false, or sluiced has not started it on this node)", ErrNotPinned, pinDir)
		}
		return nil, fmt.Errorf("reading pin directory %s: %w", pinDir, err)
	}
	spec, err := loadSluice()
	if err != nil {
		return nil, fmt.Errorf("reading the embedded eBPF object: %w", err)
	}
	p := &Pinned{Dir: pinDir, maps: map[string]*ebpf.Map{}}
	for _, name := range append(slices.Clone(PinnedMapNames), PinnedMapNames6...) {
		path := filepath.Join(pinDir, name)
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) && slices.Contains(PinnedMapNames6, name) {
			continue
		}
		if err != nil {
			p.Close()
			switch {
			case errors.Is(err, os.ErrNotExist):
				return nil, fmt.Errorf("%w at %s: no pinned map %s (sluiced has not loaded the service stage here yet, or it is of another version)", ErrNotPinned, pinDir, name)
			case errors.Is(err, os.ErrPermission):
				return nil, fmt.Errorf("opening pinned map %s: %w (reading eBPF maps needs root or CAP_BPF)", path, err)
			}
			return nil, fmt.Errorf("opening pinned map %s: %w", path, err)
		}
		if ms := spec.Maps[name]; ms != nil && (m.Type() != ms.Type || m.KeySize() != ms.KeySize || m.ValueSize() != ms.ValueSize) {
			err := fmt.Errorf("pinned map %s has another layout (%v, key %d, value %d bytes; this sluicectl reads %v, %d, %d): %w",
				path, m.Type(), m.KeySize(), m.ValueSize(), ms.Type, ms.KeySize, ms.ValueSize, ebpf.ErrMapIncompatible)
			m.Close()
			p.Close()
			return nil, err
		}
		p.maps[name] = m
	}
	return p, nil
}

// Tables returns the service maps as Tables (for Render and comparison); they are
// read-only.
func (p *Pinned) Tables() Tables { return tablesOf(p.maps) }

// Conntrack returns the connection table's entries.
func (p *Pinned) Conntrack() (map[ConntrackKey]ConntrackValue, error) {
	out, err := MapTable[ConntrackKey, ConntrackValue]{p.maps["sl_ct_v4"]}.Dump()
	if err != nil {
		return nil, fmt.Errorf("reading the connection table in %s: %w", p.Dir, err)
	}
	return out, nil
}

// Conntrack6 returns the IPv6 connection table's entries (none from an agent without one).
func (p *Pinned) Conntrack6() (map[ConntrackKey6]ConntrackValue6, error) {
	m := p.maps["sl_ct_v6"]
	if m == nil {
		return nil, nil
	}
	out, err := MapTable[ConntrackKey6, ConntrackValue6]{m}.Dump()
	if err != nil {
		return nil, fmt.Errorf("reading the IPv6 connection table in %s: %w", p.Dir, err)
	}
	return out, nil
}

// Counters returns the per-CPU counters summed, by name (CounterNames).
func (p *Pinned) Counters() (map[string]uint64, error) {
	out, err := sumCounters(p.maps["sl_counters"])
	if err != nil {
		return nil, fmt.Errorf("%w in %s", err, p.Dir)
	}
	return out, nil
}

// Close releases the map handles (the pins stay).
func (p *Pinned) Close() {
	for _, m := range p.maps {
		m.Close()
	}
}

// ConntrackKind names an entry type: forward, reverse or tunnel.
func ConntrackKind(t uint8) string {
	switch t {
	case ConntrackFwd:
		return "forward"
	case ConntrackRev:
		return "reverse"
	case ConntrackTun:
		return "tunnel"
	}
	return fmt.Sprintf("type-%d", t)
}

// ConntrackFlagNames names an entry's flags: forwarded (to or from another node through the
// tunnel), redirect (replies leave by the recorded interface and MACs) and psnat (the source
// port was rewritten).
func ConntrackFlagNames(f uint8) []string {
	var out []string
	for _, b := range []struct {
		bit  uint8
		name string
	}{{ConntrackRemote, "forwarded"}, {ConntrackRedirect, "redirect"}, {ConntrackPSNAT, "psnat"}, {ConntrackLocal, "local"}} {
		if f&b.bit != 0 {
			out = append(out, b.name)
		}
	}
	return out
}

// TCPStateNames names the TCP state bits of an entry.
func TCPStateNames(s uint8) []string {
	var out []string
	for _, b := range []struct {
		bit  uint8
		name string
	}{{TCPSyn, "syn"}, {TCPReplied, "replied"}, {TCPFinFwd, "fin-fwd"}, {TCPFinRev, "fin-rev"}, {TCPRst, "rst"}, {TCPLiveFwd, "live-fwd"}, {TCPLiveRev, "live-rev"}, {TCPOpening, "opening"}} {
		if s&b.bit != 0 {
			out = append(out, b.name)
		}
	}
	return out
}

// ConntrackString describes a connection-table entry for operators: its kind, protocol and
// tuple as the packets carry it, the translation and where the packets go, its flags, TCP
// state, idle time and age (now is CLOCK_MONOTONIC in ns, Monotonic()).
func ConntrackString(k ConntrackKey, v ConntrackValue, now uint64) string {
	return ConntrackStringNamed(k, v, now, nil)
}

// ConntrackStringNamed is ConntrackString naming the interface of a redirect: ifname
// returns the name of an interface index, or "" when it does not know it.
func ConntrackStringNamed(k ConntrackKey, v ConntrackValue, now uint64, ifname func(int) string) string {
	return FlowOf(k, v).String(now, ifname)
}

// since is now - t in whole seconds; a t after now (another clock, a racing update) is 0s.
func since(now, t uint64) time.Duration {
	if t >= now {
		return 0
	}
	return time.Duration(now - t).Truncate(time.Second)
}
