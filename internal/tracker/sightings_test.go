package tracker

import (
	"fmt"
	"slices"
	"testing"
)

// TestSightings: each thing is reported once when it appears and once when it goes; one judged
// otherwise goes and appears again; a thing left out of a pass (removed) is reported gone.
func TestSightings(t *testing.T) {
	type thing struct{ name, effect string }
	var s Sightings[thing]
	var got []string
	pass := func(found ...thing) []string {
		got = nil
		s.Pass(found, func(x thing) string { return x.name }, func(x thing) string { return x.effect }, func(x thing, gone bool) {
			got = append(got, fmt.Sprintf("%s %s gone=%v", x.name, x.effect, gone))
		})
		return got
	}
	for _, c := range []struct {
		found []thing
		want  []string
	}{
		{[]thing{{"a", "breaking"}, {"b", "dormant"}}, []string{"a breaking gone=false", "b dormant gone=false"}},
		{[]thing{{"a", "breaking"}, {"b", "dormant"}}, nil},
		{[]thing{{"a", "dormant"}, {"b", "dormant"}}, []string{"a breaking gone=true", "a dormant gone=false"}},
		{[]thing{{"b", "dormant"}}, []string{"a dormant gone=true"}},
		{nil, []string{"b dormant gone=true"}},
		{nil, nil},
	} {
		if r := pass(c.found...); !slices.Equal(r, c.want) {
			t.Errorf("after %v: reported %q, want %q", c.found, r, c.want)
		}
	}
}
