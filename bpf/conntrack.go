package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Timeouts are how long an idle flow is kept, by state. The defaults are the kernel
// conntrack's (net.netfilter.nf_conntrack_*), so a connection lives through sluice exactly as
// long as it would through kube-proxy's iptables.
type Timeouts struct {
	TCPEstablished time.Duration // answered, not closing
	TCPSyn         time.Duration // not answered, or answered and not acknowledged by the client
	TCPFin         time.Duration // both sides sent FIN
	TCPRst         time.Duration // reset
	UDP            time.Duration // one direction only
	UDPStream      time.Duration // answered
	// Grace keeps a half-made pair (a forward entry whose reverse entry is missing) this long.
	Grace time.Duration
}

// DefaultTimeouts are the kernel's conntrack defaults, but for a handshake: 60 s, Cilium's
// and the kernel's SYN_RECV (its SYN_SENT is 120 s, Calico's 20 s); an option sets it.
var DefaultTimeouts = Timeouts{TCPEstablished: 432000 * time.Second, TCPSyn: 60 * time.Second, TCPFin: 120 * time.Second,
	TCPRst: 10 * time.Second, UDP: 30 * time.Second, UDPStream: 120 * time.Second, Grace: 10 * time.Second}

// Idle returns the timeout of an entry in its state.
func (t Timeouts) Idle(proto uint8, tcp uint8) time.Duration {
	switch {
	case proto != ProtoTCP:
		if tcp&TCPReplied != 0 {
			return t.UDPStream
		}
		return t.UDP
	case tcp&TCPRst != 0:
		return t.TCPRst
	case tcp&TCPFinFwd != 0 && tcp&TCPFinRev != 0:
		return t.TCPFin
	case tcp&TCPReplied != 0 && tcp&TCPOpening == 0:
		return t.TCPEstablished
	default:
		return t.TCPSyn
	}
}

// Monotonic returns CLOCK_MONOTONIC in nanoseconds, the clock of bpf_ktime_get_ns.
func Monotonic() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// CleanStats says what one cleanup pass did.
type CleanStats struct {
	Entries  int            // entries seen
	ByType   map[string]int // entries by kind: forward, reverse, tunnel
	Expired  int            // judged expired
	Deleted  int            // deleted by the cleaner
	Kept     int            // refreshed between judgement and deletion: kept
	Forwards int            // live flows forwarded to or from another node
	Stale    int            // flows to endpoints no longer in their service, queued for deletion
	Early    int            // unestablished flows idle past PressureIdle, judged expired because the table was nearly full
}

// Under pressure: when a cleanup finds the table at least PressureShare full, a flow that is
// not established (TCP handshake not done, UDP not answered) and idle longer than
// PressureIdle is expired, as the kernel conntrack's early drop makes room. The young-flow
// ring evicts TCP handshakes as they come; this is what clears a UDP flood (a datagram a
// source), and what a TCP flood left behind the ring, within a cleanup interval. A one-way
// UDP stream that sends more often than PressureIdle keeps its flow.
const (
	PressureShare = 0.9
	PressureIdle  = time.Second
)

// established says whether a reverse or tunnel entry's flow is past its handshake (as the
// programs' established()).
func established(proto, tcp uint8) bool {
	if proto != ProtoTCP {
		return tcp&TCPReplied != 0
	}
	return tcp&TCPReplied != 0 && tcp&TCPOpening == 0
}

// Conntrack expires idle flows. Expiry is judged on the reverse or tunnel entry, which every
// packet of both directions refreshes; a forward entry goes with its pair. Deletion is done
// by the sl_ct_clean program, which deletes an entry only if its last_seen is still what was
// judged: a packet that refreshes a flow while it is being judged keeps it (never a race with
// live traffic, as Felix's BPF cleaner).
//
// Hazard: before Linux 5.14 there are no syscall programs and Cleaner is nil; user space then
// reads each judged entry again and deletes it when its last_seen has not moved. A packet
// that lands between that read and the delete (microseconds, on a flow idle for its whole
// timeout) loses its flow, as with Calico's user-space cleaner; the next packet of a TCP
// flow that is not a SYN is then passed on untranslated.
type Conntrack struct {
	CT       *ebpf.Map
	Queue    *ebpf.Map
	Cleaner  *ebpf.Program
	Timeouts Timeouts
	// Live, when set, says whether an endpoint is still named by its service's slices;
	// flows to one that is not are stale and go at the next cleanup, whatever their state
	// (as kube-proxy clears conntrack for removed endpoints): the client gets a reset from
	// a new backend instead of hanging on one that is gone.
	Live func(addr netip.Addr, port uint16) bool
}

