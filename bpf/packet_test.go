package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// A small packet builder and decoder for the program tests: Ethernet, IPv4 (with options and
// fragments), TCP, UDP, ICMP and VXLAN (an Ethernet frame inside UDP). Building always computes lengths
// and checksums from scratch; decoding checks every checksum by recomputing it, so an
// output compared byte for byte with a built frame has correct checksums, and a decoded
// one says which checksum is wrong when it is not.

const (
	tpProtoICMP = 1
	tpProtoTCP  = 6
	tpProtoUDP  = 17

	tpFIN = 0x01
	tpSYN = 0x02
	tpRST = 0x04
	tpPSH = 0x08
	tpACK = 0x10

	tpDF = 0x4000 // IPv4 don't fragment
)

type tpMAC [6]byte

func (m tpMAC) String() string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

type tpIPv4 struct {
	TOS    uint8
	TotLen uint16 // set by build
	ID     uint16
	Frag   uint16 // flags and fragment offset as in the header
	TTL    uint8
	Proto  uint8
	Check  uint16 // set by build
	Src    netip.Addr
	Dst    netip.Addr
	// Options follow the fixed header (a multiple of 4 bytes: the header length grows).
	Options []byte
}

type tpTCP struct {
	Sport, Dport uint16
	Seq, Ack     uint32
	Flags        uint8
	Window       uint16
	Check        uint16 // set by build
	Urgent       uint16
	Options      []byte // a multiple of 4 bytes
}

type tpUDP struct {
	Sport, Dport uint16
	Len          uint16 // set by build
	Check        uint16 // set by build
	ZeroCheck    bool   // send (or received) without checksum, as VXLAN does
}

type tpICMP struct {
	Type, Code uint8
	Check      uint16 // set by build
	Rest       uint32 // the second word: for fragmentation-needed, unused<<16 | MTU
}

// tpFrame is an Ethernet frame carrying IPv4. The transport header used is the one IP.Proto
// names. A UDP frame with Inner set is VXLAN: an 8-byte VXLAN header, then Inner.
type tpFrame struct {
	Dst, Src tpMAC
	IP       tpIPv4
	TCP      tpTCP
	UDP      tpUDP
	ICMP     tpICMP
	VXFlags  uint8
	VNI      uint32
	Inner    *tpFrame
	Payload  []byte // after the transport header (for ICMP errors: the quoted packet)
}

