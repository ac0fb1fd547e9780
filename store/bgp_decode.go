package store

import (
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// parseASNumber reads an AS number as Calico stores it: a JSON number, or a string holding a
// number ("64512") or the asdot form ("1.10" is 65546). Absent or null is 0.
func parseASNumber(field string, raw []byte) (uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	s := string(raw)
	if raw[0] == '"' {
		u, err := strconv.Unquote(s)
		if err != nil {
			return 0, bad(field, "%s is not an AS number", Clip(s, 40))
		}
		s = u
	}
	var n uint64
	var err error
	if hi, lo, dot := strings.Cut(s, "."); dot {
		var h, l uint64
		h, err = strconv.ParseUint(hi, 10, 16)
		if err == nil {
			l, err = strconv.ParseUint(lo, 10, 16)
		}
		n = h<<16 | l
	} else {
		n, err = strconv.ParseUint(s, 10, 32)
	}
	if err != nil || n == 0 {
		return 0, bad(field, "%q is not an AS number: want 1 to 4294967295, or asdot form such as 1.10", Clip(s, 40))
	}
	return uint32(n), nil
}

// parseDuration reads a Kubernetes duration ("120s", "2m").
func parseDuration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, bad(field, "%q is not a duration such as 120s", s)
	}
	return d, nil
}

func parseSecretRef(field string, p *BGPPassword) (*SecretKeyRef, error) {
	if p == nil {
		return nil, nil
	}
	r := p.SecretKeyRef
	if r == nil {
		return nil, bad(field, "want secretKeyRef: sluice reads passwords only from a secret's key (a file on the node), never from etcd")
	}
	for _, part := range []struct{ f, v string }{{"name", r.Name}, {"key", r.Key}} {
		if part.v == "" || strings.ContainsAny(part.v, "/\\") || part.v == "." || part.v == ".." {
			return nil, bad(field+".secretKeyRef."+part.f, "%q: want a non-empty name without '/' (it names a file)", part.v)
		}
	}
	return &SecretKeyRef{Name: r.Name, Key: r.Key}, nil
}

// parseCommunity reads "aa:nn" (each up to 65535) or "aa:nn:mm" (each up to 4294967295).
func parseCommunity(field, s string) (Community, error) {
	parts := strings.Split(s, ":")
	var c Community
	bits := 16
	switch len(parts) {
	case 2:
	case 3:
		c.Large, bits = true, 32
	default:
		return c, bad(field, "%q is not a community: want aa:nn or aa:nn:mm", Clip(s, 60))
	}
	var v [3]uint64
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, bits)
		if err != nil {
			return c, bad(field, "%q is not a community: each part of aa:nn is at most 65535, of aa:nn:mm at most 4294967295", Clip(s, 60))
		}
		v[i] = n
	}
	c.A, c.B, c.C = uint32(v[0]), uint32(v[1]), uint32(v[2])
	return c, nil
}

