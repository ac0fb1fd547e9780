package calc

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-net/sluice/store"
)

// RouteSource says where routes come from.
type RouteSource string

// Route sources.
const (
	// SourceCalicoIPAM: routes come from IPAM blocks and their affinities.
	SourceCalicoIPAM RouteSource = "CalicoIPAM"
	// SourceWorkloadIPs: routes come from workload endpoints (OpenStack, no blocks).
	SourceWorkloadIPs RouteSource = "WorkloadIPs"
)

// RouteType is the kernel route type.
type RouteType string

// Route types.
const (
	RouteUnicast     RouteType = "unicast"
	RouteBlackhole   RouteType = "blackhole"
	RouteUnreachable RouteType = "unreachable"
	RouteProhibit    RouteType = "prohibit"
)

// ParentDevice stands for the interface that holds this node's underlay address; the
// dataplane resolves it.
const ParentDevice = "@parent"

// DeviceName is how a route's device reads in text meant for people: ParentDevice, which no
// interface is named, as "uplink" (the interface holding the node's own address, found on the
// node).
func DeviceName(d string) string {
	if d == ParentDevice {
		return "uplink"
	}
	return d
}

// Config is the agent's configuration as far as calc is concerned.
type Config struct {
	NodeName    string
	RouteSource RouteSource
	VXLAN       bool
	// VXLANDevice is the name of sluice's VXLAN device; VXLANDeviceV6 of its IPv6 one (IPv6
	// tunnel addresses over an IPv6 underlay).
	VXLANDevice   string
	VXLANDeviceV6 string
	// BlackholeType is the type of the routes for local blocks: blackhole, unreachable or prohibit.
	BlackholeType RouteType
	// BlackholeMetric is the metric of local-block blackholes (high, so an operator's route wins).
	BlackholeMetric int
	// PoolBlackholes adds a lowest-priority blackhole for each whole pool (off by default: a
	// pool may share its range with other address users).
	PoolBlackholes bool
	// PoolBlackholeMetric is the metric of pool blackholes; default BlackholeMetric+1.
	PoolBlackholeMetric int
	// NATOutgoingExclusions says which destinations traffic from natOutgoing pools reaches
	// with its workload address kept, as Calico's FelixConfiguration field of that name:
	// IPPoolsOnly (default) or IPPoolsAndHostIPs (nodes' addresses too).
	NATOutgoingExclusions NATExclusions
	// BGP runs this node's BGP speaker (when its Node has spec.bgp): calc then computes the
	// speaker, its sessions and what it announces.
	BGP bool
	// BGPDefaultRouteMetric programs a default route BGP learned, at this metric: 0 never
	// does (calico/node's rule, and the default). A metric of its own keeps it beside the
	// node's own default route, which it never replaces: the lower metric wins.
	BGPDefaultRouteMetric int
}

// NATExclusions is Calico's natOutgoingExclusions.
type NATExclusions string

// The values of NATExclusions.
const (
	NATExcludePools         NATExclusions = "IPPoolsOnly"
	NATExcludePoolsAndHosts NATExclusions = "IPPoolsAndHostIPs"
)

// The default names of sluice's VXLAN devices (Calico's are vxlan.calico and vxlan-v6.calico).
const (
	DefaultVXLANDevice   = "vxlan.sluice"
	DefaultVXLANDeviceV6 = "vxlan-v6.sluice"
)

// DefaultConfig returns the defaults for node.
func DefaultConfig(node string) Config {
	return Config{NodeName: node, RouteSource: SourceCalicoIPAM, VXLAN: true, VXLANDevice: DefaultVXLANDevice,
		VXLANDeviceV6: DefaultVXLANDeviceV6, BlackholeType: RouteBlackhole, BlackholeMetric: 1024, NATOutgoingExclusions: NATExcludePools}
}

// oneOf sets an empty *v to the first of allowed, and refuses a value not among them.
func oneOf[T ~string](v *T, what string, allowed ...T) error {
	if *v == "" {
		*v = allowed[0]
		return nil
	}
	if slices.Contains(allowed, *v) {
		return nil
	}
	want := make([]string, len(allowed))
	for i, a := range allowed {
		want[i] = string(a)
	}
	last := len(want) - 1
	return fmt.Errorf("calc: %s %q: want %s or %s", what, *v, strings.Join(want[:last], ", "), want[last])
}

