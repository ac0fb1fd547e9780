package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
)

const servicesUsage = `usage: sluicectl services [VIEW] [--pin-dir DIR] [--config FILE] [-o table|json]

Shows this node's service maps as its sluiced pinned them: run it on the node,
as root. It only reads; nothing is written.

views:
  frontends  (the default) every frontend: its kind and flags, service
             identity, backends (the local set and the cluster set; remote
             ones @ their node) and affinity
  backends   every entry of every backend list, and how many frontends use
             the list
  conntrack  the connection table, one line per entry: where each flow's
             packets are translated and sent, its TCP state, idle time and age;
             --forwarded shows only the flows forwarded between nodes through
             the tunnel
  drops      the datapath's counters, drops and rejects first

flags:
`

// runServices shows the pinned service maps of this node.
func runServices(_ context.Context, a *app, args []string) error {
	fs := a.flagSet("services")
	pinDir := fs.String("pin-dir", "", "sluiced's pin directory (default: its option bpf-pin-dir, from its configuration file and SLUICE_* variables)")
	configFile := fs.String("config", "", "sluiced's configuration file (default: SLUICE_CONFIG, or "+agentconfig.DefaultConfigFile+" when present)")
	output := outputFlag(fs, "table or json")
	forwarded := fs.Bool("forwarded", false, "conntrack: only the flows forwarded between nodes")
	fs.Usage = func() {
		fmt.Fprint(a.stderr, servicesUsage)
		printFlags(a.stderr, fs)
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	view := "frontends"
	if len(pos) > 0 {
		view = pos[0]
	}
	if len(pos) > 1 {
		return usagef("unexpected argument %q", pos[1])
	}
	if !slices.Contains([]string{"frontends", "backends", "conntrack", "drops"}, view) {
		return usagef("unknown view %q: want frontends, backends, conntrack or drops", view)
	}
	if err := tableOrJSON(*output); err != nil {
		return err
	}
	if *forwarded && view != "conntrack" {
		return usagef("--forwarded is for the conntrack view")
	}
	dir, servicesOn := *pinDir, true
	if dir == "" {
		agent, err := a.agentConfig(*configFile)
		if err != nil {
			return err
		}
		dir, servicesOn = agent.BPF.PinDir, agent.Services && agent.Dataplane
	}
	p, err := bpf.OpenPinned(dir)
	if err != nil {
		if !servicesOn && errors.Is(err, bpf.ErrNotPinned) {
			return fmt.Errorf("%w; sluiced's configuration here turns the service stage off (options services, dataplane)", err)
		}
		return err
	}
	defer p.Close()
	var rows any
	var table func(w io.Writer) error
	switch view {
	case "frontends":
		fr, err := frontendRows(p.Tables())
		if err != nil {
			return fmt.Errorf("reading the service maps in %s: %w", dir, err)
		}
		rows, table = fr, func(w io.Writer) error { return writeFrontends(w, fr) }
	case "backends":
		br, err := backendRows(p.Tables())
		if err != nil {
			return fmt.Errorf("reading the service maps in %s: %w", dir, err)
		}
		rows, table = br, func(w io.Writer) error { return writeBackends(w, br) }
	case "conntrack":
		flows, err := p.Flows()
		if err != nil {
			return err
		}
		cr := conntrackRows(flows, bpf.Monotonic(), *forwarded, interfaceName)
		rows, table = cr, func(w io.Writer) error {
			for _, r := range cr {
				fmt.Fprintln(w, r.Text)
			}
			return nil
		}
	case "drops":
		counters, err := p.Counters()
		if err != nil {
			return err
		}
		cr := counterRows(counters)
		rows, table = cr, func(w io.Writer) error { return writeCounters(w, cr) }
	}
	if *output == "json" {
		b, err := json.MarshalIndent(rows, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", b)
		return err
	}
	return table(a.stdout)
}

// agentConfig reads sluiced's configuration as this node's sluiced reads it (its file and
// SLUICE_* variables), with more of sluiced's flags.
func (a *app) agentConfig(configFile string, flags ...string) (*agentconfig.Config, error) {
	var args []string
	if configFile != "" {
		args = append(args, "--config", configFile)
	}
	return agentconfig.ParseEnv(append(args, flags...), a.lookupEnv, a.stderr)
}

// interfaceName names an interface of this network namespace by index, "" when unknown.
func interfaceName(i int) string {
	ifc, err := net.InterfaceByIndex(i)
	if err != nil {
		return ""
	}
	return ifc.Name
}

// backendRow is one backend list entry.
type backendRow struct {
	List    string `json:"list"`
	Ordinal uint32 `json:"ordinal"`
	Backend string `json:"backend"`
	// Node is the underlay address of the backend's node, where flows to it are tunnelled;
	// empty for a backend on this node.
	Node  string `json:"node,omitempty"`
	Local bool   `json:"local"`
	// Routed marks an endpoint on no node: reached by routing, never the tunnel.
	Routed bool `json:"routed,omitempty"`
	// UsedBy counts the frontends pointing at the list (0: a list left behind).
	UsedBy int `json:"usedBy"`
	// Missing marks an entry a frontend's count reaches that is not in the map.
	Missing bool `json:"missing,omitempty"`
}

func (b backendRow) String() string {
	switch {
	case b.Missing:
		return fmt.Sprintf("#%d-missing", b.Ordinal)
	case b.Local:
		return b.Backend
	case b.Routed:
		return b.Backend + "@routed"
	}
	return b.Backend + "@" + b.Node
}

// describe fills the row from a backend entry.
func (b *backendRow) describe(v bpf.Backend) {
	b.Backend = v.Addr.String()
	b.Local = v.Flags&bpf.BackendLocal != 0
	b.Routed = v.Flags&bpf.BackendRouted != 0
	if !b.Local && !b.Routed {
		b.Node = v.Node.String()
	}
}

// frontendRow is one frontend entry with its backends resolved.
type frontendRow struct {
	Frontend  string   `json:"frontend"`
	Address   string   `json:"address"`
	Port      uint16   `json:"port,omitempty"`
	Protocol  string   `json:"protocol"`
	Kind      string   `json:"kind"`
	Flags     []string `json:"flags,omitempty"`
	ServiceID string   `json:"serviceID"`
	List      string   `json:"list,omitempty"`
	// Local are the backends [0, local): the set of traffic policy Local; Cluster are
	// [clusterStart, count), the set of policy Cluster.
	Local           []backendRow `json:"local"`
	Cluster         []backendRow `json:"cluster"`
	SourceRanges    []string     `json:"sourceRanges,omitempty"`
	AffinitySeconds uint32       `json:"affinitySeconds,omitempty"`

	key bpf.Frontend
}

func compareFrontends(a, b bpf.Frontend) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Proto, b.Proto))
}

