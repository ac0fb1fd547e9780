package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
)

// helpWidth is the widest line sluicectl's help prints, as sluiced --help keeps to.
const helpWidth = 80

// flagIndent is where flag.PrintDefaults puts a flag's description ("    \t", column 8),
// written as spaces so that the width does not depend on the terminal's tab stops.
const flagIndent = "        "

// printFlags writes what fs.PrintDefaults writes, each description wrapped at spaces to
// helpWidth columns under flagIndent. PrintDefaults itself writes the text (the type names,
// the defaults it leaves out), so only the layout differs.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	out := fs.Output()
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(out)
	for line := range strings.Lines(b.String()) {
		line = strings.TrimSuffix(line, "\n")
		lead := flagIndent // what goes before the description's first line
		desc, ok := strings.CutPrefix(line, "    \t")
		if !ok {
			// A flag's line. A short one ("  -f") has its description after a tab.
			var name string
			if name, desc, ok = strings.Cut(line, "\t"); !ok {
				fmt.Fprintln(w, line)
				continue
			}
			lead = name + strings.Repeat(" ", max(len(flagIndent)-len(name), 1))
		}
		for _, l := range agentconfig.Wrap(desc, helpWidth-len(flagIndent)) {
			fmt.Fprintln(w, lead+l)
			lead = flagIndent
		}
	}
}
