package etcdtest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Cluster is n etcd members in this process, each on its own ports and
// data dir. Stop a member with Members[i].Stop and bring it back with
// Members[i].Restart.
type Cluster struct {
	Members []*Server
}

// StartCluster starts an n-member cluster (plain http, temp data dirs)
// and waits until every member is ready.
func StartCluster(n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("etcdtest: cluster of %d members", n)
	}
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		var c *Cluster
		c, err = startCluster(n)
		if err == nil {
			return c, nil
		}
		if !isAddrInUse(err) {
			break
		}
	}
	return nil, err
}

func startCluster(n int) (*Cluster, error) {
	c := &Cluster{}
	token := uniqueToken()
	peers := make([]string, 0, n)
	for i := range n {
		s, err := newServer(Options{}, fmt.Sprintf("m%d", i))
		if err != nil {
			c.Close()
			return nil, err
		}
		s.token = token
		c.Members = append(c.Members, s)
		peers = append(peers, s.name+"="+s.PeerURL())
	}
	initial := strings.Join(peers, ",")
	for _, s := range c.Members {
		s.initialCluster = initial
	}

	// Members block until a quorum is up, so start them all at once.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range c.Members {
		wg.Go(func() { errs[i] = s.start() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// NewCluster starts an n-member cluster for a test, registers
// t.Cleanup(Close), and fails the test on error.
func NewCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c, err := StartCluster(n)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Endpoints returns the client URLs of all members, stopped or not.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, s := range c.Members {
		eps[i] = s.Endpoint()
	}
	return eps
}

// Client returns a new client of all members (DialTimeout 5 s). The
// caller closes it.
func (c *Cluster) Client() (*clientv3.Client, error) {
	return newClient(c.Endpoints(), nil, "", "")
}

// Close closes every member and removes their data dirs. It is
// idempotent.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for _, s := range c.Members {
		wg.Go(s.Close)
	}
	wg.Wait()
}