// listKey names a backend list in the maps of its family.
type listKey struct {
	ipv6 bool
	bpf.BackendKey
}

// frontendRows reads the frontends of both families with their backends and source ranges,
// in address order.
func frontendRows(t bpf.Tables) ([]frontendRow, error) {
	fe, be, err := t.Entries()
	if err != nil {
		return nil, err
	}
	backends := make(map[listKey]bpf.Backend, len(be))
	for _, b := range be {
		backends[listKey{b.IPv6, b.Key}] = b
	}
	rows := []frontendRow{}
	for _, k := range fe {
		v := k.Value
		r := frontendRow{Address: k.Addr.String(), Port: k.Port, Protocol: bpf.ProtoName(k.Proto),
			ServiceID: fmt.Sprintf("%016x", v.SvcId), AffinitySeconds: v.AffinitySec, key: k,
			Local: []backendRow{}, Cluster: []backendRow{}}
		for _, p := range k.SourceRanges {
			r.SourceRanges = append(r.SourceRanges, p.String())
		}
		slices.Sort(r.SourceRanges)
		r.Frontend = fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, r.Port), r.Protocol)
		switch {
		case v.Flags&bpf.FrontendAddrOnly != 0:
			r.Kind, r.Frontend = "address-only", k.Addr.String()
		case v.Flags&bpf.FrontendNodePort != 0:
			r.Kind = "node-port"
		default:
			r.Kind = "service"
		}
		for _, f := range []struct {
			bit  uint32
			name string
		}{{bpf.FrontendExternalLocal, "external-local"}, {bpf.FrontendInternalLocal, "internal-local"}, {bpf.FrontendSourceRanges, "source-ranges"}} {
			if v.Flags&f.bit != 0 {
				r.Flags = append(r.Flags, f.name)
			}
		}
		if v.Flags&bpf.FrontendAddrOnly == 0 {
			r.List = fmt.Sprintf("%016x", v.ListId)
			for i := uint32(0); i < v.Count; i++ {
				b := backendRow{List: r.List, Ordinal: i}
				if bv, ok := backends[listKey{k.IPv6, bpf.BackendKey{ListId: v.ListId, Ordinal: i}}]; ok {
					b.describe(bv)
				} else {
					b.Missing = true
				}
				if i < v.Local {
					r.Local = append(r.Local, b)
				}
				if i >= v.ClusterStart {
					r.Cluster = append(r.Cluster, b)
				}
			}
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b frontendRow) int { return compareFrontends(a.key, b.key) })
	return rows, nil
}

