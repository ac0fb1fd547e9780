package bgp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/sluice-net/sluice/bgp"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/nstest"
)

// The speaker runs in a child process (this test binary again) started inside the node's
// namespace: GoBGP opens its sockets from goroutines on any thread, so one thread moved into
// a namespace is not enough; a process is wholly in one. The test speaks to it in JSON
// lines: it sends updates and asks for the table; the child reports its sessions.

const helperEnv = "SLUICE_BGP_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		runHelper()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// request is one line to the child: an update to apply, or a question.
type request struct {
	Update *calc.Update `json:"update,omitempty"`
	RIB    bool         `json:"rib,omitempty"`
	Counts bool         `json:"counts,omitempty"`
}

// reply is one line from the child.
type reply struct {
	Session *bgp.SessionEvent `json:"session,omitempty"`
	RIB     []bgp.Route       `json:"rib,omitempty"`
	RIBDone bool              `json:"ribDone,omitempty"`
	Applied *string           `json:"applied,omitempty"`
	Learned []calc.Learned    `json:"learned,omitempty"`
	Synced  bool              `json:"synced,omitempty"`
	Counts  *[2]int           `json:"counts,omitempty"` // SessionCounts: configured, up
}

func runHelper() {
	out := json.NewEncoder(os.Stdout)
	var mu sync.Mutex
	say := func(r reply) {
		mu.Lock()
		defer mu.Unlock()
		_ = out.Encode(r)
	}
	sp := bgp.New(bgp.Config{SecretsDir: os.Getenv("SLUICE_BGP_SECRETS"), Restarting: os.Getenv("SLUICE_BGP_RESTARTING") != "",
		OnSession: func(e bgp.SessionEvent) { say(reply{Session: &e}) },
		OnLearned: func(ls []calc.Learned) { say(reply{Learned: ls}) },
		OnSynced:  func() { say(reply{Synced: true}) },
		OnApply: func(err error) {
			s := ""
			if err != nil {
				s = err.Error()
			}
			say(reply{Applied: &s})
		}})
	go sp.Run(context.Background())
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var r request
		if err := json.Unmarshal(in.Bytes(), &r); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(2)
		}
		if r.Update != nil {
			sp.OnUpdate(r.Update)
		}
		if r.RIB {
			rib, err := sp.RIB()
			if err != nil {
				fmt.Fprintln(os.Stderr, "helper:", err)
			}
			say(reply{RIB: rib, RIBDone: true})
		}
		if r.Counts {
			configured, up := sp.SessionCounts()
			say(reply{Counts: &[2]int{configured, up}})
		}
	}
	// stdin closed: leave as a killed process would, without a word to the peers.
}

// speakerProc is a speaker child process.
type speakerProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	mu   sync.Mutex
	seen []reply
	more chan struct{}
}

// startSpeaker starts a speaker child in ns.
func startSpeaker(t *testing.T, ns netns.NsHandle, secrets string, env ...string) *speakerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"=1", "SLUICE_BGP_SECRETS="+secrets), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := nstest.Run(ns, cmd.Start); err != nil {
		t.Fatal(err)
	}
	p := &speakerProc{t: t, cmd: cmd, in: in, more: make(chan struct{}, 1)}
	t.Cleanup(p.kill)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var r reply
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			p.mu.Lock()
			p.seen = append(p.seen, r)
			p.mu.Unlock()
			select {
			case p.more <- struct{}{}:
			default:
			}
		}
	}()
	return p
}

// kill ends the child at once (SIGKILL): no Cease reaches its peers.
func (p *speakerProc) kill() {
	if p.cmd.Process != nil && p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

func (p *speakerProc) send(r request) {
	p.t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatal(err)
	}
}

// waitFor waits until a reply after index from satisfies ok, and returns its index.
func (p *speakerProc) waitFor(what string, from int, timeout time.Duration, ok func(reply) bool) int {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		p.mu.Lock()
		for i := from; i < len(p.seen); i++ {
			if ok(p.seen[i]) {
				p.mu.Unlock()
				return i
			}
		}
		p.mu.Unlock()
		select {
		case <-p.more:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			p.t.Fatalf("no %s from the speaker within %v; it said:\n%s", what, timeout, p.said())
		}
	}
}

func (p *speakerProc) said() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, r := range p.seen {
		line, _ := json.Marshal(r)
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

func (p *speakerProc) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

// rib asks the child for its table.
func (p *speakerProc) rib() []bgp.Route {
	p.t.Helper()
	from := p.count()
	p.send(request{RIB: true})
	i := p.waitFor("table", from, 5*time.Second, func(r reply) bool { return r.RIBDone })
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[i].RIB
}

// learnedVia says whether ls holds prefix p learned through exactly the next hops nhs.
func learnedVia(ls []calc.Learned, p netip.Prefix, nhs ...netip.Addr) bool {
	return slices.ContainsFunc(ls, func(l calc.Learned) bool { return l.Prefix == p && slices.Equal(l.NextHops, nhs) })
}

// waitCounts asks the child for SessionCounts until they are configured and up.
func (p *speakerProc) waitCounts(configured, up int) {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		from := p.count()
		p.send(request{Counts: true})
		i := p.waitFor("session counts", from, 5*time.Second, func(r reply) bool { return r.Counts != nil })
		p.mu.Lock()
		got := *p.seen[i].Counts
		p.mu.Unlock()
		if got == [2]int{configured, up} {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("session counts %v, want [%d %d]", got, configured, up)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
