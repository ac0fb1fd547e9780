package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cloudflare/ipvs"
	"github.com/sluice-net/sluice/internal/nlutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultHostInterfaces matches a node's NICs, bonds and VLANs as Calico's
// BPFDataIfacePattern does. A matching device enslaved to another (a bond's slave) gets no
// programs; its master does when it matches. A VLAN's parent keeps its programs for untagged
// traffic; tagged packets pass them for the VLAN device's own.
const DefaultHostInterfaces = `^((en|wl|ww|sl|ib)[Popsx].*|(eth|wlan|wwan|bond).*)`

// Hook is one program on one interface direction.
type Hook struct {
	Iface   string
	Ifindex int
	Egress  bool
}

func (h Hook) dir() string {
	if h.Egress {
		return "egress"
	}
	return "ingress"
}

func (h Hook) String() string { return h.Iface + " " + h.dir() }

// Conflict is a program of other software on a hook sluice uses (a leftover of another CNI
// or of an earlier install, as in seed 000): what it is, whose, whether it breaks one of
// sluice's paths or is dormant behind sluice's program, and how to remove it.
type Conflict struct {
	Hook     Hook
	Kind     string // KindXDP, KindTCX, KindTCFilter
	What     string // "tcx program 123 cil_from_netdev", "tc filter pref 1 handle 0x1 bpf foreign"
	Owner    string // OwnerCalico, OwnerCilium; "" when its name says nothing
	Breaking bool   // it can take the hook's packets before sluice's program sees them
	Breaks   string // which of sluice's paths it breaks; for a dormant one, why it is dormant
	Fix      string // the command that removes it by hand
	Removed  bool
	Gone     bool // reported before and no longer there (set by the Stage)
	Err      error

	// Cgroup and CgroupHook say where a cgroup socket hook's program is (KindCgroup): the
	// cgroup directory and the hook (connect4, sendmsg6, ...); Hook is then unset.
	Cgroup, CgroupHook string
	// Path is a pin directory's (KindPin); Hook is then unset.
	Path string

	xdpMode      uint32
	tcxLink      link.ID
	filter       tcFilter
	progID       ebpf.ProgramID
	cgroupAttach ebpf.AttachType
	ipvsAddrs    []netlink.Addr // kube-ipvs0's addresses that are sluice's frontends
	ipvsService  *ipvs.Service  // an IPVS virtual service (KindIPVS, not kube-ipvs0)
}

// Where is the hook c is on: an interface and direction, or a cgroup and socket hook.
func (c Conflict) Where() string {
	if c.Kind == KindIPVS {
		return c.Hook.Iface
	}
	if c.Path != "" {
		return "bpffs " + c.Path
	}
	if c.Cgroup != "" {
		return "cgroup " + c.Cgroup + " " + c.CgroupHook
	}
	return c.Hook.String()
}

// Key identifies c across syncs: its kind, what it is and where.
func (c Conflict) Key() string { return c.Kind + " " + c.What + " on " + c.Where() }

// Effect is "breaking" or "dormant".
func (c Conflict) Effect() string {
	if c.Breaking {
		return "breaking"
	}
	return "dormant"
}

func (c Conflict) String() string {
	s := fmt.Sprintf("%s on %s (%s", c.What, c.Where(), c.Effect())
	if c.Owner != "" {
		s += ", " + c.Owner
	}
	s += ")"
	switch {
	case c.Removed:
		s += " (removed)"
	case c.Gone:
		s += " (gone)"
	}
	return s
}

// Attacher keeps sluice's programs attached on the host interfaces (by pattern) and the
// workload interfaces (named by calc's routes), through TCX links or classic tc filters
// (mode). Ownership rules: a TCX link is sluice's when it is pinned under <pin dir>/links as
// <iface>_<direction>, so a restarted agent finds it and swaps its new programs in atomically
// (link update); a classic filter is sluice's by its slot (TCPriority, TCHandle, a program
// named sl_*), replaced in place by a restarted agent. Either way traffic never meets an
// interface without a program. Switching modes removes the other mode's objects once the new
// ones are in place.
type Attacher struct {
	dir            string
	mode           AttachMode // tcx or tc, resolved
	objs           *Objects
	hostPattern    *regexp.Regexp
	tunnels        []string // overlay devices: egress only (StageConfig.TunnelDevices)
	cleanConflicts bool
	links          map[Hook]link.Link
	// filters are the hooks holding sluice's classic filter after the last Sync (tc mode).
	filters map[Hook]bool
	ours    map[ebpf.ProgramID]bool
	// Repairs counts links found detached or missing and attached again, held links whose
	// pin was removed, pinned again, and classic filters found removed and put back.
	Repairs int
	// beforeAttach, when set, is called before each hook is attached: a test's way to
	// delete an interface between the listing and the attach.
	beforeAttach func(Hook)
}

