package store

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	json "github.com/segmentio/encoding/json"
)

// BadValueError says why the value under a key was rejected. Field is the JSON path of the
// offending field ("spec.vxlanMode"), or "" when the whole value is at fault.
type BadValueError struct {
	Key    string
	Field  string
	Reason string
}

func (e *BadValueError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("key %s: %s", e.Key, e.Reason)
	}
	return fmt.Sprintf("key %s: field %s: %s", e.Key, e.Field, e.Reason)
}

// fieldError is a BadValueError before the key is known.
type fieldError struct{ field, reason string }

func (e *fieldError) Error() string { return e.field + ": " + e.reason }

func bad(field, format string, args ...any) error {
	return &fieldError{field: field, reason: fmt.Sprintf(format, clipArgs(args)...)}
}

// Decode parses and validates the value stored under key. Every error is a *BadValueError
// naming the key and, where one is at fault, the field.
func Decode(key string, value []byte) (obj Object, err error) {
	kind, id, err := ParseKey(key)
	if err != nil {
		return nil, newBadValue(key, "", err.Error())
	}
	switch kind {
	case KindIPPool:
		obj, err = decodeIPPool(id, value)
	case KindNode:
		obj, err = decodeNode(id, value)
	case KindBlock:
		obj, err = decodeBlock(id, value)
	case KindBlockAffinity:
		obj, err = decodeAffinity(id, value)
	case KindWorkloadEndpoint:
		obj, err = decodeWorkloadEndpoint(id, value)
	case KindService:
		obj, err = decodeService(id, value)
	case KindEndpointSlice:
		obj, err = decodeEndpointSlice(id, value)
	case KindBGPConfiguration:
		obj, err = decodeBGPConfiguration(id, value)
	case KindBGPPeer:
		obj, err = decodeBGPPeer(id, value)
	}
	if err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			return nil, newBadValue(key, fe.field, fe.reason)
		}
		return nil, newBadValue(key, "", err.Error())
	}
	return obj, nil
}

// emptied returns m emptied for a decode, or when nil a map with room for a few entries: the
// decoder would make a nil map for 64 (4.5 kB an object; for endpoint slices a tenth of what
// sluiced allocated while services arrived, BenchmarkServicesArriving in cmd/sluiced).
func emptied(m map[string]string) map[string]string {
	if m == nil {
		return make(map[string]string, 4)
	}
	clear(m)
	return m
}

// emptyMaps empties the labels and annotations for a decode (see emptied).
func (m *ObjectMeta) emptyMaps() {
	m.Labels, m.Annotations = emptied(m.Labels), emptied(m.Annotations)
}

// unmarshal decodes JSON and turns type errors into field errors.
func unmarshal(value []byte, v any) error {
	if len(bytes.TrimSpace(value)) == 0 {
		return errors.New("empty value: want a JSON object")
	}
	if err := json.Unmarshal(value, v); err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			return err // from a field's own UnmarshalJSON
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return bad(te.Field, "got JSON %s, want %s", valueKind(te.Value), te.Type)
		}
		return fmt.Errorf("not valid JSON: %v", err)
	}
	return nil
}

func checkMeta(tm TypeMeta, wantKind string, m ObjectMeta, id string, namespaced bool) error {
	if tm.Kind != "" && tm.Kind != wantKind {
		return bad("kind", "got %q under a %s key", tm.Kind, wantKind)
	}
	want := m.Name
	if namespaced {
		want = m.Namespace + "/" + m.Name
	}
	if m.Name != "" && want != id {
		return bad("metadata.name", "%q does not match the key's %q", want, id)
	}
	return nil
}

func parseMode(field, s string) (EncapMode, error) {
	switch EncapMode(s) {
	case "", EncapNever:
		return EncapNever, nil
	case EncapAlways, EncapCrossSubnet:
		return EncapMode(s), nil
	}
	return "", bad(field, "unknown mode %q: want Never, Always or CrossSubnet", s)
}

