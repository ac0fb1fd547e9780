package store

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits on how much of an input an error quotes: any etcd writer can store megabytes under
// a key, and an error that quotes it whole fills the node's journal (issue #10).
const (
	// MaxQuoted bounds one quoted value inside a message.
	MaxQuoted = 128
	// MaxMessage bounds a whole message built from input (a reason, a key, a log field).
	MaxMessage = 512
)

// Clip returns s when it is at most max bytes, else its first bytes (cut on a character
// boundary) followed by how much was cut: "…[5243021 of 5243149 bytes cut]".
func Clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…[%d of %d bytes cut]", s[:cut], len(s)-cut, len(s))
}

// clipped formats a long string argument of an error message: %q quotes its first
// MaxQuoted bytes and says how long the whole was.
type clipped string

func (c clipped) Format(f fmt.State, verb rune) {
	s := string(c)
	if len(s) <= MaxQuoted {
		fmt.Fprintf(f, fmt.FormatString(f, verb), s)
		return
	}
	cut := MaxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	fmt.Fprintf(f, fmt.FormatString(f, verb), s[:cut])
	fmt.Fprintf(f, "…[%d of %d bytes cut]", len(s)-cut, len(s))
}

// clipArgs wraps every string argument of a message built from input in clipped.
func clipArgs(args []any) []any {
	for i, a := range args {
		if s, ok := a.(string); ok && len(s) > MaxQuoted {
			args[i] = clipped(s)
		}
	}
	return args
}

// newBadValue builds the error for key's value with every part bounded.
func newBadValue(key, field, reason string) *BadValueError {
	return &BadValueError{Key: Clip(key, MaxMessage), Field: Clip(field, MaxQuoted), Reason: Clip(reason, MaxMessage)}
}

// ClipLines clips each line of s to max bytes: for messages that join several errors.
func ClipLines(s string, max int) string {
	if len(s) <= max {
		return s
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Clip(l, max)
	}
	return strings.Join(lines, "\n")
}