func parseCIDRBlocks(field string, bs []CIDRBlock) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, b := range bs {
		if b.CIDR == "" {
			continue // Calico accepts an empty entry ({}) and ignores it
		}
		p, err := netip.ParsePrefix(b.CIDR)
		if err != nil {
			return nil, bad(fmt.Sprintf("%s[%d].cidr", field, i), "%q is not a CIDR", Clip(b.CIDR, 60))
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func decodeBGPConfiguration(id string, value []byte) (Object, error) {
	var r BGPConfigurationResource
	if err := unmarshal(value, &r); err != nil {
		return nil, err
	}
	if err := checkMeta(r.TypeMeta, "BGPConfiguration", r.Metadata, id, false); err != nil {
		return nil, err
	}
	s := &r.Spec
	c := &BGPConfiguration{Name: id, NoNodeToNodeMesh: s.NodeToNodeMeshEnabled != nil && !*s.NodeToNodeMeshEnabled}
	var err error
	if c.ASNumber, err = parseASNumber("spec.asNumber", s.ASNumber); err != nil {
		return nil, err
	}
	if s.ListenPort < 0 || s.ListenPort > 65535 {
		return nil, bad("spec.listenPort", "%d is not a port", s.ListenPort)
	}
	c.ListenPort = uint16(s.ListenPort)
	if c.ServiceClusterIPs, err = parseCIDRBlocks("spec.serviceClusterIPs", s.ServiceClusterIPs); err != nil {
		return nil, err
	}
	if c.ServiceExternalIPs, err = parseCIDRBlocks("spec.serviceExternalIPs", s.ServiceExternalIPs); err != nil {
		return nil, err
	}
	if c.ServiceLoadBalancerIPs, err = parseCIDRBlocks("spec.serviceLoadBalancerIPs", s.ServiceLoadBalancerIPs); err != nil {
		return nil, err
	}
	for i, cm := range s.Communities {
		if cm.Name == "" {
			return nil, bad(fmt.Sprintf("spec.communities[%d].name", i), "empty: want a name")
		}
		v, err := parseCommunity(fmt.Sprintf("spec.communities[%d].value", i), cm.Value)
		if err != nil {
			return nil, err
		}
		if c.Communities == nil {
			c.Communities = map[string]Community{}
		}
		c.Communities[cm.Name] = v
	}
	for i, pa := range s.PrefixAdvertisements {
		field := fmt.Sprintf("spec.prefixAdvertisements[%d]", i)
		p, err := netip.ParsePrefix(pa.CIDR)
		if err != nil {
			return nil, bad(field+".cidr", "%q is not a CIDR", Clip(pa.CIDR, 60))
		}
		adv := PrefixAdvertisement{CIDR: p.Masked()}
		for j, name := range pa.Communities {
			v, ok := c.Communities[name]
			if !ok {
				if v, err = parseCommunity(fmt.Sprintf("%s.communities[%d]", field, j), name); err != nil {
					return nil, bad(fmt.Sprintf("%s.communities[%d]", field, j), "%q is neither a name in spec.communities nor a community value", Clip(name, 60))
				}
			}
			adv.Communities = append(adv.Communities, v)
		}
		c.PrefixAdvertisements = append(c.PrefixAdvertisements, adv)
	}
	if c.NodeMeshPassword, err = parseSecretRef("spec.nodeMeshPassword", s.NodeMeshPassword); err != nil {
		return nil, err
	}
	if c.NodeMeshMaxRestartTime, err = parseDuration("spec.nodeMeshMaxRestartTime", s.NodeMeshMaxRestartTime); err != nil {
		return nil, err
	}
	// What sluice does not do is refused rather than silently ignored.
	switch {
	case s.BindMode != "" && s.BindMode != "None":
		return nil, bad("spec.bindMode", "%q is not supported: sluice's speaker listens on every address (bindMode None)", s.BindMode)
	case s.ServiceLoadBalancerAggregation != "" && s.ServiceLoadBalancerAggregation != "Enabled":
		return nil, bad("spec.serviceLoadBalancerAggregation", "%q is not supported: sluice announces the serviceLoadBalancerIPs ranges as given (Enabled)", s.ServiceLoadBalancerAggregation)
	case s.LocalWorkloadPeeringIPV4 != "" || s.LocalWorkloadPeeringIPV6 != "":
		return nil, bad("spec.localWorkloadPeeringIPV4", "peering with local workloads is not supported")
	case s.ProgramClusterRoutes != "" && s.ProgramClusterRoutes != "Disabled":
		return nil, bad("spec.programClusterRoutes", "%q is not supported: sluice programs cluster routes itself (from IPAM blocks), not through BGP", s.ProgramClusterRoutes)
	}
	if strings.HasPrefix(id, NodeConfigPrefix) {
		// Calico allows a node's own configuration only these: listenPort,
		// logSeverityScreen, prefixAdvertisements.
		for _, f := range []struct {
			field string
			set   bool
		}{
			{"spec.asNumber", c.ASNumber != 0}, {"spec.nodeToNodeMeshEnabled", s.NodeToNodeMeshEnabled != nil},
			{"spec.serviceClusterIPs", len(s.ServiceClusterIPs) > 0}, {"spec.serviceExternalIPs", len(s.ServiceExternalIPs) > 0},
			{"spec.serviceLoadBalancerIPs", len(s.ServiceLoadBalancerIPs) > 0}, {"spec.nodeMeshPassword", c.NodeMeshPassword != nil},
			{"spec.nodeMeshMaxRestartTime", c.NodeMeshMaxRestartTime != 0},
		} {
			if f.set {
				return nil, bad(f.field, "is cluster-wide: set it in BGPConfiguration default, not in %s", id)
			}
		}
	} else if id != "default" {
		return nil, bad("metadata.name", "%q: want default or node.<node name>", id)
	}
	return c, nil
}

func decodeBGPPeer(id string, value []byte) (Object, error) {
	var r BGPPeerResource
	if err := unmarshal(value, &r); err != nil {
		return nil, err
	}
	if err := checkMeta(r.TypeMeta, "BGPPeer", r.Metadata, id, false); err != nil {
		return nil, err
	}
	s := &r.Spec
	p := &BGPPeer{Name: id, Node: s.Node, NextHopMode: NextHopAuto}
	var err error
	if p.NodeSelector, err = ParseSelector(s.NodeSelector); err != nil {
		return nil, bad("spec.nodeSelector", "%v", err)
	}
	if p.PeerSelector, err = ParseSelector(s.PeerSelector); err != nil {
		return nil, bad("spec.peerSelector", "%v", err)
	}
	if s.Node != "" && p.NodeSelector.Set() {
		return nil, bad("spec.nodeSelector", "node and nodeSelector cannot both be set")
	}
	switch {
	case s.PeerIP != "" && p.PeerSelector.Set():
		return nil, bad("spec.peerSelector", "peerIP and peerSelector cannot both be set")
	case s.PeerIP == "" && !p.PeerSelector.Set():
		return nil, bad("spec.peerIP", "want peerIP or peerSelector")
	case s.PeerIP != "":
		if p.PeerIP, p.PeerPort, err = parsePeerIP(s.PeerIP); err != nil {
			return nil, err
		}
	}
	if p.ASNumber, err = parseASNumber("spec.asNumber", s.ASNumber); err != nil {
		return nil, err
	}
	if p.PeerIP.IsValid() && p.ASNumber == 0 {
		return nil, bad("spec.asNumber", "required with peerIP")
	}
	if p.LocalASNumber, err = parseASNumber("spec.localASNumber", s.LocalASNumber); err != nil {
		return nil, err
	}
	switch s.NextHopMode {
	case "", NextHopAuto:
		if s.KeepOriginalNextHop {
			p.NextHopMode = NextHopKeep
		}
	case NextHopSelf, NextHopKeep:
		if s.KeepOriginalNextHop && s.NextHopMode != NextHopKeep {
			return nil, bad("spec.nextHopMode", "%s contradicts keepOriginalNextHop", s.NextHopMode)
		}
		p.NextHopMode = s.NextHopMode
	default:
		return nil, bad("spec.nextHopMode", "%q: want Auto, Self or Keep", s.NextHopMode)
	}
	if p.Password, err = parseSecretRef("spec.password", s.Password); err != nil {
		return nil, err
	}
	switch s.SourceAddress {
	case "", "UseNodeIP":
	case "None":
		p.NoSourceAddress = true
	default:
		return nil, bad("spec.sourceAddress", "%q: want UseNodeIP or None", s.SourceAddress)
	}
	if p.MaxRestartTime, err = parseDuration("spec.maxRestartTime", s.MaxRestartTime); err != nil {
		return nil, err
	}
	if s.TTLSecurity != nil {
		p.TTLSecurity = *s.TTLSecurity
	}
	switch s.ReversePeering {
	case "", "Auto":
	case "Manual":
		p.ManualReverse = true
	default:
		return nil, bad("spec.reversePeering", "%q: want Auto or Manual", s.ReversePeering)
	}
	switch {
	case len(s.Filters) > 0:
		return nil, bad("spec.filters", "BGPFilter is not supported: sluice announces and learns by Calico's default rules")
	case s.ReachableBy != "":
		return nil, bad("spec.reachableBy", "not supported: sluice's sessions take the kernel's route to the peer")
	case s.LocalWorkloadSelector != "":
		return nil, bad("spec.localWorkloadSelector", "peering with local workloads is not supported")
	case s.NumAllowedLocalASNumbers != nil && *s.NumAllowedLocalASNumbers != 0:
		return nil, bad("spec.numAllowedLocalASNumbers", "not supported")
	}
	return p, nil
}

// parsePeerIP reads "ip", "ip:port" (IPv4) or "[ip]:port" (IPv6).
func parsePeerIP(s string) (netip.Addr, uint16, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a, 0, usableAddr("spec.peerIP", a)
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 {
		return netip.Addr{}, 0, bad("spec.peerIP", "%q: want an address, ip:port or [ipv6]:port", Clip(s, 60))
	}
	return ap.Addr(), ap.Port(), usableAddr("spec.peerIP", ap.Addr())
}
