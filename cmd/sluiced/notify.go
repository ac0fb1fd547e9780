package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"
)

// notifier speaks systemd's sd_notify protocol: datagrams of "KEY=VALUE" lines to the
// socket named by NOTIFY_SOCKET. Without that variable it does nothing.
type notifier struct {
	conn *net.UnixConn
}

func newNotifier(socket string) (*notifier, error) {
	if socket == "" {
		return &notifier{}, nil
	}
	if strings.HasPrefix(socket, "@") {
		socket = "\x00" + socket[1:] // an abstract socket
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("connecting to NOTIFY_SOCKET: %w", err)
	}
	return &notifier{conn: c}, nil
}

func (n *notifier) send(lines ...string) {
	if n.conn == nil {
		return
	}
	// Best effort, never blocking the loop: a full systemd queue drops the message.
	_ = n.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = n.conn.Write([]byte(strings.Join(lines, "\n")))
}

func (n *notifier) close() {
	if n.conn != nil {
		n.conn.Close()
	}
}

// supervise tells systemd how the agent is doing: STATUS lines as it progresses, READY=1
// once the first full apply after in-sync is done (or in-sync, without a dataplane), and a
// watchdog keepalive at half the watchdog interval as long as the apply loop is alive, so a
// hung loop gets the service restarted. STOPPING=1 when ctx ends.
func supervise(ctx context.Context, n *notifier, state *agentState, watchdog time.Duration) {
	tick := 250 * time.Millisecond
	if watchdog > 0 && watchdog/2 < tick {
		tick = watchdog / 2
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	ready := false
	status := ""
	lastKeepalive := time.Time{}
	n.send("STATUS=reading etcd")
	applied := state.applied // READY=1 as soon as the first apply is done, not at the next tick
	for {
		select {
		case <-ctx.Done():
			n.send("STOPPING=1", "STATUS=stopping; the dataplane stays in place")
			return
		case <-t.C:
		case <-applied:
			applied = nil
		}
		now := ""
		rev, synced := state.syncedAt()
		switch {
		case !synced:
			now = "waiting for etcd"
			if _, why := state.readiness(); state.intake != nil && state.intake.Stats().Silent.Load() {
				now = why
			}
		case !state.started():
			now = fmt.Sprintf("in sync with etcd at revision %d; programming the kernel", rev)
		case !state.ready() && state.dp != nil:
			now = fmt.Sprintf("in sync at revision %d; retrying: %v", rev, state.dp.Stats().LastErr)
		default:
			now = fmt.Sprintf("ready: in sync at revision %d", rev)
			if !state.intake.Stats().InSync.Load() {
				now = fmt.Sprintf("ready: the state kept by the last run is etcd's at revision %d; reading etcd", rev)
			}
			if state.dp != nil {
				s := state.dp.Stats()
				now += fmt.Sprintf(", %d routes programmed", s.ProgrammedRoutes)
			}
		}
		if now != status {
			status = now
			n.send("STATUS=" + status)
		}
		if !ready && state.started() {
			ready = true
			n.send("READY=1", "STATUS="+status)
		}
		if watchdog > 0 && state.live() && time.Since(lastKeepalive) >= watchdog/2 {
			lastKeepalive = time.Now()
			n.send("WATCHDOG=1")
		}
	}
}
