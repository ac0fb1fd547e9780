package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

// An IPv6 packet builder and decoder for the program tests, as packet_test.go's for IPv4:
// Ethernet, IPv6 with extension headers (hop-by-hop, routing, destination options,
// fragment), TCP, UDP and ICMPv6. Building computes lengths and checksums from scratch;
// decoding checks the transport checksum of every packet that is not a fragment.

const (
	tp6ProtoICMP = 58

	tp6HopByHop = 0
	tp6Routing  = 43
	tp6Fragment = 44
	tp6DestOpts = 60
)

// tp6Ext is one extension header: Type is the header's own protocol number; Body is what
// follows its next-header byte (for hop-by-hop, routing and destination options a multiple of
// 8 bytes minus 1 after the length byte is made by build; for a fragment header its 7 bytes).
type tp6Ext struct {
	Type uint8
	Body []byte
}

// tp6Frag is a fragment header's body: offset in 8-byte units, more fragments, id.
func tp6Frag(offset uint16, more bool, id uint32) tp6Ext {
	b := make([]byte, 7)
	fo := offset << 3
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(b[1:], fo)
	binary.BigEndian.PutUint32(b[3:], id)
	return tp6Ext{Type: tp6Fragment, Body: b}
}

// tp6Opts is a hop-by-hop or destination-options header of n*8 bytes (padding options);
// a routing header of type 4 with the given segments left when typ is tp6Routing.
func tp6Opts(typ uint8, n int, segmentsLeft uint8) tp6Ext {
	b := make([]byte, n*8-1)
	b[0] = uint8(n - 1)
	if typ == tp6Routing {
		b[1] = 4
		b[2] = segmentsLeft
	} else {
		b[1] = 1 // PadN
		b[2] = uint8(len(b) - 3)
	}
	return tp6Ext{Type: typ, Body: b}
}

type tpICMP6 struct {
	Type, Code uint8
	Check      uint16 // set by build
	Data       uint32 // the MTU of a Packet Too Big
}

// tp6Frame is an Ethernet frame carrying IPv6. Proto is the transport protocol, after Ext.
type tp6Frame struct {
	Dst, Src tpMAC
	SrcIP    netip.Addr
	DstIP    netip.Addr
	HopLimit uint8
	Ext      []tp6Ext
	Proto    uint8
	TCP      tpTCP
	UDP      tpUDP
	ICMP     tpICMP6
	Payload  []byte // after the transport header (an ICMPv6 error's: the quoted packet)
	// Raw, when set, is the whole transport part as it is (a later fragment's bytes).
	Raw []byte
}

func tp6Pseudo(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	b := make([]byte, 0, 40+len(l4))
	s, d := src.As16(), dst.As16()
	b = append(b, s[:]...)
	b = append(b, d[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(l4)))
	b = append(b, 0, 0, 0, proto)
	return append(b, l4...)
}

// l4 builds the transport part with its checksum.
func (f tp6Frame) l4() []byte {
	if f.Raw != nil {
		return f.Raw
	}
	var b []byte
	switch f.Proto {
	case tpProtoTCP:
		b = make([]byte, 20+len(f.TCP.Options))
		binary.BigEndian.PutUint16(b[0:], f.TCP.Sport)
		binary.BigEndian.PutUint16(b[2:], f.TCP.Dport)
		binary.BigEndian.PutUint32(b[4:], f.TCP.Seq)
		binary.BigEndian.PutUint32(b[8:], f.TCP.Ack)
		b[12] = uint8((20+len(f.TCP.Options))/4) << 4
		b[13] = f.TCP.Flags
		binary.BigEndian.PutUint16(b[14:], f.TCP.Window)
		copy(b[20:], f.TCP.Options)
		b = append(b, f.Payload...)
		binary.BigEndian.PutUint16(b[16:], tpChecksum(tp6Pseudo(f.SrcIP, f.DstIP, tpProtoTCP, b)))
	case tpProtoUDP:
		b = make([]byte, 8)
		binary.BigEndian.PutUint16(b[0:], f.UDP.Sport)
		binary.BigEndian.PutUint16(b[2:], f.UDP.Dport)
		binary.BigEndian.PutUint16(b[4:], uint16(8+len(f.Payload)))
		b = append(b, f.Payload...)
		if !f.UDP.ZeroCheck {
			c := tpChecksum(tp6Pseudo(f.SrcIP, f.DstIP, tpProtoUDP, b))
			if c == 0 {
				c = 0xffff
			}
			binary.BigEndian.PutUint16(b[6:], c)
		}
	case tp6ProtoICMP:
		b = make([]byte, 8)
		b[0], b[1] = f.ICMP.Type, f.ICMP.Code
		binary.BigEndian.PutUint32(b[4:], f.ICMP.Data)
		b = append(b, f.Payload...)
		binary.BigEndian.PutUint16(b[2:], tpChecksum(tp6Pseudo(f.SrcIP, f.DstIP, tp6ProtoICMP, b)))
	default:
		b = append(b, f.Payload...)
	}
	return b
}

