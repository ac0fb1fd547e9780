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
	// CT6, Queue6 and Cleaner6 are the IPv6 table's, cleaned by the same rules.
	CT6      *ebpf.Map
	Queue6   *ebpf.Map
	Cleaner6 *ebpf.Program
	// Live, when set, says whether an endpoint is still named by its service's slices. Flows
	// to one that is not are stale (stale): UDP flows and TCP handshakes at once, so the
	// client's next datagram or SYN meets a live endpoint; an established TCP connection
	// keeps its endpoint until it ends or idles out (as the kernel conntrack keeps
	// kube-proxy's translation), unless Vacant says the endpoint's address is certainly not
	// answering.
	Live func(addr netip.Addr, port uint16) bool
	// Vacant, when set, says whether an address is certainly not answering: an address of
	// the pools that no workload holds (its pod was deleted). Such a connection's entries go,
	// and its next segment, from either side, meets a reset instead of an address that
	// drops it.
	Vacant func(addr netip.Addr) bool
}

// NewConntrack returns the cleaner of objs' tables.
func NewConntrack(o *Objects, t Timeouts) *Conntrack {
	return &Conntrack{CT: o.SlCtV4, Queue: o.SlCtCleanq, Cleaner: o.SlCtClean, Timeouts: t,
		CT6: o.SlCtV6, Queue6: o.SlCtCleanq6, Cleaner6: o.SlCtClean6}
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

// PairKey6 is PairKey for the IPv6 table.
func PairKey6(k ConntrackKey6, v ConntrackValue6) ConntrackKey6 {
	switch v.Type {
	case ConntrackRev:
		client := k.Dst
		if v.NatSaddr != (Addr6{}) {
			client = v.NatSaddr
		}
		return ConntrackKey6{Src: client, Dst: v.NatAddr, Sport: v.NatSport, Dport: v.NatPort, Proto: k.Proto}
	case ConntrackFwd:
		client := k.Src
		if v.NatSaddr != (Addr6{}) {
			client = v.NatSaddr
		}
		return ConntrackKey6{Src: v.NatAddr, Dst: client, Sport: v.NatPort, Dport: v.NatSport, Proto: k.Proto}
	}
	return ConntrackKey6{}
}

// ctEntry is what the cleaner judges of an entry of either family.
type ctEntry struct {
	typ, flags, tcp, proto uint8
	created, lastSeen      uint64
	// endpoint is the backend the flow goes to: the source of a reverse or tunnel entry's
	// key, the destination a forward entry translates to.
	endpoint netip.AddrPort
}

// ctTable is one family's connection table with its cleaner: the entry types and how to
// read them, and the clean queue's (c/sluice.h's ct_clean_ctx_v4 or _v6).
type ctTable[K comparable, V any, Q any] struct {
	name    string
	ct      *ebpf.Map
	queue   *ebpf.Map
	cleaner *ebpf.Program
	entry   func(K, V) ctEntry
	pair    func(K, V) K
	// add queues a request, saying whether the queue is full; result reads a run's counts.
	add    func(q *Q, k, pair K, seen uint64) bool
	reqs   func(q *Q) []ctReq[K]
	result func(q *Q) (deleted, kept int)
}

type ctReq[K any] struct {
	key, pair K
	seen      uint64
}

func (c *Conntrack) table4() ctTable[ConntrackKey, ConntrackValue, sluiceCtCleanCtxV4] {
	return ctTable[ConntrackKey, ConntrackValue, sluiceCtCleanCtxV4]{name: "connection table", ct: c.CT, queue: c.Queue, cleaner: c.Cleaner,
		entry: func(k ConntrackKey, v ConntrackValue) ctEntry {
			e := ctEntry{typ: v.Type, flags: v.Flags, tcp: v.Tcp, proto: k.Proto, created: v.Created, lastSeen: v.LastSeen}
			if v.Type == ConntrackFwd {
				e.endpoint = netip.AddrPortFrom(HostAddr(v.NatAddr), HostPort(v.NatPort))
			} else {
				e.endpoint = netip.AddrPortFrom(HostAddr(k.Src), HostPort(k.Sport))
			}
			return e
		},
		pair: PairKey,
		add: func(q *sluiceCtCleanCtxV4, k, pair ConntrackKey, seen uint64) bool {
			q.Req[q.N].Key, q.Req[q.N].Pair, q.Req[q.N].Seen = k, pair, seen
			q.N++
			return int(q.N) == len(q.Req)
		},
		reqs: func(q *sluiceCtCleanCtxV4) []ctReq[ConntrackKey] {
			out := make([]ctReq[ConntrackKey], q.N)
			for i := range out {
				out[i] = ctReq[ConntrackKey]{q.Req[i].Key, q.Req[i].Pair, q.Req[i].Seen}
			}
			return out
		},
		result: func(q *sluiceCtCleanCtxV4) (int, int) { return int(q.Deleted), int(q.Kept) },
	}
}

func (c *Conntrack) table6() ctTable[ConntrackKey6, ConntrackValue6, sluiceCtCleanCtxV6] {
	return ctTable[ConntrackKey6, ConntrackValue6, sluiceCtCleanCtxV6]{name: "IPv6 connection table", ct: c.CT6, queue: c.Queue6, cleaner: c.Cleaner6,
		entry: func(k ConntrackKey6, v ConntrackValue6) ctEntry {
			e := ctEntry{typ: v.Type, flags: v.Flags, tcp: v.Tcp, proto: k.Proto, created: v.Created, lastSeen: v.LastSeen}
			if v.Type == ConntrackFwd {
				e.endpoint = netip.AddrPortFrom(hostAddr6(v.NatAddr), HostPort(v.NatPort))
			} else {
				e.endpoint = netip.AddrPortFrom(hostAddr6(k.Src), HostPort(k.Sport))
			}
			return e
		},
		pair: PairKey6,
		add: func(q *sluiceCtCleanCtxV6, k, pair ConntrackKey6, seen uint64) bool {
			q.Req[q.N].Key, q.Req[q.N].Pair, q.Req[q.N].Seen = k, pair, seen
			q.N++
			return int(q.N) == len(q.Req)
		},
		reqs: func(q *sluiceCtCleanCtxV6) []ctReq[ConntrackKey6] {
			out := make([]ctReq[ConntrackKey6], q.N)
			for i := range out {
				out[i] = ctReq[ConntrackKey6]{q.Req[i].Key, q.Req[i].Pair, q.Req[i].Seen}
			}
			return out
		},
		result: func(q *sluiceCtCleanCtxV6) (int, int) { return int(q.Deleted), int(q.Kept) },
	}
}

// Clean runs one pass over both tables at now (CLOCK_MONOTONIC ns).
func (c *Conntrack) Clean(now uint64) (CleanStats, error) {
	st := CleanStats{ByType: map[string]int{}}
	if err := cleanTable(c, c.table4(), now, &st); err != nil {
		return st, err
	}
	if c.CT6 != nil {
		if err := cleanTable(c, c.table6(), now, &st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// cleanTable runs one pass over one family's table, adding to st.
func cleanTable[K comparable, V any, Q any](c *Conntrack, t ctTable[K, V, Q], now uint64, st *CleanStats) error {
	all := map[K]V{}
	if err := walk(t.ct, func(k K, v V) { all[k] = v }); err != nil {
		return fmt.Errorf("reading the %s: %w", t.name, err)
	}
	st.Entries += len(all)
	pressure := t.ct.MaxEntries() > 0 && float64(len(all)) >= PressureShare*float64(t.ct.MaxEntries())
	var q Q
	flush := func() error {
		reqs := t.reqs(&q)
		if len(reqs) == 0 {
			return nil
		}
		if t.cleaner == nil {
			cleanFromUserSpace(t, reqs, st)
			q = *new(Q)
			return nil
		}
		if err := t.queue.Put(uint32(0), &q); err != nil {
			return fmt.Errorf("queueing cleanup: %w", err)
		}
		if _, err := t.cleaner.Run(&ebpf.RunOptions{}); err != nil {
			return fmt.Errorf("running the cleaner: %w", err)
		}
		var res Q
		if err := t.queue.Lookup(uint32(0), &res); err != nil {
			return fmt.Errorf("reading cleanup results: %w", err)
		}
		d, k := t.result(&res)
		st.Deleted += d
		st.Kept += k
		q = *new(Q)
		return nil
	}
	queue := func(k, pair K, seen uint64) error {
		st.Expired++
		if t.add(&q, k, pair, seen) {
			return flush()
		}
		return nil
	}
	var none K
	for k, v := range all {
		e := t.entry(k, v)
		switch e.typ {
		case ConntrackFwd:
			st.ByType["forward"]++
			if _, ok := all[t.pair(k, v)]; !ok && now > e.created && time.Duration(now-e.created) > c.Timeouts.Grace {
				if err := queue(k, none, e.lastSeen); err != nil {
					return err
				}
			}
		case ConntrackRev, ConntrackTun:
			if e.typ == ConntrackRev {
				st.ByType["reverse"]++
			} else {
				st.ByType["tunnel"]++
			}
			if e.flags&ConntrackRemote != 0 || e.typ == ConntrackTun {
				st.Forwards++
			}
			if c.stale(e) {
				// Deleted at once below, not through the last-seen check: traffic to an
				// endpoint that is gone keeps refreshing its flow.
				st.Stale++
				continue
			}
			idle := c.Timeouts.Idle(e.proto, e.tcp)
			early := pressure && !established(e.proto, e.tcp) && idle > PressureIdle
			if early {
				idle = PressureIdle
			}
			if now <= e.lastSeen || time.Duration(now-e.lastSeen) <= idle {
				continue
			}
			if early {
				st.Early++
			}
			pair := none
			if e.typ == ConntrackRev {
				pair = t.pair(k, v)
			}
			if err := queue(k, pair, e.lastSeen); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if c.Live != nil {
		n, err := deleteStale(c, t, all)
		st.Deleted += n
		return err
	}
	return nil
}

// stale says whether a reverse or tunnel entry's flow goes to an endpoint no service names
// any more and must go now: a flow not TCP, a TCP handshake, or a connection to a vacant
// address (Live, Vacant).
func (c *Conntrack) stale(e ctEntry) bool {
	// A forward entry carries no state of its own: it goes with its pair.
	if c.Live == nil || (e.typ != ConntrackRev && e.typ != ConntrackTun) || c.Live(e.endpoint.Addr(), e.endpoint.Port()) {
		return false
	}
	if e.proto != ProtoTCP || !established(e.proto, e.tcp) {
		return true
	}
	return c.Vacant != nil && c.Vacant(e.endpoint.Addr())
}

// deleteStale deletes every stale entry of all with its pair, however busy its flow: as
// kube-proxy deletes a removed UDP endpoint's conntrack entries at the sync that removes it,
// the client's next packet meets a live backend (a DNS resolver sending from one port would
// otherwise keep reaching the removed one until the flow idles out). It returns how many
// entries went.
func deleteStale[K comparable, V any, Q any](c *Conntrack, t ctTable[K, V, Q], all map[K]V) (int, error) {
	n := 0
	var errs []error
	var none K
	for k, v := range all {
		if !c.stale(t.entry(k, v)) {
			continue
		}
		for _, key := range []K{k, t.pair(k, v)} {
			if key == none {
				continue
			}
			err := t.ct.Delete(&key)
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

// SweepStale deletes the stale flows at once: the stage calls it at the apply that removed
// an endpoint from every service.
func (c *Conntrack) SweepStale() (int, error) {
	if c.Live == nil {
		return 0, nil
	}
	n, err := sweepStale(c, c.table4())
	if err != nil || c.CT6 == nil {
		return n, err
	}
	n6, err := sweepStale(c, c.table6())
	return n + n6, err
}

func sweepStale[K comparable, V any, Q any](c *Conntrack, t ctTable[K, V, Q]) (int, error) {
	all := map[K]V{}
	if err := walk(t.ct, func(k K, v V) {
		if c.stale(t.entry(k, v)) {
			all[k] = v
		}
	}); err != nil {
		return 0, fmt.Errorf("reading the %s: %w", t.name, err)
	}
	return deleteStale(c, t, all)
}

// cleanFromUserSpace does what sl_ct_clean does, from user space (kernels before 5.14).
func cleanFromUserSpace[K comparable, V any, Q any](t ctTable[K, V, Q], reqs []ctReq[K], st *CleanStats) {
	var none K
	ct := t.ct
	for _, r := range reqs {
		var v V
		if err := ct.Lookup(&r.key, &v); err != nil {
			continue
		}
		if t.entry(r.key, v).lastSeen != r.seen {
			st.Kept++
			continue
		}
		if err := ct.Delete(&r.key); err == nil {
			st.Deleted++
		}
		if r.pair != none {
			_ = ct.Delete(&r.pair)
		}
	}
}

// Counters sums the per-CPU drop and event counters by name.
func Counters(o *Objects) (map[string]uint64, error) { return sumCounters(o.SlCounters) }
