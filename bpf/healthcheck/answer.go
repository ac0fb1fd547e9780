package healthcheck

import (
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
)

// serviceAnswer is the body of a health-check node port answer, as kube-proxy writes it.
type serviceAnswer struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// serviceHandler answers any path on a health-check node port: 200 when the service owning
// port has a local ready endpoint of the family the check came by and the agent is healthy,
// 503 otherwise. Each family forwards to its own endpoints: a node with IPv4 endpoints only
// must not tell a load balancer checking over IPv6 to send it IPv6 connections.
func (s *Servers) serviceHandler(port uint16) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		h := s.services[port]
		healthy := s.healthy
		s.mu.Unlock()

		local := h.local4
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if ap, err := netip.ParseAddrPort(la.String()); err == nil && !ap.Addr().Unmap().Is4() {
				local = h.local6
			}
		}
		var a serviceAnswer
		a.Service.Namespace, a.Service.Name = h.namespace, h.name
		a.LocalEndpoints = local
		a.ServiceProxyHealthy = healthy
		writeJSON(w, local > 0 && healthy, a)
	})
}

// writeJSON writes v as the JSON body, with status 200 when ok and 503 when not.
func writeJSON(w http.ResponseWriter, ok bool, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if ok {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(body) // the client went away; nothing to do
}
