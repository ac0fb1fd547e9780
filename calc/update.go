package calc

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
)

// Op is one change to the desired state: exactly one of the pointers is set, the one its
// Kind names. Remove ops carry the object as it was. What the pointers point to is never
// changed afterwards: a consumer may keep them (the dataplane keeps calc's routes rather than
// a copy of each), and must not change them.
type Op struct {
	Remove      bool
	VTEP        *VTEP
	ClusterNet  *ClusterNet
	Route       *Route
	Frontend    *Frontend
	HealthCheck *HealthCheck
	FloatingIP  *FloatingIP
	BGPSpeaker  *BGPSpeaker
	BGPPeer     *BGPPeer
	BGPPath     *BGPPath
}

// OpKind is the kind of desired state an op changes: consumers switch on it rather than test
// each pointer.
type OpKind uint8

const (
	OpNone OpKind = iota // an op with no object: never sent
	OpVTEP
	OpClusterNet
	OpRoute
	OpFrontend
	OpHealthCheck
	OpFloatingIP
	OpBGPSpeaker
	OpBGPPeer
	OpBGPPath
)

var opKindNames = [...]string{OpNone: "none", OpVTEP: "vtep", OpClusterNet: "cluster-net", OpRoute: "route",
	OpFrontend: "frontend", OpHealthCheck: "health-check", OpFloatingIP: "floating-ip", OpBGPSpeaker: "bgp-speaker",
	OpBGPPeer: "bgp-peer", OpBGPPath: "bgp-path"}

func (k OpKind) String() string {
	if int(k) < len(opKindNames) {
		return opKindNames[k]
	}
	return "unknown"
}

// String names the op's object: its kind, then the object ("route 10.0.1.0/26 ...").
func (o Op) String() string {
	switch o.Kind() {
	case OpVTEP:
		return "vtep " + o.VTEP.String()
	case OpRoute:
		return "route " + o.Route.String()
	case OpFrontend:
		return "frontend " + o.Frontend.Key.String() + " " + o.Frontend.Service
	case OpHealthCheck:
		return "health-check " + o.HealthCheck.Service
	case OpClusterNet:
		return "cluster-net " + o.ClusterNet.String()
	case OpFloatingIP:
		return "floating-ip " + o.FloatingIP.String()
	case OpBGPSpeaker:
		return "bgp-speaker " + o.BGPSpeaker.String()
	case OpBGPPeer:
		return "bgp-peer " + o.BGPPeer.String()
	case OpBGPPath:
		return "bgp-path " + o.BGPPath.String()
	}
	return ""
}

// Kind is the kind of o: the one pointer set is the only place that says it.
func (o Op) Kind() OpKind {
	switch {
	case o.VTEP != nil:
		return OpVTEP
	case o.ClusterNet != nil:
		return OpClusterNet
	case o.Route != nil:
		return OpRoute
	case o.Frontend != nil:
		return OpFrontend
	case o.HealthCheck != nil:
		return OpHealthCheck
	case o.FloatingIP != nil:
		return OpFloatingIP
	case o.BGPSpeaker != nil:
		return OpBGPSpeaker
	case o.BGPPeer != nil:
		return OpBGPPeer
	case o.BGPPath != nil:
		return OpBGPPath
	}
	return OpNone
}

// Update is what calc hands the dataplane after a batch. Full means Ops is the whole desired
// state (the first update after in-sync): the consumer replaces everything it had. Ops are in
// apply order: VTEP sets, cluster-net sets, route sets, floating-IP sets, frontend and
// health-check sets, the BGP speaker, peer and path sets, then BGP path, peer and speaker
// removals, then health-check, frontend, floating-IP, route, VTEP and cluster-net removals. So VTEPs exist before the routes that use them, a floating IP's workload is routed
// before the floating IP leads to it and after it no longer does, and a cluster net is known
// before any frontend that relies on it and outlives them all.
type Update struct {
	Full     bool
	Ops      []Op
	Problems []Problem
}