// NewAttacher returns an attacher for objs in mode (tcx or tc: resolve auto first), pinning
// links under pinDir/links.
func NewAttacher(pinDir string, mode AttachMode, objs *Objects, hostPattern *regexp.Regexp, cleanConflicts bool) (*Attacher, error) {
	if mode != AttachTCX && mode != AttachTC {
		return nil, fmt.Errorf("attach mode %q: want tcx or tc", mode)
	}
	dir := filepath.Join(pinDir, "links")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating link pin directory: %w", err)
	}
	a := &Attacher{dir: dir, mode: mode, objs: objs, hostPattern: hostPattern, cleanConflicts: cleanConflicts,
		links: map[Hook]link.Link{}, filters: map[Hook]bool{}, ours: map[ebpf.ProgramID]bool{}}
	for _, p := range []*ebpf.Program{objs.SlFromHost, objs.SlToHost, objs.SlFromWep, objs.SlToWep} {
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("reading program info: %w", err)
		}
		if id, ok := info.ID(); ok {
			a.ours[id] = true
		}
	}
	return a, nil
}

// Mode is how the attacher attaches: tcx or tc.
func (a *Attacher) Mode() AttachMode { return a.mode }

func (a *Attacher) program(h Hook, wep bool) (*ebpf.Program, string) {
	switch {
	case !wep && h.Egress:
		return a.objs.SlToHost, "sl_to_host"
	case !wep:
		return a.objs.SlFromHost, "sl_from_host"
	case h.Egress:
		return a.objs.SlToWep, "sl_to_wep"
	default:
		return a.objs.SlFromWep, "sl_from_wep"
	}
}

func (a *Attacher) pin(h Hook) string { return filepath.Join(a.dir, pinSafe(h.Iface)+"_"+h.dir()) }

// pinSafe escapes an interface name for a bpffs file name, which may not hold a dot (bpffs
// refuses it: EPERM) while interface names may: VLAN devices (eth0.100), sluice's own
// vxlan.sluice. '%' and '.' become %25 and %2e, so no two names meet.
func pinSafe(iface string) string {
	return strings.NewReplacer("%", "%25", ".", "%2e").Replace(iface)
}

// isHookPin says whether a pin under the link directory is an interface hook's.
func isHookPin(name string) bool {
	return strings.HasSuffix(name, "_ingress") || strings.HasSuffix(name, "_egress")
}

