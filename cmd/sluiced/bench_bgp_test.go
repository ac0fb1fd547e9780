package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sluice-net/sluice/bgp"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
)

// The BGP benchmark's namespaces, made by `make bench-bgp`: the node (where the benchmark and
// sluiced run, eth0 192.0.2.11/24), the route reflector (BIRD, 192.0.2.1) and a node running
// BIRD's own kernel protocol instead (192.0.2.12), on one bridge in the reflector's namespace.
const (
	benchRRNS   = "sl-bench-rr"
	benchBirdNS = "sl-bench-bird"
	// benchLearned is how many /26s the reflector announces: 20,000, a large fleet's blocks.
	benchLearned   = 20000
	birdRouteProto = 12
)

// benchRounds is how many times each client gets the 20,000 and loses them.
const benchRounds = 3

// nowChan is a channel that says "now" once: a session already up.
func nowChan() <-chan time.Time {
	ch := make(chan time.Time, 1)
	ch <- time.Now()
	return ch
}

// benchWait bounds each wait for 20,000 routes.
var benchWait = 3 * time.Minute

// benchPrefix is the i-th announced block: 10.64.0.0/10 cut in /26s.
func benchPrefix(i int) netip.Prefix {
	base := netip.MustParseAddr("10.64.0.0").As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(i)<<6
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), 26)
}

// bareSpeakerEnv makes this test binary the BGP benchmark's bare speaker (serveBareSpeaker).
const bareSpeakerEnv = "SLUICE_BENCH_BARE_SPEAKER"

// serveBareSpeaker runs sluice's BGP speaker alone, as sluiced's node would (AS 64512, the
// reflector at 192.0.2.1), with nothing behind it: it counts the prefixes it learned and says
// "ALL" when it holds benchLearned of them and "NONE" when they are gone, until killed. The
// benchmark's floor: what GoBGP (and the speaker's hand-over) alone take.
func serveBareSpeaker() {
	held := map[netip.Prefix]bool{}
	var mu sync.Mutex
	sp := bgp.New(bgp.Config{OnLearned: func(ls []calc.Learned) {
		mu.Lock()
		defer mu.Unlock()
		before := len(held)
		for _, l := range ls {
			if len(l.NextHops) > 0 {
				held[l.Prefix] = true
			} else {
				delete(held, l.Prefix)
			}
		}
		switch {
		case len(held) >= benchLearned && before < benchLearned:
			fmt.Println("ALL")
		case len(held) == 0 && before > 0:
			fmt.Println("NONE")
		}
	}})
	speaker := calc.BGPSpeaker{ASN: 64512, RouterID: netip.MustParseAddr("192.0.2.11"), ListenPort: 179, Addr4: netip.MustParseAddr("192.0.2.11")}
	peer := calc.BGPPeer{Addr: netip.MustParseAddr("192.0.2.1"), ASN: 64512, LocalASN: 64512, SourceAddr: netip.MustParseAddr("192.0.2.11"),
		NextHop: store.NextHopAuto, Origin: "bench"}
	sp.OnUpdate(&calc.Update{Full: true, Ops: []calc.Op{{BGPSpeaker: &speaker}, {BGPPeer: &peer}}})
	fmt.Println("READY")
	sp.Run(context.Background())
}

// rrConf is the reflector's BIRD configuration: 20,000 static /26s via itself (blocks),
// reflected over iBGP to its two clients; a one-route protocol (probe) to time one prefix.
// Both are off at start: the benchmark turns them on once a client's session is up, so what
// it times is the routes' arrival and installation, not the session's setup.
func rrConf() string {
	var b strings.Builder
	b.WriteString(`router id 192.0.2.1;
protocol device { scan time 10; }
protocol static blocks {
  disabled;
  ipv4;
`)
	for i := range benchLearned {
		fmt.Fprintf(&b, "  route %s via 192.0.2.1;\n", benchPrefix(i))
	}
	b.WriteString(`}
protocol static probe {
  disabled;
  ipv4;
  route 10.127.255.0/26 via 192.0.2.1;
}
template bgp rrc {
  local 192.0.2.1 as 64512;
  rr client;
  rr cluster id 192.0.2.1;
  graceful restart on;
  connect retry time 1;
  ipv4 { import all; export all; next hop keep; };
}
protocol bgp to_sluice from rrc { neighbor 192.0.2.11 as 64512; }
protocol bgp to_bird from rrc { neighbor 192.0.2.12 as 64512; }
`)
	return b.String()
}

