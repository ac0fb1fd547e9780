// Command sluicectl is the operator's tool for sluice: it writes and reads the etcd data sluice
// acts on (Calico's pools, nodes, IPAM blocks and endpoints, and sluice's services), manages
// IPAM the way calico-ipam does, records and replays the event stream, and on a node compares
// its kernel with the desired state and shows its eBPF service maps.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
	"github.com/sluice-net/sluice/cmd/internal/buildinfo"
	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// app holds what every command shares: the connection settings and the output streams.
type app struct {
	etcd    store.ClientConfig
	timeout time.Duration
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
	getenv  func(string) string
	// lookupEnv tells a variable set but empty from one not set (sluiced's configuration).
	lookupEnv func(string) (string, bool)
}

// usageError makes main print the command's usage and exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

type command struct {
	summary string
	run     func(ctx context.Context, a *app, args []string) error
}

var commands = map[string]command{
	"apply":     {"write objects from YAML or JSON files (-f FILE|DIR|-)", runApply},
	"get":       {"list objects of a kind: get KIND [NAME] [-n NS] [-o table|yaml|json]", runGet},
	"delete":    {"delete objects: delete KIND NAME [-n NS], or delete -f FILE|DIR|- (--force: even if in use)", runDelete},
	"ipam":      {"claim blocks, assign and release addresses, show usage", runIPAM},
	"record":    {"record the event stream to a file: record FILE", runRecord},
	"replay":    {"replay a recorded event log and show the index it builds: replay FILE", runReplay},
	"plan":      {"print the desired dataplane of a node: plan --node NAME [--from-log FILE] [-o table|json]", runPlan},
	"diff":      {"on a node: compare its kernel with its desired state; exit 1 when they differ: diff --node NAME", runDiff},
	"status":    {"list every node's agent: in sync, lagging by N revisions, failing, starting, gone or none", runStatus},
	"version":   {"print sluicectl's version (also --version)", runVersion},
	"services":  {"on a node: show its service maps: services [frontends|backends|conntrack|drops] [-o table|json]", runServices},
	"bgp":       {"on a node: its BGP sessions (peer, AS, state, since, prefixes) and, with --routes, its table", runBGP},
	"leftovers": {"on a node: other software's programs on sluice's hooks, breaking or dormant; exit 1 when one breaks", runLeftovers},
}

func (a *app) globalFlags(fs *flag.FlagSet) {
	a.etcd.RegisterFlags(fs)
	fs.DurationVar(&a.timeout, "timeout", a.timeout, "how long one command may take talking to etcd")
}

// client connects with flags first, then the environment. An etcd that no endpoint reaches is
// an error at once, naming the endpoints and why (connection refused, no route, a timeout),
// rather than a "context deadline exceeded" when --timeout runs out.
func (a *app) client() (*clientv3.Client, error) {
	cfg := a.etcd.WithEnv(a.getenv)
	if err := reachable(cfg.Endpoints, min(a.timeout, 5*time.Second)); err != nil {
		return nil, err
	}
	return cfg.New()
}

// noSuchNode is the error for a --node that etcd has no Node of.
func noSuchNode(node string) error {
	return fmt.Errorf("no node named %q in etcd (no %s%s); sluicectl get nodes lists them", node, store.NodePrefix, node)
}

// dialTarget is the network and address etcd's client would dial for an endpoint: a unix
// socket for unix:// and unixs:// (unix:///path, or unix://name:port, which etcd takes for a
// socket file of that name), else TCP to host:port (2379 when no port is given).
func dialTarget(ep string) (network, addr string) {
	if u, err := url.Parse(ep); err == nil {
		switch u.Scheme {
		case "unix", "unixs":
			if u.Host != "" {
				return "unix", u.Host + u.Path
			}
			return "unix", u.Path
		}
		if u.Host != "" {
			ep = u.Host
		}
	}
	if _, _, err := net.SplitHostPort(ep); err != nil {
		ep = net.JoinHostPort(ep, "2379")
	}
	return "tcp", ep
}

// reachable checks that at least one endpoint accepts a connection within wait.
func reachable(endpoints []string, wait time.Duration) error {
	if len(endpoints) == 0 {
		endpoints = []string{store.DefaultEndpoint}
	}
	errs := make([]error, len(endpoints))
	var wg sync.WaitGroup
	for i, ep := range endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			network, addr := dialTarget(ep)
			c, err := net.DialTimeout(network, addr, wait)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", ep, err)
				return
			}
			c.Close()
		}()
	}
	wg.Wait()
	var failed []string
	for _, err := range errs {
		if err == nil {
			return nil // one member answers: the client finds it
		}
		failed = append(failed, err.Error())
	}
	return fmt.Errorf("cannot reach etcd (--etcd-endpoints or SLUICE_ETCD_ENDPOINTS): %s", strings.Join(failed, "; "))
}

