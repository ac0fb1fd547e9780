package bpf

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

// TestProgramsPassVerifier loads every program of the committed object into this kernel.
func TestProgramsPassVerifier(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading eBPF programs needs root")
	}
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
