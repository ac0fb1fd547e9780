package bpf

import (
	"cmp"
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
	f        calc.Frontend
	list     uint64
	addrOnly bool
	sources  []SourceRangeKey
	live     []netip.AddrPort // endpoints named or in use (counted in Services.live)
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

	mu       sync.Mutex
	fe       *dataplane.Tracker[FrontendKey, FrontendValue]
	be       *dataplane.Tracker[BackendKey, BackendValue]
	src      *dataplane.Tracker[SourceRangeKey, uint32]
	cnet     *dataplane.Tracker[ClusterNetKey, ClusterNetVal]
	settings *dataplane.Tracker[uint32, Settings]
	fronts   map[calc.FrontendKey]wanted
	lists    map[uint64]*list
	addrOnly map[netip.Addr]map[calc.FrontendKey]uint64 // cluster IPs: their frontends' service identities
	svcIDs   map[uint64]map[string]int
	refused  map[calc.FrontendKey]calc.Frontend // frontends whose service identity is another's
	self     map[netip.Prefix]bool              // this node's own addresses (both families)
	// live counts the endpoints the frontends' slices still name (Frontend.Present and the
	// backends in use): the cleaner's test for flows whose endpoint went.
	live     map[netip.AddrPort]int
	wepDst   map[netip.Prefix]string
	weps     map[string]int
	problems map[calc.FrontendKey]string
	full     bool
	resync   bool
	stats    Stats

	// feLists and heldLists are the lists the frontends in the map point at (as written or
	// read): a list is not deleted while one does.
	feLists   map[FrontendKey]uint64
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
	s.be = dataplane.NewTracker[BackendKey, BackendValue](func(a, b BackendValue) bool { return a == b })
	s.src = dataplane.NewTracker[SourceRangeKey, uint32](func(a, b uint32) bool { return a == b })
	s.cnet = dataplane.NewTracker[ClusterNetKey, ClusterNetVal](func(a, b ClusterNetVal) bool { return a == b })
	s.settings = dataplane.NewTracker[uint32, Settings](func(a, b Settings) bool { return a == b })
	s.fronts = map[calc.FrontendKey]wanted{}
	s.lists = map[uint64]*list{}
	s.addrOnly = map[netip.Addr]map[calc.FrontendKey]uint64{}
	s.svcIDs = map[uint64]map[string]int{}
	s.refused = map[calc.FrontendKey]calc.Frontend{}
	s.feLists = map[FrontendKey]uint64{}
	s.heldLists = map[uint64]int{}
	s.self = map[netip.Prefix]bool{}
	s.live = map[netip.AddrPort]int{}
	s.wepDst = map[netip.Prefix]string{}
	s.weps = map[string]int{}
	s.problems = map[calc.FrontendKey]string{}
	s.resync = true
}

