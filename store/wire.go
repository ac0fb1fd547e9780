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

// ObjectMeta is Kubernetes object metadata (metav1.ObjectMeta), field for field, as
// calicoctl and kubectl print it. sluice uses the name, namespace, uid and labels; the rest is
// accepted so that a `kubectl get -o yaml` or `calicoctl get -o yaml` applies as printed.
// sluicectl drops the apiserver's bookkeeping (resourceVersion, generation, managedFields,
// selfLink, deletion*) before writing: it describes another store's copy, and its timestamps
// would make every re-applied dump an update.
type ObjectMeta struct {
	Name                       string               `json:"name,omitempty"`
	GenerateName               string               `json:"generateName,omitempty"`
	Namespace                  string               `json:"namespace,omitempty"`
	SelfLink                   string               `json:"selfLink,omitempty"`
	UID                        string               `json:"uid,omitempty"`
	ResourceVersion            string               `json:"resourceVersion,omitempty"`
	Generation                 int64                `json:"generation,omitempty"`
	CreationTimestamp          string               `json:"creationTimestamp,omitempty"`
	DeletionTimestamp          string               `json:"deletionTimestamp,omitempty"`
	DeletionGracePeriodSeconds *int64               `json:"deletionGracePeriodSeconds,omitempty"`
	Labels                     map[string]string    `json:"labels,omitempty"`
	Annotations                map[string]string    `json:"annotations,omitempty"`
	OwnerReferences            []OwnerReference     `json:"ownerReferences,omitempty"`
	Finalizers                 []string             `json:"finalizers,omitempty"`
	ManagedFields              []ManagedFieldsEntry `json:"managedFields,omitempty"`
}

// OwnerReference names the object that owns this one (an endpoint slice's service).
type OwnerReference struct {
	APIVersion         string `json:"apiVersion"`
	Kind               string `json:"kind"`
	Name               string `json:"name"`
	UID                string `json:"uid"`
	Controller         *bool  `json:"controller,omitempty"`
	BlockOwnerDeletion *bool  `json:"blockOwnerDeletion,omitempty"`
}

// ManagedFieldsEntry is one writer's claim on fields, from server-side apply. FieldsV1 is
// kept opaque: its keys ("f:spec", ".") are the apiserver's, not field names.
type ManagedFieldsEntry struct {
	Manager     string          `json:"manager,omitempty"`
	Operation   string          `json:"operation,omitempty"`
	APIVersion  string          `json:"apiVersion,omitempty"`
	Time        string          `json:"time,omitempty"`
	FieldsType  string          `json:"fieldsType,omitempty"`
	FieldsV1    json.RawMessage `json:"fieldsV1,omitempty"`
	Subresource string          `json:"subresource,omitempty"`
}

