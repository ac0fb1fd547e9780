package dataplane

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// nftNAT is the natKernel of one network namespace, through nftables' netlink API (no nft
// binary).
type nftNAT struct {
	netnsFd int // 0: the caller's namespace
}

func (k nftNAT) conn() (*nftables.Conn, error) {
	if k.netnsFd != 0 {
		return nftables.New(nftables.WithNetNSFd(k.netnsFd))
	}
	return nftables.New()
}

var natTable = &nftables.Table{Family: nftables.TableFamilyINet, Name: NATTable}

// natSets are the table's sets: name, key type, and the rules' field holding them.
var natSets = []struct {
	name string
	v6   bool
	of   func(r *natRules) *[]netip.Prefix
}{
	{"masq4", false, func(r *natRules) *[]netip.Prefix { return &r.masq4 }},
	{"keep4", false, func(r *natRules) *[]netip.Prefix { return &r.keep4 }},
	{"masq6", true, func(r *natRules) *[]netip.Prefix { return &r.masq6 }},
	{"keep6", true, func(r *natRules) *[]netip.Prefix { return &r.keep6 }},
}

// natTags returns the comments of the rules r calls for: dnat those of prerouting and of
// output alike, one per floating IP; post those of postrouting, two per floating IP (hairpin,
// out) then one per family that masquerades.
func natTags(r *natRules) (dnat, post []string) {
	for _, f := range r.fips {
		dnat = append(dnat, fmt.Sprintf("sluice fip dnat %s %s", f.ext, f.int))
		post = append(post, fmt.Sprintf("sluice fip hairpin %s %s", f.int, f.ext), fmt.Sprintf("sluice fip snat %s %s", f.int, f.ext))
	}
	for _, v6 := range []bool{false, true} {
		if (!v6 && len(r.masq4) > 0) || (v6 && len(r.masq6) > 0) {
			post = append(post, ruleTag(v6, r))
		}
	}
	return dnat, post
}

// ruleTag is the comment on each of sluice's rules: what the rule does beyond its sets, read
// back to tell whether the rule is the desired one.
func ruleTag(v6 bool, r *natRules) string {
	family, addr := "ip", r.addr4
	if v6 {
		family, addr = "ip6", r.addr6
	}
	if addr.IsValid() {
		return fmt.Sprintf("sluice %s snat %s", family, addr)
	}
	return fmt.Sprintf("sluice %s masquerade %d-65535", family, r.minPort)
}