func decodeIPPool(id string, value []byte) (Object, error) {
	var r IPPoolResource
	if err := unmarshal(value, &r); err != nil {
		return nil, err
	}
	if err := checkMeta(r.TypeMeta, "IPPool", r.Metadata, id, false); err != nil {
		return nil, err
	}
	cidr, err := netip.ParsePrefix(r.Spec.CIDR)
	if err != nil {
		return nil, bad("spec.cidr", "%q is not a CIDR", r.Spec.CIDR)
	}
	cidr = cidr.Masked()
	p := &IPPool{Name: id, CIDR: cidr, NATOutgoing: r.Spec.NATOutgoing, Disabled: r.Spec.Disabled,
		BlockSize: r.Spec.BlockSize, NodeSelector: r.Spec.NodeSelector, AllowedUses: r.Spec.AllowedUses, DisableBGPExport: r.Spec.DisableBGPExport}
	if p.VXLANMode, err = parseMode("spec.vxlanMode", r.Spec.VXLANMode); err != nil {
		return nil, err
	}
	if p.IPIPMode, err = parseMode("spec.ipipMode", r.Spec.IPIPMode); err != nil {
		return nil, err
	}
	lo, hi := 20, 32
	if cidr.Addr().Is6() {
		lo, hi = 116, 128
	}
	if p.BlockSize == 0 {
		p.BlockSize = 26
		if cidr.Addr().Is6() {
			p.BlockSize = 122
		}
	}
	if p.BlockSize < lo || p.BlockSize > hi {
		return nil, bad("spec.blockSize", "%d out of range: want %d to %d", p.BlockSize, lo, hi)
	}
	if p.BlockSize < cidr.Bits() {
		return nil, bad("spec.blockSize", "/%d blocks do not fit in the pool's /%d", p.BlockSize, cidr.Bits())
	}
	if p.VXLANMode != EncapNever && p.IPIPMode != EncapNever {
		return nil, bad("spec.ipipMode", "VXLAN and IPIP cannot both be on")
	}
	return p, nil
}

// parseAddrOrPrefix accepts "192.0.2.1/24" or "192.0.2.1" (as a single-address prefix).
func parseAddrOrPrefix(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p, true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	return netip.Prefix{}, false
}

func parseOptionalAddr(field, s string, want4 bool) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	// Calico's tunnel addresses are bare, but tolerate a /32.
	p, ok := parseAddrOrPrefix(s)
	if !ok || p.Addr().Is4() != want4 {
		fam := "IPv6"
		if want4 {
			fam = "IPv4"
		}
		return netip.Addr{}, bad(field, "%q is not an %s address", s, fam)
	}
	return p.Addr(), nil
}

func parseOptionalMAC(field, s string) (net.HardwareAddr, error) {
	if s == "" {
		return nil, nil
	}
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, bad(field, "%q is not a MAC address", s)
	}
	if mac[0]&1 != 0 {
		return nil, bad(field, "%q is a multicast or broadcast MAC: want a unicast one", s)
	}
	return mac, nil
}

// usableAddr rejects addresses that cannot be a host's: unspecified, loopback, multicast,
// link-local.
func usableAddr(field string, a netip.Addr) error {
	if !a.IsGlobalUnicast() {
		return bad(field, "%s cannot be a node's address", a)
	}
	return nil
}