// pendingOps collects changes until the end of a batch.
type pendingOps struct {
	vtepSets, vtepDels         []VTEP
	netSets, netDels           []ClusterNet
	routeSets, routeDels       []*Route
	frontendSets, frontendDels []*Frontend // calc's own (svcFronts'): the consumer keeps them
	healthSets, healthDels     []HealthCheck
	fipSets, fipDels           []FloatingIP
	bgpSpeakerSets             []*BGPSpeaker
	bgpSpeakerDels             []*BGPSpeaker
	bgpPeerSets, bgpPeerDels   []*BGPPeer
	bgpPathSets, bgpPathDels   []*BGPPath
	problems                   []Problem
}

func sortRoutes(r []Route) {
	slices.SortFunc(r, func(a, b Route) int { return ComparePrefix(a.Dst, b.Dst) })
}

func sortRoutePointers(r []*Route) {
	slices.SortFunc(r, func(a, b *Route) int { return ComparePrefix(a.Dst, b.Dst) })
}

func sortVTEPs(v []VTEP) {
	slices.SortFunc(v, func(a, b VTEP) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), a.TunnelAddr.Compare(b.TunnelAddr))
	})
}

func sortClusterNets(c []ClusterNet) {
	slices.SortFunc(c, func(a, b ClusterNet) int { return ComparePrefix(a.Prefix, b.Prefix) })
}

func sortFrontends(f []Frontend) {
	slices.SortFunc(f, func(a, b Frontend) int { return cmpFrontendKey(a.Key, b.Key) })
}

func sortFrontendPointers(f []*Frontend) {
	slices.SortFunc(f, func(a, b *Frontend) int { return cmpFrontendKey(a.Key, b.Key) })
}

func sortFIPs(f []FloatingIP) {
	slices.SortFunc(f, func(a, b FloatingIP) int { return a.External.Compare(b.External) })
}

func sortBGPPeers(p []*BGPPeer) {
	slices.SortFunc(p, func(a, b *BGPPeer) int { return a.Addr.Compare(b.Addr) })
}

func sortBGPPaths(p []*BGPPath) {
	slices.SortFunc(p, func(a, b *BGPPath) int { return ComparePrefix(a.Prefix, b.Prefix) })
}

func sortHealth(h []HealthCheck) {
	slices.SortFunc(h, func(a, b HealthCheck) int { return cmp.Compare(a.Port, b.Port) })
}

func cmpFrontendKey(a, b FrontendKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), strings.Compare(string(a.Protocol), string(b.Protocol)))
}