// birdNodeConf is a node running BIRD's own kernel protocol, as calico/node does: iBGP to
// the reflector, what it learns into the kernel.
const birdNodeConf = `router id 192.0.2.12;
protocol device { scan time 10; }
protocol kernel { ipv4 { import none; export all; }; merge paths on; graceful restart; }
protocol bgp reflector {
  local 192.0.2.12 as 64512;
  neighbor 192.0.2.1 as 64512;
  connect retry time 1;
  graceful restart on;
  ipv4 { import all; export none; };
}
`

// birdProc runs BIRD in a namespace of the benchmark's.
func birdProc(b *testing.B, ns, dir, name, conf string) (ctl string, stop func()) {
	b.Helper()
	cfg := filepath.Join(dir, name+".conf")
	ctl = filepath.Join(dir, name+".ctl")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "bird", "-f", "-c", cfg, "-s", ctl, "-P", filepath.Join(dir, name+".pid"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) }
	b.Cleanup(stop)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if exec.Command("birdc", "-s", ctl, "show", "status").Run() == nil {
			return ctl, stop
		}
		if time.Now().After(deadline) {
			b.Fatalf("bird %s never answered: %s", name, out.String())
		}
	}
}

// established polls the reflector's protocol until its session is established, and sends
// when it saw that (every 20 ms).
func established(ctl, proto string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() {
		for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			out, _ := exec.Command("birdc", "-s", ctl, "show", "protocols", proto).CombinedOutput()
			if strings.Contains(string(out), "Established") {
				ch <- time.Now()
				return
			}
		}
		close(ch)
	}()
	return ch
}

// routeCounter counts the routes of one protocol a namespace's kernel holds, from its route
// notifications (no dumps while the agent works).
type routeCounter struct {
	mu    sync.Mutex
	have  map[netip.Prefix]bool
	seen  chan struct{}
	done  chan struct{}
	proto netlink.RouteProtocol
}

func countRoutes(b *testing.B, ns netns.NsHandle, proto netlink.RouteProtocol) *routeCounter {
	b.Helper()
	c := &routeCounter{have: map[netip.Prefix]bool{}, seen: make(chan struct{}, 1), done: make(chan struct{}), proto: proto}
	ch := make(chan netlink.RouteUpdate, 65536)
	if err := netlink.RouteSubscribeWithOptions(ch, c.done, netlink.RouteSubscribeOptions{Namespace: &ns, ReceiveBufferSize: 64 << 20}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { close(c.done) })
	go func() {
		for u := range ch {
			if u.Protocol != proto || u.Dst == nil {
				continue
			}
			p, ok := netip.AddrFromSlice(u.Dst.IP)
			if !ok {
				continue
			}
			ones, _ := u.Dst.Mask.Size()
			pfx := netip.PrefixFrom(p.Unmap(), ones)
			c.mu.Lock()
			if u.Type == 24 { // RTM_NEWROUTE
				c.have[pfx] = true
			} else {
				delete(c.have, pfx)
			}
			c.mu.Unlock()
			select {
			case c.seen <- struct{}{}:
			default:
			}
		}
	}()
	return c
}

// until waits for f to hold of the routes held, and returns when it did.
func (c *routeCounter) until(timeout time.Duration, f func(map[netip.Prefix]bool) bool) (time.Time, bool) {
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		ok := f(c.have)
		c.mu.Unlock()
		if ok {
			return time.Now(), true
		}
		select {
		case <-c.seen:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			return time.Time{}, false
		}
	}
}

func (c *routeCounter) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.have)
}

