package agentconfig_test

import (
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
)

// TestMistypedFlagFitsEightyColumns: a mistyped flag is one error line naming it and pointing
// to sluiced --help, within 80 columns as sluiced prints it, for a flag of up to 18
// characters (conntrack-tcp-syns: the flag package's own text leaves no room for longer).
func TestMistypedFlagFitsEightyColumns(t *testing.T) {
	for _, bad := range []string{"bogus", "nod", "etcd-endpoint", "conntrack-tcp-syns"} {
		_, err := agentconfig.Parse([]string{"--" + bad}, func(string) string { return "" }, io.Discard)
		if err == nil {
			t.Fatalf("--%s: no error", bad)
		}
		line := "sluiced: " + err.Error() // as cmd/sluiced's main prints it
		if !strings.Contains(line, "not defined: -"+bad+" ") || !strings.Contains(line, "sluiced --help") || strings.Contains(line, "\n") {
			t.Errorf("--%s: %q; want one line naming -%s and pointing to sluiced --help", bad, line, bad)
		}
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("--%s: %d columns, want at most 80: %s", bad, n, line)
		}
	}
}