// take turns the collected changes into an ordered update, or nil when there are none.
func (p *pendingOps) take() *Update {
	n := len(p.vtepSets) + len(p.vtepDels) + len(p.netSets) + len(p.netDels) + len(p.routeSets) + len(p.routeDels) + len(p.frontendSets) +
		len(p.frontendDels) + len(p.healthSets) + len(p.healthDels) + len(p.fipSets) + len(p.fipDels) +
		len(p.bgpSpeakerSets) + len(p.bgpSpeakerDels) + len(p.bgpPeerSets) + len(p.bgpPeerDels) + len(p.bgpPathSets) + len(p.bgpPathDels)
	if n == 0 && len(p.problems) == 0 {
		return nil
	}
	sortVTEPs(p.vtepSets)
	sortVTEPs(p.vtepDels)
	sortClusterNets(p.netSets)
	sortClusterNets(p.netDels)
	sortRoutePointers(p.routeSets)
	sortRoutePointers(p.routeDels)
	sortFrontendPointers(p.frontendSets)
	sortFrontendPointers(p.frontendDels)
	sortHealth(p.healthSets)
	sortHealth(p.healthDels)
	sortFIPs(p.fipSets)
	sortFIPs(p.fipDels)
	sortBGPPeers(p.bgpPeerSets)
	sortBGPPeers(p.bgpPeerDels)
	sortBGPPaths(p.bgpPathSets)
	sortBGPPaths(p.bgpPathDels)
	u := &Update{Ops: make([]Op, 0, n), Problems: p.problems}
	for i := range p.vtepSets {
		u.Ops = append(u.Ops, Op{VTEP: &p.vtepSets[i]})
	}
	for i := range p.netSets {
		u.Ops = append(u.Ops, Op{ClusterNet: &p.netSets[i]})
	}
	for i := range p.routeSets {
		u.Ops = append(u.Ops, Op{Route: p.routeSets[i]})
	}
	for i := range p.fipSets { // after the routes to the workloads they lead to
		u.Ops = append(u.Ops, Op{FloatingIP: &p.fipSets[i]})
	}
	for i := range p.frontendSets {
		u.Ops = append(u.Ops, Op{Frontend: p.frontendSets[i]})
	}
	for i := range p.healthSets {
		u.Ops = append(u.Ops, Op{HealthCheck: &p.healthSets[i]})
	}
	for _, s := range p.bgpSpeakerSets {
		u.Ops = append(u.Ops, Op{BGPSpeaker: s})
	}
	for _, b := range p.bgpPeerSets {
		u.Ops = append(u.Ops, Op{BGPPeer: b})
	}
	for _, b := range p.bgpPathSets {
		u.Ops = append(u.Ops, Op{BGPPath: b})
	}
	for _, b := range p.bgpPathDels {
		u.Ops = append(u.Ops, Op{Remove: true, BGPPath: b})
	}
	for _, b := range p.bgpPeerDels {
		u.Ops = append(u.Ops, Op{Remove: true, BGPPeer: b})
	}
	for _, s := range p.bgpSpeakerDels {
		u.Ops = append(u.Ops, Op{Remove: true, BGPSpeaker: s})
	}
	for i := range p.healthDels {
		u.Ops = append(u.Ops, Op{Remove: true, HealthCheck: &p.healthDels[i]})
	}
	for i := range p.frontendDels {
		u.Ops = append(u.Ops, Op{Remove: true, Frontend: p.frontendDels[i]})
	}
	for i := range p.fipDels {
		u.Ops = append(u.Ops, Op{Remove: true, FloatingIP: &p.fipDels[i]})
	}
	for i := range p.routeDels {
		u.Ops = append(u.Ops, Op{Remove: true, Route: p.routeDels[i]})
	}
	for i := range p.vtepDels {
		u.Ops = append(u.Ops, Op{Remove: true, VTEP: &p.vtepDels[i]})
	}
	for i := range p.netDels {
		u.Ops = append(u.Ops, Op{Remove: true, ClusterNet: &p.netDels[i]})
	}
	*p = pendingOps{}
	return u
}

// State is the whole desired state, sorted.
type State struct {
	VTEPs        []VTEP        `json:"vteps"`
	ClusterNets  []ClusterNet  `json:"clusterNets"`
	Routes       []Route       `json:"routes"`
	Frontends    []Frontend    `json:"frontends"`
	HealthChecks []HealthCheck `json:"healthChecks"`
	FloatingIPs  []FloatingIP  `json:"floatingIPs"`
	// The BGP speaker (nil: none), its sessions and what it announces.
	BGPSpeaker *BGPSpeaker `json:"bgpSpeaker,omitempty"`
	BGPPeers   []BGPPeer   `json:"bgpPeers,omitempty"`
	BGPPaths   []BGPPath   `json:"bgpPaths,omitempty"`
	Problems   []Problem   `json:"problems"`
}

// State returns the desired state as it stands (computed up to the last batch).
func (g *Graph) State() *State {
	s := g.stateBut()
	s.Routes = make([]Route, 0, len(g.routes.routes))
	for _, r := range g.routes.routes {
		s.Routes = append(s.Routes, *r)
	}
	return SortState(s)
}

// stateBut is the desired state but its routes, sorted.
func (g *Graph) stateBut() *State {
	s := &State{VTEPs: make([]VTEP, 0, len(g.nodes)), ClusterNets: make([]ClusterNet, 0, len(g.nets.hostNets.one)+len(g.pools)),
		Frontends: make([]Frontend, 0, len(g.svc.frontends)), HealthChecks: make([]HealthCheck, 0, len(g.svc.health))}
	for v := range g.vteps.all {
		s.VTEPs = append(s.VTEPs, v)
	}
	for c := range g.nets.all {
		s.ClusterNets = append(s.ClusterNets, c)
	}
	for _, f := range g.svc.frontends {
		s.Frontends = append(s.Frontends, *f)
	}
	for _, h := range g.svc.health {
		s.HealthChecks = append(s.HealthChecks, h)
	}
	for _, f := range g.fips.fips {
		s.FloatingIPs = append(s.FloatingIPs, f)
	}
	for k, r := range g.problems {
		s.Problems = append(s.Problems, Problem{Key: k, Reason: r})
	}
	g.bgp.state(s)
	return SortState(s)
}

