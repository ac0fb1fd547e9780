package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// SocketHooks keeps the socket programs (connect, sendmsg, recvmsg and getpeername of both
// families) attached to a cgroup
// v2 directory, normally the root: the node's own connections to services are pointed at a
// backend when the socket connects, so the host reaches cluster IPs with no per-packet
// translation. The programs act only on sockets of the agent's network namespace (its
// cookie is in the settings map), so agents of several namespaces can share one cgroup tree
// (the lab). Ownership rule as for interface hooks: links pinned under <pin dir>/links as
// cgroup_<hook>.
type SocketHooks struct {
	dir    string
	cgroup string
	hooks  []socketHook
	links  map[string]link.Link
	ours   map[ebpf.ProgramID]bool
	// Repairs counts links found detached, stale or unpinned and attached again.
	Repairs int
	// CleanConflicts removes other software's programs that break the hooks and whose owner
	// is recognisable (Conflict.Removable).
	CleanConflicts bool
}

// socketHookTypes are the cgroup hooks the socket programs attach to, by bpftool's names.
var socketHookTypes = []struct {
	name   string
	attach ebpf.AttachType
}{
	{"connect4", ebpf.AttachCGroupInet4Connect}, {"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg}, {"getpeername4", ebpf.AttachCgroupInet4GetPeername},
	{"connect6", ebpf.AttachCGroupInet6Connect}, {"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg}, {"getpeername6", ebpf.AttachCgroupInet6GetPeername},
}

type socketHook struct {
	name   string
	attach ebpf.AttachType
	prog   *ebpf.Program
}

// NewSocketHooks returns the hooks for objs on the cgroup directory cgroupPath.
func NewSocketHooks(pinDir, cgroupPath string, objs *Objects) (*SocketHooks, error) {
	h := &SocketHooks{dir: filepath.Join(pinDir, "links"), cgroup: cgroupPath, links: map[string]link.Link{},
		ours: map[ebpf.ProgramID]bool{}}
	progs := []*ebpf.Program{objs.SlSockConnect4, objs.SlSockSendmsg4, objs.SlSockRecvmsg4, objs.SlSockGetpeername4,
		objs.SlSockConnect6, objs.SlSockSendmsg6, objs.SlSockRecvmsg6, objs.SlSockGetpeername6}
	for i, t := range socketHookTypes {
		h.hooks = append(h.hooks, socketHook{t.name, t.attach, progs[i]})
	}
	for _, hk := range h.hooks {
		info, err := hk.prog.Info()
		if err != nil {
			return nil, fmt.Errorf("reading program info: %w", err)
		}
		if id, ok := info.ID(); ok {
			h.ours[id] = true
		}
	}
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating link pin directory: %w", err)
	}
	return h, nil
}

// Sync attaches every socket program that is not attached, swapping in this agent's
// programs where a previous run's links are found. It returns the other programs found on
// the hooks (removed first, when CleanConflicts allows, so sluice's attach in the same
// Sync); a hook another program holds alone is named in the error.
func (h *SocketHooks) Sync() ([]Conflict, error) {
	var errs []error
	conflicts, holders := h.conflicts()
	for _, hk := range h.hooks {
		l, repaired, err := holdLink(filepath.Join(h.dir, "cgroup_"+hk.name), h.links[hk.name], func(info *link.Info) bool {
			return info.Cgroup() != nil && info.Cgroup().CgroupId != 0
		}, h.ours, hk.prog, func() (link.Link, error) {
			return link.AttachCgroup(link.CgroupOptions{Path: h.cgroup, Attach: hk.attach, Program: hk.prog})
		})
		h.Repairs += repaired
		if l != nil {
			h.links[hk.name] = l
		} else {
			delete(h.links, hk.name)
		}
		if err != nil {
			if held := holders[hk.name]; held != "" && errors.Is(err, unix.EPERM) {
				err = fmt.Errorf("%w: %s holds the hook alone (attached without BPF_F_ALLOW_MULTI); sluice's program cannot attach beside it", err, held)
			}
			errs = append(errs, fmt.Errorf("%s on cgroup %s: %w", hk.name, h.cgroup, err))
		}
	}
	return conflicts, errors.Join(errs...)
}

// conflicts lists the other programs on each hook, removing the removable ones when
// CleanConflicts allows; holders names, by hook, the programs still holding one alone.
func (h *SocketHooks) conflicts() (out []Conflict, holders map[string]string) {
	cg, err := os.Open(h.cgroup)
	if err != nil {
		return nil, nil
	}
	defer cg.Close()
	holders = map[string]string{}
	names := programNames()
	for _, hk := range h.hooks {
		flags, ids, err := cgroupQuery(int(cg.Fd()), hk.attach)
		if err != nil {
			continue
		}
		for _, c := range cgroupConflicts(h.cgroup, hk.name, hk.attach, flags, ids, func(id ebpf.ProgramID) bool { return h.ours[id] }, names) {
			if h.CleanConflicts && c.Removable() {
				c.Err = c.remove()
				c.Removed = c.Err == nil
			}
			if !c.Removed && flags&unix.BPF_F_ALLOW_MULTI == 0 {
				fix := c.Fix
				if c.Removable() {
					fix += ", or run with --clean-conflicts"
				}
				holders[hk.name] = fmt.Sprintf("program %d %s (%s; remove it: %s)", c.progID, names(c.progID), ownerOr(c.Owner), fix)
			}
			out = append(out, c)
		}
	}
	return out, holders
}

func ownerOr(o string) string {
	if o == "" {
		return "owner unknown"
	}
	return o + "'s"
}

// Close releases the handles; the pins keep the programs attached.
func (h *SocketHooks) Close() {
	for _, l := range h.links {
		_ = l.Close()
	}
	h.links = map[string]link.Link{}
}

// DefaultCgroupMount is where sluice mounts a cgroup2 hierarchy of its own on a host that has
// none mounted (cgroup v1 hosts), as Calico mounts /run/calico/cgroup and Cilium
// /run/cilium/cgroupv2.
const DefaultCgroupMount = "/run/sluice/cgroup"

// ErrNoCgroup2: no cgroup v2 hierarchy is mounted.
var ErrNoCgroup2 = errors.New("no cgroup v2 hierarchy is mounted (the node's own connections to services need one; option cgroup-path)")

// CgroupV2Root returns where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup on unified
// hosts, /sys/fs/cgroup/unified on hybrid ones, or sluice's own).
func CgroupV2Root() (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1], nil
		}
	}
	return "", ErrNoCgroup2
}

