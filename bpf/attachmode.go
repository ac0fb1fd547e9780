package bpf

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/internal/nlutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// AttachMode is how the programs are attached to interfaces: TCX links (Linux 6.6 and
// later) or classic tc filters (clsact and cls_bpf in direct-action mode, every kernel
// sluice supports). Auto picks TCX where the kernel has it, as Cilium does.
type AttachMode string

const (
	AttachAuto AttachMode = "auto"
	AttachTCX  AttachMode = "tcx"
	AttachTC   AttachMode = "tc"
)

// ParseAttachMode reads an option's value.
func ParseAttachMode(s string) (AttachMode, error) {
	switch m := AttachMode(strings.ToLower(strings.TrimSpace(s))); m {
	case AttachAuto, AttachTCX, AttachTC:
		return m, nil
	case "":
		return AttachAuto, nil
	}
	return "", fmt.Errorf("%q is not auto, tcx or tc", s)
}

// ErrNoTCX: the kernel has no TCX links (before Linux 6.6).
var ErrNoTCX = errors.New("this kernel has no TCX program links (Linux 6.6 or later)")

// Resolve turns auto into the mode this kernel takes, and refuses tcx where the kernel lacks it.
func (m AttachMode) Resolve() (AttachMode, error) {
	switch m {
	case AttachTC:
		return AttachTC, nil
	case AttachTCX:
		if err := HaveTCX(); err != nil {
			return "", fmt.Errorf("option bpf-attach tcx: %w", err)
		}
		return AttachTCX, nil
	}
	if HaveTCX() == nil {
		return AttachTCX, nil
	}
	return AttachTC, nil
}

// HaveTCX probes for TCX links: creating one on no interface fails with ENODEV where the
// kernel knows the attach type, with EINVAL where it does not (cilium/ebpf's own probe).
func HaveTCX() error {
	raiseMemlock()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		return fmt.Errorf("probing TCX: loading a tc program: %w", err)
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: 0x7fffffff, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		_ = l.Close()
		return nil
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return ErrNoTCX
	}
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	return fmt.Errorf("probing TCX: %w", err)
}

// Classic tc ownership rule: sluice's filter on a clsact hook is the bpf filter at priority
// TCPriority with handle TCHandle whose program's name starts with ProgramPrefix. The first
// priority, so that it runs before other classic filters; a filter of another program found
// at that slot is never replaced.
const (
	TCPriority = 1
	TCHandle   = 0x5c1
)

// ProgramPrefix starts the name of every program sluice loads (the C functions in c/ are
// sl_*). It is the ownership rule for programs by name, declared here beside the classic tc
// slot because package bpf has no ownership file. By it a filter in that slot is sluice's
// (tcFilter.ours), so is a program on a hook or a cgroup to a reader without the agent's
// program IDs (sluiceByName: sluicectl), and a socket program of another agent sharing the
// cgroup is passed over (cgroupConflicts).
const ProgramPrefix = "sl_"

// tcFilter is a bpf filter on a clsact hook as the kernel lists it.
type tcFilter struct {
	Hook     Hook
	Priority uint16
	Handle   uint32
	Name     string
	ProgID   ebpf.ProgramID
}

func (f tcFilter) ours() bool {
	return f.Priority == TCPriority && f.Handle == TCHandle && strings.HasPrefix(f.Name, ProgramPrefix)
}

func (f tcFilter) String() string {
	return fmt.Sprintf("tc filter pref %d handle %#x bpf %s", f.Priority, f.Handle, f.Name)
}

func tcParent(egress bool) uint32 {
	if egress {
		return netlink.HANDLE_MIN_EGRESS
	}
	return netlink.HANDLE_MIN_INGRESS
}

