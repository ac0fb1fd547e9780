// Package etcdtest starts real embedded etcd servers on loopback for tests, benchmarks and the lab, and injects faults between them and their clients.
//
// New and NewCluster give a test a single member or an n-member cluster
// in this process; StartChild runs a member in a child process (the
// binary must call ServeChild first, in TestMain or main) so that a
// benchmark's heap holds only the client. WriteTLSFiles and EnableAuth
// turn on client-certificate TLS and password auth; Proxy cuts and
// restores the link between a client and a server.
//
// Every server listens on 127.0.0.1 on free ports, keeps its data in a
// temp dir unless told otherwise, and is tuned for tests: no fsync, a
// 10 ms heartbeat and 100 ms election timeout, a 4 GiB backend quota, no
// auto-compaction. etcd writes nothing to stdout or stderr: its errors
// go to etcd.log in the data dir (see LogLevelEnv).
package etcdtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
)

// Tuning shared by every server this package starts.
const (
	// ReadyTimeout bounds how long Start, Restart and StartCluster wait for
	// a member to report ready.
	ReadyTimeout = 30 * time.Second
	// DialTimeout is the DialTimeout of the clients made by Client.
	DialTimeout = 5 * time.Second

	tickMs            = 10
	electionMs        = 100
	snapshotCount     = 10000
	quotaBackendBytes = 4 << 30 // room for 200,000 keys of ~1 KiB and their history
	bcryptCost        = 4       // bcrypt.MinCost: fast EnableAuth and logins
	logFileName       = "etcd.log"
	startAttempts     = 3 // retries when an auto-picked port was taken meanwhile
)

// Options for one member.
type Options struct {
	// Dir is the data dir; "" means a new temp dir that Close removes
	// (only a dir the package created is ever removed).
	Dir string
	// TLS nil means plain http; otherwise the client URL serves https and
	// requires a client certificate signed by TLS.CAFile. Peer traffic
	// stays plain http on loopback.
	TLS *TLSFiles
	// ClientPort 0 means pick a free loopback port.
	ClientPort int
	// PeerPort 0 means pick a free loopback port.
	PeerPort int
	// ClientHost is the address clients reach the server on; "" means 127.0.0.1. The lab
	// serves the nodes' network namespaces this way; it needs an explicit ClientPort.
	ClientHost string
}

// Server is one embedded etcd member listening on 127.0.0.1.
type Server struct {
	mu sync.Mutex

	name           string
	clientHost     string
	dir            string
	ownDir         bool
	tls            *TLSFiles
	clientPort     int
	peerPort       int
	autoClientPort bool
	autoPeerPort   bool
	initialCluster string // "" means a one-member cluster of itself
	token          string

	etcd    *embed.Etcd
	logFile *os.File
	closed  bool

	grpcMu      sync.Mutex
	grpcServers []*grpc.Server // client-facing gRPC servers of the running etcd

	user, password string // set by EnableAuth; used by Client
}

// Start starts a single-member etcd server and waits (at most
// ReadyTimeout) until it is ready to serve.
func Start(opts Options) (*Server, error) {
	s, err := newServer(opts, "default")
	if err != nil {
		return nil, err
	}
	s.token = uniqueToken()
	for attempt := 1; ; attempt++ {
		err = s.start()
		if err == nil {
			return s, nil
		}
		if attempt >= startAttempts || !isAddrInUse(err) || !(s.autoClientPort || s.autoPeerPort) {
			break
		}
		if err2 := s.repickPorts(); err2 != nil {
			break
		}
	}
	s.Close()
	return nil, err
}

// New starts a single member for a test or benchmark, registers
// t.Cleanup(Close), and fails the test on error.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start(Options{})
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func newServer(opts Options, name string) (*Server, error) {
	s := &Server{name: name, tls: opts.TLS, clientHost: opts.ClientHost}
	if s.clientHost == "" {
		s.clientHost = "127.0.0.1"
	} else if opts.ClientPort == 0 {
		return nil, errors.New("etcdtest: ClientHost needs an explicit ClientPort")
	}
	var err error
	if opts.Dir == "" {
		s.dir, err = os.MkdirTemp("", "etcdtest-")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: data dir: %w", err)
		}
		s.ownDir = true
	} else {
		s.dir = opts.Dir
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return nil, fmt.Errorf("etcdtest: data dir: %w", err)
		}
	}
	s.clientPort, s.peerPort = opts.ClientPort, opts.PeerPort
	s.autoClientPort, s.autoPeerPort = opts.ClientPort == 0, opts.PeerPort == 0
	if err := s.repickPorts(); err != nil {
		s.removeDir()
		return nil, err
	}
	return s, nil
}

