package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/manifest"
)

// stderrReporter prints each rejected value once and each retry, for an interactive tool.
type stderrReporter struct{ a *app }

func (r stderrReporter) BadValue(err *store.BadValueError) {
	fmt.Fprintf(r.a.stderr, "warning: skipped: %v\n", err)
}

func (r stderrReporter) Retry(err error, attempt int, delay time.Duration) {
	if attempt == 1 || attempt%10 == 0 {
		fmt.Fprintf(r.a.stderr, "warning: %s (attempt %d, next in %s)\n", store.Clip(err.Error(), store.MaxMessage), attempt, delay.Round(time.Millisecond))
	}
}

func (r stderrReporter) Silent(quiet time.Duration) {
	fmt.Fprintf(r.a.stderr, "warning: no answer from etcd for %s; waiting for it\n", quiet.Round(time.Second))
}

func (r stderrReporter) Heard(outage time.Duration) {
	fmt.Fprintf(r.a.stderr, "etcd answers again after %s\n", outage.Round(time.Millisecond))
}

func runRecord(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("record")
	untilSync := fs.Bool("until-in-sync", false, "stop after the first in-sync")
	duration := fs.Duration("for", 0, "stop after this long (0: until interrupted)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want FILE")
	}
	f, err := os.Create(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	cli, err := a.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	rec := store.NewRecorder(f)
	count := 0
	h := store.HandlerFunc(func(b []store.Event) {
		rec.OnEvents(b)
		count += len(b)
		if *untilSync && b[len(b)-1].Type == store.EventInSync {
			stop()
		}
	})
	in, err := store.NewIntake(store.IntakeConfig{Client: cli, Handler: h, Reporter: stderrReporter{a}})
	if err != nil {
		return err
	}
	_ = in.Run(ctx)
	if err := rec.Flush(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "recorded %d events up to revision %d to %s\n", count, in.Stats().Revision.Load(), pos[0])
	return nil
}

func runReplay(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("replay")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want FILE")
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	idx := store.NewIndex()
	if err := store.Replay(f, idx); err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	return manifest.WriteSnapshot(a.stdout, idx.Snapshot())
}
