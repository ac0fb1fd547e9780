package bgp

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/osrg/gobgp/v4/api"
)

// Session is one session's status, for `sluicectl bgp`, the metrics and the status key.
type Session struct {
	Peer     netip.Addr `json:"peer"`
	ASN      uint32     `json:"asn"`
	LocalASN uint32     `json:"localASN"`
	Origin   string     `json:"origin"`
	// State is BGP's: idle, connect, active, opensent, openconfirm, established.
	State string `json:"state"`
	// Since is when the session last came up (established) or went down (otherwise); zero
	// when it never did.
	Since time.Time `json:"since,omitzero"`
	// Prefixes received from the peer, accepted of those, and announced to it.
	Received   uint64 `json:"received"`
	Accepted   uint64 `json:"accepted"`
	Advertised uint64 `json:"advertised"`
}

// Up reports whether the session is established.
func (s Session) Up() bool { return s.State == "established" }

// Sessions lists the running speaker's sessions by peer address (nil while none runs).
func (s *Speaker) Sessions(ctx context.Context) ([]Session, error) {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return nil, nil
	}
	var out []Session
	err := srv.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		var ses Session
		if p.Conf != nil {
			ses.Peer, _ = netip.ParseAddr(p.Conf.NeighborAddress)
			ses.ASN, ses.LocalASN, ses.Origin = p.Conf.PeerAsn, p.Conf.LocalAsn, p.Conf.Description
		}
		if st := p.State; st != nil {
			ses.State = strings.TrimPrefix(strings.ToLower(st.SessionState.String()), "session_state_")
		}
		if t := p.Timers; t != nil && t.State != nil {
			switch {
			case ses.Up() && t.State.Uptime != nil:
				ses.Since = t.State.Uptime.AsTime()
			case !ses.Up() && t.State.Downtime != nil && t.State.Downtime.AsTime().Unix() > 0:
				ses.Since = t.State.Downtime.AsTime()
			}
		}
		for _, af := range p.AfiSafis {
			if st := af.State; st != nil {
				ses.Received += st.Received
				ses.Accepted += st.Accepted
				ses.Advertised += st.Advertised
			}
		}
		out = append(out, ses)
	})
	slices.SortFunc(out, func(a, b Session) int { return a.Peer.Compare(b.Peer) })
	return out, err
}
