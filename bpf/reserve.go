package bpf

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// reservedPortsFile is the setting of the network namespace the agent runs in.
var reservedPortsFile = "/proc/sys/net/ipv4/ip_local_reserved_ports"

// ReserveLocalPorts adds lo-hi to net.ipv4.ip_local_reserved_ports (as kube-proxy's
// documentation asks of operators), keeping what is there: the node's own sockets then never
// pick a source port a node port answers on. Nothing is written when the range is reserved
// already; nothing is ever taken out (other software may want what it reserved).
func ReserveLocalPorts(lo, hi uint16) error {
	cur, err := os.ReadFile(reservedPortsFile)
	if err != nil {
		return fmt.Errorf("reserving the node-port range %d-%d: %w", lo, hi, err)
	}
	have := strings.TrimSpace(string(cur))
	if portsCover(have, lo, hi) {
		return nil
	}
	want := fmt.Sprintf("%d-%d", lo, hi)
	if have != "" {
		want = have + "," + want
	}
	if err := os.WriteFile(reservedPortsFile, []byte(want), 0o644); err != nil {
		return fmt.Errorf("reserving the node-port range %d-%d in %s: %w", lo, hi, reservedPortsFile, err)
	}
	return nil
}

// portsCover says whether a port list as the kernel writes it ("1,5-9") holds every port of
// lo-hi.
func portsCover(list string, lo, hi uint16) bool {
	in := map[uint16]bool{}
	for _, item := range strings.Split(list, ",") {
		a, b, isRange := strings.Cut(strings.TrimSpace(item), "-")
		x, err1 := strconv.Atoi(a)
		y, err2 := x, error(nil)
		if isRange {
			y, err2 = strconv.Atoi(b)
		}
		if err1 != nil || err2 != nil {
			continue
		}
		for p := max(x, int(lo)); p <= min(y, int(hi)); p++ {
			in[uint16(p)] = true
		}
	}
	return len(in) == int(hi)-int(lo)+1
}