// SortState sorts every list of s in place, in the order State returns, and returns s.
func SortState(s *State) *State {
	sortVTEPs(s.VTEPs)
	sortClusterNets(s.ClusterNets)
	sortRoutes(s.Routes)
	sortFrontends(s.Frontends)
	sortHealth(s.HealthChecks)
	sortFIPs(s.FloatingIPs)
	slices.SortFunc(s.BGPPeers, func(a, b BGPPeer) int { return a.Addr.Compare(b.Addr) })
	slices.SortFunc(s.BGPPaths, func(a, b BGPPath) int { return ComparePrefix(a.Prefix, b.Prefix) })
	slices.SortFunc(s.Problems, func(a, b Problem) int { return strings.Compare(a.Key, b.Key) })
	return s
}

// fullUpdate is the whole state as one update, in the same apply order as deltas.
func (g *Graph) fullUpdate() *Update {
	routes := make([]*Route, 0, len(g.routes.routes))
	for _, r := range g.routes.routes {
		routes = append(routes, r) // calc's own: the consumer keeps them, not copies
	}
	fronts := make([]*Frontend, 0, len(g.svc.frontends))
	for _, f := range g.svc.frontends {
		fronts = append(fronts, f)
	}
	return fullOf(g.stateBut(), routes, fronts)
}

// Update is s as the first update after in-sync would carry it: the whole state (Full), in
// apply order, with s's problems. Its ops point into s. An agent that kept the desired state
// of an earlier run hands this to the dataplane; calc's own first update of the same inputs
// carries the same ops.
func (s *State) Update() *Update {
	routes := make([]*Route, len(s.Routes))
	for i := range s.Routes {
		routes[i] = &s.Routes[i]
	}
	fronts := make([]*Frontend, len(s.Frontends))
	for i := range s.Frontends {
		fronts[i] = &s.Frontends[i]
	}
	return fullOf(s, routes, fronts)
}

// fullOf is s, with routes and fronts for its routes and frontends, as a full update.
func fullOf(s *State, routes []*Route, fronts []*Frontend) *Update {
	p := pendingOps{vtepSets: s.VTEPs, netSets: s.ClusterNets, routeSets: routes, frontendSets: fronts, healthSets: s.HealthChecks,
		fipSets: s.FloatingIPs, problems: s.Problems}
	if s.BGPSpeaker != nil {
		p.bgpSpeakerSets = []*BGPSpeaker{s.BGPSpeaker}
	}
	for i := range s.BGPPeers {
		p.bgpPeerSets = append(p.bgpPeerSets, &s.BGPPeers[i])
	}
	for i := range s.BGPPaths {
		p.bgpPathSets = append(p.bgpPathSets, &s.BGPPaths[i])
	}
	u := p.take()
	if u == nil {
		u = &Update{} // an empty full state still tells the consumer to clear what it has
	}
	u.Full = true
	return u
}

// settle compares the value just computed for k (ok=false: nothing is wanted) with what was
// emitted, records the new value, and, when queue is set, queues the set or the removal.
// Before the first update nothing is queued: the first update is the whole state.
func settle[K comparable, V any](emitted map[K]V, k K, v V, ok bool, equal func(a, b V) bool, queue bool, sets, dels *[]V) {
	old, had := emitted[k]
	switch {
	case ok && (!had || !equal(old, v)):
		emitted[k] = v
	case !ok && had:
		delete(emitted, k)
	}
	if queue {
		queueDiff(old, had, v, ok, equal, sets, dels)
	}
}

// queueDiff queues v as a set when it is wanted (ok) and differs from what was emitted (old,
// had), or old as a removal when v is no longer wanted.
func queueDiff[V any](old V, had bool, v V, ok bool, equal func(a, b V) bool, sets, dels *[]V) {
	switch {
	case ok && (!had || !equal(old, v)):
		*sets = append(*sets, v)
	case !ok && had:
		*dels = append(*dels, old)
	}
}

func same[T comparable](a, b T) bool { return a == b }

// ComparePrefix orders prefixes by address, then length: the order of every sorted list of
// calc's.
func ComparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}
