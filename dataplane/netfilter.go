package dataplane

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// NetfilterLeftover is another product's netfilter state in the node's nf_tables (where
// iptables-nft and kube-proxy's nftables mode write; read over netlink, no binary): one owner's
// chains in one table, with the rules among them that break one of sluice's paths.
type NetfilterLeftover struct {
	Owner    string // kube-proxy, calico, cilium; "" for legacy x_tables of unknown owner
	Family   string // ip, ip6, inet
	Table    string
	Chains   []string // the owner's chains in the table, sorted
	Hooks    []string // the base chains that jump into them ("FORWARD", "nat PREROUTING", ...)
	Breaking bool
	// Breaks says which of sluice's paths its rules break (one line per rule kind), or for a
	// dormant one why it is dormant.
	Breaks []string
	Fix    string
	// Removed is set when sluice removed it (CleanConflicts); Err when that failed; Gone when
	// it was reported and is no longer there.
	Removed, Gone bool
	Err           error

	table   *nftables.Table
	chains  []*nftables.Chain
	jumps   []*nftables.Rule // the base chains' rules jumping into the owner's chains
	legacy  bool
	ownsAll bool // the whole table is the owner's (kube-proxy's nftables table)
	dnat    bool // its chains translate destinations (service rules)
}

// NetfilterView is what judging the chains needs to know of sluice: whether its socket
// programs are off (option cgroup-path none, or a kernel without them), leaving the node's
// own connections to services to whatever netfilter does with them.
type NetfilterView struct {
	SocketProgramsOff bool
}

// Key identifies the leftover across passes.
func (n NetfilterLeftover) Key() string {
	return fmt.Sprintf("netfilter %s %s %s", n.Family, n.Table, n.Owner)
}

// Effect is "breaking", "dormant", or "unknown" (legacy tables, not readable over netlink).
func (n NetfilterLeftover) Effect() string {
	switch {
	case n.legacy:
		return "unknown"
	case n.Breaking:
		return "breaking"
	}
	return "dormant"
}

func (n NetfilterLeftover) String() string {
	if n.legacy {
		return fmt.Sprintf("legacy iptables tables (%s): %s", n.Family, n.Table)
	}
	hooks := "no base chain jumps into them"
	if len(n.Hooks) > 0 {
		hooks = "jumped to from " + strings.Join(n.Hooks, ", ")
	}
	return fmt.Sprintf("%s's netfilter chains in %s %s (%d: %s; %s)", n.Owner, n.Family, n.Table, len(n.Chains), abbreviate(n.Chains, 4), hooks)
}

// Removable says whether --clean-conflicts removes it: breaking and recognisably another
// product's.
func (n NetfilterLeftover) Removable() bool { return n.Breaking && n.Owner != "" && !n.legacy }

func abbreviate(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(s[:n], ", ") + fmt.Sprintf(", and %d more", len(s)-n)
}

// netfilterOwner recognises a chain's or table's owner by its name: kube-proxy's KUBE-* chains
// (iptables and IPVS modes) and its nftables table kube-proxy, Calico's cali-*, Cilium's
// CILIUM_*; "" for anything else (an operator's own chains are never touched).
func netfilterOwner(table, chain string) string {
	switch {
	case table == "kube-proxy":
		return "kube-proxy"
	case strings.HasPrefix(chain, "KUBE-"):
		return "kube-proxy"
	case strings.HasPrefix(chain, "cali-"):
		return "calico"
	case strings.HasPrefix(chain, "CILIUM_"):
		return "cilium"
	}
	return ""
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprint(f)
}

// FindNetfilter reads the nf_tables state of the namespace c is bound to and lists other
// products' chains, judged rule by rule:
//   - a DROP in Calico's chains of cali* interfaces it does not know ("Unknown interface")
//     breaks sluice's workloads on interfaces named cali*;
//   - service DNAT rules hooked into nat OUTPUT break the node's own connections to services
//     when sluice's socket programs are off (view);
//   - otherwise service DNAT and REJECT rules act only on packets sluice's programs leave
//     untranslated (its service stage down): dormant. So does a DROP of conntrack INVALID
//     (kube-proxy's KUBE-FORWARD): every service path of sluice's passes one (make demo runs
//     them all behind such a drop in forward, input and output).
//
// Legacy x_tables, which netlink cannot read, are reported present when /proc lists them.
func FindNetfilter(c *nftables.Conn, view NetfilterView) ([]NetfilterLeftover, error) {
	tables, err := c.ListTables()
	if err != nil {
		return nil, fmt.Errorf("listing nf_tables tables: %w", err)
	}
	chains, err := c.ListChains()
	if err != nil {
		return nil, fmt.Errorf("listing nf_tables chains: %w", err)
	}
	var out []NetfilterLeftover
	var errs []error
	for _, t := range tables {
		if t.Name == NATTable {
			continue // sluice's own
		}
		var mine []*nftables.Chain
		for _, ch := range chains {
			if ch.Table.Name == t.Name && ch.Table.Family == t.Family {
				mine = append(mine, ch)
			}
		}
		found := map[string]*NetfilterLeftover{}
		rules := map[*nftables.Chain][]*nftables.Rule{}
		for _, ch := range mine {
			rs, err := c.GetRules(t, ch)
			if err != nil {
				errs = append(errs, fmt.Errorf("reading %s %s %s: %w", familyName(t.Family), t.Name, ch.Name, err))
				continue
			}
			rules[ch] = rs
			owner := netfilterOwner(t.Name, ch.Name)
			if owner == "" {
				continue
			}
			n := found[owner]
			if n == nil {
				n = &NetfilterLeftover{Owner: owner, Family: familyName(t.Family), Table: t.Name, table: t, ownsAll: t.Name == "kube-proxy"}
				found[owner] = n
			}
			n.Chains = append(n.Chains, ch.Name)
			n.chains = append(n.chains, ch)
		}
		for _, ch := range mine {
			owner := netfilterOwner(t.Name, ch.Name)
			for _, r := range rules[ch] {
				if ch.Hooknum != nil && owner == "" {
					// A base chain of someone else's (iptables' own FORWARD, ...) jumping
					// into an owner's chain: the link to unhook.
					if target := jumpTarget(r); target != "" {
						if n := found[netfilterOwner(t.Name, target)]; n != nil {
							n.jumps = append(n.jumps, r)
							where := ch.Name
							if t.Name != "filter" {
								where = t.Name + " " + ch.Name
							}
							if !slices.Contains(n.Hooks, where) {
								n.Hooks = append(n.Hooks, where)
							}
						}
					}
				}
				if n := found[owner]; n != nil {
					n.judge(ch, r)
				}
			}
			if n := found[owner]; n != nil && ch.Hooknum != nil {
				where := ch.Name
				if !slices.Contains(n.Hooks, where) {
					n.Hooks = append(n.Hooks, where) // its own base chain (kube-proxy's nftables table)
				}
			}
		}
		for _, n := range found {
			sort.Strings(n.Chains)
			if view.SocketProgramsOff && n.dnat && slices.Contains(n.Hooks, "nat OUTPUT") {
				n.breaks("its DNAT rules, hooked into nat OUTPUT, take the node's own connections to services (sluice's socket programs are off) to the endpoints it last knew")
			}
			n.Breaking = n.Breaking && (len(n.Hooks) > 0)
			if len(n.Breaks) == 0 {
				n.Breaks = []string{"dormant: its rules act only on packets sluice's programs leave untranslated (the service stage down, or the node's own connections with the socket programs off)"}
			}
			if len(n.Hooks) == 0 {
				n.Breaks = []string{"dormant: no base chain jumps into them"}
			}
			n.Fix = n.fix()
			out = append(out, *n)
		}
	}
	out = append(out, legacyTables()...)
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out, errors.Join(errs...)
}