func (k nftNAT) writeNAT(r *natRules) error {
	c, err := k.conn()
	if err != nil {
		return err
	}
	// Add, then delete, then build afresh, all in one transaction: the add makes the delete
	// valid when there was no table; nothing in between is ever seen.
	c.AddTable(natTable)
	c.DelTable(natTable)
	if r == nil {
		return c.Flush()
	}
	t := c.AddTable(natTable)
	sets := map[string]*nftables.Set{}
	for _, s := range natSets {
		key := nftables.TypeIPAddr
		if s.v6 {
			key = nftables.TypeIP6Addr
		}
		set := &nftables.Set{Table: t, Name: s.name, KeyType: key, Interval: true}
		var elems []nftables.SetElement
		for _, p := range *s.of(r) {
			first, after := prefixRange(p)
			elems = append(elems, nftables.SetElement{Key: first.AsSlice()})
			if after.IsValid() {
				elems = append(elems, nftables.SetElement{Key: after.AsSlice(), IntervalEnd: true})
			}
		}
		if err := c.AddSet(set, elems); err != nil {
			return fmt.Errorf("set %s: %w", s.name, err)
		}
		sets[s.name] = set
	}
	chain := func(name string, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeNAT, Hooknum: hook, Priority: prio})
	}
	pre := chain("prerouting", nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	out := chain("output", nftables.ChainHookOutput, nftables.ChainPriorityNATDest)
	post := chain("postrouting", nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	add := func(ch *nftables.Chain, tag string, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs, UserData: userdata.AppendString(nil, userdata.TypeComment, tag)})
	}
	// family returns the match on a packet's family, and where its addresses are.
	family := func(v6 bool) (match []expr.Any, saddr, daddr uint32, n uint32) {
		proto, off, n := byte(unix.NFPROTO_IPV4), uint32(12), uint32(4)
		if v6 {
			proto, off, n = byte(unix.NFPROTO_IPV6), 8, 16
		}
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}}}, off, off + n, n
	}
	load := func(off, n uint32) expr.Any {
		return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
	}
	is := func(a netip.Addr) expr.Any { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()} }
	nat := func(typ expr.NATType, v6 bool, to netip.Addr) []expr.Any {
		fam := uint32(unix.NFPROTO_IPV4)
		if v6 {
			fam = unix.NFPROTO_IPV6
		}
		return []expr.Any{&expr.Immediate{Register: 1, Data: to.AsSlice()}, &expr.NAT{Type: typ, Family: fam, RegAddrMin: 1}}
	}
	dnats, posts := natTags(r)
	// Floating IPs: to the external address from anywhere (prerouting) or from this host
	// (output) becomes the internal one; the workload's own traffic to itself through it
	// (hairpin) and out of the cluster leaves from the external address.
	for i, f := range r.fips {
		v6 := f.ext.Is6()
		match, saddr, daddr, n := family(v6)
		keep := sets["keep4"]
		if v6 {
			keep = sets["keep6"]
		}
		dnat := slices.Concat(match, []expr.Any{load(daddr, n), is(f.ext)}, nat(expr.NATTypeDestNAT, v6, f.int))
		add(pre, dnats[i], dnat...)
		add(out, dnats[i], dnat...)
		add(post, posts[2*i], slices.Concat(match, []expr.Any{load(saddr, n), is(f.int), load(daddr, n), is(f.int)}, nat(expr.NATTypeSourceNAT, v6, f.ext))...)
		add(post, posts[2*i+1], slices.Concat(match, []expr.Any{load(saddr, n), is(f.int), load(daddr, n),
			&expr.Lookup{SourceRegister: 1, SetName: keep.Name, SetID: keep.ID, Invert: true}}, nat(expr.NATTypeSourceNAT, v6, f.ext))...)
	}
	posts = posts[2*len(r.fips):]
	for _, v6 := range []bool{false, true} {
		masq, keep, addr := sets["masq4"], sets["keep4"], r.addr4
		empty := len(r.masq4) == 0
		if v6 {
			masq, keep, addr = sets["masq6"], sets["keep6"], r.addr6
			empty = len(r.masq6) == 0
		}
		if empty {
			continue
		}
		match, saddr, daddr, n := family(v6)
		exprs := slices.Concat(match, []expr.Any{
			load(saddr, n), &expr.Lookup{SourceRegister: 1, SetName: masq.Name, SetID: masq.ID},
			load(daddr, n), &expr.Lookup{SourceRegister: 1, SetName: keep.Name, SetID: keep.ID, Invert: true},
		})
		if addr.IsValid() {
			exprs = append(exprs, nat(expr.NATTypeSourceNAT, v6, addr)...)
		} else {
			exprs = append(exprs,
				&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, r.minPort)},
				&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, 65535)},
				&expr.Masq{ToPorts: true, RegProtoMin: 1, RegProtoMax: 2})
		}
		add(post, posts[0], exprs...)
		posts = posts[1:]
	}
	return c.Flush()
}