// NewConntrack returns the cleaner of objs' table.
func NewConntrack(o *Objects, t Timeouts) *Conntrack {
	return &Conntrack{CT: o.SlCtV4, Queue: o.SlCtCleanq, Cleaner: o.SlCtClean, Timeouts: t}
}

// PairKey returns the key of the other entry of a NAT pair: a reverse entry's forward entry
// and the other way round. A hairpin pair (NatSaddr set) has the client's own address in the
// forward entry's key and the hairpin address in the reverse entry's.
func PairKey(k ConntrackKey, v ConntrackValue) ConntrackKey {
	switch v.Type {
	case ConntrackRev:
		client := k.Dst
		if v.NatSaddr != 0 {
			client = v.NatSaddr
		}
		return ConntrackKey{Src: client, Dst: v.NatAddr, Sport: v.NatSport, Dport: v.NatPort, Proto: k.Proto}
	case ConntrackFwd:
		client := k.Src
		if v.NatSaddr != 0 {
			client = v.NatSaddr
		}
		return ConntrackKey{Src: v.NatAddr, Dst: client, Sport: v.NatPort, Dport: v.NatSport, Proto: k.Proto}
	}
	return ConntrackKey{}
}

// Clean runs one pass at now (CLOCK_MONOTONIC ns).
func (c *Conntrack) Clean(now uint64) (CleanStats, error) {
	st := CleanStats{ByType: map[string]int{}}
	all := map[ConntrackKey]ConntrackValue{}
	if err := walk(c.CT, func(k ConntrackKey, v ConntrackValue) { all[k] = v }); err != nil {
		return st, fmt.Errorf("reading the connection table: %w", err)
	}
	st.Entries = len(all)
	pressure := c.CT.MaxEntries() > 0 && float64(len(all)) >= PressureShare*float64(c.CT.MaxEntries())
	var q sluiceCtCleanCtxV4
	flush := func() error {
		if q.N == 0 {
			return nil
		}
		if c.Cleaner == nil {
			c.cleanFromUserSpace(&q, &st)
			q = sluiceCtCleanCtxV4{}
			return nil
		}
		if err := c.Queue.Put(uint32(0), &q); err != nil {
			return fmt.Errorf("queueing cleanup: %w", err)
		}
		if _, err := c.Cleaner.Run(&ebpf.RunOptions{}); err != nil {
			return fmt.Errorf("running the cleaner: %w", err)
		}
		var res sluiceCtCleanCtxV4
		if err := c.Queue.Lookup(uint32(0), &res); err != nil {
			return fmt.Errorf("reading cleanup results: %w", err)
		}
		st.Deleted += int(res.Deleted)
		st.Kept += int(res.Kept)
		q = sluiceCtCleanCtxV4{}
		return nil
	}
	queue := func(k, pair ConntrackKey, seen uint64) error {
		st.Expired++
		q.Req[q.N].Key = k
		q.Req[q.N].Pair = pair
		q.Req[q.N].Seen = seen
		q.N++
		if int(q.N) == len(q.Req) {
			return flush()
		}
		return nil
	}
	for k, v := range all {
		switch v.Type {
		case ConntrackFwd:
			st.ByType["forward"]++
			if _, ok := all[PairKey(k, v)]; !ok && now > v.Created && time.Duration(now-v.Created) > c.Timeouts.Grace {
				if err := queue(k, ConntrackKey{}, v.LastSeen); err != nil {
					return st, err
				}
			}
		case ConntrackRev, ConntrackTun:
			if v.Type == ConntrackRev {
				st.ByType["reverse"]++
			} else {
				st.ByType["tunnel"]++
			}
			if v.Flags&ConntrackRemote != 0 || v.Type == ConntrackTun {
				st.Forwards++
			}
			if c.stale(k, v) {
				// Deleted at once below, not through the last-seen check: traffic to an
				// endpoint that is gone keeps refreshing its flow.
				st.Stale++
				continue
			}
			idle := c.Timeouts.Idle(k.Proto, v.Tcp)
			early := pressure && !established(k.Proto, v.Tcp) && idle > PressureIdle
			if early {
				idle = PressureIdle
			}
			if now <= v.LastSeen || time.Duration(now-v.LastSeen) <= idle {
				continue
			}
			if early {
				st.Early++
			}
			pair := ConntrackKey{}
			if v.Type == ConntrackRev {
				pair = PairKey(k, v)
			}
			if err := queue(k, pair, v.LastSeen); err != nil {
				return st, err
			}
		}
	}
	if err := flush(); err != nil {
		return st, err
	}
	if c.Live != nil {
		n, err := c.deleteStale(all)
		st.Deleted += n
		return st, err
	}
	return st, nil
}