func decodeNode(id string, value []byte) (Object, error) {
	var r NodeResource
	if err := unmarshal(value, &r); err != nil {
		return nil, err
	}
	if err := checkMeta(r.TypeMeta, "Node", r.Metadata, id, false); err != nil {
		return nil, err
	}
	n := &Node{Name: id}
	var v6 NodeV6
	var err error
	if b := r.Spec.BGP; b != nil {
		if b.IPv4Address != "" {
			p, ok := parseAddrOrPrefix(b.IPv4Address)
			if !ok || !p.Addr().Is4() {
				return nil, bad("spec.bgp.ipv4Address", "%q is not an IPv4 address in CIDR form", b.IPv4Address)
			}
			n.IPv4Address = p
		}
		if b.IPv6Address != "" {
			p, ok := parseAddrOrPrefix(b.IPv6Address)
			if !ok || p.Addr().Is4() {
				return nil, bad("spec.bgp.ipv6Address", "%q is not an IPv6 address in CIDR form", b.IPv6Address)
			}
			v6.Address = p
		}
		if _, err = parseOptionalAddr("spec.bgp.ipv4IPIPTunnelAddr", b.IPv4IPIPTunnelAddr, true); err != nil {
			return nil, err
		}
		n.BGP = &NodeBGP{}
		if n.BGP.ASNumber, err = parseASNumber("spec.bgp.asNumber", b.ASNumber); err != nil {
			return nil, err
		}
		if id := b.RouteReflectorClusterID; id != "" {
			a, perr := netip.ParseAddr(id)
			if perr != nil || !a.Is4() {
				return nil, bad("spec.bgp.routeReflectorClusterID", "%q is not a cluster ID in IPv4 address form", id)
			}
			n.BGP.RouteReflectorClusterID = a
		}
	}
	if len(r.Metadata.Labels) > 0 {
		n.Labels = r.Metadata.Labels
	}
	// Without bgp addresses, the underlay comes from spec.addresses: InternalIP, then ExternalIP.
	for _, typ := range []string{"InternalIP", "ExternalIP"} {
		for i, a := range r.Spec.Addresses {
			if a.Type != typ {
				continue
			}
			p, ok := parseAddrOrPrefix(a.Address)
			if !ok {
				return nil, bad(fmt.Sprintf("spec.addresses[%d].address", i), "%q is not an IP address", a.Address)
			}
			if p.Addr().Is4() && !n.IPv4Address.IsValid() {
				n.IPv4Address = p
			}
			if p.Addr().Is6() && !v6.Address.IsValid() {
				v6.Address = p
			}
		}
	}
	if n.IPv4VXLANTunnelAddr, err = parseOptionalAddr("spec.ipv4VXLANTunnelAddr", r.Spec.IPv4VXLANTunnelAddr, true); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		field string
		addr  netip.Addr
	}{
		{"spec.bgp.ipv4Address", n.IPv4Address.Addr()}, {"spec.bgp.ipv6Address", v6.Address.Addr()},
		{"spec.ipv4VXLANTunnelAddr", n.IPv4VXLANTunnelAddr},
	} {
		if c.addr.IsValid() {
			if err := usableAddr(c.field, c.addr); err != nil {
				return nil, err
			}
		}
	}
	if v6.VXLANTunnelAddr, err = parseOptionalAddr("spec.ipv6VXLANTunnelAddr", r.Spec.IPv6VXLANTunnelAddr, false); err != nil {
		return nil, err
	}
	if n.VXLANTunnelMAC, err = parseOptionalMAC("spec.vxlanTunnelMACAddr", r.Spec.VXLANTunnelMACAddr); err != nil {
		return nil, err
	}
	if v6.VXLANTunnelMAC, err = parseOptionalMAC("spec.vxlanTunnelMACAddrV6", r.Spec.VXLANTunnelMACAddrV6); err != nil {
		return nil, err
	}
	if v6.Address.IsValid() || v6.VXLANTunnelAddr.IsValid() || v6.VXLANTunnelMAC != nil {
		n.V6 = &v6
	}
	return n, nil
}

// BlockSlots is the number of address slots a block of this CIDR has.
func BlockSlots(cidr netip.Prefix) int {
	return 1 << (cidr.Addr().BitLen() - cidr.Bits())
}

// blockView is what the intake reads of a block: calico-ipam's AllocationBlock less what
// routing never needs (the free list, sequence numbers), with the allocations array parsed
// by hand and each attribute's secondary map read for its node only. A cold start decodes
// tens of thousands of blocks; this takes far less time than the full type does
// (BenchmarkDecodeBlock in store measures it).
type blockView struct {
	CIDR        string          `json:"cidr"`
	Affinity    *string         `json:"affinity"`
	Allocations allocationSlots `json:"allocations"`
	Attributes  []struct {
		HandleID  *string `json:"handle_id"`
		Secondary struct {
			Node string `json:"node"`
		} `json:"secondary"`
	} `json:"attributes"`
	Deleted bool `json:"deleted"`
}

// allocationSlots is a block's allocations array: per address, the index of its attribute,
// or -1 for JSON null (free).
type allocationSlots []int32

// UnmarshalJSON parses an array of nulls and non-negative integers. encoding/json has
// checked that the value is valid JSON before calling it.
func (a *allocationSlots) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*a = nil
		return nil
	}
	if len(b) < 2 || b[0] != '[' {
		return bad("allocations", "got JSON %s, want an array", jsonKind(b[0]))
	}
	out := (*a)[:0]
	for i := 1; i < len(b); {
		switch c := b[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == ']':
			i++
		case c == 'n' && i+4 <= len(b) && string(b[i:i+4]) == "null":
			out = append(out, -1)
			i += 4
		case c >= '0' && c <= '9':
			n := int64(0)
			for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
				if n = n*10 + int64(b[i]-'0'); n > math.MaxInt32 {
					return bad(fmt.Sprintf("allocations[%d]", len(out)), "attribute index out of range")
				}
			}
			if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
				return bad(fmt.Sprintf("allocations[%d]", len(out)), "got a fraction, want an attribute index or null")
			}
			out = append(out, int32(n))
		case c == '-':
			return bad(fmt.Sprintf("allocations[%d]", len(out)), "attribute index out of range: negative")
		default:
			return bad(fmt.Sprintf("allocations[%d]", len(out)), "got JSON %s, want an attribute index or null", jsonKind(c))
		}
	}
	*a = out
	return nil
}

