package manifest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sluice-net/sluice/store"
	yaml "go.yaml.in/yaml/v3"
)

// ToDocument turns a stored value back into the document that would write it.
func ToDocument(key string, value []byte) (map[string]any, error) {
	kind, id, err := store.ParseKey(key)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", key, err)
	}
	var m map[string]any
	if err := json.Unmarshal(value, &m); err != nil {
		return nil, fmt.Errorf("key %s: not a JSON object: %w", key, err)
	}
	switch kind {
	case store.KindBlock:
		m["kind"] = "Block"
	case store.KindBlockAffinity:
		node, cidr, _ := strings.Cut(id, "/")
		m["kind"], m["node"], m["cidr"] = "BlockAffinity", node, cidr
	default:
		if _, ok := m["kind"]; !ok {
			m["kind"] = kind.String()
		}
	}
	return m, nil
}

// WriteDocuments prints documents as JSON (a List when there is more than one) or YAML.
func WriteDocuments(w io.Writer, format string, docs []map[string]any) error {
	switch format {
	case "json":
		var v any = map[string]any{"kind": "List", "items": docs}
		if len(docs) == 1 {
			v = docs[0]
		}
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		for i, d := range docs {
			if i > 0 {
				if _, err := io.WriteString(w, "---\n"); err != nil {
					return err
				}
			}
			b, err := yaml.Marshal(d)
			if err != nil {
				return err
			}
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown output format %q: want table, yaml or json", format)
}

// Header returns the table columns for a kind.
func Header(k store.Kind) []string {
	switch k {
	case store.KindIPPool:
		return []string{"NAME", "CIDR", "VXLAN", "IPIP", "BLOCKSIZE", "NAT", "DISABLED"}
	case store.KindNode:
		return []string{"NAME", "ADDRESS", "VXLAN-ADDRESS", "VXLAN-MAC", "ADDRESS-V6"}
	case store.KindBlock:
		return []string{"CIDR", "AFFINITY", "IN-USE", "SIZE"}
	case store.KindBlockAffinity:
		return []string{"NODE", "CIDR", "STATE"}
	case store.KindWorkloadEndpoint:
		return []string{"NAMESPACE", "NAME", "NODE", "INTERFACE", "NETWORKS", "ORCHESTRATOR"}
	case store.KindService:
		return []string{"NAMESPACE", "NAME", "TYPE", "CLUSTER-IPS", "EXTERNAL", "PORTS", "POLICY"}
	case store.KindEndpointSlice:
		return []string{"NAMESPACE", "NAME", "SERVICE", "ENDPOINTS", "PORTS"}
	case store.KindBGPConfiguration:
		return []string{"NAME", "AS", "MESH", "PORT", "SERVICE-RANGES"}
	case store.KindBGPPeer:
		return []string{"NAME", "NODES", "PEERS", "AS", "LOCAL-AS"}
	}
	return nil
}

func asString(n uint32) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatUint(uint64(n), 10)
}

func portString(p uint16) string {
	if p == 0 {
		return "-"
	}
	return strconv.Itoa(int(p))
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

func addrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return or(strings.Join(s, ","), "-")
}

func prefixString(p netip.Prefix) string {
	if !p.IsValid() {
		return "-"
	}
	return p.String()
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}

// Row returns an object's table row, matching Header.
func Row(o store.Object) []string {
	switch o := o.(type) {
	case *store.IPPool:
		return []string{o.Name, o.CIDR.String(), string(o.VXLANMode), string(o.IPIPMode), strconv.Itoa(o.BlockSize),
			strconv.FormatBool(o.NATOutgoing), strconv.FormatBool(o.Disabled)}
	case *store.Node:
		mac := "-"
		if o.VXLANTunnelMAC != nil {
			mac = o.VXLANTunnelMAC.String()
		}
		return []string{o.Name, prefixString(o.IPv4Address), addrString(o.IPv4VXLANTunnelAddr), mac, prefixString(o.IPv6Address())}
	case *store.Block:
		return []string{o.CIDR.String(), or(o.Affinity, "-"), strconv.Itoa(len(o.Allocations)), strconv.Itoa(store.BlockSlots(o.CIDR))}
	case *store.BlockAffinity:
		return []string{o.Node, o.CIDR.String(), string(o.State)}
	case *store.WorkloadEndpoint:
		nets := make([]string, len(o.IPNetworks))
		for i, n := range o.IPNetworks {
			nets[i] = n.String()
		}
		return []string{o.Namespace, o.Name, o.Node, o.InterfaceName, or(strings.Join(nets, ","), "-"), or(o.Orchestrator, "-")}
	case *store.Service:
		ports := make([]string, len(o.Ports))
		for i, p := range o.Ports {
			ports[i] = fmt.Sprintf("%d/%s", p.Port, p.Protocol)
			if p.NodePort != 0 {
				ports[i] = fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol)
			}
		}
		ext := append(append([]netip.Addr{}, o.ExternalIPs...), o.LoadBalancerIPs...)
		return []string{o.Namespace, o.Name, string(o.Type), addrs(o.ClusterIPs), addrs(ext), or(strings.Join(ports, ","), "-"),
			"ext=" + string(o.ExternalTrafficPolicy) + ",int=" + string(o.InternalTrafficPolicy)}
	case *store.EndpointSlice:
		eps := make([]string, 0, len(o.Endpoints))
		for _, e := range o.Endpoints {
			state := "ready"
			switch {
			case !e.Ready && e.Serving && e.Terminating:
				state = "terminating"
			case !e.Ready:
				state = "not-ready"
			}
			eps = append(eps, fmt.Sprintf("%s@%s(%s)", addrs(e.Addresses), or(e.NodeName, "?"), state))
		}
		ports := make([]string, len(o.Ports))
		for i, p := range o.Ports {
			ports[i] = fmt.Sprintf("%d/%s", p.Port, p.Protocol)
		}
		return []string{o.Namespace, o.Name, o.Service, or(strings.Join(eps, ","), "-"), or(strings.Join(ports, ","), "-")}
	case *store.BGPConfiguration:
		mesh := strconv.FormatBool(!o.NoNodeToNodeMesh)
		var ranges []string
		for _, ps := range [][]netip.Prefix{o.ServiceClusterIPs, o.ServiceExternalIPs, o.ServiceLoadBalancerIPs} {
			for _, p := range ps {
				ranges = append(ranges, p.String())
			}
		}
		return []string{o.Name, asString(o.ASNumber), mesh, portString(o.ListenPort), or(strings.Join(ranges, ","), "-")}
	case *store.BGPPeer:
		nodes := "all"
		switch {
		case o.Node != "":
			nodes = o.Node
		case o.NodeSelector.Set():
			nodes = o.NodeSelector.String()
		}
		peers := o.PeerSelector.String()
		if o.PeerIP.IsValid() {
			peers = o.PeerIP.String()
			if o.PeerPort != 0 {
				peers = netip.AddrPortFrom(o.PeerIP, o.PeerPort).String()
			}
		}
		return []string{o.Name, nodes, peers, asString(o.ASNumber), asString(o.LocalASNumber)}
	}
	return nil
}

// WriteTable prints objects of one kind as an aligned table.
func WriteTable(w io.Writer, k store.Kind, objs []store.Object) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(Header(k), "\t"))
	for _, o := range objs {
		fmt.Fprintln(tw, strings.Join(Row(o), "\t"))
	}
	return tw.Flush()
}

// WriteSnapshot prints every kind the snapshot holds as a titled table, skipping empty kinds.
func WriteSnapshot(w io.Writer, s *store.Snapshot) error {
	fmt.Fprintf(w, "revision %d, in sync: %t\n", s.Revision(), s.InSync())
	for _, k := range store.Kinds {
		objs := s.List(k)
		if len(objs) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s (%d)\n", strings.ToUpper(k.Plural()), len(objs))
		if err := WriteTable(w, k, objs); err != nil {
			return err
		}
	}
	return nil
}
