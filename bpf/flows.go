package bpf

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Flow is a connection-table entry of either family, for operators' tools (sluicectl
// services, ConntrackString): the key's tuple and the value's fields with addresses and ports
// as they read.
type Flow struct {
	Src, Dst netip.AddrPort
	Proto    uint8
	Type     uint8 // ConntrackFwd, ConntrackRev, ConntrackTun
	Flags    uint8
	TCP      uint8 // the state bits (reverse and tunnel entries)
	Created  uint64
	LastSeen uint64
	Ifindex  uint32 // a reverse entry's way back (ConntrackRedirect)
	// Nat is the backend of a forward entry, the frontend of a reverse entry, the ingress
	// node of a tunnel entry (port 0).
	Nat netip.AddrPort
	// NatSport is the source port towards the backend (forward) or the client's own (reverse).
	NatSport uint16
	// Tun is the backend's node of a flow forwarded through the tunnel (ConntrackRemote).
	Tun netip.Addr
	// Hairpin is the hairpin source (forward) or the client's own address (reverse) of a
	// workload reaching itself; invalid for other flows.
	Hairpin           netip.Addr
	MACLocal, MACPeer [6]byte
}

// FlowOf reads an IPv4 connection-table entry.
func FlowOf(k ConntrackKey, v ConntrackValue) Flow {
	f := Flow{Src: netip.AddrPortFrom(HostAddr(k.Src), HostPort(k.Sport)), Dst: netip.AddrPortFrom(HostAddr(k.Dst), HostPort(k.Dport)),
		Proto: k.Proto, Type: v.Type, Flags: v.Flags, TCP: v.Tcp, Created: v.Created, LastSeen: v.LastSeen, Ifindex: v.Ifindex,
		Nat: netip.AddrPortFrom(HostAddr(v.NatAddr), HostPort(v.NatPort)), NatSport: HostPort(v.NatSport),
		MACLocal: v.MacLocal, MACPeer: v.MacPeer}
	if v.Flags&ConntrackRemote != 0 {
		f.Tun = HostAddr(v.TunAddr)
	}
	if v.NatSaddr != 0 {
		f.Hairpin = HostAddr(v.NatSaddr)
	}
	return f
}

// FlowOf6 reads an IPv6 connection-table entry.
func FlowOf6(k ConntrackKey6, v ConntrackValue6) Flow {
	f := Flow{Src: netip.AddrPortFrom(hostAddr6(k.Src), HostPort(k.Sport)), Dst: netip.AddrPortFrom(hostAddr6(k.Dst), HostPort(k.Dport)),
		Proto: k.Proto, Type: v.Type, Flags: v.Flags, TCP: v.Tcp, Created: v.Created, LastSeen: v.LastSeen, Ifindex: v.Ifindex,
		Nat: netip.AddrPortFrom(hostAddr6(v.NatAddr), HostPort(v.NatPort)), NatSport: HostPort(v.NatSport),
		MACLocal: v.MacLocal, MACPeer: v.MacPeer}
	if v.Type == ConntrackTun {
		f.Nat = netip.AddrPortFrom(HostAddr6(v.NatAddr), 0) // a node: IPv4-mapped reads as IPv4
	}
	if v.Flags&ConntrackRemote != 0 {
		f.Tun = HostAddr6(v.TunAddr)
	}
	if v.NatSaddr != (Addr6{}) {
		f.Hairpin = hostAddr6(v.NatSaddr)
	}
	return f
}

// FlowKey is a flow's tuple: the key of its entry, family-neutral.
type FlowKey struct {
	Src, Dst netip.AddrPort
	Proto    uint8
}

// Key is the flow's own key.
func (f Flow) Key() FlowKey { return FlowKey{f.Src, f.Dst, f.Proto} }