// valueKind names the kind of JSON value a type error quotes ("string", or the value's text).
func valueKind(v string) string {
	switch v {
	case "", "string", "number", "bool", "array", "object", "null":
		return v
	}
	if v[0] == 'n' {
		return "null"
	}
	return jsonKind(v[0])
}

// jsonKind names the kind of JSON value that starts with c, as encoding/json's errors do.
func jsonKind(c byte) string {
	switch c {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "bool"
	}
	return "number"
}

func decodeBlock(id string, value []byte) (Object, error) {
	var r blockView
	if err := unmarshal(value, &r); err != nil {
		return nil, err
	}
	cidr, err := netip.ParsePrefix(r.CIDR)
	if err != nil {
		return nil, bad("cidr", "%q is not a CIDR", r.CIDR)
	}
	if cidr.String() != id {
		return nil, bad("cidr", "%q does not match the key's %q", r.CIDR, id)
	}
	hostBits := cidr.Addr().BitLen() - cidr.Bits()
	if hostBits > 12 {
		return nil, bad("cidr", "/%d is larger than any IPAM block (at most 4096 addresses)", cidr.Bits())
	}
	slots := 1 << hostBits
	if len(r.Allocations) != slots {
		return nil, bad("allocations", "has %d slots, want %d for a /%d", len(r.Allocations), slots, cidr.Bits())
	}
	b := &Block{CIDR: cidr, Deleted: r.Deleted}
	if r.Affinity != nil {
		b.Affinity = *r.Affinity
		if node, ok := strings.CutPrefix(b.Affinity, "host:"); ok {
			if node == "" {
				return nil, bad("affinity", "%q names no host", b.Affinity)
			}
			b.AffinityNode = node
		}
	}
	addr := cidr.Addr()
	for i, a := range r.Allocations {
		if a >= 0 {
			if int(a) >= len(r.Attributes) {
				return nil, bad(fmt.Sprintf("allocations[%d]", i), "attribute index %d out of range: block has %d attributes", a, len(r.Attributes))
			}
			attr := r.Attributes[a]
			al := Allocation{Addr: addr, Node: attr.Secondary.Node}
			if attr.HandleID != nil {
				al.Handle = *attr.HandleID
			}
			b.Allocations = append(b.Allocations, al)
		}
		addr = addr.Next()
	}
	return b, nil
}

func decodeAffinity(id string, value []byte) (Object, error) {
	var r BlockAffinityValue
	if err := unmarshal(value, &r); err != nil {
		return nil, err
	}
	node, cidr, _ := strings.Cut(id, "/")
	a := &BlockAffinity{Node: node, CIDR: netip.MustParsePrefix(cidr), Deleted: r.Deleted}
	switch AffinityState(r.State) {
	case "", AffinityConfirmed:
		a.State = AffinityConfirmed
	case AffinityPending, AffinityPendingDeletion:
		a.State = AffinityState(r.State)
	default:
		return nil, bad("state", "unknown state %q: want confirmed, pending or pendingDeletion", r.State)
	}
	return a, nil
}

