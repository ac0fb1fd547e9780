package store

import "encoding/json"

// This file holds the JSON shapes exactly as they sit in etcd: the Calico v3 resources and
// IPAM values that calicoctl, calico-ipam and networking-calico write, and sluice's own
// Kubernetes-shaped services. Decode turns them into the parsed model (model.go);
// sluicectl marshals them to write keys that Calico's own tools read back unchanged.

// API versions and kinds as they appear in stored values.
const (
	CalicoAPIVersion        = "projectcalico.org/v3"
	ServiceAPIVersion       = "v1"
	EndpointSliceAPIVersion = "discovery.k8s.io/v1"
)

// TypeMeta is the kind and apiVersion pair at the top of every resource.
type TypeMeta struct {
	Kind       string `json:"kind,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
}

// ObjectMeta is the subset of Kubernetes object metadata that Calico stores.
type ObjectMeta struct {
	Name              string            `json:"name,omitempty"`
	Namespace         string            `json:"namespace,omitempty"`
	UID               string            `json:"uid,omitempty"`
	CreationTimestamp string            `json:"creationTimestamp,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
}

// IPPoolResource is Calico's projectcalico.org/v3 IPPool.
type IPPoolResource struct {
	TypeMeta
	Metadata ObjectMeta `json:"metadata"`
	Spec     IPPoolSpec `json:"spec"`
}

// IPPoolSpec is the spec of an IPPoolResource.
type IPPoolSpec struct {
	CIDR             string   `json:"cidr"`
	VXLANMode        string   `json:"vxlanMode,omitempty"`
	IPIPMode         string   `json:"ipipMode,omitempty"`
	NATOutgoing      bool     `json:"natOutgoing,omitempty"`
	Disabled         bool     `json:"disabled,omitempty"`
	DisableBGPExport bool     `json:"disableBGPExport,omitempty"`
	BlockSize        int      `json:"blockSize,omitempty"`
	NodeSelector     string   `json:"nodeSelector,omitempty"`
	AllowedUses      []string `json:"allowedUses,omitempty"`
}

// NodeResource is Calico's projectcalico.org/v3 Node.
type NodeResource struct {
	TypeMeta
	Metadata ObjectMeta `json:"metadata"`
	Spec     NodeSpec   `json:"spec"`
}

// NodeSpec is the spec of a NodeResource.
type NodeSpec struct {
	BGP                  *NodeBGPSpec  `json:"bgp,omitempty"`
	IPv4VXLANTunnelAddr  string        `json:"ipv4VXLANTunnelAddr,omitempty"`
	VXLANTunnelMACAddr   string        `json:"vxlanTunnelMACAddr,omitempty"`
	IPv6VXLANTunnelAddr  string        `json:"ipv6VXLANTunnelAddr,omitempty"`
	VXLANTunnelMACAddrV6 string        `json:"vxlanTunnelMACAddrV6,omitempty"`
	Addresses            []NodeAddress `json:"addresses,omitempty"`
}

// NodeBGPSpec carries the node's underlay addresses, in CIDR form.
type NodeBGPSpec struct {
	IPv4Address             string `json:"ipv4Address,omitempty"`
	IPv6Address             string `json:"ipv6Address,omitempty"`
	IPv4IPIPTunnelAddr      string `json:"ipv4IPIPTunnelAddr,omitempty"`
	ASNumber                *int64 `json:"asNumber,omitempty"`
	RouteReflectorClusterID string `json:"routeReflectorClusterID,omitempty"`
}

// NodeAddress is one entry of spec.addresses.
type NodeAddress struct {
	Address string `json:"address"`
	Type    string `json:"type,omitempty"`
}

// WorkloadEndpointResource is Calico's projectcalico.org/v3 WorkloadEndpoint.
type WorkloadEndpointResource struct {
	TypeMeta
	Metadata ObjectMeta           `json:"metadata"`
	Spec     WorkloadEndpointSpec `json:"spec"`
}

// WorkloadEndpointSpec is the spec of a WorkloadEndpointResource.
type WorkloadEndpointSpec struct {
	Orchestrator  string      `json:"orchestrator,omitempty"`
	Workload      string      `json:"workload,omitempty"`
	Node          string      `json:"node,omitempty"`
	ContainerID   string      `json:"containerID,omitempty"`
	Pod           string      `json:"pod,omitempty"`
	Endpoint      string      `json:"endpoint,omitempty"`
	IPNetworks    []string    `json:"ipNetworks,omitempty"`
	IPNATs        []IPNATSpec `json:"ipNATs,omitempty"`
	IPv4Gateway   string      `json:"ipv4Gateway,omitempty"`
	IPv6Gateway   string      `json:"ipv6Gateway,omitempty"`
	Profiles      []string    `json:"profiles,omitempty"`
	InterfaceName string      `json:"interfaceName,omitempty"`
	MAC           string      `json:"mac,omitempty"`
}

// IPNATSpec is a floating IP: traffic to ExternalIP is NATed to InternalIP.
type IPNATSpec struct {
	InternalIP string `json:"internalIP"`
	ExternalIP string `json:"externalIP"`
}

