package dataplane

import (
	"encoding/binary"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// subscribeRoutes delivers the kernel's IPv4 and IPv6 route changes in namespace ns (this one
// when ns is nil) to ch, like netlink.RouteSubscribe, except sluice's own new routes: a socket
// filter drops RTM_NEWROUTE messages of route protocol proto inside the kernel, before they
// are queued. A cold start or a large change writes tens of thousands of routes; telling the
// agent about each of its own writes would wake its reader once per route and slow the writer
// (BenchmarkRouteWrite in dataplane measures both subscriptions). What the watch needs still
// arrives: sluice's routes going away, and every other program's routes.
//
// Each update carries the route's Dst, Table, Protocol, Priority and Type only. ch is closed
// when done is closed or the socket fails; errors go to onErr.
func subscribeRoutes(ns *netns.NsHandle, proto int, ch chan<- netlink.RouteUpdate, done <-chan struct{}, bufSize int, onErr func(error)) error {
	target := netns.None()
	if ns != nil {
		target = *ns
	}
	s, err := nl.SubscribeAt(target, netns.None(), unix.NETLINK_ROUTE, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE)
	if err != nil {
		return fmt.Errorf("subscribing to route changes: %w", err)
	}
	if err := s.SetReceiveBufferSize(bufSize, true); err != nil {
		s.Close()
		return fmt.Errorf("sizing the route subscription's buffer: %w", err)
	}
	if err := attachOwnRouteFilter(s.GetFd(), proto); err != nil {
		s.Close()
		return err
	}
	go func() {
		<-done
		s.Close()
	}()
	go func() {
		defer close(ch)
		for {
			msgs, from, err := s.Receive()
			if err != nil {
				select {
				case <-done: // closed on purpose
				default:
					onErr(fmt.Errorf("route subscription: %w", err))
				}
				return
			}
			if from.Pid != nl.PidKernel {
				continue
			}
			for _, m := range msgs {
				if m.Header.Type != unix.RTM_NEWROUTE && m.Header.Type != unix.RTM_DELROUTE {
					continue
				}
				r, err := parseRouteEvent(m.Data)
				if err != nil {
					onErr(err)
					continue
				}
				ch <- netlink.RouteUpdate{Type: m.Header.Type, Route: r}
			}
		}
	}()
	return nil
}

// attachOwnRouteFilter attaches a classic BPF program to a route subscription's socket that
// drops RTM_NEWROUTE messages whose rtm_protocol is proto and passes everything else. The
// program reads the message from its start: nlmsg_type is a host-order u16 at offset 4, and
// rtm_protocol the sixth byte of the rtmsg after the 16-byte header.
func attachOwnRouteFilter(fd, proto int) error {
	const (
		ldb = unix.BPF_LD | unix.BPF_B | unix.BPF_ABS
		jeq = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret = unix.BPF_RET | unix.BPF_K
	)
	prog := []unix.SockFilter{
		{Code: ldb, K: typeLowByte()},
		{Code: jeq, Jt: 0, Jf: 3, K: unix.RTM_NEWROUTE}, // not a new route: pass
		{Code: ldb, K: unix.NLMSG_HDRLEN + 5},           // rtm_protocol
		{Code: jeq, Jt: 0, Jf: 1, K: uint32(proto)},     // another program's: pass
		{Code: ret, K: 0},                               // sluice's own new route: drop
		{Code: ret, K: 0xffffffff},
	}
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fp); err != nil {
		return fmt.Errorf("attaching the route subscription's filter: %w", err)
	}
	return nil
}

