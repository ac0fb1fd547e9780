package store

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Key prefixes, exactly as Calico's etcdv3 datastore and sluice lay them out.
const (
	CalicoResourcePrefix   = "/calico/resources/v3/projectcalico.org/"
	IPPoolPrefix           = CalicoResourcePrefix + "ippools/"
	NodePrefix             = CalicoResourcePrefix + "nodes/"
	WorkloadEndpointPrefix = CalicoResourcePrefix + "workloadendpoints/"
	BGPConfigPrefix        = CalicoResourcePrefix + "bgpconfigurations/"
	BGPPeerPrefix          = CalicoResourcePrefix + "bgppeers/"
	BlockPrefix            = "/calico/ipam/v2/assignment/"
	AffinityPrefix         = "/calico/ipam/v2/host/"
	HandlePrefix           = "/calico/ipam/v2/handle/"
	ServicePrefix          = "/sluice/v1/services/"
	EndpointSlicePrefix    = "/sluice/v1/endpointslices/"
)

// WatchedPrefixes are the prefixes the intake lists and watches.
var WatchedPrefixes = []string{IPPoolPrefix, NodePrefix, BlockPrefix, AffinityPrefix, WorkloadEndpointPrefix, ServicePrefix, EndpointSlicePrefix,
	BGPConfigPrefix, BGPPeerPrefix}

// NodePrefixes are the prefixes one node's agent lists and watches: WatchedPrefixes with the
// block affinities narrowed to the node's own. Routes come from the blocks themselves (each
// names its node); an affinity's state matters only for this node's blackholes, and the
// other nodes' affinities are as many keys again as there are blocks.
func NodePrefixes(node string) []string {
	out := make([]string, len(WatchedPrefixes))
	for i, p := range WatchedPrefixes {
		if p == AffinityPrefix {
			p = AffinityPrefix + node + "/"
		}
		out[i] = p
	}
	return out
}

// ErrUnknownKey is returned for a key under a watched prefix whose layout sluice does not know.
var ErrUnknownKey = errors.New("key layout not recognised")

// ParseKey returns the kind and ID a key stands for.
func ParseKey(key string) (Kind, string, error) {
	switch {
	case strings.HasPrefix(key, IPPoolPrefix):
		return simpleName(KindIPPool, key, IPPoolPrefix)
	case strings.HasPrefix(key, NodePrefix):
		return simpleName(KindNode, key, NodePrefix)
	case strings.HasPrefix(key, BGPConfigPrefix):
		return simpleName(KindBGPConfiguration, key, BGPConfigPrefix)
	case strings.HasPrefix(key, BGPPeerPrefix):
		return simpleName(KindBGPPeer, key, BGPPeerPrefix)
	case strings.HasPrefix(key, WorkloadEndpointPrefix):
		return namespacedName(KindWorkloadEndpoint, key, WorkloadEndpointPrefix)
	case strings.HasPrefix(key, ServicePrefix):
		return namespacedName(KindService, key, ServicePrefix)
	case strings.HasPrefix(key, EndpointSlicePrefix):
		return namespacedName(KindEndpointSlice, key, EndpointSlicePrefix)
	case strings.HasPrefix(key, BlockPrefix):
		// ipv4/block/10.65.0.0-26
		parts := strings.Split(key[len(BlockPrefix):], "/")
		if len(parts) != 3 || parts[1] != "block" {
			return 0, "", fmt.Errorf("%w: want %s<ipv4|ipv6>/block/<cidr>", ErrUnknownKey, BlockPrefix)
		}
		cidr, err := keyCIDR(parts[0], parts[2])
		if err != nil {
			return 0, "", err
		}
		return KindBlock, cidr.String(), nil
	case strings.HasPrefix(key, AffinityPrefix):
		// node-a/ipv4/block/10.65.0.0-26
		parts := strings.Split(key[len(AffinityPrefix):], "/")
		if len(parts) != 4 || parts[2] != "block" || parts[0] == "" {
			return 0, "", fmt.Errorf("%w: want %s<node>/<ipv4|ipv6>/block/<cidr>", ErrUnknownKey, AffinityPrefix)
		}
		cidr, err := keyCIDR(parts[1], parts[3])
		if err != nil {
			return 0, "", err
		}
		return KindBlockAffinity, parts[0] + "/" + cidr.String(), nil
	}
	return 0, "", ErrUnknownKey
}

