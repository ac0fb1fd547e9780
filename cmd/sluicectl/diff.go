package main

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
	"github.com/vishvananda/netns"
)

// runDiff compares this node's kernel with the desired state computed from etcd, writing
// nothing, and exits 1 when they differ. Run it on the node (it reads this network
// namespace's kernel).
func runDiff(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("diff")
	node := fs.String("node", "", "this node's name (required)")
	config := calcFlags(fs)
	var dp dataplane.Config
	fs.IntVar(&dp.Routes.Table, "route-table", 254, "routing table sluice's routes go in")
	fs.IntVar(&dp.Routes.Protocol, "route-protocol", dataplane.DefaultRouteProtocol, "route protocol number of sluice's routes")
	fs.IntVar(&dp.VXLAN.VNI, "vxlan-vni", dataplane.DefaultVNI, "VXLAN network identifier")
	fs.IntVar(&dp.VXLAN.Port, "vxlan-port", dataplane.DefaultVXLANPort, "VXLAN UDP port")
	nodeAddr := fs.String("node-address", "", "this node's underlay address, when VXLAN is off")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	if *node == "" {
		return usagef("need --node NAME")
	}
	cfg, err := config(*node)
	if err != nil {
		return usagef("%v", err)
	}
	dp.VXLAN.Name = cfg.VXLANDevice
	if *nodeAddr != "" {
		if dp.ParentAddr, err = netip.ParseAddr(*nodeAddr); err != nil {
			return usagef("--node-address %q: want an IP address", *nodeAddr)
		}
	}
	g, err := calc.New(cfg)
	if err != nil {
		return usagef("%v", err)
	}
	var full *calc.Update
	if err := a.readUntilInSync(ctx, store.HandlerFunc(func(b []store.Event) {
		if u := g.OnEvents(b); u != nil && u.Full {
			full = u
		}
	})); err != nil {
		return err
	}
	k, err := dataplane.NewKernel(netns.None())
	if err != nil {
		return err
	}
	defer k.Close()
	missing, extra, err := dataplane.Diff(k, dp, full)
	if err != nil {
		return err
	}
	if len(missing) == 0 && len(extra) == 0 {
		fmt.Fprintf(a.stdout, "%s's kernel matches its desired state\n", *node)
		return nil
	}
	fmt.Fprintf(a.stdout, "%s's kernel differs from its desired state:\n", *node)
	for _, m := range missing {
		fmt.Fprintf(a.stdout, "  missing: %s\n", m)
	}
	for _, e := range extra {
		fmt.Fprintf(a.stdout, "  extra:   %s\n", e)
	}
	return errDiffers
}