// Sync attaches to every wanted interface present now and detaches from every other one.
// It returns the conflicts found on the hooks it holds.
func (a *Attacher) Sync(workloads map[string]bool) ([]Conflict, error) {
	links, err := nlutil.DumpAgain(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	want := map[Hook]bool{} // hook → is a workload hook
	for _, l := range links {
		attrs := l.Attrs()
		name := attrs.Name
		switch {
		case workloads[name]:
			want[Hook{Iface: name, Ifindex: attrs.Index}] = true
			want[Hook{Iface: name, Ifindex: attrs.Index, Egress: true}] = true
		case a.hostPattern != nil && a.hostPattern.MatchString(name) && attrs.MasterIndex == 0:
			// A device enslaved to a bond, team or bridge is left alone: its master carries
			// the addresses and gets the programs. On a slave they would see a request
			// before the bond does, record the slave as the way back, and send the replies
			// out of it, past the bond (and out of a dead link after a failover).
			want[Hook{Iface: name, Ifindex: attrs.Index}] = false
			want[Hook{Iface: name, Ifindex: attrs.Index, Egress: true}] = false
		case slices.Contains(a.tunnels, name):
			want[Hook{Iface: name, Ifindex: attrs.Index, Egress: true}] = false
		}
	}
	var errs []error
	hooks := make([]Hook, 0, len(want))
	for h := range want {
		hooks = append(hooks, h)
	}
	sort.Slice(hooks, func(i, j int) bool { return hooks[i].String() < hooks[j].String() })
	// The classic filters on every interface: sluice's own (held in tc mode; left by the
	// other mode otherwise) and other programs' (conflicts on the hooks sluice holds).
	filters, err := linkFilters(links)
	if err != nil {
		errs = append(errs, err)
	}
	for _, h := range hooks {
		prog, name := a.program(h, want[h])
		repairs := a.Repairs
		if a.beforeAttach != nil {
			a.beforeAttach(h)
		}
		var err error
		if a.mode == AttachTC {
			err = a.attachTC(h, prog, name, filters[h])
		} else {
			err = a.attach(h, prog)
		}
		if (err != nil || a.Repairs != repairs) && interfaceGone(h.Ifindex) {
			// The interface went while it was being attached (a workload that lived a few
			// seconds): its links are gone with it, which is neither an error nor drift.
			// The next sync finds it gone and lets go of what is held for it.
			a.Repairs, err = repairs, nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("attaching to %s: %w", h, err))
		}
	}
	// Sluice's classic filters where none is wanted: interfaces no longer sluice's, or every
	// one in TCX mode (left by the tc mode), once the links above are in place.
	for h, fs := range filters {
		for _, f := range fs {
			if _, wanted := want[h]; f.ours() && (a.mode == AttachTCX || !wanted) {
				if err := delTCFilter(h); err != nil {
					errs = append(errs, err)
				}
				delete(a.filters, h)
			}
		}
	}
	for h := range a.filters {
		if _, ok := want[h]; !ok {
			delete(a.filters, h)
		}
	}
	// Whatever is pinned or held and not wanted goes: interfaces removed or renamed, workloads
	// gone, and every link in tc mode (left by the TCX mode), once the filters are in place.
	held := map[string]bool{}
	if a.mode == AttachTCX {
		for h := range want {
			held[filepath.Base(a.pin(h))] = true
		}
	}
	for h, l := range a.links {
		if _, ok := want[h]; !ok || a.mode == AttachTC {
			// An interface gone and back under its name (a new ifindex) has its new link
			// pinned at the old one's path by now: that pin stays.
			if !held[filepath.Base(a.pin(h))] {
				_ = l.Unpin()
			}
			_ = l.Close()
			delete(a.links, h)
		}
	}
	entries, err := os.ReadDir(a.dir)
	if err != nil {
		errs = append(errs, fmt.Errorf("reading link pins: %w", err))
	}
	for _, e := range entries {
		// Only interface links: the socket hooks pin theirs in the same directory.
		if !isHookPin(e.Name()) {
			continue
		}
		if !held[e.Name()] {
			// Detached first: the last reference dropped with the pin lets the kernel
			// detach the link only later, from a work queue.
			if l, err := link.LoadPinnedLink(filepath.Join(a.dir, e.Name()), nil); err == nil {
				_ = l.Detach()
				_ = l.Close()
			}
			if err := os.Remove(filepath.Join(a.dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("removing stale link pin %s: %w", e.Name(), err))
			}
		}
	}
	byIndex := make(map[int]netlink.Link, len(links))
	for _, l := range links {
		byIndex[l.Attrs().Index] = l
	}
	var conflicts []Conflict
	for _, h := range hooks {
		conflicts = append(conflicts, a.conflicts(h, want[h], byIndex[h.Ifindex], filters[h])...)
	}
	return conflicts, errors.Join(errs...)
}

// interfaceGone says whether the interface at ifindex no longer exists.
func interfaceGone(ifindex int) bool {
	_, err := netlink.LinkByIndex(ifindex)
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// attachTC makes h run prog through sluice's classic filter, given the filters on h now: kept
// when it runs one of this agent's programs, replaced in place when it runs another (a
// previous run's), created when missing (a repair when this attacher had put it there).
func (a *Attacher) attachTC(h Hook, prog *ebpf.Program, name string, on []tcFilter) error {
	for _, f := range on {
		if f.Priority == TCPriority && f.Handle == TCHandle && !f.ours() {
			return fmt.Errorf("%s holds sluice's slot (pref %d handle %#x): remove it, or it stays", f, TCPriority, TCHandle)
		}
		if f.ours() && a.ours[f.ProgID] {
			a.filters[h] = true
			return nil
		}
	}
	found := false
	for _, f := range on {
		found = found || f.ours()
	}
	if !found && a.filters[h] {
		a.Repairs++
	}
	if !found {
		if err := ensureClsact(h.Ifindex); err != nil {
			delete(a.filters, h)
			return err
		}
	}
	if err := setTCFilter(h, prog, name); err != nil {
		delete(a.filters, h)
		return err
	}
	a.filters[h] = true
	return nil
}

// attach makes h run prog through a pinned TCX link, reusing (and updating in place) a link
// that is already there.
func (a *Attacher) attach(h Hook, prog *ebpf.Program) error {
	attach := ebpf.AttachTCXIngress
	if h.Egress {
		attach = ebpf.AttachTCXEgress
	}
	l, repaired, err := holdLink(a.pin(h), a.links[h], func(info *link.Info) bool {
		return info.TCX() != nil && int(info.TCX().Ifindex) == h.Ifindex
	}, a.ours, prog, func() (link.Link, error) {
		return link.AttachTCX(link.TCXOptions{Interface: h.Ifindex, Program: prog, Attach: attach, Anchor: link.Head()})
	})
	a.Repairs += repaired
	if l != nil {
		a.links[h] = l
	} else {
		delete(a.links, h)
	}
	return err
}

// holdLink keeps prog attached through the link pinned at path. The link held (or found
// pinned there by an earlier run) is kept while valid says it is still attached where it
// should be: its program is swapped in place when it is not one of ours, and its pin is put
// back if someone removed it (without the pin the program goes when the agent stops; Pin is
// a no-op for the path the link remembers, so that is forgotten first). A link detached by
// someone, or whose target went and came back, is let go and attach makes a new one, pinned
// at path. repaired counts what was found broken.
func holdLink(path string, held link.Link, valid func(*link.Info) bool, ours map[ebpf.ProgramID]bool,
	prog *ebpf.Program, attach func() (link.Link, error)) (l link.Link, repaired int, err error) {
	l = held
	if l == nil {
		if pl, err := link.LoadPinnedLink(path, nil); err == nil {
			l = pl
		}
	}
	if l != nil {
		if info, err := l.Info(); err == nil && valid(info) {
			if !ours[info.Program] {
				if err := l.Update(prog); err != nil {
					return l, repaired, fmt.Errorf("replacing the program: %w", err)
				}
			}
			if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
				repaired++
				_ = l.Unpin()
				if err := l.Pin(path); err != nil {
					return l, repaired, fmt.Errorf("pinning link again: %w", err)
				}
			}
			return l, repaired, nil
		}
		repaired++
		_ = l.Unpin()
		_ = l.Close()
	}
	_ = os.Remove(path)
	nl, err := attach()
	if err != nil {
		return nil, repaired, err
	}
	if err := nl.Pin(path); err != nil {
		_ = nl.Close()
		return nil, repaired, fmt.Errorf("pinning link: %w", err)
	}
	return nl, repaired, nil
}