// tcFilters lists the bpf filters on h's clsact hook (none when the interface has no clsact).
func tcFilters(h Hook) ([]tcFilter, error) {
	l := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: h.Ifindex}}
	fs, err := netlink.FilterList(l, tcParent(h.Egress))
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil, nil // no clsact qdisc
		}
		return nil, fmt.Errorf("listing tc filters on %s: %w", h, err)
	}
	var out []tcFilter
	for _, f := range fs {
		bf, ok := f.(*netlink.BpfFilter)
		if !ok {
			continue
		}
		a := bf.Attrs()
		out = append(out, tcFilter{Hook: h, Priority: a.Priority, Handle: a.Handle, Name: strings.TrimSpace(bf.Name),
			ProgID: ebpf.ProgramID(bf.Id)})
	}
	return out, nil
}

// ensureClsact adds the clsact qdisc to the interface unless it has one. It is never replaced
// nor removed: other programs' filters may hang on it.
func ensureClsact(ifindex int) error {
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0),
		Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding the clsact qdisc: %w", err)
	}
	return nil
}

// setTCFilter puts prog at sluice's slot on h: created, or replaced in place (the kernel swaps
// the program of a filter of the same priority and handle; packets never meet the hook
// without one).
func setTCFilter(h Hook, prog *ebpf.Program, name string) error {
	f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: h.Ifindex, Parent: tcParent(h.Egress),
		Handle: TCHandle, Priority: TCPriority, Protocol: unix.ETH_P_ALL}, Fd: prog.FD(), Name: name, DirectAction: true}
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("setting tc filter pref %d handle %#x: %w", TCPriority, TCHandle, err)
	}
	return nil
}

// delTCFilter removes sluice's filter from h; gone already is success.
func delTCFilter(h Hook) error {
	f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: h.Ifindex, Parent: tcParent(h.Egress),
		Handle: TCHandle, Priority: TCPriority, Protocol: unix.ETH_P_ALL}}
	if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("removing tc filter pref %d handle %#x from %s: %w", TCPriority, TCHandle, h, err)
	}
	return nil
}

// linkFilters lists the bpf filters on both hooks of every interface in links. An interface
// it cannot read is left out and named in the error.
func linkFilters(links []netlink.Link) (map[Hook][]tcFilter, error) {
	out := map[Hook][]tcFilter{}
	var errs []error
	for _, l := range links {
		for _, egress := range []bool{false, true} {
			h := Hook{Iface: l.Attrs().Name, Ifindex: l.Attrs().Index, Egress: egress}
			fs, err := tcFilters(h)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out[h] = fs
		}
	}
	return out, errors.Join(errs...)
}

// SluiceFilters returns the hooks of this namespace's interfaces that hold sluice's classic
// filter (left by a run in tc mode).
func SluiceFilters() ([]Hook, error) {
	links, err := nlutil.DumpAgain(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	filters, err := linkFilters(links)
	var out []Hook
	for h, fs := range filters {
		for _, f := range fs {
			if f.ours() {
				out = append(out, h)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, err
}

// ourFiltersPresent says whether sluice's classic filter is on any interface of this
// namespace: a previous run in tc mode left its programs running.
func ourFiltersPresent() bool {
	hooks, _ := SluiceFilters()
	return len(hooks) > 0
}

// ProgramsOn names the programs on one hook of an interface, as the kernel holds them: TCX
// programs first (they run first), then classic tc filters by priority. For operators' and
// the lab's checks of where programs sit.
func ProgramsOn(ifindex int, egress bool) ([]string, error) {
	attach := ebpf.AttachTCXIngress
	if egress {
		attach = ebpf.AttachTCXEgress
	}
	var out []string
	if res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: attach}); err == nil {
		for _, p := range res.Programs {
			prog, err := ebpf.NewProgramFromID(p.ID)
			if err != nil {
				return nil, fmt.Errorf("opening program %d: %w", p.ID, err)
			}
			info, err := prog.Info()
			prog.Close()
			if err != nil {
				return nil, fmt.Errorf("reading program %d: %w", p.ID, err)
			}
			out = append(out, info.Name)
		}
	}
	fs, err := tcFilters(Hook{Ifindex: ifindex, Egress: egress})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].Priority < fs[j].Priority })
	for _, f := range fs {
		out = append(out, f.Name)
	}
	return out, nil
}
