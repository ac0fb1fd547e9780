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
	"github.com/sluice-net/sluice/internal/tracker"
	"github.com/sluice-net/sluice/store"
)

// Config configures the service maps' driver.
type Config struct {
	// NodeName is this node: its backends are local, its addresses are CNET_SELF.
	NodeName string
	// TunnelMTU is the largest inner IP packet the node-port tunnel carries.
	TunnelMTU int
	// TunnelMTU6 is the largest inner IPv6 packet the IPv6 tunnel carries (over the node's
	// IPv6 underlay: 70 bytes of headers); 0: TunnelMTU less 20.
	TunnelMTU6 int
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
	// last is the endpoints of the service's frontend set last and what they became: a
	// service's frontends of one family (cluster IP, node ports, external addresses) name the
	// same endpoints (calc gives them one list per family and traffic policy) and come one
	// family after the other, so all but the first reuse the list and live set instead of
	// encoding, hashing and looking them up again (BenchmarkServicesColdApply). One, not one
	// per family: a map value over 128 bytes costs an allocation per write.
	last lastEndpoints
}

// lastEndpoints is the endpoints of a service's last frontend set (idOwner.last).
type lastEndpoints struct {
	backends []calc.Backend // the frontend's, not copied: calc never changes a sent frontend's
	present  []netip.AddrPort
	id       uint64
	list     any // the family's *list, held while its refs are not 0
	live     *liveSet
	family   int // the index of the family whose list it is
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
	// The maps of each family: IPv4's and IPv6's.
	v4       *famMaps4
	v6       *famMaps6
	settings *tracker.Tracker[uint32, Settings]
	// settings6 are the IPv6 tunnel's (sl_cfg_v6): this node's IPv6 underlay address and
	// the inner MTU over it.
	settings6 *tracker.Tracker[uint32, Settings6]
	svcIDs    map[uint64]*idOwner
	refused   map[calc.FrontendKey]calc.Frontend // frontends whose service identity is another's
	self      map[netip.Prefix]bool              // this node's own addresses (both families)
	// liveSets are the endpoint sets the frontends name (Frontend.Present and the backends in
	// use); live counts, for each endpoint, how many times the sets name it: the cleaner's
	// test for flows whose endpoint went. live is nil until first needed (a cold start would
	// count 100,000 endpoints for nothing) and kept by each set that comes or goes from then
	// on; a set replaced by one naming the same endpoints and more (a service's slice
	// arriving, an endpoint added) changes no count to zero, so nothing is swept.
	liveSets map[string]*liveSet
	live     map[netip.AddrPort]int32
	// gone are the endpoints whose count went to zero since EndpointsGone last said so (and
	// did not come back, as an endpoint does when its frontend is rewritten): they left every
	// service, and their flows must go at once (SweepStale). liveShrunk: a full update may
	// have left out endpoints the last state named.
	gone       map[netip.AddrPort]struct{}
	liveShrunk bool
	// driftBy counts Stats.Drift by map ("IPv4 frontends"), until TakeDrift takes it.
	driftBy  map[string]int
	liveBuf  []byte
	wepDst   map[netip.Prefix]string
	weps     map[string]int
	problems map[calc.FrontendKey]string
	full     bool
	resync   bool
	stats    Stats
}

// Stats are the driver's counters.
type Stats struct {
	Writes   int64
	MapFull  int64
	Failures int64
	// Drift counts the entries a reread of the maps found other than sluice last wrote or
	// read them (changed, missing or added by someone else), which the same apply writes
	// back; changes of the desired state are never drift.
	Drift int64
}

// NewServices returns a driver over t; nothing is written before the first full update.
func NewServices(t Tables, cfg Config) *Services {
	s := &Services{cfg: cfg, t: t, driftBy: map[string]int{}}
	s.v4 = newFamMaps(s, family4(v4{}), t.v4(), 0)
	s.v6 = newFamMaps(s, family6(v6{}), t.V6, 1)
	s.reset()
	return s
}

func (s *Services) reset() {
	s.v4.reset()
	s.v6.reset()
	s.settings = tracker.New[uint32, Settings](func(a, b Settings) bool { return a == b })
	s.settings6 = tracker.New[uint32, Settings6](func(a, b Settings6) bool { return a == b })
	s.svcIDs = map[uint64]*idOwner{}
	s.refused = map[calc.FrontendKey]calc.Frontend{}
	s.self = map[netip.Prefix]bool{}
	// A full update may leave out endpoints the last state named: their flows must go.
	s.liveShrunk = s.liveShrunk || len(s.liveSets) > 0
	s.liveSets = map[string]*liveSet{}
	s.live = nil
	s.gone = map[netip.AddrPort]struct{}{}
	s.wepDst = map[netip.Prefix]string{}
	s.weps = map[string]int{}
	s.problems = map[calc.FrontendKey]string{}
	s.resync = true
	s.settings.DirtyAll()
	s.settings6.DirtyAll()
}

