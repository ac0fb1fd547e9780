package bpf

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-net/sluice/bpf/healthcheck"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/applyloop"
	"github.com/sluice-net/sluice/internal/tracker"
	"github.com/vishvananda/netlink"
)

// StageConfig configures the service stage of the agent.
type StageConfig struct {
	PinDir         string
	Sizes          MapSizes
	HostInterfaces *regexp.Regexp
	// TunnelDevices are the overlay's VXLAN devices (the routes' own): their egress gets the
	// host program too, so that a host-networked endpoint's answer routed into the overlay
	// (to a pod client on another node) still goes back through the service tunnel to the
	// flow's ingress node, as its request came, and never meets that node's forwarding path
	// (whose conntrack, having seen no request, would call it INVALID).
	TunnelDevices []string
	// ReservePorts is the node-port range, added to net.ipv4.ip_local_reserved_ports so that
	// the node's own sockets never take such a source port (zero: the setting is left alone).
	ReservePorts   [2]uint16
	CleanConflicts bool
	Services       Config
	// TunnelMTU 0 means the MTU of the interface holding the node's address, less 50.
	TunnelMTU int
	// CgroupPath is the cgroup v2 directory the socket programs attach to: "" finds the
	// hierarchy's root (mounting one at CgroupMount when none is mounted), "none" leaves the
	// node's own connections to services alone.
	CgroupPath string
	// CgroupMount is where a cgroup2 hierarchy of sluice's own is mounted when the host has
	// none mounted ("": DefaultCgroupMount).
	CgroupMount string
	// Attach is how programs are attached to interfaces (auto: TCX where the kernel has it).
	Attach AttachMode
	// Health, when set, is the health-check state the stage answers through (the agent
	// serves the proxy health port from it before the stage starts); else the stage makes one.
	Health *healthcheck.Servers
	// LoadFault, when set, is asked before the programs are loaded and fails the start with
	// its error: a test's stand-in for a kernel that refuses them.
	LoadFault func() error
	// OnMounted is told of each file system the stage mounted (bpffs, cgroup2) and where.
	OnMounted       func(fs, path string)
	Timeouts        Timeouts
	CleanupInterval time.Duration
	ResyncInterval  time.Duration
	MinInterval     time.Duration

	OnApply    func(err error, writes int, took time.Duration)
	OnConflict func(Conflict)
	OnClean    func(CleanStats, error)
	// OnSweep is told how many entries of flows to removed endpoints went at an apply.
	OnSweep func(deleted int)
	// Vacant says whether an address is certainly not answering (Conntrack.Vacant): the
	// connections to a removed endpoint at such an address go at once, not only its UDP
	// flows and handshakes.
	Vacant    func(addr netip.Addr) bool
	OnResized func(maps []string)

	// ipv4Programs leaves the IPv6 programs out (IPv6 packets then pass untouched): tests of
	// the stage's own mechanics over IPv4 set it, since the IPv6 programs are about 60% of a
	// load's verification, and the kernel matrix runs these tests under emulation.
	ipv4Programs bool
}

// Stage is the running service stage: the loaded programs and maps, the map driver, the
// attacher and the connection-table cleaner.
type Stage struct {
	cfg  StageConfig
	Objs *Objects
	Svc  *Services
	att  *Attacher
	sock *SocketHooks // nil with cgroup-path none, and until a cgroup v2 hierarchy is there
	// sockUnusable is why the socket programs cannot run on this kernel at all (nil: they can).
	sockUnusable error
	CT           *Conntrack
	// Health serves the health-check node ports and the proxy health answer.
	Health *healthcheck.Servers
	kick   chan struct{}
	beat   atomic.Int64
	links  atomic.Bool
	// running: programs run on the maps (this stage attached them, or a previous run's
	// links were pinned at start). Only Apply touches it.
	running  bool
	reserved bool // ReservePorts is in ip_local_reserved_ports
	// mtuProblem says why the tunnel MTU option was not used (empty when it was, or unset).
	mtuProblem string
	// reserveProblem says why ReservePorts could not be reserved.
	reserveProblem string

	mu        sync.Mutex
	conflicts tracker.Sightings[Conflict] // reported and still there
	hostIP    netip.Addr
	hostIP6   netip.Addr
	// why is what keeps the stage from doing its whole job after the last apply ("": nothing).
	why       string
	hooks     []Hook
	lastClean CleanStats
	// Repins counts map pins found removed and put back.
	Repins int
	// Progs6Mended counts IPv6 programs found missing from sl_progs_v6 and put back.
	Progs6Mended int
	// synced are the workload interfaces the last hook check attached to, hooksOK whether
	// it succeeded; needHooks asks the loop's next apply to check every hook.
	synced    map[string]bool
	hooksOK   bool
	needHooks atomic.Bool
	repairs   Repairs
}