// OnUpdate takes one calc update. It reports whether the update touched anything the
// service stage programs (a route change elsewhere in the cluster does not).
func (s *Services) OnUpdate(u *calc.Update) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.Full {
		s.reset()
		s.full = true
		changed = true
	}
	for _, op := range u.Ops {
		switch {
		case op.Frontend != nil:
			changed = true
			s.removeFrontendLocked(op.Frontend.Key)
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
	if owners := s.svcIDs[f.ServiceID]; len(owners) > 0 && owners[f.Service] == 0 {
		for other := range owners {
			s.problems[pkey] = fmt.Sprintf("service identity %016x is already %s's; %s is not programmed", f.ServiceID, other, f.Service)
		}
		s.refused[f.Key] = f
		return
	}
	owners := s.svcIDs[f.ServiceID]
	if owners == nil {
		owners = map[string]int{}
		s.svcIDs[f.ServiceID] = owners
	}
	owners[f.Service]++
	w := wanted{f: f}
	bes := make([]BackendValue, 0, len(f.Backends))
	for i, b := range f.Backends {
		local := b.Node == s.cfg.NodeName
		if !b.Addr.Is4() {
			continue
		}
		v := BackendValue{Addr: NetAddr(b.Addr), Port: NetPort(b.Port)}
		if local {
			v.Flags = BackendLocal
		} else if b.NodeAddr.Is4() {
			v.NodeAddr = NetAddr(b.NodeAddr)
		} else if i >= f.LocalBackends {
			// A remote endpoint whose node has no IPv4 address cannot be tunnelled to;
			// remote endpoints come last, so dropping it shortens the cluster set only.
			s.problems[pkey] = fmt.Sprintf("endpoint %s is on node %q, which has no IPv4 address; not used", b.Addr, b.Node)
			continue
		}
		bes = append(bes, v)
	}
	w.list = listID(bes)
	l := s.lists[w.list]
	if l == nil {
		l = &list{entries: bes}
		s.lists[w.list] = l
		for i, v := range bes {
			s.be.SetDesired(BackendKey{ListId: w.list, Ordinal: uint32(i)}, v)
		}
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
		holders := s.addrOnly[f.Key.Addr]
		if holders == nil {
			holders = map[calc.FrontendKey]uint64{}
			s.addrOnly[f.Key.Addr] = holders
		}
		holders[f.Key] = f.ServiceID
		s.setAddrOnlyLocked(f.Key.Addr)
	}
	// Every endpoint in use is live, whether or not the update listed it as present.
	w.live = slices.Clone(f.Present)
	for _, b := range f.Backends {
		w.live = append(w.live, netip.AddrPortFrom(b.Addr, b.Port))
	}
	slices.SortFunc(w.live, netip.AddrPort.Compare)
	w.live = slices.Compact(w.live)
	for _, ap := range w.live {
		s.live[ap]++
	}
	s.fronts[f.Key] = w
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
	var first calc.FrontendKey
	for k := range holders {
		if !first.Addr.IsValid() || cmpFrontendKey(k, first) < 0 {
			first = k
		}
	}
	s.fe.SetDesired(ak, FrontendValue{SvcId: holders[first], Flags: FrontendAddrOnly})
}

func (s *Services) removeFrontendLocked(k calc.FrontendKey) {
	delete(s.problems, k)
	delete(s.refused, k)
	w, ok := s.fronts[k]
	if !ok {
		return
	}
	delete(s.fronts, k)
	for _, ap := range w.live {
		if s.live[ap]--; s.live[ap] <= 0 {
			delete(s.live, ap)
		}
	}
	key := FrontendMapKey(k)
	s.fe.DeleteDesired(key)
	if owners := s.svcIDs[w.f.ServiceID]; owners != nil {
		if owners[w.f.Service]--; owners[w.f.Service] <= 0 {
			delete(owners, w.f.Service)
		}
		if len(owners) == 0 {
			delete(s.svcIDs, w.f.ServiceID)
		}
	}
	if l := s.lists[w.list]; l != nil {
		if l.refs--; l.refs == 0 {
			for i := range l.entries {
				s.be.DeleteDesired(BackendKey{ListId: w.list, Ordinal: uint32(i)})
			}
			delete(s.lists, w.list)
		}
	}
	for _, sk := range w.sources {
		s.src.DeleteDesired(sk)
	}
	if w.addrOnly {
		delete(s.addrOnly[k.Addr], k)
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
	return s.live[netip.AddrPortFrom(addr, port)] > 0
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
	// Backend entries and frontends are written in batches: collected from the trackers,
	// written, then marked. A list with an entry refused is not written, and no frontend
	// is pointed at it in this apply.
	failedLists := map[uint64]bool{}
	var beKeys []BackendKey
	var beVals []BackendValue
	collectBe := func(k BackendKey, v BackendValue) bool {
		beKeys, beVals = append(beKeys, k), append(beVals, v)
		return false
	}
	writeBe := func() {
		s.be.ReserveActual(len(beKeys))
		putAll(s.t.Backends, beKeys, beVals, func(i int) {
			s.be.SetActual(beKeys[i], beVals[i])
			s.be.Clean(beKeys[i])
			wrote(nil)
		}, func(i int, err error) {
			k := beKeys[i]
			failedLists[k.ListId] = true
			fail(fmt.Sprintf("backend list %016x of %s", k.ListId, s.serviceOfListLocked(k.ListId)), s.full1(err, "backends", s.t.Backends.Max()))
		})
		beKeys, beVals = beKeys[:0], beVals[:0]
	}
	delBe := func(k BackendKey, v BackendValue) bool {
		if s.heldLists[k.ListId] > 0 {
			return false // a frontend in the map still points at it (moving it failed): later
		}
		if err := s.t.Backends.Delete(k); err != nil {
			fail("deleting backend "+BackendString(k, v), err)
			return false
		}
		s.be.DeleteActual(k)
		return wrote(nil)
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
		return false
	}
	delFe := func(k FrontendKey, v FrontendValue) bool {
		if err := s.t.Frontends.Delete(k); err != nil {
			fail("deleting frontend "+FrontendString(k, v), err)
			return false
		}
		s.fe.DeleteActual(k)
		s.holdLocked(k, v, false)
		return wrote(nil)
	}
	// Frontends no longer wanted go first, making room in a full map for the new ones.
	s.fe.Pending(func(FrontendKey, FrontendValue) bool { return false }, delFe)
	// Adds first: lists and source ranges exist before the frontends that use them.
	beKeys, beVals = make([]BackendKey, 0, s.be.DirtyLen()), make([]BackendValue, 0, s.be.DirtyLen())
	s.be.Pending(collectBe, func(BackendKey, BackendValue) bool { return false })
	writeBe()
	s.src.Pending(setSrc, func(SourceRangeKey, uint32) bool { return false })
	feKeys, feVals = make([]FrontendKey, 0, s.fe.DirtyLen()), make([]FrontendValue, 0, s.fe.DirtyLen())
	s.fe.Pending(collectFe, delFe)
	s.fe.ReserveActual(len(feKeys))
	putAll(s.t.Frontends, feKeys, feVals, func(i int) {
		k, v := feKeys[i], feVals[i]
		s.fe.SetActual(k, v)
		s.fe.Clean(k)
		s.holdLocked(k, v, true)
		wrote(nil)
	}, func(i int, err error) {
		k, v := feKeys[i], feVals[i]
		fail(fmt.Sprintf("frontend %s of %s", FrontendString(k, v), s.serviceOfLocked(k)), s.full1(err, "frontends", s.t.Frontends.Max()))
	})
	s.be.Pending(collectBe, delBe)
	writeBe()
	s.src.Pending(setSrc, delSrc)
	return errors.Join(errs...)
}

// holdLocked records that the frontend map holds v at k (held) or nothing.
func (s *Services) holdLocked(k FrontendKey, v FrontendValue, held bool) {
	if old, ok := s.feLists[k]; ok {
		if s.heldLists[old]--; s.heldLists[old] <= 0 {
			delete(s.heldLists, old)
		}
		delete(s.feLists, k)
	}
	if held && v.Flags&FrontendAddrOnly == 0 {
		s.feLists[k] = v.ListId
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
			return "service " + w.f.Service
		}
	}
	return "no service"
}

func (s *Services) serviceOfListLocked(id uint64) string {
	for _, w := range s.fronts {
		if w.list == id {
			return "service " + w.f.Service
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
	s.fe.ReplaceActual(fe)
	clear(s.feLists)
	clear(s.heldLists)
	for k, v := range fe {
		s.holdLocked(k, v, true)
	}
	s.be.ReplaceActual(be)
	s.src.ReplaceActual(src)
	s.cnet.ReplaceActual(cn)
	s.settings.ReplaceActual(st)
	return nil
}

// Counts returns desired and programmed entries per map, for metrics.
func (s *Services) Counts() map[string][2]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return map[string][2]int{
		"frontends":     {s.fe.DesiredLen(), s.fe.ActualLen()},
		"backends":      {s.be.DesiredLen(), s.be.ActualLen()},
		"source_ranges": {s.src.DesiredLen(), s.src.ActualLen()},
		"cluster_nets":  {s.cnet.DesiredLen(), s.cnet.ActualLen()},
	}
}
