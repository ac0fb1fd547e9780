package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
	"github.com/sluice-net/sluice/store"
)

// runPlan prints the desired dataplane of any node, computed by the same calc graph sluiced
// runs, from a live etcd or from a recorded event log. It touches no kernel.
func runPlan(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("plan")
	node := fs.String("node", "", "the node to plan for (required)")
	fromLog := fs.String("from-log", "", "read a recorded event log instead of etcd")
	output := outputFlag(fs, "table or json")
	config := agentconfig.CalcFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	if *node == "" {
		return usagef("need --node NAME")
	}
	if err := tableOrJSON(*output); err != nil {
		return err
	}
	cfg, err := config(*node)
	if err != nil {
		return usagef("%v", err)
	}
	g, err := calc.New(cfg)
	if err != nil {
		return usagef("%v", err)
	}
	feed := store.HandlerFunc(func(b []store.Event) { g.OnEvents(b) })
	if *fromLog != "" {
		f, err := os.Open(*fromLog)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := store.Replay(f, feed); err != nil {
			return fmt.Errorf("%s: %w", *fromLog, err)
		}
	} else if err := a.readUntilInSync(ctx, feed); err != nil {
		return err
	}
	if g.SelfMissing() {
		return noSuchNode(*node)
	}
	st := g.State()
	if *output == "json" {
		b, err := json.MarshalIndent(st, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", b)
		return err
	}
	fmt.Fprintf(a.stdout, "desired dataplane of %s\n\n", *node)
	return st.WriteText(a.stdout)
}

// readUntilInSync runs an intake into h until its first in-sync.
func (a *app) readUntilInSync(ctx context.Context, h store.Handler) error {
	cli, ctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	synced := false
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Reporter: stderrReporter{a}, Handler: store.HandlerFunc(func(b []store.Event) {
		h.OnEvents(b)
		if b[len(b)-1].Type == store.EventInSync {
			synced = true
			cancel()
		}
	})})
	if err != nil {
		return err
	}
	_ = in.Run(ctx)
	if !synced {
		return fmt.Errorf("etcd did not answer within %s", a.timeout)
	}
	return nil
}
