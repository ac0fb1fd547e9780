package bpf

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
)

// Config configures the service maps' driver.
type Config struct {
	// NodeName is this node: its backends are local, its addresses are CNET_SELF.
	NodeName string
	// TunnelMTU is the largest inner IP packet the node-port tunnel carries.
	TunnelMTU int
	// VXLANPort and VNI of the node-port tunnel (VNI distinct from the overlay's 4096).
	VXLANPort uint16
	VNI       uint32
	// PSNATMin and PSNATMax bound the source ports of flows forwarded to another node.
	PSNATMin, PSNATMax uint16
	// NetnsCookie is the agent's network namespace: the socket programs act only there.
	NetnsCookie uint64
}

// Defaults for Config.
const (
	DefaultVXLANPort = 4789
	DefaultVNI       = 0x51ce00
	DefaultPSNATMin  = 20000
	DefaultPSNATMax  = 29999
)

// list is one backend list in the maps, shared by the frontends with the same endpoints.
type list struct {
	entries []BackendValue
	refs    int
}

// wanted is what one calc frontend became in the maps.
type wanted struct {
	service  string // namespace/name
	svcID    uint64
	list     uint64
	addrOnly bool
	sources  []SourceRangeKey
	live     *liveSet // endpoints named or in use
}

// liveSet is one set of endpoints that frontends name (Frontend.Present and the backends in
// use), shared by the frontends naming the same set: a service's cluster IP and node ports
// count its endpoints once, not once each.
type liveSet struct {
	key  string // the endpoints, encoded (see holdLiveLocked): the set's key in Services.liveSets
	refs int
}

// eachLive calls fn for each endpoint a live set's key encodes: a family byte (4 or 16), the
// address, the port big-endian; a zero byte separates the present from the backends.
func eachLive(key string, fn func(netip.AddrPort)) {
	for i := 0; i < len(key); {
		var a netip.Addr
		switch key[i] {
		case 0:
			i++
			continue
		case 4:
			a = netip.AddrFrom4([4]byte([]byte(key[i+1 : i+5])))
			i += 5
		default:
			a = netip.AddrFrom16([16]byte([]byte(key[i+1 : i+17])))
			i += 17
		}
		fn(netip.AddrPortFrom(a, binary.BigEndian.Uint16([]byte(key[i:i+2]))))
		i += 2
	}
}

// idOwner is the one service holding a service identity, and how many frontends of it do.
type idOwner struct {
	service string
	n       int
}

// addrHolder is a cluster-IP frontend holding its address's address-only entry.
type addrHolder struct {
	key calc.FrontendKey
	id  uint64
}

// Services keeps the service maps matching calc's frontends and cluster networks. Updates
// only change the desired state; Apply writes the difference.
//
// Hazards that shaped it: a backend list is written before any frontend points at it and
// deleted only after none does, so a packet never meets a half-written service (the order
// Felix learned: delete frontends, write backends, write frontends, delete backends); a
// service identity found on two services is refused, not shared (Calico #13279: backends
// flapped between the two) and let in once the first service is gone; nothing is written
// before the first full update, so a restart never erases node ports for a moment (Calico
// #12192); a list stays while a frontend in the map still points at it, even when moving that
// frontend failed; the address-only entry names the cluster IP's lowest frontend, so the maps
// do not depend on the order the frontends came in.
type Services struct {
	cfg Config
	t   Tables

	mu sync.Mutex
	fe *dataplane.Tracker[FrontendKey, FrontendValue]
	// be tracks backend lists, not single entries: a list's identity is a hash of its
	// content, so it is written and removed whole (a cold start handles 10,000 lists where it
	// would handle 100,000 entries). An actual list read with a gap holds a zero entry there.
	be      *dataplane.Tracker[uint64, []BackendValue]
	beCount [2]int       // backend entries desired and programmed
	strays  []BackendKey // backend entries read that no list can hold, to delete
	// idxStrays are backend-index entries read that no list's entry names, to delete. The
	// index is part of a list: an entry whose index entry reads wrong is rewritten with it.
	idxStrays []BackendIndex
	src       *dataplane.Tracker[SourceRangeKey, uint32]
	cnet      *dataplane.Tracker[ClusterNetKey, ClusterNetVal]
	settings  *dataplane.Tracker[uint32, Settings]
	fronts    map[calc.FrontendKey]wanted
	lists     map[uint64]*list
	addrOnly  map[netip.Addr][]addrHolder // cluster IPs: their frontends and service identities
	svcIDs    map[uint64]idOwner
	refused   map[calc.FrontendKey]calc.Frontend // frontends whose service identity is another's
	self      map[netip.Prefix]bool              // this node's own addresses (both families)
	// liveSets are the endpoint sets the frontends name (Frontend.Present and the backends in
	// use); live is their union, the cleaner's test for flows whose endpoint went, rebuilt
	// when the cleaner asks after a set came or went (not at every change: a cold start
	// would count 100,000 endpoints for nothing).
	liveSets  map[string]*liveSet
	live      map[netip.AddrPort]struct{}
	liveStale bool
	// liveShrunk: a set of endpoints was let go since EndpointsGone last said so; an endpoint
	// may have left its service, and its flows must go at once (SweepStale).
	liveShrunk bool
	liveBuf    []byte
	beBuf      []BackendValue
	wepDst     map[netip.Prefix]string
	weps       map[string]int
	problems   map[calc.FrontendKey]string
	full       bool
	resync     bool
	stats      Stats

	// heldLists counts the frontends in the map (as written or read) pointing at each list:
	// a list is not deleted while one does.
	heldLists map[uint64]int
}

