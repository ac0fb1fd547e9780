// Command sluice-lab runs sluice's main job on one machine: three nodes as network namespaces
// on an underlay of two subnets joined by a router, a LAN gateway that is every node's default
// route, workloads as namespaces on veth pairs, an etcd in the router, and one sluiced per node.
// It loads a sample cluster with sluicectl exactly as an operator would, then proves with real
// traffic that sluice routes it, one PASS or FAIL line per check, and tears everything down.
// It needs root and iproute2, nothing else: its network tools are its own subcommands.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

type lab struct {
	// ctx is the run's (see end): once it is done no step, check or process starts and
	// every wait returns at once.
	ctx      context.Context
	bin      string // directory holding sluicectl, sluiced and sluice-lab
	testdata string
	out      io.Writer
	failures int
	checks   int
	procs    []*proc
	agents   map[string]*proc
	dir      string
	bpffs    bool  // the lab's bpffs is mounted at dir/bpf
	etcd     *proc // the etcd serving the lab
	// outage is how long the fault suite keeps the link to etcd cut after the agent noticed.
	outage time.Duration
	// agentWrap, when set, is the command sluiced runs under (the fault suite's).
	agentWrap []string
	// bondVLAN gives node-a a bond for its uplink (active-backup, slaves eth0 and eth2) and
	// node-b an 802.1Q sub-interface (eth0.100): bare metal's shapes (smoke --uplinks).
	bondVLAN bool
	// rack runs BGP (the demo's rack, rack.go): the router's speaker (tor) and every agent
	// with --bgp.
	rack bool
	tor  *proc
}

// uplink is the device that carries a node's LAN address.
func (l *lab) uplink(node string) string {
	switch {
	case l.bondVLAN && node == "node-a":
		return "bond0"
	case l.bondVLAN && node == "node-b":
		return "eth0.100"
	}
	return "eth0"
}

func (l *lab) step(format string, args ...any) {
	l.halt()
	fmt.Fprintf(l.out, "\n==> %s\n", fmt.Sprintf(format, args...))
}

// check prints a check's verdict; once the lab's context is done it ends the run instead
// (see end): a check that failed because the signal killed its tool is not reported.
func (l *lab) check(ok bool, format string, args ...any) bool {
	l.halt()
	verdict := "PASS"
	if !ok {
		verdict = "FAIL"
		l.failures++
	}
	l.checks++
	fmt.Fprintf(l.out, "%s: %s\n", verdict, fmt.Sprintf(format, args...))
	return ok
}

func (l *lab) tool() string { return filepath.Join(l.bin, "sluice-lab") }

// ctl runs sluicectl inside the router namespace (where etcd is), echoing it.
func (l *lab) ctl(args ...string) (string, error) {
	l.halt()
	fmt.Fprintf(l.out, "$ sluicectl %s\n", strings.Join(args, " "))
	cmd := l.command("ip", append([]string{"netns", "exec", nsRouter, filepath.Join(l.bin, "sluicectl")}, args...)...)
	cmd.Env = append(os.Environ(), "SLUICE_ETCD_ENDPOINTS=http://"+etcdListen)
	out, err := cmd.CombinedOutput()
	l.out.Write(out)
	return string(out), err
}

// apply writes doc to a file named name in the lab's directory and applies it with sluicectl
// (a check line says whether it went in).
func (l *lab) apply(name, doc string) error {
	file := filepath.Join(l.dir, name)
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		return err
	}
	l.mustCtl("apply", "-f", file)
	return nil
}

func (l *lab) mustCtl(args ...string) string {
	out, err := l.ctl(args...)
	l.check(err == nil, "sluicectl %s", strings.Join(args[:min(len(args), 3)], " "))
	return out
}

// proc is a background process inside a namespace whose output lines are kept (and echoed
// with a prefix when echo is set, until the lab's context is done). It is stopped when the
// lab's context is done (SIGTERM, then SIGKILL after procGrace).
type proc struct {
	ctx   context.Context
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	lines []string
	done  chan struct{}
	err   error
}

// procGrace is how long a process of the lab has to exit once it was sent SIGTERM for the
// lab's context being done; then it is killed. An agent whose etcd is gone too takes 2 s
// (its status lease's revoke times out).
const procGrace = 5 * time.Second