// expectLocked sizes the empty tables of a reset for a full update of u's size: maps grown
// one key at a time to 100,000 copy themselves a dozen times.
func (s *Services) expectLocked(u *calc.Update) {
	var nFront, nList [2]int
	for _, op := range u.Ops {
		if op.Kind() == calc.OpFrontend && !op.Remove {
			f := 0
			if !op.Frontend.Key.Addr.Is4() {
				f = 1
			}
			nFront[f]++
			if op.Frontend.Kind == calc.FrontendClusterIP {
				nList[f]++ // lists and endpoint sets are shared by a service's frontends
			}
		}
	}
	s.v4.expect(nFront[0], nList[0])
	s.v6.expect(nFront[1], nList[1])
	s.liveSets = make(map[string]*liveSet, nList[0]+nList[1])
	s.svcIDs = make(map[uint64]*idOwner, nList[0]+nList[1])
}

// OnUpdate takes one calc update: Full's or OnOp's work for each op, under one lock. It
// reports whether the update touched anything the service stage programs (a route change
// elsewhere in the cluster does not).
func (s *Services) OnUpdate(u *calc.Update) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.Full {
		s.fullLocked(u)
		changed = true
	} else {
		for _, op := range u.Ops {
			if s.onOpLocked(op) {
				changed = true
			}
		}
	}
	s.settleLocked()
	return changed
}

// Full replaces the desired state with a full update's: what it lacks goes at the next Apply.
// Nothing is written before the first.
func (s *Services) Full(u *calc.Update) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fullLocked(u)
	s.settleLocked()
}

// OnOp takes one change: a frontend, a cluster net, or a route to a workload (the workloads'
// programs follow them). It reports whether it touched anything the stage programs.
func (s *Services) OnOp(op calc.Op) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := s.onOpLocked(op)
	s.settleLocked()
	return changed
}

func (s *Services) fullLocked(u *calc.Update) {
	s.reset()
	s.expectLocked(u)
	s.full = true
	// A full update names each frontend once, in key order (calc's State): there is nothing
	// to remove unless a key comes again.
	var last *calc.FrontendKey
	for _, op := range u.Ops {
		if op.Kind() != calc.OpFrontend {
			s.onOpLocked(op)
			continue
		}
		if last != nil && *last == op.Frontend.Key {
			s.removeFrontendLocked(op.Frontend.Key)
		}
		last = &op.Frontend.Key
		if !op.Remove {
			s.setFrontendLocked(*op.Frontend)
		}
	}
}

func (s *Services) onOpLocked(op calc.Op) bool {
	switch op.Kind() {
	case calc.OpFrontend:
		s.removeFrontendLocked(op.Frontend.Key)
		if !op.Remove {
			s.setFrontendLocked(*op.Frontend)
		}
		return true
	case calc.OpClusterNet:
		s.setClusterNetLocked(*op.ClusterNet, op.Remove)
		return true
	case calc.OpRoute:
		// Routes are keyed by destination: a workload's address that now leads elsewhere
		// comes as a set with another reason, not as a removal.
		return s.setWorkloadRouteLocked(*op.Route, op.Remove || op.Route.Reason != calc.ReasonLocalWorkload)
	}
	return false
}

// settleLocked is what follows any change: frontends refused for another's identity are tried
// again, and the settings follow the node's addresses.
func (s *Services) settleLocked() {
	s.retryRefusedLocked()
	s.setSettingsLocked()
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
	if len(s.problems) > 0 {
		delete(s.problems, pkey)
	}
	if f.Key.Protocol != store.ProtocolTCP && f.Key.Protocol != store.ProtocolUDP {
		s.problems[pkey] = "only TCP and UDP services are programmed"
		return
	}
	if f.Key.Addr.Is4() {
		s.v4.setFrontend(f)
		return
	}
	if !s.v6.usable() {
		s.problems[pkey] = "IPv6 frontends are not programmed: no IPv6 maps"
		return
	}
	s.v6.setFrontend(f)
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
	if s.live != nil {
		eachLive(ls.key, func(ap netip.AddrPort) {
			if s.live[ap]++; s.live[ap] == 1 {
				delete(s.gone, ap)
			}
		})
	}
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
	if len(ls.key) <= 1 { // no endpoint: a service whose slice has not come yet
		delete(s.liveSets, ls.key)
		return
	}
	live := s.liveLocked() // counted with ls still among the sets
	delete(s.liveSets, ls.key)
	eachLive(ls.key, func(ap netip.AddrPort) {
		if live[ap]--; live[ap] <= 0 {
			delete(live, ap)
			s.gone[ap] = struct{}{}
		}
	})
}