// Stats are the driver's counters.
type Stats struct {
	Writes   int64
	MapFull  int64
	Failures int64
}

// NewServices returns a driver over t; nothing is written before the first full update.
func NewServices(t Tables, cfg Config) *Services {
	s := &Services{cfg: cfg, t: t}
	s.reset()
	return s
}

func (s *Services) reset() {
	s.fe = dataplane.NewTracker[FrontendKey, FrontendValue](func(a, b FrontendValue) bool { return a == b })
	s.be = dataplane.NewTracker[uint64, []BackendValue](slices.Equal[[]BackendValue])
	s.beCount = [2]int{}
	s.src = dataplane.NewTracker[SourceRangeKey, uint32](func(a, b uint32) bool { return a == b })
	s.cnet = dataplane.NewTracker[ClusterNetKey, ClusterNetVal](func(a, b ClusterNetVal) bool { return a == b })
	s.settings = dataplane.NewTracker[uint32, Settings](func(a, b Settings) bool { return a == b })
	s.fronts = map[calc.FrontendKey]wanted{}
	s.lists = map[uint64]*list{}
	s.addrOnly = map[netip.Addr][]addrHolder{}
	s.svcIDs = map[uint64]idOwner{}
	s.refused = map[calc.FrontendKey]calc.Frontend{}
	s.heldLists = map[uint64]int{}
	s.self = map[netip.Prefix]bool{}
	// A full update may leave out endpoints the last state named: their flows must go.
	s.liveShrunk = s.liveShrunk || len(s.liveSets) > 0
	s.liveSets = map[string]*liveSet{}
	s.liveStale = true
	s.wepDst = map[netip.Prefix]string{}
	s.weps = map[string]int{}
	s.problems = map[calc.FrontendKey]string{}
	s.resync = true
	// A reset is always followed by a fresh read of the maps, which compares every key.
	for _, t := range []interface{ DirtyAll() }{s.fe, s.be, s.src, s.cnet, s.settings} {
		t.DirtyAll()
	}
}

// expectLocked sizes the empty tables of a reset for a full update of u's size: maps grown
// one key at a time to 100,000 copy themselves a dozen times.
func (s *Services) expectLocked(u *calc.Update) {
	nFront, nList := 0, 0
	for _, op := range u.Ops {
		if op.Frontend != nil && !op.Remove {
			nFront++
			if op.Frontend.Kind == calc.FrontendClusterIP {
				nList++ // lists and endpoint sets are shared by a service's frontends
			}
		}
	}
	s.fronts = make(map[calc.FrontendKey]wanted, nFront)
	s.fe.Expect(nFront)
	s.be.Expect(nList)
	s.lists = make(map[uint64]*list, nList)
	s.liveSets = make(map[string]*liveSet, nList)
	s.svcIDs = make(map[uint64]idOwner, nList)
	s.addrOnly = make(map[netip.Addr][]addrHolder, nList)
}

// OnUpdate takes one calc update. It reports whether the update touched anything the
// service stage programs (a route change elsewhere in the cluster does not).
func (s *Services) OnUpdate(u *calc.Update) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.Full {
		s.reset()
		s.expectLocked(u)
		s.full = true
		changed = true
	}
	var last *calc.FrontendKey
	for _, op := range u.Ops {
		switch {
		case op.Frontend != nil:
			changed = true
			// A full update follows a reset and names each frontend once, in key order (calc's
			// State): there is nothing to remove unless a key comes again.
			if !u.Full || (last != nil && *last == op.Frontend.Key) {
				s.removeFrontendLocked(op.Frontend.Key)
			}
			last = &op.Frontend.Key
			if !op.Remove {
				s.setFrontendLocked(*op.Frontend)
			}
		case op.ClusterNet != nil:
			changed = true
			s.setClusterNetLocked(*op.ClusterNet, op.Remove)
		case op.Route != nil:
			// Routes are keyed by destination: a workload's address that now leads elsewhere
			// comes as a set with another reason, not as a removal.
			if s.setWorkloadRouteLocked(*op.Route, op.Remove || op.Route.Reason != calc.ReasonLocalWorkload) {
				changed = true
			}
		}
	}
	s.retryRefusedLocked()
	s.setSettingsLocked()
	return changed
}

