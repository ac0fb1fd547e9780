package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/store"
)

func TestClip(t *testing.T) {
	if got := store.Clip("short", 10); got != "short" {
		t.Errorf("Clip of a short string: %q", got)
	}
	long := strings.Repeat("a", 1000)
	if got := store.Clip(long, 100); got != strings.Repeat("a", 100)+"…[900 of 1000 bytes cut]" {
		t.Errorf("Clip: %q", got)
	}
	// Cut on a character boundary: "é" is two bytes.
	s := strings.Repeat("é", 100)
	got := store.Clip(s, 101)
	if !strings.HasPrefix(got, strings.Repeat("é", 50)+"…[100 of 200 bytes cut]") {
		t.Errorf("Clip across a character: %q", got)
	}
	joined := errors.Join(errors.New(long), errors.New("second")).Error()
	if got := store.ClipLines(joined, 100); got != strings.Repeat("a", 100)+"…[900 of 1000 bytes cut]\nsecond" {
		t.Errorf("ClipLines: %q", got)
	}
}

// TestDecodeBoundsQuotes: a value of megabytes with a bad field gives an error of a few
// hundred bytes that still names the key, the field and what is wrong (issue #10: a 5 MB
// workload endpoint made a 5 MB log line).
func TestDecodeBoundsQuotes(t *testing.T) {
	huge := strings.Repeat("1", 5<<20)
	key := store.WorkloadEndpointPrefix + "ns/w"
	_, err := store.Decode(key, []byte(`{"spec":{"node":"n","interfaceName":"cali1","ipNetworks":["10.0.0.0/8","`+huge+`"]}}`))
	var bv *store.BadValueError
	if !errors.As(err, &bv) {
		t.Fatalf("Decode: %v; want a BadValueError", err)
	}
	msg := bv.Error()
	if len(msg) > 1024 {
		t.Fatalf("the error is %d bytes long", len(msg))
	}
	for _, want := range []string{key, "spec.ipNetworks[1]", "is not a CIDR", "bytes cut]"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	// A key of megabytes is bounded too.
	_, err = store.Decode(store.WorkloadEndpointPrefix+huge, []byte(`{}`))
	if err == nil || len(err.Error()) > 2048 {
		t.Fatalf("Decode under a huge key: %d bytes of error", len(err.Error()))
	}
	// Short values are quoted whole, as before.
	_, err = store.Decode(key, []byte(`{"spec":{"node":"n","interfaceName":"cali1","ipNetworks":["10.0.0.300/32"]}}`))
	if err == nil || !strings.Contains(err.Error(), `"10.0.0.300/32" is not a CIDR`) {
		t.Errorf("a short bad value: %v", err)
	}
}
