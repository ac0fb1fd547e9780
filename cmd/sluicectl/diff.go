package main

import (
	"context"
	"fmt"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
	"github.com/vishvananda/netns"
)

// runDiff compares this node's kernel with the desired state computed from etcd, writing
// nothing, and exits 1 when they differ. Run it on the node (it reads this network
// namespace's kernel).
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
	if *configFile != "" {
		agentArgs = append(agentArgs, "--config", *configFile)
	}
	if *node != "" {
		agentArgs = append(agentArgs, "--node-name", *node)
	}
	agent, err := agentconfig.ParseEnv(agentArgs, a.lookupEnv, a.stderr)
	if err != nil {
		return err
	}
	g, err := calc.New(agent.Calc)
	if err != nil {
		return err
	}
	dp := agent.DP
	*node = agent.NodeName
	var full *calc.Update
	if err := a.readUntilInSync(ctx, store.HandlerFunc(func(b []store.Event) {
		if u := g.OnEvents(b); u != nil && u.Full {
			full = u
		}
	})); err != nil {
		return err
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
