package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-net/sluice/cmd/internal/agentconfig"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/bpf/healthcheck"
	"github.com/sluice-net/sluice/cmd/internal/agent"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/vishvananda/netns"
)

// startDataplane opens netlink in this namespace and runs the dataplane and its kernel
// watch until ctx ends. Stopping leaves everything programmed in place.
// The returned wait blocks until the dataplane's loops have ended (after ctx) and the kernel
// handle is closed.
func startDataplane(ctx context.Context, c *agentconfig.Config, log zerolog.Logger, state *agentState) (*dataplane.Dataplane, func(), error) {
	k, err := dataplane.NewKernel(netns.None())
	if err != nil {
		return nil, nil, err
	}
	cfg := c.DP
	if cfg.Routes.Nexthops {
		if err := k.NexthopsSupported(); err != nil {
			// Before Linux 5.3 there are no nexthop objects: Felix's layout works everywhere.
			log.Warn().Err(err).Msg("this kernel has no nexthop objects (Linux 5.3 or later); routes to other nodes carry their own gateways (route-layout gateways)")
			cfg.Routes.Nexthops = false
		}
	}
	if !cfg.NAT.Disabled {
		if err := k.NATSupported(); err != nil {
			// Routing works without nftables; pools' natOutgoing and floating IPs do not.
			log.Error().Err(err).Msg("nftables cannot be read (nf_tables missing?): outgoing NAT and floating IPs are off; the rest of the dataplane runs")
			cfg.NAT.Disabled = true
		}
	}
	var mu sync.Mutex
	var lastLog time.Time
	cfg.OnApply = func(err error, writes int, took time.Duration) {
		state.applySeconds.Observe(took.Seconds())
		if dp := state.dp; dp != nil && dp.AppliedOnce() {
			defer state.appliedOnce.Do(func() { close(state.applied) }) // after the line below
		}
		// The kernel has had its turn with etcd's state (calc's first update has been handed
		// over, so this apply or the next carries it): the cold start's garbage goes back,
		// off the apply loop (a full collection) and after the line that says the dataplane
		// is updated.
		if state.fromCalc.Load() {
			defer state.freeOnce.Do(func() { go freeColdStart(state.gc) })
		}
		if err == nil {
			log.Info().Int("writes", writes).Dur("took", took).Msg("dataplane updated")
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			log.Warn().Err(err).Int("writes", writes).Msg("dataplane apply failed; retrying with backoff")
		}
	}
	cfg.OnKernelLatency = func(d time.Duration) { state.kernelDelay.Observe(d.Seconds()) }
	cfg.OnRepair = (&repairLog{log: log}).heard
	cfg.OnNetfilter = func(n dataplane.NetfilterLeftover) { state.reportLeftover(log, netfilterLeftover(n)) }
	cfg.OnLeftover = func(l dataplane.Leftover) { state.reportLeftover(log, routeLeftover(l)) }
	cfg.Routes.Reporter = routeConflicts{log: log, count: state.leftovers}
	dp := dataplane.New(k, cfg)
	var loops sync.WaitGroup
	loops.Add(2)
	go func() { defer loops.Done(); dp.Run(ctx) }()
	go func() {
		defer loops.Done()
		for ctx.Err() == nil {
			if err := dp.Watch(ctx, netns.None()); err != nil {
				log.Warn().Err(err).Msg("kernel watch lost; subscribing again (with a full resync)")
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}()
	return dp, func() {
		loops.Wait() // nothing uses the kernel handle any more
		k.Close()
	}, nil
}

// startServices runs the eBPF service stage (loaded, or adopted from pins) until ctx ends,
// starting it with backoff while the kernel refuses it; stopping leaves programs, links and
// maps in place, so connections live through a restart. The proxy health port is served from
// the start: 503 while the stage is not running. The returned wait blocks until all of it
// has stopped.
func startServices(ctx context.Context, c *agentconfig.Config, plan *agent.Planner, log zerolog.Logger, state *agentState) (*agent.ServiceStage, func()) {
	cfg := c.BPF
	cfg.OnResized = func(maps []string) {
		log.Warn().Strs("maps", maps).Msg("map size options changed: maps resized, their entries kept")
	}
	cfg.OnMounted = func(fs, path string) {
		log.Info().Str("fs", fs).Str("path", path).Msg("mounted for the service stage: the host had none mounted")
	}
	var mu sync.Mutex
	var lastLog time.Time
	var svc *agent.ServiceStage
	var lastRepairs bpf.Repairs
	cfg.OnApply = func(err error, writes int, took time.Duration) {
		if stage := svc.Running(); stage != nil {
			// Drift is logged once for each time it is found.
			if r := stage.Repairs(); r != lastRepairs {
				e := log.Warn().Int("map_entries", r.MapEntries-lastRepairs.MapEntries).Int("links", r.Links-lastRepairs.Links).
					Int("pins", r.Pins-lastRepairs.Pins)
				if by := stage.Svc.TakeDrift(); len(by) > 0 {
					e = e.Str("maps", fmt.Sprint(by)) // which maps held the entries: map[IPv4 frontends:1]
				}
				e.Msg("service stage drift repaired")
				lastRepairs = r
			}
		}
		if err == nil {
			log.Info().Int("writes", writes).Dur("took", took).Msg("service maps updated")
			return
		}
		state.serviceErrors.Inc()
		mu.Lock()
		defer mu.Unlock()
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			log.Warn().Err(err).Int("writes", writes).Msg("service stage apply failed; retrying with backoff")
		}
	}
	cfg.OnConflict = func(cf bpf.Conflict) { state.reportLeftover(log, hookLeftover(cf)) }
	cfg.OnClean = func(st bpf.CleanStats, err error) {
		state.conntrackDeleted.Add(float64(st.Deleted))
		if err != nil {
			log.Warn().Err(err).Msg("connection table cleanup failed")
			return
		}
		if st.Early > 0 {
			// Under pressure (a flood): worth an operator's eye, at most once a cleanup.
			log.Info().Int("entries", st.Entries).Int("expired_early", st.Early).
				Msg("connection table nearly full: flows without a finished handshake or an answer, idle 1 s, expired")
		}
		if st.Deleted > 0 || st.Kept > 0 {
			log.Debug().Int("entries", st.Entries).Int("deleted", st.Deleted).Int("kept_refreshed", st.Kept).Msg("connection table cleaned")
		}
	}
	cfg.Vacant = plan.Vacant
	cfg.OnSweep = func(n int) {
		state.conntrackDeleted.Add(float64(n))
		log.Debug().Int("deleted", n).Msg("flows to removed endpoints deleted")
	}
	svc = agent.NewServiceStage(cfg, plan, log)
	// The first attempt is made in the stage's own loop, beside the routes: loading and
	// verifying the programs takes long, and far longer on a slow machine (an emulated one:
	// the kernel matrix), which the routes must not wait for (BenchmarkServiceEndpointChange
	// in cmd/sluiced measures the time to the first service-map apply).
	var loops sync.WaitGroup
	loops.Add(1)
	go func() { defer loops.Done(); svc.Run(ctx) }()
	if c.ProxyHealthListen != "" {
		loops.Add(1)
		go func() {
			defer loops.Done()
			serveProxyHealth(ctx, log, c.ProxyHealthListen, time.Second, svc.Health())
		}()
	}
	return svc, loops.Wait
}

// serveProxyHealth serves the proxy health check on addr until ctx is done. A port it cannot
// listen on (a leftover kube-proxy holding 10256) is tried again every retry, doubling to a
// minute; the first failure, and each change of why, is logged with the process holding it.
func serveProxyHealth(ctx context.Context, log zerolog.Logger, addr string, retry time.Duration, h *healthcheck.Servers) {
	var ln net.Listener
	said := ""
	for wait := retry; ; wait = min(2*wait, time.Minute) {
		var err error
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		why := err.Error()
		if _, port, perr := net.SplitHostPort(addr); perr == nil && errors.Is(err, syscall.EADDRINUSE) {
			if p, perr := strconv.ParseUint(port, 10, 16); perr == nil {
				if who := healthcheck.PortHolder(uint16(p)); who != "" {
					why += ": held by " + who
				}
			}
		}
		if why != said {
			said = why
			log.Error().Str("listen", addr).Str("why", why).Msg("proxy health check not served yet; trying again until the port is free")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
	if said != "" {
		log.Info().Str("listen", addr).Msg("proxy health check served")
	}
	if err := healthcheck.ServeProxyHealth(ctx, ln, h); err != nil {
		log.Error().Err(err).Msg("proxy health check failed")
	}
}

// routeConflicts logs and counts what the route table found of other programs where sluice's
// objects go: a route at exactly a desired route's destination and metric (replaced), and a
// nexthop object at an ID sluice held or picked (sluice's moves to another ID).
type routeConflicts struct {
	log   zerolog.Logger
	count *prometheus.CounterVec
}

func (r routeConflicts) Conflict(dst netip.Prefix, metric, protocol int) {
	r.count.WithLabelValues("route-replaced").Inc()
	r.log.Warn().Str("route", dst.String()).Int("metric", metric).Int("protocol", protocol).Msg("replaced another program's route where sluice's goes")
}

func (r routeConflicts) NexthopConflict(id uint32, protocol int) {
	r.count.WithLabelValues("nexthop-moved").Inc()
	r.log.Warn().Uint32("nexthop", id).Int("protocol", protocol).Msg("another program's nexthop object holds an ID sluice used; sluice's object moves to another ID")
}

// repairLog logs the objects someone deleted and the dataplane put back: one line per object,
// at most repairLines a second; the rest of that second's are counted in one line at its end
// (a flushed table must not make 20,000 lines, nor leave its count unsaid until the next).
type repairLog struct {
	log    zerolog.Logger
	mu     sync.Mutex
	window time.Time // when the current second began
	logged int       // lines this second
	held   int       // repairs this second not logged one by one
}

const repairLines = 10

func (r *repairLog) heard(kind, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.window) >= time.Second {
		r.flushLocked()
		r.window, r.logged = time.Now(), 0
	}
	if r.logged++; r.logged > repairLines {
		if r.held == 0 {
			time.AfterFunc(time.Until(r.window.Add(time.Second)), r.flush)
		}
		r.held++
		return
	}
	r.log.Info().Str("kind", kind).Str("object", what).Msg("someone deleted this; putting it back")
}

func (r *repairLog) flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.flushLocked()
}

func (r *repairLog) flushLocked() {
	if r.held > 0 {
		r.log.Info().Int("count", r.held).Msg("and more deleted by someone, put back (not each logged)")
		r.held = 0
	}
}
