package agent_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/cmd/internal/agent"
)

// TestKeptLearned: the routes BGP had learned come back from the kept state, for this build
// and configuration only, whether or not etcd still matches the rest.
func TestKeptLearned(t *testing.T) {
	path := filepath.Join(t.TempDir(), "desired-state")
	cfg := calc.DefaultConfig("node-a")
	cfg.BGP = true
	st := &calc.State{Routes: []calc.Route{
		{Dst: netip.MustParsePrefix("10.80.0.0/26"), Type: calc.RouteBlackhole, Reason: calc.ReasonLocalBlock},
		{Dst: netip.MustParsePrefix("10.80.0.64/26"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: netip.MustParseAddr("192.0.2.12"), OnLink: true, Reason: calc.ReasonBGP},
		{Dst: netip.MustParsePrefix("198.18.0.0/24"), Type: calc.RouteUnicast, Device: calc.ParentDevice, Gateway: netip.MustParseAddr("192.0.2.1"),
			Multipath: []netip.Addr{netip.MustParseAddr("192.0.2.2")}, OnLink: true, Reason: calc.ReasonBGP},
	}}
	if _, err := agent.SaveState(path, "build-1", cfg, nil, st); err != nil {
		t.Fatal(err)
	}
	got, err := agent.KeptLearned(path, "build-1", cfg)
	want := []calc.Learned{{Prefix: netip.MustParsePrefix("10.80.0.64/26"), NextHops: []netip.Addr{netip.MustParseAddr("192.0.2.12")}},
		{Prefix: netip.MustParsePrefix("198.18.0.0/24"), NextHops: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("kept learned %v %v, want %v", got, err, want)
	}
	if got, err := agent.KeptLearned(path, "build-2", cfg); err != nil || got != nil {
		t.Fatalf("another build's file: %v %v", got, err)
	}
	other := cfg
	other.BGP = false
	if got, err := agent.KeptLearned(path, "build-1", other); err != nil || got != nil {
		t.Fatalf("another configuration's file: %v %v", got, err)
	}
	if got, err := agent.KeptLearned(filepath.Join(t.TempDir(), "none"), "build-1", cfg); err != nil || got != nil {
		t.Fatalf("no file: %v %v", got, err)
	}
	raw, _ := os.ReadFile(path)
	if err := os.WriteFile(path, append(raw, 'x'), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.KeptLearned(path, "build-1", cfg); err == nil {
		t.Fatal("a damaged file was read")
	}
}
