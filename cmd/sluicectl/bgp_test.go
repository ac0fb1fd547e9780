package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/bgp"
)

// TestBGPCommand: sluicectl bgp asks sluiced's /bgp and prints each session (and, with
// --routes, the table); a sluiced without BGP is told apart from one that cannot be reached.
func TestBGPCommand(t *testing.T) {
	up := time.Now().Add(-90 * time.Second)
	report := bgpReport{
		Sessions: []bgp.Session{
			{Peer: netip.MustParseAddr("192.0.2.1"), ASN: 65001, LocalASN: 64512, Origin: "BGPPeer tor", State: "established", Since: up, Received: 3, Accepted: 2, Advertised: 4},
			{Peer: netip.MustParseAddr("192.0.2.12"), ASN: 64512, LocalASN: 64512, Origin: "mesh", State: "active"},
		},
		Routes: []bgp.Route{
			{Prefix: netip.MustParsePrefix("10.80.0.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("192.0.2.11")}},
			{Prefix: netip.MustParsePrefix("198.18.0.0/24"), NextHops: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, Peer: netip.MustParseAddr("192.0.2.1"), Stale: true},
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/bgp" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(report)
	}))
	defer srv.Close()
	c := newCluster(t)
	agent := strings.TrimPrefix(srv.URL, "http://")
	out := table(c.mustCtl("bgp", "--agent", agent, "--routes"))
	for _, want := range []string{
		"PEER AS LOCAL-AS STATE SINCE RECEIVED ACCEPTED ANNOUNCED ORIGIN",
		"192.0.2.1 65001 64512 established 1m30s 3 2 4 BGPPeer tor",
		"192.0.2.12 64512 64512 active - 0 0 0 mesh",
		"ROUTES (2)",
		"10.80.0.0/26 192.0.2.11 local",
		"198.18.0.0/24 192.0.2.1 192.0.2.1 (stale)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("bgp lacks %q:\n%s", want, out)
		}
	}
	if out := c.mustCtl("bgp", "--agent", agent); strings.Contains(out, "ROUTES") {
		t.Errorf("the table without --routes:\n%s", out)
	}
	var got bgpReport
	if err := json.Unmarshal([]byte(c.mustCtl("bgp", "--agent", agent, "-o", "json")), &got); err != nil || len(got.Sessions) != 2 || got.Sessions[0].Received != 3 {
		t.Errorf("json: %v %+v", err, got)
	}
	noBGP := httptest.NewServer(http.NotFoundHandler())
	defer noBGP.Close()
	if r := c.ctl("", "bgp", "--agent", strings.TrimPrefix(noBGP.URL, "http://")); r.code != 1 || !strings.Contains(r.stderr, "runs no BGP speaker") {
		t.Errorf("a sluiced without BGP: exit %d, %q", r.code, r.stderr)
	}
	if r := c.ctl("", "bgp", "--agent", "127.0.0.1:1"); r.code != 1 || !strings.Contains(r.stderr, "asking sluiced at 127.0.0.1:1") {
		t.Errorf("no sluiced: exit %d, %q", r.code, r.stderr)
	}
}
