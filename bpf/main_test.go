package bpf

import (
	"os"
	"testing"
)

// TestMain runs a test's helper process when asked to (SLUICE_HELPER_DIAL), and otherwise
// lifts RLIMIT_MEMLOCK before any test makes a map or program of its own (kernels before 5.11
// charge them to it; the kernel matrix boots 5.10), then runs the tests.
func TestMain(m *testing.M) {
	if addr := os.Getenv("SLUICE_HELPER_DIAL"); addr != "" {
		os.Exit(helperDial(addr)) // a helper process of TestCgroupLeftovers
	}
	raiseMemlock()
	os.Exit(m.Run())
}