// AllocationBlock is calico-ipam's block value.
type AllocationBlock struct {
	CIDR                        string                `json:"cidr"`
	Affinity                    *string               `json:"affinity"`
	StrictAffinity              bool                  `json:"strictAffinity"`
	Allocations                 []*int                `json:"allocations"`
	Unallocated                 []int                 `json:"unallocated"`
	Attributes                  []AllocationAttribute `json:"attributes"`
	Deleted                     bool                  `json:"deleted"`
	SequenceNumber              uint64                `json:"sequenceNumber"`
	SequenceNumberForAllocation map[string]uint64     `json:"sequenceNumberForAllocation"`
}

// AllocationAttribute says who holds an allocated address.
type AllocationAttribute struct {
	HandleID  *string           `json:"handle_id,omitempty"`
	Secondary map[string]string `json:"secondary,omitempty"`
}

// BlockAffinityValue is calico-ipam's host affinity value.
type BlockAffinityValue struct {
	State   string `json:"state"`
	Deleted bool   `json:"deleted"`
}

// IPAMHandle is calico-ipam's handle value: how many addresses the handle holds per block.
type IPAMHandle struct {
	Block   map[string]int `json:"block"`
	Deleted bool           `json:"deleted"`
}

// ServiceResource is sluice's service, shaped like Kubernetes v1/Service.
type ServiceResource struct {
	TypeMeta
	Metadata ObjectMeta    `json:"metadata"`
	Spec     ServiceSpec   `json:"spec"`
	Status   ServiceStatus `json:"status,omitempty"`
}

// ServiceSpec is the spec of a ServiceResource.
type ServiceSpec struct {
	Type                     string                 `json:"type,omitempty"`
	ClusterIP                string                 `json:"clusterIP,omitempty"`
	ClusterIPs               []string               `json:"clusterIPs,omitempty"`
	Ports                    []ServicePort          `json:"ports,omitempty"`
	ExternalIPs              []string               `json:"externalIPs,omitempty"`
	ExternalTrafficPolicy    string                 `json:"externalTrafficPolicy,omitempty"`
	InternalTrafficPolicy    string                 `json:"internalTrafficPolicy,omitempty"`
	HealthCheckNodePort      int                    `json:"healthCheckNodePort,omitempty"`
	SessionAffinity          string                 `json:"sessionAffinity,omitempty"`
	SessionAffinityConfig    *SessionAffinityConfig `json:"sessionAffinityConfig,omitempty"`
	LoadBalancerSourceRanges []string               `json:"loadBalancerSourceRanges,omitempty"`
}

// ServicePort is one port of a service. TargetPort is a number or a port name.
type ServicePort struct {
	Name       string          `json:"name,omitempty"`
	Protocol   string          `json:"protocol,omitempty"`
	Port       int             `json:"port"`
	TargetPort json.RawMessage `json:"targetPort,omitempty"`
	NodePort   int             `json:"nodePort,omitempty"`
}

// SessionAffinityConfig holds the client-IP affinity timeout.
type SessionAffinityConfig struct {
	ClientIP *ClientIPConfig `json:"clientIP,omitempty"`
}

// ClientIPConfig holds the affinity timeout in seconds.
type ClientIPConfig struct {
	TimeoutSeconds *int `json:"timeoutSeconds,omitempty"`
}

// ServiceStatus carries the load balancer's ingress addresses.
type ServiceStatus struct {
	LoadBalancer LoadBalancerStatus `json:"loadBalancer,omitempty"`
}

// LoadBalancerStatus lists ingress points.
type LoadBalancerStatus struct {
	Ingress []LoadBalancerIngress `json:"ingress,omitempty"`
}

// LoadBalancerIngress is one ingress point; only IP matters to sluice.
type LoadBalancerIngress struct {
	IP       string `json:"ip,omitempty"`
	Hostname string `json:"hostname,omitempty"`
}

// EndpointSliceResource is sluice's endpoint slice, shaped like discovery.k8s.io/v1.
type EndpointSliceResource struct {
	TypeMeta
	Metadata    ObjectMeta         `json:"metadata"`
	AddressType string             `json:"addressType"`
	Endpoints   []EndpointResource `json:"endpoints"`
	Ports       []EndpointPortWire `json:"ports"`
}

// EndpointResource is one endpoint of a slice.
type EndpointResource struct {
	Addresses  []string           `json:"addresses"`
	Conditions EndpointConditions `json:"conditions,omitempty"`
	NodeName   string             `json:"nodeName,omitempty"`
	Zone       string             `json:"zone,omitempty"`
}

// EndpointConditions are tri-state, as in Kubernetes: nil means unknown.
type EndpointConditions struct {
	Ready       *bool `json:"ready,omitempty"`
	Serving     *bool `json:"serving,omitempty"`
	Terminating *bool `json:"terminating,omitempty"`
}

// EndpointPortWire is one port of a slice.
type EndpointPortWire struct {
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol,omitempty"`
	Port     *int   `json:"port,omitempty"`
}

// ServiceNameLabel ties an endpoint slice to its service.
const ServiceNameLabel = "kubernetes.io/service-name"
