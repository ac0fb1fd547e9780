package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
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
		for _, l := range wrap(desc, helpWidth-len(flagIndent)) {
			fmt.Fprintln(w, lead+l)
			lead = flagIndent
		}
	}
}

// wrap breaks text into lines of at most width runes at spaces, as sluiced's help does, but
// not inside a synopsis's [...] (a longer word or group stands alone).
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range words(text) {
		if line != "" && utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// words splits text at spaces, keeping a bracketed group ("[--from-log FILE]") whole.
func words(text string) []string {
	var out []string
	depth := 0
	for _, f := range strings.Fields(text) {
		if depth > 0 {
			out[len(out)-1] += " " + f
		} else {
			out = append(out, f)
		}
		depth += strings.Count(f, "[") - strings.Count(f, "]")
		depth = max(depth, 0)
	}
	return out
}
