package calc

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sluice-net/sluice/store"
)

// The BGP outputs: what this node's speaker is, whom it peers with and what it announces, as
// calico/node's BIRD templates decide them (the golden fixtures of Calico's confd are the
// reference: confd/tests/compiled_templates).

// DefaultASNumber is Calico's default AS for nodes (BGPConfiguration's asNumber).
const DefaultASNumber = 64512

// DefaultBGPPort is BGP's port; BGPConfiguration's listenPort overrides it.
const DefaultBGPPort = 179

// ExcludeFromLBLabel on a node keeps its service addresses from being announced, as
// Kubernetes' load balancers and calico/node read it.
const ExcludeFromLBLabel = "node.kubernetes.io/exclude-from-external-load-balancers"

// BGPSpeaker is this node's BGP speaker: there is one while the agent runs BGP (option bgp)
// and this node has spec.bgp.
type BGPSpeaker struct {
	ASN uint32 `json:"asn"`
	// RouterID is the node's IPv4 address or, without one, four bytes of a hash of its name.
	RouterID   netip.Addr `json:"routerID"`
	ListenPort uint16     `json:"listenPort"`
	// Addr4 and Addr6 are the node's own addresses: the next hop of what it announces.
	Addr4 netip.Addr `json:"addr4"`
	Addr6 netip.Addr `json:"addr6"`
	// ClusterID makes the node a route reflector (invalid: it is not one).
	ClusterID netip.Addr `json:"clusterID"`
}

func (s BGPSpeaker) String() string {
	out := fmt.Sprintf("as %d router-id %s port %d", s.ASN, s.RouterID, s.ListenPort)
	if s.ClusterID.IsValid() {
		out += " reflector " + s.ClusterID.String()
	}
	return out
}

// BGPPeer is one session of this node's speaker, keyed by the peer's address. It carries the
// family of its address (an IPv4 session carries IPv4 routes), as calico/node's bird.cfg and
// bird6.cfg do.
type BGPPeer struct {
	Addr netip.Addr `json:"addr"`
	// Port is the peer's port (0: 179).
	Port     uint16 `json:"port,omitempty"`
	ASN      uint32 `json:"asn"`
	LocalASN uint32 `json:"localASN"`
	// SourceAddr is the session's source (invalid: the kernel picks).
	SourceAddr netip.Addr `json:"sourceAddr"`
	// Passive: the peer connects, this node only listens (the mesh's higher address connects
	// to the lower one, as calico/node does).
	Passive bool `json:"passive,omitempty"`
	// RRClient: this node reflects routes to the peer (it is a reflector, the peer a node that
	// is not one of the same cluster).
	RRClient bool `json:"rrClient,omitempty"`
	// Password names the file holding the TCP MD5 password (empty Name: none).
	Password store.SecretKeyRef `json:"password"`
	// RestartTime is the graceful-restart time offered (0: the default).
	RestartTime time.Duration `json:"restartTime,omitempty"`
	TTLSecurity uint8         `json:"ttlSecurity,omitempty"`
	NextHop     string        `json:"nextHop"`
	// Node is the peer's node name when the peer is a node of the cluster.
	Node string `json:"node,omitempty"`
	// Origin says why the session exists: "mesh" or "BGPPeer <name>".
	Origin string `json:"origin"`
}

// Flags lists the session's settings beyond its addresses and ASes, comma-separated ("" for
// none): passive, rr-client, password=<secret>/<key>, restart=<time>, ttl-security=<hops>,
// next-hop=<mode> (but Auto).
func (p BGPPeer) Flags() string {
	var flags []string
	if p.Passive {
		flags = append(flags, "passive")
	}
	if p.RRClient {
		flags = append(flags, "rr-client")
	}
	if p.Password.Name != "" {
		flags = append(flags, "password="+p.Password.Name+"/"+p.Password.Key)
	}
	if p.RestartTime != 0 {
		flags = append(flags, "restart="+p.RestartTime.String())
	}
	if p.TTLSecurity != 0 {
		flags = append(flags, fmt.Sprintf("ttl-security=%d", p.TTLSecurity))
	}
	if p.NextHop != "" && p.NextHop != store.NextHopAuto {
		flags = append(flags, "next-hop="+p.NextHop)
	}
	return strings.Join(flags, ",")
}

