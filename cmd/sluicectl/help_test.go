package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// columns is how wide line shows on a terminal: one column a rune, a tab to the next multiple
// of eight.
func columns(line string) int {
	n := 0
	for _, r := range line {
		if r == '\t' {
			n += 8 - n%8
			continue
		}
		n++
	}
	return n
}

// checkWidth fails t when a line of out is wider than helpWidth columns, naming the widest.
func checkWidth(t *testing.T, args []string, out string) {
	t.Helper()
	wide, widest, width := 0, "", 0
	for line := range strings.Lines(out) {
		line = strings.TrimSuffix(line, "\n")
		if n := columns(line); n > helpWidth {
			wide++
			if n > width {
				widest, width = line, n
			}
		}
	}
	if wide > 0 {
		t.Errorf("%s: %d lines wider than %d columns; the widest, %d columns (%d runes):\n%s",
			strings.Join(append([]string{"sluicectl"}, args...), " "), wide, helpWidth, width, utf8.RuneCountInString(widest), widest)
	}
}

// helpArgs are the arguments of every help sluicectl prints: the top level's, each command's
// (from the commands table) and each ipam subcommand's.
func helpArgs() [][]string {
	all := [][]string{{"--help"}, {"-h"}, {"help"}, {}}
	for name := range commands {
		all = append(all, []string{name, "--help"})
	}
	for _, sub := range ipamSubcommands {
		all = append(all, []string{"ipam", sub, "--help"})
	}
	slices.SortFunc(all, func(a, b []string) int { return slices.Compare(a, b) })
	return all
}

// flagLine is a flag's line in a help: its name, as flag.PrintDefaults writes it.
var flagLine = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)

// TestHelpFitsEightyColumns: the top level's help and every command's and ipam subcommand's
// keep to 80 columns, as sluiced --help does.
func TestHelpFitsEightyColumns(t *testing.T) {
	c := &cluster{t: t, env: map[string]string{}} // help never asks etcd
	for _, args := range helpArgs() {
		r := c.ctl("", args...)
		out := r.stdout + r.stderr
		if strings.TrimSpace(out) == "" {
			t.Errorf("sluicectl %s: exit %d and nothing printed", strings.Join(args, " "), r.code)
		}
		checkWidth(t, args, out)
	}
}

// TestMistypedFlagFitsEightyColumns: every flag a help lists, misspelt with a letter more
// (the longest mistake of the longest name), is an error line naming it; that line and the
// usage printed with it keep to 80 columns.
func TestMistypedFlagFitsEightyColumns(t *testing.T) {
	c := &cluster{t: t, env: map[string]string{}} // the flags are parsed before etcd is asked
	runs := 0
	for _, help := range helpArgs() {
		if len(help) == 0 || help[len(help)-1] != "--help" {
			continue
		}
		r := c.ctl("", help...)
		cmd := help[:len(help)-1]
		for _, m := range flagLine.FindAllStringSubmatch(r.stdout+r.stderr, -1) {
			bad := m[1] + "x"
			args := append(slices.Clone(cmd), "--"+bad, "x")
			r := c.ctl("", args...)
			if r.code == 0 || !strings.Contains(r.stderr, "flag provided but not defined: -"+bad+"\n") {
				t.Errorf("sluicectl %s: exit %d, stderr %q; want an error naming -%s", strings.Join(args, " "), r.code, r.stderr, bad)
			}
			checkWidth(t, args, r.stderr)
			runs++
		}
	}
	if runs < len(commands) {
		t.Fatalf("%d mistyped flags tried; the helps list too few flags", runs)
	}
}
