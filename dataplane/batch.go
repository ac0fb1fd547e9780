package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// batcher writes many rtnetlink requests (routes, neighbours, FDB entries) over one netlink
// socket with few system calls: it packs the requests into packets of up to packetSize bytes,
// one sendmsg each, and asks for an acknowledgement only of each packet's last request. The
// kernel handles a packet's requests in order inside that sendmsg and answers a failed one
// with an error naming its sequence number, so one failure stays one object's, and the last
// request's acknowledgement says the whole packet is done.
//
// Hazard: every failed request queues an answer on the socket. A packet must never hold more
// requests than the receive buffer has room for answers, or the kernel drops answers (the
// acknowledgement among them) and marks the socket congested until it is drained; so the
// buffer is forced large, answers are capped to the bare error (NETLINK_CAP_ACK), packets are
// cut at perPacket requests, and after an overflow the socket is drained and the batch goes
// on with the next packet.
type batcher struct {
	sock *nl.NetlinkSocket
	seq  uint32
	buf  []byte
	// perPacket is how many requests a packet may hold: the receive buffer over the room
	// one answer takes, with margin.
	perPacket int
}

const (
	// packetSize keeps a packet well inside the socket's default send buffer (212,992
	// bytes): about 400 IPv4 routes.
	packetSize = 32 << 10
	// answerRoom is what one error answer takes of a receive buffer, with margin (the
	// socket buffer's accounting of it, the original request it quotes included).
	answerRoom = 2048
	// receiveBuffer is asked for, forced where sluice may (CAP_NET_ADMIN).
	receiveBuffer = 8 << 20
)

func newRouteBatcher(ns netns.NsHandle) (*batcher, error) {
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening a netlink socket: %w", err)
	}
	if s.SetReceiveBufferSize(receiveBuffer, true) != nil {
		_ = s.SetReceiveBufferSize(receiveBuffer, false) // capped at net.core.rmem_max
	}
	// Errors answer with the error alone, not a copy of the request.
	_ = unix.SetsockoptInt(s.GetFd(), unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	// An acknowledgement that never comes must not hold an apply (and the lock) for ever.
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	if err := s.SetReceiveTimeout(&tv); err != nil {
		s.Close()
		return nil, err
	}
	size, err := unix.GetsockoptInt(s.GetFd(), unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("reading the netlink socket's receive buffer: %w", err)
	}
	return &batcher{sock: s, perPacket: max(1, size/answerRoom)}, nil
}

func (b *batcher) close() { b.sock.Close() }

// routeRequest builds an RTM_NEWROUTE (create or replace) or, with del, an RTM_DELROUTE
// request for r. A route through a nexthop object names the object instead of a gateway
// and device.
func routeRequest(r *Route, del bool) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE)
	if del {
		req = nl.NewNetlinkRequest(unix.RTM_DELROUTE, 0)
	}
	msg := nl.NewRtMsg()
	dst := r.Dst.IP.To4()
	msg.Family = unix.AF_INET
	if dst == nil {
		dst = r.Dst.IP.To16()
		msg.Family = unix.AF_INET6
	}
	ones, _ := r.Dst.Mask.Size()
	msg.Dst_len = uint8(ones)
	msg.Protocol = uint8(r.Protocol)
	msg.Scope = uint8(r.Scope)
	msg.Type = uint8(r.Type)
	msg.Flags = uint32(r.Flags)
	msg.Table = unix.RT_TABLE_UNSPEC
	if r.Table < 256 {
		msg.Table = uint8(r.Table)
	}
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.RTA_DST, dst))
	req.AddData(nl.NewRtAttr(unix.RTA_TABLE, nl.Uint32Attr(uint32(r.Table))))
	if r.NH != 0 {
		req.AddData(nl.NewRtAttr(rtaNHID, nl.Uint32Attr(r.NH)))
	}
	if r.Gw != nil && r.NH == 0 {
		gw := r.Gw.To4()
		if msg.Family == unix.AF_INET6 {
			gw = r.Gw.To16()
		}
		req.AddData(nl.NewRtAttr(unix.RTA_GATEWAY, gw))
	}
	if r.LinkIndex != 0 && r.NH == 0 {
		req.AddData(nl.NewRtAttr(unix.RTA_OIF, nl.Uint32Attr(uint32(r.LinkIndex))))
	}
	if len(r.MultiPath) > 0 && r.NH == 0 && !del {
		// struct rtnexthop per path, its gateway after it.
		var mp []byte
		for _, nh := range r.MultiPath {
			gw := nh.Gw.To4()
			if msg.Family == unix.AF_INET6 {
				gw = nh.Gw.To16()
			}
			attr := nl.NewRtAttr(unix.RTA_GATEWAY, gw).Serialize()
			rtnh := make([]byte, unix.SizeofRtNexthop, unix.SizeofRtNexthop+len(attr))
			binary.NativeEndian.PutUint16(rtnh[0:], uint16(unix.SizeofRtNexthop+len(attr)))
			rtnh[2], rtnh[3] = uint8(nh.Flags), uint8(nh.Hops)
			binary.NativeEndian.PutUint32(rtnh[4:], uint32(nh.LinkIndex))
			mp = append(mp, append(rtnh, attr...)...)
		}
		req.AddData(nl.NewRtAttr(unix.RTA_MULTIPATH, mp))
	}
	if r.Priority != 0 {
		req.AddData(nl.NewRtAttr(unix.RTA_PRIORITY, nl.Uint32Attr(uint32(r.Priority))))
	}
	return req
}

