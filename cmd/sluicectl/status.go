package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-net/sluice/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// statusRow is one node as `sluicectl status` sees it.
type statusRow struct {
	Node   string            `json:"node"`
	State  string            `json:"state"`
	Lag    int64             `json:"lagRevisions,omitempty"`
	Status *store.NodeStatus `json:"status,omitempty"`
}

func runStatus(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("status")
	output := outputFlag(fs, "table or json")
	settle := fs.Duration("settle", 6*time.Second, "how long to wait for nodes behind the newest revision to report before calling them lagging (agents pace revision-only reports to every 5 s)")
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
	cli, ctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	latest, err := latestRevision(ctx, cli)
	if err != nil {
		return err
	}
	var rows []statusRow
	for deadline := time.Now().Add(*settle); ; {
		if rows, err = nodeStatuses(ctx, cli, latest); err != nil {
			return err
		}
		lagging := false
		for _, r := range rows {
			lagging = lagging || r.Lag > 0
		}
		if !lagging || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if *output == "json" {
		b, err := json.MarshalIndent(rows, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", b)
		return err
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tREVISION\tAPPLIED\tROUTES\tBAD-VALUES\tPROBLEMS\tLEFTOVERS\tSERVICES\tBGP\tLAST-ERROR")
	for _, r := range rows {
		if r.Status == nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\n", r.Node, r.State)
			continue
		}
		s := r.Status
		bgp := "-"
		if s.BGPSessions > 0 {
			bgp = fmt.Sprintf("%d/%d up", s.BGPSessionsUp, s.BGPSessions)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d/%d\t%d\t%d\t%s\t%s\t%s\t%s\n", r.Node, r.State, s.Revision, s.AppliedRevision, s.RoutesProgrammed, s.RoutesDesired, s.BadValues, s.Problems,
			leftoverCounts(s), or(s.Services, "off"), bgp, or(s.LastError, "-"))
	}
	return tw.Flush()
}

// latestRevision is the newest revision of the keys sluice reads: the yardstick.
func latestRevision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	var latest int64
	for _, p := range store.WatchedPrefixes {
		resp, err := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend),
			clientv3.WithLimit(1), clientv3.WithKeysOnly())
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", p, err)
		}
		if len(resp.Kvs) > 0 {
			latest = max(latest, resp.Kvs[0].ModRevision)
		}
	}
	return latest, nil
}

// nodeStatuses joins Calico's nodes with the agents' status keys: an agent that is ready, in
// sync and applied latest is in sync; one with an error is failing; one behind lags.
func nodeStatuses(ctx context.Context, cli *clientv3.Client, latest int64) ([]statusRow, error) {
	rows := map[string]*statusRow{}
	nodes, err := cli.Get(ctx, store.NodePrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("reading nodes: %w", err)
	}
	seen, err := cli.Get(ctx, store.SeenPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("reading which nodes ran an agent: %w", err)
	}
	started := map[string]string{}
	for _, kv := range seen.Kvs {
		started[string(kv.Key)[len(store.SeenPrefix):]] = string(kv.Value)
	}
	for _, kv := range nodes.Kvs {
		name := string(kv.Key)[len(store.NodePrefix):]
		state := "no agent (none ever reported)"
		if at, ok := started[name]; ok {
			state = "gone (its agent last started " + at + ")"
		}
		rows[name] = &statusRow{Node: name, State: state}
	}
	st, err := cli.Get(ctx, store.StatusPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("reading statuses: %w", err)
	}
	for _, kv := range st.Kvs {
		var s store.NodeStatus
		if err := json.Unmarshal(kv.Value, &s); err != nil {
			name := string(kv.Key)[len(store.StatusPrefix):]
			rows[name] = &statusRow{Node: name, State: "unreadable status: " + err.Error()}
			continue
		}
		r := rows[s.Node]
		if r == nil {
			r = &statusRow{Node: s.Node}
			rows[s.Node] = r
		}
		r.Status = &s
		switch {
		case s.LastError != "":
			r.State = "failing"
		case strings.HasPrefix(s.Services, "down"):
			r.State = "services down (routes programmed)"
		case !s.InSync:
			r.State = "not in sync with etcd"
		case !s.Ready && s.AppliedRevision == 0:
			r.State = "starting"
		case s.Ready && s.AppliedRevision >= latest:
			r.State = "in sync"
		default:
			r.Lag = latest - s.AppliedRevision
			r.State = "lagging by " + strconv.FormatInt(r.Lag, 10)
		}
	}
	out := make([]statusRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// leftoverCounts says how many leftovers the node's agent found: "2 breaking", "1 dormant",
// "1 breaking, 3 dormant", or "-" (`sluicectl leftovers` on the node names them).
func leftoverCounts(s *store.NodeStatus) string {
	var parts []string
	if s.LeftoversBreaking > 0 {
		parts = append(parts, fmt.Sprintf("%d breaking", s.LeftoversBreaking))
	}
	if s.LeftoversDormant > 0 {
		parts = append(parts, fmt.Sprintf("%d dormant", s.LeftoversDormant))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