func (c *Config) normalise() error {
	if c.NodeName == "" {
		return fmt.Errorf("calc: node name is required")
	}
	if err := oneOf(&c.RouteSource, "route source", SourceCalicoIPAM, SourceWorkloadIPs); err != nil {
		return err
	}
	if err := oneOf(&c.NATOutgoingExclusions, "natOutgoingExclusions", NATExcludePools, NATExcludePoolsAndHosts); err != nil {
		return err
	}
	if err := oneOf(&c.BlackholeType, "blackhole type", RouteBlackhole, RouteUnreachable, RouteProhibit); err != nil {
		return err
	}
	if c.VXLANDevice == "" {
		c.VXLANDevice = DefaultVXLANDevice
	}
	if c.VXLANDeviceV6 == "" {
		c.VXLANDeviceV6 = DefaultVXLANDeviceV6
	}
	if c.VXLANDevice == c.VXLANDeviceV6 {
		return fmt.Errorf("calc: the IPv4 and IPv6 VXLAN devices are both named %q", c.VXLANDevice)
	}
	if c.BlackholeMetric == 0 {
		c.BlackholeMetric = 1024
	}
	if c.PoolBlackholeMetric == 0 {
		c.PoolBlackholeMetric = c.BlackholeMetric + 1
	}
	return nil
}

// RouteReason says why a route is wanted; it is shown to people and does not reach the kernel.
type RouteReason string

// Route reasons.
const (
	ReasonLocalWorkload  RouteReason = "local-workload"
	ReasonRemoteBlock    RouteReason = "remote-block"
	ReasonBorrowed       RouteReason = "borrowed"
	ReasonRemoteTunnel   RouteReason = "remote-tunnel"
	ReasonRemoteWorkload RouteReason = "remote-workload"
	ReasonLocalBlock     RouteReason = "local-block"
	ReasonPool           RouteReason = "pool"
	// ReasonFloatingIP: a workload's floating IP (ipNATs' externalIP), routed as the
	// workload's own address: to its interface on its node, to its node from the others.
	ReasonFloatingIP RouteReason = "floating-ip"
	// ReasonBGP: learned from a BGP peer (a pool without encapsulation, another node's block
	// in it, or the fabric's), as calico/node's BIRD programs it.
	ReasonBGP RouteReason = "bgp"
)

// Route is one desired route in sluice's table.
type Route struct {
	Dst     netip.Prefix `json:"dst"`
	Type    RouteType    `json:"type"`
	Device  string       `json:"device"`
	Gateway netip.Addr   `json:"gateway"`
	// Multipath holds the route's other gateways, on the same device, sorted: equal-cost
	// multipath (a prefix BGP learned over several equal paths). Gateway is the lowest; nil
	// for a route with one gateway.
	Multipath []netip.Addr `json:"multipath,omitempty"`
	// Recursive says Gateway is on no link of this node: the kernel's own route to it (the
	// default route, say) gives the route its gateway and device, as BIRD's "gateway
	// recursive" resolves a BGP next hop through the kernel routes it learned. Device is
	// then unset.
	Recursive bool        `json:"recursive,omitempty"`
	OnLink    bool        `json:"onLink"`
	Metric    int         `json:"metric"`
	Reason    RouteReason `json:"reason"`
	// Node is the node the route leads to ("" for local routes and blackholes).
	Node string `json:"node"`
}

// Equal says whether two routes are the same.
func (r Route) Equal(o Route) bool {
	return r.Dst == o.Dst && r.Type == o.Type && r.Device == o.Device && r.Gateway == o.Gateway && slices.Equal(r.Multipath, o.Multipath) && r.Recursive == o.Recursive &&
		r.OnLink == o.OnLink && r.Metric == o.Metric && r.Reason == o.Reason && r.Node == o.Node
}

