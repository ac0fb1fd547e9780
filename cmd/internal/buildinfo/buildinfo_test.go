package buildinfo

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestIDMatchesGoTool: the build ID read from the running test binary is the one the Go
// toolchain reports for it.
func TestIDMatchesGoTool(t *testing.T) {
	id, err := ID()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "tool", "buildid", exe).Output()
	if err != nil {
		t.Fatalf("go tool buildid %s: %v", exe, err)
	}
	if want := strings.TrimSpace(string(out)); id != want {
		t.Fatalf("ID() = %q, go tool buildid says %q", id, want)
	}
}
