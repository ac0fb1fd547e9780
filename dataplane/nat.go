package dataplane

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-net/sluice/calc"
)

// Outgoing NAT (Calico's natOutgoing): traffic from a workload in a pool with natOutgoing to
// an address in no pool leaves with the node's address as its source. It is the kernel's
// own connection tracking and NAT, through one nftables table of sluice's (nat_nft.go):
//
//	table inet sluice-nat {
//		set masq4 { type ipv4_addr; flags interval; elements = { <natOutgoing pools> } }
//		set keep4 { type ipv4_addr; flags interval; elements = { <every pool>, [nodes] } }
//		(and masq6, keep6)
//		chain postrouting { type nat hook postrouting priority srcnat;
//			ip saddr @masq4 ip daddr != @keep4 masquerade to :<ports>   (or snat to <address>)
//			ip6 saddr @masq6 ip6 daddr != @keep6 masquerade to :<ports> }
//	}
//
// Why the kernel's NAT and not the service stage's eBPF: the translation of a connection is
// then the kernel's conntrack entry, which outlives sluiced (a restart or crash cuts nothing,
// and no cleanup of sluice's can cut a long connection), picks a free source port itself, and
// translates replies and ICMP errors back; BenchmarkOutgoingNAT in dataplane measures the
// per-connection cost beside the same traffic without it. Masquerade keeps the source port
// when it can and otherwise picks one above the node-port range, so a reply never lands on a
// node port the service stage's programs (which run before conntrack on the way in) would
// take for a new connection.
//
// Ownership rule: the table named NATTable, in the inet family, is sluice's whole: written
// in one transaction (table, sets, chain and rules, replacing what was there) when anything
// in it differs from the desired state; no other table is ever read for writing or touched.

// NATTable is the name of sluice's nftables table (family inet).
const NATTable = "sluice-nat"

// NATConfig configures outgoing NAT.
type NATConfig struct {
	// Disabled leaves nftables alone: sluice's table, if one is left from an earlier run,
	// stays as it is.
	Disabled bool
	// Address4 and Address6, when valid, are the source addresses outgoing NAT uses (SNAT,
	// as Felix's natOutgoingAddress) instead of the outgoing interface's (masquerade).
	Address4, Address6 netip.Addr
	// MinPort is the lowest source port masquerade may pick for a connection whose own
	// port is taken (default 32768: above the default node-port range, 30000-32767).
	MinPort uint16
}

// natRules is the desired (or actual) content of sluice's table.
type natRules struct {
	masq4, keep4, masq6, keep6 []netip.Prefix // merged, sorted
	addr4, addr6               netip.Addr
	minPort                    uint16
	// fips are this node's workloads' floating IPs, by external address.
	fips []natFIP
}

// natFIP is one floating IP: external address to internal.
type natFIP struct{ ext, int netip.Addr }

func (r natRules) equal(o natRules) bool {
	return slices.Equal(r.masq4, o.masq4) && slices.Equal(r.keep4, o.keep4) && slices.Equal(r.masq6, o.masq6) &&
		slices.Equal(r.keep6, o.keep6) && r.addr4 == o.addr4 && r.addr6 == o.addr6 && r.minPort == o.minPort &&
		slices.Equal(r.fips, o.fips)
}

// empty says there is nothing to translate: no pool has natOutgoing, no floating IP here.
func (r natRules) empty() bool { return len(r.masq4) == 0 && len(r.masq6) == 0 && len(r.fips) == 0 }

func (r natRules) String() string {
	var b strings.Builder
	list := func(name string, ps []netip.Prefix) {
		s := make([]string, len(ps))
		for i, p := range ps {
			s[i] = p.String()
		}
		fmt.Fprintf(&b, "%s {%s} ", name, strings.Join(s, ", "))
	}
	list("masq4", r.masq4)
	list("keep4", r.keep4)
	list("masq6", r.masq6)
	list("keep6", r.keep6)
	if r.addr4.IsValid() || r.addr6.IsValid() {
		fmt.Fprintf(&b, "snat %v %v", r.addr4, r.addr6)
	} else {
		fmt.Fprintf(&b, "masquerade from port %d", r.minPort)
	}
	for _, f := range r.fips {
		fmt.Fprintf(&b, " fip %s->%s", f.ext, f.int)
	}
	return strings.TrimSpace(b.String())
}

