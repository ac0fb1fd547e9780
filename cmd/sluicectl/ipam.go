package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sluice-net/sluice/store/ipam"
)

const ipamUsage = `ipam claim   --node NODE --pool POOL [--cidr BLOCK]
ipam assign  --node NODE --handle HANDLE [--pool POOL]
             [--ip ADDR | --count N] [--attr KEY=VALUE ...]
ipam release --handle HANDLE | --ip ADDR
ipam show`

// ipamSubcommands are ipam's subcommands, each with its own flags.
var ipamSubcommands = []string{"claim", "assign", "release", "show"}

func runIPAM(ctx context.Context, a *app, args []string) error {
	if len(args) == 0 {
		return usagef("want a subcommand:\n%s", ipamUsage)
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(a.stdout, "usage:\n%s\n\nsluicectl ipam SUBCOMMAND --help lists a subcommand's flags.\n", ipamUsage)
		return nil
	}
	if !slices.Contains(ipamSubcommands, sub) {
		return usagef("unknown ipam subcommand %q:\n%s", sub, ipamUsage)
	}
	// Each subcommand has its own flags, so that its --help lists only those.
	fs := a.flagSet("ipam " + sub)
	var node, pool, cidr, handle, ip *string
	count := new(int)
	var attrs stringList
	str := func(name, help string) *string { return fs.String(name, "", help) }
	switch sub {
	case "claim":
		node, pool = str("node", "node name"), str("pool", "IP pool name")
		cidr = str("cidr", "the block to claim (default: the pool's first free block)")
	case "assign":
		node, handle = str("node", "node name"), str("handle", "IPAM handle the addresses are held under")
		pool = str("pool", "IP pool name (default: any pool that may serve the node)")
		ip = str("ip", "one exact address")
		count = fs.Int("count", 1, "how many addresses to assign")
		fs.Var(&attrs, "attr", "KEY=VALUE attribute stored with the allocation (repeatable)")
	case "release":
		handle, ip = str("handle", "IPAM handle whose addresses to release"), str("ip", "one exact address to release")
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	parseIP := func() (netip.Addr, error) {
		if *ip == "" {
			return netip.Addr{}, nil
		}
		addr, err := netip.ParseAddr(*ip)
		if err != nil {
			return netip.Addr{}, usagef("--ip %q is not an IP address", *ip)
		}
		return addr, nil
	}
	cli, ctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	m := ipam.New(cli)

	switch sub {
	case "claim":
		if *node == "" || *pool == "" {
			return usagef("claim needs --node and --pool")
		}
		var want netip.Prefix
		if *cidr != "" {
			if want, err = netip.ParsePrefix(*cidr); err != nil {
				return usagef("--cidr %q is not a CIDR", *cidr)
			}
		}
		got, err := m.ClaimBlock(ctx, *node, *pool, want)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "claimed %s for %s\n", got, *node)
	case "assign":
		if *node == "" || *handle == "" {
			return usagef("assign needs --node and --handle")
		}
		addr, err := parseIP()
		if err != nil {
			return err
		}
		req := ipam.AssignRequest{Handle: *handle, Node: *node, Pool: *pool, IP: addr, Count: *count, Attrs: map[string]string{}}
		for _, kv := range attrs {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usagef("--attr %q: want KEY=VALUE", kv)
			}
			req.Attrs[k] = v
		}
		got, err := m.Assign(ctx, req)
		if err != nil {
			return err
		}
		for _, g := range got {
			fmt.Fprintln(a.stdout, g)
		}
	case "release":
		addr, err := parseIP()
		if err != nil {
			return err
		}
		switch {
		case *handle != "" && addr.IsValid():
			return usagef("release takes --handle or --ip, not both")
		case *handle != "":
			got, err := m.Release(ctx, *handle)
			if err != nil {
				return err
			}
			for _, g := range got {
				fmt.Fprintf(a.stdout, "released %s\n", g)
			}
		case addr.IsValid():
			if err := m.ReleaseIP(ctx, addr); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "released %s\n", addr)
		default:
			return usagef("release needs --handle or --ip")
		}
	case "show":
		rows, err := m.Usage(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "POOL\tNODE\tBLOCKS\tIN-USE\tTOTAL\tUSED%")
		for _, r := range rows {
			pct := "0"
			if r.Total > 0 {
				pct = strconv.FormatFloat(100*float64(r.InUse)/float64(r.Total), 'f', 1, 64)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", or(r.Pool, "-"), or(r.Node, "-"), r.Blocks, r.InUse, r.Total, pct)
		}
		return tw.Flush()
	default:
		return usagef("unknown ipam subcommand %q:\n%s", sub, ipamUsage)
	}
	return nil
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}
