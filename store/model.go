package store

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// Kind names one kind of object sluice reads.
type Kind uint8

// The kinds, in the order the index and dumps list them.
const (
	KindIPPool Kind = iota + 1
	KindNode
	KindBlock
	KindBlockAffinity
	KindWorkloadEndpoint
	KindService
	KindEndpointSlice
	KindBGPConfiguration
	KindBGPPeer
	kindEnd
)

// KindSlots is how many elements an array indexed by Kind takes (Kind 0 is none).
const KindSlots = int(kindEnd)

// Kinds lists every kind in dump order.
var Kinds = []Kind{KindIPPool, KindNode, KindBlock, KindBlockAffinity, KindWorkloadEndpoint, KindService, KindEndpointSlice,
	KindBGPConfiguration, KindBGPPeer}

// kindNames is indexed by Kind: arrays counting by kind take its length.
var kindNames = [...]string{"", "IPPool", "Node", "Block", "BlockAffinity", "WorkloadEndpoint", "Service", "EndpointSlice",
	"BGPConfiguration", "BGPPeer"}
var kindPlurals = [...]string{"", "ippools", "nodes", "blocks", "blockaffinities", "workloadendpoints", "services", "endpointslices",
	"bgpconfigurations", "bgppeers"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// Plural is the lower-case plural used on the command line and as the index table name.
func (k Kind) Plural() string {
	if int(k) < len(kindPlurals) && k != 0 {
		return kindPlurals[k]
	}
	return k.String()
}

// Namespaced reports whether names of this kind are "namespace/name".
func (k Kind) Namespaced() bool {
	return k == KindWorkloadEndpoint || k == KindService || k == KindEndpointSlice
}

// ParseKind accepts a kind's name, plural or singular, in any case ("ippools", "IPPool",
// "ippool", "wep" is not accepted: sluicectl spells kinds out).
func ParseKind(s string) (Kind, error) {
	l := strings.ToLower(s)
	if k, ok := shortNames[l]; ok {
		return k, nil
	}
	for _, k := range Kinds {
		if l == k.Plural() || l == strings.ToLower(k.String()) || l+"s" == k.Plural() || l+"es" == k.Plural() {
			return k, nil
		}
	}
	plurals := make([]string, len(Kinds))
	for i, k := range Kinds {
		plurals[i] = k.Plural()
	}
	return 0, fmt.Errorf("unknown kind %q: expected one of %s", s, strings.Join(plurals, ", "))
}

// shortNames are the short forms kubectl and calicoctl users type (`get svc`, `get wep`).
var shortNames = map[string]Kind{
	"ipp": KindIPPool, "pool": KindIPPool, "pools": KindIPPool,
	"no":  KindNode,
	"wep": KindWorkloadEndpoint, "weps": KindWorkloadEndpoint,
	"svc":      KindService,
	"affinity": KindBlockAffinity, "affinities": KindBlockAffinity,
	"bgpconfig": KindBGPConfiguration, "bgpconfigs": KindBGPConfiguration,
}

// KindNamed is the kind a manifest's `kind:` names: IPPool, Node, Block, BlockAffinity,
// WorkloadEndpoint, Service or EndpointSlice (any case; not a plural or a short name, as in
// kubectl's manifests).
func KindNamed(s string) (Kind, error) {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		if strings.EqualFold(s, k.String()) {
			return k, nil
		}
		names[i] = k.String()
	}
	return 0, fmt.Errorf("unknown kind %q: expected one of %s", s, strings.Join(names, ", "))
}

// Object is one parsed, validated object of the model.
type Object interface {
	Kind() Kind
	// ID is unique within the kind: the name, "namespace/name", the block's CIDR, or
	// "node/CIDR" for an affinity.
	ID() string
}

// EncapMode is a pool's vxlanMode or ipipMode.
type EncapMode string

// Encapsulation modes; an empty mode in etcd means Never.
const (
	EncapNever       EncapMode = "Never"
	EncapAlways      EncapMode = "Always"
	EncapCrossSubnet EncapMode = "CrossSubnet"
)