// retryRefusedLocked tries again the frontends refused for a service identity that was
// another's: in key order, so the same state gives the same owner however it came.
func (s *Services) retryRefusedLocked() {
	if len(s.refused) == 0 {
		return
	}
	keys := make([]calc.FrontendKey, 0, len(s.refused))
	for k := range s.refused {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmpFrontendKey)
	for _, k := range keys {
		f := s.refused[k]
		delete(s.refused, k)
		s.setFrontendLocked(f) // refused again, with the current owner named, while it clashes
	}
}

func cmpFrontendKey(a, b calc.FrontendKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), strings.Compare(string(a.Protocol), string(b.Protocol)))
}

func protoNumber(p store.Protocol) uint8 {
	switch p {
	case store.ProtocolTCP:
		return ProtoTCP
	case store.ProtocolUDP:
		return ProtoUDP
	case store.ProtocolSCTP:
		return ProtoSCTP
	}
	return 0
}

// FrontendMapKey is the frontend map's key for a calc frontend key (IPv4).
func FrontendMapKey(k calc.FrontendKey) FrontendKey {
	return FrontendKey{Addr: NetAddr(k.Addr), Port: NetPort(k.Port), Proto: protoNumber(k.Protocol)}
}

func (s *Services) setFrontendLocked(f calc.Frontend) {
	pkey := f.Key // rendered only when Problems is asked (formatting every key cost a cold start a fifth)
	delete(s.problems, pkey)
	if !f.Key.Addr.Is4() {
		s.problems[pkey] = "IPv6 frontends are not programmed yet"
		return
	}
	if f.Key.Protocol != store.ProtocolTCP && f.Key.Protocol != store.ProtocolUDP {
		s.problems[pkey] = "only TCP and UDP services are programmed"
		return
	}
	owner, held := s.svcIDs[f.ServiceID]
	if held && owner.service != f.Service {
		s.problems[pkey] = fmt.Sprintf("service identity %016x is already %s's; %s is not programmed", f.ServiceID, owner.service, f.Service)
		s.refused[f.Key] = f
		return
	}
	s.svcIDs[f.ServiceID] = idOwner{service: f.Service, n: owner.n + 1}
	w := wanted{service: f.Service, svcID: f.ServiceID}
	bes := s.beBuf[:0] // cloned only for a new list
	for _, b := range f.Backends {
		if !b.Addr.Is4() {
			continue
		}
		v := BackendValue{Addr: NetAddr(b.Addr), Port: NetPort(b.Port)}
		switch {
		case b.Node == s.cfg.NodeName:
			v.Flags = BackendLocal
		case b.Node == "":
			// An endpoint on no node (a slice written by hand for an address outside the
			// cluster, as kube-proxy allows) is reached by routing, never by the tunnel.
			v.Flags = BackendRouted
		case b.NodeAddr.Is4():
			v.NodeAddr = NetAddr(b.NodeAddr)
		default:
			// A remote endpoint whose node has no IPv4 address cannot be tunnelled to;
			// remote endpoints come last, so dropping it shortens the cluster set only.
			s.problems[pkey] = fmt.Sprintf("endpoint %s is on node %q, which has no IPv4 address; not used", b.Addr, b.Node)
			continue
		}
		bes = append(bes, v)
	}
	s.beBuf = bes
	w.list = listID(bes)
	l := s.lists[w.list]
	if l == nil {
		bes = slices.Clone(bes)
		l = &list{entries: bes}
		s.lists[w.list] = l
		s.be.SetDesired(w.list, bes)
		s.beCount[0] += len(bes)
	}
	l.refs++
	v := FrontendValue{ListId: w.list, SvcId: f.ServiceID, Count: uint32(len(bes)), Local: uint32(min(f.LocalBackends, len(bes))),
		ClusterStart: uint32(min(f.ClusterStart, len(bes))), AffinitySec: uint32(f.AffinityTimeout)}
	if f.ExternalLocal {
		v.Flags |= FrontendExternalLocal
	}
	if f.InternalLocal {
		v.Flags |= FrontendInternalLocal
	}
	if f.Kind == calc.FrontendNodePort {
		v.Flags |= FrontendNodePort
	}
	key := FrontendMapKey(f.Key)
	for _, p := range f.SourceRanges {
		if !p.Addr().Is4() {
			continue
		}
		sk := SourceRangeKey{Prefixlen: uint32(64 + p.Bits()), FeAddr: key.Addr, FePort: key.Port, Proto: key.Proto,
			Src: NetAddr(p.Masked().Addr())}
		w.sources = append(w.sources, sk)
		s.src.SetDesired(sk, 1)
	}
	if len(f.SourceRanges) > 0 {
		// A load balancer limited to IPv6 ranges admits no IPv4 client: the flag stays.
		v.Flags |= FrontendSourceRanges
	}
	s.fe.SetDesired(key, v)
	if f.Kind == calc.FrontendClusterIP {
		w.addrOnly = true
		s.addrOnly[f.Key.Addr] = append(s.addrOnly[f.Key.Addr], addrHolder{key: f.Key, id: f.ServiceID})
		s.setAddrOnlyLocked(f.Key.Addr)
	}
	w.live = s.holdLiveLocked(f)
	s.fronts[f.Key] = w
}

