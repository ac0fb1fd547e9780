// Command sluiced is the sluice node agent. It watches etcd for the network's intent (the keys
// Calico's tools write, and sluice's services), computes this node's desired dataplane with
// calc, and keeps the kernel matching it: routes, nexthop objects, the VXLAN devices and their
// neighbours and FDB entries (dataplane), and service NAT in eBPF (bpf). It reports what it
// does through its log, /metrics, /readyz and /livez, a status key in etcd and systemd's
// notify protocol.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
	"github.com/sluice-net/sluice/cmd/internal/buildinfo"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/cmd/internal/agent"
	"github.com/sluice-net/sluice/store"
)

func newLogger(c *agentconfig.Config, w *os.File) zerolog.Logger {
	format := c.LogFormat
	if format == "" {
		format = "json"
		if st, err := w.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			format = "console"
		}
	}
	var out io.Writer = w
	if format == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	// Durations with their unit ("took":"19.1ms"), not a bare number whose unit the reader
	// must guess.
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
	lvl, _ := zerolog.ParseLevel(c.LogLevel)
	return zerolog.New(out).Level(lvl).With().Timestamp().Str("node", c.NodeName).Logger()
}

func run(parent context.Context, c *agentconfig.Config, log zerolog.Logger) error {
	// Everything the agent starts ends with this context; run waits for it all before it
	// returns, so no apply is cut off half-way by the process exiting.
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	cli, err := c.Etcd.New()
	if err != nil {
		return err
	}
	defer cli.Close()
	// What can fail at start fails before anything runs.
	var healthLn net.Listener
	if c.HealthListen != "" {
		if healthLn, err = net.Listen("tcp", c.HealthListen); err != nil {
			return fmt.Errorf("option health-listen %q: %w", c.HealthListen, err)
		}
	}
	var rec *store.Recorder
	if c.Record != "" {
		f, err := os.Create(c.Record)
		if err != nil {
			return fmt.Errorf("option record: opening the event log: %w", err)
		}
		defer f.Close()
		rec = store.NewRecorder(f)
	}
	graph, err := calc.New(c.Calc)
	if err != nil {
		return err
	}
	state := newAgentState()
	// The agent keeps no queryable copy of what it read (calc holds what it computes from):
	// the intake's counts are what it reports.
	state.profiling = c.Profiling
	plan := &agent.Planner{Graph: graph, Log: log, Problems: &state.problems, SelfMissing: &state.selfMissing, FromCalc: &state.fromCalc}
	state.nodeName = c.NodeName
	var background sync.WaitGroup
	defer func() { cancel(); background.Wait() }()
	if c.Dataplane {
		logKernel(log)
		dp, wait, err := startDataplane(ctx, c, log, state)
		if err != nil {
			return err
		}
		plan.Dataplane = dp
		state.dp = dp
		background.Add(1)
		go func() { defer background.Done(); wait() }()
		if c.Calc.BGP {
			// A state file of an earlier run: this is a restart (or an upgrade).
			_, err := os.Stat(c.StateFile)
			st, bwait := startBGP(ctx, c, plan, log, c.StateFile != "" && err == nil, state.gc)
			state.bgp = st
			background.Add(1)
			go func() { defer background.Done(); bwait() }()
		}
		if c.Services {
			// Never fatal: the service stage starts (and is retried) beside the routes.
			svc, swait := startServices(ctx, c, plan, log, state)
			state.svc = svc
			background.Add(1)
			go func() { defer background.Done(); swait() }()
		} else if err := bpf.RemoveAll(c.BPF.PinDir); err != nil {
			log.Warn().Err(err).Str("pin_dir", c.BPF.PinDir).Msg("could not remove the service stage's programs and pins")
		}
	}
	// calc and the dataplane come first: they are the path from etcd to the kernel.
	handlers := store.Fanout{plan, state, &eventLogger{log: log, state: state, dataplane: c.Dataplane}}
	if rec != nil {
		handlers = append(handlers, rec)
	}
	prefixes := store.NodePrefixes(c.NodeName)
	intake, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: handlers, Reporter: newReporter(log),
		Prefixes: prefixes, Liveness: c.EtcdLiveness, StallAfter: c.EtcdWatchStall})
	if err != nil {
		return err
	}
	state.intake = intake
	notify, err := newNotifier(c.NotifySocket)
	if err != nil {
		// sd_notify is best effort: a stale NOTIFY_SOCKET must not stop the agent.
		log.Warn().Err(err).Str("socket", c.NotifySocket).Msg("cannot reach systemd's notify socket; carrying on without it")
		notify = &notifier{}
	}
	background.Add(2)
	go func() { defer background.Done(); reportStatus(ctx, cli, c.NodeName, c.StatusTTL, state, log) }()
	go func() {
		defer background.Done()
		supervise(ctx, notify, state, c.Watchdog) // ends with STOPPING=1
		notify.close()
	}()
	if healthLn != nil {
		background.Add(1)
		go func() {
			defer background.Done()
			if err := state.serveHealth(ctx, healthLn); err != nil {
				log.Error().Err(err).Str("listen", c.HealthListen).Msg("health and metrics endpoint failed")
			}
		}()
	}
	// The state kept by the last run is restored, and applied, before the intake reads etcd
	// (beside it, both would be slower), and saved as the agent stops; only with a dataplane
	// to hand it to, and only by the build that made it.
	stateFile := ""
	build := ""
	if c.Dataplane && c.StateFile != "" {
		if build, err = buildinfo.ID(); err != nil {
			log.Warn().Err(err).Str("file", c.StateFile).Msg("cannot tell this binary's build: the desired state is not kept across restarts")
		} else {
			stateFile = c.StateFile
			if c.Calc.BGP {
				// What BGP had learned stays programmed until the peers have spoken again.
				if ls, err := agent.KeptLearned(stateFile, build, c.Calc); err != nil {
					log.Warn().Err(err).Str("file", stateFile).Msg("the routes BGP learned before this start could not be read: they go at the first update")
				} else if len(ls) > 0 {
					plan.KeepLearned(ls)
					state.bgp.sweepIfNeverSynced(plan)
					log.Info().Int("routes", len(ls)).Msg("routes learned by BGP before this start kept until the peers have spoken again")
				}
			}
			if restoreKept(ctx, stateFile, cli, build, plan, prefixes, state, log) {
				select {
				case <-state.applied:
				case <-time.After(agent.KeptApplyWait):
				case <-ctx.Done():
				}
			}
		}
	}
	log.Info().Strs("etcd", c.Etcd.Endpoints).Msg("starting")
	err = intake.Run(ctx)
	if rec != nil {
		if ferr := rec.Flush(); ferr != nil {
			log.Error().Err(ferr).Msg("event log incomplete")
		}
	}
	st := intake.Stats()
	if stateFile != "" && parent.Err() != nil {
		saveKept(stateFile, build, graph, intake, state, log)
	}
	log.Info().Int64("revision", st.Revision.Load()).Int64("events", st.Events.Load()).
		Int64("bad_values", st.BadValues.Load()).Int64("retries", st.Retries.Load()).Msg("stopped")
	if parent.Err() != nil {
		return nil // asked to stop
	}
	return err
}

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version" || os.Args[1] == "version") {
		fmt.Println("sluiced", buildinfo.Read())
		return
	}
	if len(os.Args) == 2 && (os.Args[1] == "--check-kernel" || os.Args[1] == "-check-kernel") {
		if !checkKernel(os.Stdout) {
			os.Exit(1)
		}
		return
	}
	c, err := agentconfig.ParseEnv(os.Args[1:], os.LookupEnv, os.Stderr)
	if err == flag.ErrHelp {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluiced: %v\n", err)
		os.Exit(2)
	}
	log := newLogger(c, os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, log); err != nil {
		log.Error().Err(err).Msg("exiting")
		os.Exit(1)
	}
}