// connect returns a client and a context bounded by --timeout; done releases both.
func (a *app) connect(ctx context.Context) (*clientv3.Client, context.Context, func(), error) {
	cli, err := a.client()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	return cli, ctx, func() { cancel(); cli.Close() }, nil
}

// flagSet returns a flag set for a command that also takes the global flags.
func (a *app) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("sluicectl "+name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() { // flag's own, in helpWidth columns
		fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
		printFlags(fs.Output(), fs)
	}
	a.globalFlags(fs)
	return fs
}

// outputFlag registers -o and its long form --output (kubectl's) on one value.
func outputFlag(fs *flag.FlagSet, formats string) *string {
	out := fs.String("o", "table", "output format: "+formats)
	fs.StringVar(out, "output", "table", "output format: "+formats+" (same as -o)")
	return out
}

// tableOrJSON checks an -o of the commands that print a table or JSON.
func tableOrJSON(output string) error {
	if output != "table" && output != "json" {
		return usagef("-o %q: want table or json", output)
	}
	return nil
}

// parseInterspersed parses flags that may come before or after positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluicectl [global flags] COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	nameWidth := 0
	for _, n := range names {
		nameWidth = max(nameWidth, len(n))
	}
	indent := strings.Repeat(" ", 2+nameWidth+2)
	for _, n := range names {
		lead := fmt.Sprintf("  %-*s  ", nameWidth, n)
		for _, l := range agentconfig.Wrap(commands[n].summary, helpWidth-len(indent)) {
			fmt.Fprintln(w, lead+l)
			lead = indent
		}
	}
	fmt.Fprintln(w, "\nkinds: ippools (ipp, pool), nodes (no), blocks, blockaffinities (affinity),\n  workloadendpoints (wep), services (svc), endpointslices")
	fmt.Fprintln(w, "\nglobal flags (also accepted after the command):")
	a := &app{}
	fs := flag.NewFlagSet("sluicectl", flag.ContinueOnError)
	fs.SetOutput(w)
	a.globalFlags(fs)
	printFlags(w, fs)
}

// run is main without the process: it returns the exit code. getenv stands for the
// environment, where an empty variable counts as unset.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	return runEnv(ctx, args, stdin, stdout, stderr, func(k string) (string, bool) { v := getenv(k); return v, v != "" })
}

// runEnv is run with an environment that tells empty variables from unset ones
// (os.LookupEnv), as sluiced reads its own.
func runEnv(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	getenv := func(k string) string { v, _ := lookupEnv(k); return v }
	a := &app{timeout: 30 * time.Second, stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv, lookupEnv: lookupEnv}
	fs := flag.NewFlagSet("sluicectl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(stderr) }
	a.globalFlags(fs)
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	rest := fs.Args()
	if *version {
		rest = []string{"version"}
	}
	if len(rest) == 0 {
		usage(stderr)
		return 2
	}
	if rest[0] == "help" {
		usage(stdout)
		return 0
	}
	cmd, ok := commands[rest[0]]
	if !ok {
		fmt.Fprintf(stderr, "sluicectl: unknown command %q\n\n", store.Clip(rest[0], store.MaxQuoted))
		usage(stderr)
		return 2
	}
	err := cmd.run(ctx, a, rest[1:])
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "sluicectl %s: %s\n", rest[0], store.ClipLines(ue.msg, store.MaxMessage))
		return 2
	case errors.Is(err, errDiffers):
		return 1
	}
	// Errors can quote input (a file, a value in etcd): each line is bounded.
	fmt.Fprintf(stderr, "sluicectl %s: %s\n", rest[0], store.ClipLines(err.Error(), 2*store.MaxMessage))
	if rest[0] == "diff" {
		return 2 // as diff(1): 1 means "they differ", 2 means trouble
	}
	return 1
}

// errDiffers asks for exit code 1 without a message (the command printed what it found).
var errDiffers = errors.New("differs")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runEnv(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}

func runVersion(_ context.Context, a *app, args []string) error {
	if len(args) > 0 {
		return usagef("version takes no arguments")
	}
	_, err := fmt.Fprintln(a.stdout, "sluicectl", buildinfo.Read())
	return err
}
