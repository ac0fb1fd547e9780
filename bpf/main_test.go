package bpf

import (
	"os"
	"testing"
)

// TestMain lifts RLIMIT_MEMLOCK before any test makes a map or program of its own (kernels
// before 5.11 charge them to it; the kernel matrix boots 5.10).
func TestMain(m *testing.M) {
	raiseMemlock()
	os.Exit(m.Run())
}