// holdLiveLocked counts the endpoints f names (every endpoint in use is live, whether or not
// the update listed it as present) through the set shared with the frontends naming the same.
func (s *Services) holdLiveLocked(f calc.Frontend) *liveSet {
	buf := s.liveBuf[:0]
	put := func(ap netip.AddrPort) {
		if a := ap.Addr(); a.Is4() {
			b := a.As4()
			buf = append(append(buf, 4), b[:]...)
		} else {
			b := a.As16()
			buf = append(append(buf, 16), b[:]...)
		}
		buf = binary.BigEndian.AppendUint16(buf, ap.Port())
	}
	for _, ap := range f.Present {
		put(ap)
	}
	buf = append(buf, 0)
	for _, b := range f.Backends {
		put(netip.AddrPortFrom(b.Addr, b.Port))
	}
	s.liveBuf = buf
	if ls := s.liveSets[string(buf)]; ls != nil {
		ls.refs++
		return ls
	}
	ls := &liveSet{key: string(buf), refs: 1}
	s.liveSets[ls.key] = ls
	s.liveStale = true
	return ls
}

// releaseLiveLocked drops a frontend's hold on its endpoint set.
func (s *Services) releaseLiveLocked(ls *liveSet) {
	if ls == nil {
		return
	}
	if ls.refs--; ls.refs > 0 {
		return
	}
	delete(s.liveSets, ls.key)
	s.liveStale = true
	s.liveShrunk = true
}

// EndpointsGone says whether an endpoint may have left its service since it last said so:
// the stage then deletes the flows to endpoints that are gone (Conntrack.SweepStale).
func (s *Services) EndpointsGone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	gone := s.liveShrunk
	s.liveShrunk = false
	return gone
}

// setAddrOnlyLocked wants the address-only entry of cluster IP a while a cluster-IP frontend
// holds it, naming the service of the lowest such frontend (not the first to come, so the
// entry does not depend on the order of updates).
func (s *Services) setAddrOnlyLocked(a netip.Addr) {
	ak := FrontendKey{Addr: NetAddr(a)}
	holders := s.addrOnly[a]
	if len(holders) == 0 {
		delete(s.addrOnly, a)
		s.fe.DeleteDesired(ak)
		return
	}
	first := holders[0]
	for _, h := range holders[1:] {
		if cmpFrontendKey(h.key, first.key) < 0 {
			first = h
		}
	}
	s.fe.SetDesired(ak, FrontendValue{SvcId: first.id, Flags: FrontendAddrOnly})
}

func (s *Services) removeFrontendLocked(k calc.FrontendKey) {
	if len(s.problems) > 0 {
		delete(s.problems, k)
	}
	if len(s.refused) > 0 {
		delete(s.refused, k)
	}
	w, ok := s.fronts[k]
	if !ok {
		return
	}
	delete(s.fronts, k)
	s.releaseLiveLocked(w.live)
	key := FrontendMapKey(k)
	s.fe.DeleteDesired(key)
	if owner := s.svcIDs[w.svcID]; owner.n > 1 {
		s.svcIDs[w.svcID] = idOwner{service: owner.service, n: owner.n - 1}
	} else {
		delete(s.svcIDs, w.svcID)
	}
	if l := s.lists[w.list]; l != nil {
		if l.refs--; l.refs == 0 {
			s.be.DeleteDesired(w.list)
			s.beCount[0] -= len(l.entries)
			delete(s.lists, w.list)
		}
	}
	for _, sk := range w.sources {
		s.src.DeleteDesired(sk)
	}
	if w.addrOnly {
		s.addrOnly[k.Addr] = slices.DeleteFunc(s.addrOnly[k.Addr], func(h addrHolder) bool { return h.key == k })
		s.setAddrOnlyLocked(k.Addr)
	}
}

func (s *Services) setClusterNetLocked(n calc.ClusterNet, remove bool) {
	if !remove && n.Host && n.Node == s.cfg.NodeName {
		s.self[n.Prefix] = true
	} else {
		delete(s.self, n.Prefix)
	}
	if !n.Prefix.Addr().Is4() {
		return
	}
	k := ClusterNetKey{Prefixlen: uint32(n.Prefix.Bits()), Addr: NetAddr(n.Prefix.Masked().Addr())}
	if remove {
		s.cnet.DeleteDesired(k)
		return
	}
	v := ClusterNetVal{Flags: ClusterNetPool}
	if n.Host {
		v.Flags = ClusterNetHost
		if n.Node == s.cfg.NodeName {
			v.Flags |= ClusterNetSelf
		}
	}
	s.cnet.SetDesired(k, v)
}

func (s *Services) setWorkloadRouteLocked(r calc.Route, remove bool) bool {
	old, had := s.wepDst[r.Dst]
	if had {
		if s.weps[old]--; s.weps[old] <= 0 {
			delete(s.weps, old)
		}
		delete(s.wepDst, r.Dst)
	}
	if remove || r.Device == "" {
		return had
	}
	s.wepDst[r.Dst] = r.Device
	s.weps[r.Device]++
	return !had || old != r.Device
}