// Gateways lists the route's gateways: Gateway and the multipath ones (none for a route
// without a gateway).
func (r Route) Gateways() []netip.Addr {
	if !r.Gateway.IsValid() {
		return nil
	}
	return append([]netip.Addr{r.Gateway}, r.Multipath...)
}

func (r Route) String() string {
	var b strings.Builder
	if r.Type != RouteUnicast {
		b.WriteString(string(r.Type) + " ")
	}
	b.WriteString(r.Dst.String())
	if r.Gateway.IsValid() {
		b.WriteString(" via " + r.Gateway.String())
	}
	for _, gw := range r.Multipath {
		b.WriteString(" via " + gw.String())
	}
	if r.Recursive {
		b.WriteString(" recursive")
	}
	if r.Device != "" {
		b.WriteString(" dev " + DeviceName(r.Device))
	}
	if r.OnLink {
		b.WriteString(" onlink")
	}
	if r.Metric != 0 {
		fmt.Fprintf(&b, " metric %d", r.Metric)
	}
	return b.String()
}

// VTEP is a VXLAN tunnel endpoint: a node's tunnel address and MAC, reached at its underlay
// address. Local is true for this node's own VTEP (the device's address and MAC).
type VTEP struct {
	Node       string           `json:"node"`
	TunnelAddr netip.Addr       `json:"tunnelAddr"`
	MAC        net.HardwareAddr `json:"mac"`
	Underlay   netip.Addr       `json:"underlay"`
	Local      bool             `json:"local"`
}

// VTEPKey identifies a VTEP: a node and an address family.
type VTEPKey struct {
	Node string
	IPv6 bool
}

// Key returns the VTEP's key.
func (v VTEP) Key() VTEPKey { return VTEPKey{Node: v.Node, IPv6: v.TunnelAddr.Is6()} }

func (v VTEP) String() string {
	l := ""
	if v.Local {
		l = " (local)"
	}
	return fmt.Sprintf("%s %s mac %s underlay %s%s", v.Node, v.TunnelAddr, v.MAC, v.Underlay, l)
}

// FrontendKind says how a frontend address is reached.
type FrontendKind string

// Frontend kinds.
const (
	FrontendClusterIP    FrontendKind = "cluster-ip"
	FrontendExternalIP   FrontendKind = "external-ip"
	FrontendLoadBalancer FrontendKind = "load-balancer"
	FrontendNodePort     FrontendKind = "node-port"
)

// FrontendKey identifies a frontend: address, port and protocol. A node port's wildcard
// entry has the unspecified address (0.0.0.0 or ::).
type FrontendKey struct {
	Addr     netip.Addr     `json:"addr"`
	Port     uint16         `json:"port"`
	Protocol store.Protocol `json:"protocol"`
}

func (k FrontendKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Protocol)
}

// Backend is one endpoint a frontend forwards to.
type Backend struct {
	Addr netip.Addr `json:"addr"`
	Port uint16     `json:"port"`
	Node string     `json:"node"`
	// NodeAddr is the underlay address of Node in the backend's family (where node-port
	// traffic is tunnelled to reach the backend); invalid when the node is unknown or has no
	// address of that family.
	//
	// Hazard: it is an input of the frontend like any other, so a node's underlay address
	// changing must recompute every service with an endpoint on that node, or the frontend
	// keeps tunnelling to the old address.
	NodeAddr netip.Addr `json:"nodeAddr"`
	// Terminating is set when the backend is used only because no endpoint is ready.
	Terminating bool `json:"terminating"`
}

