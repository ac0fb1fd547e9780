package tracker

import (
	"fmt"
	"slices"
	"testing"
)

// TestSightings: each thing is reported once when it appears and once when it goes; one judged
// otherwise goes and appears again; one the caller removed is reported as found (removed),
// and as gone if it was seen before, and is not kept.
func TestSightings(t *testing.T) {
	type thing struct {
		name, effect string
		removed      bool
	}
	var s Sightings[thing]
	var got []string
	pass := func(found ...thing) []string {
		got = nil
		s.Pass(found, func(x thing) string { return x.name }, func(x thing) string { return x.effect },
			func(x thing) bool { return x.removed }, func(x thing, gone bool) {
				got = append(got, fmt.Sprintf("%s %s removed=%v gone=%v", x.name, x.effect, x.removed, gone))
			})
		return got
	}
	for _, c := range []struct {
		found []thing
		want  []string
	}{
		{[]thing{{"a", "breaking", false}, {"b", "dormant", false}}, []string{"a breaking removed=false gone=false", "b dormant removed=false gone=false"}},
		{[]thing{{"a", "breaking", false}, {"b", "dormant", false}}, nil},
		{[]thing{{"a", "dormant", false}, {"b", "dormant", false}}, []string{"a breaking removed=false gone=true", "a dormant removed=false gone=false"}},
		{[]thing{{"b", "dormant", false}}, []string{"a dormant removed=false gone=true"}},
		{[]thing{{"b", "dormant", true}}, []string{"b dormant removed=true gone=false", "b dormant removed=false gone=true"}},
		{[]thing{{"c", "breaking", true}}, []string{"c breaking removed=true gone=false"}},
		{nil, nil},
	} {
		if r := pass(c.found...); !slices.Equal(r, c.want) {
			t.Errorf("after %v: reported %q, want %q", c.found, r, c.want)
		}
	}
}