// tpChecksum is the Internet checksum (RFC 1071) of data.
func tpChecksum(data []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(data); i += 2 {
		sum += uint32(data[i])<<8 | uint32(data[i+1])
	}
	if len(data)%2 == 1 {
		sum += uint32(data[len(data)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func tpPseudo(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	b := make([]byte, 0, 12+len(l4))
	b = append(b, src.AsSlice()...)
	b = append(b, dst.AsSlice()...)
	b = append(b, 0, proto)
	b = binary.BigEndian.AppendUint16(b, uint16(len(l4)))
	return append(b, l4...)
}

// clone copies f deeply enough that changing the copy's Inner, options or payload leaves f
// alone.
func (f tpFrame) clone() tpFrame {
	c := f
	c.TCP.Options = bytes.Clone(f.TCP.Options)
	c.Payload = bytes.Clone(f.Payload)
	if f.Inner != nil {
		in := f.Inner.clone()
		c.Inner = &in
	}
	return c
}

// build serialises f, filling in lengths and checksums.
func (f tpFrame) build() []byte {
	var l4 []byte
	switch f.IP.Proto {
	case tpProtoTCP:
		t := f.TCP
		if len(t.Options)%4 != 0 {
			panic("tcp options must be a multiple of 4 bytes")
		}
		l4 = binary.BigEndian.AppendUint16(l4, t.Sport)
		l4 = binary.BigEndian.AppendUint16(l4, t.Dport)
		l4 = binary.BigEndian.AppendUint32(l4, t.Seq)
		l4 = binary.BigEndian.AppendUint32(l4, t.Ack)
		l4 = append(l4, uint8((20+len(t.Options))/4)<<4, t.Flags)
		l4 = binary.BigEndian.AppendUint16(l4, t.Window)
		l4 = append(l4, 0, 0)
		l4 = binary.BigEndian.AppendUint16(l4, t.Urgent)
		l4 = append(l4, t.Options...)
		l4 = append(l4, f.Payload...)
		binary.BigEndian.PutUint16(l4[16:], tpChecksum(tpPseudo(f.IP.Src, f.IP.Dst, tpProtoTCP, l4)))
	case tpProtoUDP:
		payload := f.Payload
		if f.Inner != nil {
			vx := []byte{f.VXFlags, 0, 0, 0, byte(f.VNI >> 16), byte(f.VNI >> 8), byte(f.VNI), 0}
			payload = append(vx, f.Inner.build()...)
		}
		l4 = binary.BigEndian.AppendUint16(l4, f.UDP.Sport)
		l4 = binary.BigEndian.AppendUint16(l4, f.UDP.Dport)
		l4 = binary.BigEndian.AppendUint16(l4, uint16(8+len(payload)))
		l4 = append(l4, 0, 0)
		l4 = append(l4, payload...)
		if !f.UDP.ZeroCheck {
			c := tpChecksum(tpPseudo(f.IP.Src, f.IP.Dst, tpProtoUDP, l4))
			if c == 0 {
				c = 0xffff
			}
			binary.BigEndian.PutUint16(l4[6:], c)
		}
	case tpProtoICMP:
		l4 = append(l4, f.ICMP.Type, f.ICMP.Code, 0, 0)
		l4 = binary.BigEndian.AppendUint32(l4, f.ICMP.Rest)
		l4 = append(l4, f.Payload...)
		binary.BigEndian.PutUint16(l4[2:], tpChecksum(l4))
	default:
		l4 = append(l4, f.Payload...)
	}
	if len(f.IP.Options)%4 != 0 || len(f.IP.Options) > 40 {
		panic("IP options must be a multiple of 4 bytes, at most 40")
	}
	hlen := 20 + len(f.IP.Options)
	ip := []byte{0x40 | byte(hlen/4), f.IP.TOS}
	ip = binary.BigEndian.AppendUint16(ip, uint16(hlen+len(l4)))
	ip = binary.BigEndian.AppendUint16(ip, f.IP.ID)
	ip = binary.BigEndian.AppendUint16(ip, f.IP.Frag)
	ip = append(ip, f.IP.TTL, f.IP.Proto, 0, 0)
	ip = append(ip, f.IP.Src.AsSlice()...)
	ip = append(ip, f.IP.Dst.AsSlice()...)
	ip = append(ip, f.IP.Options...)
	binary.BigEndian.PutUint16(ip[10:], tpChecksum(ip))

	b := make([]byte, 0, 14+len(ip)+len(l4))
	b = append(b, f.Dst[:]...)
	b = append(b, f.Src[:]...)
	b = append(b, 0x08, 0x00)
	b = append(b, ip...)
	return append(b, l4...)
}

// tpDecode parses an Ethernet frame built like build's. UDP to vxlanPort (unless 0) is
// decoded as VXLAN with the inner frame. bad lists every checksum that is wrong, inner ones
// prefixed with "inner". The frame must end where the IP header's total length says.
func tpDecode(b []byte, vxlanPort uint16) (f tpFrame, bad []string, err error) {
	if len(b) < 14+20 {
		return f, nil, fmt.Errorf("frame of %d bytes is too short", len(b))
	}
	copy(f.Dst[:], b[0:6])
	copy(f.Src[:], b[6:12])
	if et := binary.BigEndian.Uint16(b[12:]); et != 0x0800 {
		return f, nil, fmt.Errorf("ethertype %#04x, want IPv4", et)
	}
	ip := b[14:]
	hlen := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || hlen < 20 || hlen > len(ip) {
		return f, nil, fmt.Errorf("IP version/ihl byte %#02x, want IPv4 with a header in the frame", ip[0])
	}
	f.IP = tpIPv4{TOS: ip[1], TotLen: binary.BigEndian.Uint16(ip[2:]), ID: binary.BigEndian.Uint16(ip[4:]),
		Frag: binary.BigEndian.Uint16(ip[6:]), TTL: ip[8], Proto: ip[9], Check: binary.BigEndian.Uint16(ip[10:]),
		Src: netip.AddrFrom4([4]byte(ip[12:16])), Dst: netip.AddrFrom4([4]byte(ip[16:20]))}
	if hlen > 20 {
		f.IP.Options = bytes.Clone(ip[20:hlen])
	}
	if int(f.IP.TotLen) != len(ip) {
		return f, nil, fmt.Errorf("IP total length %d, but %d bytes follow the Ethernet header", f.IP.TotLen, len(ip))
	}
	if tpChecksum(ip[:hlen]) != 0 {
		bad = append(bad, fmt.Sprintf("IP checksum %#04x", f.IP.Check))
	}
	l4 := ip[hlen:]
	proto := f.IP.Proto
	if f.IP.Frag&0x3fff != 0 {
		// A fragment: its transport header, if it has one, is checked on the reassembled
		// datagram (tpReassemble).
		proto = 0
	}
	switch proto {
	case tpProtoTCP:
		if len(l4) < 20 {
			return f, bad, errors.New("short TCP header")
		}
		off := int(l4[12]>>4) * 4
		if off < 20 || off > len(l4) {
			return f, bad, fmt.Errorf("TCP data offset %d", off)
		}
		f.TCP = tpTCP{Sport: binary.BigEndian.Uint16(l4), Dport: binary.BigEndian.Uint16(l4[2:]),
			Seq: binary.BigEndian.Uint32(l4[4:]), Ack: binary.BigEndian.Uint32(l4[8:]), Flags: l4[13],
			Window: binary.BigEndian.Uint16(l4[14:]), Check: binary.BigEndian.Uint16(l4[16:]),
			Urgent: binary.BigEndian.Uint16(l4[18:]), Options: bytes.Clone(l4[20:off])}
		f.Payload = bytes.Clone(l4[off:])
		if tpChecksum(tpPseudo(f.IP.Src, f.IP.Dst, tpProtoTCP, l4)) != 0 {
			bad = append(bad, fmt.Sprintf("TCP checksum %#04x", f.TCP.Check))
		}
	case tpProtoUDP:
		if len(l4) < 8 {
			return f, bad, errors.New("short UDP header")
		}
		f.UDP = tpUDP{Sport: binary.BigEndian.Uint16(l4), Dport: binary.BigEndian.Uint16(l4[2:]),
			Len: binary.BigEndian.Uint16(l4[4:]), Check: binary.BigEndian.Uint16(l4[6:])}
		if int(f.UDP.Len) != len(l4) {
			return f, bad, fmt.Errorf("UDP length %d, but the IP packet carries %d bytes", f.UDP.Len, len(l4))
		}
		if f.UDP.Check == 0 {
			f.UDP.ZeroCheck = true
		} else if tpChecksum(tpPseudo(f.IP.Src, f.IP.Dst, tpProtoUDP, l4)) != 0 {
			bad = append(bad, fmt.Sprintf("UDP checksum %#04x", f.UDP.Check))
		}
		if vxlanPort != 0 && f.UDP.Dport == vxlanPort {
			vx := l4[8:]
			if len(vx) < 8 {
				return f, bad, errors.New("short VXLAN header")
			}
			f.VXFlags = vx[0]
			f.VNI = uint32(vx[4])<<16 | uint32(vx[5])<<8 | uint32(vx[6])
			in, ibad, err := tpDecode(vx[8:], vxlanPort)
			for _, s := range ibad {
				bad = append(bad, "inner "+s)
			}
			if err != nil {
				return f, bad, fmt.Errorf("inner frame: %w", err)
			}
			f.Inner = &in
		} else {
			f.Payload = bytes.Clone(l4[8:])
		}
	case tpProtoICMP:
		if len(l4) < 8 {
			return f, bad, errors.New("short ICMP header")
		}
		f.ICMP = tpICMP{Type: l4[0], Code: l4[1], Check: binary.BigEndian.Uint16(l4[2:]), Rest: binary.BigEndian.Uint32(l4[4:])}
		f.Payload = bytes.Clone(l4[8:])
		if tpChecksum(l4) != 0 {
			bad = append(bad, fmt.Sprintf("ICMP checksum %#04x", f.ICMP.Check))
		}
	default:
		f.Payload = bytes.Clone(l4)
	}
	return f, bad, nil
}

// String renders the headers of f for failure messages.
func (f tpFrame) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "eth %v>%v ip %v>%v tos %d id %d frag %#04x ttl %d proto %d len %d csum %#04x",
		f.Src, f.Dst, f.IP.Src, f.IP.Dst, f.IP.TOS, f.IP.ID, f.IP.Frag, f.IP.TTL, f.IP.Proto, f.IP.TotLen, f.IP.Check)
	switch f.IP.Proto {
	case tpProtoTCP:
		fmt.Fprintf(&s, " | tcp %d>%d seq %d ack %d flags %#02x win %d csum %#04x opts %x",
			f.TCP.Sport, f.TCP.Dport, f.TCP.Seq, f.TCP.Ack, f.TCP.Flags, f.TCP.Window, f.TCP.Check, f.TCP.Options)
	case tpProtoUDP:
		fmt.Fprintf(&s, " | udp %d>%d len %d csum %#04x", f.UDP.Sport, f.UDP.Dport, f.UDP.Len, f.UDP.Check)
		if f.Inner != nil {
			fmt.Fprintf(&s, " | vxlan flags %#02x vni %#x | %v", f.VXFlags, f.VNI, *f.Inner)
			return s.String()
		}
	case tpProtoICMP:
		fmt.Fprintf(&s, " | icmp type %d code %d csum %#04x rest %#08x", f.ICMP.Type, f.ICMP.Code, f.ICMP.Check, f.ICMP.Rest)
	}
	fmt.Fprintf(&s, " | payload %d bytes", len(f.Payload))
	return s.String()
}

// tpTCPFrame is a TCP segment from src to dst with a 64-hop TTL and DF set, as Linux sends.
func tpTCPFrame(srcMAC, dstMAC tpMAC, src, dst netip.AddrPort, flags uint8, seq, ack uint32, payload []byte) tpFrame {
	return tpFrame{Dst: dstMAC, Src: srcMAC,
		IP:      tpIPv4{ID: 0x1234, Frag: tpDF, TTL: 64, Proto: tpProtoTCP, Src: src.Addr(), Dst: dst.Addr()},
		TCP:     tpTCP{Sport: src.Port(), Dport: dst.Port(), Seq: seq, Ack: ack, Flags: flags, Window: 64240},
		Payload: payload}
}

// tpUDPFrame is a UDP datagram from src to dst.
func tpUDPFrame(srcMAC, dstMAC tpMAC, src, dst netip.AddrPort, payload []byte) tpFrame {
	return tpFrame{Dst: dstMAC, Src: srcMAC,
		IP:      tpIPv4{ID: 0x4321, Frag: tpDF, TTL: 64, Proto: tpProtoUDP, Src: src.Addr(), Dst: dst.Addr()},
		UDP:     tpUDP{Sport: src.Port(), Dport: dst.Port()},
		Payload: payload}
}

// tpVXLANFrame wraps inner in VXLAN from outer src to dst as a node's tunnel sends it
// (TTL 64, no DF, UDP checksum 0, the I flag set).
func tpVXLANFrame(srcMAC, dstMAC tpMAC, src, dst netip.Addr, sport, dport uint16, vni uint32, inner tpFrame) tpFrame {
	return tpFrame{Dst: dstMAC, Src: srcMAC,
		IP:      tpIPv4{TTL: 64, Proto: tpProtoUDP, Src: src, Dst: dst},
		UDP:     tpUDP{Sport: sport, Dport: dport, ZeroCheck: true},
		VXFlags: 0x08, VNI: vni, Inner: &inner}
}

// tpFragments cuts f's IP datagram into fragments carrying at most size bytes of it each
// (a multiple of 8 but the last), with f's ID; every fragment keeps f's Ethernet header.
func tpFragments(f tpFrame, size int) [][]byte {
	whole := f.build()
	hlen := int(whole[14]&0x0f) * 4
	hdr, data := whole[:14+hlen], whole[14+hlen:]
	var out [][]byte
	for off := 0; off < len(data); off += size {
		end := min(off+size, len(data))
		b := append(bytes.Clone(hdr), data[off:end]...)
		ip := b[14:]
		binary.BigEndian.PutUint16(ip[2:], uint16(hlen+end-off))
		frag := uint16(off / 8)
		if end < len(data) {
			frag |= 0x2000
		}
		binary.BigEndian.PutUint16(ip[6:], frag)
		binary.BigEndian.PutUint16(ip[10:], 0)
		binary.BigEndian.PutUint16(ip[10:], tpChecksum(ip[:hlen]))
		out = append(out, b)
	}
	return out
}

// tpReassemble puts fragments (as frames, any order) back into one frame and decodes it; the
// fragments must agree on addresses, protocol and ID, have right IP checksums, and cover the
// datagram exactly once.
func tpReassemble(t *testing.T, frags [][]byte) tpFrame {
	t.Helper()
	type piece struct {
		off  int
		data []byte
	}
	var pieces []piece
	var first []byte
	total := -1
	for i, b := range frags {
		f, bad, err := tpDecode(b, 0)
		if err != nil || len(bad) > 0 {
			t.Fatalf("fragment %d: %v %v", i, err, bad)
		}
		hlen := int(b[14]&0x0f) * 4
		off := int(f.IP.Frag&0x1fff) * 8
		if off == 0 {
			first = b[:14+hlen]
		}
		if f.IP.Frag&0x2000 == 0 {
			total = off + len(b) - 14 - hlen
		}
		pieces = append(pieces, piece{off, b[14+hlen:]})
		if i > 0 {
			ref, _, _ := tpDecode(frags[0], 0)
			if f.IP.Src != ref.IP.Src || f.IP.Dst != ref.IP.Dst || f.IP.ID != ref.IP.ID || f.IP.Proto != ref.IP.Proto {
				t.Fatalf("fragment %d (%v) is not of the datagram of fragment 0 (%v)", i, f, ref)
			}
		}
	}
	if first == nil || total < 0 {
		t.Fatalf("%d fragments without a first or a last one", len(frags))
	}
	data := make([]byte, total)
	covered := make([]int, total)
	for _, p := range pieces {
		if p.off+len(p.data) > total {
			t.Fatalf("fragment at %d+%d runs past the datagram's end %d", p.off, len(p.data), total)
		}
		copy(data[p.off:], p.data)
		for i := range p.data {
			covered[p.off+i]++
		}
	}
	for i, c := range covered {
		if c != 1 {
			t.Fatalf("byte %d of the datagram is in %d fragments", i, c)
		}
	}
	b := append(bytes.Clone(first), data...)
	ip := b[14:]
	hlen := int(ip[0]&0x0f) * 4
	binary.BigEndian.PutUint16(ip[2:], uint16(hlen+total))
	binary.BigEndian.PutUint16(ip[6:], 0)
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], tpChecksum(ip[:hlen]))
	f, bad, err := tpDecode(b, 0)
	if err != nil || len(bad) > 0 {
		t.Fatalf("reassembled datagram: %v %v", err, bad)
	}
	return f
}