func (l *lab) start(ns, prefix string, echo bool, args ...string) (*proc, error) {
	l.halt()
	cmd := exec.CommandContext(l.ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = procGrace
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{ctx: l.ctx, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if echo && p.ctx.Err() == nil {
				fmt.Fprintf(l.out, "  [%s] %s\n", prefix, sc.Text())
			}
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
	}()
	go func() {
		p.err = cmd.Wait()
		pw.Close()
		<-scanned // done means every line is in p.lines
		close(p.done)
	}()
	l.procs = append(l.procs, p)
	return p, nil
}

// matching returns the lines that contain s.
func (p *proc) matching(s string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, line := range p.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

func (p *proc) count(parts ...string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, line := range p.lines {
		all := true
		for _, s := range parts {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// waitFor waits until a line holds every part, the process ends, the timeout passes or the
// lab's context is done, and says whether one does.
func (p *proc) waitFor(timeout time.Duration, parts ...string) bool {
	deadline := time.Now().Add(timeout)
	for p.count(parts...) == 0 {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-p.done:
			return p.count(parts...) > 0
		case <-p.ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	return true
}

// finish closes the stream tool's input (it then reports and exits), waits for it, and says
// whether it ran to its end: every round trip answered ("round trips" reported, no error).
func (p *proc) finish() bool {
	_ = p.stdin.Close()
	<-p.done
	return p.err == nil && p.count("round trips") == 1
}

// transcript is the process's output on one line, and how it ended.
func (p *proc) transcript() string { return fmt.Sprintf("%s %v", strings.Join(p.lines, " "), p.err) }

// stop sends SIGTERM and waits.
func (p *proc) stop() error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// routeLayout is the node's route layout: node-c lays its routes out as Felix does (each its
// own gateway), the others through nexthop objects, so the lab's traffic crosses both.
func routeLayout(node string) string {
	if node == "node-c" {
		return "gateways"
	}
	return "nexthops"
}

// startAgent starts node's sluiced with the lab's options; extra ones come last (and so win).
func (l *lab) startAgent(node string, extra ...string) (*proc, error) {
	// One bpffs for the lab, mounted here in the host's mount namespace: `ip netns exec` gives
	// each agent a mount namespace of its own, and a bpffs mounted there would vanish with
	// the agent, pins and all. Each agent pins under a directory of its own.
	bpffs := filepath.Join(l.dir, "bpf")
	if !l.bpffs {
		if err := os.MkdirAll(bpffs, 0o700); err != nil {
			return nil, err
		}
		if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
			return nil, fmt.Errorf("mounting the lab's bpffs: %w", err)
		}
		l.bpffs = true
		// The cgroup v2 hierarchy too: `ip netns exec` remounts /sys, hiding /sys/fs/cgroup
		// from the agents. Their socket programs act only on their own namespace's sockets.
		cg := filepath.Join(l.dir, "cgroup")
		if err := os.MkdirAll(cg, 0o700); err != nil {
			return nil, err
		}
		if err := unix.Mount("cgroup2", cg, "cgroup2", 0, ""); err != nil {
			return nil, fmt.Errorf("mounting cgroup2 for the lab: %w", err)
		}
	}
	p, err := l.start(nodeNS(node), "sluiced "+node, true, append(append(slices.Clone(l.agentWrap), filepath.Join(l.bin, "sluiced"), "--node-name", node,
		"--etcd-endpoints", "http://"+etcdListen, "--log-format", "console", "--resync-interval", "30s",
		"--bpf-pin-dir", filepath.Join(bpffs, node), "--conntrack-cleanup-interval", "2s", "--state-file", filepath.Join(l.dir, node+".desired-state"),
		"--cgroup-path", filepath.Join(l.dir, "cgroup"), "--route-layout", routeLayout(node)), append(l.bgpFlags(), extra...)...)...)
	if err == nil {
		l.agents[node] = p
	}
	return p, err
}

// bgpFlags are the agents' BGP options: on in the rack.
func (l *lab) bgpFlags() []string {
	if l.rack {
		return []string{"--bgp"}
	}
	return nil
}

// retry runs f until it succeeds, the timeout passes or the lab's context is done; it
// returns how long it took.
func (l *lab) retry(timeout time.Duration, f func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := f()
		if err == nil || time.Since(start) > timeout {
			return time.Since(start), err
		}
		if !l.sleep(50 * time.Millisecond) {
			return time.Since(start), context.Cause(l.ctx)
		}
	}
}

// sleep waits for d or until the lab's context is done, and says whether it slept all of d.
func (l *lab) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.ctx.Done():
		return false
	}
}

func (l *lab) workload(name string) labWorkload { return workloadNamed(name) }

func (l *lab) ping(from, to string) error {
	_, err := l.nsRun(wlNS(l.workload(from)), l.tool(), "ping", l.workload(to).addr)
	return err
}

// tcp connects from one workload to another's server, to its IPv6 address with ipv6.
func (l *lab) tcp(from, to string, ipv6 bool) error {
	addr := l.workload(to).addr
	if ipv6 {
		addr = l.workload(to).addr6
	}
	_, err := l.nsRun(wlNS(l.workload(from)), l.tool(), "tcp-check", net.JoinHostPort(addr, "8080"))
	return err
}

func (l *lab) cleanup() {
	// Last started, first stopped: the agents before etcd, so that each revokes its status
	// lease and goes at once instead of waiting on an etcd that is gone. After a signal they
	// have all been sent SIGTERM at once (by the lab's context, or the terminal), and some
	// may be gone already: stop only waits, procGrace at most.
	for _, p := range slices.Backward(l.procs) {
		_ = p.stop()
	}
	teardown()
	if l.bpffs {
		// The agents are gone; the pins (maps, program links) go with the mount.
		_ = unix.Unmount(filepath.Join(l.dir, "bpf"), unix.MNT_DETACH)
		_ = unix.Unmount(filepath.Join(l.dir, "cgroup"), unix.MNT_DETACH)
		l.bpffs = false
	}
	if l.dir != "" {
		os.RemoveAll(l.dir)
	}
}

func main() {
	if len(os.Args) >= 2 {
		tools := map[string]func([]string) error{
			"etcd": toolEtcd, "tcp-serve": toolTCPServe, "tcp-check": toolTCPCheck, "stream": toolStream,
			"ping": toolPing, "send-udp": toolSendUDP, "sniff": toolSniff,
			"tcp-whoami": toolTCPWhoami, "tcp-ask": toolTCPAsk, "tcp-ask-mapped": toolTCPAskMapped, "nft-table": toolNftTable, "tcp-idle": toolTCPIdle, "tcp-loop": toolTCPLoop, "http-get": toolHTTPGet, "tcp-reuse": toolTCPReuse, "udp-who": toolUDPWho, "udp-resolver": toolUDPResolver, "tcp-bulk": toolTCPBulk, "tcp-ask-opts": toolTCPAskOpts, "udp-echo": toolUDPEcho, "udp-big": toolUDPBig, "nft-drop-invalid": toolNftDropInvalid, "syn-flood": toolSynFlood, "hooks": toolHooks, "bond-state": toolBondState, "plant-leftovers": toolPlantLeftovers,
			"lab-churn": toolLabChurn, "tcp-slow": toolTCPSlow, "tcp-slow-ask": toolTCPSlowAsk, "tcp-slow-client": toolTCPSlowClient,
			"etcd-put": toolEtcdPut, "etcd-compact": toolEtcdCompact, "etcd-load-fleet": toolEtcdLoadFleet, "etcd-churn": toolEtcdChurn, "bpf-damage": toolBPFDamage,
			"tor":   toolTOR,   // the lab's top-of-rack router (tor.go)
			"smoke": toolSmoke, // the kernel matrix's scenario (smoke.go): the lab and a few checks
		}
		if t, ok := tools[os.Args[1]]; ok {
			if err := t(os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "sluice-lab %s: %v\n", os.Args[1], err)
				if sig := (interrupted{}); errors.As(err, &sig) { // smoke's
					sig.exit()
				}
				os.Exit(1)
			}
			return
		}
	}
	fs := flag.NewFlagSet("sluice-lab", flag.ExitOnError)
	keep := fs.Bool("keep", false, "keep the lab running until interrupted, and print how to look around")
	testdata := fs.String("testdata", "testdata/sample", "directory of the sample cluster's manifests")
	outage := fs.Duration("outage", 10*time.Second, "faults: how long the link to etcd stays cut after the agent noticed")
	duration := fs.Duration("duration", 10*time.Minute, "churn: how long the cluster changes")
	if len(os.Args) < 2 || (os.Args[1] != "demo" && os.Args[1] != "faults" && os.Args[1] != "churn") {
		fmt.Fprintln(os.Stderr, "usage: sluice-lab demo [--keep] [--testdata DIR]   (as root)\n       sluice-lab faults [--testdata DIR]         (as root: the fault suite)\n       sluice-lab churn [--duration 10m] [--testdata DIR]  (as root: the long run of changes under traffic)")
		os.Exit(2)
	}
	_ = fs.Parse(os.Args[2:])
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice-lab: %v\n", err)
		os.Exit(1)
	}
	l := &lab{bin: filepath.Dir(exe), testdata: *testdata, out: os.Stdout, agents: map[string]*proc{}, outage: *outage}
	ctx, stop := signalContext()
	defer stop()
	switch os.Args[1] {
	case "faults":
		err = l.faults(ctx)
	case "churn":
		err = l.churnRun(ctx, *duration)
	default:
		err = l.demo(ctx, *keep)
	}
	if sig := (interrupted{}); errors.As(err, &sig) {
		fmt.Fprintf(os.Stderr, "sluice-lab: %v: stopped after %d checks (%d failed); the lab is torn down\n", sig, l.checks, l.failures)
		sig.exit()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice-lab: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(l.out, "\n%d checks, %d failed\n", l.checks, l.failures)
	if l.failures > 0 {
		os.Exit(1)
	}
}