func writeFrontends(w io.Writer, rows []frontendRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FRONTEND\tKIND\tSERVICE-ID\tBACKENDS\tAFFINITY")
	set := func(bs []backendRow) string {
		s := make([]string, len(bs))
		for i, b := range bs {
			s[i] = b.String()
		}
		return "[" + strings.Join(s, " ") + "]"
	}
	for _, r := range rows {
		kind := append([]string{r.Kind}, r.Flags...)
		for _, s := range r.SourceRanges {
			kind = append(kind, "source="+s)
		}
		backends, affinity := "-", "-"
		if r.Kind != "address-only" {
			backends = "local " + set(r.Local) + " cluster " + set(r.Cluster)
		}
		if r.AffinitySeconds != 0 {
			affinity = fmt.Sprintf("%ds", r.AffinitySeconds)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Frontend, strings.Join(kind, ","), r.ServiceID, backends, affinity)
	}
	return tw.Flush()
}

// backendRows reads every backend list entry of both families, in list and ordinal order,
// with how many frontends use its list.
func backendRows(t bpf.Tables) ([]backendRow, error) {
	fe, be, err := t.Entries()
	if err != nil {
		return nil, err
	}
	users := map[listKey]int{}
	for _, f := range fe {
		if f.Value.Flags&bpf.FrontendAddrOnly == 0 {
			users[listKey{f.IPv6, bpf.BackendKey{ListId: f.Value.ListId}}]++
		}
	}
	rows := []backendRow{}
	for _, b := range be {
		r := backendRow{List: fmt.Sprintf("%016x", b.Key.ListId), Ordinal: b.Key.Ordinal,
			UsedBy: users[listKey{b.IPv6, bpf.BackendKey{ListId: b.Key.ListId}}]}
		r.describe(b)
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b backendRow) int {
		return cmp.Or(cmp.Compare(a.List, b.List), cmp.Compare(a.Ordinal, b.Ordinal), strings.Compare(a.Backend, b.Backend))
	})
	return rows, nil
}