func decodeWorkloadEndpoint(id string, value []byte) (Object, error) {
	var r WorkloadEndpointResource
	r.Metadata.emptyMaps()
	if err := unmarshal(value, &r); err != nil {
		return nil, err
	}
	if err := checkMeta(r.TypeMeta, "WorkloadEndpoint", r.Metadata, id, true); err != nil {
		return nil, err
	}
	ns, name, _ := strings.Cut(id, "/")
	w := &WorkloadEndpoint{Namespace: ns, Name: name, Node: r.Spec.Node, Orchestrator: r.Spec.Orchestrator, InterfaceName: r.Spec.InterfaceName}
	if w.Node == "" {
		return nil, bad("spec.node", "missing: a workload endpoint must name its node")
	}
	if w.InterfaceName == "" {
		return nil, bad("spec.interfaceName", "missing: a workload endpoint must name its host-side interface")
	}
	if len(w.InterfaceName) > 15 || strings.ContainsAny(w.InterfaceName, "/ \t\n") {
		return nil, bad("spec.interfaceName", "%q is not a Linux interface name", w.InterfaceName)
	}
	for i, s := range r.Spec.IPNetworks {
		p, ok := parseAddrOrPrefix(s)
		if !ok {
			return nil, bad(fmt.Sprintf("spec.ipNetworks[%d]", i), "%q is not a CIDR", s)
		}
		if p.Masked() != p {
			return nil, bad(fmt.Sprintf("spec.ipNetworks[%d]", i), "%q has host bits set: want an address (/32, /128) or a network", s)
		}
		w.IPNetworks = append(w.IPNetworks, p)
	}
	for i, n := range r.Spec.IPNATs {
		in, err1 := netip.ParseAddr(n.InternalIP)
		ex, err2 := netip.ParseAddr(n.ExternalIP)
		if err1 != nil || err2 != nil || in.Is4() != ex.Is4() {
			return nil, bad(fmt.Sprintf("spec.ipNATs[%d]", i), "want internalIP and externalIP of one family, got %q and %q", n.InternalIP, n.ExternalIP)
		}
		w.IPNATs = append(w.IPNATs, IPNAT{InternalIP: in, ExternalIP: ex})
	}
	var err error
	if w.MAC, err = parseOptionalMAC("spec.mac", r.Spec.MAC); err != nil {
		return nil, err
	}
	return w, nil
}

func parseProtocol(field, s string) (Protocol, error) {
	switch Protocol(s) {
	case "":
		return ProtocolTCP, nil
	case ProtocolTCP, ProtocolUDP, ProtocolSCTP:
		return Protocol(s), nil
	}
	return "", bad(field, "unknown protocol %q: want TCP, UDP or SCTP", s)
}

func parsePolicy(field, s string) (TrafficPolicy, error) {
	switch TrafficPolicy(s) {
	case "":
		return PolicyCluster, nil
	case PolicyCluster, PolicyLocal:
		return TrafficPolicy(s), nil
	}
	return "", bad(field, "unknown policy %q: want Cluster or Local", s)
}

func parsePort(field string, v int, allowZero bool) (uint16, error) {
	if v < 0 || v > 65535 || (v == 0 && !allowZero) {
		return 0, bad(field, "%d is not a port number (1 to 65535)", v)
	}
	return uint16(v), nil
}

// ipFamily names the family of a, as spec.ipFamilies spells it.
func ipFamily(a netip.Addr) string {
	if a.Is4() {
		return IPv4Family
	}
	return IPv6Family
}