// PairKey is the key of the other entry of a NAT pair (PairKey for either family); the zero
// key for a tunnel entry.
func (f Flow) PairKey() FlowKey {
	switch f.Type {
	case ConntrackRev:
		client := f.Dst.Addr()
		if f.Hairpin.IsValid() {
			client = f.Hairpin
		}
		return FlowKey{netip.AddrPortFrom(client, f.NatSport), f.Nat, f.Proto}
	case ConntrackFwd:
		client := f.Src.Addr()
		if f.Hairpin.IsValid() {
			client = f.Hairpin
		}
		return FlowKey{f.Nat, netip.AddrPortFrom(client, f.NatSport), f.Proto}
	}
	return FlowKey{}
}

// Conntrack entries of both families, read as flows.
func (p *Pinned) Flows() ([]Flow, error) {
	ct, err := p.Conntrack()
	if err != nil {
		return nil, err
	}
	ct6, err := p.Conntrack6()
	if err != nil {
		return nil, err
	}
	out := make([]Flow, 0, len(ct)+len(ct6))
	for k, v := range ct {
		out = append(out, FlowOf(k, v))
	}
	for k, v := range ct6 {
		out = append(out, FlowOf6(k, v))
	}
	return out, nil
}

// String describes the flow's entry for operators: its kind, protocol and tuple as the
// packets carry it, the translation and where the packets go, its flags, TCP state, idle time
// and age (now is CLOCK_MONOTONIC in ns, Monotonic()). ifname, when not nil, names the
// interface of a redirect ("" when it does not know it).
func (f Flow) String(now uint64, ifname func(int) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s → %s", ConntrackKind(f.Type), ProtoName(f.Proto), f.Src, f.Dst)
	switch f.Type {
	case ConntrackFwd:
		fmt.Fprintf(&b, " dnat to %s", f.Nat)
		if f.Flags&ConntrackRemote != 0 {
			fmt.Fprintf(&b, " via node %s", f.Tun)
		}
		if f.Hairpin.IsValid() {
			fmt.Fprintf(&b, " from %s (hairpin)", netip.AddrPortFrom(f.Hairpin, f.NatSport))
		} else if f.NatSport != f.Src.Port() || f.Flags&ConntrackPSNAT != 0 {
			fmt.Fprintf(&b, " from port %d", f.NatSport)
		}
	case ConntrackRev:
		if f.Hairpin.IsValid() {
			fmt.Fprintf(&b, " reply as %s to client %s (hairpin)", f.Nat, netip.AddrPortFrom(f.Hairpin, f.NatSport))
		} else {
			fmt.Fprintf(&b, " reply as %s to client port %d", f.Nat, f.NatSport)
		}
		if f.Flags&ConntrackRemote != 0 {
			fmt.Fprintf(&b, " tunnelled from node %s", f.Tun)
		}
		if f.Flags&ConntrackRedirect != 0 {
			fmt.Fprintf(&b, " out ifindex %d", f.Ifindex)
			if ifname != nil {
				if name := ifname(int(f.Ifindex)); name != "" {
					fmt.Fprintf(&b, " (%s)", name)
				}
			}
			fmt.Fprintf(&b, " to %s from %s", net.HardwareAddr(f.MACPeer[:]), net.HardwareAddr(f.MACLocal[:]))
		} else {
			b.WriteString(" out by the kernel's route")
		}
	case ConntrackTun:
		fmt.Fprintf(&b, " tunnel back to %s", f.Nat.Addr())
	}
	if fl := ConntrackFlagNames(f.Flags); len(fl) > 0 {
		b.WriteString(" flags " + strings.Join(fl, ","))
	}
	// Only reverse and tunnel entries keep the TCP state and the last packet's time; a
	// forward entry's last_seen is its creation. Other protocols keep only "replied".
	if f.Type != ConntrackFwd {
		if f.Proto == ProtoTCP {
			st := TCPStateNames(f.TCP)
			if len(st) == 0 {
				st = []string{"none"}
			}
			b.WriteString(" tcp " + strings.Join(st, ","))
		} else if f.TCP&TCPReplied != 0 {
			b.WriteString(" replied")
		}
		fmt.Fprintf(&b, " idle %s", since(now, f.LastSeen))
	}
	fmt.Fprintf(&b, " age %s", since(now, f.Created))
	return b.String()
}
