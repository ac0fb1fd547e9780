package store

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ClientConfig says how to reach etcd.
type ClientConfig struct {
	Endpoints   []string
	CACert      string // file with the CA that signed etcd's certificate
	Cert, Key   string // client certificate and key files
	Username    string
	Password    string
	DialTimeout time.Duration
}

// DefaultEndpoint is used when no endpoint is configured anywhere.
const DefaultEndpoint = "http://127.0.0.1:2379"

// envNames lists, for each setting, the environment variables read in order of precedence:
// sluice's own, then etcdctl's, then the ones Calico's tools read.
var envNames = struct{ endpoints, ca, cert, key, user, password []string }{
	endpoints: []string{"SLUICE_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS", "ETCD_ENDPOINTS"},
	ca:        []string{"SLUICE_ETCD_CACERT", "ETCDCTL_CACERT", "ETCD_CA_CERT_FILE"},
	cert:      []string{"SLUICE_ETCD_CERT", "ETCDCTL_CERT", "ETCD_CERT_FILE"},
	key:       []string{"SLUICE_ETCD_KEY", "ETCDCTL_KEY", "ETCD_KEY_FILE"},
	user:      []string{"SLUICE_ETCD_USERNAME", "ETCDCTL_USER", "ETCD_USERNAME"},
	password:  []string{"SLUICE_ETCD_PASSWORD", "ETCDCTL_PASSWORD", "ETCD_PASSWORD"},
}

// WithEnv fills every setting left empty from the environment (getenv, usually os.Getenv),
// then defaults the endpoints. ETCDCTL_USER may be "user:password", as etcdctl allows.
func (c ClientConfig) WithEnv(getenv func(string) string) ClientConfig {
	first := func(names []string) string {
		for _, n := range names {
			if v := getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	if len(c.Endpoints) == 0 {
		c.Endpoints = SplitEndpoints(first(envNames.endpoints))
	}
	fill := func(dst *string, names []string) {
		if *dst == "" {
			*dst = first(names)
		}
	}
	fill(&c.CACert, envNames.ca)
	fill(&c.Cert, envNames.cert)
	fill(&c.Key, envNames.key)
	fill(&c.Username, envNames.user)
	fill(&c.Password, envNames.password)
	if u, p, ok := strings.Cut(c.Username, ":"); ok && c.Password == "" {
		c.Username, c.Password = u, p
	}
	if len(c.Endpoints) == 0 {
		c.Endpoints = []string{DefaultEndpoint}
	}
	return c
}

// SplitEndpoints splits a comma-separated endpoint list, dropping blanks.
func SplitEndpoints(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// TLS returns the TLS configuration, or nil when no TLS file is set.
func (c ClientConfig) TLS() (*tls.Config, error) {
	if c.CACert == "" && c.Cert == "" && c.Key == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CACert != "" {
		pem, err := os.ReadFile(c.CACert)
		if err != nil {
			return nil, fmt.Errorf("reading etcd CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA file %s: no PEM certificate in it", c.CACert)
		}
		cfg.RootCAs = pool
	}
	if (c.Cert == "") != (c.Key == "") {
		return nil, errors.New("etcd client certificate and key must be given together")
	}
	if c.Cert != "" {
		pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("loading etcd client certificate %s: %w", c.Cert, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// New connects. The client dials lazily: an unreachable etcd shows up on first use.
func (c ClientConfig) New() (*clientv3.Client, error) {
	if len(c.Endpoints) == 0 {
		c.Endpoints = []string{DefaultEndpoint}
	}
	tlsCfg, err := c.TLS()
	if err != nil {
		return nil, err
	}
	eps := make([]string, len(c.Endpoints))
	for i, e := range c.Endpoints {
		// clientv3 wants host:port or a URL; a bare host:port with TLS needs the scheme.
		if !strings.Contains(e, "://") {
			if tlsCfg != nil {
				e = "https://" + e
			} else {
				e = "http://" + e
			}
		}
		eps[i] = e
	}
	dt := c.DialTimeout
	if dt == 0 {
		dt = 5 * time.Second
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		TLS:         tlsCfg,
		Username:    c.Username,
		Password:    c.Password,
		DialTimeout: dt,
		// gRPC pings no more often than every 10 s whatever is asked; the timeout is also
		// the TCP_USER_TIMEOUT gRPC sets: written data unacknowledged for 3 s ends the
		// connection, which is how the intake learns of a link cut without a word.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Logger:               zap.NewNop(),
		// gRPC's flow control starts a connection with a 64 KiB window and grows it only as
		// it measures the link; a first page of several megabytes goes through that ramp, and
		// a cold start waits for it. A node agent's one connection can afford fixed windows
		// this large.
		//
		// Reconnecting: gRPC's default backoff grows to 120 s, so an agent cut off for two
		// minutes stayed behind for many seconds after the link came back (issue #10); a node
		// agent's one connection retries at most every second, and one attempt waits 5 s
		// for a link that drops its packets.
		DialOptions: []grpc.DialOption{grpc.WithInitialWindowSize(16 << 20), grpc.WithInitialConnWindowSize(64 << 20),
			grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 5 * time.Second,
				Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}})},
		MaxCallRecvMsgSize: 64 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd at %s: %w", strings.Join(eps, ","), err)
	}
	return cli, nil
}

// RegisterFlags adds the etcd connection flags to fs, writing into c. Anything left unset
// is filled from the environment by WithEnv.
func (c *ClientConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.Func("etcd-endpoints", "comma-separated etcd endpoints (env SLUICE_ETCD_ENDPOINTS, ETCDCTL_ENDPOINTS, ETCD_ENDPOINTS; default "+DefaultEndpoint+")",
		func(s string) error { c.Endpoints = SplitEndpoints(s); return nil })
	fs.StringVar(&c.CACert, "etcd-cacert", c.CACert, "CA certificate file for etcd's TLS (env SLUICE_ETCD_CACERT, ETCDCTL_CACERT, ETCD_CA_CERT_FILE)")
	fs.StringVar(&c.Cert, "etcd-cert", c.Cert, "client certificate file (env SLUICE_ETCD_CERT, ETCDCTL_CERT, ETCD_CERT_FILE)")
	fs.StringVar(&c.Key, "etcd-key", c.Key, "client key file (env SLUICE_ETCD_KEY, ETCDCTL_KEY, ETCD_KEY_FILE)")
	fs.StringVar(&c.Username, "etcd-username", c.Username, "etcd user (env SLUICE_ETCD_USERNAME, ETCDCTL_USER, ETCD_USERNAME)")
	fs.StringVar(&c.Password, "etcd-password", c.Password, "etcd password (env SLUICE_ETCD_PASSWORD, ETCDCTL_PASSWORD, ETCD_PASSWORD)")
}
