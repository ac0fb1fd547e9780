// Package buildinfo says which build a binary is: the module version, the commit it was built
// from (and whether the tree had changes), and the Go version, as the Go toolchain records them.
package buildinfo

import (
	"debug/elf"
	"fmt"
	"os"
	"runtime/debug"
)

// Info is what the toolchain recorded of a build.
type Info struct {
	Version, Revision, GoVersion string
	Modified                     bool
}

// Read returns this binary's build information ("unknown" where the toolchain recorded none,
// as in a test binary).
func Read() Info {
	i := Info{Version: "unknown", Revision: "unknown", GoVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return i
	}
	i.GoVersion = bi.GoVersion
	if v := bi.Main.Version; v != "" {
		i.Version = v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Revision = s.Value
		case "vcs.modified":
			i.Modified = s.Value == "true"
		}
	}
	return i
}

// String is the one line `NAME version` prints.
func (i Info) String() string {
	rev := i.Revision
	if i.Modified {
		rev += " (with uncommitted changes)"
	}
	return fmt.Sprintf("version %s, commit %s, %s", i.Version, rev, i.GoVersion)
}

// ID returns the Go build ID of the running executable (what `go tool buildid` prints): it
// differs between any two builds that differ in code, dependencies or toolchain, even with
// no version control information, as in tests. Read from the executable's ELF note.
func ID() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding this executable: %w", err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", exe, err)
	}
	defer f.Close()
	sec := f.Section(".note.go.buildid")
	if sec == nil {
		return "", fmt.Errorf("%s has no Go build ID note", exe)
	}
	note, err := sec.Data()
	if err != nil {
		return "", fmt.Errorf("reading %s's build ID note: %w", exe, err)
	}
	// An ELF note: name size, description size, type (4 for Go's build ID), the name "Go\0"
	// padded to four bytes, then the ID.
	if len(note) < 16 {
		return "", fmt.Errorf("%s's build ID note is %d bytes", exe, len(note))
	}
	nameSize, descSize := f.ByteOrder.Uint32(note[0:4]), f.ByteOrder.Uint32(note[4:8])
	start := 12 + (uint64(nameSize)+3)&^3
	if f.ByteOrder.Uint32(note[8:12]) != 4 || string(note[12:14]) != "Go" || start+uint64(descSize) > uint64(len(note)) || descSize == 0 {
		return "", fmt.Errorf("%s's build ID note is not Go's", exe)
	}
	return string(note[start : start+uint64(descSize)]), nil
}
