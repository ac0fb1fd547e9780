// Command sluice-lab runs sluice's main job on one machine: it starts an embedded etcd, loads a
// sample cluster with sluicectl exactly as an operator would, runs sluiced against it, and shows
// and checks what sluice read. Each check prints one PASS or FAIL line; the exit code is the
// number of failures (at most 1). The three-node network-namespace lab grows from here.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-net/sluice/store/etcdtest"
)

type lab struct {
	bin      string // directory holding sluicectl and sluiced
	testdata string
	endpoint string
	out      io.Writer
	failures int
}

func (l *lab) step(format string, args ...any) {
	fmt.Fprintf(l.out, "\n==> %s\n", fmt.Sprintf(format, args...))
}

func (l *lab) check(ok bool, format string, args ...any) {
	verdict := "PASS"
	if !ok {
		verdict = "FAIL"
		l.failures++
	}
	fmt.Fprintf(l.out, "%s: %s\n", verdict, fmt.Sprintf(format, args...))
}

// ctl runs sluicectl, echoing the command line and its output; it returns the output.
func (l *lab) ctl(args ...string) (string, error) {
	fmt.Fprintf(l.out, "$ sluicectl %s\n", strings.Join(args, " "))
	cmd := exec.Command(filepath.Join(l.bin, "sluicectl"), args...)
	cmd.Env = append(os.Environ(), "SLUICE_ETCD_ENDPOINTS="+l.endpoint)
	out, err := cmd.CombinedOutput()
	l.out.Write(out)
	return string(out), err
}

func (l *lab) mustCtl(args ...string) string {
	out, err := l.ctl(args...)
	l.check(err == nil, "sluicectl %s", args[0]+" "+strings.Join(args[1:min(len(args), 3)], " "))
	return out
}

// agent is a running sluiced whose log lines are echoed and kept.
type agent struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func (l *lab) startAgent(node string) (*agent, error) {
	cmd := exec.Command(filepath.Join(l.bin, "sluiced"), "--node-name", node, "--log-format", "console", "--log-level", "debug", "--dataplane=false")
	cmd.Env = append(os.Environ(), "SLUICE_ETCD_ENDPOINTS="+l.endpoint, "NO_COLOR=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	a := &agent{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintf(l.out, "  [sluiced %s] %s\n", node, sc.Text())
			a.mu.Lock()
			a.lines = append(a.lines, sc.Text())
			a.mu.Unlock()
		}
	}()
	return a, nil
}