// EnsureCgroup2 returns where the cgroup v2 hierarchy is mounted, mounting it at mountAt when
// none is; it says whether it mounted. Every process is in the hierarchy's root cgroup
// unless moved, also on cgroup v1 hosts, so socket programs attached there see every socket.
func EnsureCgroup2(mountAt string) (string, bool, error) {
	p, err := CgroupV2Root()
	if err == nil {
		return p, false, nil
	}
	if !errors.Is(err, ErrNoCgroup2) {
		return "", false, err
	}
	if err := os.MkdirAll(mountAt, 0o755); err != nil {
		return "", false, fmt.Errorf("no cgroup v2 hierarchy is mounted, and creating %s for one failed: %w", mountAt, err)
	}
	if err := unix.Mount("cgroup2", mountAt, "cgroup2", 0, ""); err != nil {
		return "", false, fmt.Errorf("no cgroup v2 hierarchy is mounted, and mounting one on %s failed: %w", mountAt, err)
	}
	return mountAt, true, nil
}

// netnsCookie is NetnsCookie, or a test's stand-in for a kernel without SO_NETNS_COOKIE.
var netnsCookie = NetnsCookie

// NetnsCookie returns the cookie of the calling thread's network namespace.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return 0, fmt.Errorf("opening a socket: %w", err)
	}
	defer unix.Close(fd)
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("reading the network namespace cookie: %w", err)
	}
	return v, nil
}