// liveLocked returns the endpoints' counts, counting them first if nothing has needed them
// since the last full update.
func (s *Services) liveLocked() map[netip.AddrPort]int32 {
	if s.live == nil {
		s.live = make(map[netip.AddrPort]int32, len(s.liveSets)*4)
		for _, ls := range s.liveSets {
			eachLive(ls.key, func(ap netip.AddrPort) { s.live[ap]++ })
		}
	}
	return s.live
}

// EndpointsGone says whether an endpoint has left every service since it last said so:
// the stage then deletes the flows to endpoints that are gone (Conntrack.SweepStale).
func (s *Services) EndpointsGone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	gone := s.liveShrunk || len(s.gone) > 0
	s.liveShrunk = false
	clear(s.gone)
	return gone
}

func (s *Services) removeFrontendLocked(k calc.FrontendKey) {
	if len(s.problems) > 0 {
		delete(s.problems, k)
	}
	if len(s.refused) > 0 {
		delete(s.refused, k)
	}
	if k.Addr.Is4() {
		s.v4.removeFrontend(k)
	} else {
		s.v6.removeFrontend(k)
	}
}

func (s *Services) setClusterNetLocked(n calc.ClusterNet, remove bool) {
	if !remove && n.Host && n.Node == s.cfg.NodeName {
		s.self[n.Prefix] = true
	} else {
		delete(s.self, n.Prefix)
	}
	switch {
	case n.Prefix.Addr().Is4():
		s.v4.setClusterNet(n, remove)
	case s.v6.usable():
		s.v6.setClusterNet(n, remove)
	}
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

// HostIP6 returns this node's IPv6 underlay address as calc knows it (invalid: none): the
// outer source of the IPv6 node-port tunnel.
func (s *Services) HostIP6() netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostIP6Locked()
}

func (s *Services) hostIP6Locked() netip.Addr {
	var best netip.Addr
	for p := range s.self {
		if a := p.Addr(); a.Is6() && !a.Is4In6() && (!best.IsValid() || a.Less(best)) {
			best = a
		}
	}
	return best
}

// tunnelMTU6Locked is the largest inner IPv6 packet the IPv6 tunnel carries: its own
// setting, else the IPv4 tunnel's less the 20 bytes an IPv6 outer header adds.
func (s *Services) tunnelMTU6Locked() int {
	if s.cfg.TunnelMTU6 > 0 {
		return s.cfg.TunnelMTU6
	}
	return max(0, s.cfg.TunnelMTU-20)
}

// SetTunnelMTU6 changes the IPv6 tunnel's MTU (its parent interface's MTU changed).
func (s *Services) SetTunnelMTU6(mtu int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.TunnelMTU6 = mtu
	s.setSettingsLocked()
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
	_, ok := s.liveLocked()[netip.AddrPortFrom(addr, port)]
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
	v6 := Settings6{TunnelMtu: uint32(s.tunnelMTU6Locked())}
	if a := s.hostIP6Locked(); a.IsValid() {
		v6.HostIp = NetAddr6(a)
	}
	s.settings6.SetDesired(0, v6)
}

// SetTunnelMTU changes the tunnel MTU (the parent interface's MTU changed).
func (s *Services) SetTunnelMTU(mtu int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.TunnelMTU = mtu
	s.setSettingsLocked()
}

// Workloads returns the workload interfaces this node's routes name.
// FrontendAddrs returns the addresses of every frontend wanted (cluster IPs, external and
// load-balancer addresses; node ports' node addresses and wildcards too).
func (s *Services) FrontendAddrs() map[netip.Addr]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[netip.Addr]bool{}
	for k := range s.v4.fronts {
		a, _, _ := s.v4.fam.feView(k)
		out[a] = true
	}
	for k := range s.v6.fronts {
		a, _, _ := s.v6.fam.feView(k)
		out[a] = true
	}
	return out
}

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

