package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// Feature is one thing the service stage asks of the kernel: whether this kernel has it (Err
// nil), since which Linux, and what goes without it.
type Feature struct {
	Name    string
	Since   string
	Without string
	Err     error
}

// Found says whether the kernel has it.
func (f Feature) Found() bool { return f.Err == nil }

// ProbeFeatures asks the running kernel, through cilium/ebpf's probes (each loads a tiny
// program or map, or makes a syscall that fails in a known way), for what the service stage
// uses. The stage itself needs every feature but the first (TCX, for which classic tc stands
// in); what it lacks keeps the stage from starting, and the agent says which.
func ProbeFeatures() []Feature {
	raiseMemlock()
	helper := func(pt ebpf.ProgramType, fn asm.BuiltinFunc) error {
		err := features.HaveProgramHelper(pt, fn)
		if errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("%v has no %v", pt, fn)
		}
		return err
	}
	return []Feature{
		{Name: "tcx", Since: "6.6", Without: "programs attached as classic tc filters (bpf-attach auto picks tc)", Err: HaveTCX()},
		{Name: "tc-programs", Since: "4.1", Without: "no service stage", Err: features.HaveProgramType(ebpf.SchedCLS)},
		{Name: "bounded-loops", Since: "5.3", Without: "no service stage", Err: features.HaveBoundedLoops()},
		{Name: "lru-hash-maps", Since: "4.10", Without: "no service stage", Err: features.HaveMapType(ebpf.LRUHash)},
		{Name: "lpm-trie-maps", Since: "4.11", Without: "no service stage", Err: features.HaveMapType(ebpf.LPMTrie)},
		{Name: "fib-lookup", Since: "4.18", Without: "no service stage", Err: helper(ebpf.SchedCLS, asm.FnFibLookup)},
		{Name: "redirect-neigh", Since: "5.10", Without: "no service stage", Err: helper(ebpf.SchedCLS, asm.FnRedirectNeigh)},
		{Name: "syscall-programs", Since: "5.14", Without: "the connection table is cleaned from user space (a flow refreshed in the microseconds between its read and its delete is lost)", Err: haveSyscallPrograms()},
		{Name: "socket-hooks", Since: "4.17", Without: "no service stage", Err: features.HaveProgramType(ebpf.CGroupSockAddr)},
		{Name: "netns-cookie", Since: "5.7", Without: "no service stage", Err: helper(ebpf.CGroupSockAddr, asm.FnGetNetnsCookie)},
		{Name: "netns-cookie-sockopt", Since: "5.14", Without: "the node's own connections to services are not handled (the agent cannot name its namespace to the socket programs); /readyz says so until cgroup-path is none", Err: netnsCookieErr()},
	}
}

// KernelRelease is the running kernel's release (uname -r).
func KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

func netnsCookieErr() error {
	_, err := NetnsCookie()
	return err
}
