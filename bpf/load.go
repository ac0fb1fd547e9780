package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// MapSizes are the maximum entries of the service maps (options of the agent).
type MapSizes struct {
	Frontends    int
	Backends     int
	SourceRanges int
	ClusterNets  int
	Affinity     int
	Conntrack    int
	// Sockets sizes the socket programs' maps (one entry a host socket connected to a
	// service); 0 keeps the object's 65,536. Not an option of the agent: tests make them small.
	Sockets int
}

// DefaultMapSizes fit 10,000 services of 10 endpoints with room to spare.
var DefaultMapSizes = MapSizes{Frontends: 65536, Backends: 262144, SourceRanges: 16384, ClusterNets: 65536,
	Affinity: 65536, Conntrack: 262144}

func (s MapSizes) apply(spec *ebpf.CollectionSpec) {
	set := func(name string, n int) {
		if n > 0 {
			spec.Maps[name].MaxEntries = uint32(n)
		}
	}
	// Each option sizes the map of both families (pinnedMaps says which).
	for _, m := range pinnedMaps {
		if m.size != nil {
			set(m.name, m.size(s))
		}
	}
	// The young-flow ring of each CPU: together an eighth of the connection table's flows
	// (two entries each), so unanswered flows (a SYN flood's) hold at most a quarter of it.
	// Shared among the CPUs that run (a machine may report many more possible ones, which
	// would shrink each ring and so its turn).
	spec.Maps["sl_ct_young_v4"].MaxEntries = YoungRing(int(spec.Maps["sl_ct_v4"].MaxEntries), onlineCPUs())
	spec.Maps["sl_ct_young_v6"].MaxEntries = YoungRing(int(spec.Maps["sl_ct_v6"].MaxEntries), onlineCPUs())
}

// onlineCPUs counts the CPUs the kernel runs (/sys/devices/system/cpu/online, "0-3,6"); the
// possible ones when it cannot be read.
func onlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if n := countCPUList(strings.TrimSpace(string(b))); err == nil && n > 0 {
		return n
	}
	if n, err := ebpf.PossibleCPU(); err == nil && n > 0 {
		return n
	}
	return 1
}

// countCPUList counts the CPUs of a kernel CPU list ("0-3,6" is 5); 0 when it cannot be read.
func countCPUList(list string) int {
	n := 0
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}

// YoungRing is the size of each CPU's young-flow ring for a connection table of entries.
func YoungRing(entries, ncpu int) uint32 {
	return uint32(max(64, entries/8/ncpu))
}

// Objects are sluice's loaded programs and maps.
type Objects struct {
	sluiceObjects
	// Resized names maps whose pin was replaced because its size option changed (their
	// entries were copied into the new map).
	Resized []string
}

// Close releases the programs and maps (pins stay).
func (o *Objects) Close() error { return o.sluiceObjects.Close() }

// Load loads the programs and maps. With a pin directory, maps are pinned there by name and
// a restarted agent reuses them (state and connections survive); a pinned map whose size no
// longer matches its option is replaced by one of the new size holding the same entries.
// Without one (tests), every map is new and private.
func Load(pinDir string, sizes MapSizes) (*Objects, error) { return load(pinDir, sizes, true) }

// programs6 are the IPv6 tc programs, reached by tail calls from the IPv4 ones.
var programs6 = []string{"sl_from_host6", "sl_from_wep6", "sl_to_wep6", "sl_to_host6"}