func (p BGPPeer) String() string {
	out := fmt.Sprintf("%s as %d", p.Addr, p.ASN)
	if p.Port != 0 {
		out = fmt.Sprintf("%s as %d", netip.AddrPortFrom(p.Addr, p.Port), p.ASN)
	}
	if p.Node != "" {
		out += " node " + p.Node
	}
	if p.RRClient {
		out += " rr-client"
	}
	if p.Passive {
		out += " passive"
	}
	return out + " (" + p.Origin + ")"
}

// Reasons a prefix is announced.
const (
	AnnounceBlock        = "block"         // a block affine to this node (its blackhole)
	AnnounceWorkload     = "workload"      // a local workload's address outside this node's blocks
	AnnounceFloatingIP   = "floating-ip"   // a local workload's floating IP
	AnnounceServiceRange = "service-range" // a range BGPConfiguration lists
	AnnounceService      = "service"       // a service's address (policy Local with a local endpoint, or a single-address range)
)

// BGPPath is one prefix this node announces, with its communities (sorted).
type BGPPath struct {
	Prefix      netip.Prefix      `json:"prefix"`
	Communities []store.Community `json:"communities,omitempty"`
	Reason      string            `json:"reason"`
}

func (p *BGPPath) String() string {
	out := p.Prefix.String() + " (" + p.Reason + ")"
	if len(p.Communities) > 0 {
		cs := make([]string, len(p.Communities))
		for i, c := range p.Communities {
			cs[i] = c.String()
		}
		out += " communities " + strings.Join(cs, ",")
	}
	return out
}

func samePath(a, b *BGPPath) bool {
	return a.Prefix == b.Prefix && a.Reason == b.Reason && slices.Equal(a.Communities, b.Communities)
}

// bgpCalc is the BGP calculator: the speaker, its sessions and its announcements. It hears
// nothing while the agent runs no BGP (Config.BGP), so it costs nothing then. Announcements
// of blocks, workloads and floating IPs follow the routes (routeCalc tells it which changed);
// service addresses follow services and their slices.
type bgpCalc struct {
	*inputs
	*emitter
	rc *routeCalc
	// svc holds the services (read, never written: one copy of them in calc).
	svc *serviceCalc

	peers map[string]*store.BGPPeer
	// Per slice, its service and the families of its ready endpoints on this node (bit 0:
	// IPv4, bit 1: IPv6); localFams is the same by service (its slices' families), so a
	// service's announcement never walks every slice.
	sliceLocal map[string]sliceLocal
	localFams  map[string]map[string]uint8
	// svcPaths is what each service announces; svcRefs counts the services announcing each
	// address (two services may name one external IP).
	svcPaths map[string][]netip.Prefix
	svcRefs  map[netip.Prefix]int
	// local holds the destinations of this node's routes that may be announced.
	local set[netip.Prefix]

	dirtyPaths    set[netip.Prefix]
	dirtySvcs     set[string]
	dirtySessions bool
	dirtyAll      bool // every announcement (ranges, communities, pools, this node)

	speaker  *BGPSpeaker
	sessions map[netip.Addr]*BGPPeer
	paths    map[netip.Prefix]*BGPPath
	// sessionProblems holds the problem keys said of sessions.
	sessionProblems set[string]
}

type sliceLocal struct {
	service string
	fams    uint8
}

func newBGPCalc(in *inputs, e *emitter, rc *routeCalc, svc *serviceCalc) *bgpCalc {
	c := &bgpCalc{inputs: in, emitter: e, rc: rc, svc: svc, peers: map[string]*store.BGPPeer{},
		sliceLocal: map[string]sliceLocal{}, localFams: map[string]map[string]uint8{}, svcPaths: map[string][]netip.Prefix{},
		svcRefs: map[netip.Prefix]int{}, local: set[netip.Prefix]{}, dirtyPaths: set[netip.Prefix]{}, dirtySvcs: set[string]{},
		sessions: map[netip.Addr]*BGPPeer{}, paths: map[netip.Prefix]*BGPPath{}, sessionProblems: set[string]{}}
	if in.cfg.BGP {
		rc.routeChanged = c.onRoute
	}
	return c
}

