package agent

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keptHeader says what a kept desired state (option state-file) is: calc's output computed
// by build Build with calc's configuration Config from etcd's keys under each watched prefix
// as the intake held them (store.PrefixState: as of a revision, how many keys, the newest mod
// revision among them), and a checksum of the state. Started again, the agent programs that
// state at once when etcd holds exactly those keys still (store.Unchanged: a count and the
// newest key, no value sent), instead of waiting for its read of etcd, its decoding and calc's
// first full computation. The file is the header, JSON on one line, then the calc.State in
// gob (faster to read than JSON; BenchmarkKeptState in cmd/sluiced measures the restore), so
// an agent finds out whether the state is of any use before it decodes it.
//
// Hazards: the state is only as good as the binary and configuration that computed it, so
// another build (the Go build ID) or another calc configuration makes it unusable, not merely
// old; it must be saved only when the intake holds etcd's keys whole (not in the middle of a
// read, whose deletions come last), each prefix at the revision its own watch reached; and
// it must never stand for etcd once etcd has moved: it is handed over only before calc's own
// first update, which replaces it.
type keptHeader struct {
	Format   int                 `json:"format"`
	Build    string              `json:"build"`
	Config   calc.Config         `json:"config"`
	Prefixes []store.PrefixState `json:"prefixes"`
	// Checksum is the CRC-32 (Castagnoli) of the gob that follows: a file damaged on disk
	// could otherwise decode into other addresses.
	Checksum uint32 `json:"checksum"`
}

// keptStateFormat is the file's layout; a file of another is not used.
const keptStateFormat = 2

// saveState writes st, calc's desired state computed from the keys held (store.Intake.Held),
// to path: whole or not at all (a temporary file, synced, then renamed over it).
func SaveState(path, build string, cfg calc.Config, held []store.PrefixState, st *calc.State) (int64, error) {
	kept := *st
	kept.Problems = nil // calc says them again once it has read etcd
	return writeKept(path, &keptHeader{Format: keptStateFormat, Build: build, Config: cfg, Prefixes: held}, &kept)
}

// writeKept writes h and st to path, whole or not at all, and returns the file's size.
func writeKept(path string, h *keptHeader, st *calc.State) (int64, error) {
	var payload bytes.Buffer
	if err := gob.NewEncoder(&payload).Encode(st); err != nil {
		return 0, err
	}
	h.Checksum = crc32.Checksum(payload.Bytes(), castagnoli)
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
		_, err = w.Write(payload.Bytes())
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

// KeptCheckTimeout bounds the wait for etcd's answer at start, before the intake's read.
const KeptCheckTimeout = 2 * time.Second

// KeptApplyWait bounds how long the intake's read waits for the dataplane's apply of a
// restored state: beside each other both take longer (docs/perf-log.md has the run), and
// the state being etcd's, nothing is lost by applying it first; what etcd changes meanwhile
// the read that follows brings.
const KeptApplyWait = 5 * time.Second

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrNoKeptState is restoreState's answer when there is no file at all.
var ErrNoKeptState = errors.New("no state file")

// NotCurrent says why a kept state is not used; it is not an error of the file.
type NotCurrent string

func (n NotCurrent) Error() string { return string(n) }

// restoreState reads the state kept at path and returns it as calc's first update would carry
// it, with the newest revision it was computed at and the one etcd was checked at, if build and
// cfg computed it over the same prefixes and etcd holds the same keys still. Otherwise the
// error says why: ErrNoKeptState, a NotCurrent reason, an EtcdUnanswered error, or a file
// that cannot be read (naming it).
func RestoreState(ctx context.Context, path string, cli *clientv3.Client, build string, cfg calc.Config, prefixes []string) (u *calc.Update, kept, checked int64, err error) {
	raw, err := os.ReadFile(path) // 2.3 MB at 20,000 nodes
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, 0, ErrNoKeptState
	}
	if err != nil {
		return nil, 0, 0, err
	}
	line, rest, found := bytes.Cut(raw, []byte("\n"))
	var h keptHeader
	if err := json.Unmarshal(line, &h); err != nil || !found {
		return nil, 0, 0, fmt.Errorf("reading the state file %s: the header: %v", path, cmp.Or(err, io.ErrUnexpectedEOF))
	}
	kept = HeldRevision(h.Prefixes)
	names := make([]string, len(h.Prefixes))
	for i, p := range h.Prefixes {
		names[i] = p.Prefix
	}
	switch {
	case h.Format != keptStateFormat:
		return nil, 0, 0, NotCurrent(fmt.Sprintf("written in format %d, not %d", h.Format, keptStateFormat))
	case h.Build != build:
		return nil, 0, 0, NotCurrent("written by another build of sluiced")
	case h.Config != cfg:
		return nil, 0, 0, NotCurrent("computed with another configuration")
	case !slices.Equal(names, prefixes):
		return nil, 0, 0, NotCurrent("computed from other prefixes")
	case crc32.Checksum(rest, castagnoli) != h.Checksum:
		return nil, 0, 0, fmt.Errorf("reading the state file %s: the state does not match its checksum", path)
	}
	// The state is decoded while etcd answers (BenchmarkKeptState in cmd/sluiced measures
	// both); when etcd says no, the decoding is left to finish on its own.
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
	same, at, err := store.Unchanged(ctx, cli, h.Prefixes)
	if err != nil {
		return nil, 0, 0, EtcdUnanswered{err}
	}
	if !same {
		return nil, 0, 0, NotCurrent(fmt.Sprintf("etcd changed since revision %d (now %d)", kept, at))
	}
	d := <-done
	if d.err != nil {
		return nil, 0, 0, fmt.Errorf("reading the state file %s: %w", path, d.err)
	}
	return d.st.Update(), kept, at, nil
}

// KeptLearned reads the routes BGP had learned from the state kept at path, whether or not
// etcd still holds what the state came from: they are the network's, not etcd's, and the
// kernel still holds them (graceful restart). Nothing (nil) when the file is missing, or was
// written by another build or configuration.
func KeptLearned(path, build string, cfg calc.Config) ([]calc.Learned, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	line, rest, found := bytes.Cut(raw, []byte("\n"))
	var h keptHeader
	if err := json.Unmarshal(line, &h); err != nil || !found {
		return nil, fmt.Errorf("reading the state file %s: the header: %v", path, cmp.Or(err, io.ErrUnexpectedEOF))
	}
	if h.Format != keptStateFormat || h.Build != build || h.Config != cfg {
		return nil, nil
	}
	if crc32.Checksum(rest, castagnoli) != h.Checksum {
		return nil, fmt.Errorf("reading the state file %s: the state does not match its checksum", path)
	}
	var st calc.State
	if err := gob.NewDecoder(bytes.NewReader(rest)).Decode(&st); err != nil {
		return nil, fmt.Errorf("reading the state file %s: %w", path, err)
	}
	return st.LearnedRoutes(), nil
}

// heldRevision is the newest of the revisions the prefixes were held at: the one a kept state
// is named by in logs.
func HeldRevision(held []store.PrefixState) int64 {
	rev := int64(0)
	for _, h := range held {
		rev = max(rev, h.Revision)
	}
	return rev
}

// EtcdUnanswered is restoreState's answer when etcd could not be asked.
type EtcdUnanswered struct{ error }