// load is Load; without ipv6 the IPv6 tc programs are left out (their slots in sl_progs_v6
// empty: IPv6 packets pass untouched). Only tests of the IPv4 programs load so, to shorten
// their verification under emulation (the kernel matrix).
func load(pinDir string, sizes MapSizes, ipv6 bool) (*Objects, error) {
	raiseMemlock()
	spec, err := loadSluice()
	if err != nil {
		return nil, fmt.Errorf("reading the embedded eBPF object: %w", err)
	}
	sizes.apply(spec)
	if !ipv6 {
		for _, name := range programs6 {
			delete(spec.Programs, name)
		}
	}
	opts := &ebpf.CollectionOptions{}
	o := &Objects{}
	if pinDir == "" {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	} else {
		opts.Maps.PinPath = pinDir
		for name, m := range spec.Maps {
			resized, err := resizePinned(filepath.Join(pinDir, name), m)
			if err != nil {
				return nil, err
			}
			if resized {
				o.Resized = append(o.Resized, name)
			}
		}
	}
	if err := loadObjects(spec, opts, o); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading the eBPF programs: %+v", ve)
		}
		return nil, fmt.Errorf("loading the eBPF programs: %w", err)
	}
	if err := o.fillProgs6(); err != nil {
		o.Close()
		return nil, err
	}
	return o, nil
}

