package bpf

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/sluice-net/sluice/internal/nstest"
)

// TestProgramsPassVerifier loads every program of the committed object into this kernel.
func TestProgramsPassVerifier(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (2 s): make test runs it")
	}
	nstest.NeedRoot(t, "loading eBPF programs")
	o, err := Load("", MapSizes{Conntrack: 1024, Backends: 1024, Frontends: 1024, Affinity: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	progs := map[string]*ebpf.Program{"sl_from_host": o.SlFromHost, "sl_from_wep": o.SlFromWep,
		"sl_to_wep": o.SlToWep, "sl_to_host": o.SlToHost, "sl_ct_clean": o.SlCtClean, "sl_sock_connect4": o.SlSockConnect4,
		"sl_sock_sendmsg4": o.SlSockSendmsg4, "sl_sock_recvmsg4": o.SlSockRecvmsg4}
	if err := haveSyscallPrograms(); err != nil {
		// Before 5.14: the cleaner is left out (user space cleans); it must not be there.
		if o.SlCtClean != nil {
			t.Error("sl_ct_clean loaded on a kernel without syscall programs")
		}
		delete(progs, "sl_ct_clean")
	}
	for name, p := range progs {
		if p == nil || p.FD() <= 0 {
			t.Errorf("%s: no program", name)
		}
	}
}

// TestStackChains: Linux 5.10's verifier adds up the stack frames of a call chain, each
// rounded up to 32 bytes, over the program's whole call graph (not the paths taken) and
// refuses a program whose deepest chain passes 512 bytes; newer kernels count only the paths
// taken, so this kernel's load does not show it. Taken from the object: a function's frame is
// its deepest r10 offset, its callees the bpf-to-bpf calls it makes.
func TestStackChains(t *testing.T) {
	spec, err := loadSluice()
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range spec.Programs {
		frames := map[string]int{}     // function -> frame size
		calls := map[string][]string{} // function -> functions it calls
		fn := name
		for i, ins := range p.Instructions {
			if sym := ins.Symbol(); sym != "" {
				fn = sym
			}
			if ins.IsFunctionCall() && ins.Reference() != "" {
				calls[fn] = append(calls[fn], ins.Reference())
			}
			depth := 0
			switch {
			case ins.OpCode.Class().IsLoad() && ins.Src == asm.R10 && ins.Offset < 0:
				depth = -int(ins.Offset)
			case ins.OpCode.Class().IsStore() && ins.Dst == asm.R10 && ins.Offset < 0:
				depth = -int(ins.Offset)
			case ins.OpCode.ALUOp() == asm.Mov && ins.OpCode.Source() == asm.RegSource && ins.Src == asm.R10 &&
				i+1 < len(p.Instructions):
				// rX = r10; rX += -N: a pointer to a stack slot.
				if next := p.Instructions[i+1]; next.OpCode.ALUOp() == asm.Add && next.Dst == ins.Dst && next.Constant < 0 {
					depth = -int(next.Constant)
				}
			}
			frames[fn] = max(frames[fn], depth)
		}
		var deepest func(fn string, seen map[string]bool) (int, []string)
		deepest = func(fn string, seen map[string]bool) (int, []string) {
			if seen[fn] {
				return 0, nil
			}
			seen[fn] = true
			defer delete(seen, fn)
			best, path := 0, []string(nil)
			for _, c := range calls[fn] {
				if d, p := deepest(c, seen); d > best {
					best, path = d, p
				}
			}
			own := (frames[fn] + 31) / 32 * 32
			return own + best, append([]string{fmt.Sprintf("%s(%d)", fn, own)}, path...)
		}
		if d, path := deepest(name, map[string]bool{}); d > 512 {
			t.Errorf("%s: a call chain of %d bytes, over the 512 Linux 5.10 allows: %s", name, d, strings.Join(path, " -> "))
		} else {
			t.Logf("%s: %d bytes: %s", name, d, strings.Join(path, " -> "))
		}
	}
}