func (c *bgpCalc) onPool(string, *store.IPPool, *store.IPPool) {
	if c.cfg.BGP {
		c.dirtyAll = true
	}
}

func (c *bgpCalc) onNode(id string, old, n *store.Node) {
	if !c.cfg.BGP {
		return
	}
	if c.isLocal(id) {
		c.dirtySessions, c.dirtyAll = true, true
		c.allServices()
		return
	}
	if (old != nil && old.BGP != nil) || (n != nil && n.BGP != nil) {
		c.dirtySessions = true
	}
}

func (c *bgpCalc) onService(id string, _ *store.Service) {
	if c.cfg.BGP {
		c.dirtySvcs.add(id)
	}
}

func (c *bgpCalc) onSlice(id string, e *store.EndpointSlice) {
	if !c.cfg.BGP {
		return
	}
	if old, ok := c.sliceLocal[id]; ok {
		c.dirtySvcs.add(old.service)
		delete(c.sliceLocal, id)
		if m := c.localFams[old.service]; m != nil {
			if delete(m, id); len(m) == 0 {
				delete(c.localFams, old.service)
			}
		}
	}
	if e == nil {
		return
	}
	var fams uint8
	for _, ep := range e.Endpoints {
		if !ep.Ready || !c.isLocal(ep.NodeName) {
			continue
		}
		for _, a := range ep.Addresses {
			fams |= famBit(a)
		}
	}
	c.sliceLocal[id] = sliceLocal{service: e.ServiceID(), fams: fams}
	if fams != 0 {
		m := c.localFams[e.ServiceID()]
		if m == nil {
			m = map[string]uint8{}
			c.localFams[e.ServiceID()] = m
		}
		m[id] = fams
	}
	c.dirtySvcs.add(e.ServiceID())
}

func famBit(a netip.Addr) uint8 {
	if a.Is4() {
		return 1
	}
	return 2
}

func (c *bgpCalc) onBGPConfig(id string, cfg *store.BGPConfiguration) {
	if !c.cfg.BGP {
		return
	}
	c.dirtySessions = true // any node's listen port is its sessions' port
	if id == "default" || id == store.NodeConfigPrefix+c.cfg.NodeName {
		c.dirtyAll = true
		c.allServices()
	}
}

func (c *bgpCalc) onBGPPeer(id string, p *store.BGPPeer) {
	if !c.cfg.BGP {
		return
	}
	put(c.peers, id, p)
	c.dirtySessions = true
}

func (c *bgpCalc) allServices() {
	for id := range c.svc.services {
		c.dirtySvcs.add(id)
	}
	for id := range c.svcPaths {
		c.dirtySvcs.add(id)
	}
}

// onRoute hears that routeCalc's route to dst changed (old, r: as it was and is; nil: none).
func (c *bgpCalc) onRoute(dst netip.Prefix, old, r *Route) {
	if announceable(r) {
		c.local.add(dst)
	} else {
		delete(c.local, dst)
	}
	c.dirtyPaths.add(dst)
	// A block's blackhole covers the workload addresses inside it.
	if (old != nil && old.Reason == ReasonLocalBlock) || (r != nil && r.Reason == ReasonLocalBlock) {
		for p := range c.local {
			if p.Bits() > dst.Bits() && dst.Contains(p.Addr()) {
				c.dirtyPaths.add(p)
			}
		}
	}
}

// announceable: a route of this node's that BGP may announce.
func announceable(r *Route) bool {
	if r == nil || r.Node != "" {
		return false
	}
	switch r.Reason {
	case ReasonLocalBlock, ReasonLocalWorkload, ReasonFloatingIP:
		return true
	}
	return false
}