// decodeFamilies parses spec.clusterIPs (or spec.clusterIP) with spec.ipFamilies and
// spec.ipFamilyPolicy into s, as the apiserver validates them: at most one entry per
// family, clusterIPs[i] of family ipFamilies[i], one family under SingleStack, two under
// RequireDualStack. Without ipFamilies the families come from the addresses alone.
func decodeFamilies(spec *ServiceSpec, s *Service) error {
	fams := spec.IPFamilies
	if len(fams) > 2 {
		return bad("spec.ipFamilies", "%d entries: want at most two, one per family", len(fams))
	}
	for i, f := range fams {
		field := fmt.Sprintf("spec.ipFamilies[%d]", i)
		if f != IPv4Family && f != IPv6Family {
			return bad(field, "unknown family %q: want IPv4 or IPv6", f)
		}
		if i > 0 && f == fams[0] {
			return bad(field, "duplicate family %q: a dual-stack service names each family once", f)
		}
	}
	policy := spec.IPFamilyPolicy
	switch policy {
	case "", SingleStack, PreferDualStack, RequireDualStack:
	default:
		return bad("spec.ipFamilyPolicy", "unknown policy %q: want SingleStack, PreferDualStack or RequireDualStack", policy)
	}
	if len(fams) > 0 {
		s.IPFamilies = slices.Clone(fams) // spec's lists are kept for the next decode
	}

	clusterIPs, field := spec.ClusterIPs, "spec.clusterIPs"
	at := func(i int) string { return fmt.Sprintf("%s[%d]", field, i) }
	if len(clusterIPs) == 0 && spec.ClusterIP != "" {
		clusterIPs, field = []string{spec.ClusterIP}, "spec.clusterIP"
		at = func(int) string { return field }
	}
	families := map[string]bool{} // of the cluster IPs
	for i, c := range clusterIPs {
		if c == "None" || c == "" {
			continue // headless
		}
		a, err := netip.ParseAddr(c)
		if err != nil {
			return bad(at(i), "%q is not an IP address", c)
		}
		if i < len(fams) && ipFamily(a) != fams[i] {
			return bad(at(i), "%s is %s, but spec.ipFamilies[%d] is %s", a, ipFamily(a), i, fams[i])
		}
		families[ipFamily(a)] = true
		s.ClusterIPs = append(s.ClusterIPs, a)
	}

	const wantDual = "want PreferDualStack or RequireDualStack for a dual-stack service"
	switch policy {
	case SingleStack:
		if len(fams) == 2 {
			return bad("spec.ipFamilies", "names two families, but spec.ipFamilyPolicy is SingleStack: %s", wantDual)
		}
		if len(families) == 2 {
			return bad(field, "has addresses of both families, but spec.ipFamilyPolicy is SingleStack: %s", wantDual)
		}
	case RequireDualStack:
		if len(s.ClusterIPs) == 0 {
			break // headless, or no address yet: nothing to hold the families to
		}
		if len(fams) == 1 {
			return bad("spec.ipFamilies", "names only %s, but spec.ipFamilyPolicy is RequireDualStack: want IPv4 and IPv6", fams[0])
		}
		if len(families) < 2 {
			return bad(field, "has addresses of one family only, but spec.ipFamilyPolicy is RequireDualStack: want one of each family")
		}
	case "":
		// Defaulted as the apiserver defaults it from the fields given.
		policy = SingleStack
		if len(fams) == 2 || len(families) == 2 {
			policy = RequireDualStack
		}
	}
	s.IPFamilyPolicy = policy
	return nil
}

// servicesRead holds services' wire forms between decodes, as slicesRead does for slices.
var servicesRead = sync.Pool{New: func() any { return new(ServiceResource) }}

// resetForDecode empties r for the next decode and keeps the room of its address and port
// lists and of its maps (a service's selector too), as the endpoint slice's does. The string
// lists' elements are overwritten whole; the ports are zeroed up to their capacity.
func (r *ServiceResource) resetForDecode() {
	keep := func(l []string) []string { return l[:0] }
	ports := r.Spec.Ports[:cap(r.Spec.Ports)]
	clear(ports)
	meta := ObjectMeta{Labels: r.Metadata.Labels, Annotations: r.Metadata.Annotations}
	meta.emptyMaps()
	*r = ServiceResource{Metadata: meta, Spec: ServiceSpec{Selector: emptied(r.Spec.Selector),
		ClusterIPs: keep(r.Spec.ClusterIPs), IPFamilies: keep(r.Spec.IPFamilies), Ports: ports[:0],
		ExternalIPs: keep(r.Spec.ExternalIPs), LoadBalancerSourceRanges: keep(r.Spec.LoadBalancerSourceRanges)}}
}