// ObjectReference points at another object (an endpoint's pod).
type ObjectReference struct {
	Kind            string `json:"kind,omitempty"`
	Namespace       string `json:"namespace,omitempty"`
	Name            string `json:"name,omitempty"`
	UID             string `json:"uid,omitempty"`
	APIVersion      string `json:"apiVersion,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	FieldPath       string `json:"fieldPath,omitempty"`
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
	IPv4Address             string          `json:"ipv4Address,omitempty"`
	IPv6Address             string          `json:"ipv6Address,omitempty"`
	IPv4IPIPTunnelAddr      string          `json:"ipv4IPIPTunnelAddr,omitempty"`
	ASNumber                json.RawMessage `json:"asNumber,omitempty"`
	RouteReflectorClusterID string          `json:"routeReflectorClusterID,omitempty"`
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

// ServiceSpec is the spec of a ServiceResource: every field of Kubernetes' v1 ServiceSpec.
// Those a proxy has no use for (Selector, PublishNotReadyAddresses, AllocateLoadBalancerNodePorts,
// LoadBalancerClass, LoadBalancerIP, ExternalName, TrafficDistribution) are kept but not read;
// docs/data-model.md says why for each.
type ServiceSpec struct {
	Type                          string                 `json:"type,omitempty"`
	Selector                      map[string]string      `json:"selector,omitempty"`
	ClusterIP                     string                 `json:"clusterIP,omitempty"`
	ClusterIPs                    []string               `json:"clusterIPs,omitempty"`
	IPFamilies                    []string               `json:"ipFamilies,omitempty"`
	IPFamilyPolicy                string                 `json:"ipFamilyPolicy,omitempty"`
	Ports                         []ServicePort          `json:"ports,omitempty"`
	ExternalIPs                   []string               `json:"externalIPs,omitempty"`
	ExternalName                  string                 `json:"externalName,omitempty"`
	ExternalTrafficPolicy         string                 `json:"externalTrafficPolicy,omitempty"`
	InternalTrafficPolicy         string                 `json:"internalTrafficPolicy,omitempty"`
	HealthCheckNodePort           int                    `json:"healthCheckNodePort,omitempty"`
	SessionAffinity               string                 `json:"sessionAffinity,omitempty"`
	SessionAffinityConfig         *SessionAffinityConfig `json:"sessionAffinityConfig,omitempty"`
	LoadBalancerSourceRanges      []string               `json:"loadBalancerSourceRanges,omitempty"`
	LoadBalancerIP                string                 `json:"loadBalancerIP,omitempty"`
	LoadBalancerClass             string                 `json:"loadBalancerClass,omitempty"`
	AllocateLoadBalancerNodePorts *bool                  `json:"allocateLoadBalancerNodePorts,omitempty"`
	PublishNotReadyAddresses      bool                   `json:"publishNotReadyAddresses,omitempty"`
	TrafficDistribution           string                 `json:"trafficDistribution,omitempty"`
}

// ServicePort is one port of a service. TargetPort is a number or a port name.
type ServicePort struct {
	Name        string          `json:"name,omitempty"`
	Protocol    string          `json:"protocol,omitempty"`
	AppProtocol string          `json:"appProtocol,omitempty"`
	Port        int             `json:"port"`
	TargetPort  json.RawMessage `json:"targetPort,omitempty"`
	NodePort    int             `json:"nodePort,omitempty"`
}

// SessionAffinityConfig holds the client-IP affinity timeout.
type SessionAffinityConfig struct {
	ClientIP *ClientIPConfig `json:"clientIP,omitempty"`
}

// ClientIPConfig holds the affinity timeout in seconds.
type ClientIPConfig struct {
	TimeoutSeconds *int `json:"timeoutSeconds,omitempty"`
}

// ServiceStatus carries the load balancer's ingress addresses and the service's conditions.
type ServiceStatus struct {
	LoadBalancer LoadBalancerStatus `json:"loadBalancer,omitempty"`
	Conditions   []Condition        `json:"conditions,omitempty"`
}

// Condition is a metav1.Condition; sluice does not read it.
type Condition struct {
	Type               string `json:"type"`
	Status             string `json:"status"`
	ObservedGeneration int64  `json:"observedGeneration,omitempty"`
	LastTransitionTime string `json:"lastTransitionTime"`
	Reason             string `json:"reason"`
	Message            string `json:"message"`
}

// LoadBalancerStatus lists ingress points.
type LoadBalancerStatus struct {
	Ingress []LoadBalancerIngress `json:"ingress,omitempty"`
}

// LoadBalancerIngress is one ingress point. sluice programs IP unless IPMode is "Proxy"
// (the load balancer, not the node, is then where traffic to it must go).
type LoadBalancerIngress struct {
	IP       string       `json:"ip,omitempty"`
	Hostname string       `json:"hostname,omitempty"`
	IPMode   string       `json:"ipMode,omitempty"`
	Ports    []PortStatus `json:"ports,omitempty"`
}

// PortStatus is the load balancer's report on one service port; sluice does not read it.
type PortStatus struct {
	Port     int     `json:"port"`
	Protocol string  `json:"protocol"`
	Error    *string `json:"error,omitempty"`
}

// EndpointSliceResource is sluice's endpoint slice, shaped like discovery.k8s.io/v1.
type EndpointSliceResource struct {
	TypeMeta
	Metadata    ObjectMeta         `json:"metadata"`
	AddressType string             `json:"addressType"`
	Endpoints   []EndpointResource `json:"endpoints"`
	Ports       []EndpointPortWire `json:"ports"`
}

// EndpointResource is one endpoint of a slice: every field of discovery.k8s.io/v1's Endpoint.
// Hostname, TargetRef, DeprecatedTopology and Hints are kept but not read.
type EndpointResource struct {
	Addresses          []string           `json:"addresses"`
	Conditions         EndpointConditions `json:"conditions,omitempty"`
	Hostname           string             `json:"hostname,omitempty"`
	TargetRef          *ObjectReference   `json:"targetRef,omitempty"`
	DeprecatedTopology map[string]string  `json:"deprecatedTopology,omitempty"`
	NodeName           string             `json:"nodeName,omitempty"`
	Zone               string             `json:"zone,omitempty"`
	Hints              *EndpointHints     `json:"hints,omitempty"`
}

// EndpointConditions are tri-state, as in Kubernetes: nil means unknown.
type EndpointConditions struct {
	Ready       *bool `json:"ready,omitempty"`
	Serving     *bool `json:"serving,omitempty"`
	Terminating *bool `json:"terminating,omitempty"`
}

// EndpointHints are topology-aware routing's hints: which zones or nodes should use the
// endpoint.
type EndpointHints struct {
	ForZones []ForZone `json:"forZones,omitempty"`
	ForNodes []ForNode `json:"forNodes,omitempty"`
}

// ForZone names a zone that should use an endpoint.
type ForZone struct {
	Name string `json:"name"`
}

// ForNode names a node that should use an endpoint.
type ForNode struct {
	Name string `json:"name"`
}

// EndpointPortWire is one port of a slice.
type EndpointPortWire struct {
	Name        string `json:"name,omitempty"`
	Protocol    string `json:"protocol,omitempty"`
	Port        *int   `json:"port,omitempty"`
	AppProtocol string `json:"appProtocol,omitempty"`
}

// ServiceNameLabel ties an endpoint slice to its service.
const ServiceNameLabel = "kubernetes.io/service-name"

// BGPConfigurationResource is Calico's projectcalico.org/v3 BGPConfiguration: `default` for
// the cluster, `node.<name>` for one node. Every field of Calico's spec is here so a
// calicoctl dump applies as printed; docs/data-model.md says which sluice uses and which it
// refuses.
type BGPConfigurationResource struct {
	TypeMeta
	Metadata ObjectMeta           `json:"metadata"`
	Spec     BGPConfigurationSpec `json:"spec"`
}

// BGPConfigurationSpec is the spec of a BGPConfigurationResource. AS numbers are kept raw:
// Calico writes a number, and accepts a string ("64512", or "1.10" in asdot form).
type BGPConfigurationSpec struct {
	LogSeverityScreen              string                    `json:"logSeverityScreen,omitempty"`
	NodeToNodeMeshEnabled          *bool                     `json:"nodeToNodeMeshEnabled,omitempty"`
	ASNumber                       json.RawMessage           `json:"asNumber,omitempty"`
	ServiceLoadBalancerIPs         []CIDRBlock               `json:"serviceLoadBalancerIPs,omitempty"`
	ServiceExternalIPs             []CIDRBlock               `json:"serviceExternalIPs,omitempty"`
	ServiceClusterIPs              []CIDRBlock               `json:"serviceClusterIPs,omitempty"`
	ServiceLoadBalancerAggregation string                    `json:"serviceLoadBalancerAggregation,omitempty"`
	ListenPort                     int                       `json:"listenPort,omitempty"`
	Communities                    []CommunityWire           `json:"communities,omitempty"`
	PrefixAdvertisements           []PrefixAdvertisementWire `json:"prefixAdvertisements,omitempty"`
	NodeMeshPassword               *BGPPassword              `json:"nodeMeshPassword,omitempty"`
	NodeMeshMaxRestartTime         string                    `json:"nodeMeshMaxRestartTime,omitempty"`
	BindMode                       string                    `json:"bindMode,omitempty"`
	IgnoredInterfaces              []string                  `json:"ignoredInterfaces,omitempty"`
	LocalWorkloadPeeringIPV4       string                    `json:"localWorkloadPeeringIPV4,omitempty"`
	LocalWorkloadPeeringIPV6       string                    `json:"localWorkloadPeeringIPV6,omitempty"`
	ProgramClusterRoutes           string                    `json:"programClusterRoutes,omitempty"`
}

// CIDRBlock is one entry of the service address lists: `{cidr: ...}`.
type CIDRBlock struct {
	CIDR string `json:"cidr,omitempty"`
}

// CommunityWire names a community value: "aa:nn" (standard) or "aa:nn:mm" (large).
type CommunityWire struct {
	Name  string `json:"name,omitempty"`
	Value string `json:"value,omitempty"`
}

// PrefixAdvertisementWire attaches communities (names from the communities list, or values) to
// the routes within CIDR.
type PrefixAdvertisementWire struct {
	CIDR        string   `json:"cidr,omitempty"`
	Communities []string `json:"communities,omitempty"`
}

// BGPPassword names where a session's password is: a key of a Kubernetes secret, which
// sluice reads from a file on the node (docs/data-model.md).
type BGPPassword struct {
	SecretKeyRef *SecretKeySelector `json:"secretKeyRef,omitempty"`
}

// SecretKeySelector is Kubernetes' reference to one key of a secret.
type SecretKeySelector struct {
	Name     string `json:"name,omitempty"`
	Key      string `json:"key"`
	Optional *bool  `json:"optional,omitempty"`
}

// BGPPeerResource is Calico's projectcalico.org/v3 BGPPeer.
type BGPPeerResource struct {
	TypeMeta
	Metadata ObjectMeta  `json:"metadata"`
	Spec     BGPPeerSpec `json:"spec"`
}

// BGPPeerSpec is the spec of a BGPPeerResource, every field of Calico's.
type BGPPeerSpec struct {
	Node                     string          `json:"node,omitempty"`
	PeerIP                   string          `json:"peerIP,omitempty"`
	ASNumber                 json.RawMessage `json:"asNumber,omitempty"`
	NodeSelector             string          `json:"nodeSelector,omitempty"`
	PeerSelector             string          `json:"peerSelector,omitempty"`
	KeepOriginalNextHop      bool            `json:"keepOriginalNextHop,omitempty"`
	NextHopMode              string          `json:"nextHopMode,omitempty"`
	Password                 *BGPPassword    `json:"password,omitempty"`
	SourceAddress            string          `json:"sourceAddress,omitempty"`
	MaxRestartTime           string          `json:"maxRestartTime,omitempty"`
	NumAllowedLocalASNumbers *int32          `json:"numAllowedLocalASNumbers,omitempty"`
	TTLSecurity              *uint8          `json:"ttlSecurity,omitempty"`
	Filters                  []string        `json:"filters,omitempty"`
	ReachableBy              string          `json:"reachableBy,omitempty"`
	LocalASNumber            json.RawMessage `json:"localASNumber,omitempty"`
	LocalWorkloadSelector    string          `json:"localWorkloadSelector,omitempty"`
	ReversePeering           string          `json:"reversePeering,omitempty"`
}
