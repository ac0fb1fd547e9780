package dataplane

import (
	"maps"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/sluice-net/sluice/calc"
)

// fakeSysctls is /proc/sys as a map: a path absent is an interface not there.
type fakeSysctls struct {
	values map[string]string
	writes int
}

func (f *fakeSysctls) write(path, value string) error {
	if _, ok := f.values[path]; !ok {
		return os.ErrNotExist
	}
	f.writes++
	f.values[path] = value
	return nil
}

func (f *fakeSysctls) read(path string) (string, error) {
	v, ok := f.values[path]
	if !ok {
		return "", os.ErrNotExist
	}
	return v, nil
}

func localRoute(dst, dev string) *calc.Route {
	return &calc.Route{Dst: netip.MustParsePrefix(dst), Reason: calc.ReasonLocalWorkload, Device: dev}
}

// TestSysctlsTransitions walks the sysctls driver through the changes it sees: a workload's
// route comes and goes, a full update drops what it lacks, a resync checks each value again,
// an interface not there yet is no failure, and Diff names what differs.
func TestSysctlsTransitions(t *testing.T) {
	f := &fakeSysctls{values: map[string]string{"net/ipv4/ip_forward": "0", "net/ipv6/conf/all/forwarding": "0",
		"net/ipv4/conf/cali1/proxy_arp": "0", "net/ipv4/neigh/cali1/proxy_delay": "1", "net/ipv4/conf/cali1/forwarding": "0"}}
	v6 := false
	s := newSysctls(f.write, f.read, func() bool { return v6 })
	var _ driver = s

	s.Full(&calc.Update{Full: true, Ops: []calc.Op{{Route: localRoute("10.0.0.1/32", "cali1")}, {Route: localRoute("10.0.0.2/32", "cali2")}}})
	missing, _, err := s.Diff()
	if err != nil {
		t.Fatal(err)
	}
	// cali2 is not there: the routes report that, not the sysctls.
	want := []string{"sysctl net/ipv4/conf/cali1/forwarding = 1 (is 0)", "sysctl net/ipv4/conf/cali1/proxy_arp = 1 (is 0)",
		"sysctl net/ipv4/ip_forward = 1 (is 0)", "sysctl net/ipv4/neigh/cali1/proxy_delay = 0 (is 1)"}
	if !slices.Equal(missing, want) {
		t.Fatalf("diff before apply: %q, want %q", missing, want)
	}
	if err := s.Apply(); err != nil {
		t.Fatalf("apply with an interface not there yet: %v", err)
	}
	if f.writes != 4 || f.values["net/ipv4/conf/cali1/proxy_arp"] != "1" || f.values["net/ipv6/conf/all/forwarding"] != "0" {
		t.Fatalf("after apply: %d writes, %v", f.writes, f.values)
	}
	if missing, _, _ := s.Diff(); len(missing) != 0 {
		t.Fatalf("diff after apply: %q", missing)
	}
	// Nothing new: nothing written. Someone sets ip_forward back: a resync writes it again.
	if err := s.Apply(); err != nil || f.writes != 4 {
		t.Fatalf("second apply: %v, %d writes", err, f.writes)
	}
	f.values["net/ipv4/ip_forward"] = "0"
	s.QueueResync()
	if err := s.Apply(); err != nil || f.values["net/ipv4/ip_forward"] != "1" {
		t.Fatalf("after a resync: %v, ip_forward %q", err, f.values["net/ipv4/ip_forward"])
	}
	// An IPv6 route wants IPv6 forwarding.
	v6 = true
	if err := s.Apply(); err != nil || f.values["net/ipv6/conf/all/forwarding"] != "1" {
		t.Fatalf("with an IPv6 route: %v, %v", err, f.values)
	}
	// cali1's route goes: its sysctls are no longer wanted (and never set back).
	if !s.OnOp(calc.Op{Remove: true, Route: localRoute("10.0.0.1/32", "cali1")}) {
		t.Fatal("removing a local workload's route changed nothing")
	}
	if got := slices.Sorted(maps.Keys(s.want())); !slices.Equal(got, []string{"net/ipv4/conf/cali2/forwarding", "net/ipv4/conf/cali2/proxy_arp",
		"net/ipv4/ip_forward", "net/ipv4/neigh/cali2/proxy_delay", "net/ipv6/conf/all/forwarding"}) {
		t.Fatalf("wanted after cali1's route went: %q", got)
	}
	// A route elsewhere is not the sysctls' concern; a full update without cali2 drops it.
	if s.OnOp(calc.Op{Route: &calc.Route{Dst: netip.MustParsePrefix("10.1.0.0/26"), Reason: calc.ReasonRemoteBlock}}) {
		t.Fatal("a remote block's route changed the sysctls")
	}
	s.Full(&calc.Update{Full: true})
	if got := len(s.want()); got != 2 {
		t.Fatalf("after an empty full update %d sysctls wanted: %v", got, s.want())
	}
}
