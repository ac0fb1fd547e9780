package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"github.com/vishvananda/netlink"
)

// torProto is the protocol of the routes the lab's top-of-rack router programs (RTPROT_BGP).
const torProto = 186

// toolTOR is the lab's own top-of-rack router, so that `make demo` needs nothing but
// iproute2: a BGP speaker (GoBGP) that peers over eBGP with the nodes named, passes what one
// announces on to the others (next hop itself, as a router does), and programs what it learns
// into its namespace's kernel, several nodes' paths to one prefix as one multipath (ECMP)
// route. It prints "READY", then a line per change of its kernel routes:
// "ROUTE <prefix> <next hops,...>" or "ROUTE <prefix> -", and "UP <peer>" / "DOWN <peer>".
// On its standard input it takes "announce <prefix>" and "withdraw <prefix>": a route of its
// own to every peer, next hop itself (it answers "ANNOUNCED <prefix>", "WITHDRAWN <prefix>").
//
//	tor --as 65010 --router-id 192.168.10.1 --peer 192.168.10.11:64601 --peer ...
func toolTOR(args []string) error {
	fs := flag.NewFlagSet("tor", flag.ContinueOnError)
	asn := fs.Uint("as", 65010, "the router's AS")
	routerID := fs.String("router-id", "", "the router's ID (an IPv4 address)")
	var peers []string
	fs.Func("peer", "a node to peer with: ADDRESS:AS (repeatable)", func(v string) error { peers = append(peers, v); return nil })
	if err := fs.Parse(args); err != nil {
		return err
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	srv := server.NewBgpServer(server.LoggerOption(slog.New(slog.DiscardHandler), new(slog.LevelVar)))
	go srv.Serve()
	ctx := context.Background()
	if err := srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: uint32(*asn), RouterId: *routerID, ListenPort: 179, Families: []uint32{0}}}); err != nil {
		return err
	}
	t := &tor{h: h, adj: map[netip.Prefix]map[netip.Addr]netip.Addr{}}
	if err := srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{OnPathUpdate: t.onUpdate}, server.WatchUpdate(true, "", "")); err != nil {
		return err
	}
	if err := srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{OnPeerUpdate: t.onPeer}, server.WatchPeer()); err != nil {
		return err
	}
	for _, p := range peers {
		host, as, ok := strings.Cut(p, ":")
		n, err := strconv.ParseUint(as, 10, 32)
		if !ok || err != nil || net.ParseIP(host) == nil {
			return fmt.Errorf("--peer %q: want ADDRESS:AS", p)
		}
		peer := &api.Peer{Conf: &api.PeerConf{NeighborAddress: host, PeerAsn: uint32(n)},
			Timers:          &api.Timers{Config: &api.TimersConfig{ConnectRetry: 1}},
			GracefulRestart: &api.GracefulRestart{Enabled: true, RestartTime: 120},
			AfiSafis: []*api.AfiSafi{{Config: &api.AfiSafiConfig{Family: &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}, Enabled: true},
				MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}}}}
		if err := srv.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
			return fmt.Errorf("peer %s: %w", host, err)
		}
	}
	fmt.Println("READY")
	go torCommands(srv)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}

// torCommands announces and withdraws the router's own routes as its standard input says.
func torCommands(srv *server.BgpServer) {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		verb, arg, _ := strings.Cut(strings.TrimSpace(in.Text()), " ")
		prefix, err := netip.ParsePrefix(arg)
		if err != nil || !prefix.Addr().Is4() || (verb != "announce" && verb != "withdraw") {
			fmt.Fprintf(os.Stderr, "tor: %q: want announce|withdraw <IPv4 prefix>\n", in.Text())
			continue
		}
		nlri, _ := bgp.NewIPAddrPrefix(prefix)
		nh, _ := bgp.NewPathAttributeNextHop(netip.IPv4Unspecified()) // itself, to each peer
		path := &apiutil.Path{Family: bgp.RF_IPv4_UC, Nlri: nlri, Attrs: []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP), nh}}
		if verb == "announce" {
			_, err = srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{path}})
		} else {
			err = srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{path}})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "tor:", verb, prefix, err)
			continue
		}
		fmt.Println(map[string]string{"announce": "ANNOUNCED", "withdraw": "WITHDRAWN"}[verb], prefix)
	}
}

// tor holds what each peer announced of each prefix (its next hop) and programs the kernel.
type tor struct {
	h   *netlink.Handle
	mu  sync.Mutex
	adj map[netip.Prefix]map[netip.Addr]netip.Addr // prefix -> peer -> next hop
}

func (t *tor) onPeer(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
	if ev.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	switch st := ev.Peer.State.SessionState; {
	case st == bgp.BGP_FSM_ESTABLISHED:
		fmt.Println("UP", ev.Peer.Conf.NeighborAddress)
	case ev.Peer.State.DisconnectReason != api.PeerState_DISCONNECT_REASON_UNSPECIFIED || st == bgp.BGP_FSM_IDLE || st == bgp.BGP_FSM_ACTIVE:
		fmt.Println("DOWN", ev.Peer.Conf.NeighborAddress, st)
	}
}

// onUpdate takes the paths peers announce and withdraw (before best-path selection: every
// node's path counts for ECMP) and programs each changed prefix. A session lost under
// graceful restart withdraws nothing here: its paths stay until the peer comes back or its
// restart time is over, as GoBGP keeps them.
func (t *tor) onUpdate(paths []*apiutil.Path, _ time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := map[netip.Prefix]bool{}
	for _, p := range paths {
		if p.Nlri == nil || !p.PeerAddress.IsValid() {
			continue
		}
		prefix, err := netip.ParsePrefix(p.Nlri.String())
		if err != nil {
			continue
		}
		m := t.adj[prefix]
		if p.Withdrawal {
			delete(m, p.PeerAddress)
		} else {
			if m == nil {
				m = map[netip.Addr]netip.Addr{}
				t.adj[prefix] = m
			}
			for _, a := range p.Attrs {
				if nh, ok := a.(*bgp.PathAttributeNextHop); ok {
					m[p.PeerAddress] = nh.Value
				}
			}
		}
		changed[prefix] = true
	}
	for prefix := range changed {
		t.program(prefix)
	}
}

// program writes prefix's route: one next hop, several (multipath), or none (deleted).
func (t *tor) program(prefix netip.Prefix) {
	var hops []netip.Addr
	for _, nh := range t.adj[prefix] {
		if !slices.Contains(hops, nh) {
			hops = append(hops, nh)
		}
	}
	slices.SortFunc(hops, func(a, b netip.Addr) int { return a.Compare(b) })
	dst := &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())}
	r := &netlink.Route{Dst: dst, Protocol: torProto}
	if len(hops) == 0 {
		delete(t.adj, prefix)
		if err := t.h.RouteDel(r); err != nil && !errors.Is(err, syscall.ESRCH) {
			fmt.Fprintln(os.Stderr, "tor: deleting", prefix, err)
		}
		fmt.Println("ROUTE", prefix, "-")
		return
	}
	if len(hops) == 1 {
		r.Gw = hops[0].AsSlice()
	} else {
		for _, nh := range hops {
			r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{Gw: nh.AsSlice()})
		}
	}
	if err := t.h.RouteReplace(r); err != nil {
		fmt.Fprintln(os.Stderr, "tor: programming", prefix, err)
		return
	}
	s := make([]string, len(hops))
	for i, h := range hops {
		s[i] = h.String()
	}
	fmt.Println("ROUTE", prefix, strings.Join(s, ","))
}