// natKernel reads and writes sluice's table.
type natKernel interface {
	// readNAT returns what sluice's table holds (ok false: no table, or one not of sluice's
	// making, which the next write replaces).
	readNAT() (r natRules, ok bool, err error)
	// writeNAT replaces sluice's table with r in one transaction, or deletes it when r is
	// nil.
	writeNAT(r *natRules) error
}

// OutgoingNAT keeps sluice's nftables table matching the cluster nets calc wants.
type OutgoingNAT struct {
	k   natKernel
	cfg NATConfig
	// nets are calc's cluster nets by prefix (only what NAT needs of them).
	nets map[netip.Prefix]calc.ClusterNet
	// fips are calc's floating IPs of this node's workloads, by external address.
	fips     map[netip.Addr]netip.Addr
	changed  bool // nets or floating IPs changed since the last apply
	needRead bool
	actual   *natRules // nil: no table
	writes   int
	// repaired says the last Apply's read found the table not as sluice had left it (someone
	// changed or deleted it).
	repaired bool
}

func newOutgoingNAT(k natKernel, cfg NATConfig) *OutgoingNAT {
	if cfg.MinPort == 0 {
		cfg.MinPort = 32768
	}
	return &OutgoingNAT{k: k, cfg: cfg, nets: map[netip.Prefix]calc.ClusterNet{}, fips: map[netip.Addr]netip.Addr{}, needRead: true, changed: true}
}

// Full takes a full update's cluster nets and floating IPs: the table is made from them
// alone.
func (n *OutgoingNAT) Full(u *calc.Update) {
	clear(n.nets)
	clear(n.fips)
	n.changed = true
	for _, op := range u.Ops {
		n.OnOp(op)
	}
}

// OnOp takes one of calc's ops: a cluster net or a floating IP of this node's (others are
// not NAT's). It reports whether the table's desired content changed. Only the nets NAT uses
// are kept: with the default exclusions a node's address is neither masqueraded nor kept, and
// 20,000 of them would make every node's arrival recompute the table.
func (n *OutgoingNAT) OnOp(op calc.Op) bool {
	switch op.Kind() {
	case calc.OpClusterNet:
		c := op.ClusterNet
		old, had := n.nets[c.Prefix]
		if op.Remove || (!c.Masquerade && !c.KeepSource) {
			delete(n.nets, c.Prefix)
			return n.mark(had)
		}
		c2 := calc.ClusterNet{Prefix: c.Prefix, Masquerade: c.Masquerade, KeepSource: c.KeepSource}
		n.nets[c.Prefix] = c2
		return n.mark(!had || old != c2)
	case calc.OpFloatingIP:
		f := op.FloatingIP
		old, had := n.fips[f.External]
		if op.Remove {
			delete(n.fips, f.External)
			return n.mark(had)
		}
		n.fips[f.External] = f.Internal
		return n.mark(!had || old != f.Internal)
	}
	return false
}

func (n *OutgoingNAT) mark(changed bool) bool {
	n.changed = n.changed || changed
	return changed
}

// QueueResync makes the next Apply read the table again (drift, failures).
func (n *OutgoingNAT) QueueResync() { n.needRead = true }

// Changed is what nftables reports deleted in some table: when it is sluice's (or may be),
// the next Apply reads the table again. (sluice's own writes delete its table too: the read
// then finds it as written, and nothing more happens. Set elements' and sets' events do not
// say their table in google/nftables v0.3.0, so any program's element deletions cost such a
// read too: a few small dumps.)
func (n *OutgoingNAT) Changed(table string) bool {
	if table != "" && table != NATTable {
		return false
	}
	n.needRead = true
	return true
}

