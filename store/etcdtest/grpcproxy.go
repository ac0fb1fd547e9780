package etcdtest

import (
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// GRPCProxyChildEnv is the environment variable that makes ServeChild serve
// etcd's gRPC proxy instead of a server. It holds the endpoint the proxy
// forwards to.
const GRPCProxyChildEnv = "SLUICE_ETCDTEST_GRPCPROXY_CHILD"

// GRPCProxy is etcd's gRPC proxy (the one `etcd grpc-proxy start` runs),
// in this process, on a free 127.0.0.1 port, forwarding to one etcd
// endpoint over plain http. Its watches are coalesced: clients watching
// the same range share one watch on etcd.
type GRPCProxy struct {
	ln     net.Listener
	server *grpc.Server
	client *clientv3.Client
	log    *tailBuffer // nil when the log goes elsewhere (a child's stderr)
	served chan struct{}

	closeOnce sync.Once
}

// StartGRPCProxy starts a proxy to endpoint, an etcd client URL such as
// "http://127.0.0.1:2379". The proxy dials lazily: an unreachable etcd
// shows up on the first request through it.
func StartGRPCProxy(endpoint string) (*GRPCProxy, error) {
	log := &tailBuffer{max: 64 << 10}
	p, err := startGRPCProxy(endpoint, log)
	if err != nil {
		return nil, err
	}
	p.log = log
	return p, nil
}

// NewGRPCProxy starts a proxy to endpoint for a test or benchmark,
// registers t.Cleanup(Close), and fails the test on error.
func NewGRPCProxy(t testing.TB, endpoint string) *GRPCProxy {
	t.Helper()
	p, err := StartGRPCProxy(endpoint)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// startGRPCProxy builds the proxy as etcd's own grpc-proxy command does with its
// default flags (etcdmain's newGRPCProxyServer and newClientCfg): the same
// services, the same client settings towards etcd, the same keepalive policy
// towards its clients. Left out: the HTTP endpoints (/health, /metrics) the
// command serves beside gRPC on the same port, its Prometheus interceptors
// (registered globally, they would clash on a second proxy in one process),
// and TLS. The log (errors only, unless LogLevelEnv says otherwise) goes to
// logOut.
func startGRPCProxy(endpoint string, logOut io.Writer) (*GRPCProxy, error) {
	lg := logTo(logOut)

	client, err := clientv3.New(clientv3.Config{
		Endpoints:            []string{endpoint},
		DialTimeout:          DialTimeout,
		DialKeepAliveTimeout: embed.DefaultGRPCKeepAliveTimeout,
		MaxCallSendMsgSize:   3 << 19, // the command's 1.5 MiB
		MaxCallRecvMsgSize:   math.MaxInt32,
		Logger:               lg.Named("client"),
		// A client's auth token travels on to etcd.
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(grpcproxy.AuthUnaryClientInterceptor),
			grpc.WithStreamInterceptor(grpcproxy.AuthStreamClientInterceptor)},
	})
	if err != nil {
		return nil, fmt.Errorf("etcdtest: grpc proxy client of %s: %w", endpoint, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("etcdtest: grpc proxy listen: %w", err)
	}

	kvp, _ := grpcproxy.NewKvProxy(client)
	watchp, _ := grpcproxy.NewWatchProxy(client.Ctx(), lg, client)
	clusterp, _ := grpcproxy.NewClusterProxy(lg, client, "", "")
	leasep, _ := grpcproxy.NewLeaseProxy(client.Ctx(), client)
	server := grpc.NewServer(
		grpc.MaxConcurrentStreams(math.MaxUint32),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: embed.DefaultGRPCKeepAliveMinTime}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: embed.DefaultGRPCKeepAliveInterval, Timeout: embed.DefaultGRPCKeepAliveTimeout}),
	)
	pb.RegisterKVServer(server, kvp)
	pb.RegisterWatchServer(server, watchp)
	pb.RegisterClusterServer(server, clusterp)
	pb.RegisterLeaseServer(server, leasep)
	pb.RegisterMaintenanceServer(server, grpcproxy.NewMaintenanceProxy(client))
	pb.RegisterAuthServer(server, grpcproxy.NewAuthProxy(client))
	v3electionpb.RegisterElectionServer(server, grpcproxy.NewElectionProxy(client))
	v3lockpb.RegisterLockServer(server, grpcproxy.NewLockProxy(client))

	p := &GRPCProxy{ln: ln, server: server, client: client, served: make(chan struct{})}
	go func() {
		defer close(p.served)
		_ = server.Serve(ln) // returns when Close stops the server
	}()
	return p, nil
}

// Endpoint returns the proxy's client URL, "http://127.0.0.1:PORT".
func (p *GRPCProxy) Endpoint() string {
	return "http://127.0.0.1:" + strconv.Itoa(p.ln.Addr().(*net.TCPAddr).Port)
}

// Log returns the end of what the proxy logged (its errors, unless
// LogLevelEnv says otherwise): the last 64 KiB.
func (p *GRPCProxy) Log() string {
	if p.log == nil {
		return ""
	}
	return p.log.String()
}

// Close stops listening, drops every client connection at once (open
// watches and lease keepalives included, rather than wait for them to end),
// and closes the proxy's connection to etcd. It is idempotent.
func (p *GRPCProxy) Close() {
	p.closeOnce.Do(func() {
		p.server.Stop()
		<-p.served
		p.client.Close()
	})
}

// StartGRPCProxyChild runs a gRPC proxy to endpoint in a child process, as
// StartChild runs a server, so that its CPU and memory can be measured
// apart. The returned Child has no data dir; Close ends the proxy.
func StartGRPCProxyChild(endpoint string) (*Child, error) {
	c := &Child{exited: make(chan struct{}), stderr: &tailBuffer{max: 64 << 10}}
	if err := c.start(GRPCProxyChildEnv + "=" + endpoint); err != nil {
		return nil, err
	}
	return c, nil
}

// serveGRPCProxyChild is ServeChild for a proxy: it logs to stderr, which
// the parent keeps the end of.
func serveGRPCProxyChild(endpoint string) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	p, err := startGRPCProxy(endpoint, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcdtest grpc proxy child: %v\n", err)
		return 1
	}
	defer p.Close()
	return announceAndWait(p.Endpoint(), sigs)
}
