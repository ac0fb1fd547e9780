package etcdtest

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ChildEnv is the environment variable that makes ServeChild serve. It
// holds the JSON encoding of the child's Options.
const ChildEnv = "SLUICE_ETCDTEST_CHILD"

// ChildStartTimeout bounds how long StartChild waits for READY.
const ChildStartTimeout = ReadyTimeout + 30*time.Second

// ServeChild turns this process into an etcd server when ChildEnv is
// set: it starts a server with the options encoded there, prints
// "READY <endpoint>\n" on stdout, serves until stdin closes or SIGTERM
// (or SIGINT) arrives, then closes the server and exits the process.
// With GRPCProxyChildEnv set it does the same with a gRPC proxy. Without
// either it returns false at once.
//
// Call it first in a TestMain (or in main, for a plain program) so that
// StartChild and StartGRPCProxyChild can re-execute the binary.
func ServeChild() bool {
	if upstream := os.Getenv(GRPCProxyChildEnv); upstream != "" {
		os.Exit(serveGRPCProxyChild(upstream))
	}
	spec, ok := os.LookupEnv(ChildEnv)
	if !ok || spec == "" {
		return false
	}
	os.Exit(serveChild(spec))
	return true
}

// childSpec is what StartChild passes to ServeChild in ChildEnv.
type childSpec struct {
	Options
	// RemoveDir: the data dir is a temp dir made by StartChild; the
	// child removes it too on its way out, so that it goes away even
	// when the parent was killed and could not remove it.
	RemoveDir bool `json:",omitempty"`
}

func serveChild(raw string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "etcdtest child: bad %s: %v\n", ChildEnv, err)
		return 2
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	s, err := Start(spec.Options)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcdtest child: %v\n", err)
		return 1
	}
	defer func() {
		s.Close()
		if spec.RemoveDir && spec.Dir != "" {
			os.RemoveAll(spec.Dir)
		}
	}()
	return announceAndWait(s.Endpoint(), sigs)
}

// announceAndWait prints "READY <endpoint>" for the parent and waits until
// stdin closes or a signal arrives.
func announceAndWait(endpoint string, sigs <-chan os.Signal) int {
	stdinClosed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	if _, err := fmt.Fprintf(os.Stdout, "READY %s\n", endpoint); err != nil {
		return 1
	}
	select {
	case <-stdinClosed:
	case <-sigs:
	}
	return 0
}

// Child is an etcd server (or a gRPC proxy, see StartGRPCProxyChild)
// running in a child process (see ServeChild), so that a benchmark's heap
// holds only the client.
type Child struct {
	cmd      *exec.Cmd
	endpoint string
	dir      string
	ownDir   bool
	stdin    *os.File
	exited   chan struct{}
	stderr   *tailBuffer

	closeOnce sync.Once
}

// StartChild re-executes this binary (os.Executable, else os.Args[0])
// with ChildEnv set, and with -test.run=^$ when it is a test binary so
// that no test runs in the child, then waits for READY. The binary must
// call ServeChild first (in TestMain or main).
func StartChild(opts Options) (*Child, error) {
	c := &Child{exited: make(chan struct{}), stderr: &tailBuffer{max: 64 << 10}}
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "etcdtest-child-")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: data dir: %w", err)
		}
		opts.Dir, c.ownDir = d, true
	}
	c.dir = opts.Dir
	spec, err := json.Marshal(childSpec{Options: opts, RemoveDir: c.ownDir})
	if err != nil {
		c.removeDir()
		return nil, err
	}
	if err := c.start(ChildEnv + "=" + string(spec)); err != nil {
		return nil, err
	}
	return c, nil
}

// start runs the child with env added to this process's environment and
// waits for READY; on failure nothing of the child is left.
func (c *Child) start(env string) error {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	var args []string
	if flag.Lookup("test.run") != nil {
		args = append(args, "-test.run=^$", "-test.bench=^$")
	}
	c.cmd = exec.Command(exe, args...)
	c.cmd.Env = append(os.Environ(), env)
	c.cmd.Stderr = c.stderr

	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		c.removeDir()
		return err
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		c.removeDir()
		return err
	}
	c.cmd.Stdin, c.cmd.Stdout = stdinR, stdoutW
	err = c.cmd.Start()
	stdinR.Close()
	stdoutW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		c.removeDir()
		return fmt.Errorf("etcdtest: start child: %w", err)
	}
	c.stdin = stdinW
	go func() {
		c.cmd.Wait()
		close(c.exited)
	}()

	ready := make(chan string, 1)
	go func() {
		defer stdoutR.Close()
		sc := bufio.NewScanner(stdoutR)
		for sc.Scan() {
			if ep, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- ep
				break
			}
		}
		io.Copy(io.Discard, stdoutR) // keep the child from blocking on stdout
	}()

	timer := time.NewTimer(ChildStartTimeout)
	defer timer.Stop()
	select {
	case c.endpoint = <-ready:
		return nil
	case <-c.exited:
		select { // READY may have raced the exit
		case c.endpoint = <-ready:
			return nil
		default:
		}
		c.Close()
		return fmt.Errorf("etcdtest: child exited before READY (%v; does TestMain/main call ServeChild first?): %s",
			c.cmd.ProcessState, c.stderr.String())
	case <-timer.C:
		c.Close()
		return fmt.Errorf("etcdtest: child not READY after %v: %s", ChildStartTimeout, c.stderr.String())
	}
}

// Endpoint returns the child server's client URL.
func (c *Child) Endpoint() string { return c.endpoint }

// Dir returns the child server's data dir ("" for a proxy).
func (c *Child) Dir() string { return c.dir }

// Pid returns the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Close ends the child (stdin closed and SIGTERM, SIGKILL after 10 s),
// waits for it, and removes its data dir if StartChild created it. It is
// idempotent.
func (c *Child) Close() {
	c.closeOnce.Do(func() {
		c.stdin.Close()
		select {
		case <-c.exited:
		default:
			c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(10 * time.Second):
				c.cmd.Process.Kill()
				<-c.exited
			}
		}
		c.removeDir()
	})
}

func (c *Child) removeDir() {
	if c.ownDir {
		os.RemoveAll(c.dir)
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
