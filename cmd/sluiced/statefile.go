package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keptHeader says what a kept desired state (option state-file) is: calc's output as of etcd
// revision Revision, when each watched prefix held Counts keys, computed by build Build with
// calc's configuration Config. Started again, the agent programs that state at once when etcd
// holds exactly those keys still (store.UnchangedSince: a count and a revision filter, no
// value read), instead of waiting for its read of etcd, its decoding and calc's first full
// computation. The file is the header, JSON on one line, then the calc.State in gob (read in
// 40 ms at 20,000 nodes, a quarter of the time JSON took), so an agent finds out whether the
// state is of any use before it reads it.
//
// Hazards: the state is only as good as the binary and configuration that computed it, so
// another build (the Go build ID) or another calc configuration makes it unusable, not merely
// old; and it must never stand for etcd once etcd has moved: it is handed over only before
// calc's own first update, which replaces it.
type keptHeader struct {
	Format   int         `json:"format"`
	Build    string      `json:"build"`
	Config   calc.Config `json:"config"`
	Prefixes []string    `json:"prefixes"`
	Revision int64       `json:"revision"`
	Counts   []int64     `json:"counts"`
}

// keptStateFormat is the file's layout; a file of another is not used.
const keptStateFormat = 1

// saveState writes st, calc's desired state as of etcd revision rev over prefixes, to path:
// whole or not at all (a temporary file, synced, then renamed over it). It reads etcd for the
// prefixes' key counts at rev, so it fails when etcd cannot answer or has compacted rev away.
func saveState(ctx context.Context, path string, cli *clientv3.Client, build string, cfg calc.Config, prefixes []string, rev int64, st *calc.State) (int64, error) {
	counts, _, err := store.CountKeys(ctx, cli, prefixes, rev)
	if err != nil {
		return 0, err
	}
	st.Problems = nil // calc says them again once it has read etcd
	return writeKept(path, &keptHeader{Format: keptStateFormat, Build: build, Config: cfg, Prefixes: prefixes, Revision: rev, Counts: counts}, st)
}

// writeKept writes h and st to path, whole or not at all, and returns the file's size.
func writeKept(path string, h *keptHeader, st *calc.State) (int64, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return 0, err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp) // after the rename, nothing there
	w := bufio.NewWriterSize(f, 1<<20)
	err = json.NewEncoder(w).Encode(h)
	if err == nil {
		err = gob.NewEncoder(w).Encode(st)
	}
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	size, _ := f.Seek(0, io.SeekCurrent)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("writing %s: %w", tmp, err)
	}
	return size, os.Rename(tmp, path)
}

// keptCheckTimeout bounds the wait for etcd's answer at start, before the intake's read.
const keptCheckTimeout = 2 * time.Second

// keptApplyWait bounds how long the intake's read waits for the dataplane's apply of a
// restored state: beside each other both take longer (0.35-0.45 s for the apply at 20,000
// nodes, against 0.19 s alone), and the state being etcd's, nothing is lost by applying it
// first; what etcd changes meanwhile the read that follows brings.
const keptApplyWait = 5 * time.Second

// errNoKeptState is restoreState's answer when there is no file at all.
var errNoKeptState = errors.New("no state file")

// notCurrent says why a kept state is not used; it is not an error of the file.
type notCurrent string

func (n notCurrent) Error() string { return string(n) }