func simpleName(k Kind, key, prefix string) (Kind, string, error) {
	name := key[len(prefix):]
	if name == "" || strings.Contains(name, "/") {
		return 0, "", fmt.Errorf("%w: want %s<name>", ErrUnknownKey, prefix)
	}
	// A copy: a name kept by the objects built from it must not keep the whole key (and at
	// 20,000 nodes, 20,000 keys of 55 bytes) alive.
	return k, strings.Clone(name), nil
}

func namespacedName(k Kind, key, prefix string) (Kind, string, error) {
	ns, name, ok := strings.Cut(key[len(prefix):], "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return 0, "", fmt.Errorf("%w: want %s<namespace>/<name>", ErrUnknownKey, prefix)
	}
	return k, ns + "/" + name, nil
}

// keyCIDR parses "10.65.0.0-26" under a family segment "ipv4" or "ipv6".
func keyCIDR(family, s string) (netip.Prefix, error) {
	i := strings.LastIndexByte(s, '-')
	if i < 0 {
		return netip.Prefix{}, fmt.Errorf("%w: block %q has no '-<length>'", ErrUnknownKey, s)
	}
	p, err := netip.ParsePrefix(s[:i] + "/" + s[i+1:])
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%w: block %q: %v", ErrUnknownKey, s, err)
	}
	if (family == "ipv4") != p.Addr().Is4() || (family != "ipv4" && family != "ipv6") {
		return netip.Prefix{}, fmt.Errorf("%w: block %q under family %q", ErrUnknownKey, s, family)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%w: block %q is not a network address", ErrUnknownKey, s)
	}
	return p, nil
}

func cidrKeyPart(p netip.Prefix) string {
	return fmt.Sprintf("%s-%d", p.Addr(), p.Bits())
}

func familyOf(p netip.Prefix) string {
	if p.Addr().Is4() {
		return "ipv4"
	}
	return "ipv6"
}

// KindPrefix is the etcd prefix under which every key of kind k lives.
func KindPrefix(k Kind) string {
	switch k {
	case KindIPPool:
		return IPPoolPrefix
	case KindNode:
		return NodePrefix
	case KindBlock:
		return BlockPrefix
	case KindBlockAffinity:
		return AffinityPrefix
	case KindWorkloadEndpoint:
		return WorkloadEndpointPrefix
	case KindService:
		return ServicePrefix
	case KindEndpointSlice:
		return EndpointSlicePrefix
	case KindBGPConfiguration:
		return BGPConfigPrefix
	case KindBGPPeer:
		return BGPPeerPrefix
	}
	return ""
}

// KeyFor returns the etcd key of an object of kind k with the given ID.
func KeyFor(k Kind, id string) (string, error) {
	switch k {
	case KindIPPool, KindNode, KindWorkloadEndpoint, KindService, KindEndpointSlice, KindBGPConfiguration, KindBGPPeer:
		return KindPrefix(k) + id, nil
	case KindBlock:
		p, err := netip.ParsePrefix(id)
		if err != nil {
			return "", fmt.Errorf("block name %q: want a CIDR: %w", id, err)
		}
		return BlockKey(p), nil
	case KindBlockAffinity:
		node, cidr, ok := strings.Cut(id, "/")
		p, err := netip.ParsePrefix(cidr)
		if !ok || err != nil {
			return "", fmt.Errorf("block affinity name %q: want <node>/<cidr>", id)
		}
		return AffinityKey(node, p), nil
	}
	return "", fmt.Errorf("no key for kind %v", k)
}

// BlockKey is the key of the IPAM block for cidr.
func BlockKey(cidr netip.Prefix) string {
	return BlockPrefix + familyOf(cidr) + "/block/" + cidrKeyPart(cidr)
}

// AffinityKey is the key of node's affinity for the block cidr.
func AffinityKey(node string, cidr netip.Prefix) string {
	return AffinityPrefix + node + "/" + familyOf(cidr) + "/block/" + cidrKeyPart(cidr)
}

// HandleKey is the key of an IPAM handle.
func HandleKey(handle string) string { return HandlePrefix + handle }