// HostIP returns this node's IPv4 underlay address as calc knows it.
func (s *Services) HostIP() netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostIPLocked()
}

func (s *Services) hostIPLocked() netip.Addr {
	// The lowest, so a node with several IPv4 addresses always tunnels from the same one.
	var best netip.Addr
	for p := range s.self {
		if p.Addr().Is4() && (!best.IsValid() || p.Addr().Less(best)) {
			best = p.Addr()
		}
	}
	return best
}

// SelfAddrs returns this node's own addresses as calc knows them, sorted.
func (s *Services) SelfAddrs() []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]netip.Addr, 0, len(s.self))
	for p := range s.self {
		out = append(out, p.Addr())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// LiveEndpoint says whether a service still names addr:port as an endpoint.
func (s *Services) LiveEndpoint(addr netip.Addr, port uint16) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.liveStale {
		s.live = make(map[netip.AddrPort]struct{}, len(s.live))
		for _, ls := range s.liveSets {
			eachLive(ls.key, func(ap netip.AddrPort) { s.live[ap] = struct{}{} })
		}
		s.liveStale = false
	}
	_, ok := s.live[netip.AddrPortFrom(addr, port)]
	return ok
}

func (s *Services) setSettingsLocked() {
	if !s.full {
		return
	}
	v := Settings{TunnelMtu: uint32(s.cfg.TunnelMTU), Vni: s.cfg.VNI, VxlanPort: NetPort(s.cfg.VXLANPort),
		PsnatMin: s.cfg.PSNATMin, PsnatMax: s.cfg.PSNATMax, NetnsCookie: s.cfg.NetnsCookie}
	if a := s.hostIPLocked(); a.IsValid() {
		v.HostIp = NetAddr(a)
	}
	s.settings.SetDesired(0, v)
}

// SetTunnelMTU changes the tunnel MTU (the parent interface's MTU changed).
func (s *Services) SetTunnelMTU(mtu int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.TunnelMTU = mtu
	s.setSettingsLocked()
}

// Workloads returns the workload interfaces this node's routes name.
func (s *Services) Workloads() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.weps))
	for w := range s.weps {
		out[w] = true
	}
	return out
}

// Problems returns what the driver could not program, by key.
func (s *Services) Problems() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.problems))
	for k, v := range s.problems {
		out["frontend/"+k.String()] = v
	}
	return out
}

// Ready reports whether the first full update arrived.
func (s *Services) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.full
}

// QueueResync makes the next Apply read every map again (drift, restart).
func (s *Services) QueueResync() {
	s.mu.Lock()
	s.resync = true
	s.mu.Unlock()
}

