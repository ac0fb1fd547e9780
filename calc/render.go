package calc

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
)

// MarshalJSON writes the MAC in its usual colon form.
func (v VTEP) MarshalJSON() ([]byte, error) {
	type plain VTEP
	return json.Marshal(struct {
		plain
		MAC string `json:"mac"`
	}{plain(v), v.MAC.String()})
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func addrOrDash(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}

// gatewaysOrDash is a route's gateways, comma-separated (several: equal-cost multipath).
func gatewaysOrDash(r Route) string {
	gws := r.Gateways()
	if len(gws) == 0 {
		return "-"
	}
	parts := make([]string, len(gws))
	for i, gw := range gws {
		parts[i] = gw.String()
	}
	if r.Recursive {
		return strings.Join(parts, ",") + " (recursive)"
	}
	return strings.Join(parts, ",")
}

// WriteText prints the state as readable tables, one section per kind of object.
func (s *State) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "VTEPS (%d)\n", len(s.VTEPs))
	fmt.Fprintln(tw, "NODE\tTUNNEL\tMAC\tUNDERLAY\tLOCAL")
	for _, v := range s.VTEPs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\n", v.Node, v.TunnelAddr, v.MAC, v.Underlay, v.Local)
	}
	fmt.Fprintf(tw, "\nCLUSTER NETS (%d)\n", len(s.ClusterNets))
	fmt.Fprintln(tw, "PREFIX\tHOST\tNODE\tMASQUERADE\tKEEP-SOURCE")
	for _, c := range s.ClusterNets {
		fmt.Fprintf(tw, "%s\t%t\t%s\t%t\t%t\n", c.Prefix, c.Host, orDash(c.Node), c.Masquerade, c.KeepSource)
	}
	fmt.Fprintf(tw, "\nROUTES (%d)\n", len(s.Routes))
	fmt.Fprintln(tw, "DESTINATION\tTYPE\tVIA\tDEVICE\tONLINK\tMETRIC\tREASON\tNODE")
	uplink := false
	for _, r := range s.Routes {
		uplink = uplink || r.Device == ParentDevice
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\t%d\t%s\t%s\n", r.Dst, r.Type, gatewaysOrDash(r), orDash(DeviceName(r.Device)), r.OnLink, r.Metric, r.Reason, orDash(r.Node))
	}
	if uplink {
		fmt.Fprintln(tw, "(uplink: the node's interface holding its own address, found on the node)")
	}
	fmt.Fprintf(tw, "\nFRONTENDS (%d)\n", len(s.Frontends))
	fmt.Fprintln(tw, "FRONTEND\tKIND\tSERVICE\tFLAGS\tLOCAL\tBACKENDS")
	for _, f := range s.Frontends {
		var flags []string
		if f.ExternalLocal {
			flags = append(flags, "external-local")
		}
		if f.InternalLocal {
			flags = append(flags, "internal-local")
		}
		if f.AffinityTimeout != 0 {
			flags = append(flags, fmt.Sprintf("affinity=%ds", f.AffinityTimeout))
		}
		for _, r := range f.SourceRanges {
			flags = append(flags, "source="+r.String())
		}
		var bs []string
		for i, b := range f.Backends {
			t := ""
			if b.Terminating {
				t = "(terminating)"
			}
			if i < f.ClusterStart {
				t += "(local-only)"
			}
			node := orDash(b.Node)
			if b.Node != "" {
				node += "/" + addrOrDash(b.NodeAddr)
			}
			bs = append(bs, fmt.Sprintf("%s@%s%s", netip.AddrPortFrom(b.Addr, b.Port), node, t))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", f.Key, f.Kind, f.Service, orDash(strings.Join(flags, ",")), f.LocalBackends, orDash(strings.Join(bs, " ")))
	}
	fmt.Fprintf(tw, "\nHEALTH CHECKS (%d)\n", len(s.HealthChecks))
	fmt.Fprintln(tw, "PORT\tSERVICE\tLOCAL-ENDPOINTS\tIPV4\tIPV6")
	for _, h := range s.HealthChecks {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\n", h.Port, h.Service, h.LocalEndpoints, h.LocalIPv4, h.LocalIPv6)
	}
	if len(s.FloatingIPs) > 0 {
		fmt.Fprintf(tw, "\nFLOATING IPS (%d)\n", len(s.FloatingIPs))
		fmt.Fprintln(tw, "EXTERNAL\tINTERNAL\tWORKLOAD")
		for _, f := range s.FloatingIPs {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", f.External, f.Internal, f.Workload)
		}
	}
	if s.BGPSpeaker != nil || len(s.BGPPeers) > 0 || len(s.BGPPaths) > 0 {
		fmt.Fprintln(tw, "\nBGP SPEAKER")
		if sp := s.BGPSpeaker; sp != nil {
			fmt.Fprintln(tw, "AS\tROUTER-ID\tPORT\tIPV4\tIPV6\tREFLECTOR")
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", sp.ASN, sp.RouterID, sp.ListenPort, addrOrDash(sp.Addr4), addrOrDash(sp.Addr6), addrOrDash(sp.ClusterID))
		} else {
			fmt.Fprintln(tw, "none")
		}
		fmt.Fprintf(tw, "\nBGP PEERS (%d)\n", len(s.BGPPeers))
		fmt.Fprintln(tw, "PEER\tAS\tLOCAL-AS\tSOURCE\tFLAGS\tNODE\tORIGIN")
		for _, p := range s.BGPPeers {
			peer := p.Addr.String()
			if p.Port != 0 {
				peer = netip.AddrPortFrom(p.Addr, p.Port).String()
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\n", peer, p.ASN, p.LocalASN, addrOrDash(p.SourceAddr), orDash(p.Flags()), orDash(p.Node), p.Origin)
		}
		fmt.Fprintf(tw, "\nBGP PATHS (%d)\n", len(s.BGPPaths))
		fmt.Fprintln(tw, "PREFIX\tREASON\tCOMMUNITIES")
		for _, p := range s.BGPPaths {
			cs := make([]string, len(p.Communities))
			for i, c := range p.Communities {
				cs[i] = c.String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Prefix, p.Reason, orDash(strings.Join(cs, ",")))
		}
	}
	if len(s.Problems) > 0 {
		fmt.Fprintf(tw, "\nPROBLEMS (%d)\n", len(s.Problems))
		for _, p := range s.Problems {
			fmt.Fprintf(tw, "%s\t%s\n", p.Key, p.Reason)
		}
	}
	return tw.Flush()
}
