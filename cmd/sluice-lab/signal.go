package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// How a run of the lab stops on a signal. SIGINT (Ctrl-C: the terminal sends it to the
// whole foreground process group, the lab's agents, etcd and tools included) or SIGTERM
// ends the lab's context with an interrupted cause. From then on every wait of the lab
// (retry, waitFor, waitReady, sleep) returns at once, the processes it runs are stopped
// (SIGTERM, SIGKILL after procGrace), none starts, and the next step or check does not run:
// it panics with errInterrupted, which end recovers. end then tears the lab down as after a
// full run, and the run returns the cause.

// interrupted is the cause of a run's end on a signal.
type interrupted struct{ sig syscall.Signal }

func (e interrupted) Error() string { return "interrupted by " + unix.SignalName(e.sig) }

// exit ends the process by the signal, as a program that does not catch it ends, so that
// what runs the lab (make, a shell's loop) knows it was interrupted and stops too; with the
// shell's status for it (128 + the signal) should the signal not end it.
func (e interrupted) exit() {
	signal.Reset(e.sig)
	_ = syscall.Kill(os.Getpid(), e.sig)
	time.Sleep(time.Second)
	os.Exit(128 + int(e.sig))
}

// errInterrupted unwinds a run from the step or check that found the lab's context done.
var errInterrupted = errors.New("the run was interrupted")

// signalContext is done, with an interrupted cause, at the first SIGINT or SIGTERM; later ones
// are ignored, so that a second Ctrl-C does not cut the teardown short.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sigs:
			cancel(interrupted{s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		cancel(context.Canceled)
	}
}

// halt ends the run (see end) if the lab's context is done: called where a step, a check or
// a process begins.
func (l *lab) halt() {
	if l.ctx.Err() != nil {
		panic(errInterrupted)
	}
}

// end is deferred first thing by every run (demo, faults, smoke), with the lab's context
// set: it tears the lab down, and if the context ended before the run did (a signal, a test's
// deadline) it says so and makes the run's error the context's cause. A run that finished
// (demo --keep ends on Ctrl-C) keeps its result.
func (l *lab) end(err *error) {
	if r := recover(); r != nil {
		if r != errInterrupted {
			l.cleanup()
			panic(r)
		}
		*err = errInterrupted
	}
	if *err != nil && l.ctx.Err() != nil {
		fmt.Fprintf(l.out, "\n==> %v after %d checks: no more checks; tearing the lab down\n", context.Cause(l.ctx), l.checks)
	}
	l.cleanup()
	// Asked again after the teardown: the terminal's SIGINT reaches the lab's processes too,
	// and one of them dying may have failed the run before the lab had seen the signal.
	if *err != nil && l.ctx.Err() != nil {
		*err = context.Cause(l.ctx)
	}
}