// ip builds the IPv6 header, extension headers and transport part (no Ethernet header).
func (f tp6Frame) ip() []byte {
	var ext []byte
	for i, e := range f.Ext {
		next := f.Proto
		if i+1 < len(f.Ext) {
			next = f.Ext[i+1].Type
		}
		ext = append(ext, next)
		ext = append(ext, e.Body...)
	}
	l4 := f.l4()
	b := make([]byte, 40, 40+len(ext)+len(l4))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(ext)+len(l4)))
	b[6] = f.Proto
	if len(f.Ext) > 0 {
		b[6] = f.Ext[0].Type
	}
	b[7] = f.HopLimit
	s, d := f.SrcIP.As16(), f.DstIP.As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	b = append(b, ext...)
	return append(b, l4...)
}

func (f tp6Frame) build() []byte {
	b := make([]byte, 14, 14+60)
	copy(b[0:], f.Dst[:])
	copy(b[6:], f.Src[:])
	binary.BigEndian.PutUint16(b[12:], 0x86dd)
	return append(b, f.ip()...)
}

// tp6Decode decodes an Ethernet frame carrying IPv6; bad lists the wrong checksums (the
// transport's, over its pseudo-header; none is checked for a fragment).
func tp6Decode(b []byte) (f tp6Frame, bad []string, err error) {
	if len(b) < 54 || binary.BigEndian.Uint16(b[12:]) != 0x86dd {
		return f, nil, fmt.Errorf("not an Ethernet frame carrying IPv6 (%d bytes)", len(b))
	}
	copy(f.Dst[:], b[0:6])
	copy(f.Src[:], b[6:12])
	ip := b[14:]
	if ip[0]>>4 != 6 {
		return f, nil, errors.New("IP version is not 6")
	}
	plen := int(binary.BigEndian.Uint16(ip[4:]))
	if 40+plen != len(ip) {
		return f, nil, fmt.Errorf("payload length %d, but %d bytes follow the header", plen, len(ip)-40)
	}
	f.HopLimit = ip[7]
	f.SrcIP = netip.AddrFrom16([16]byte(ip[8:24]))
	f.DstIP = netip.AddrFrom16([16]byte(ip[24:40]))
	next, off, frag := ip[6], 40, false
	for next == tp6HopByHop || next == tp6Routing || next == tp6DestOpts || next == tp6Fragment {
		if off+8 > len(ip) {
			return f, nil, errors.New("extension header past the end")
		}
		n := 8
		if next != tp6Fragment {
			n = (int(ip[off+1]) + 1) * 8
		} else {
			frag = true
		}
		if off+n > len(ip) {
			return f, nil, errors.New("extension header past the end")
		}
		f.Ext = append(f.Ext, tp6Ext{Type: next, Body: append([]byte(nil), ip[off+1:off+n]...)})
		next, off = ip[off], off+n
	}
	f.Proto = next
	l4 := ip[off:]
	if frag && binary.BigEndian.Uint16(f.Ext[len(f.Ext)-1].Body[1:])>>3 != 0 {
		f.Raw = append([]byte(nil), l4...)
		return f, nil, nil
	}
	switch next {
	case tpProtoTCP:
		if len(l4) < 20 {
			return f, nil, errors.New("short TCP header")
		}
		f.TCP = tpTCP{Sport: binary.BigEndian.Uint16(l4[0:]), Dport: binary.BigEndian.Uint16(l4[2:]),
			Seq: binary.BigEndian.Uint32(l4[4:]), Ack: binary.BigEndian.Uint32(l4[8:]), Flags: l4[13],
			Window: binary.BigEndian.Uint16(l4[14:]), Check: binary.BigEndian.Uint16(l4[16:])}
		hl := int(l4[12]>>4) * 4
		f.TCP.Options = append([]byte(nil), l4[20:hl]...)
		f.Payload = append([]byte(nil), l4[hl:]...)
	case tpProtoUDP:
		f.UDP = tpUDP{Sport: binary.BigEndian.Uint16(l4[0:]), Dport: binary.BigEndian.Uint16(l4[2:]),
			Len: binary.BigEndian.Uint16(l4[4:]), Check: binary.BigEndian.Uint16(l4[6:])}
		f.UDP.ZeroCheck = f.UDP.Check == 0
		f.Payload = append([]byte(nil), l4[8:]...)
		if f.UDP.ZeroCheck {
			bad = append(bad, "UDP checksum 0 (none: IPv6 forbids it)")
		}
	case tp6ProtoICMP:
		f.ICMP = tpICMP6{Type: l4[0], Code: l4[1], Check: binary.BigEndian.Uint16(l4[2:]), Data: binary.BigEndian.Uint32(l4[4:])}
		f.Payload = append([]byte(nil), l4[8:]...)
	default:
		f.Raw = append([]byte(nil), l4...)
		return f, nil, nil
	}
	if !frag && tpChecksum(tp6Pseudo(f.SrcIP, f.DstIP, next, l4)) != 0 {
		if !(next == tpProtoUDP && f.UDP.ZeroCheck) {
			bad = append(bad, fmt.Sprintf("transport checksum %04x", binary.BigEndian.Uint16(l4[map[uint8]int{tpProtoTCP: 16, tpProtoUDP: 6, tp6ProtoICMP: 2}[next]:])))
		}
	}
	return f, bad, nil
}