// StartError is why the service stage could not start, by step: "attach-mode" (the kernel
// lacks what the option asks), "bpffs" (the pin directory cannot be on bpffs), "load" (the
// kernel refused a map or program: too old, a verifier refusal, no memory for a map) or
// "attach" (the attacher could not be set up).
type StartError struct {
	Step string
	Err  error
}

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// StartStage mounts bpffs under the pin directory if needed, loads (or adopts) the maps and
// programs and returns the stage; nothing is written or attached before the first full
// update. Its errors are *StartError.
func StartStage(cfg StageConfig) (*Stage, error) {
	mode, err := cfg.Attach.Resolve()
	if err != nil {
		return nil, &StartError{"attach-mode", err}
	}
	cfg.Attach = mode
	mounted, err := EnsureBPFFS(cfg.PinDir)
	if err != nil {
		return nil, &StartError{"bpffs", err}
	}
	if mounted && cfg.OnMounted != nil {
		cfg.OnMounted("bpf", cfg.PinDir)
	}
	if cfg.LoadFault != nil {
		if err := cfg.LoadFault(); err != nil {
			return nil, &StartError{"load", fmt.Errorf("loading the eBPF programs: %w", err)}
		}
	}
	objs, err := load(cfg.PinDir, cfg.Sizes, !cfg.ipv4Programs)
	if err != nil {
		return nil, &StartError{"load", err}
	}
	if len(objs.Resized) > 0 && cfg.OnResized != nil {
		cfg.OnResized(objs.Resized)
	}
	att, err := NewAttacher(cfg.PinDir, mode, objs, cfg.HostInterfaces, cfg.CleanConflicts)
	if att != nil {
		att.tunnels = cfg.TunnelDevices
	}
	if err != nil {
		objs.Close()
		return nil, &StartError{"attach", err}
	}
	// The socket programs act only on sockets of the agent's network namespace, named by its
	// cookie; a kernel that cannot say it (before 5.14) leaves them off, and only them.
	var sockUnusable error
	if cfg.CgroupPath != "none" {
		if cfg.Services.NetnsCookie, err = netnsCookie(); err != nil {
			sockUnusable = fmt.Errorf("%w (SO_NETNS_COOKIE: Linux 5.14 or later; option cgroup-path none turns the socket programs off)", err)
		}
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = 10 * time.Millisecond
	}
	if cfg.ResyncInterval == 0 {
		cfg.ResyncInterval = 90 * time.Second
	}
	if cfg.Timeouts == (Timeouts{}) {
		// Zero timeouts would expire every flow at the first cleanup.
		cfg.Timeouts = DefaultTimeouts
	}
	if cfg.CleanupInterval == 0 {
		cfg.CleanupInterval = 10 * time.Second
	}
	if cfg.CgroupMount == "" {
		cfg.CgroupMount = DefaultCgroupMount
	}
	health := cfg.Health
	if health == nil {
		health = healthcheck.New()
	}
	s := &Stage{cfg: cfg, Objs: objs, att: att, CT: NewConntrack(objs, cfg.Timeouts),
		Svc: NewServices(KernelTables(objs), cfg.Services), kick: make(chan struct{}, 1),
		Health: health, why: "not programmed yet", sockUnusable: sockUnusable}
	s.CT.Live, s.CT.Vacant = s.Svc.LiveEndpoint, cfg.Vacant
	if entries, err := os.ReadDir(filepath.Join(cfg.PinDir, "links")); err == nil {
		for _, e := range entries {
			s.running = s.running || isHookPin(e.Name())
		}
	}
	if !s.running {
		// A previous run in tc mode leaves no pin: its filters say the programs run.
		s.running = ourFiltersPresent()
	}
	return s, nil
}

// socketHooks returns the socket hooks, set up at the first call that can: the cgroup v2
// hierarchy is found (or mounted) then, so one mounted later brings them up.
func (s *Stage) socketHooks() (*SocketHooks, error) {
	if s.sock != nil || s.cfg.CgroupPath == "none" {
		return s.sock, nil
	}
	if s.sockUnusable != nil {
		return nil, s.sockUnusable
	}
	path := s.cfg.CgroupPath
	if path == "" {
		p, mounted, err := EnsureCgroup2(s.cfg.CgroupMount)
		if err != nil {
			return nil, err
		}
		if mounted && s.cfg.OnMounted != nil {
			s.cfg.OnMounted("cgroup2", p)
		}
		path = p
	}
	sock, err := NewSocketHooks(s.cfg.PinDir, path, s.Objs)
	if err != nil {
		return nil, err
	}
	s.sock = sock
	return sock, nil
}