// IPPool is a range that workload addresses come from.
type IPPool struct {
	Name         string
	CIDR         netip.Prefix
	VXLANMode    EncapMode
	IPIPMode     EncapMode
	NATOutgoing  bool
	Disabled     bool
	BlockSize    int
	NodeSelector string
	AllowedUses  []string
	// DisableBGPExport keeps the pool's routes from BGP peers.
	DisableBGPExport bool
}

func (*IPPool) Kind() Kind   { return KindIPPool }
func (p *IPPool) ID() string { return p.Name }

// Node is a host in the cluster with its underlay and tunnel addresses.
//
// The IPv6 ones sit apart (V6, nil on an IPv4-only node): with every field inline a Node took
// 208 bytes, most of them empty, and an agent holds one per node in the cluster. (The IPIP
// tunnel address is checked when decoded but not kept: sluice does not route IPIP.)
type Node struct {
	Name string
	// IPv4Address is the underlay address with its subnet's prefix length, from
	// spec.bgp.ipv4Address or, without bgp, from spec.addresses (InternalIP first).
	IPv4Address         netip.Prefix
	IPv4VXLANTunnelAddr netip.Addr
	VXLANTunnelMAC      net.HardwareAddr
	V6                  *NodeV6
	// Labels are metadata.labels (nil: none), which BGP peers' selectors match.
	Labels map[string]string
	// BGP is spec.bgp's BGP settings; nil when the node has no spec.bgp, which for
	// calico/node means it runs no BGP.
	BGP *NodeBGP
}

// NodeBGP is a Node's spec.bgp beyond its addresses.
type NodeBGP struct {
	// ASNumber is spec.bgp.asNumber (0: the cluster's, from BGPConfiguration).
	ASNumber uint32
	// RouteReflectorClusterID makes the node a route reflector for this cluster ID (invalid:
	// not a reflector).
	RouteReflectorClusterID netip.Addr
}

// NodeV6 is a Node's IPv6 underlay and tunnel addresses.
type NodeV6 struct {
	// Address is from spec.bgp.ipv6Address or, without bgp, from spec.addresses.
	Address         netip.Prefix
	VXLANTunnelAddr netip.Addr
	VXLANTunnelMAC  net.HardwareAddr
}

// IPv6Address is the node's IPv6 underlay address (zero: none).
func (n *Node) IPv6Address() netip.Prefix {
	if n.V6 == nil {
		return netip.Prefix{}
	}
	return n.V6.Address
}

// IPv6VXLANTunnelAddr is the node's IPv6 VXLAN tunnel address (zero: none).
func (n *Node) IPv6VXLANTunnelAddr() netip.Addr {
	if n.V6 == nil {
		return netip.Addr{}
	}
	return n.V6.VXLANTunnelAddr
}

// VXLANTunnelMACV6 is the MAC of the node's IPv6 VTEP (nil: derived).
func (n *Node) VXLANTunnelMACV6() net.HardwareAddr {
	if n.V6 == nil {
		return nil
	}
	return n.V6.VXLANTunnelMAC
}

func (*Node) Kind() Kind   { return KindNode }
func (n *Node) ID() string { return n.Name }

// Block is an IPAM block: a CIDR, the node it is affine to, and who holds its addresses.
//
// Hazard: a block and its affinity are written in separate transactions, so for a moment
// one exists without the other; the block's own affinity field is not proof of ownership
// (see BlockAffinity.State).
type Block struct {
	CIDR netip.Prefix
	// Affinity is the raw affinity field ("host:node-a", "virtual:...", or "").
	Affinity string
	// AffinityNode is the node of a "host:" affinity, else "".
	AffinityNode string
	// Allocations lists the allocated addresses in address order.
	Allocations []Allocation
	Deleted     bool
}

// Allocation is one allocated address of a block.
type Allocation struct {
	Addr   netip.Addr
	Handle string
	// Node is the node the attributes name (secondary "node"); may differ from the
	// block's affinity for a borrowed address.
	Node string
}

func (*Block) Kind() Kind   { return KindBlock }
func (b *Block) ID() string { return b.CIDR.String() }

// AffinityState is the state of a block affinity.
type AffinityState string

// Affinity states; an empty state in etcd (older Calico) means confirmed.
const (
	AffinityConfirmed       AffinityState = "confirmed"
	AffinityPending         AffinityState = "pending"
	AffinityPendingDeletion AffinityState = "pendingDeletion"
)

