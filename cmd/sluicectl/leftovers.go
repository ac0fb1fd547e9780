package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/google/nftables"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/cmd/internal/agentconfig"
	"github.com/sluice-net/sluice/dataplane"
)

const leftoversUsage = `usage: sluicectl leftovers [--cgroup DIR] [--pin-dir DIR] [--config FILE]
                           [-o table|json]

On a node, as root: lists what other networking software left on the hooks
sluice's programs hold — XDP programs on their interfaces, TCX programs, classic
tc bpf filters, and programs on the cgroup socket hooks (connect, sendmsg,
recvmsg, getpeername) — and other products' netfilter chains (kube-proxy's
KUBE-*, Calico's cali-*, Cilium's CILIUM_*) and their pins on sluice's bpffs
(calico/, cilium/, tc/globals/), each with its owner when its name gives it away
(calico, cilium), whether it breaks one of sluice's paths (it sees the packets
first) or is dormant behind sluice's program, which path, and the command that
removes it. It reads the kernel only; sluiced removes the breaking ones of a
recognised owner when started with --clean-conflicts. Exits 1 when anything
breaking is present: the first thing to run after migrating a node to sluice.

flags:
`

// leftoverJSON is one leftover as -o json prints it.
type leftoverJSON struct {
	Kind   string `json:"kind"`
	Where  string `json:"where"`
	What   string `json:"what"`
	Owner  string `json:"owner"`
	Effect string `json:"effect"`
	Breaks string `json:"breaks"`
	Fix    string `json:"fix"`
}

// runLeftovers lists other software's programs on sluice's hooks in this node's kernel.
func runLeftovers(_ context.Context, a *app, args []string) error {
	fs := a.flagSet("leftovers")
	output := outputFlag(fs, "table or json")
	configFile := fs.String("config", "", "sluiced's configuration file, for its cgroup (default: SLUICE_CONFIG, or "+agentconfig.DefaultConfigFile+" when present)")
	cgroup := fs.String("cgroup", "", "the cgroup v2 directory sluiced's socket programs use (default: its option cgroup-path)")
	pinDir := fs.String("pin-dir", "", "sluiced's pin directory, whose bpffs is searched for other products' pins (default: its option bpf-pin-dir)")
	fs.Usage = func() {
		fmt.Fprint(a.stderr, leftoversUsage)
		printFlags(a.stderr, fs)
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	if err := tableOrJSON(*output); err != nil {
		return err
	}
	found, err := bpf.HookConflicts()
	if err != nil && len(found) == 0 {
		return fmt.Errorf("reading the hooks: %w", err)
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "sluicectl: some hooks could not be read: %v\n", err)
	}
	path, pins := *cgroup, *pinDir
	if path == "" || pins == "" {
		agent, err := a.agentConfig(*configFile)
		if err != nil {
			return err
		}
		path, pins = cmp.Or(path, agent.BPF.CgroupPath), cmp.Or(pins, agent.BPF.PinDir)
	}
	found = append(found, bpf.ForeignPins(filepath.Dir(pins))...)
	found = append(found, bpf.KubeIPVS(func() map[netip.Addr]bool {
		frontends := map[netip.Addr]bool{}
		if p, err := bpf.OpenPinned(pins); err == nil {
			if fa, err := bpf.PinnedFrontendAddrs(p.Tables()); err == nil {
				frontends = fa
			}
			p.Close()
		}
		return frontends
	})...)
	if path != "none" {
		cf, err := bpf.CgroupConflicts(path)
		if err != nil {
			fmt.Fprintf(a.stderr, "sluicectl: the cgroup socket hooks could not be read: %v\n", err)
		}
		found = append(found, cf...)
	}
	rows := make([]leftoverJSON, 0, len(found))
	for _, c := range found {
		rows = append(rows, leftoverJSON{Kind: c.Kind, Where: c.Where(), What: c.What, Owner: ownerName(c.Owner),
			Effect: c.Effect(), Breaks: c.Breaks, Fix: c.Fix})
	}
	if nc, err := nftables.New(); err != nil {
		fmt.Fprintf(a.stderr, "sluicectl: netfilter could not be read: %v\n", err)
	} else {
		nf, err := dataplane.FindNetfilter(nc, dataplane.NetfilterView{SocketProgramsOff: path == "none"})
		if err != nil {
			fmt.Fprintf(a.stderr, "sluicectl: some of netfilter could not be read: %v\n", err)
		}
		for _, n := range nf {
			rows = append(rows, leftoverJSON{Kind: "netfilter", Where: n.Family + " " + n.Table, What: n.String(), Owner: ownerName(n.Owner),
				Effect: n.Effect(), Breaks: strings.Join(n.Breaks, "; "), Fix: n.Fix})
		}
	}
	breaking := 0
	for _, r := range rows {
		if r.Effect == "breaking" {
			breaking++
		}
	}
	if *output == "json" {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			return err
		}
	} else {
		writeLeftovers(a.stdout, rows, breaking)
	}
	if breaking > 0 {
		return errDiffers
	}
	return nil
}

func ownerName(o string) string {
	if o == "" {
		return "unknown"
	}
	return o
}

// writeLeftovers prints the table, then what each breaking one breaks.
func writeLeftovers(w io.Writer, rows []leftoverJSON, breaking int) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "no other software's programs on sluice's hooks, nor its netfilter rules")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EFFECT\tKIND\tOWNER\tWHERE\tWHAT\tFIX")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Effect, r.Kind, r.Owner, r.Where, r.What, r.Fix)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\n%d breaking, %d dormant or unknown (dormant: acts only if sluice's programs go)\n", breaking, len(rows)-breaking)
	for _, r := range rows {
		if r.Effect == "breaking" {
			fmt.Fprintf(w, "  %s on %s breaks %s\n", r.What, r.Where, r.Breaks)
		}
	}
}