func decodeService(id string, value []byte) (Object, error) {
	r := servicesRead.Get().(*ServiceResource)
	defer servicesRead.Put(r)
	r.resetForDecode()
	if err := unmarshal(value, r); err != nil {
		return nil, err
	}
	if err := checkMeta(r.TypeMeta, "Service", r.Metadata, id, true); err != nil {
		return nil, err
	}
	ns, name, _ := strings.Cut(id, "/")
	s := &Service{Namespace: ns, Name: name, UID: r.Metadata.UID}
	var err error
	switch ServiceType(r.Spec.Type) {
	case "":
		s.Type = ServiceClusterIP
	case ServiceClusterIP, ServiceNodePort, ServiceLoadBalancer:
		s.Type = ServiceType(r.Spec.Type)
	case "ExternalName":
		return nil, bad("spec.type", "ExternalName is a DNS alias with no address or port to proxy: sluice has nothing to program for it; leave the service out")
	default:
		return nil, bad("spec.type", "unknown type %q: want ClusterIP, NodePort or LoadBalancer", r.Spec.Type)
	}
	if err := decodeFamilies(&r.Spec, s); err != nil {
		return nil, err
	}
	for i, c := range r.Spec.ExternalIPs {
		a, err := netip.ParseAddr(c)
		if err != nil {
			return nil, bad(fmt.Sprintf("spec.externalIPs[%d]", i), "%q is not an IP address", c)
		}
		s.ExternalIPs = append(s.ExternalIPs, a)
	}
	for i, in := range r.Status.LoadBalancer.Ingress {
		f := fmt.Sprintf("status.loadBalancer.ingress[%d]", i)
		switch in.IPMode {
		case "", "VIP", "Proxy":
		default:
			return nil, bad(f+".ipMode", "unknown mode %q: want VIP or Proxy", in.IPMode)
		}
		if in.IP == "" {
			continue // hostname-only ingress: nothing to program
		}
		a, err := netip.ParseAddr(in.IP)
		if err != nil {
			return nil, bad(f+".ip", "%q is not an IP address", in.IP)
		}
		if in.IPMode == "Proxy" {
			// The load balancer proxies to node ports or pods: traffic for its address must
			// reach it, not be caught on the way (kube-proxy skips these too).
			continue
		}
		s.LoadBalancerIPs = append(s.LoadBalancerIPs, a)
	}
	for i, c := range r.Spec.LoadBalancerSourceRanges {
		p, ok := parseAddrOrPrefix(strings.TrimSpace(c))
		if !ok {
			return nil, bad(fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), "%q is not a CIDR", c)
		}
		s.LoadBalancerSourceRanges = append(s.LoadBalancerSourceRanges, p.Masked())
	}
	seen := map[string]bool{}
	for i, p := range r.Spec.Ports {
		f := fmt.Sprintf("spec.ports[%d]", i)
		sp := ServicePortSpec{Name: p.Name}
		if sp.Protocol, err = parseProtocol(f+".protocol", p.Protocol); err != nil {
			return nil, err
		}
		if sp.Port, err = parsePort(f+".port", p.Port, false); err != nil {
			return nil, err
		}
		if sp.NodePort, err = parsePort(f+".nodePort", p.NodePort, true); err != nil {
			return nil, err
		}
		if len(p.TargetPort) > 0 {
			var num int
			var str string
			if json.Unmarshal(p.TargetPort, &num) == nil {
				if sp.TargetPort, err = parsePort(f+".targetPort", num, true); err != nil {
					return nil, err
				}
			} else if json.Unmarshal(p.TargetPort, &str) == nil {
				if n, err := strconv.Atoi(str); err == nil {
					if sp.TargetPort, err = parsePort(f+".targetPort", n, true); err != nil {
						return nil, err
					}
				} else if str != "" {
					sp.TargetPortName = str
				}
			} else {
				return nil, bad(f+".targetPort", "want a port number or a port name, got %s", p.TargetPort)
			}
		}
		k := string(sp.Protocol) + "/" + strconv.Itoa(int(sp.Port))
		if seen[k] {
			return nil, bad(f, "duplicate port %s", k)
		}
		seen[k] = true
		if len(r.Spec.Ports) > 1 {
			if sp.Name == "" {
				return nil, bad(f+".name", "missing: every port of a multi-port service needs a name")
			}
			if seen["name/"+sp.Name] {
				return nil, bad(f+".name", "duplicate port name %q", sp.Name)
			}
			seen["name/"+sp.Name] = true
		}
		if sp.NodePort != 0 {
			nk := "node/" + string(sp.Protocol) + "/" + strconv.Itoa(int(sp.NodePort))
			if seen[nk] {
				return nil, bad(f+".nodePort", "duplicate node port %d/%s", sp.NodePort, sp.Protocol)
			}
			seen[nk] = true
		}
		s.Ports = append(s.Ports, sp)
	}
	if s.ExternalTrafficPolicy, err = parsePolicy("spec.externalTrafficPolicy", r.Spec.ExternalTrafficPolicy); err != nil {
		return nil, err
	}
	if s.InternalTrafficPolicy, err = parsePolicy("spec.internalTrafficPolicy", r.Spec.InternalTrafficPolicy); err != nil {
		return nil, err
	}
	if s.HealthCheckNodePort, err = parsePort("spec.healthCheckNodePort", r.Spec.HealthCheckNodePort, true); err != nil {
		return nil, err
	}
	switch r.Spec.SessionAffinity {
	case "", "None":
	case "ClientIP":
		s.AffinityTimeout = DefaultAffinityTimeout
		if c := r.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t := *c.ClientIP.TimeoutSeconds
			if t < 1 || t > 86400 {
				return nil, bad("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "%d out of range: want 1 to 86400", t)
			}
			s.AffinityTimeout = t
		}
	default:
		return nil, bad("spec.sessionAffinity", "unknown affinity %q: want None or ClientIP", r.Spec.SessionAffinity)
	}
	return s, nil
}