// Mode is how the stage attaches its programs to interfaces: tcx or tc.
func (s *Stage) Mode() AttachMode { return s.cfg.Attach }

// Status says whether the stage does its whole job now (programs on every hook, the
// node's own connections handled) and, when not, why: what the last apply could not do.
func (s *Stage) Status() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.why == "", s.why
}

// OnUpdate takes a calc update.
func (s *Stage) OnUpdate(u *calc.Update) {
	relevant := s.Svc.OnUpdate(u)
	addrsChanged := u.Full
	for _, op := range u.Ops {
		switch op.Kind() {
		case calc.OpHealthCheck:
			// Only what the stage programs asks for an apply: a route change elsewhere in
			// the cluster does not.
			relevant = true
			if op.Remove {
				s.Health.DeleteService(op.HealthCheck.Port)
			} else {
				s.Health.SetServiceFamilies(op.HealthCheck.Port, op.HealthCheck.Service, op.HealthCheck.LocalIPv4, op.HealthCheck.LocalIPv6)
			}
		case calc.OpClusterNet:
			addrsChanged = true
		}
	}
	if addrsChanged {
		// Health-check node ports answer on the node's own addresses and follow them.
		s.Health.SetNodeAddrs(s.Svc.SelfAddrs())
	}
	if relevant {
		s.Kick()
	}
}

// ErrNoNodeAddress: the service stage waits for this node's own address.
var ErrNoNodeAddress = errors.New("waiting for this node's address before programming services")

// Kick asks for an apply soon.
func (s *Stage) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Alive reports whether the loop went round within d.
func (s *Stage) Alive(d time.Duration) bool {
	return time.Since(time.Unix(0, s.beat.Load())) < d
}

// Hooks returns the hooks held after the last apply.
func (s *Stage) Hooks() []Hook {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Hook(nil), s.hooks...)
}

// LastClean returns the last cleanup pass's figures.
func (s *Stage) LastClean() CleanStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastClean
}

// Apply writes the maps, then attaches the programs: a program is never first attached to
// maps that are not yet the desired state. Once programs run on the maps (attached by this
// stage or found pinned at start), a map that fails (full until its size option is raised)
// no longer holds back the attacher: new workload interfaces still get the programs and
// detached ones are still repaired.
func (s *Stage) Apply() (int, error) { return s.apply(true) }