// self is this node when it speaks BGP, else nil.
func (c *bgpCalc) self() *store.Node {
	if !c.cfg.BGP {
		return nil
	}
	if n := c.nodes[c.cfg.NodeName]; n != nil && n.BGP != nil {
		return n
	}
	return nil
}

func (c *bgpCalc) recompute() {
	if !c.cfg.BGP {
		return
	}
	if c.dirtySessions {
		c.dirtySessions = false
		c.computeSessions()
	}
	for id := range c.dirtySvcs {
		c.computeService(id)
	}
	clear(c.dirtySvcs)
	if c.dirtyAll {
		c.dirtyAll = false
		for p := range c.local {
			c.dirtyPaths.add(p)
		}
		for p := range c.paths {
			c.dirtyPaths.add(p)
		}
		for p := range c.svcRefs {
			c.dirtyPaths.add(p)
		}
		for _, p := range c.ranges() {
			c.dirtyPaths.add(p)
		}
	}
	ranges := c.ranges() // once, not once a path
	for p := range c.dirtyPaths {
		path, ok := c.computePath(p, ranges)
		old, had := c.paths[p]
		switch {
		case ok && (!had || !samePath(old, path)):
			c.paths[p] = path
			if c.emitted {
				c.pending.bgpPathSets = append(c.pending.bgpPathSets, path)
			}
		case !ok && had:
			delete(c.paths, p)
			if c.emitted {
				c.pending.bgpPathDels = append(c.pending.bgpPathDels, old)
			}
		}
	}
	reset(&c.dirtyPaths, len(c.dirtyPaths))
}

// ranges are the service ranges the cluster's BGPConfiguration lists.
func (c *bgpCalc) ranges() []netip.Prefix {
	g := c.bgpConfigs["default"]
	if g == nil {
		return nil
	}
	return slices.Concat(g.ServiceClusterIPs, g.ServiceExternalIPs, g.ServiceLoadBalancerIPs)
}

