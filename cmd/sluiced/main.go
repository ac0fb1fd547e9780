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
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
)

type config struct {
	etcd      store.ClientConfig
	nodeName  string
	logFormat string
	logLevel  string
	record    string
	calc      calc.Config
	routeSrc  string
	blackhole string
	dataplane bool
	dp        dataplane.Config
	nodeAddr  string
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("sluiced", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.etcd.RegisterFlags(fs)
	fs.StringVar(&c.nodeName, "node-name", "", "this node's name as in Calico's Node resources (env SLUICE_NODE_NAME; default the hostname)")
	fs.StringVar(&c.logFormat, "log-format", "", "json or console (env SLUICE_LOG_FORMAT; default console on a terminal, else json)")
	fs.StringVar(&c.logLevel, "log-level", "", "debug, info, warn or error (env SLUICE_LOG_LEVEL; default info)")
	fs.StringVar(&c.record, "record", "", "also record every event to this file as JSON lines (replay with sluicectl replay)")
	c.calc = calc.DefaultConfig("")
	fs.StringVar(&c.routeSrc, "route-source", string(c.calc.RouteSource), "CalicoIPAM (routes from IPAM blocks) or WorkloadIPs (from workload endpoints, for OpenStack without blocks)")
	fs.BoolVar(&c.calc.VXLAN, "vxlan", c.calc.VXLAN, "program VXLAN routes and VTEPs")
	fs.StringVar(&c.calc.VXLANDevice, "vxlan-device", c.calc.VXLANDevice, "name of sluice's VXLAN device")
	fs.StringVar(&c.blackhole, "blackhole-type", string(c.calc.BlackholeType), "route type for local blocks: blackhole (silent), unreachable or prohibit (ICMP errors)")
	fs.IntVar(&c.calc.BlackholeMetric, "blackhole-metric", c.calc.BlackholeMetric, "metric of local-block blackholes (high, so an operator's route wins)")
	fs.BoolVar(&c.calc.PoolBlackholes, "pool-blackholes", c.calc.PoolBlackholes, "also blackhole whole pools at the lowest priority")
	fs.BoolVar(&c.dataplane, "dataplane", true, "program the kernel (false: read etcd and compute only)")
	fs.IntVar(&c.dp.Routes.Table, "route-table", 254, "routing table sluice's routes go in")
	fs.IntVar(&c.dp.Routes.Protocol, "route-protocol", dataplane.DefaultRouteProtocol, "route protocol number that marks sluice's routes (exclusive to sluice)")
	fs.IntVar(&c.dp.VXLAN.VNI, "vxlan-vni", dataplane.DefaultVNI, "VXLAN network identifier")
	fs.IntVar(&c.dp.VXLAN.Port, "vxlan-port", dataplane.DefaultVXLANPort, "VXLAN UDP port")
	fs.IntVar(&c.dp.VXLAN.MTU, "vxlan-mtu", 0, "MTU of the VXLAN device (0: the parent interface's MTU minus 50)")
	fs.DurationVar(&c.dp.ResyncInterval, "resync-interval", 90*time.Second, "period of the full dataplane resync (safety net)")
	fs.BoolVar(&c.dp.CleanConflicts, "clean-conflicts", false, "remove what other networking software left that breaks sluice's routes (routes over sluice's destinations, VXLAN devices on its VNI or port); without it they are only reported")
	fs.StringVar(&c.nodeAddr, "node-address", "", "this node's underlay address, when VXLAN is off and no Node gives it")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	c.etcd = c.etcd.WithEnv(getenv)
	if c.nodeName == "" {
		c.nodeName = getenv("SLUICE_NODE_NAME")
	}
	if c.nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--node-name not set and the hostname is unknown: %w", err)
		}
		c.nodeName = h
	}
	c.calc.NodeName, c.calc.RouteSource, c.calc.BlackholeType = c.nodeName, calc.RouteSource(c.routeSrc), calc.RouteType(c.blackhole)
	c.dp.VXLAN.Name = c.calc.VXLANDevice
	if c.nodeAddr != "" {
		a, err := netip.ParseAddr(c.nodeAddr)
		if err != nil {
			return nil, fmt.Errorf("--node-address %q: want an IP address", c.nodeAddr)
		}
		c.dp.ParentAddr = a
	}
	if c.dp.Routes.Protocol < 1 || c.dp.Routes.Protocol > 255 || c.dp.Routes.Protocol == 2 {
		return nil, fmt.Errorf("--route-protocol %d: want 1 to 255, not the kernel's 2", c.dp.Routes.Protocol)
	}
	if _, err := calc.New(c.calc); err != nil {
		return nil, err
	}
	if c.logFormat == "" {
		c.logFormat = getenv("SLUICE_LOG_FORMAT")
	}
	switch c.logFormat {
	case "", "json", "console":
	default:
		return nil, fmt.Errorf("--log-format %q: want json or console", c.logFormat)
	}
	if c.logLevel == "" {
		c.logLevel = getenv("SLUICE_LOG_LEVEL")
	}
	if c.logLevel == "" {
		c.logLevel = "info"
	}
	switch c.logLevel {
	case "debug", "info", "warn", "error":
	default:
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.logLevel)
	}
	return c, nil
}

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
	plan := &planner{graph: graph, log: log}
	if c.dataplane {
		dp, err := startDataplane(ctx, c, log)
		if err != nil {
			return err
		}
		plan.dp = dp
	}
	handlers := store.Fanout{index, &eventLogger{log: log, index: index}, plan}
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
