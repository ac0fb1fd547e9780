package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The lab as data (issue #37). A scene is a part of a run in order: headings, servers
// started, manifests applied, commands run, and checks. Most checks have one of two shapes,
// each one table row, as kube-proxy's packet tests are a table:
//
//	probe  one of the lab's tools sent from a namespace to an address (ping, TCP, UDP, a
//	       run of connections), and what must come of it: success or failure, the address
//	       the server saw the client as, what the output holds, how soon
//	look   a node's kernel read with ip or bridge, and what it must (not) show
//
// A check that is a procedure of its own (sluiced restarted under a stream, a capture on a
// gateway) is an act: a small function, standing in the scene where it runs. The scene's
// order is the run's: state changes between checks (restarts, deletions, manifests) happen
// where their entries stand. Each check prints one PASS or FAIL line: its name, in which %s
// (or %q) stands for what the tool or command printed.

// entry is one thing a scene does.
type entry interface{ play(l *lab) error }

// scene is entries played in order until one fails; a scene is an entry itself, so a part
// made by a function (pingTCP) stands in a table as one row.
type scene []entry

// play plays every entry in order, then runs the scene's undo entries (however it ended:
// an error, or the run interrupted), last first.
func (s scene) play(l *lab) error {
	var undos []undo
	defer func() {
		for _, u := range slices.Backward(undos) {
			u.run(l)
		}
	}()
	for _, e := range s {
		if u, ok := e.(undo); ok {
			undos = append(undos, u)
			continue
		}
		if err := e.play(l); err != nil {
			return err
		}
	}
	return nil
}

// play runs a scene (l.play(demoScene)).
func (l *lab) play(s scene) error { return s.play(l) }

// heading starts a step: the "==> ..." line.
type heading string

func (h heading) play(l *lab) error {
	l.step("%s", string(h))
	return nil
}

// serve starts a server of the lab's tools for the rest of the run: run is the tool and its
// arguments ("tcp-whoami 10.65.0.65:8082"), at a workload, a node or a namespace (nsOf).
// With ready the scene goes on once it says READY, and ends if it does not within 5 s.
type serve struct {
	at    string
	run   string
	ready bool
}

func (s serve) play(l *lab) error {
	p, err := l.start(nsOf(s.at), s.run, false, append([]string{l.tool()}, strings.Fields(s.run)...)...)
	if err != nil {
		return fmt.Errorf("%s on %s: %w", s.run, s.at, err)
	}
	if s.ready && !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("%s on %s did not say READY: %q", s.run, s.at, p.matching(""))
	}
	return nil
}

// manifest is a document written to file in the lab's directory and applied with sluicectl
// (a check line of its own says whether it went in).
type manifest struct{ file, doc string }

func (m manifest) play(l *lab) error { return l.apply(m.file, m.doc) }

// ctl is a sluicectl command (its words), run in the router's namespace: a check line of its
// own says whether it succeeded.
type ctl string

func (c ctl) play(l *lab) error {
	l.mustCtl(strings.Fields(string(c))...)
	return nil
}

// commands are command lines run in order, the scene ending at the first that fails;
// "sluice-lab" in one stands for the lab's own tool.
type commands []string

func (c commands) play(l *lab) error {
	for _, line := range c {
		l.halt()
		if _, err := sh(l.words(line)...); err != nil {
			return err
		}
	}
	return nil
}

// undo is command lines run, in order, when the scene they stand in ends however it ends
// (what a defer does in a function); their failures are ignored. It takes effect where it
// stands: if the scene ends before, it is not run.
type undo []string

func (u undo) run(l *lab) {
	for _, line := range u {
		_, _ = sh(l.words(line)...)
	}
}

func (u undo) play(*lab) error { return errors.New("an undo entry stands only in a scene") }

// words splits a command line, "sluice-lab" standing for the lab's own tool.
func (l *lab) words(line string) []string {
	w := strings.Fields(line)
	for i := range w {
		if w[i] == "sluice-lab" {
			w[i] = l.tool()
		}
	}
	return w
}

// act is a procedure of its own in a scene, making its own checks: the one-off (a restart
// under a stream, a capture), or a part of the run that is a function (seed000).
type act func(l *lab) error

func (a act) play(l *lab) error { return a(l) }

// probe is a check made with one of the lab's tools: send (the tool and its arguments but
// the address: "tcp-ask 50", 50 connections) from a workload, node or namespace (nsOf) to an
// address, and what must come of it. The tool must succeed (fails: must fail); its output
// must hold each of want and, with seenAs, tcp-ask's count of answers naming seenAs: the
// address the server saw the client as ("answer 192.168.40.100 50"). With retry it is sent
// again until that holds, up to retry; with within it must be over within that. name is the
// check's line: %s stands for the tool's output on one line; with within, %v for how long it
// took comes first.
type probe struct {
	name   string
	from   string
	send   string
	to     string
	seenAs string
	want   []string
	fails  bool
	retry  time.Duration
	within time.Duration
}