// Frontend is one address:port:protocol a service answers on, with its backends.
//
// Backends holds two overlapping ranges: the node-local set is Backends[:LocalBackends] and
// the cluster-wide set is Backends[ClusterStart:]. Each set has its own terminating fallback
// (as in kube-proxy), so a local set made of terminating endpoints is not mixed into a
// cluster set of ready ones: such entries sit before ClusterStart. In the common case
// ClusterStart is 0 and the list is simply "local first, then the rest".
//
// Hazard: forwarding cluster-policy traffic to Backends[:] instead of Backends[ClusterStart:]
// would send connections to terminating endpoints while ready ones exist.
type Frontend struct {
	Key       FrontendKey  `json:"key"`
	Kind      FrontendKind `json:"kind"`
	Service   string       `json:"service"` // "namespace/name"
	ServiceID uint64       `json:"serviceID"`
	PortName  string       `json:"portName"`
	// ExternalLocal: traffic from outside the cluster goes only to local backends
	// (externalTrafficPolicy Local on node-port, load-balancer and external-IP frontends).
	ExternalLocal bool `json:"externalLocal"`
	// InternalLocal: traffic from inside the cluster to the cluster IP goes only to local
	// backends (internalTrafficPolicy Local).
	InternalLocal bool `json:"internalLocal"`
	// AffinityTimeout is the client-IP affinity timeout in seconds; 0 means none.
	AffinityTimeout int `json:"affinityTimeout"`
	// SourceRanges limits clients of load-balancer frontends; empty means any.
	SourceRanges  []netip.Prefix `json:"sourceRanges"`
	Backends      []Backend      `json:"backends"`
	LocalBackends int            `json:"localBackends"`
	ClusterStart  int            `json:"clusterStart"`
	// Present lists every endpoint of the port the slices still name (of the frontend's
	// family), used or not: established flows to one of them are kept (a terminating
	// endpoint drains); flows to an endpoint no longer present are stale.
	Present []netip.AddrPort `json:"present"`
}

// HealthCheck is a health-check node port and what it should answer.
type HealthCheck struct {
	Port    uint16 `json:"port"`
	Service string `json:"service"`
	// LocalEndpoints counts the local ready endpoints of the families the load balancer
	// reaches this node on (its ingress addresses' families; both when it has none).
	LocalEndpoints int `json:"localEndpoints"`
	// LocalIPv4 and LocalIPv6 count them by family: a check over IPv4 is answered with the
	// IPv4 count, one over IPv6 with the IPv6 count, as each family forwards alone.
	LocalIPv4 int `json:"localIPv4"`
	LocalIPv6 int `json:"localIPv6"`
}

// ClusterNet is a range of addresses inside the cluster: an IP pool's CIDR (Host false, Node
// "", disabled pools too) or a node's underlay address as a /32 or /128 (Host true, Node its
// name). The service stage tells traffic from inside the cluster by these (externalTrafficPolicy
// Local applies only to traffic from outside) and drops tunnelled packets whose outer source is
// not a known node.
//
// Keyed by prefix: a node's address wins over a pool of the same prefix, and when two nodes
// claim one address the node whose name sorts first wins (the clash is a Problem), so the
// result does not depend on which node was written last.
//
// The same list decides outgoing NAT (Calico's natOutgoing): traffic from a workload address
// in a net with Masquerade (a pool with natOutgoing, disabled or not) to an address in no net
// with KeepSource (every pool; nodes' addresses too when Config.NATOutgoingExclusions says
// so) leaves with the node's address as its source.
type ClusterNet struct {
	Prefix     netip.Prefix `json:"prefix"`
	Host       bool         `json:"host"`
	Node       string       `json:"node"`
	Masquerade bool         `json:"masquerade,omitempty"`
	KeepSource bool         `json:"keepSource,omitempty"`
}

func (c ClusterNet) String() string {
	s := c.Prefix.String() + " pool"
	if c.Host {
		s = c.Prefix.String() + " node " + c.Node
	}
	if c.Masquerade {
		s += " masquerade"
	}
	if c.KeepSource {
		s += " keep-source"
	}
	return s
}

// FloatingIP is an OpenStack floating IP (ipNATs on a workload endpoint) of a workload on this
// node: traffic to External reaches the workload at Internal; traffic the workload sends
// from Internal out of the cluster leaves from External. Keyed by External.
type FloatingIP struct {
	External netip.Addr `json:"external"`
	Internal netip.Addr `json:"internal"`
	Workload string     `json:"workload"`
}

func (f FloatingIP) String() string {
	return f.External.String() + " -> " + f.Internal.String() + " (" + f.Workload + ")"
}

// Problem is something in the input that calc cannot act on, keyed so each is reported once.
type Problem struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
}