// neighRequest builds an RTM_NEWNEIGH request that creates or replaces n: a neighbour
// (AF_INET, AF_INET6) or an FDB entry (AF_BRIDGE), as netlink.NeighSet does.
func neighRequest(n *netlink.Neigh) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE)
	req.AddData(&netlink.Ndmsg{Family: uint8(n.Family), Index: uint32(n.LinkIndex), State: uint16(n.State), Flags: uint8(n.Flags), Type: uint8(n.Type)})
	ip := n.IP.To4()
	if ip == nil {
		ip = n.IP.To16()
	}
	req.AddData(nl.NewRtAttr(unix.NDA_DST, ip))
	if n.HardwareAddr != nil {
		req.AddData(nl.NewRtAttr(unix.NDA_LLADDR, []byte(n.HardwareAddr)))
	}
	return req
}

// replace writes every route and returns one error per route (nil where it succeeded).
func (b *batcher) replace(rs []*Route) []error {
	reqs := make([]*nl.NetlinkRequest, len(rs))
	for i, r := range rs {
		reqs[i] = routeRequest(r, false)
	}
	return b.send(reqs)
}

// setNeighs creates or replaces every neighbour or FDB entry and returns one error each.
func (b *batcher) setNeighs(ns []*netlink.Neigh) []error {
	reqs := make([]*nl.NetlinkRequest, len(ns))
	for i, n := range ns {
		reqs[i] = neighRequest(n)
	}
	return b.send(reqs)
}

// remove deletes every route and returns one error per route; a route already gone is not an
// error (deleting is idempotent).
func (b *batcher) remove(rs []*Route) []error {
	reqs := make([]*nl.NetlinkRequest, len(rs))
	for i, r := range rs {
		reqs[i] = routeRequest(r, true)
	}
	errs := b.send(reqs)
	for i, err := range errs {
		if gone(err) {
			errs[i] = nil
		}
	}
	return errs
}

// send writes the requests, packed, and returns one error per request.
func (b *batcher) send(reqs []*nl.NetlinkRequest) []error {
	errs := make([]error, len(reqs))
	first := 0 // the first request of the packet being built
	firstSeq := b.seq + 1
	b.buf = b.buf[:0]
	// flush sends the packet built of reqs[first:end]; false ends the batch.
	flush := func(end int) bool {
		err := b.flush(errs, first, firstSeq)
		if err == nil {
			return true
		}
		b.drain()
		if errors.Is(err, unix.ENOBUFS) {
			// Answers were lost: this packet's outcome is unknown where no error came,
			// so those count as failed (and are written again); the batch goes on.
			b.failRange(errs, first, end, err)
			return true
		}
		b.failRange(errs, first, len(errs), err)
		return false
	}
	for i, req := range reqs {
		b.seq++
		req.Seq = b.seq
		msg := req.Serialize()
		if len(b.buf) > 0 && (len(b.buf)+len(msg) > packetSize || i-first >= b.perPacket) {
			// This request starts the next packet: send what is built.
			if !flush(i) {
				return errs
			}
			first, firstSeq = i, b.seq
			b.buf = b.buf[:0]
		}
		b.buf = append(b.buf, msg...)
	}
	if len(reqs) > 0 {
		flush(len(reqs))
	}
	return errs
}

// ackRequest sets NLM_F_ACK in a serialized request's header.
func ackRequest(msg []byte) {
	flags := binary.NativeEndian.Uint16(msg[6:8])
	binary.NativeEndian.PutUint16(msg[6:8], flags|unix.NLM_F_ACK)
}

// flush sends the packet in b.buf, whose requests carry sequence numbers firstSeq.. and
// stand for errs[first:], and reads the answers until the last request's acknowledgement.
func (b *batcher) flush(errs []error, first int, firstSeq uint32) error {
	// The packet's last request is the one to ack: mark it if it was not marked yet.
	n := 0
	for off := 0; off < len(b.buf); n++ {
		l := int(binary.NativeEndian.Uint32(b.buf[off : off+4]))
		if off+l == len(b.buf) {
			ackRequest(b.buf[off : off+l])
		}
		off += l
	}
	if err := unix.Sendto(b.sock.GetFd(), b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending to netlink: %w", err)
	}
	for {
		msgs, _, err := b.sock.Receive()
		if err != nil {
			return fmt.Errorf("reading netlink acknowledgements: %w", err)
		}
		for _, m := range msgs {
			k := m.Header.Seq - firstSeq // wraps around to a large number for earlier packets
			if m.Header.Type != unix.NLMSG_ERROR || k >= uint32(n) {
				continue // an answer to an earlier, abandoned packet
			}
			i := first + int(k)
			if len(m.Data) < 4 {
				errs[i] = fmt.Errorf("short netlink acknowledgement")
			} else if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				errs[i] = syscall.Errno(-code)
			}
			if int(k) == n-1 {
				return nil
			}
		}
	}
}

// drain reads and drops whatever answers are still queued, without waiting: after a failed
// packet they would be mistaken for nothing, and a congested socket drops every new answer
// until it is emptied.
func (b *batcher) drain() {
	buf := make([]byte, 64<<10)
	for {
		_, _, err := unix.Recvfrom(b.sock.GetFd(), buf, unix.MSG_DONTWAIT)
		if err != nil && err != unix.ENOBUFS && err != unix.EINTR {
			return // EAGAIN: empty
		}
	}
}

// failRange marks every request in errs[from:to] that has no answer yet as failed with err.
func (b *batcher) failRange(errs []error, from, to int, err error) {
	for i := from; i < min(to, len(errs)); i++ {
		if errs[i] == nil {
			errs[i] = err
		}
	}
}