// BlockAffinity says that a node claims a block.
type BlockAffinity struct {
	Node    string
	CIDR    netip.Prefix
	State   AffinityState
	Deleted bool
}

func (*BlockAffinity) Kind() Kind   { return KindBlockAffinity }
func (a *BlockAffinity) ID() string { return a.Node + "/" + a.CIDR.String() }

// WorkloadEndpoint is a workload's interface on a node and its addresses.
type WorkloadEndpoint struct {
	Namespace     string
	Name          string
	Node          string
	Orchestrator  string
	InterfaceName string
	IPNetworks    []netip.Prefix
	IPNATs        []IPNAT
	MAC           net.HardwareAddr
}

// IPNAT is a floating IP.
type IPNAT struct {
	InternalIP netip.Addr
	ExternalIP netip.Addr
}

func (*WorkloadEndpoint) Kind() Kind   { return KindWorkloadEndpoint }
func (w *WorkloadEndpoint) ID() string { return w.Namespace + "/" + w.Name }

// Protocol is a service port's transport protocol.
type Protocol string

// Protocols a service port may use.
const (
	ProtocolTCP  Protocol = "TCP"
	ProtocolUDP  Protocol = "UDP"
	ProtocolSCTP Protocol = "SCTP"
)

// ServiceType is ClusterIP, NodePort or LoadBalancer.
type ServiceType string

// Service types; an empty type means ClusterIP.
const (
	ServiceClusterIP    ServiceType = "ClusterIP"
	ServiceNodePort     ServiceType = "NodePort"
	ServiceLoadBalancer ServiceType = "LoadBalancer"
)

// TrafficPolicy is Cluster or Local.
type TrafficPolicy string

// Traffic policies; empty means Cluster.
const (
	PolicyCluster TrafficPolicy = "Cluster"
	PolicyLocal   TrafficPolicy = "Local"
)

// IP families of a service's spec.ipFamilies.
const (
	IPv4Family = "IPv4"
	IPv6Family = "IPv6"
)

// IP family policies of a service's spec.ipFamilyPolicy.
const (
	SingleStack      = "SingleStack"
	PreferDualStack  = "PreferDualStack"
	RequireDualStack = "RequireDualStack"
)

// DefaultAffinityTimeout is Kubernetes' default client-IP affinity timeout in seconds.
const DefaultAffinityTimeout = 10800

// Service is a service with its frontends' addresses and ports.
type Service struct {
	Namespace string
	Name      string
	// UID is metadata.uid: it changes when a service is deleted and created again.
	UID        string
	Type       ServiceType
	ClusterIPs []netip.Addr
	// IPFamilies is spec.ipFamilies as given (IPv4, IPv6; nil when absent): the family of
	// each of spec.clusterIPs, in order, checked against them. A headless service keeps it
	// although it has no cluster IPs. The frontends' families come from the addresses.
	IPFamilies []string
	// IPFamilyPolicy is spec.ipFamilyPolicy (SingleStack, PreferDualStack or
	// RequireDualStack). When absent it is defaulted as the apiserver does from what the
	// service names: RequireDualStack with two families (in ipFamilies or clusterIPs), else
	// SingleStack.
	IPFamilyPolicy        string
	Ports                 []ServicePortSpec
	ExternalIPs           []netip.Addr
	LoadBalancerIPs       []netip.Addr
	ExternalTrafficPolicy TrafficPolicy
	InternalTrafficPolicy TrafficPolicy
	HealthCheckNodePort   uint16
	// AffinityTimeout is the client-IP affinity timeout in seconds; 0 means no affinity.
	AffinityTimeout          int
	LoadBalancerSourceRanges []netip.Prefix
}

// ServicePortSpec is one port of a service. TargetPortName is set when the target port is
// named; else TargetPort is the number (0 means the same as Port).
type ServicePortSpec struct {
	Name           string
	Protocol       Protocol
	Port           uint16
	TargetPort     uint16
	TargetPortName string
	NodePort       uint16
}

func (*Service) Kind() Kind   { return KindService }
func (s *Service) ID() string { return s.Namespace + "/" + s.Name }

// ServiceID is the "namespace/name" of the service.
func (s *Service) ServiceID() string { return s.ID() }