// mendProgs6 puts back each hook's IPv6 program where sl_progs_v6 no longer holds it (an
// entry deleted or replaced by hand, or by another agent): the hook's IPv4 program would pass
// every IPv6 packet on untouched. It returns how many were put back.
func (o *Objects) mendProgs6() (int, error) {
	n := 0
	var errs []error
	for i, p := range []*ebpf.Program{o.SlFromHost6, o.SlFromWep6, o.SlToWep6, o.SlToHost6} {
		if p == nil {
			continue
		}
		info, err := p.Info()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		want, _ := info.ID()
		var have uint32
		if err := o.SlProgsV6.Lookup(uint32(i), &have); err == nil && ebpf.ProgramID(have) == want {
			continue
		}
		if err := o.SlProgsV6.Put(uint32(i), p); err != nil {
			errs = append(errs, fmt.Errorf("putting back the IPv6 program %d in sl_progs_v6: %w", i, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// fillProgs6 puts each hook's IPv6 program in sl_progs_v6, where the hook's IPv4 program
// passes IPv6 packets on to it. A pinned array of an earlier agent's programs gets this one's
// at once: its IPv4 programs, still attached until the links are updated, then reach these.
func (o *Objects) fillProgs6() error {
	for i, p := range []*ebpf.Program{o.SlFromHost6, o.SlFromWep6, o.SlToWep6, o.SlToHost6} {
		if p == nil {
			continue // left out (load)
		}
		if err := o.SlProgsV6.Put(uint32(i), p); err != nil {
			return fmt.Errorf("putting the IPv6 program %d in sl_progs_v6: %w", i, err)
		}
	}
	return nil
}

// raiseMemlock lifts RLIMIT_MEMLOCK once, before the first map or program is made: before
// Linux 5.11 the kernel charges them to it (64 KiB by default, which not one of sluice's maps
// fits); from 5.11 it charges the memory cgroup and this does nothing. Raising it needs
// CAP_SYS_RESOURCE; without it a load fails saying what the kernel refused.
var raiseMemlock = sync.OnceFunc(func() { _ = rlimit.RemoveMemlock() })

// haveSyscallPrograms probes for syscall programs (Linux 5.14); a test stands in for an older kernel.
var haveSyscallPrograms = func() error { return features.HaveProgramType(ebpf.Syscall) }

// loadObjects loads spec into o; a program left out of spec (load) stays nil. Before Linux
// 5.14 the kernel has no syscall programs: the connection table's cleaners (sl_ct_clean,
// sl_ct_clean6) are left out, and Conntrack deletes from user space instead (its comment says
// what that costs).
func loadObjects(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions, o *Objects) error {
	if haveSyscallPrograms() != nil {
		delete(spec.Programs, "sl_ct_clean")
		delete(spec.Programs, "sl_ct_clean6")
	}
	if len(spec.Programs) == reflect.TypeOf(o.sluicePrograms).NumField() {
		return spec.LoadAndAssign(&o.sluiceObjects, opts)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, *opts)
	if err != nil {
		return err
	}
	defer coll.Close() // what was not taken below
	if err := coll.Assign(&o.sluiceMaps); err != nil {
		return err
	}
	progs := reflect.ValueOf(&o.sluicePrograms).Elem()
	for i := range progs.NumField() {
		if p := coll.DetachProgram(progs.Type().Field(i).Tag.Get("ebpf")); p != nil {
			progs.Field(i).Set(reflect.ValueOf(p))
		}
	}
	return nil
}

// resizePinned replaces a pinned map whose max entries differ from spec by a new map of the
// spec's size with the old one's entries, pinned at the same path. A map whose key or value
// size or type changed is a different layout: that must come with a new name (sluice.h), so
// it is an error here, naming the map.
func resizePinned(path string, spec *ebpf.MapSpec) (bool, error) {
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("opening pinned map %s: %w", path, err)
	}
	defer old.Close()
	if old.MaxEntries() == spec.MaxEntries {
		return false, nil
	}
	if old.Type() != spec.Type || old.KeySize() != spec.KeySize || old.ValueSize() != spec.ValueSize {
		return false, fmt.Errorf("pinned map %s has another layout (%v, key %d, value %d bytes; want %v, %d, %d): %w",
			path, old.Type(), old.KeySize(), old.ValueSize(), spec.Type, spec.KeySize, spec.ValueSize, ebpf.ErrMapIncompatible)
	}
	s := spec.Copy()
	s.Pinning = ebpf.PinNone
	nm, err := ebpf.NewMap(s)
	if err != nil {
		return false, fmt.Errorf("creating map %s with %d entries: %w", spec.Name, spec.MaxEntries, err)
	}
	defer nm.Close()
	if spec.Type != ebpf.PerCPUArray && spec.Type != ebpf.Array {
		key := make([]byte, old.KeySize())
		val := make([]byte, old.ValueSize())
		it := old.Iterate()
		for it.Next(&key, &val) {
			if err := nm.Put(key, val); err != nil {
				return false, fmt.Errorf("copying map %s into %d entries: %w", spec.Name, spec.MaxEntries, err)
			}
		}
		if err := it.Err(); err != nil {
			return false, fmt.Errorf("reading pinned map %s: %w", path, err)
		}
	}
	tmp := resizeTemp(path)
	_ = os.Remove(tmp)
	if err := nm.Pin(tmp); err != nil {
		return false, fmt.Errorf("pinning resized map %s: %w", spec.Name, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("replacing pinned map %s: %w", path, err)
	}
	return true, nil
}

// resizeTemp is where a resized map is pinned before it replaces the old pin. Not a dot:
// bpffs refuses names with one (EPERM, reserved by the kernel).
func resizeTemp(path string) string { return path + "_resizing" }

// BPFFSMagic is the file system type of bpffs.
const BPFFSMagic = 0xcafe4a11

// EnsureBPFFS makes dir a directory on bpffs. When it is not on one, bpffs is mounted as
// Felix and Cilium mount it on hosts that lack it: on /sys/fs/bpf when dir is under it (sysfs
// has no room for directories of ours), else on dir itself. It returns whether it mounted.
func EnsureBPFFS(dir string) (bool, error) {
	onBPF := func(p string) (bool, error) {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			return false, err
		}
		return uint32(st.Type) == BPFFSMagic, nil
	}
	existing := dir
	for {
		if _, err := os.Stat(existing); err == nil {
			break
		}
		parent := filepath.Dir(existing)
		if parent == existing {
			break
		}
		existing = parent
	}
	ok, err := onBPF(existing)
	if err != nil {
		return false, fmt.Errorf("checking pin directory %s: %w", dir, err)
	}
	mounted := false
	if !ok {
		target := dir
		if rel, err := filepath.Rel("/sys/fs/bpf", dir); err == nil && !strings.HasPrefix(rel, "..") {
			target = "/sys/fs/bpf"
		}
		if err := os.MkdirAll(target, 0o700); err != nil {
			return false, fmt.Errorf("creating pin directory %s: %w", target, err)
		}
		if err := unix.Mount("bpf", target, "bpf", 0, "mode=0700"); err != nil {
			return false, fmt.Errorf("mounting bpffs on %s for pin directory %s: %w", target, dir, err)
		}
		mounted = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return mounted, fmt.Errorf("creating pin directory %s: %w", dir, err)
	}
	return mounted, nil
}