// stale says whether the entry's flow goes to an endpoint its service no longer names: the
// backend is the source of a reverse or tunnel entry's key and the destination a forward
// entry translates to.
func (c *Conntrack) stale(k ConntrackKey, v ConntrackValue) bool {
	if c.Live == nil {
		return false
	}
	switch v.Type {
	case ConntrackRev, ConntrackTun:
		return !c.Live(HostAddr(k.Src), HostPort(k.Sport))
	case ConntrackFwd:
		return !c.Live(HostAddr(v.NatAddr), HostPort(v.NatPort))
	}
	return false
}

// deleteStale deletes every entry of all whose flow goes to an endpoint that is gone, with
// its pair, whatever its state and however busy: as kube-proxy deletes a removed UDP
// endpoint's conntrack entries at the sync that removes it, the client's next packet meets a
// live backend (a DNS resolver sending from one port would otherwise keep reaching the
// removed one until the flow idles out). It returns how many entries went.
func (c *Conntrack) deleteStale(all map[ConntrackKey]ConntrackValue) (int, error) {
	n := 0
	var errs []error
	for k, v := range all {
		if !c.stale(k, v) {
			continue
		}
		for _, key := range []ConntrackKey{k, PairKey(k, v)} {
			if key.Proto == 0 {
				continue
			}
			err := c.CT.Delete(&key)
			switch {
			case err == nil:
				n++
			case !errors.Is(err, ebpf.ErrKeyNotExist):
				errs = append(errs, fmt.Errorf("deleting the flow %v to a removed endpoint: %w", key, err))
			}
		}
	}
	return n, errors.Join(errs...)
}

// SweepStale deletes the flows to endpoints that are gone, at once: the stage calls it at the
// apply that removed an endpoint from its service.
func (c *Conntrack) SweepStale() (int, error) {
	if c.Live == nil {
		return 0, nil
	}
	all := map[ConntrackKey]ConntrackValue{}
	if err := walk(c.CT, func(k ConntrackKey, v ConntrackValue) {
		if c.stale(k, v) {
			all[k] = v
		}
	}); err != nil {
		return 0, fmt.Errorf("reading the connection table: %w", err)
	}
	return c.deleteStale(all)
}

// cleanFromUserSpace does what sl_ct_clean does, from user space (kernels before 5.14).
func (c *Conntrack) cleanFromUserSpace(q *sluiceCtCleanCtxV4, st *CleanStats) {
	for i := range q.N {
		r := q.Req[i]
		var v ConntrackValue
		if err := c.CT.Lookup(&r.Key, &v); err != nil {
			continue
		}
		if v.LastSeen != r.Seen {
			st.Kept++
			continue
		}
		if err := c.CT.Delete(&r.Key); err == nil {
			st.Deleted++
		}
		if r.Pair.Proto != 0 {
			_ = c.CT.Delete(&r.Pair)
		}
	}
}

// Counters sums the per-CPU drop and event counters by name.
func Counters(o *Objects) (map[string]uint64, error) { return sumCounters(o.SlCounters) }