// apply writes the maps and, with hooks (or when the workload interfaces changed, or the
// last attach failed), checks every hook: listing links and hooks costs more than a small
// change of the maps, so the loop does it when a link event, the periodic resync or a
// failure asks for it.
func (s *Stage) apply(hooks bool) (int, error) {
	if !s.Svc.Ready() {
		return 0, nil
	}
	if len(s.Svc.SelfAddrs()) == 0 {
		// Node ports are this node's addresses: programming before they are known would
		// erase every node port for a moment (Calico #12192). Nothing is written or
		// attached until etcd gives the node an address.
		err := fmt.Errorf("%w: node %q has no address in etcd", ErrNoNodeAddress, s.cfg.Services.NodeName)
		s.setWhy(err.Error())
		return 0, err
	}
	before := s.Svc.Stats().Writes
	if r := s.cfg.ReservePorts; r[0] != 0 && !s.reserved {
		// Not fatal: TCP answers to host sockets are told apart without it; tried again at
		// the next apply, said in the status meanwhile.
		s.reserveProblem = ""
		if err := ReserveLocalPorts(r[0], r[1]); err != nil {
			s.reserveProblem = err.Error()
		} else {
			s.reserved = true
		}
	}
	if ip := s.Svc.HostIP(); ip != s.hostIP {
		s.hostIP = ip
		s.mtuProblem = ""
		if mtu, err := mtuOf(ip); err != nil {
			if s.cfg.TunnelMTU > 0 {
				s.Svc.SetTunnelMTU(s.cfg.TunnelMTU)
			}
		} else {
			switch {
			case s.cfg.TunnelMTU == 0:
				s.Svc.SetTunnelMTU(mtu - 50)
			case s.cfg.TunnelMTU > mtu-50:
				// Refused: wrapped packets of that size would not cross the underlay (the FIB
				// answers "fragmentation needed", and they are dropped). The most it carries is
				// used instead, and the stage says why until the option is mended.
				s.mtuProblem = fmt.Sprintf("option nodeport-tunnel-mtu %d is more than the underlay carries: the interface of %s has MTU %d, so at most %d; using %d",
					s.cfg.TunnelMTU, ip, mtu, mtu-50, mtu-50)
				s.Svc.SetTunnelMTU(mtu - 50)
			default:
				s.Svc.SetTunnelMTU(s.cfg.TunnelMTU)
			}
		}
	}
	if ip := s.Svc.HostIP6(); ip != s.hostIP6 {
		// The IPv6 tunnel's inner MTU: its underlay interface's less 70 bytes, at most the
		// IPv4 tunnel's less 20 (nodeport-tunnel-mtu speaks for both).
		s.hostIP6 = ip
		if mtu, err := mtuOf(ip); err == nil && ip.IsValid() {
			want := mtu - 70
			if s.cfg.TunnelMTU > 0 {
				want = min(want, s.cfg.TunnelMTU-20)
			}
			s.Svc.SetTunnelMTU6(want)
		}
	}
	driftBefore := s.Svc.Stats().Drift
	err := s.Svc.Apply()
	writes := int(s.Svc.Stats().Writes - before)
	drift := int(s.Svc.Stats().Drift - driftBefore)
	if s.Svc.EndpointsGone() && s.running {
		// Flows to an endpoint that left its service go now, not at the next cleanup: a client
		// sending from a fixed port (every DNS resolver) reaches a live endpoint with its next
		// datagram, as kube-proxy's sync deletes a removed endpoint's conntrack entries.
		if n, serr := s.CT.SweepStale(); serr != nil {
			err = errors.Join(err, serr)
		} else if n > 0 && s.cfg.OnSweep != nil {
			s.cfg.OnSweep(n)
		}
	}
	// Drift is what a reread found other than sluice left it, not the writes of the apply: an
	// endpoint change that lands in the same apply as the periodic resync is none.
	s.mu.Lock()
	s.repairs.MapEntries += drift
	s.mu.Unlock()
	if err != nil && !s.running {
		// Maps first: programs attached over a half-written table would answer wrongly.
		s.setWhy("writing the service maps before the programs are attached: " + err.Error())
		return writes, err
	}
	var aerr, perr, serr error
	if workloads := s.Svc.Workloads(); hooks || !s.running || !s.hooksOK || !maps.Equal(workloads, s.synced) {
		aerr, perr, serr = s.checkHooks(workloads)
		switch {
		case aerr != nil:
			s.setWhy(fmt.Sprintf("attaching the programs (%s): %v", s.cfg.Attach, aerr))
		case serr != nil:
			s.setWhy("the node's own connections to services are not handled: " + serr.Error())
		case s.sockUnusable != nil:
			s.setWhy("the node's own connections to services are not handled: " + s.sockUnusable.Error())
		default:
			s.setWhy(strings.Join(slices.DeleteFunc([]string{s.mtuProblem, s.reserveProblem}, func(p string) bool { return p == "" }), "; "))
		}
	}
	if aerr != nil || err == nil {
		s.Health.SetHealthy(aerr == nil)
	}
	herr := s.Health.Apply()
	return writes, errors.Join(err, aerr, herr, perr, serr)
}

// checkHooks attaches the programs to every wanted interface, lets go of the others, puts
// back removed pins, and reports conflicts found on the hooks.
func (s *Stage) checkHooks(workloads map[string]bool) (aerr, perr, serr error) {
	conflicts, aerr := s.att.Sync(workloads)
	s.synced = workloads
	if len(s.att.Hooks()) > 0 {
		s.running = true
	}
	perr = s.repin()
	// The IPv6 half of every hook: its programs in sl_progs_v6 (a detached half is a link).
	mended, merr := s.Objs.mendProgs6()
	s.Progs6Mended += mended
	perr = errors.Join(perr, merr)
	sock, err := s.socketHooks()
	switch {
	case s.sockUnusable != nil:
		// A kernel that lacks what they need: said by Status, not an apply error retried
		// (with a full reread of the maps) for as long as the agent runs.
	case err != nil:
		serr = err
	case sock != nil:
		sock.CleanConflicts = s.cfg.CleanConflicts
		var found []Conflict
		found, serr = sock.Sync()
		conflicts = append(conflicts, found...)
	}
	conflicts = append(conflicts, ForeignPins(filepath.Dir(s.cfg.PinDir))...)
	for _, c := range KubeIPVS(s.Svc.FrontendAddrs) {
		if s.cfg.CleanConflicts && c.Removable() {
			c.Err = c.remove()
			c.Removed = c.Err == nil
		}
		conflicts = append(conflicts, c)
	}
	s.mu.Lock()
	s.repairs.Links = s.att.Repairs + s.Progs6Mended
	if s.sock != nil {
		s.repairs.Links += s.sock.Repairs
	}
	s.repairs.Pins = s.Repins
	s.hooks = s.att.Hooks()
	// Each conflict is reported when it appears and when it goes; a removed one, when it is
	// removed (and as gone, if it was seen before).
	removed := func(c Conflict) bool { return c.Removed }
	s.conflicts.Pass(conflicts, Conflict.Key, Conflict.Effect, removed, func(c Conflict, gone bool) {
		if gone {
			c.Gone, c.Err = true, nil
		}
		if s.cfg.OnConflict != nil {
			s.cfg.OnConflict(c)
		}
	})
	s.mu.Unlock()
	s.hooksOK = aerr == nil && perr == nil && serr == nil
	return aerr, perr, serr
}