// BenchmarkBGPLearned (make bench-bgp): a route reflector (BIRD) announces 20,000 /26s to an
// established session; the time until all of them are in sluiced's (--bgp) kernel, and until
// none is once they are withdrawn, beside BIRD's own kernel protocol with the same routes from
// the same reflector on the same machine in the same run; one prefix announced at the reflector to its route in sluiced's kernel and
// withdrawn to its removal (p50 of 20); sluiced's settled memory with the 20,000 learned
// routes, beside the same agent without BGP.
func BenchmarkBGPLearned(b *testing.B) {
	if os.Getenv("SLUICE_BENCH_BGP") == "" || os.Geteuid() != 0 {
		b.Skip("needs its namespaces and BIRD: run through `make bench-bgp`")
	}
	dir := b.TempDir()
	bin := buildSluiced(b, dir)
	etcd, cli := startBenchEtcd(b)
	add, flush := benchWriter(b, cli)
	add(store.IPPoolPrefix+"routed", `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"routed"},"spec":{"cidr":"10.64.0.0/10","vxlanMode":"Never","ipipMode":"Never"}}`)
	add(store.NodePrefix+"node-00000", `{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-00000"},"spec":{"bgp":{"ipv4Address":"192.0.2.11/24"}}}`)
	add(store.BGPConfigPrefix+"default", `{"kind":"BGPConfiguration","apiVersion":"projectcalico.org/v3","metadata":{"name":"default"},"spec":{"nodeToNodeMeshEnabled":false}}`)
	add(store.BGPPeerPrefix+"rr", `{"kind":"BGPPeer","apiVersion":"projectcalico.org/v3","metadata":{"name":"rr"},"spec":{"peerIP":"192.0.2.1","asNumber":64512}}`)
	flush()

	rrCtl, _ := birdProc(b, benchRRNS, dir, "rr", rrConf())
	self, err := netns.Get()
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()

	birdc := func(args ...string) {
		if out, err := exec.Command("birdc", append([]string{"-s", rrCtl}, args...)...).CombinedOutput(); err != nil {
			b.Fatalf("birdc %v: %v %s", args, err, out)
		}
	}
	// all announces the 20,000 blocks once the client's session is up and returns how long
	// until count saw them all; none withdraws them and returns how long until it saw none.
	all := func(who string, c *routeCounter, up <-chan time.Time) time.Duration {
		if _, ok := <-up; !ok {
			b.Fatalf("%s: no session with the reflector", who)
		}
		t0 := time.Now()
		birdc("enable", "blocks")
		at, ok := c.until(benchWait, func(m map[netip.Prefix]bool) bool { return len(m) >= benchLearned })
		if !ok {
			b.Fatalf("%s: %d of %d learned routes in the kernel after %v", who, c.n(), benchLearned, benchWait)
		}
		return at.Sub(t0)
	}
	none := func(who string, c *routeCounter) time.Duration {
		t0 := time.Now()
		birdc("disable", "blocks")
		at, ok := c.until(benchWait, func(m map[netip.Prefix]bool) bool { return len(m) == 0 })
		if !ok {
			b.Fatalf("%s: %d learned routes left in the kernel after %v", who, c.n(), benchWait)
		}
		return at.Sub(t0)
	}

	// sluiced.
	mine := countRoutes(b, self, dataplane.DefaultRouteProtocol)
	agent := startAgent(b, bin, etcd.Endpoint(), "--bgp", "--state-file", "")
	var profiled sync.WaitGroup
	if path := os.Getenv("SLUICE_BENCH_CPUPROFILE"); path != "" {
		// sluiced's CPU while it learns (its health endpoint serves Go's profiles).
		profiled.Add(1)
		go func() {
			defer profiled.Done()
			time.Sleep(2 * time.Second)
			saveProfile(b, "http://127.0.0.1:9097/debug/pprof/profile?seconds=4", path)
		}()
	}
	// Three rounds each (the median is reported): BIRD's own time varies from run to run.
	rounds := func(who string, c *routeCounter, up <-chan time.Time) (in, out time.Duration) {
		var ins, outs []time.Duration
		for range benchRounds {
			ins = append(ins, all(who, c, up))
			outs = append(outs, none(who, c))
			up = nowChan()
		}
		return percentile(ins, 0.5), percentile(outs, 0.5)
	}
	sluiced, sluicedOut := rounds("sluiced", mine, established(rrCtl, "to_sluice"))
	profiled.Wait()
	agent.stop() // the others take its address and port
	_ = exec.Command("ip", "nexthop", "flush").Run()

	// BIRD's own kernel protocol, the same routes from the same reflector.
	birdNS, err := netns.GetFromName(benchBirdNS)
	if err != nil {
		b.Fatal(err)
	}
	defer birdNS.Close()
	theirs := countRoutes(b, birdNS, birdRouteProto)
	_, stopBird := birdProc(b, benchBirdNS, dir, "node", birdNodeConf)
	bird, birdOut := rounds("BIRD", theirs, established(rrCtl, "to_bird"))
	stopBird()

	// The floor: sluice's speaker alone (GoBGP and its hand-over, no calc, no kernel).
	bare, bareRSS := bareSpeaker(b, birdc, rrCtl)

	// sluiced again, with the 20,000, for the rest.
	downAt := time.Now()
	for exec.Command("sh", "-c", "birdc -s "+rrCtl+" show protocols to_sluice | grep -q Established").Run() == nil && time.Since(downAt) < benchWait {
		time.Sleep(20 * time.Millisecond) // the reflector has seen the bare speaker go
	}
	agent = startAgent(b, bin, etcd.Endpoint(), "--bgp", "--state-file", "")
	all("sluiced", mine, established(rrCtl, "to_sluice"))
	// One prefix announced at the reflector, and withdrawn: to its route in sluiced's kernel.
	probe := netip.MustParsePrefix("10.127.255.0/26")
	var adds, dels []time.Duration
	for range 20 {
		t0 := time.Now()
		if out, err := exec.Command("birdc", "-s", rrCtl, "enable", "probe").CombinedOutput(); err != nil {
			b.Fatalf("enabling the probe: %v %s", err, out)
		}
		at, ok := mine.until(10*time.Second, func(m map[netip.Prefix]bool) bool { return m[probe] })
		if !ok {
			b.Fatal("the probe's route never reached the kernel")
		}
		adds = append(adds, at.Sub(t0))
		t0 = time.Now()
		if out, err := exec.Command("birdc", "-s", rrCtl, "disable", "probe").CombinedOutput(); err != nil {
			b.Fatalf("disabling the probe: %v %s", err, out)
		}
		at, ok = mine.until(10*time.Second, func(m map[netip.Prefix]bool) bool { return !m[probe] })
		if !ok {
			b.Fatal("the probe's route was never removed")
		}
		dels = append(dels, at.Sub(t0))
	}
	// Settled: the collector's pace is back to its settled target, the bulk's reserve handed
	// back (gcpace.go), as an agent holding its routes runs.
	time.Sleep(busyQuiet + 2*time.Second)
	_, rss := memKiB(agent.cmd.Process.Pid)
	if path := os.Getenv("SLUICE_BENCH_HEAP"); path != "" {
		saveProfile(b, "http://127.0.0.1:9097/debug/pprof/heap?gc=1", path)
	}
	agent.stop()

	// The same agent without BGP, for its memory.
	// (Its routes go through one nexthop object: flushing the objects takes them along.)
	_ = exec.Command("ip", "nexthop", "flush").Run()
	plain := startAgent(b, bin, etcd.Endpoint(), "--state-file", "")
	if !plain.waitLine(time.Minute, "dataplane updated") {
		b.Fatal("sluiced without BGP never applied")
	}
	time.Sleep(2 * time.Second)
	_, rssPlain := memKiB(plain.cmd.Process.Pid)
	plain.stop()
	b.StopTimer()

	b.ReportMetric(sluiced.Seconds(), "sluiced-s")
	b.ReportMetric(bird.Seconds(), "bird-s")
	b.ReportMetric(sluiced.Seconds()/bird.Seconds(), "sluiced/bird")
	b.ReportMetric(bare.Seconds(), "speaker-alone-s")
	b.ReportMetric(float64(bareRSS)/1024, "speaker-alone-rss-MiB")
	b.ReportMetric(sluicedOut.Seconds(), "sluiced-withdraw-s")
	b.ReportMetric(birdOut.Seconds(), "bird-withdraw-s")
	b.ReportMetric(float64(percentile(adds, 0.5).Microseconds())/1000, "announce-p50-ms")
	b.ReportMetric(float64(percentile(dels, 0.5).Microseconds())/1000, "withdraw-p50-ms")
	b.ReportMetric(float64(rss)/1024, "rss-MiB")
	b.ReportMetric(float64(rssPlain)/1024, "rss-noBGP-MiB")
}

// bareSpeaker runs serveBareSpeaker in a child process, announces the 20,000 blocks to it
// once its session is up (three rounds), and returns the median time until it held them all
// and its memory holding them.
func bareSpeaker(b *testing.B, birdc func(...string), rrCtl string) (time.Duration, int) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), bareSpeakerEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	wait := func(want string) bool {
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return false
				}
				if l == want {
					return true
				}
			case <-time.After(benchWait):
				return false
			}
		}
	}
	if !wait("READY") {
		b.Fatal("the bare speaker did not start")
	}
	if _, ok := <-established(rrCtl, "to_sluice"); !ok {
		b.Fatal("the bare speaker has no session with the reflector")
	}
	var took []time.Duration
	rss := 0
	for round := range benchRounds {
		t0 := time.Now()
		birdc("enable", "blocks")
		if !wait("ALL") {
			b.Fatal("the bare speaker never held every block")
		}
		took = append(took, time.Since(t0))
		if round == 0 {
			time.Sleep(2 * time.Second)
			_, rss = memKiB(cmd.Process.Pid)
		}
		birdc("disable", "blocks")
		if !wait("NONE") {
			b.Fatal("the bare speaker never lost the blocks")
		}
	}
	return percentile(took, 0.5), rss
}
