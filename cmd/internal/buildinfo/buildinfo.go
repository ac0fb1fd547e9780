// Package buildinfo says which build a binary is: the module version, the commit it was built
// from (and whether the tree had changes), and the Go version, as the Go toolchain records them.
package buildinfo

import (
	"fmt"
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
