package bgp_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/internal/nstest"
	"github.com/sluice-net/sluice/store"
)

// birdProto is BIRD's kernel route protocol number (RTPROT_BIRD).
const birdProto = 12

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

// TestSpeakerWithBIRD runs the speaker against Debian's BIRD 2 as a top-of-rack router, each
// in a namespace of its own, over eBGP with a TCP MD5 password: a block announced arrives in
// the router's table with its community and in its kernel; a block claimed is announced and
// one released withdrawn (timed); the router's own route is learned; the speaker killed
// outright leaves the router keeping this node's routes (graceful restart, no Cease), and a
// new speaker takes them over.
func TestSpeakerWithBIRD(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces")
	needBIRD(t)
	nodeNS, torNS := nstest.New(t), nstest.New(t)
	link(t, nodeNS, "eth0", "192.0.2.11/24", torNS, "eth-node", "192.0.2.1/24")
	secrets := t.TempDir()
	if err := os.MkdirAll(filepath.Join(secrets, "bgp"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "bgp", "tor"), []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tor := startBIRD(t, torNS, "tor", torConf("192.0.2.1", "192.0.2.1", 65001, "192.0.2.11", 64512, "s3cret"))

	speaker := calc.BGPSpeaker{ASN: 64512, RouterID: addr("192.0.2.11"), ListenPort: 179, Addr4: addr("192.0.2.11")}
	peer := calc.BGPPeer{Addr: addr("192.0.2.1"), ASN: 65001, LocalASN: 64512, SourceAddr: addr("192.0.2.11"), NextHop: store.NextHopAuto,
		Password: store.SecretKeyRef{Name: "bgp", Key: "tor"}, Origin: "BGPPeer tor"}
	block := calc.BGPPath{Prefix: pfx("10.80.0.0/26"), Reason: calc.AnnounceBlock, Communities: []store.Community{{A: 65000, B: 100}}}
	full := &calc.Update{Full: true, Ops: []calc.Op{{BGPSpeaker: &speaker}, {BGPPeer: &peer}, {BGPPath: &block}}}

	sp := startSpeaker(t, nodeNS, secrets)
	start := time.Now()
	sp.send(request{Update: full})
	sp.waitFor("session up", 0, 30*time.Second, func(r reply) bool { return r.Session != nil && r.Session.Up && r.Session.Peer == peer.Addr })
	t.Logf("session established %v after the first update", time.Since(start).Round(time.Millisecond))

	// The router has the block, from the node, with its community, and in its kernel.
	tor.waitC("the block at the router", "show route 10.80.0.0/26 all", 10*time.Second, func(out string) bool {
		return strings.Contains(out, "via 192.0.2.11") && strings.Contains(out, "(65000,100)")
	})
	waitKernel(t, "the block in the router's kernel", func() bool {
		return slices.Contains(kernelRoutes(t, torNS, birdProto), "10.80.0.0/26 via 192.0.2.11")
	})

	// The router's own route is learned, handed on as learned, and the router's End-of-RIB
	// makes the speaker synced at once (not after the 120 s restart time).
	waitRIB(t, sp, func(rib []string) bool { return slices.Contains(rib, "198.18.0.0/24 via [192.0.2.1] from 192.0.2.1") })
	sp.waitFor("the learned route", 0, 10*time.Second, func(r reply) bool {
		return learnedVia(r.Learned, pfx("198.18.0.0/24"), addr("192.0.2.1"))
	})
	sp.waitFor("synced", 0, 10*time.Second, func(r reply) bool { return r.Synced })
	t.Logf("synced %v after the first update", time.Since(start).Round(time.Millisecond))

	// A block claimed: one path added; one released: withdrawn.
	claimed := calc.BGPPath{Prefix: pfx("10.80.0.64/26"), Reason: calc.AnnounceBlock}
	t0 := time.Now()
	sp.send(request{Update: &calc.Update{Ops: []calc.Op{{BGPPath: &claimed}}}})
	at := tor.waitC("the claimed block at the router", "show route 10.80.0.64/26", 10*time.Second, func(out string) bool { return strings.Contains(out, "via 192.0.2.11") })
	t.Logf("claimed block at the router after %v", at.Sub(t0).Round(time.Millisecond))
	t0 = time.Now()
	sp.send(request{Update: &calc.Update{Ops: []calc.Op{{Remove: true, BGPPath: &block}}}})
	at = tor.waitC("the released block withdrawn", "show route 10.80.0.0/26", 10*time.Second, func(out string) bool { return !strings.Contains(out, "10.80.0.0/26") })
	t.Logf("released block withdrawn at the router after %v", at.Sub(t0).Round(time.Millisecond))

	// Killed outright: the router keeps the node's route (stale) and its kernel route.
	sp.kill()
	tor.waitC("the session down at the router", "show protocols node", 10*time.Second, func(out string) bool { return !strings.Contains(out, "Established") })
	time.Sleep(2 * time.Second)
	if out, _ := tor.c("show route 10.80.0.64/26"); !strings.Contains(out, "via 192.0.2.11") {
		t.Fatalf("the router dropped the node's route when the speaker was killed:\n%s\n%s", out, tor.mustC("show protocols all node"))
	}
	if !slices.Contains(kernelRoutes(t, torNS, birdProto), "10.80.0.64/26 via 192.0.2.11") {
		t.Fatalf("the router's kernel lost the node's route when the speaker was killed: %v", kernelRoutes(t, torNS, birdProto))
	}

	// A new speaker with the same desired state, restarting (the node's kernel kept its
	// routes): the session comes back offering the restarting and forwarding-state bits, and
	// the route stays.
	sp2 := startSpeaker(t, nodeNS, secrets, "SLUICE_BGP_RESTARTING=1")
	sp2.send(request{Update: &calc.Update{Full: true, Ops: []calc.Op{{BGPSpeaker: &speaker}, {BGPPeer: &peer}, {BGPPath: &claimed}}}})
	sp2.waitFor("session up again", 0, 30*time.Second, func(r reply) bool { return r.Session != nil && r.Session.Up })
	if out := tor.mustC("show protocols all node"); !strings.Contains(out[strings.Index(out, "Neighbor capabilities"):], "AF preserved: ipv4") {
		t.Errorf("the restarted speaker did not say it kept forwarding (graceful restart's F bit):\n%s", out)
	}
	tor.waitC("the route after the restart", "show route 10.80.0.64/26 all", 10*time.Second, func(out string) bool {
		return strings.Contains(out, "via 192.0.2.11") && !strings.Contains(out, "stale")
	})
	if out, _ := tor.c("show route 10.80.0.0/26"); strings.Contains(out, "10.80.0.0/26") {
		t.Fatalf("the released block came back:\n%s", out)
	}
}

func waitKernel(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitRIB(t *testing.T, sp *speakerProc, ok func([]string) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var lines []string
		for _, r := range sp.rib() {
			lines = append(lines, r.String())
		}
		if ok(lines) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the speaker's table: %q", lines)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// birdNodeConf is a calico/node-style BIRD node, as confd's templates configure one (in BIRD
// 2's syntax): its block is a static blackhole, exported to the mesh with the rest of the
// pool; what the mesh sends goes into its kernel (its next hops resolved through the
// interfaces' routes, protocol direct, as calico/node's); graceful restart; the mesh session
// to the node with the lower address made by this one (the higher connects, as calico/node's
// mesh).
const birdNodeConf = `router id 192.0.2.12;
filter calico_export_to_bgp_peers { if ( net ~ 10.80.0.0/16 ) then accept; reject; }
filter calico_kernel_programming { if ( net ~ 10.80.0.0/16 ) then accept; reject; }
protocol device { scan time 1; }
protocol direct { ipv4; interface "eth*"; }
protocol kernel { ipv4 { import none; export filter calico_kernel_programming; }; merge paths on; graceful restart; }
protocol static { ipv4; route 10.80.1.0/26 blackhole; }
protocol bgp Mesh_192_0_2_11 {
  local 192.0.2.12 as 64512;
  neighbor 192.0.2.11 as 64512;
  multihop;
  graceful restart on;
  connect retry time 1;
  ipv4 { import all; export filter calico_export_to_bgp_peers; };
}
`

// TestSpeakerInMeshWithBIRDNode: a sluice node and a calico/node-style BIRD node in one
// node-to-node mesh (iBGP, AS 64512): each learns the other's block, BIRD programs sluice's
// into its kernel, and the session is made from BIRD's side (sluice, the lower address, is
// passive, as calc makes mesh sessions).
func TestSpeakerInMeshWithBIRDNode(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces")
	needBIRD(t)
	sluiceNS, birdNS := nstest.New(t), nstest.New(t)
	link(t, sluiceNS, "eth0", "192.0.2.11/24", birdNS, "eth0", "192.0.2.12/24")
	node := startBIRD(t, birdNS, "node-b", birdNodeConf)

	speaker := calc.BGPSpeaker{ASN: 64512, RouterID: addr("192.0.2.11"), ListenPort: 179, Addr4: addr("192.0.2.11")}
	peer := calc.BGPPeer{Addr: addr("192.0.2.12"), ASN: 64512, LocalASN: 64512, SourceAddr: addr("192.0.2.11"), NextHop: store.NextHopAuto,
		Passive: true, Node: "node-b", Origin: "mesh"}
	block := calc.BGPPath{Prefix: pfx("10.80.0.0/26"), Reason: calc.AnnounceBlock}
	sp := startSpeaker(t, sluiceNS, t.TempDir())
	sp.send(request{Update: &calc.Update{Full: true, Ops: []calc.Op{{BGPSpeaker: &speaker}, {BGPPeer: &peer}, {BGPPath: &block}}}})
	sp.waitFor("the mesh session up", 0, 30*time.Second, func(r reply) bool { return r.Session != nil && r.Session.Up })
	sp.waitFor("the BIRD node's block learned", 0, 10*time.Second, func(r reply) bool {
		return learnedVia(r.Learned, pfx("10.80.1.0/26"), addr("192.0.2.12"))
	})
	node.waitC("sluice's block at the BIRD node", "show route 10.80.0.0/26", 10*time.Second, func(out string) bool { return strings.Contains(out, "via 192.0.2.11") })
	waitKernel(t, "sluice's block in the BIRD node's kernel", func() bool {
		return slices.Contains(kernelRoutes(t, birdNS, birdProto), "10.80.0.0/26 via 192.0.2.11")
	})
	if out := node.mustC("show protocols all Mesh_192_0_2_11"); !strings.Contains(out, "Source address:   192.0.2.12") || !strings.Contains(out, "internal") {
		t.Errorf("the mesh session as the BIRD node sees it:\n%s", out)
	}
}

// TestSpeakerNextHopMode: BGPPeer's nextHopMode on the wire, and the node no transit. The
// node, a route reflector, reflects what its client A sends over iBGP to B: by BGP's own rule
// (Auto) B sees A's address as next hop, with Self the node's own. What router E sends over
// eBGP never reaches B (calico/node's export filter: a node is no transit).
func TestSpeakerNextHopMode(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces")
	needBIRD(t)
	nodeNS, aNS, bNS, eNS := nstest.New(t), nstest.New(t), nstest.New(t), nstest.New(t)
	link(t, nodeNS, "eth0", "192.0.2.11/24", aNS, "eth0", "192.0.2.1/24")
	link(t, nodeNS, "eth1", "198.51.100.11/24", bNS, "eth0", "198.51.100.2/24")
	link(t, nodeNS, "eth2", "203.0.113.11/24", eNS, "eth0", "203.0.113.1/24")
	startBIRD(t, aNS, "a", routerConf("192.0.2.1", "192.0.2.1", 64512, "192.0.2.11", 64512, "", "198.18.0.0/24"))
	startBIRD(t, eNS, "e", routerConf("203.0.113.1", "203.0.113.1", 65001, "203.0.113.11", 64512, "", "198.19.0.0/24"))
	b := startBIRD(t, bNS, "b", `router id 198.51.100.2;
protocol device {}
protocol bgp node {
  local 198.51.100.2 as 64512;
  neighbor 198.51.100.11 as 64512;
  connect retry time 1;
  ipv4 { import all; export none; };
}
`)
	speaker := calc.BGPSpeaker{ASN: 64512, RouterID: addr("192.0.2.11"), ListenPort: 179, Addr4: addr("192.0.2.11"), ClusterID: addr("10.0.0.1")}
	toA := calc.BGPPeer{Addr: addr("192.0.2.1"), ASN: 64512, LocalASN: 64512, SourceAddr: addr("192.0.2.11"), NextHop: store.NextHopAuto, RRClient: true, Origin: "BGPPeer a"}
	toE := calc.BGPPeer{Addr: addr("203.0.113.1"), ASN: 65001, LocalASN: 64512, SourceAddr: addr("203.0.113.11"), NextHop: store.NextHopAuto, Origin: "BGPPeer e"}
	toB := calc.BGPPeer{Addr: addr("198.51.100.2"), ASN: 64512, LocalASN: 64512, SourceAddr: addr("198.51.100.11"), NextHop: store.NextHopSelf, RRClient: true, Origin: "BGPPeer b"}
	sp := startSpeaker(t, nodeNS, t.TempDir())
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(sp.said())
		}
	})
	sp.send(request{Update: &calc.Update{Full: true, Ops: []calc.Op{{BGPSpeaker: &speaker}, {BGPPeer: &toA}, {BGPPeer: &toB}, {BGPPeer: &toE}}}})
	b.waitC("A's route reflected to B, next hop the node (Self)", "show route 198.18.0.0/24 all", 30*time.Second, func(out string) bool {
		return strings.Contains(out, "BGP.next_hop: 198.51.100.11")
	})
	waitRIB(t, sp, func(rib []string) bool {
		return slices.Contains(rib, "198.19.0.0/24 via [203.0.113.1] from 203.0.113.1")
	})
	auto := toB
	auto.NextHop = store.NextHopAuto
	sp.send(request{Update: &calc.Update{Ops: []calc.Op{{BGPPeer: &auto}}}})
	b.waitC("A's route reflected to B, next hop A's (Auto over iBGP)", "show route 198.18.0.0/24 all", 30*time.Second, func(out string) bool {
		return strings.Contains(out, "BGP.next_hop: 192.0.2.1")
	})
	if out, _ := b.c("show route 198.19.0.0/24"); strings.Contains(out, "198.19.0.0/24") {
		t.Fatalf("E's route (learned over eBGP) reached B through the node:\n%s", out)
	}
}

// TestSpeakerWithFRR: FRR's bgpd (Debian's frr) as a top-of-rack router over eBGP: the node's
// block with its community at the router, the router's route learned, a block released
// withdrawn.
func TestSpeakerWithFRR(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces")
	needFRR(t)
	nodeNS, torNS := nstest.New(t), nstest.New(t)
	link(t, nodeNS, "eth0", "192.0.2.11/24", torNS, "eth-node", "192.0.2.1/24")
	tor := startFRR(t, torNS, `frr defaults traditional
hostname tor
router bgp 65001
 bgp router-id 192.0.2.1
 no bgp ebgp-requires-policy
 no bgp network import-check
 bgp graceful-restart
 neighbor 192.0.2.11 remote-as 64512
 neighbor 192.0.2.11 timers connect 1
 address-family ipv4 unicast
  network 198.18.0.0/24
 exit-address-family
`)
	speaker := calc.BGPSpeaker{ASN: 64512, RouterID: addr("192.0.2.11"), ListenPort: 179, Addr4: addr("192.0.2.11")}
	peer := calc.BGPPeer{Addr: addr("192.0.2.1"), ASN: 65001, LocalASN: 64512, SourceAddr: addr("192.0.2.11"), NextHop: store.NextHopAuto, Origin: "BGPPeer tor"}
	block := calc.BGPPath{Prefix: pfx("10.80.0.0/26"), Reason: calc.AnnounceBlock, Communities: []store.Community{{A: 65000, B: 100}}}
	sp := startSpeaker(t, nodeNS, t.TempDir())
	sp.send(request{Update: &calc.Update{Full: true, Ops: []calc.Op{{BGPSpeaker: &speaker}, {BGPPeer: &peer}, {BGPPath: &block}}}})
	sp.waitFor("session up", 0, 30*time.Second, func(r reply) bool { return r.Session != nil && r.Session.Up })
	tor.waitC("the block at FRR with its community", "show bgp ipv4 unicast 10.80.0.0/26", 10*time.Second, func(out string) bool {
		return strings.Contains(out, "192.0.2.11") && strings.Contains(out, "65000:100")
	})
	sp.waitFor("FRR's route learned", 0, 10*time.Second, func(r reply) bool {
		return learnedVia(r.Learned, pfx("198.18.0.0/24"), addr("192.0.2.1"))
	})
	sp.send(request{Update: &calc.Update{Ops: []calc.Op{{Remove: true, BGPPath: &block}}}})
	tor.waitC("the released block withdrawn at FRR", "show bgp ipv4 unicast 10.80.0.0/26", 10*time.Second, func(out string) bool {
		return strings.Contains(out, "not in table")
	})
}

// TestSpeakerMultipathWithBIRD: two top-of-rack routers (BIRD, one AS) on the node's segment
// announce the same route: the speaker hands calc both next hops as one multipath set (as
// calico/node's BIRD merges paths); one router gone leaves the other's path, and back, both.
func TestSpeakerMultipathWithBIRD(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces")
	needBIRD(t)
	nodeNS, aNS, bNS := nstest.New(t), nstest.New(t), nstest.New(t)
	segment(t, nodeNS, "192.0.2.11/24", []segmentPort{{aNS, "192.0.2.1/24"}, {bNS, "192.0.2.2/24"}})
	torA := startBIRD(t, aNS, "tora", torConf("192.0.2.1", "192.0.2.1", 65001, "192.0.2.11", 64512, ""))
	torB := startBIRD(t, bNS, "torb", torConf("192.0.2.2", "192.0.2.2", 65001, "192.0.2.11", 64512, ""))

	speaker := calc.BGPSpeaker{ASN: 64512, RouterID: addr("192.0.2.11"), ListenPort: 179, Addr4: addr("192.0.2.11")}
	peerA := calc.BGPPeer{Addr: addr("192.0.2.1"), ASN: 65001, LocalASN: 64512, SourceAddr: addr("192.0.2.11"), NextHop: store.NextHopAuto, Origin: "BGPPeer tor-a"}
	peerB := peerA
	peerB.Addr, peerB.Origin = addr("192.0.2.2"), "BGPPeer tor-b"
	block := calc.BGPPath{Prefix: pfx("10.80.0.0/26"), Reason: calc.AnnounceBlock}
	sp := startSpeaker(t, nodeNS, t.TempDir())
	sp.send(request{Update: &calc.Update{Full: true, Ops: []calc.Op{{BGPSpeaker: &speaker}, {BGPPeer: &peerA}, {BGPPeer: &peerB}, {BGPPath: &block}}}})
	route, a, b := pfx("198.18.0.0/24"), addr("192.0.2.1"), addr("192.0.2.2")
	sp.waitFor("both paths as one set", 0, 30*time.Second, func(r reply) bool { return learnedVia(r.Learned, route, a, b) })
	waitRIB(t, sp, func(rib []string) bool {
		return slices.ContainsFunc(rib, func(l string) bool { return strings.HasPrefix(l, "198.18.0.0/24 via [192.0.2.1 192.0.2.2] from ") })
	})
	for _, tor := range []*bird{torA, torB} {
		tor.waitC("the block at the router", "show route 10.80.0.0/26", 10*time.Second, func(out string) bool { return strings.Contains(out, "via 192.0.2.11") })
	}

	sp.waitCounts(2, 2)

	// Router b stops: its path leaves the set. Back: both again.
	from := sp.count()
	torB.mustC("disable node")
	sp.waitFor("router a's path alone", from, 10*time.Second, func(r reply) bool { return learnedVia(r.Learned, route, a) })
	sp.waitCounts(2, 1)
	from = sp.count()
	torB.mustC("enable node")
	sp.waitFor("both paths again", from, 30*time.Second, func(r reply) bool { return learnedVia(r.Learned, route, a, b) })

	// Both stop: withdrawn.
	from = sp.count()
	torA.mustC("disable node")
	torB.mustC("disable node")
	sp.waitFor("the route withdrawn", from, 10*time.Second, func(r reply) bool { return learnedVia(r.Learned, route) })
}

// TestSpeakerIPv6WithBIRD: an IPv6 session (calico/node's BIRD6 peers over IPv6 for IPv6
// pools): an IPv6 block arrives at the router from the node's IPv6 address and in its
// kernel, the router's IPv6 route is learned with its IPv6 next hop, and a released block is
// withdrawn.
func TestSpeakerIPv6WithBIRD(t *testing.T) {
	nstest.NeedRoot(t, "network namespaces")
	needBIRD(t)
	nodeNS, torNS := nstest.New(t), nstest.New(t)
	link(t, nodeNS, "eth0", "2001:db8:2::11/64", torNS, "eth-node", "2001:db8:2::1/64")
	tor := startBIRD(t, torNS, "tor", torConf6("192.0.2.1", "2001:db8:2::1", 65001, "2001:db8:2::11", 64512))
	speaker := calc.BGPSpeaker{ASN: 64512, RouterID: addr("192.0.2.11"), ListenPort: 179, Addr6: addr("2001:db8:2::11")}
	peer := calc.BGPPeer{Addr: addr("2001:db8:2::1"), ASN: 65001, LocalASN: 64512, SourceAddr: addr("2001:db8:2::11"), NextHop: store.NextHopAuto, Origin: "BGPPeer tor6"}
	block := calc.BGPPath{Prefix: pfx("fd00:80::/122"), Reason: calc.AnnounceBlock}
	sp := startSpeaker(t, nodeNS, t.TempDir())
	sp.send(request{Update: &calc.Update{Full: true, Ops: []calc.Op{{BGPSpeaker: &speaker}, {BGPPeer: &peer}, {BGPPath: &block}}}})
	sp.waitFor("the IPv6 session up", 0, 30*time.Second, func(r reply) bool { return r.Session != nil && r.Session.Up && r.Session.Peer == peer.Addr })
	tor.waitC("the IPv6 block at the router", "show route fd00:80::/122", 10*time.Second, func(out string) bool { return strings.Contains(out, "via 2001:db8:2::11") })
	waitKernel(t, "the IPv6 block in the router's kernel", func() bool {
		return slices.Contains(kernelRoutes(t, torNS, birdProto), "fd00:80::/122 via 2001:db8:2::11")
	})
	sp.waitFor("the router's IPv6 route learned", 0, 10*time.Second, func(r reply) bool {
		return learnedVia(r.Learned, pfx("2001:db8:18::/48"), addr("2001:db8:2::1"))
	})
	sp.send(request{Update: &calc.Update{Ops: []calc.Op{{Remove: true, BGPPath: &block}}}})
	tor.waitC("the IPv6 block withdrawn", "show route fd00:80::/122", 10*time.Second, func(out string) bool { return !strings.Contains(out, "fd00:80::/122") })
}