// restoreState reads the state kept at path and returns it as calc's first update would carry
// it, with the revision it was computed at and the one etcd was checked at, if build and cfg
// computed it over the same prefixes and etcd holds the same keys still. Otherwise the error
// says why: errNoKeptState, a notCurrent reason, or a file that cannot be read (naming it).
func restoreState(ctx context.Context, path string, cli *clientv3.Client, build string, cfg calc.Config, prefixes []string) (u *calc.Update, kept, checked int64, err error) {
	raw, err := os.ReadFile(path) // 2.3 MB at 20,000 nodes
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, 0, errNoKeptState
	}
	if err != nil {
		return nil, 0, 0, err
	}
	line, rest, found := bytes.Cut(raw, []byte("\n"))
	var h keptHeader
	if err := json.Unmarshal(line, &h); err != nil || !found {
		return nil, 0, 0, fmt.Errorf("reading the state file %s: the header: %v", path, cmp.Or(err, io.ErrUnexpectedEOF))
	}
	switch {
	case h.Format != keptStateFormat:
		return nil, 0, 0, notCurrent(fmt.Sprintf("written in format %d, not %d", h.Format, keptStateFormat))
	case h.Build != build:
		return nil, 0, 0, notCurrent("written by another build of sluiced")
	case h.Config != cfg:
		return nil, 0, 0, notCurrent("computed with another configuration")
	case !slices.Equal(h.Prefixes, prefixes):
		return nil, 0, 0, notCurrent("computed from other prefixes")
	case h.Revision <= 0:
		return nil, 0, 0, fmt.Errorf("reading the state file %s: revision %d", path, h.Revision)
	}
	// The state is decoded while etcd answers (each takes tens of milliseconds at 20,000
	// nodes); when etcd says no, the decoding is left to finish on its own.
	type decoded struct {
		st  calc.State
		err error
	}
	done := make(chan *decoded, 1)
	go func() {
		d := &decoded{}
		d.err = gob.NewDecoder(bytes.NewReader(rest)).Decode(&d.st)
		done <- d
	}()
	same, at, err := store.UnchangedSince(ctx, cli, prefixes, h.Revision, h.Counts)
	if err != nil {
		return nil, 0, 0, notCurrent(err.Error())
	}
	if !same {
		return nil, 0, 0, notCurrent(fmt.Sprintf("etcd changed since revision %d (now %d)", h.Revision, at))
	}
	d := <-done
	if d.err != nil {
		return nil, 0, 0, fmt.Errorf("reading the state file %s: %w", path, d.err)
	}
	return d.st.Update(), h.Revision, at, nil
}

// restoreKept runs before the intake's first read of etcd: it hands the stages the state kept
// by the last run when etcd still holds what it was computed from (and calc has not got there
// first; as etcd's for at most liveness, unless the intake's read is in by then), reports
// whether it did, and logs and counts what became of the file. It waits for
// etcd's answer for at most keptCheckTimeout: an etcd that cannot answer is left to the
// intake.
func restoreKept(ctx context.Context, path string, cli *clientv3.Client, build string, liveness time.Duration, plan *planner, prefixes []string, state *agentState, log zerolog.Logger) (handed bool) {
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, keptCheckTimeout)
	defer cancel()
	u, kept, checked, err := restoreState(rctx, path, cli, build, plan.graph.Config(), prefixes)
	answered := time.Now()
	var nc notCurrent
	outcome := "restored"
	switch {
	case errors.Is(err, errNoKeptState):
		outcome = "missing"
		log.Info().Str("file", path).Msg("no state file: the desired state comes from etcd")
	case errors.As(err, &nc):
		outcome = "not-current"
		log.Info().Str("file", path).Str("why", nc.Error()).Msg("state file not used: the desired state comes from etcd")
	case err != nil:
		outcome = "unreadable"
		log.Warn().Err(err).Str("file", path).Msg("state file unreadable: the desired state comes from etcd")
	case !plan.restore(u, checked, answered.Add(liveness), &state.restored, &state.restoredUntil):
		outcome = "not-current"
		log.Info().Str("file", path).Msg("state file not used: calc's own desired state came first")
	default:
		log.Info().Str("file", path).Int64("revision", kept).Int64("checked_at", checked).Int("objects", len(u.Ops)).
			Dur("took", time.Since(start)).Msg("desired state restored: etcd holds the keys it was computed from")
	}
	state.stateFile.WithLabelValues(outcome).Inc()
	return outcome == "restored"
}

// saveKept keeps graph's desired state, as of etcd revision rev, in path for the next start;
// it runs as the agent stops, after the intake has ended (nothing else touches graph).
func saveKept(path string, cli *clientv3.Client, build string, graph *calc.Graph, prefixes []string, rev int64, state *agentState, log zerolog.Logger) {
	if !graph.InSync() || graph.SelfMissing() {
		log.Info().Str("file", path).Msg("desired state not saved: the agent never had it whole")
		return
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	size, err := saveState(ctx, path, cli, build, graph.Config(), prefixes, rev, graph.State())
	if err != nil {
		state.stateFile.WithLabelValues("save-failed").Inc()
		log.Warn().Err(err).Str("file", path).Msg("desired state not saved: the next start reads etcd before it programs anything")
		return
	}
	state.stateFile.WithLabelValues("saved").Inc()
	log.Info().Str("file", path).Int64("revision", rev).Int64("bytes", size).Dur("took", time.Since(start)).Msg("desired state saved")
}
