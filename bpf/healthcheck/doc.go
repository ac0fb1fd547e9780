// Package healthcheck owns the HTTP health checks that load balancers send to this node for
// services: for each LoadBalancer service with externalTrafficPolicy Local, a server on its
// health-check node port at each of the node's addresses, answering whether this node has a
// local ready endpoint (kube-proxy's service health check); and the proxy health server
// (/healthz, /livez) that load balancers of Cluster-policy services probe. It opens and
// closes only its own listeners, never logs, and answers what its caller last set.
package healthcheck