// subscribeNexthopDeletions delivers the IDs of sluice's nexthop objects (protocol proto) that
// the kernel deleted, in namespace ns (this one when ns is nil), to ch. The kernel tells of an
// object deleted by a request (`ip nexthop del`, or sluice itself) but not of the routes that
// went with it, so this is how such a repair starts. (Objects dropped with their device going
// down are not told of at all; the link event's resync finds them.) ch is closed when done is
// closed or the socket fails; errors go to onErr.
func subscribeNexthopDeletions(ns *netns.NsHandle, proto int, ch chan<- uint32, done <-chan struct{}, onErr func(error)) error {
	return subscribeDeletions(ns, unix.RTNLGRP_NEXTHOP, unix.RTM_DELNEXTHOP, "nexthop", func(b []byte) error {
		n, err := parseNexthop(b)
		if err == nil && ownedNexthop(n.Protocol, proto) {
			ch <- n.ID
		}
		return err
	}, done, onErr, func() { close(ch) })
}

// subscribeNeighDeletions delivers the kernel's deleted neighbour and FDB entries in namespace
// ns (this one when ns is nil) to ch. sluice's own writes (two entries per remote node, 40,000
// at a 20,000-node cold start) and the kernel's state changes of every other neighbour are
// dropped in the kernel, not parsed and thrown away here. ch is closed when done is closed or
// the socket fails; errors go to onErr.
func subscribeNeighDeletions(ns *netns.NsHandle, ch chan<- Neighbour, done <-chan struct{}, onErr func(error)) error {
	return subscribeDeletions(ns, unix.RTNLGRP_NEIGH, unix.RTM_DELNEIGH, "neighbour", func(b []byte) error {
		n, err := parseNeighbour(b)
		if err == nil {
			ch <- n
		}
		return err
	}, done, onErr, func() { close(ch) })
}

// subscribeDeletions subscribes to one rtnetlink group in namespace ns (this one when nil),
// with a socket filter that passes messages of type typ only, and hands each message's data
// to deliver, on a goroutine of its own; deliver's errors, and the socket's, go to onErr
// (what names the subscription in them). ended runs when the reader stops: done closed, or
// the socket failed.
func subscribeDeletions(ns *netns.NsHandle, group uint, typ uint16, what string, deliver func([]byte) error, done <-chan struct{}, onErr func(error), ended func()) error {
	target := netns.None()
	if ns != nil {
		target = *ns
	}
	s, err := nl.SubscribeAt(target, netns.None(), unix.NETLINK_ROUTE, group)
	if err != nil {
		return fmt.Errorf("subscribing to %s changes: %w", what, err)
	}
	if err := s.SetReceiveBufferSize(subscriptionBuffer, true); err != nil {
		s.Close()
		return fmt.Errorf("sizing the %s subscription's buffer: %w", what, err)
	}
	if err := attachTypeFilter(s.GetFd(), uint32(typ)); err != nil {
		s.Close()
		return fmt.Errorf("attaching the %s subscription's filter: %w", what, err)
	}
	go func() {
		<-done
		s.Close()
	}()
	go func() {
		defer ended()
		for {
			msgs, from, err := s.Receive()
			if err != nil {
				select {
				case <-done:
				default:
					onErr(fmt.Errorf("%s subscription: %w", what, err))
				}
				return
			}
			if from.Pid != nl.PidKernel {
				continue
			}
			for _, m := range msgs {
				if m.Header.Type != typ {
					continue
				}
				if err := deliver(m.Data); err != nil {
					onErr(err)
				}
			}
		}
	}()
	return nil
}

// typeLowByte is the offset of nlmsg_type's low byte in a netlink message, where a classic BPF
// program reads the type (every rtnetlink type is below 256): 4 on a little-endian host, 5 on
// a big-endian one.
func typeLowByte() uint32 {
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 {
		return 5
	}
	return 4
}

// attachTypeFilter attaches a classic BPF program to a subscription's socket that passes
// messages of type typ only.
func attachTypeFilter(fd int, typ uint32) error {
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: typeLowByte()},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, Jf: 0, K: typ},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
	}
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fp)
}

// parseRouteEvent reads what the watch needs of a route message.
func parseRouteEvent(b []byte) (netlink.Route, error) {
	r, err := parseRoute(b)
	if err != nil {
		return netlink.Route{}, fmt.Errorf("route event: %w", err)
	}
	return r.Route, nil
}
