package store

import "time"

// StatusPrefix holds one key per running sluiced, under a lease: etcd removes a node's key
// when its agent dies and the lease expires.
const StatusPrefix = "/sluice/v1/status/"

// SeenPrefix holds one key per node whose sluiced ever ran, without a lease: the time it last
// started. It tells a node whose agent stopped (gone) from one that never ran one.
const SeenPrefix = "/sluice/v1/seen/"

// NodeStatus is what a sluiced reports about itself.
type NodeStatus struct {
	Node string `json:"node"`
	// Revision is the newest etcd revision the agent has read; AppliedRevision the newest one
	// whose desired state it had programmed when it last reported ready.
	Revision         int64 `json:"revision"`
	AppliedRevision  int64 `json:"appliedRevision"`
	InSync           bool  `json:"inSync"`
	Ready            bool  `json:"ready"`
	RoutesDesired    int   `json:"routesDesired"`
	RoutesProgrammed int   `json:"routesProgrammed"`
	BadValues        int64 `json:"badValues"`
	// Problems is how many inputs the agent cannot act on (a block whose node has no tunnel
	// address, say); its log and `sluicectl plan` name them.
	Problems int `json:"problems"`
	// LeftoversBreaking and LeftoversDormant count other products' objects in sluice's way
	// found on the node and still there (programs on its hooks, netfilter chains): breaking
	// ones break one of its paths; `sluicectl leftovers` on the node names them.
	LeftoversBreaking int `json:"leftoversBreaking,omitempty"`
	LeftoversDormant  int `json:"leftoversDormant,omitempty"`
	// Services is the eBPF service stage's state: "running", "down: <why>" (the agent runs
	// and programs routes, but node ports and cluster IPs do not work), or "" with services off.
	Services string `json:"services,omitempty"`
	// BGPSessions is how many BGP sessions the node's speaker has configured, BGPSessionsUp
	// how many of them are established (both 0 without BGP).
	BGPSessions   int       `json:"bgpSessions,omitempty"`
	BGPSessionsUp int       `json:"bgpSessionsUp,omitempty"`
	LastError     string    `json:"lastError,omitempty"`
	Updated       time.Time `json:"updated"`
}