func writeBackends(w io.Writer, rows []backendRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LIST\t#\tBACKEND\tNODE\tUSED-BY")
	for _, r := range rows {
		node, used := r.Node, fmt.Sprintf("%d frontends", r.UsedBy)
		if r.Local {
			node = "local"
		} else if r.Routed {
			node = "routed (no node)"
		}
		switch r.UsedBy {
		case 0:
			used = "none (left behind)"
		case 1:
			used = "1 frontend"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", r.List, r.Ordinal, r.Backend, node, used)
	}
	return tw.Flush()
}

// conntrackRow is one connection-table entry.
type conntrackRow struct {
	Kind     string `json:"kind"`
	Protocol string `json:"protocol"`
	Source   string `json:"source"`
	Dest     string `json:"destination"`
	// Forward entries: the backend, the source port towards it.
	Backend    string `json:"backend,omitempty"`
	SourcePort uint16 `json:"sourcePort,omitempty"`
	// Reverse entries: the frontend replies come from, the client's own port, and for
	// replies redirected out of an interface: the interface and the MACs.
	Frontend   string `json:"frontend,omitempty"`
	ClientPort uint16 `json:"clientPort,omitempty"`
	Ifindex    uint32 `json:"ifindex,omitempty"`
	Interface  string `json:"interface,omitempty"`
	MACLocal   string `json:"macLocal,omitempty"`
	MACPeer    string `json:"macPeer,omitempty"`
	// HairpinSource is the source a hairpinned flow's backend sees (a workload reaching
	// itself through a service), and the client's own address on its reverse entry.
	HairpinSource string `json:"hairpinSource,omitempty"`
	HairpinClient string `json:"hairpinClient,omitempty"`
	// Node is the backend's node of a forwarded flow (forward and reverse entries);
	// TunnelPeer the ingress node a tunnel entry sends replies back to.
	Node       string   `json:"node,omitempty"`
	TunnelPeer string   `json:"tunnelPeer,omitempty"`
	Flags      []string `json:"flags,omitempty"`
	TCP        []string `json:"tcp,omitempty"`
	// Replied: a UDP flow that was answered (kept for the longer "stream" timeout).
	Replied     bool   `json:"replied,omitempty"`
	IdleSeconds *int64 `json:"idleSeconds,omitempty"`
	AgeSeconds  int64  `json:"ageSeconds"`
	Text        string `json:"text"`
}

// conntrackRows describes the entries of both families at now: each forward entry followed by
// its reverse entry, then the reverse entries without one, then the tunnel entries. forwarded
// keeps only the flows forwarded between nodes.
func conntrackRows(flows []bpf.Flow, now uint64, forwarded bool, ifname func(int) string) []conntrackRow {
	secs := func(t uint64) int64 {
		if t >= now {
			return 0
		}
		return int64(time.Duration(now-t) / time.Second)
	}
	row := func(f bpf.Flow) conntrackRow {
		r := conntrackRow{Kind: bpf.ConntrackKind(f.Type), Protocol: bpf.ProtoName(f.Proto), Source: f.Src.String(),
			Dest: f.Dst.String(), Flags: bpf.ConntrackFlagNames(f.Flags), AgeSeconds: secs(f.Created),
			Text: f.String(now, ifname)}
		if f.Flags&bpf.ConntrackRemote != 0 {
			r.Node = f.Tun.String()
		}
		switch f.Type {
		case bpf.ConntrackFwd:
			r.Backend, r.SourcePort = f.Nat.String(), f.NatSport
			if f.Hairpin.IsValid() {
				r.HairpinSource = f.Hairpin.String()
			}
		case bpf.ConntrackRev:
			r.Frontend, r.ClientPort = f.Nat.String(), f.NatSport
			if f.Hairpin.IsValid() {
				r.HairpinClient = f.Hairpin.String()
			}
			if f.Flags&bpf.ConntrackRedirect != 0 {
				r.Ifindex, r.Interface = f.Ifindex, ifname(int(f.Ifindex))
				r.MACLocal, r.MACPeer = net.HardwareAddr(f.MACLocal[:]).String(), net.HardwareAddr(f.MACPeer[:]).String()
			}
		case bpf.ConntrackTun:
			r.TunnelPeer = f.Nat.Addr().String()
		}
		if f.Type != bpf.ConntrackFwd {
			idle := secs(f.LastSeen)
			r.IdleSeconds = &idle
			if f.Proto == bpf.ProtoTCP {
				r.TCP = bpf.TCPStateNames(f.TCP)
			} else {
				r.Replied = f.TCP&bpf.TCPReplied != 0
			}
		}
		return r
	}
	type entry struct {
		f bpf.Flow
		r conntrackRow
	}
	byKey := make(map[bpf.FlowKey]bpf.Flow, len(flows))
	for _, f := range flows {
		byKey[f.Key()] = f
	}
	var fwd, rest []entry
	for _, f := range flows {
		if forwarded && f.Flags&bpf.ConntrackRemote == 0 && f.Type != bpf.ConntrackTun {
			continue
		}
		e := entry{f, row(f)}
		if f.Type == bpf.ConntrackFwd {
			fwd = append(fwd, e)
		} else {
			rest = append(rest, e)
		}
	}
	byText := func(a, b entry) int { return cmp.Compare(a.r.Text, b.r.Text) }
	slices.SortFunc(fwd, byText)
	paired := map[bpf.FlowKey]bool{}
	out := []conntrackRow{}
	for _, e := range fwd {
		out = append(out, e.r)
		pk := e.f.PairKey()
		if pv, ok := byKey[pk]; ok && pv.Type == bpf.ConntrackRev && (!forwarded || pv.Flags&bpf.ConntrackRemote != 0) {
			out = append(out, row(pv))
			paired[pk] = true
		}
	}
	slices.SortFunc(rest, func(a, b entry) int {
		// Reverse entries before tunnel entries, each in text order.
		return cmp.Or(cmp.Compare(a.f.Type, b.f.Type), byText(a, b))
	})
	for _, e := range rest {
		if !paired[e.f.Key()] {
			out = append(out, e.r)
		}
	}
	return out
}

// counterRow is one datapath counter.
type counterRow struct {
	Name    string `json:"name"`
	Value   uint64 `json:"value"`
	Meaning string `json:"meaning,omitempty"`
}

// counterRows orders the counters: drops, rejects, then the rest, each in the datapath's
// order.
func counterRows(counters map[string]uint64) []counterRow {
	rank := func(name string) int {
		switch {
		case strings.HasPrefix(name, "drop_"):
			return 0
		case strings.HasPrefix(name, "reject_"):
			return 1
		}
		return 2
	}
	var rows []counterRow
	for r := 0; r < 3; r++ {
		for _, name := range bpf.CounterNames {
			if rank(name) == r {
				rows = append(rows, counterRow{Name: name, Value: counters[name], Meaning: bpf.CounterMeanings[name]})
			}
		}
	}
	return rows
}

func writeCounters(w io.Writer, rows []counterRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "COUNTER\tVALUE\tMEANING")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", r.Name, r.Value, r.Meaning)
	}
	return tw.Flush()
}
