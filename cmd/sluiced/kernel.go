package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/rs/zerolog"
	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/vishvananda/netns"
)

// kernelFeatures is what the agent asks of the running kernel, the service stage's features
// (bpf.ProbeFeatures) after the dataplane's: nexthop objects and nftables.
func kernelFeatures() []bpf.Feature {
	var out []bpf.Feature
	k, err := dataplane.NewKernel(netns.None())
	if err != nil {
		out = append(out, bpf.Feature{Name: "netlink-route", Since: "any", Without: "no agent", Err: err})
	} else {
		out = append(out,
			bpf.Feature{Name: "nexthop-objects", Since: "5.3", Without: "routes to other nodes carry their own gateways (route-layout gateways)", Err: k.NexthopsSupported()},
			bpf.Feature{Name: "nftables", Since: "3.13", Without: "no outgoing NAT (natOutgoing) and no floating IPs", Err: k.NATSupported()})
		k.Close()
	}
	return append(out, bpf.ProbeFeatures()...)
}

// checkKernel prints what the kernel has of what sluice uses (sluiced --check-kernel) and
// reports whether sluice can do its whole job on it: everything found, but TCX and syscall
// programs, for which classic tc and a user-space cleaner stand in.
func checkKernel(w io.Writer) bool {
	fmt.Fprintf(w, "Linux %s\n\n", bpf.KernelRelease())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FEATURE\tSINCE\tFOUND\tWITHOUT IT")
	whole := true
	for _, f := range kernelFeatures() {
		found := "yes"
		if !f.Found() {
			found = "no: " + f.Err.Error()
			whole = whole && hasStandIn(f.Name)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Name, f.Since, found, f.Without)
	}
	_ = tw.Flush()
	if whole {
		fmt.Fprintln(w, "\nsluice can do its whole job on this kernel.")
	} else {
		fmt.Fprintln(w, "\nsluice runs on this kernel without what is missing above (the agent says so at start, and /readyz while services cannot run).")
	}
	return whole
}

// logKernel says at start, in one line, what the kernel has of what sluice uses.
func logKernel(log zerolog.Logger) {
	var found, missing []string
	for _, f := range kernelFeatures() {
		if f.Found() {
			found = append(found, f.Name)
		} else {
			missing = append(missing, f.Name+" ("+f.Since+")")
		}
	}
	ev := log.Info()
	if len(missing) > 0 {
		ev = log.Warn()
	}
	ev.Str("kernel", bpf.KernelRelease()).Str("found", strings.Join(found, ",")).Str("missing", strings.Join(missing, ",")).
		Msg("kernel features (sluiced --check-kernel explains each)")
}

// hasStandIn says whether sluice does the feature's job another way where the kernel lacks it.
func hasStandIn(feature string) bool { return feature == "tcx" || feature == "syscall-programs" }