// count returns how many log lines contain every part.
func (a *agent) count(parts ...string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, line := range a.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// waitFor waits until n log lines contain every part, or the timeout passes.
func (a *agent) waitForN(timeout time.Duration, n int, parts ...string) bool {
	deadline := time.Now().Add(timeout)
	for a.count(parts...) < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func (a *agent) waitFor(timeout time.Duration, parts ...string) bool {
	return a.waitForN(timeout, 1, parts...)
}

func (a *agent) stop() error {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	<-a.done
	return a.cmd.Wait()
}

func (l *lab) demo(ctx context.Context, keep bool) error {
	l.step("starting an embedded etcd on loopback")
	srv, err := etcdtest.Start(etcdtest.Options{})
	if err != nil {
		return err
	}
	defer srv.Close()
	l.endpoint = srv.Endpoint()
	fmt.Fprintf(l.out, "etcd at %s\n", l.endpoint)

	l.step("loading the sample cluster from %s with sluicectl", l.testdata)
	l.mustCtl("apply", "-f", l.testdata)
	l.step("claiming one block per node per pool and assigning addresses, as calico-ipam does")
	for i, node := range []string{"node-a", "node-b", "node-c"} {
		l.mustCtl("ipam", "claim", "--node", node, "--pool", "pool-vxlan", "--cidr", fmt.Sprintf("10.65.0.%d/26", 64*i))
		l.mustCtl("ipam", "assign", "--node", node, "--handle", "vxlan-tunnel-addr-"+node, "--ip", fmt.Sprintf("10.65.0.%d", 64*i))
		l.mustCtl("ipam", "assign", "--node", node, "--handle", "k8s-pod-network.web-"+node[5:], "--ip", fmt.Sprintf("10.65.0.%d", 64*i+1))
	}
	for i, node := range []string{"node-a", "node-b"} {
		l.mustCtl("ipam", "claim", "--node", node, "--pool", "pool-cross", "--cidr", fmt.Sprintf("10.66.0.%d/26", 64*i))
		l.mustCtl("ipam", "assign", "--node", node, "--handle", "k8s-pod-network.db-"+node[5:], "--ip", fmt.Sprintf("10.66.0.%d", 64*i+1))
	}
	l.mustCtl("ipam", "show")

	l.step("what the datastore holds")
	for _, kind := range []string{"ippools", "nodes", "blocks", "blockaffinities", "workloadendpoints", "services", "endpointslices"} {
		l.mustCtl("get", kind)
	}

	l.step("starting sluiced for node-a")
	a, err := l.startAgent("node-a")
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = a.stop()
		}
	}()
	l.check(a.waitFor(10*time.Second, "in sync with etcd", `"ippools":2`, `"nodes":3`, `"blocks":5`, `"blockaffinities":5`, `"workloadendpoints":5`, `"services":1`, `"endpointslices":1`),
		"sluiced is in sync and holds 2 pools, 3 nodes, 5 blocks, 5 affinities, 5 endpoints, 1 service, 1 slice")

	l.check(a.waitFor(10*time.Second, "desired state computed", "vteps=3", "routes=7"),
		"sluiced computes node-a's desired dataplane: 3 VTEPs and 7 routes (2 blackholed local blocks, 2 local workloads, 3 remote blocks)")
	plan := l.mustCtl("plan", "--node", "node-a")
	l.check(strings.Contains(plan, "10.65.0.0/26    blackhole") && strings.Contains(plan, "10.66.0.64/26   unicast    192.168.10.12  @parent"),
		"sluicectl plan shows node-a's blackhole and its direct CrossSubnet route to node-b")

	l.step("a change arrives through the watch; a bad value is reported with its key and field, and skipped")
	f, err := os.CreateTemp("", "sluice-lab-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	fmt.Fprint(f, "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-extra}\nspec: {cidr: 10.67.0.0/16, vxlanMode: Always}\n")
	f.Close()
	l.mustCtl("apply", "-f", f.Name())
	_, err = l.ctl("apply", "-f", "-")
	l.check(err != nil, "sluicectl refuses an empty document stream")
	cli, err := srv.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	fmt.Fprintln(l.out, "$ (another writer puts an IP pool with a broken CIDR straight into etcd)")
	if _, err := cli.Put(ctx, "/calico/resources/v3/projectcalico.org/ippools/pool-broken", `{"kind":"IPPool","metadata":{"name":"pool-broken"},"spec":{"cidr":"10.300.0.0/16"}}`); err != nil {
		return err
	}
	l.check(a.waitFor(10*time.Second, "skipping invalid value", "pool-broken", "spec.cidr"), "sluiced reports the broken pool with its key and field and keeps running")
	l.check(a.waitFor(10*time.Second, "event=upsert", "ippools/pool-extra"), "sluiced sees the new pool through its watch")
	l.mustCtl("delete", "ippools", "pool-extra")
	l.check(a.waitFor(10*time.Second, "event=delete", "ippools/pool-extra"), "sluiced sees the pool deleted")

	l.step("sluiced follows etcd through a restart of etcd")
	srv.Stop()
	time.Sleep(500 * time.Millisecond)
	if err := srv.Restart(); err != nil {
		return err
	}
	l.mustCtl("apply", "-f", f.Name())
	l.check(a.waitForN(15*time.Second, 2, "event=upsert", "ippools/pool-extra"), "sluiced sees the pool written after etcd came back")

	if keep {
		l.step("keeping the lab running; press Ctrl-C to stop")
		fmt.Fprintf(l.out, "try: SLUICE_ETCD_ENDPOINTS=%s %s/sluicectl get workloadendpoints\n", l.endpoint, l.bin)
		<-ctx.Done()
	}
	l.step("stopping sluiced")
	stopped = true
	l.check(a.stop() == nil, "sluiced exits cleanly on SIGTERM")
	return nil
}

func main() {
	fs := flag.NewFlagSet("sluice-lab", flag.ExitOnError)
	keep := fs.Bool("keep", false, "keep the lab running until interrupted")
	testdata := fs.String("testdata", "testdata/sample", "directory of the sample cluster's manifests")
	if len(os.Args) < 2 || os.Args[1] != "demo" {
		fmt.Fprintln(os.Stderr, "usage: sluice-lab demo [--keep] [--testdata DIR]")
		os.Exit(2)
	}
	_ = fs.Parse(os.Args[2:])
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice-lab: %v\n", err)
		os.Exit(1)
	}
	l := &lab{bin: filepath.Dir(exe), testdata: *testdata, out: os.Stdout}
	ctx, stop := signalContext()
	defer stop()
	if err := l.demo(ctx, *keep); err != nil {
		fmt.Fprintf(os.Stderr, "sluice-lab: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(l.out, "\n%d checks failed\n", l.failures)
	if l.failures > 0 {
		os.Exit(1)
	}
}