// conflicts lists other software's programs on h (an XDP program on its interface, TCX
// programs, classic filters given as on), each breaking or dormant; with cleanConflicts the
// removable ones (Conflict.Removable) are removed.
func (a *Attacher) conflicts(h Hook, wep bool, l netlink.Link, on []tcFilter) []Conflict {
	if a.mode == AttachTC && !slices.ContainsFunc(on, tcFilter.ours) {
		// Read again: sluice's own filter was put on since on was read (a first attach), and
		// the position of the others against it is what tells breaking from dormant.
		if fs, err := tcFilters(h); err == nil {
			on = fs
		}
	}
	v := hookView{hook: h, wep: wep, mode: a.mode, tcx: tcxPrograms(h), tc: on,
		ours:  func(id ebpf.ProgramID) bool { return a.ours[id] },
		owner: programNames()}
	if l != nil {
		v.xdp = l.Attrs().Xdp
	}
	out := v.classify()
	if a.cleanConflicts {
		for i := range out {
			if c := &out[i]; c.Removable() {
				c.Err = c.remove()
				c.Removed = c.Err == nil
			}
		}
	}
	return out
}

// Hooks returns the hooks held now, sorted.
func (a *Attacher) Hooks() []Hook {
	out := make([]Hook, 0, len(a.links)+len(a.filters))
	for h := range a.links {
		out = append(out, h)
	}
	for h := range a.filters {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// Close releases the link handles; the pins keep the programs attached.
func (a *Attacher) Close() {
	for _, l := range a.links {
		_ = l.Close()
	}
	a.links = map[Hook]link.Link{}
}

// RemoveAll detaches every program sluice attached (links pinned under pinDir, and sluice's
// classic filters on this namespace's interfaces) and removes every pin under pinDir: the
// service stage turned off leaves nothing behind.
func RemoveAll(pinDir string) error {
	var errs []error
	dir := filepath.Join(pinDir, "links")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if l, err := link.LoadPinnedLink(p, nil); err == nil {
			_ = l.Unpin()
			_ = l.Close()
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	_ = os.Remove(dir)
	// Sluice's classic filters, on every interface (clsact stays: other filters may use it).
	hooks, err := SluiceFilters()
	if err != nil {
		errs = append(errs, err)
	}
	for _, h := range hooks {
		if err := delTCFilter(h); err != nil {
			errs = append(errs, err)
		}
	}
	spec, err := loadSluice()
	if err == nil {
		for name := range spec.Maps {
			// With a resize's temporary pin, should one have been left by a crash.
			for _, p := range []string{filepath.Join(pinDir, name), resizeTemp(filepath.Join(pinDir, name))} {
				if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, fmt.Errorf("removing pinned map %s: %w", filepath.Base(p), err))
				}
			}
		}
	}
	return errors.Join(errs...)
}