// Stats returns the counters.
func (s *Services) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Apply writes the difference between the desired and the actual maps: cluster networks and
// settings, frontends no longer wanted, backend lists, frontends, then the lists and source
// ranges no longer wanted. A failed entry stays pending and the rest goes on; the errors are
// joined, each naming its service.
func (s *Services) Apply() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.full {
		return nil
	}
	var errs []error
	if s.resync {
		if err := s.readLocked(); err != nil {
			return err
		}
		s.resync = false
	}
	fail := func(what string, err error) {
		s.stats.Failures++
		if errors.Is(err, ErrMapFull) {
			s.stats.MapFull++
		}
		if len(errs) < 10 {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		} else if len(errs) == 10 {
			errs = append(errs, errors.New("more failures not shown"))
		}
	}
	wrote := func(err error) bool {
		if err == nil {
			s.stats.Writes++
		}
		return err == nil
	}
	never := func(uint32, Settings) bool { return false }
	s.settings.Pending(func(k uint32, v Settings) bool {
		if err := s.t.Settings.Put(k, v); err != nil {
			fail("writing settings", err)
			return false
		}
		s.settings.SetActual(k, v)
		return wrote(nil)
	}, never)
	setCnet := func(k ClusterNetKey, v ClusterNetVal) bool {
		if err := s.t.ClusterNets.Put(k, v); err != nil {
			fail("cluster network "+ClusterNetString(k, v), s.full1(err, "cluster-nets", s.t.ClusterNets.Max()))
			return false
		}
		s.cnet.SetActual(k, v)
		return wrote(nil)
	}
	delCnet := func(k ClusterNetKey, v ClusterNetVal) bool {
		if err := s.t.ClusterNets.Delete(k); err != nil {
			fail("deleting cluster network "+ClusterNetString(k, v), err)
			return false
		}
		s.cnet.DeleteActual(k)
		return wrote(nil)
	}
	s.cnet.Pending(setCnet, delCnet)
	// Backend lists and frontends are written in batches: collected from the trackers (as
	// clean), written, then marked (a failed one dirty again). A list with an entry refused
	// is not written whole, and no frontend is pointed at it in this apply.
	failedLists := map[uint64]bool{}
	var beIDs []uint64
	var beKeys []BackendKey
	var beVals []BackendValue
	var idxKeys []BackendIndex
	var idxVals []uint32
	collectBe := func(id uint64, want []BackendValue) bool {
		beIDs = append(beIDs, id)
		// Only the entries that differ from the map's are written (a list read back with
		// one wrong entry is mended by one write), each with its index entry.
		have, _ := s.be.Actual(id)
		var index map[BackendIndex]uint32 // nil: a short list, not indexed
		if len(want) > AffinityScan {
			index = indexOf(id, want)
		}
		for i, v := range want {
			if i < len(have) && have[i] == v {
				continue
			}
			beKeys, beVals = append(beKeys, BackendKey{ListId: id, Ordinal: uint32(i)}), append(beVals, v)
			// The index entry goes with a new address at i (a gap read is one whose
			// index entry was wrong); a value corrected in place keeps its own.
			moved := i >= len(have) || have[i] == (BackendValue{}) || indexKey(id, have[i]) != indexKey(id, v)
			if o, ok := index[indexKey(id, v)]; ok && o == uint32(i) && moved {
				idxKeys, idxVals = append(idxKeys, indexKey(id, v)), append(idxVals, uint32(i))
			}
		}
		return true
	}
	writeBe := func() {
		refused := func(id uint64, err error) {
			if !failedLists[id] {
				failedLists[id] = true
				fail(fmt.Sprintf("backend list %016x of %s", id, s.serviceOfListLocked(id)), s.full1(err, "backends", s.t.Backends.Max()))
			}
		}
		putAll(s.t.Backends, beKeys, beVals, func(int) { wrote(nil) }, func(i int, err error) { refused(beKeys[i].ListId, err) })
		putAll(s.t.BackendIndex, idxKeys, idxVals, func(int) { wrote(nil) }, func(i int, err error) { refused(idxKeys[i].ListId, err) })
		for _, id := range beIDs {
			if failedLists[id] {
				s.be.MarkDirty(id)
				continue
			}
			want, _ := s.be.Desired(id)
			have, _ := s.be.Actual(id)
			// A list read longer than wanted (drift) loses its extra entries.
			for i := len(want); i < len(have); i++ {
				if err := s.t.Backends.Delete(BackendKey{ListId: id, Ordinal: uint32(i)}); err != nil {
					fail(fmt.Sprintf("deleting backend %016x #%d", id, i), err)
				}
				if v := have[i]; v != (BackendValue{}) && len(have) > AffinityScan && !slices.ContainsFunc(want, func(w BackendValue) bool { return indexKey(id, w) == indexKey(id, v) }) {
					if err := s.t.BackendIndex.Delete(indexKey(id, v)); err != nil {
						fail(fmt.Sprintf("deleting backend index %016x %s", id, BackendString(BackendKey{ListId: id, Ordinal: uint32(i)}, v)), err)
					}
				}
			}
			s.beCount[1] += len(want) - realEntries(have)
			s.be.SetActual(id, want)
		}
		beIDs, beKeys, beVals, idxKeys, idxVals = beIDs[:0], beKeys[:0], beVals[:0], idxKeys[:0], idxVals[:0]
	}
	delBe := func(id uint64, have []BackendValue) bool {
		if s.heldLists[id] > 0 {
			return false // a frontend in the map still points at it (moving it failed): later
		}
		for i, v := range have {
			if v != (BackendValue{}) && len(have) > AffinityScan {
				// The index entry first: one left behind by a failure is a stray the next
				// read deletes, never a pointer into a list half gone.
				if err := s.t.BackendIndex.Delete(indexKey(id, v)); err != nil {
					fail(fmt.Sprintf("deleting backend list %016x", id), err)
					return false
				}
			}
			if err := s.t.Backends.Delete(BackendKey{ListId: id, Ordinal: uint32(i)}); err != nil {
				fail(fmt.Sprintf("deleting backend list %016x", id), err)
				return false
			}
			wrote(nil)
		}
		s.beCount[1] -= realEntries(have)
		s.be.DeleteActual(id)
		return true
	}
	setSrc := func(k SourceRangeKey, v uint32) bool {
		if err := s.t.SourceRanges.Put(k, v); err != nil {
			fail("source range "+SourceRangeString(k), s.full1(err, "source-ranges", s.t.SourceRanges.Max()))
			return false
		}
		s.src.SetActual(k, v)
		return wrote(nil)
	}
	delSrc := func(k SourceRangeKey, v uint32) bool {
		if err := s.t.SourceRanges.Delete(k); err != nil {
			fail("deleting source range "+SourceRangeString(k), err)
			return false
		}
		s.src.DeleteActual(k)
		return wrote(nil)
	}
	var feKeys []FrontendKey
	var feVals []FrontendValue
	collectFe := func(k FrontendKey, v FrontendValue) bool {
		if v.Flags&FrontendAddrOnly == 0 && failedLists[v.ListId] {
			fail(fmt.Sprintf("frontend %s", FrontendString(k, v)), errors.New("its backend list is not written yet"))
			return false
		}
		feKeys, feVals = append(feKeys, k), append(feVals, v)
		return true
	}
	delFe := func(k FrontendKey, v FrontendValue) bool {
		if err := s.t.Frontends.Delete(k); err != nil {
			fail("deleting frontend "+FrontendString(k, v), err)
			return false
		}
		s.holdLocked(k, v, false)
		s.fe.DeleteActual(k)
		return wrote(nil)
	}
	// Frontends no longer wanted go first, making room in a full map for the new ones.
	s.fe.Pending(func(FrontendKey, FrontendValue) bool { return false }, delFe)
	// Adds first: lists and source ranges exist before the frontends that use them.
	n := max(0, s.beCount[0]-s.beCount[1])
	beKeys, beVals = make([]BackendKey, 0, n), make([]BackendValue, 0, n)
	idxKeys, idxVals = make([]BackendIndex, 0, n), make([]uint32, 0, n)
	s.be.Pending(collectBe, func(uint64, []BackendValue) bool { return false })
	writeBe()
	s.src.Pending(setSrc, func(SourceRangeKey, uint32) bool { return false })
	feKeys, feVals = make([]FrontendKey, 0, s.fe.DirtyLen()), make([]FrontendValue, 0, s.fe.DirtyLen())
	// Cold: nothing in the map and every wanted frontend about to be written. When all go in,
	// the tracker adopts the desired state in one copy rather than a SetActual per frontend.
	cold := s.fe.ActualLen() == 0
	s.fe.Pending(collectFe, delFe)
	cold = cold && len(feKeys) == s.fe.DesiredLen()
	var refusedFe map[int]bool
	putAll(s.t.Frontends, feKeys, feVals, func(i int) {
		k, v := feKeys[i], feVals[i]
		if cold {
			if v.Flags&FrontendAddrOnly == 0 {
				s.heldLists[v.ListId]++
			}
		} else {
			s.holdLocked(k, v, true)
			s.fe.SetActual(k, v)
		}
		wrote(nil)
	}, func(i int, err error) {
		k, v := feKeys[i], feVals[i]
		if refusedFe == nil {
			refusedFe = map[int]bool{}
		}
		refusedFe[i] = true
		s.fe.MarkDirty(k)
		fail(fmt.Sprintf("frontend %s of %s", FrontendString(k, v), s.serviceOfLocked(k)), s.full1(err, "frontends", s.t.Frontends.Max()))
	})
	if cold && refusedFe == nil {
		s.fe.AdoptDesired()
	} else if cold {
		s.fe.ReserveActual(len(feKeys))
		for i, k := range feKeys {
			if !refusedFe[i] {
				s.fe.SetActual(k, feVals[i])
			}
		}
	}
	s.be.Pending(collectBe, delBe)
	writeBe()
	for len(s.strays) > 0 {
		k := s.strays[len(s.strays)-1]
		if err := s.t.Backends.Delete(k); err != nil {
			fail(fmt.Sprintf("deleting stray backend %016x #%d", k.ListId, k.Ordinal), err)
			break
		}
		s.strays = s.strays[:len(s.strays)-1]
		wrote(nil)
	}
	for len(s.idxStrays) > 0 {
		k := s.idxStrays[len(s.idxStrays)-1]
		if err := s.t.BackendIndex.Delete(k); err != nil {
			fail(fmt.Sprintf("deleting stray backend index %016x %v", k.ListId, netip.AddrPortFrom(HostAddr(k.Addr), HostPort(k.Port))), err)
			break
		}
		s.idxStrays = s.idxStrays[:len(s.idxStrays)-1]
		wrote(nil)
	}
	s.src.Pending(setSrc, delSrc)
	s.fe.Settle()
	s.be.Settle()
	s.src.Settle()
	s.cnet.Settle()
	s.settings.Settle()
	return errors.Join(errs...)
}