// repickPorts picks new free ports for the ports that were not fixed by
// the caller.
func (s *Server) repickPorts() error {
	var err error
	if s.autoClientPort {
		if s.clientPort, err = freePort(); err != nil {
			return err
		}
	}
	if s.autoPeerPort {
		if s.peerPort, err = freePort(); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) clientScheme() string {
	if s.tls != nil {
		return "https"
	}
	return "http"
}

// Endpoint returns the client URL, "http://127.0.0.1:PORT" (or https).
func (s *Server) Endpoint() string {
	return s.clientScheme() + "://" + net.JoinHostPort(s.clientHost, strconv.Itoa(s.clientPort))
}

// PeerURL returns the peer URL, "http://127.0.0.1:PORT".
func (s *Server) PeerURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(s.peerPort)
}

// Dir returns the data dir.
func (s *Server) Dir() string { return s.dir }

func (s *Server) config() *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = s.name
	cfg.Dir = s.dir

	curl := url.URL{Scheme: s.clientScheme(), Host: net.JoinHostPort(s.clientHost, strconv.Itoa(s.clientPort))}
	purl := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(s.peerPort)}
	cfg.ListenClientUrls = []url.URL{curl}
	cfg.AdvertiseClientUrls = []url.URL{curl}
	cfg.ListenPeerUrls = []url.URL{purl}
	cfg.AdvertisePeerUrls = []url.URL{purl}
	cfg.ListenMetricsUrls = nil

	cfg.InitialCluster = s.initialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = s.name + "=" + purl.String()
	}
	cfg.InitialClusterToken = s.token
	cfg.ClusterState = embed.ClusterStateFlagNew
	if hasWAL(s.dir) {
		// A restart: the member rejoins with its WAL; the initial
		// cluster settings are then ignored by etcd.
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}

	cfg.TickMs = tickMs
	cfg.ElectionMs = electionMs
	cfg.UnsafeNoFsync = true
	cfg.SnapshotCount = snapshotCount
	cfg.QuotaBackendBytes = quotaBackendBytes
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = "0" // off: tests compact by hand
	cfg.BcryptCost = bcryptCost

	if s.tls != nil {
		cfg.ClientTLSInfo.CertFile = s.tls.ServerCertFile
		cfg.ClientTLSInfo.KeyFile = s.tls.ServerKeyFile
		cfg.ClientTLSInfo.TrustedCAFile = s.tls.CAFile
		cfg.ClientTLSInfo.ClientCertAuth = true
	}
	return cfg
}

func hasWAL(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "member", "wal"))
	return err == nil
}

// LogLevelEnv, when set (debug, info, warn, error), is the level of what
// etcd writes to etcd.log in its data dir; the default is error. etcd never
// writes to stdout or stderr.
const LogLevelEnv = "SLUICE_ETCDTEST_LOG_LEVEL"

// quietLogger writes etcd's errors, and nothing else, to dir/etcd.log.
func quietLogger(dir string) (*zap.Logger, *os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, logFileName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	return logTo(f), f, nil
}

// logTo is a JSON logger writing to w at LogLevelEnv's level (errors only by default); the
// logger's own failures go nowhere.
func logTo(w io.Writer) *zap.Logger {
	level := zapcore.ErrorLevel
	if v := os.Getenv(LogLevelEnv); v != "" {
		if err := level.Set(v); err != nil {
			level = zapcore.ErrorLevel
		}
	}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(w), level)
	return zap.New(core, zap.ErrorOutput(zapcore.AddSync(io.Discard)))
}