// desired computes the table's content from the cluster nets.
func (n *OutgoingNAT) desired() natRules {
	var r natRules
	for p, c := range n.nets {
		four := p.Addr().Is4()
		if c.Masquerade {
			if four {
				r.masq4 = append(r.masq4, p)
			} else {
				r.masq6 = append(r.masq6, p)
			}
		}
		if c.KeepSource {
			if four {
				r.keep4 = append(r.keep4, p)
			} else {
				r.keep6 = append(r.keep6, p)
			}
		}
	}
	r.masq4, r.keep4, r.masq6, r.keep6 = mergePrefixes(r.masq4), mergePrefixes(r.keep4), mergePrefixes(r.masq6), mergePrefixes(r.keep6)
	// The source address or port range only as far as a rule uses them (so that a table read
	// back, which says them only there, compares equal).
	if len(r.masq4) > 0 {
		r.addr4 = n.cfg.Address4
	}
	if len(r.masq6) > 0 {
		r.addr6 = n.cfg.Address6
	}
	if (len(r.masq4) > 0 && !r.addr4.IsValid()) || (len(r.masq6) > 0 && !r.addr6.IsValid()) {
		r.minPort = n.cfg.MinPort
	}
	for ext, in := range n.fips {
		r.fips = append(r.fips, natFIP{ext, in})
	}
	slices.SortFunc(r.fips, func(a, b natFIP) int { return a.ext.Compare(b.ext) })
	return r
}

// Writes is how many times the table was written.
func (n *OutgoingNAT) Writes() int { return n.writes }

// Repaired says whether the last Apply's read found the table not as sluice had left it.
func (n *OutgoingNAT) Repaired() bool { return n.repaired }

// Apply makes the table match: written whole when it differs, deleted when nothing is to be
// translated. It reads the table first after QueueResync or a failure.
func (n *OutgoingNAT) Apply() error {
	n.repaired = false
	if !n.changed && !n.needRead {
		return nil
	}
	if n.needRead {
		r, ok, err := n.k.readNAT()
		if err != nil {
			return fmt.Errorf("reading nftables table %s: %w", NATTable, err)
		}
		prev := n.actual
		n.actual = nil
		if ok {
			n.actual = &r
		}
		n.repaired = prev != nil && (n.actual == nil || !n.actual.equal(*prev))
		n.needRead = false
	}
	want := n.desired()
	var werr error
	switch {
	case want.empty():
		if n.actual != nil {
			werr = n.k.writeNAT(nil)
			if werr == nil {
				n.actual = nil
				n.writes++
			}
		}
	case n.actual == nil || !n.actual.equal(want):
		werr = n.k.writeNAT(&want)
		if werr == nil {
			n.actual = &want
			n.writes++
		}
	}
	if werr != nil {
		n.needRead = true
		return fmt.Errorf("writing nftables table %s: %w", NATTable, werr)
	}
	n.changed = false
	return nil
}

// Programmed says what the table holds, as last read or written ("" when absent).
func (n *OutgoingNAT) Programmed() string {
	if n.actual == nil {
		return ""
	}
	return n.actual.String()
}

// Diff reads the table and says how it differs from the desired state: a table that should
// not be there is extra, one missing or holding other rules missing.
func (n *OutgoingNAT) Diff() (missing, extra []string, err error) {
	r, ok, err := n.k.readNAT()
	if err != nil {
		return nil, nil, err
	}
	want := n.desired()
	switch {
	case want.empty():
		if ok {
			return nil, []string{fmt.Sprintf("nftables table %s: present (%s); want none", NATTable, r)}, nil
		}
	case !ok:
		return []string{fmt.Sprintf("nftables table %s: missing; want %s", NATTable, want)}, nil, nil
	case !r.equal(want):
		return []string{fmt.Sprintf("nftables table %s: holds %s; want %s", NATTable, r, want)}, nil, nil
	}
	return nil, nil, nil
}

// mergePrefixes sorts ps and drops every prefix inside another: what an interval set holds.
// (Adjacent prefixes stay apart; the kernel takes them as separate intervals.)
func mergePrefixes(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	out := ps[:0]
	for _, p := range ps {
		p = p.Masked()
		if len(out) > 0 && out[len(out)-1].Contains(p.Addr()) {
			continue // sorted by address, shortest first: inside the last kept one
		}
		out = append(out, p)
	}
	return slices.Clip(out)
}

// prefixRange returns the first address of p and the first one after it (invalid when p
// reaches the end of the address space).
func prefixRange(p netip.Prefix) (first, after netip.Addr) {
	p = p.Masked()
	first = p.Addr()
	b := first.AsSlice()
	host := len(b)*8 - p.Bits()
	// last address: set the host bits, then add one.
	for i := len(b) - 1; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	last, _ := netip.AddrFromSlice(b)
	return first, last.Next()
}