// slicesRead holds endpoint slices' wire forms between decodes (see resetForDecode).
var slicesRead = sync.Pool{New: func() any { return new(EndpointSliceResource) }}

// resetForDecode empties r for the next decode and keeps the room of its lists and maps: the
// decoder grows a list from ten elements through reflection, which was a sixth of what sluiced
// allocated while 10,000 services arrived (BenchmarkServicesArriving in cmd/sluiced). The
// decoder decodes over what an element holds, so every element up to the capacity is zeroed
// (a field the next value leaves out must be empty); an endpoint's addresses keep their room.
func (r *EndpointSliceResource) resetForDecode() {
	eps := r.Endpoints[:cap(r.Endpoints)]
	for i := range eps {
		eps[i] = EndpointResource{Addresses: eps[i].Addresses[:0]}
	}
	ports := r.Ports[:cap(r.Ports)]
	clear(ports)
	meta := ObjectMeta{Labels: r.Metadata.Labels, Annotations: r.Metadata.Annotations}
	meta.emptyMaps()
	*r = EndpointSliceResource{Metadata: meta, Endpoints: eps[:0], Ports: ports[:0]}
}

func decodeEndpointSlice(id string, value []byte) (Object, error) {
	r := slicesRead.Get().(*EndpointSliceResource)
	defer slicesRead.Put(r)
	r.resetForDecode()
	if err := unmarshal(value, r); err != nil {
		return nil, err
	}
	if err := checkMeta(r.TypeMeta, "EndpointSlice", r.Metadata, id, true); err != nil {
		return nil, err
	}
	ns, name, _ := strings.Cut(id, "/")
	e := &EndpointSlice{Namespace: ns, Name: name, Service: r.Metadata.Labels[ServiceNameLabel], AddressType: r.AddressType}
	if e.Service == "" {
		return nil, bad("metadata.labels", "missing label %s naming the service", ServiceNameLabel)
	}
	var want4 bool
	switch r.AddressType {
	case "IPv4":
		want4 = true
	case "IPv6":
	default:
		return nil, bad("addressType", "unknown address type %q: want IPv4 or IPv6", r.AddressType)
	}
	// Field names are made only for an error: a slice of 10 endpoints would otherwise format
	// ten names for nothing at every change (BenchmarkServicesArriving in cmd/sluiced).
	if len(r.Endpoints) > 0 {
		e.Endpoints = make([]Endpoint, 0, len(r.Endpoints))
	}
	for i, ep := range r.Endpoints {
		out := Endpoint{NodeName: ep.NodeName, Zone: ep.Zone, Ready: true}
		c := ep.Conditions
		if c.Ready != nil {
			out.Ready = *c.Ready
		}
		out.Serving = true // as kube-proxy reads it: unknown means serving
		if c.Serving != nil {
			out.Serving = *c.Serving
		}
		if c.Terminating != nil {
			out.Terminating = *c.Terminating
		}
		if len(ep.Addresses) == 0 {
			return nil, bad(fmt.Sprintf("endpoints[%d].addresses", i), "empty: an endpoint needs an address")
		}
		for j, s := range ep.Addresses {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Is4() != want4 {
				return nil, bad(fmt.Sprintf("endpoints[%d].addresses[%d]", i, j), "%q is not an %s address", s, r.AddressType)
			}
			if out.Addresses == nil {
				out.Addresses = make([]netip.Addr, 0, len(ep.Addresses))
			}
			out.Addresses = append(out.Addresses, a)
		}
		e.Endpoints = append(e.Endpoints, out)
	}
	for i, p := range r.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		ep := EndpointPort{Name: p.Name}
		var err error
		if ep.Protocol, err = parseProtocol(f+".protocol", p.Protocol); err != nil {
			return nil, err
		}
		if p.Port == nil {
			continue // "all ports" in Kubernetes: nothing a service port can be matched to
		}
		if ep.Port, err = parsePort(f+".port", *p.Port, false); err != nil {
			return nil, err
		}
		e.Ports = append(e.Ports, ep)
	}
	return e, nil
}
