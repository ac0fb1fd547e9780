// Command sluiced is the sluice node agent. It watches etcd for the network's intent and keeps
// this node's kernel matching it. Today it runs the first two stages: it reads and follows every
// key sluice acts on into its index, computes this node's desired dataplane with calc, and
// reports both; the dataplane stage plugs in behind the same updates.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
)

func newLogger(c *config, w *os.File) zerolog.Logger {
	format := c.logFormat
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
	lvl, _ := zerolog.ParseLevel(c.logLevel)
	return zerolog.New(out).Level(lvl).With().Timestamp().Str("node", c.nodeName).Logger()
}

func run(ctx context.Context, c *config, log zerolog.Logger) error {
	cli, err := c.etcd.New()
	if err != nil {
		return err
	}
	defer cli.Close()
	index := store.NewIndex()
	graph, err := calc.New(c.calc)
	if err != nil {
		return err
	}
	state := newAgentState()
	state.index = index
	plan := &planner{graph: graph, log: log}
	if c.dataplane {
		dp, err := startDataplane(ctx, c, log, state)
		if err != nil {
			return err
		}
		plan.dp = dp
		state.dp = dp
	}
	handlers := store.Fanout{index, state, &eventLogger{log: log, index: index}, plan}
	var rec *store.Recorder
	if c.record != "" {
		f, err := os.Create(c.record)
		if err != nil {
			return fmt.Errorf("opening event log: %w", err)
		}
		defer f.Close()
		rec = store.NewRecorder(f)
		handlers = append(handlers, rec)
	}
	intake, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: handlers, Reporter: newReporter(log)})
	if err != nil {
		return err
	}
	state.intake = intake
	notify, err := newNotifier(c.notifySocket)
	if err != nil {
		return err
	}
	defer notify.close()
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		reportStatus(ctx, cli, c.nodeName, c.statusTTL, state, log)
	}()
	defer func() { <-statusDone }()
	superviseDone := make(chan struct{})
	sctx, stopSupervise := context.WithCancel(ctx)
	go func() { defer close(superviseDone); supervise(sctx, notify, state, c.watchdog) }()
	defer func() { stopSupervise(); <-superviseDone }()
	if c.healthListen != "" {
		go func() {
			if err := state.serveHealth(ctx, c.healthListen); err != nil {
				log.Error().Err(err).Str("listen", c.healthListen).Msg("health and metrics endpoint failed")
			}
		}()
	}
	log.Info().Strs("etcd", c.etcd.Endpoints).Msg("starting")
	err = intake.Run(ctx)
	if rec != nil {
		if ferr := rec.Flush(); ferr != nil {
			log.Error().Err(ferr).Msg("event log incomplete")
		}
	}
	st := intake.Stats()
	log.Info().Int64("revision", st.Revision.Load()).Int64("events", st.Events.Load()).
		Int64("bad_values", st.BadValues.Load()).Int64("retries", st.Retries.Load()).Msg("stopped")
	if ctx.Err() != nil {
		return nil // asked to stop
	}
	return err
}

func main() {
	c, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
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