// start launches etcd on s's settings and waits for it to be ready.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("etcdtest: server is closed")
	}
	if s.etcd != nil {
		return nil
	}
	cfg := s.config()
	lg, f, err := quietLogger(s.dir)
	if err != nil {
		return fmt.Errorf("etcdtest: log file: %w", err)
	}
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(s.dir, logFileName)}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	// Keep hold of the client gRPC servers so that Stop can drop their
	// connections at once instead of waiting up to 5 s for open
	// streams such as watches.
	cfg.ServiceRegister = func(gs *grpc.Server) {
		s.grpcMu.Lock()
		s.grpcServers = append(s.grpcServers, gs)
		s.grpcMu.Unlock()
	}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		f.Close()
		return fmt.Errorf("etcdtest: start %s: %w", s.name, err)
	}
	timer := time.NewTimer(ReadyTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		f.Close()
		return fmt.Errorf("etcdtest: start %s: %w", s.name, err)
	case <-timer.C:
		e.Server.Stop()
		e.Close()
		f.Close()
		return fmt.Errorf("etcdtest: %s not ready after %v", s.name, ReadyTimeout)
	}
	s.etcd, s.logFile = e, f
	return nil
}

// Stop closes the server but keeps its data dir, so that Restart can
// bring it back. Client connections are dropped at once (clients see
// the member go away); a leader first hands leadership to a peer, as
// etcd does on a clean shutdown. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(false)
}

// Kill is Stop without the leadership handover: a leader just vanishes,
// as in a crash, and the remaining members elect a new one after the
// election timeout (100 ms).
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(true)
}

// stopLocked closes etcd. A graceful stop hands leadership over first; a
// hard one does not.
func (s *Server) stopLocked(hard bool) {
	if s.etcd == nil {
		return
	}
	s.grpcMu.Lock()
	gss := s.grpcServers
	s.grpcServers = nil
	s.grpcMu.Unlock()
	for _, gs := range gss {
		gs.Stop()
	}
	if hard {
		s.etcd.Server.HardStop()
	}
	s.etcd.Close()
	s.etcd = nil
	if s.logFile != nil {
		s.logFile.Close()
		s.logFile = nil
	}
}

// Restart starts the server again on the same data dir and the same
// ports (stopping it first if it is running). A cluster member rejoins
// its cluster.
func (s *Server) Restart() error {
	s.Stop()
	return s.start()
}

// Close stops the server and removes the data dir if the package created
// it. It is idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.stopLocked(true)
	s.removeDir()
}

func (s *Server) removeDir() {
	if s.ownDir {
		os.RemoveAll(s.dir)
	}
}

// Client returns a new client of this server: DialTimeout 5 s, the client
// certificate when the server uses TLS, and the root credentials once
// EnableAuth succeeded. The caller closes it.
func (s *Server) Client() (*clientv3.Client, error) {
	s.mu.Lock()
	user, password := s.user, s.password
	s.mu.Unlock()
	return newClient([]string{s.Endpoint()}, s.tls, user, password)
}

func newClient(endpoints []string, files *TLSFiles, user, password string) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: DialTimeout,
		Logger:      zap.NewNop(),
		Username:    user,
		Password:    password,
	}
	if files != nil {
		tc, err := files.ClientConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	return clientv3.New(cfg)
}

// EnableAuth creates user root with the given password, grants it role
// root and enables authentication. Later clients from s.Client() log in as
// root with that password.
func EnableAuth(s *Server, password string) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.UserAdd(ctx, "root", password); err != nil {
		return fmt.Errorf("etcdtest: add user root: %w", err)
	}
	if _, err := c.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("etcdtest: grant role root: %w", err)
	}
	if _, err := c.AuthEnable(ctx); err != nil {
		return fmt.Errorf("etcdtest: enable auth: %w", err)
	}
	s.mu.Lock()
	s.user, s.password = "root", password
	s.mu.Unlock()
	return nil
}

// Ports handed out by this process, never handed out twice, so that two
// servers started at the same time cannot be given the same port.
var (
	portsMu sync.Mutex
	ports   = map[int]bool{}
)

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("etcdtest: free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !ports[p] {
			ports[p] = true
			return p, nil
		}
	}
	return 0, errors.New("etcdtest: no free port")
}

func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) ||
		(err != nil && strings.Contains(err.Error(), "address already in use"))
}

var tokenSeq atomic.Uint64

// uniqueToken returns a cluster token unique to this call.
func uniqueToken() string {
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("etcdtest-%d-%d-%s", os.Getpid(), tokenSeq.Add(1), hex.EncodeToString(b[:]))
}