// AffinityScan is the longest list client-IP affinity reads whole (AFF_SCAN); only longer
// lists have index entries.
const AffinityScan = 16

// indexKey is the backend index's key of v in list id.
func indexKey(id uint64, v BackendValue) BackendIndex {
	return BackendIndex{ListId: id, Addr: v.Addr, Port: v.Port}
}

// indexOf is the index a list of more than AffinityScan entries wants: each address:port at
// its first ordinal (an endpoint listed twice is found at the first). Gaps have no entry.
func indexOf(id uint64, l []BackendValue) map[BackendIndex]uint32 {
	out := make(map[BackendIndex]uint32, len(l))
	for i, v := range l {
		if k := indexKey(id, v); v != (BackendValue{}) {
			if _, ok := out[k]; !ok {
				out[k] = uint32(i)
			}
		}
	}
	return out
}

// realEntries counts the entries of an actual list that the map holds (not its gaps).
func realEntries(l []BackendValue) int {
	n := 0
	for _, v := range l {
		if v != (BackendValue{}) {
			n++
		}
	}
	return n
}

// holdLocked records that the frontend map now holds v at k (held) or nothing, before the
// tracker's actual value changes: the lists that frontends in the map point at are counted.
func (s *Services) holdLocked(k FrontendKey, v FrontendValue, held bool) {
	if old, ok := s.fe.Actual(k); ok && old.Flags&FrontendAddrOnly == 0 {
		if s.heldLists[old.ListId]--; s.heldLists[old.ListId] <= 0 {
			delete(s.heldLists, old.ListId)
		}
	}
	if held && v.Flags&FrontendAddrOnly == 0 {
		s.heldLists[v.ListId]++
	}
}

