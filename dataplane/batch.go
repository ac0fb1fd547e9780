package dataplane

import (
	"encoding/binary"
	"fmt"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// routeBatcher writes many routes over one netlink socket without waiting for each
// acknowledgement: it keeps a window of requests in flight and matches the acknowledgements
// by sequence number. One request per route still, so one failure stays one route's.
type routeBatcher struct {
	sock *nl.NetlinkSocket
	seq  uint32
}

const batchWindow = 256

func newRouteBatcher(ns netns.NsHandle) (*routeBatcher, error) {
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening a netlink socket: %w", err)
	}
	_ = s.SetReceiveBufferSize(4<<20, false)
	// An acknowledgement that never comes must not hold an apply (and the lock) for ever.
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	if err := s.SetReceiveTimeout(&tv); err != nil {
		s.Close()
		return nil, err
	}
	return &routeBatcher{sock: s}, nil
}

func (b *routeBatcher) close() { b.sock.Close() }

func routeRequest(r *netlink.Route, seq uint32) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK)
	req.Seq = seq
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
	if r.Gw != nil {
		gw := r.Gw.To4()
		if msg.Family == unix.AF_INET6 {
			gw = r.Gw.To16()
		}
		req.AddData(nl.NewRtAttr(unix.RTA_GATEWAY, gw))
	}
	if r.LinkIndex != 0 {
		req.AddData(nl.NewRtAttr(unix.RTA_OIF, nl.Uint32Attr(uint32(r.LinkIndex))))
	}
	if r.Priority != 0 {
		req.AddData(nl.NewRtAttr(unix.RTA_PRIORITY, nl.Uint32Attr(uint32(r.Priority))))
	}
	return req
}

// replace writes every route and returns one error per route (nil where it succeeded).
func (b *routeBatcher) replace(rs []*netlink.Route) []error {
	errs := make([]error, len(rs))
	pending := map[uint32]int{}
	receive := func() error {
		msgs, _, err := b.sock.Receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			i, ok := pending[m.Header.Seq]
			if !ok || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			delete(pending, m.Header.Seq)
			if len(m.Data) < 4 {
				errs[i] = fmt.Errorf("short netlink acknowledgement")
			} else if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				errs[i] = syscall.Errno(-code)
			}
		}
		return nil
	}
	fail := func(err error) []error {
		for _, i := range pending {
			errs[i] = err
		}
		return errs
	}
	for i, r := range rs {
		b.seq++
		if err := b.sock.Send(routeRequest(r, b.seq)); err != nil {
			errs[i] = err
			continue
		}
		pending[b.seq] = i
		for len(pending) >= batchWindow {
			if err := receive(); err != nil {
				return fail(err)
			}
		}
	}
	for len(pending) > 0 {
		if err := receive(); err != nil {
			return fail(err)
		}
	}
	return errs
}