// EndpointSlice is a set of a service's endpoints.
type EndpointSlice struct {
	Namespace string
	Name      string
	// Service is the name (not namespaced) of the service from kubernetes.io/service-name.
	Service     string
	AddressType string
	Endpoints   []Endpoint
	Ports       []EndpointPort
}

// Endpoint is one backend. Conditions are resolved as Kubernetes consumers do: ready
// unknown means ready, serving unknown means the same as ready, terminating unknown means no.
type Endpoint struct {
	Addresses   []netip.Addr
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
}

// EndpointPort is one port the endpoints listen on.
type EndpointPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

func (*EndpointSlice) Kind() Kind   { return KindEndpointSlice }
func (e *EndpointSlice) ID() string { return e.Namespace + "/" + e.Name }

// ServiceID is "namespace/service" of the service this slice belongs to.
func (e *EndpointSlice) ServiceID() string { return e.Namespace + "/" + e.Service }

// BGPConfiguration is Calico's BGP settings: `default` for the cluster, `node.<name>` for one
// node (which may set only the listen port and prefix advertisements, as Calico allows).
type BGPConfiguration struct {
	Name string
	// ASNumber is spec.asNumber (0: not given; the cluster's default is 64512).
	ASNumber uint32
	// NoNodeToNodeMesh is spec.nodeToNodeMeshEnabled false (absent means on).
	NoNodeToNodeMesh bool
	// ListenPort is spec.listenPort (0: not given, 179).
	ListenPort             uint16
	ServiceClusterIPs      []netip.Prefix
	ServiceExternalIPs     []netip.Prefix
	ServiceLoadBalancerIPs []netip.Prefix
	// Communities names values that PrefixAdvertisements may refer to (resolved there).
	Communities          map[string]Community
	PrefixAdvertisements []PrefixAdvertisement
	// NodeMeshPassword is the mesh sessions' password (nil: none).
	NodeMeshPassword *SecretKeyRef
	// NodeMeshMaxRestartTime is the mesh sessions' graceful restart time (0: the default).
	NodeMeshMaxRestartTime time.Duration
}

func (*BGPConfiguration) Kind() Kind   { return KindBGPConfiguration }
func (c *BGPConfiguration) ID() string { return c.Name }

// NodeConfigPrefix starts the name of a node's own BGPConfiguration ("node.<name>").
const NodeConfigPrefix = "node."

// Community is a BGP community: standard (Large false: A:B, each 16 bits) or large (A:B:C,
// each 32 bits).
type Community struct {
	Large   bool
	A, B, C uint32
}

func (c Community) String() string {
	if c.Large {
		return fmt.Sprintf("%d:%d:%d", c.A, c.B, c.C)
	}
	return fmt.Sprintf("%d:%d", c.A, c.B)
}

// PrefixAdvertisement gives the routes within CIDR communities (resolved from names).
type PrefixAdvertisement struct {
	CIDR        netip.Prefix
	Communities []Community
}

// SecretKeyRef names one key of a secret; sluiced reads it from a file on the node.
type SecretKeyRef struct {
	Name, Key string
}

// Next-hop modes of a BGPPeer (spec.nextHopMode; keepOriginalNextHop means Keep).
const (
	NextHopAuto = "Auto"
	NextHopSelf = "Self"
	NextHopKeep = "Keep"
)

// BGPPeer is Calico's BGPPeer: which nodes peer (Node, NodeSelector, or every node when both
// are empty) with whom (PeerIP, or the nodes PeerSelector selects).
type BGPPeer struct {
	Name         string
	Node         string
	NodeSelector Selector
	PeerSelector Selector
	PeerIP       netip.Addr
	// PeerPort is the port of peerIP's "ip:port" form (0: 179).
	PeerPort      uint16
	ASNumber      uint32
	LocalASNumber uint32
	NextHopMode   string
	Password      *SecretKeyRef
	// NoSourceAddress is sourceAddress None: the kernel picks the session's source address
	// (by default it is the node's own address).
	NoSourceAddress bool
	MaxRestartTime  time.Duration
	TTLSecurity     uint8
	// ManualReverse is reversePeering Manual: the selected peers do not peer back by
	// themselves.
	ManualReverse bool
}

func (*BGPPeer) Kind() Kind   { return KindBGPPeer }
func (p *BGPPeer) ID() string { return p.Name }