// computePath decides whether p is announced (ranges: the service ranges), why, and with
// which communities.
func (c *bgpCalc) computePath(p netip.Prefix, ranges []netip.Prefix) (*BGPPath, bool) {
	if c.self() == nil {
		return nil, false
	}
	reason := ""
	if r := c.rc.routes[p]; announceable(r) {
		reason = c.routeReason(p, r)
	}
	if reason == "" && slices.Contains(ranges, p) {
		reason = AnnounceServiceRange
	}
	if reason == "" && c.svcRefs[p] > 0 {
		reason = AnnounceService
	}
	if reason == "" {
		return nil, false
	}
	path := &BGPPath{Prefix: p, Reason: reason}
	for _, name := range []string{"default", store.NodeConfigPrefix + c.cfg.NodeName} {
		cfg := c.bgpConfigs[name]
		if cfg == nil {
			continue
		}
		for _, adv := range cfg.PrefixAdvertisements {
			if adv.CIDR.Bits() <= p.Bits() && adv.CIDR.Contains(p.Addr()) {
				path.Communities = append(path.Communities, adv.Communities...)
			}
		}
	}
	slices.SortFunc(path.Communities, func(a, b store.Community) int {
		return cmp.Or(cmpBool(a.Large, b.Large), cmp.Compare(a.A, b.A), cmp.Compare(a.B, b.B), cmp.Compare(a.C, b.C))
	})
	path.Communities = slices.Compact(path.Communities)
	return path, true
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// routeReason is why this node's route to p is announced ("" when it is not): a floating IP
// always; a block or workload address only inside a pool that allows export, and a workload
// address only when no block of this node's announces it already.
func (c *bgpCalc) routeReason(p netip.Prefix, r *Route) string {
	if r.Reason == ReasonFloatingIP {
		return AnnounceFloatingIP
	}
	pool := c.rc.poolFor(p)
	if pool == nil || pool.DisableBGPExport {
		return ""
	}
	if r.Reason == ReasonLocalBlock {
		return AnnounceBlock
	}
	if b := c.rc.blockFor(p.Addr()); b != nil && b.CIDR != p {
		if br := c.rc.routes[b.CIDR]; br != nil && br.Reason == ReasonLocalBlock {
			return ""
		}
	}
	return AnnounceWorkload
}

// computeService recomputes the addresses service id announces from this node, as
// calico/node does (confd's route generator): with externalTrafficPolicy Local, its cluster
// IPs (when cluster ranges are listed) and its listed external and load-balancer addresses
// while a ready endpoint of the address's family runs here; with Cluster, all of them only
// when one of its external or load-balancer addresses is in a single-address range (the
// ranges announce the rest).
func (c *bgpCalc) computeService(id string) {
	var want []netip.Prefix
	if s, self := c.svc.services[id], c.self(); s != nil && self != nil && len(s.ClusterIPs) > 0 {
		if self.Labels[ExcludeFromLBLabel] != "true" { // as calico/node reads it
			want = c.serviceAddrs(id, s)
		}
	}
	old := c.svcPaths[id]
	if slices.Equal(old, want) {
		return
	}
	for _, p := range old {
		if c.svcRefs[p]--; c.svcRefs[p] <= 0 {
			delete(c.svcRefs, p)
		}
		c.dirtyPaths.add(p)
	}
	for _, p := range want {
		c.svcRefs[p]++
		c.dirtyPaths.add(p)
	}
	if want == nil {
		delete(c.svcPaths, id)
	} else {
		c.svcPaths[id] = want
	}
}

func (c *bgpCalc) serviceAddrs(id string, s *store.Service) []netip.Prefix {
	g := c.bgpConfigs["default"]
	if g == nil {
		return nil
	}
	in := func(a netip.Addr, ranges []netip.Prefix, single bool) bool {
		for _, r := range ranges {
			if r.Contains(a) && (!single || r.IsSingleIP()) {
				return true
			}
		}
		return false
	}
	var fams uint8
	if s.ExternalTrafficPolicy == store.PolicyLocal {
		for _, f := range c.localFams[id] {
			fams |= f
		}
	} else {
		single := false
		for _, a := range s.ExternalIPs {
			single = single || in(a, g.ServiceExternalIPs, true)
		}
		if s.Type == store.ServiceLoadBalancer {
			for _, a := range s.LoadBalancerIPs {
				single = single || in(a, g.ServiceLoadBalancerIPs, true)
			}
		}
		if single {
			fams = 3
		}
	}
	if fams == 0 {
		return nil
	}
	var out []netip.Prefix
	add := func(a netip.Addr) {
		if fams&famBit(a) != 0 {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	if len(g.ServiceClusterIPs) > 0 {
		for _, a := range s.ClusterIPs {
			add(a)
		}
	}
	for _, a := range s.ExternalIPs {
		if in(a, g.ServiceExternalIPs, false) {
			add(a)
		}
	}
	for _, a := range s.LoadBalancerIPs {
		if in(a, g.ServiceLoadBalancerIPs, false) {
			add(a)
		}
	}
	slices.SortFunc(out, ComparePrefix)
	return slices.Compact(out)
}

// computeSessions recomputes the speaker and its sessions, and queues what changed.
func (c *bgpCalc) computeSessions() {
	speaker, want := c.wantSessions()
	switch {
	case speaker != nil && (c.speaker == nil || *c.speaker != *speaker):
		if c.emitted {
			c.pending.bgpSpeakerSets = append(c.pending.bgpSpeakerSets, speaker)
		}
		c.speaker = speaker
	case speaker == nil && c.speaker != nil:
		if c.emitted {
			c.pending.bgpSpeakerDels = append(c.pending.bgpSpeakerDels, c.speaker)
		}
		c.speaker = nil
	}
	for a, p := range want {
		if old, had := c.sessions[a]; !had || *old != *p {
			c.sessions[a] = p
			if c.emitted {
				c.pending.bgpPeerSets = append(c.pending.bgpPeerSets, p)
			}
		}
	}
	for a, old := range c.sessions {
		if _, ok := want[a]; !ok {
			delete(c.sessions, a)
			if c.emitted {
				c.pending.bgpPeerDels = append(c.pending.bgpPeerDels, old)
			}
		}
	}
}

// wantSessions computes the speaker (nil: none) and its sessions by peer address. Explicit
// peers come first, in name order; a node that is also a mesh peer keeps the explicit
// session; two explicit peers naming one address keep the first and say so.
func (c *bgpCalc) wantSessions() (*BGPSpeaker, map[netip.Addr]*BGPPeer) {
	self := c.self()
	problems := set[string]{}
	defer func() {
		for k := range c.sessionProblems {
			if _, still := problems[k]; !still {
				delete(c.problems, k)
			}
		}
		c.sessionProblems = problems
	}()
	if self == nil {
		return nil, nil
	}
	global := c.bgpConfigs["default"]
	if global == nil {
		global = &store.BGPConfiguration{}
	}
	asn := cmp.Or(self.BGP.ASNumber, global.ASNumber, DefaultASNumber)
	port := uint16(DefaultBGPPort)
	if nc := c.bgpConfigs[store.NodeConfigPrefix+self.Name]; nc != nil && nc.ListenPort != 0 {
		port = nc.ListenPort
	} else if global.ListenPort != 0 {
		port = global.ListenPort
	}
	sp := &BGPSpeaker{ASN: asn, ListenPort: port, Addr4: self.IPv4Address.Addr(), Addr6: self.IPv6Address().Addr(),
		ClusterID: self.BGP.RouteReflectorClusterID, RouterID: self.IPv4Address.Addr()}
	if !sp.RouterID.IsValid() {
		h := fnv.New32a()
		h.Write([]byte(self.Name))
		var b [4]byte
		copy(b[:], h.Sum(nil))
		sp.RouterID = netip.AddrFrom4(b)
	}
	out := map[netip.Addr]*BGPPeer{}
	say := func(key, reason string) {
		problems.add(key)
		c.problem(key, reason)
	}
	add := func(p BGPPeer) {
		key := "bgp/session/" + p.Addr.String()
		if p.Addr == sp.Addr4 || p.Addr == sp.Addr6 {
			return // this node itself
		}
		if old, dup := out[p.Addr]; dup {
			if old.Origin != "mesh" && p.Origin != "mesh" && old.Origin != p.Origin {
				say(key, fmt.Sprintf("%s and %s both name peer %s: the session is %s's", old.Origin, p.Origin, p.Addr, old.Origin))
			}
			return
		}
		out[p.Addr] = &p
	}
	source := func(peer netip.Addr, none bool) (netip.Addr, bool) {
		if none {
			return netip.Addr{}, true
		}
		if peer.Is4() {
			return sp.Addr4, sp.Addr4.IsValid()
		}
		return sp.Addr6, sp.Addr6.IsValid()
	}
	// nodePeer adds sessions to node n's addresses (one per family) for BGPPeer bp.
	nodePeer := func(n *store.Node, bp *store.BGPPeer, origin string) {
		for _, a := range []netip.Addr{n.IPv4Address.Addr(), n.IPv6Address().Addr()} {
			if !a.IsValid() {
				continue
			}
			src, ok := source(a, bp != nil && bp.NoSourceAddress)
			if !ok {
				continue // this node has no address of that family: no session of it
			}
			peerASN := cmp.Or(n.BGP.ASNumber, global.ASNumber, DefaultASNumber)
			p := BGPPeer{Addr: a, Port: c.listenPort(n.Name), ASN: peerASN, LocalASN: asn, SourceAddr: src,
				NextHop: store.NextHopAuto, Node: n.Name, Origin: origin,
				// A reflector's clients: iBGP peers that are not reflectors of its cluster.
				RRClient: sp.ClusterID.IsValid() && peerASN == asn && n.BGP.RouteReflectorClusterID != sp.ClusterID,
				// Sessions between nodes are one-way, as calico/node's templates make them:
				// the node whose address is the greater string connects (its template
				// compares the addresses as text).
				Passive: a.String() > src.String()}
			if bp != nil {
				p.LocalASN = cmp.Or(bp.LocalASNumber, asn)
				p.Password = derefSecret(bp.Password)
				p.RestartTime, p.TTLSecurity, p.NextHop = bp.MaxRestartTime, bp.TTLSecurity, bp.NextHopMode
			} else {
				p.Password = derefSecret(global.NodeMeshPassword)
				p.RestartTime = global.NodeMeshMaxRestartTime
			}
			add(p)
		}
	}
	applies := func(bp *store.BGPPeer, n *store.Node) bool {
		switch {
		case bp.Node != "":
			return bp.Node == n.Name
		case bp.NodeSelector.Set():
			return bp.NodeSelector.Matches(n.Labels)
		}
		return true
	}
	others := make([]*store.Node, 0, len(c.nodes))
	for _, n := range c.nodes {
		if n.BGP != nil && n.Name != self.Name {
			others = append(others, n)
		}
	}
	slices.SortFunc(others, func(a, b *store.Node) int { return strings.Compare(a.Name, b.Name) })
	names := make([]string, 0, len(c.peers))
	for name := range c.peers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		bp := c.peers[name]
		origin := "BGPPeer " + name
		if applies(bp, self) {
			if bp.PeerIP.IsValid() {
				src, ok := source(bp.PeerIP, bp.NoSourceAddress)
				if !ok {
					say("bgp/session/"+bp.PeerIP.String(), fmt.Sprintf("%s: this node has no address of peer %s's family (spec.bgp)", origin, bp.PeerIP))
					continue
				}
				local := cmp.Or(bp.LocalASNumber, asn)
				add(BGPPeer{Addr: bp.PeerIP, Port: bp.PeerPort, ASN: bp.ASNumber, LocalASN: local, SourceAddr: src,
					Password: derefSecret(bp.Password), RestartTime: bp.MaxRestartTime, TTLSecurity: bp.TTLSecurity, NextHop: bp.NextHopMode,
					// An iBGP peer by address is a reflector's client (it has no cluster ID).
					RRClient: sp.ClusterID.IsValid() && bp.ASNumber == local, Origin: origin})
			} else {
				for _, n := range others {
					if bp.PeerSelector.Matches(n.Labels) {
						nodePeer(n, bp, origin)
					}
				}
			}
		}
		// The reverse: the nodes this peering applies to peer with this node when it is one
		// they select.
		if bp.PeerSelector.Set() && !bp.ManualReverse && bp.PeerSelector.Matches(self.Labels) {
			for _, n := range others {
				if applies(bp, n) {
					nodePeer(n, bp, origin)
				}
			}
		}
	}
	if !global.NoNodeToNodeMesh && !sp.ClusterID.IsValid() {
		for _, n := range others {
			if !n.BGP.RouteReflectorClusterID.IsValid() {
				nodePeer(n, nil, "mesh")
			}
		}
	}
	return sp, out
}

// listenPort is the port node's speaker listens on, as its BGP configurations say (0: 179).
func (c *bgpCalc) listenPort(node string) uint16 {
	port := uint16(0)
	if g := c.bgpConfigs["default"]; g != nil {
		port = g.ListenPort
	}
	if nc := c.bgpConfigs[store.NodeConfigPrefix+node]; nc != nil && nc.ListenPort != 0 {
		port = nc.ListenPort
	}
	if port == DefaultBGPPort {
		return 0
	}
	return port
}

func derefSecret(r *store.SecretKeyRef) store.SecretKeyRef {
	if r == nil {
		return store.SecretKeyRef{}
	}
	return *r
}

// bgpState is the BGP part of the desired state, sorted.
func (c *bgpCalc) state(s *State) {
	if c.speaker != nil {
		sp := *c.speaker
		s.BGPSpeaker = &sp
	}
	for _, p := range c.sessions {
		s.BGPPeers = append(s.BGPPeers, *p)
	}
	for _, p := range c.paths {
		s.BGPPaths = append(s.BGPPaths, *p)
	}
}
