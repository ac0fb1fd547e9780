package calc_test

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/calc"
)

// TestRouteEnumsReadAsNames: a route's type and reason are bytes in memory but names in JSON
// and text, both ways, and an unknown name is an error naming it.
func TestRouteEnumsReadAsNames(t *testing.T) {
	r := calc.Route{Dst: netip.MustParsePrefix("10.65.0.0/26"), Type: calc.RouteUnreachable, Metric: 1024, Reason: calc.ReasonLocalBlock}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"type":"unreachable"`) || !strings.Contains(string(b), `"reason":"local-block"`) {
		t.Fatalf("route JSON %s; want type and reason by name", b)
	}
	var back calc.Route
	if err := json.Unmarshal(b, &back); err != nil || back != r {
		t.Fatalf("round trip: %+v, %v; want %+v", back, err, r)
	}
	if got := r.String(); got != "unreachable 10.65.0.0/26 metric 1024" {
		t.Fatalf("String() = %q", got)
	}
	err = json.Unmarshal([]byte(`{"type":"wormhole"}`), &back)
	if err == nil || !strings.Contains(err.Error(), `"wormhole"`) || !strings.Contains(err.Error(), "blackhole") {
		t.Fatalf("unknown type: %v; want an error naming it and the choices", err)
	}
	for _, ty := range []calc.RouteType{calc.RouteUnicast, calc.RouteBlackhole, calc.RouteUnreachable, calc.RouteProhibit} {
		if p, err := calc.ParseRouteType(ty.String()); err != nil || p != ty {
			t.Fatalf("ParseRouteType(%q) = %v, %v", ty, p, err)
		}
	}
}
