package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-net/sluice/bgp"
	"github.com/sluice-net/sluice/calc"
)

const bgpUsage = `usage: sluicectl bgp [--agent HOST:PORT] [--config FILE] [--routes]
                     [-o table|json]

On a node: the BGP sessions of its sluiced (option bgp), as its health endpoint
(/bgp) reports them: each peer's address, AS, state, since when, and the
prefixes received from it, accepted of those, and announced to it. --routes
lists the speaker's table too: each prefix, its next hops and where it was
learned ("local": this node's own announcement).

`

// bgpReport is what sluiced's /bgp answers.
type bgpReport struct {
	Sessions []bgp.Session `json:"sessions"`
	Routes   []bgp.Route   `json:"routes"`
}

func runBGP(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("bgp")
	output := outputFlag(fs, "table or json")
	agentAddr := fs.String("agent", "", "sluiced's health endpoint (default: its option health-listen)")
	configFile := fs.String("config", "", "sluiced's configuration file, for its health-listen (default: SLUICE_CONFIG, or /etc/sluice/sluiced.yaml when present)")
	routes := fs.Bool("routes", false, "list the speaker's table too")
	fs.Usage = func() {
		fmt.Fprint(a.stderr, bgpUsage)
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
	addr := *agentAddr
	if addr == "" {
		c, err := a.agentConfig(*configFile)
		if err != nil {
			return err
		}
		if addr = c.HealthListen; addr == "" {
			return fmt.Errorf("sluiced's health endpoint is off (option health-listen): nothing to ask; give --agent")
		}
		if !c.Calc.BGP {
			fmt.Fprintln(a.stderr, "sluicectl: sluiced's configuration has BGP off (option bgp)")
		}
	}
	r, err := fetchBGP(ctx, addr, cmp.Or(a.timeout, 5*time.Second))
	if err != nil {
		return err
	}
	if !*routes {
		r.Routes = nil
	}
	if *output == "json" {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", b)
		return err
	}
	return writeBGP(a.stdout, r, *routes, time.Now())
}

func writeBGP(w io.Writer, r bgpReport, routes bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tAS\tLOCAL-AS\tSTATE\tSINCE\tRECEIVED\tACCEPTED\tANNOUNCED\tORIGIN")
	for _, s := range r.Sessions {
		since := "-"
		if !s.Since.IsZero() {
			since = now.Sub(s.Since).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%s\n", s.Peer, s.ASN, s.LocalASN, s.State, since, s.Received, s.Accepted, s.Advertised, or(s.Origin, "-"))
	}
	if routes {
		fmt.Fprintf(tw, "\nROUTES (%d)\n", len(r.Routes))
		fmt.Fprintln(tw, "PREFIX\tNEXT-HOPS\tFROM")
		for _, rt := range r.Routes {
			hops := make([]string, len(rt.NextHops))
			for i, h := range rt.NextHops {
				hops[i] = h.String()
			}
			from := "local"
			if rt.Peer.IsValid() && rt.Peer != (netip.Addr{}) {
				from = rt.Peer.String()
			}
			if rt.Stale {
				from += " (stale)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", rt.Prefix, or(strings.Join(hops, ","), "-"), from)
		}
	}
	return tw.Flush()
}

// fetchBGP asks sluiced's health endpoint at addr for its BGP report.
func fetchBGP(ctx context.Context, addr string, timeout time.Duration) (bgpReport, error) {
	var r bgpReport
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+addr+"/bgp", nil)
	if err != nil {
		return r, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return r, fmt.Errorf("asking sluiced at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return r, err
	}
	if resp.StatusCode == http.StatusNotFound {
		return r, fmt.Errorf("sluiced at %s runs no BGP speaker (option bgp is off)", addr)
	}
	if resp.StatusCode != http.StatusOK {
		return r, fmt.Errorf("sluiced at %s: %s: %s", addr, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return r, fmt.Errorf("sluiced at %s answered what is not a BGP report: %w", addr, err)
	}
	return r, nil
}

// learnedOf is what the speaker learned from its peers, as calc takes it.
func learnedOf(r bgpReport) []calc.Learned {
	var out []calc.Learned
	for _, rt := range r.Routes {
		if rt.Peer.IsValid() && len(rt.NextHops) > 0 {
			out = append(out, calc.Learned{Prefix: rt.Prefix, NextHops: rt.NextHops})
		}
	}
	return out
}
