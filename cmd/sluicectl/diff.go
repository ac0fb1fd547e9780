package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
	"github.com/vishvananda/netns"
)

// runDiff compares this node's kernel with the desired state computed from etcd, writing
// nothing, and exits 1 when they differ: VXLAN devices, neighbours and routes, and with the
// service stage on, the pinned service maps. Run it on the node (it reads this network
// namespace's kernel and the pin directory).
func runDiff(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("diff")
	node := fs.String("node", "", "this node's name (default: as sluiced would name it)")
	configFile := fs.String("config", "", "sluiced's configuration file (default: SLUICE_CONFIG, or "+agentconfig.DefaultConfigFile+" when present)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	// The same configuration sluiced reads (its file and SLUICE_* variables), so the kernel
	// is compared with what this node's sluiced is set to program.
	var agentArgs []string
	if *node != "" {
		agentArgs = append(agentArgs, "--node-name", *node)
	}
	agent, err := a.agentConfig(*configFile, agentArgs...)
	if err != nil {
		return err
	}
	g, err := calc.New(agent.Calc)
	if err != nil {
		return err
	}
	dp := agent.DP
	if *node == "" {
		// Said, not assumed silently: a diff of another node's state would look believable.
		fmt.Fprintf(a.stderr, "node %s (the name this node's sluiced would use: its configuration, else the hostname; --node NAME to choose)\n", agent.NodeName)
	}
	*node = agent.NodeName
	var full *calc.Update
	if err := a.readUntilInSync(ctx, store.HandlerFunc(func(b []store.Event) {
		if u := g.OnEvents(b); u != nil && u.Full {
			full = u
		}
	})); err != nil {
		return err
	}
	if g.SelfMissing() {
		return noSuchNode(*node)
	}
	if agent.Calc.BGP && agent.HealthListen != "" {
		// Routes learned by BGP are the network's, not etcd's: the node's sluiced says
		// which its speaker holds.
		r, err := fetchBGP(ctx, agent.HealthListen, 5*time.Second)
		if err != nil {
			return fmt.Errorf("the routes BGP learned: %w", err)
		}
		g.OnLearned(learnedOf(r))
		full = g.State().Update()
	}
	k, err := dataplane.NewKernel(netns.None())
	if err != nil {
		return err
	}
	defer k.Close()
	missing, extra, err := dataplane.Diff(k, dp, full)
	if err != nil {
		return err
	}
	// sluiced runs the service stage only with the dataplane, and removes its pins when the
	// stage is off.
	if agent.Dataplane && agent.Services {
		sm, se, err := diffServiceMaps(full, agent.BPF.Services, agent.BPF.Sizes, agent.BPF.PinDir, a.stderr)
		if err != nil {
			return err
		}
		missing, extra = append(missing, sm...), append(extra, se...)
	} else if agent.Dataplane {
		extra = append(extra, leftoverPins(agent.BPF.PinDir)...)
	}
	if len(missing) == 0 && len(extra) == 0 {
		fmt.Fprintf(a.stdout, "%s's kernel matches its desired state\n", *node)
		return nil
	}
	fmt.Fprintf(a.stdout, "%s's kernel differs from its desired state:\n", *node)
	for _, m := range missing {
		fmt.Fprintf(a.stdout, "  missing: %s\n", m)
	}
	for _, e := range extra {
		fmt.Fprintf(a.stdout, "  extra:   %s\n", e)
	}
	return errDiffers
}

// diffServiceMaps compares the service maps pinned under pinDir with those the map driver
// writes for full (calc's full update) with cfg, as lines of bpf.Render: missing are the
// lines the kernel lacks, extra those it has too many. Maps not found are one missing line,
// not an error. The settings map is not compared (Render leaves it out: its tunnel MTU is
// the agent's to measure).
func diffServiceMaps(full *calc.Update, cfg bpf.Config, sizes bpf.MapSizes, pinDir string, warn io.Writer) (missing, extra []string, err error) {
	if full == nil {
		full = &calc.Update{Full: true}
	}
	tables, _ := bpf.MemTables(sizes)
	svc := bpf.NewServices(tables, cfg)
	svc.OnUpdate(full)
	if err := svc.Apply(); err != nil {
		// The kernel's maps have the same sizes: sluiced cannot write these either.
		fmt.Fprintf(warn, "warning: the desired service maps do not fit in this node's maps: %v\n", err)
	}
	want, err := bpf.Render(tables)
	if err != nil {
		return nil, nil, err
	}
	p, err := bpf.OpenPinned(pinDir)
	if errors.Is(err, bpf.ErrNotPinned) {
		return []string{err.Error()}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer p.Close()
	have, err := bpf.Render(p.Tables())
	if err != nil {
		return nil, nil, fmt.Errorf("reading the service maps in %s: %w", pinDir, err)
	}
	missing, extra = diffLines(want, have)
	return missing, extra, nil
}

// diffLines returns the lines of want not in have and those of have not in want, each in
// their text's order.
func diffLines(want, have string) (missing, extra []string) {
	count := map[string]int{}
	for _, l := range strings.Split(have, "\n") {
		if l != "" {
			count[l]++
		}
	}
	for _, l := range strings.Split(want, "\n") {
		if l == "" {
			continue
		}
		if count[l] > 0 {
			count[l]--
			continue
		}
		missing = append(missing, l)
	}
	for _, l := range strings.Split(have, "\n") {
		if l != "" && count[l] > 0 {
			count[l]--
			extra = append(extra, l)
		}
	}
	return missing, extra
}

// leftoverPins lists what the service stage pinned under pinDir, and its classic filters on
// this node's interfaces: sluiced removes it all when the stage is off.
func leftoverPins(pinDir string) []string {
	var out []string
	for _, name := range bpf.PinnedMapNames {
		path := filepath.Join(pinDir, name)
		if _, err := os.Stat(path); err == nil {
			out = append(out, fmt.Sprintf("pinned map %s (option services is off: sluiced removes it)", path))
		}
	}
	links, _ := os.ReadDir(filepath.Join(pinDir, "links"))
	for _, l := range links {
		out = append(out, fmt.Sprintf("program link %s (option services is off: sluiced removes it)", filepath.Join(pinDir, "links", l.Name())))
	}
	hooks, _ := bpf.SluiceFilters()
	for _, h := range hooks {
		out = append(out, fmt.Sprintf("tc filter pref %d handle %#x on %s (option services is off: sluiced removes it)", bpf.TCPriority, bpf.TCHandle, h))
	}
	return out
}