func (k nftNAT) readNAT() (natRules, bool, error) {
	var r natRules
	c, err := k.conn()
	if err != nil {
		return r, false, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return r, false, err
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == NATTable }) {
		return r, false, nil
	}
	sets, err := c.GetSets(natTable)
	if err != nil {
		return r, false, err
	}
	found := 0
	for _, set := range sets {
		for _, s := range natSets {
			if set.Name != s.name {
				continue
			}
			found++
			elems, err := c.GetSetElements(set)
			if err != nil {
				return r, false, err
			}
			ps, ok := intervalsToPrefixes(elems)
			if !ok {
				return r, false, nil // not what sluice writes: rewritten
			}
			*s.of(&r) = ps
		}
	}
	if found != len(natSets) || len(sets) != len(natSets) {
		return r, false, nil
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return r, false, err
	}
	tags := map[string][]string{}
	hooks := map[string]*nftables.ChainHook{"prerouting": nftables.ChainHookPrerouting, "output": nftables.ChainHookOutput, "postrouting": nftables.ChainHookPostrouting}
	for _, x := range chains {
		if x.Table.Name != NATTable {
			continue
		}
		hook, ok := hooks[x.Name]
		if _, seen := tags[x.Name]; !ok || seen || x.Type != nftables.ChainTypeNAT || x.Hooknum == nil || *x.Hooknum != *hook {
			return r, false, nil
		}
		rules, err := c.GetRules(natTable, x)
		if err != nil {
			return r, false, err
		}
		tags[x.Name] = []string{}
		for _, rule := range rules {
			tag, _ := userdata.GetString(rule.UserData, userdata.TypeComment)
			tags[x.Name] = append(tags[x.Name], tag)
		}
	}
	if len(tags) != len(hooks) {
		return r, false, nil
	}
	// The tags say the floating IPs (prerouting) and the source address or port range
	// (postrouting's last rules); read back, every chain must hold the rules those call for.
	for _, tag := range tags["prerouting"] {
		var ext, in string
		if _, err := fmt.Sscanf(tag, "sluice fip dnat %s %s", &ext, &in); err != nil {
			return r, false, nil
		}
		e, err1 := netip.ParseAddr(ext)
		i, err2 := netip.ParseAddr(in)
		if err1 != nil || err2 != nil {
			return r, false, nil
		}
		r.fips = append(r.fips, natFIP{e, i})
	}
	for _, tag := range tags["postrouting"][min(len(tags["postrouting"]), 2*len(r.fips)):] {
		var family, what, arg string
		if _, err := fmt.Sscanf(tag, "sluice %s %s %s", &family, &what, &arg); err != nil {
			return r, false, nil
		}
		switch {
		case what == "snat" && family == "ip":
			r.addr4, _ = netip.ParseAddr(arg)
		case what == "snat" && family == "ip6":
			r.addr6, _ = netip.ParseAddr(arg)
		case what == "masquerade":
			var p uint16
			if _, err := fmt.Sscanf(arg, "%d-65535", &p); err != nil {
				return r, false, nil
			}
			r.minPort = p
		}
	}
	dnat, post := natTags(&r)
	if !slices.Equal(tags["prerouting"], dnat) || !slices.Equal(tags["output"], dnat) || !slices.Equal(tags["postrouting"], post) {
		return r, false, nil
	}
	return r, true, nil
}

// intervalsToPrefixes turns an interval set's elements back into the prefixes sluice wrote
// (false: they are not exactly prefixes).
func intervalsToPrefixes(elems []nftables.SetElement) ([]netip.Prefix, bool) {
	var starts, ends []netip.Addr
	for _, e := range elems {
		a, ok := netip.AddrFromSlice(e.Key)
		if !ok {
			return nil, false
		}
		if e.IntervalEnd {
			ends = append(ends, a)
		} else {
			starts = append(starts, a)
		}
	}
	slices.SortFunc(starts, netip.Addr.Compare)
	slices.SortFunc(ends, netip.Addr.Compare)
	// The kernel may report a leading end at the zero address (an interval set's sentinel).
	if len(ends) > len(starts) && len(ends) > 0 && ends[0].IsUnspecified() {
		ends = ends[1:]
	}
	var out []netip.Prefix
	for i, s := range starts {
		var after netip.Addr
		if i < len(ends) {
			after = ends[i]
		}
		p, ok := prefixOfRange(s, after)
		if !ok {
			return nil, false
		}
		out = append(out, p)
	}
	if len(ends) > len(starts) {
		return nil, false
	}
	return mergePrefixes(out), true
}

// prefixOfRange returns the prefix covering exactly [first, after) (after invalid: to the end).
func prefixOfRange(first, after netip.Addr) (netip.Prefix, bool) {
	for bits := 0; bits <= first.BitLen(); bits++ {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() != first {
			continue
		}
		f, a := prefixRange(p)
		if f == first && a == after {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