// TakeDrift returns the drift found since it was last called, by map ("IPv4 frontends": the
// family and the map's name in TableNames, or "settings"), for the log line that reports it.
func (s *Services) TakeDrift() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.driftBy
	s.driftBy = map[string]int{}
	return d
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
	// wrote counts one write the kernel confirmed; the settings are never deleted.
	wrote := func() { s.stats.Writes++ }
	never := func(uint32, Settings) tracker.Outcome { return tracker.Skipped }
	s.settings.Pending(func(k uint32, v Settings) tracker.Outcome {
		if err := s.t.Settings.Put(k, v); err != nil {
			fail("writing settings", err)
			return tracker.Failed
		}
		s.settings.SetActual(k, v)
		wrote()
		return tracker.Done
	}, never)
	if s.t.Settings6 != nil {
		s.settings6.Pending(func(k uint32, v Settings6) tracker.Outcome {
			if err := s.t.Settings6.Put(k, v); err != nil {
				fail("writing the IPv6 settings", err)
				return tracker.Failed
			}
			s.settings6.SetActual(k, v)
			wrote()
			return tracker.Done
		}, func(uint32, Settings6) tracker.Outcome { return tracker.Skipped })
	}
	s.v4.apply(fail, wrote)
	if s.v6.usable() {
		s.v6.apply(fail, wrote)
	}
	s.settings.Settle()
	s.settings6.Settle()
	return errors.Join(errs...)
}

// Diff reads the maps, as a resync does, and says what they lack or hold differently
// (missing) and what of sluice's they hold too much of (extra); it writes nothing. Meant for a
// driver given only a full update (sluicectl): the read becomes what it knows of the maps.
func (s *Services) Diff() (missing, extra []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.readLocked(); err != nil {
		return nil, nil, err
	}
	s.v4.diff(&missing, &extra)
	if s.v6.usable() {
		s.v6.diff(&missing, &extra)
	}
	settings := func(which string) func(_ uint32, _, _ Settings, held bool) {
		return func(_ uint32, _, _ Settings, held bool) {
			if held {
				missing = append(missing, which+" (tunnel, MTU, source ports, this node's address): other values")
			} else {
				missing = append(missing, which+" (tunnel, MTU, source ports, this node's address)")
			}
		}
	}
	s.settings.Differences(settings("settings"), func(uint32, Settings) {})
	if s.t.Settings6 != nil {
		s.settings6.Differences(func(_ uint32, _, _ Settings6, held bool) { settings("IPv6 settings")(0, Settings{}, Settings{}, held) },
			func(uint32, Settings6) {})
	}
	slices.Sort(missing)
	slices.Sort(extra)
	return missing, extra, nil
}

// AffinityScan is the longest list client-IP affinity reads whole (AFF_SCAN); only longer
// lists have index entries.
const AffinityScan = 16

// indexKey is the backend index's key of v in list id.
func indexKey(id uint64, v BackendValue) BackendIndex {
	return BackendIndex{ListId: id, Addr: v.Addr, Port: v.Port}
}

// readLocked reads every map into the trackers: adoption after a restart (what matches is
// kept, only the difference is written) and drift repair.
func (s *Services) readLocked() error {
	if err := s.v4.read(); err != nil {
		return err
	}
	if s.v6.usable() {
		if err := s.v6.read(); err != nil {
			return err
		}
	}
	st, err := s.t.Settings.Dump()
	if err != nil {
		return fmt.Errorf("reading the settings map: %w", err)
	}
	if n := s.settings.ReplaceActual(st); n > 0 {
		s.stats.Drift += int64(n)
		s.driftBy["settings"] += n
	}
	if s.t.Settings6 != nil {
		st6, err := s.t.Settings6.Dump()
		if err != nil {
			return fmt.Errorf("reading the IPv6 settings map: %w", err)
		}
		if n := s.settings6.ReplaceActual(st6); n > 0 {
			s.stats.Drift += int64(n)
			s.driftBy["IPv6 settings"] += n
		}
	}
	return nil
}

// full1 names the option to raise when a map is full.
func (s *Services) full1(err error, option string, max int) error {
	if errors.Is(err, ErrMapFull) {
		return fmt.Errorf("%w (%d entries; raise option bpf-map-size-%s)", err, max, option)
	}
	return err
}

// TableNames are the names Counts gives its figures under.
var TableNames = []string{"frontends", "backends", "source_ranges", "cluster_nets"}

// Counts returns desired and programmed entries per map (named as in TableNames), both
// families together, for metrics.
func (s *Services) Counts() map[string][2]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := map[string][2]int{}
	s.v4.counts(c)
	s.v6.counts(c)
	return c
}