// judge looks at one rule of the owner's chain ch for what breaks sluice's paths.
func (n *NetfilterLeftover) judge(ch *nftables.Chain, r *nftables.Rule) {
	drop := false
	for _, e := range r.Exprs {
		switch v := e.(type) {
		case *expr.Verdict:
			drop = drop || v.Kind == expr.VerdictDrop
		case *expr.Target:
			n.dnat = n.dnat || v.Name == "DNAT"
		case *expr.NAT:
			n.dnat = n.dnat || v.Type == expr.NATTypeDestNAT
		}
	}
	if !drop {
		return
	}
	for _, e := range r.Exprs {
		if m, ok := e.(*expr.Match); ok {
			if c, ok := m.Info.(*xt.Comment); ok && strings.Contains(string(*c), "Unknown interface") {
				n.breaks(fmt.Sprintf("%s drops packets of interfaces named cali* Calico does not know (\"Unknown interface\"): sluice's workloads there", ch.Name))
			}
		}
	}
}

func (n *NetfilterLeftover) breaks(why string) {
	n.Breaking = true
	if !slices.Contains(n.Breaks, why) {
		n.Breaks = append(n.Breaks, why)
	}
}

func (n *NetfilterLeftover) fix() string {
	if n.ownsAll {
		return fmt.Sprintf("nft delete table %s %s", n.Family, n.Table)
	}
	cmd := "iptables"
	if n.Family == "ip6" {
		cmd = "ip6tables"
	}
	var parts []string
	if len(n.Hooks) > 0 {
		parts = append(parts, "delete the jumps from "+strings.Join(n.Hooks, ", "))
	}
	parts = append(parts, fmt.Sprintf("then %s -t %s -F and -X each of its chains", cmd, n.Table))
	return strings.Join(parts, ", ")
}

// jumpTarget is the chain a rule jumps or goes to, "" when it does neither.
func jumpTarget(r *nftables.Rule) string {
	for _, e := range r.Exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
			return v.Chain
		}
	}
	return ""
}

// legacyTables reports the x_tables (iptables-legacy) tables /proc lists: netlink cannot read
// them, so what they hold is unknown.
func legacyTables() []NetfilterLeftover {
	var out []NetfilterLeftover
	for _, f := range []struct{ file, family, save string }{{"/proc/net/ip_tables_names", "ip", "iptables-legacy-save"}, {"/proc/net/ip6_tables_names", "ip6", "ip6tables-legacy-save"}} {
		b, err := os.ReadFile(f.file)
		names := strings.Fields(string(b))
		if err != nil || len(names) == 0 {
			continue
		}
		sort.Strings(names)
		out = append(out, NetfilterLeftover{Family: f.family, Table: strings.Join(names, ","), legacy: true,
			Breaks: []string{"unknown: legacy x_tables cannot be read over netlink"},
			Fix:    "read them with " + f.save + "; remove another product's chains with iptables-legacy"})
	}
	return out
}

// Remove unhooks n (the base chains' jumps into its chains), then flushes and deletes its
// chains, in one transaction; a table wholly the owner's is deleted.
func (n *NetfilterLeftover) Remove(c *nftables.Conn) error {
	if n.ownsAll {
		c.DelTable(n.table)
		return c.Flush()
	}
	for _, r := range n.jumps {
		if err := c.DelRule(r); err != nil {
			return err
		}
	}
	for _, ch := range n.chains {
		if ch.Hooknum == nil {
			c.FlushChain(ch)
		}
	}
	for _, ch := range n.chains {
		if ch.Hooknum == nil {
			c.DelChain(ch)
		}
	}
	return c.Flush()
}
