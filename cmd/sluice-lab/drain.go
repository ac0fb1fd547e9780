package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// seedDrain is a TCP service, cluster IP 10.96.0.27:80 and node port 30099, whose one
// endpoint is web-b's tcp-slow on 10.65.0.65:8085 (node-b), or none.
func seedDrain(withEndpoint bool) string {
	eps := "endpoints: []"
	if withEndpoint {
		eps = "endpoints:\n- addresses: [10.65.0.65]\n  conditions: {ready: true}\n  nodeName: node-b"
	}
	return `apiVersion: v1
kind: Service
metadata: {name: drain, namespace: seed}
spec:
  type: NodePort
  clusterIPs: [10.96.0.27]
  ports:
  - {name: slow, protocol: TCP, port: 80, targetPort: 8085, nodePort: 30099}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: drain-1
  namespace: seed
  labels: {kubernetes.io/service-name: drain}
addressType: IPv4
` + eps + `
ports:
- {name: slow, protocol: TCP, port: 8085}
`
}

// endpointRemoved: what a connection to an endpoint does when the endpoint leaves its
// service, and when its pod is then deleted (#36), with real traffic to web-b on node-b: from
// outside through node-a's node port, and from web-a on node-a through the cluster IP. A
// client that asked and waits for the answer gets it after the endpoint left (its connection
// keeps the endpoint, as through kube-proxy), and can ask again; new connections find no
// endpoint. Once web-b's workload is deleted, the connection's entries go, and web-a's next
// request is answered at once with a reset (through the node port, the reset the node's own
// stack sends leaves by node-a's default route, which the seed-000 steps moved to its second
// NIC: that client is not checked).
func (l *lab) endpointRemoved() error {
	l.step("an endpoint removed while clients wait for its answer; then its pod deleted")
	front := nodeIPs["node-a"] + ":30099"
	if p, err := l.start(wlNS(l.workload("web-b")), "slow web-b", false, l.tool(), "tcp-slow", "10.65.0.65:8085"); err != nil || !p.waitFor(5*time.Second, "READY") {
		return fmt.Errorf("tcp-slow on web-b: %v", err)
	}
	if err := l.apply("seed-drain.yaml", seedDrain(true)); err != nil {
		return err
	}
	_, err := l.retry(5*time.Second, func() error { _, err := l.nsRun(nsExt, l.tool(), "tcp-slow-ask", front, "0"); return err })
	if !l.check(err == nil, "the drain service answers through node-a's node port %s: %v", front, err) {
		return nil
	}
	clients := map[string]*proc{}
	for name, c := range map[string]struct{ ns, addr string }{
		"outside, node port": {nsExt, front},
		"web-a, cluster IP":  {wlNS(l.workload("web-a")), "10.96.0.27:80"},
	} {
		p, err := l.start(c.ns, "slow client "+name, false, l.tool(), "tcp-slow-client", c.addr)
		if err != nil {
			return err
		}
		defer func() { _ = p.stop() }()
		clients[name] = p
	}
	ask := func(ms int) {
		for _, p := range clients {
			_, _ = fmt.Fprintf(p.stdin, "%d\n", ms)
		}
	}
	ask(0)
	for name, p := range clients {
		l.check(p.waitFor(5*time.Second, "answer 1 "), "%s: the connection is answered: %s", name, p.transcript())
	}
	ask(2000)
	l.sleep(300 * time.Millisecond)
	if err := l.apply("seed-drain.yaml", seedDrain(false)); err != nil {
		return err
	}
	for name, p := range clients {
		l.check(p.waitFor(10*time.Second, "answer 2 "), "%s: web-b left the service while it held the second request; its answer, 2 s later, reaches the client (the connection keeps its endpoint): %s", name, p.transcript())
	}
	ask(0)
	for name, p := range clients {
		l.check(p.waitFor(5*time.Second, "answer 3 "), "%s: the connection goes on, a third request answered: %s", name, p.transcript())
	}
	out, err := l.nsRun(nsExt, l.tool(), "tcp-slow-ask", front, "0")
	l.check(err != nil, "a new connection to the node port finds no endpoint: %s %v", oneLine(out), err)

	// web-b's pod deleted: its workload endpoints go (every one holding its address: the
	// floating-IP step left a second), its interface stays in the lab, but no node routes to
	// it any more, and the cleaner (every 2 s in the lab) ends the connection.
	weps, err := l.ctl("get", "workloadendpoints")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(weps, "\n") {
		if f := strings.Fields(line); len(f) >= 5 && strings.Contains(f[4], "10.65.0.65/32") {
			if _, err := l.ctl("delete", "workloadendpoint", f[1], "-n", f[0]); err != nil {
				return err
			}
		}
	}
	defer func() {
		// web-b back for the steps after this one, as the files that made it say.
		for _, f := range []string{filepath.Join(l.testdata, "03-workloads.yaml"), filepath.Join(l.dir, "fip-web-b-gone.yaml")} {
			if _, err := os.Stat(f); err == nil {
				_, _ = l.ctl("apply", "-f", f)
			}
		}
		_, _ = l.retry(5*time.Second, func() error { return l.tcp("web-a", "web-b", false) })
	}()
	l.sleep(3 * time.Second)
	web := clients["web-a, cluster IP"]
	start := time.Now()
	_, _ = fmt.Fprintf(web.stdin, "0\n")
	reset := web.waitFor(5*time.Second, "reset 4 ")
	took := time.Since(start)
	l.check(reset && took < time.Second, "once web-b's pod is deleted, web-a's next request on its connection is answered with a reset (%v), not left to hang: %s", took.Round(time.Millisecond), web.transcript())
	return nil
}

// toolTCPSlow answers each line "MS" of each TCP connection on addr with "done MS", MS
// milliseconds after it came, until killed.
func toolTCPSlow(args []string) error {
	return serveTCP(args, "usage: tcp-slow IP:PORT", func(c net.Conn) {
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				ms, _ := strconv.Atoi(strings.TrimSpace(line))
				time.Sleep(time.Duration(ms) * time.Millisecond)
				if _, err := fmt.Fprintf(c, "done %d\n", ms); err != nil {
					return
				}
			}
		}()
	})
}

// toolTCPSlowAsk makes one connection to a tcp-slow and asks it once to wait MS.
func toolTCPSlowAsk(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: tcp-slow-ask IP:PORT MS")
	}
	c, err := net.DialTimeout("tcp", args[0], 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\n", args[1]); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	fmt.Print(line)
	return nil
}

// toolTCPSlowClient keeps one connection to a tcp-slow, and for each line MS of its input asks
// it to wait MS, printing "answer N after D" for the Nth request answered, "reset N after D"
// when the connection was reset or refused (an ICMP error ends it as a reset does), or "error N after D: ..." (10 s without an answer, say).
func toolTCPSlowClient(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: tcp-slow-client IP:PORT")
	}
	c, err := net.DialTimeout("tcp", args[0], 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("READY")
	r := bufio.NewReader(c)
	in := bufio.NewScanner(os.Stdin)
	for n := 1; in.Scan(); n++ {
		start := time.Now()
		_ = c.SetDeadline(start.Add(10 * time.Second))
		_, err := fmt.Fprintf(c, "%s\n", strings.TrimSpace(in.Text()))
		if err == nil {
			_, err = r.ReadString('\n')
		}
		took := time.Since(start).Round(time.Millisecond)
		switch {
		case err == nil:
			fmt.Printf("answer %d after %v\n", n, took)
		case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED):
			fmt.Printf("reset %d after %v\n", n, took)
		default:
			fmt.Printf("error %d after %v: %v\n", n, took, err)
		}
	}
	return nil
}