func (p probe) play(l *lab) error {
	ok, line := p.run(l)
	l.check(ok, "%s", line)
	return nil
}

// run sends the probe (again until it passes, with retry) and says whether it passed, and
// its check line.
func (p probe) run(l *lab) (bool, string) {
	send := strings.Fields(p.send)
	args := append([]string{l.tool(), send[0], p.to}, send[1:]...)
	want := slices.Clone(p.want)
	if p.seenAs != "" {
		want = append(want, "answer "+p.seenAs+" "+send[len(send)-1])
	}
	var out string
	var took time.Duration
	attempt := func() error {
		start := time.Now()
		var err error
		out, err = l.nsRun(nsOf(p.from), args...)
		took = time.Since(start)
		switch {
		case p.fails && err == nil:
			return errors.New("it succeeded")
		case !p.fails && err != nil:
			return err
		case p.within > 0 && took >= p.within:
			return fmt.Errorf("it took %v", took)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("no %q in %q", w, out)
			}
		}
		return nil
	}
	var err error
	if p.retry > 0 {
		_, err = l.retry(p.retry, attempt)
	} else {
		err = attempt()
	}
	switch {
	case p.within > 0:
		return err == nil, fmt.Sprintf(p.name, took.Round(time.Millisecond), oneLine(out))
	case strings.Contains(p.name, "%"):
		return err == nil, fmt.Sprintf(p.name, oneLine(out))
	}
	return err == nil, p.name
}

// await is a probe that is no check: sent until it passes, up to its retry, before the
// checks that need what it waits for (a node port in every node's maps); how it ended is
// not reported, as the checks after it say.
type await probe

func (a await) play(l *lab) error {
	_, _ = probe(a).run(l)
	return nil
}

// look is a check of a node's kernel: cmd, an ip or bridge command ("ip -6 route show proto
// 83"), run in the node's namespace (any other command runs there through ip netns exec).
// It must succeed, and print each of has ("nhid *" standing for any nexthop object's ID) and
// none of lacks. With show, what it printed is printed too. name is the check's line: %s (or
// %q) stands for what it printed, trimmed.
type look struct {
	name  string
	node  string
	cmd   string
	has   []string
	lacks []string
	show  bool
}

func (k look) play(l *lab) error {
	cmd, ns := strings.Fields(k.cmd), nsOf(k.node)
	if cmd[0] == "ip" || cmd[0] == "bridge" {
		cmd = slices.Concat(cmd[:1], []string{"-n", ns}, cmd[1:])
	} else {
		cmd = append([]string{"ip", "netns", "exec", ns}, cmd...)
	}
	out, err := sh(cmd...)
	if k.show {
		fmt.Fprint(l.out, out)
	}
	ok := err == nil
	for _, s := range k.has {
		ok = ok && routeLine(out, s)
	}
	for _, s := range k.lacks {
		ok = ok && !strings.Contains(out, s)
	}
	line := k.name
	if strings.Contains(line, "%") {
		line = fmt.Sprintf(line, strings.TrimSpace(out))
	}
	l.check(ok, "%s", line)
	return nil
}

// routes is a look per line that cmd must print on node, each named by format with the line
// (%q); the first shows what cmd printed.
func routes(node, cmd, format string, lines ...string) scene {
	var s scene
	for i, line := range lines {
		s = append(s, look{node: node, cmd: cmd, has: []string{line}, show: i == 0, name: fmt.Sprintf(format, line)})
	}
	return s
}

// pingTCP is ping, then TCP to its server on port 8080, from one workload to another's
// address, named with how the traffic goes; each retried until it passes (10 s, 5 s).
func pingTCP(from, to, how string) scene {
	addr := workloadNamed(to).addr
	return scene{
		probe{from: from, send: "ping", to: addr, retry: 10 * time.Second, name: "ping " + from + " -> " + to + " " + how},
		probe{from: from, send: "tcp-check", to: addr + ":8080", retry: 5 * time.Second, name: "TCP " + from + " -> " + to + " " + how},
	}
}

// tcp6 is TCP to a workload's server on its IPv6 address, retried until it passes (10 s).
func tcp6(from, to string) probe {
	return probe{from: from, send: "tcp-check", to: "[" + workloadNamed(to).addr6 + "]:8080", retry: 10 * time.Second,
		name: "TCP over IPv6 " + from + " -> " + to + " through vxlan-v6.sluice"}
}

// nsOf is the namespace of the workload or node so named; any other name is a namespace's.
func nsOf(name string) string {
	for _, w := range labWorkloads {
		if w.name == name {
			return wlNS(w)
		}
	}
	for _, n := range labNodes {
		if n.name == name {
			return n.ns
		}
	}
	return name
}

// workloadNamed is the lab's workload so named.
func workloadNamed(name string) labWorkload {
	for _, w := range labWorkloads {
		if w.name == name {
			return w
		}
	}
	panic("no workload " + name)
}
