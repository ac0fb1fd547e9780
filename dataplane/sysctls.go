package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sluice-net/sluice/calc"
)

// Sysctls sets what forwarding to workloads needs: IPv4 forwarding (IPv6 forwarding too
// once any IPv6 route is desired), and on each local workload's interface proxy ARP
// (workloads route via a link-local gateway the host answers for), no proxy delay, and
// forwarding. Values are written only when they differ from what sluice last wrote; a
// resync checks each again. sluice never sets them back: other software relies on them too.
type Sysctls struct {
	write func(path, value string) error
	read  func(path string) (string, error) // nil: Diff says nothing of sysctls
	// hasIPv6 says whether any IPv6 route is desired (the route table counts them).
	hasIPv6 func() bool
	// locals are the desired routes to local workloads, by destination: their interfaces.
	locals  map[netip.Prefix]string
	written map[string]string // path → what sluice last wrote there
}

func newSysctls(write func(path, value string) error, read func(path string) (string, error), hasIPv6 func() bool) *Sysctls {
	return &Sysctls{write: write, read: read, hasIPv6: hasIPv6, locals: map[netip.Prefix]string{}, written: map[string]string{}}
}

// Full takes the local workloads' routes of a full update.
func (s *Sysctls) Full(u *calc.Update) {
	clear(s.locals)
	for _, op := range u.Ops {
		s.OnOp(op)
	}
}

// OnOp takes a route: one to a local workload names an interface that needs its sysctls.
func (s *Sysctls) OnOp(op calc.Op) bool {
	if op.Kind() != calc.OpRoute {
		return false
	}
	r := op.Route
	_, had := s.locals[r.Dst]
	if !op.Remove && r.Reason == calc.ReasonLocalWorkload && r.Device != "" {
		s.locals[r.Dst] = r.Device
		return true
	}
	delete(s.locals, r.Dst)
	return had
}

// want is every sysctl and its value.
func (s *Sysctls) want() map[string]string {
	want := map[string]string{"net/ipv4/ip_forward": "1"}
	if s.hasIPv6() {
		// IPv6 routes to route: the host must forward IPv6 too. (On a host that configures
		// its own uplink by router advertisements, accept_ra=2 keeps them working.)
		want["net/ipv6/conf/all/forwarding"] = "1"
	}
	for _, dev := range s.locals {
		want["net/ipv4/conf/"+dev+"/proxy_arp"] = "1"
		want["net/ipv4/neigh/"+dev+"/proxy_delay"] = "0"
		want["net/ipv4/conf/"+dev+"/forwarding"] = "1"
	}
	return want
}

// Apply writes each value sluice has not written yet. An interface not there yet is no
// failure: its link event brings the dataplane back.
func (s *Sysctls) Apply() error {
	var errs []error
	for path, v := range s.want() {
		if s.written[path] == v {
			continue
		}
		if err := s.write(path, v); err != nil {
			if !errors.Is(err, os.ErrNotExist) || !interfaceSysctl(path) {
				errs = append(errs, err)
			}
			continue
		}
		s.written[path] = v
	}
	return errors.Join(errs...)
}

func interfaceSysctl(path string) bool {
	return strings.Contains(path, "/conf/") || strings.Contains(path, "/neigh/")
}

// QueueResync forgets what sluice wrote: the next Apply checks each value again (the real
// writer reads it first and writes only a different one).
func (s *Sysctls) QueueResync() { clear(s.written) }

// ForgetInterface forgets what sluice wrote for an interface (it went, and a new one of the
// same name needs its sysctls again).
func (s *Sysctls) ForgetInterface(name string) {
	for p := range s.written {
		if strings.Contains(p, "/"+name+"/") {
			delete(s.written, p)
		}
	}
}

// Diff reads each value (nothing without a reader: a dataplane given its own writer).
func (s *Sysctls) Diff() (missing, extra []string, err error) {
	if s.read == nil {
		return nil, nil, nil
	}
	for path, v := range s.want() {
		cur, err := s.read(path)
		switch {
		case errors.Is(err, os.ErrNotExist) && interfaceSysctl(path):
			continue // the interface is not there: the routes say so
		case err != nil:
			return nil, nil, err
		case cur != v:
			missing = append(missing, fmt.Sprintf("sysctl %s = %s (is %s)", path, v, cur))
		}
	}
	slices.Sort(missing)
	return missing, nil, nil
}

func writeSysctl(path, value string) error {
	cur, err := readSysctl(path)
	if err != nil {
		return err
	}
	if cur == value {
		return nil
	}
	return os.WriteFile(filepath.Join("/proc/sys", path), []byte(value), 0o644)
}

func readSysctl(path string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", path))
	return strings.TrimSpace(string(b)), err
}