func (s *Services) full1(err error, option string, max int) error {
	if errors.Is(err, ErrMapFull) {
		return fmt.Errorf("%w (%d entries; raise option bpf-map-size-%s)", err, max, option)
	}
	return err
}

func (s *Services) serviceOfLocked(k FrontendKey) string {
	for fk, w := range s.fronts {
		if FrontendMapKey(fk) == k || (k.Port == 0 && k.Addr == NetAddr(fk.Addr)) {
			return "service " + w.service
		}
	}
	return "no service"
}

func (s *Services) serviceOfListLocked(id uint64) string {
	for _, w := range s.fronts {
		if w.list == id {
			return "service " + w.service
		}
	}
	return "no service"
}

// readLocked reads every map into the trackers: adoption after a restart (what matches is
// kept, only the difference is written) and drift repair.
func (s *Services) readLocked() error {
	fe, err := s.t.Frontends.Dump()
	if err != nil {
		return fmt.Errorf("reading the frontend map: %w", err)
	}
	be, err := s.t.Backends.Dump()
	if err != nil {
		return fmt.Errorf("reading the backend map: %w", err)
	}
	src, err := s.t.SourceRanges.Dump()
	if err != nil {
		return fmt.Errorf("reading the source-range map: %w", err)
	}
	cn, err := s.t.ClusterNets.Dump()
	if err != nil {
		return fmt.Errorf("reading the cluster-network map: %w", err)
	}
	st, err := s.t.Settings.Dump()
	if err != nil {
		return fmt.Errorf("reading the settings map: %w", err)
	}
	clear(s.heldLists)
	for _, v := range fe {
		if v.Flags&FrontendAddrOnly == 0 {
			s.heldLists[v.ListId]++
		}
	}
	s.fe.ReplaceActual(fe)
	lists := map[uint64][]BackendValue{}
	s.strays = s.strays[:0]
	for k, v := range be {
		if want := s.lists[k.ListId]; k.Ordinal >= uint32(len(be)) && (want == nil || int(k.Ordinal) >= len(want.entries)) {
			// No list written by a driver has an entry this far (the map holds fewer entries
			// than the ordinal, and no wanted list is that long): removed at the next apply.
			// A wanted list's entry is kept however few entries were read (a list that lost
			// some still holds its last).
			s.strays = append(s.strays, k)
			continue
		}
		l := lists[k.ListId]
		for uint32(len(l)) <= k.Ordinal {
			l = append(l, BackendValue{})
		}
		l[k.Ordinal] = v
		lists[k.ListId] = l
	}
	// A list's entry counts as written only with its index entry right (the first ordinal
	// of its address); one that is not is read as a gap, and rewritten with its index.
	idx, err := s.t.BackendIndex.Dump()
	if err != nil {
		return fmt.Errorf("reading the backend index map: %w", err)
	}
	// Index entries in use: those of the lists read and of the lists wanted (a list read with
	// gaps or short still owns its entries: the apply rewrites them, and must not then delete
	// them as strays).
	named := make(map[BackendIndex]bool, len(idx))
	for id, l := range s.lists {
		if len(l.entries) > AffinityScan {
			for k := range indexOf(id, l.entries) {
				named[k] = true
			}
		}
	}
	blanked := 0
	for id, l := range lists {
		length := len(l)
		if want := s.lists[id]; want != nil {
			length = len(want.entries) // drift may have cut the list read short
		}
		if length <= AffinityScan {
			continue
		}
		for k, o := range indexOf(id, l) {
			named[k] = true
			if got, ok := idx[k]; !ok || got != o {
				l[o] = BackendValue{}
				blanked++
			}
		}
	}
	s.idxStrays = s.idxStrays[:0]
	for k := range idx {
		if !named[k] {
			s.idxStrays = append(s.idxStrays, k)
		}
	}
	s.be.ReplaceActual(lists)
	s.beCount[1] = len(be) - len(s.strays) - blanked
	s.src.ReplaceActual(src)
	s.cnet.ReplaceActual(cn)
	s.settings.ReplaceActual(st)
	return nil
}

// TableNames are the names Counts gives its figures under.
var TableNames = []string{"frontends", "backends", "source_ranges", "cluster_nets"}

// Counts returns desired and programmed entries per map (named as in TableNames), for metrics.
func (s *Services) Counts() map[string][2]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return map[string][2]int{
		"frontends":     {s.fe.DesiredLen(), s.fe.ActualLen()},
		"backends":      {s.beCount[0], s.beCount[1]},
		"source_ranges": {s.src.DesiredLen(), s.src.ActualLen()},
		"cluster_nets":  {s.cnet.DesiredLen(), s.cnet.ActualLen()},
	}
}