func (f tp6Frame) String() string {
	s := fmt.Sprintf("%v>%v %v>%v", f.Src, f.Dst, f.SrcIP, f.DstIP)
	for _, e := range f.Ext {
		s += fmt.Sprintf(" ext%d", e.Type)
	}
	switch f.Proto {
	case tpProtoTCP:
		s += fmt.Sprintf(" TCP %d>%d flags %02x seq %d ack %d", f.TCP.Sport, f.TCP.Dport, f.TCP.Flags, f.TCP.Seq, f.TCP.Ack)
	case tpProtoUDP:
		s += fmt.Sprintf(" UDP %d>%d", f.UDP.Sport, f.UDP.Dport)
	case tp6ProtoICMP:
		s += fmt.Sprintf(" ICMPv6 %d/%d data %d", f.ICMP.Type, f.ICMP.Code, f.ICMP.Data)
	}
	return s + fmt.Sprintf(" %d bytes", len(f.Payload)+len(f.Raw))
}

// tp6TCP is a TCP segment from src to dst.
func tp6TCP(srcMAC, dstMAC tpMAC, src, dst netip.AddrPort, flags uint8, seq, ack uint32, payload []byte) tp6Frame {
	return tp6Frame{Dst: dstMAC, Src: srcMAC, SrcIP: src.Addr(), DstIP: dst.Addr(), HopLimit: 64, Proto: tpProtoTCP,
		TCP: tpTCP{Sport: src.Port(), Dport: dst.Port(), Seq: seq, Ack: ack, Flags: flags, Window: 64240}, Payload: payload}
}

// tp6UDP is a UDP datagram from src to dst.
func tp6UDP(srcMAC, dstMAC tpMAC, src, dst netip.AddrPort, payload []byte) tp6Frame {
	return tp6Frame{Dst: dstMAC, Src: srcMAC, SrcIP: src.Addr(), DstIP: dst.Addr(), HopLimit: 64, Proto: tpProtoUDP,
		UDP: tpUDP{Sport: src.Port(), Dport: dst.Port()}, Payload: payload}
}

// tp6DecodeOK decodes a program's output, failing the test on a malformed frame and reporting
// every wrong checksum.
func tp6DecodeOK(t *testing.T, out []byte) tp6Frame {
	t.Helper()
	f, bad, err := tp6Decode(out)
	if err != nil {
		t.Fatalf("output %x: %v", out, err)
	}
	for _, b := range bad {
		t.Errorf("output %v: wrong %s", f, b)
	}
	return f
}

// TestPacket6Builder checks the builder against itself: a built frame decodes to the same
// fields with good checksums, and a flipped byte is caught.
func TestPacket6Builder(t *testing.T) {
	src, dst := netip.MustParseAddrPort("[2001:db8::1]:40000"), netip.MustParseAddrPort("[2001:db8::2]:80")
	f := tp6TCP(tpMAC{1}, tpMAC{2}, src, dst, tpSYN, 7, 0, []byte("hello"))
	f.Ext = []tp6Ext{tp6Opts(tp6HopByHop, 1, 0), tp6Opts(tp6DestOpts, 2, 0)}
	b := f.build()
	got := tp6DecodeOK(t, b)
	if got.TCP.Sport != 40000 || got.TCP.Dport != 80 || got.DstIP != dst.Addr() || len(got.Ext) != 2 || string(got.Payload) != "hello" {
		t.Errorf("decoded %v", got)
	}
	b[len(b)-1] ^= 1
	if _, bad, _ := tp6Decode(b); len(bad) != 1 {
		t.Errorf("a flipped payload byte: %v, want one wrong checksum", bad)
	}
}