func (s *Stage) setWhy(why string) {
	s.mu.Lock()
	s.why = why
	s.mu.Unlock()
}

// Repairs counts drift the stage found and repaired.
type Repairs struct {
	MapEntries int // map entries a reread found changed, missing or added by someone else, written back
	Links      int // program links found detached, stale or unpinned and attached again
	Pins       int // map pins found removed and pinned again
}

// Repairs returns the drift repaired so far.
func (s *Stage) Repairs() Repairs {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.repairs
}

// repin puts back a map pin someone removed: without it a restarted agent would start with
// empty maps and lose every connection's state.
func (s *Stage) repin() error {
	var errs []error
	for name, m := range s.Objs.pinned() {
		path := filepath.Join(s.cfg.PinDir, name)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			// Pin is a no-op for the path the map remembers as its pin: forget it first.
			_ = m.Unpin()
			if err := m.Pin(path); err != nil {
				errs = append(errs, fmt.Errorf("pinning map %s again: %w", name, err))
				continue
			}
			s.Repins++
		}
	}
	return errors.Join(errs...)
}

// mtuOf returns the MTU of the interface holding a.
func mtuOf(a netip.Addr) (int, error) {
	if !a.IsValid() {
		return 0, errors.New("no address")
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, err
	}
	for _, ad := range addrs {
		if ip, ok := netip.AddrFromSlice(ad.IP); ok && ip.Unmap() == a {
			l, err := netlink.LinkByIndex(ad.LinkIndex)
			if err != nil {
				return 0, err
			}
			return l.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("no interface holds %s", a)
}

// Run applies when kicked (at most every MinInterval), retries with backoff, rereads the maps
// every ResyncInterval, cleans the connection table every CleanupInterval and follows
// interfaces as they come and go, until ctx ends. Stopping leaves everything in place.
func (s *Stage) Run(ctx context.Context) {
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribe(updates, done); err == nil {
		s.links.Store(true)
		go func() {
			for range updates { // closed once done is
				// A workload or host interface came or went: attach or let go.
				s.needHooks.Store(true)
				s.Kick()
			}
		}()
	}
	loop := applyloop.Loop{Kick: s.kick, MinInterval: s.cfg.MinInterval, Beat: &s.beat,
		Ticks: []applyloop.Tick{
			{Every: s.cfg.ResyncInterval, Do: func() bool {
				s.Svc.QueueResync()
				s.needHooks.Store(true)
				return true
			}},
			{Every: s.cfg.CleanupInterval, Do: func() bool {
				if s.Svc.Ready() {
					st, err := s.CT.Clean(Monotonic())
					s.mu.Lock()
					s.lastClean = st
					s.mu.Unlock()
					if s.cfg.OnClean != nil {
						s.cfg.OnClean(st, err)
					}
				}
				return false
			}},
		},
		Apply: func() error {
			start := time.Now()
			// Without the link subscription, no event says an interface came: check every time.
			writes, err := s.apply(s.needHooks.Swap(false) || !s.links.Load())
			if s.cfg.OnApply != nil && (writes > 0 || err != nil) {
				s.cfg.OnApply(err, writes, time.Since(start))
			}
			if err != nil {
				s.Svc.QueueResync()
			}
			return err
		}}
	loop.Run(ctx)
}

// Close releases the handles; pins keep programs and maps in place for the next start.
func (s *Stage) Close() {
	_ = s.Health.Close()
	s.att.Close()
	if s.sock != nil {
		s.sock.Close()
	}
	s.Objs.Close()
}
