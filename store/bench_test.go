package store_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// benchCluster is a cluster of 100,000 objects in realistic proportions: 1,000 nodes with 4
// blocks each (and their affinities), 500 services with one slice each, and workload
// endpoints for the rest.
const (
	benchNodes     = 1000
	benchBlocksPer = 4
	benchServices  = 500
	benchObjects   = 100_000
)

// benchEtcd runs etcd in a child process, so that heap figures are the intake's alone.
var benchEtcd struct {
	once   sync.Once
	child  *etcdtest.Child
	err    error
	loaded bool
}

func benchEndpoint(b *testing.B) string {
	benchEtcd.once.Do(func() {
		benchEtcd.child, benchEtcd.err = etcdtest.StartChild(etcdtest.Options{})
	})
	if benchEtcd.err != nil {
		b.Fatal(benchEtcd.err)
	}
	return benchEtcd.child.Endpoint()
}

// closeBenchEtcd stops the benchmarks' etcd; TestMain calls it after every benchmark ran.
func closeBenchEtcd() {
	if benchEtcd.child != nil {
		benchEtcd.child.Close()
	}
}

func benchKVs() (keys, values []string) {
	add := func(k, v string) { keys, values = append(keys, k), append(values, v) }
	for n := range benchNodes {
		node := fmt.Sprintf("node-%04d", n)
		add(store.NodePrefix+node, nodeValue(node, fmt.Sprintf("192.168.%d.%d/16", n/250, n%250+1), fmt.Sprintf("10.65.%d.%d", n/4, (n%4)*64)))
		for j := range benchBlocksPer {
			i := n*benchBlocksPer + j
			cidr := fmt.Sprintf("10.%d.%d.%d/26", 64+i/1024, (i/4)%256, (i%4)*64)
			p := pfx(cidr)
			add(store.BlockKey(p), blockValue(cidr, node, 0, 1, 2, 3, 4, 5, 6, 7))
			add(store.AffinityKey(node, p), `{"state":"confirmed","deleted":false}`)
		}
	}
	for s := range benchServices {
		add(store.ServicePrefix+fmt.Sprintf("ns%d/svc-%d", s%20, s), serviceValue(fmt.Sprintf("ns%d", s%20), fmt.Sprintf("svc-%d", s), fmt.Sprintf("10.96.%d.%d", s/250, s%250+1)))
		add(store.EndpointSlicePrefix+fmt.Sprintf("ns%d/svc-%d-abc", s%20, s), sliceValue(fmt.Sprintf("ns%d", s%20), fmt.Sprintf("svc-%d-abc", s), fmt.Sprintf("svc-%d", s), "10.64.0.1", "node-0001"))
	}
	for w := 0; len(keys) < benchObjects; w++ {
		node := fmt.Sprintf("node-%04d", w%benchNodes)
		name := fmt.Sprintf("%s-k8s-pod--%d-eth0", node, w)
		add(store.WorkloadEndpointPrefix+"ns"+fmt.Sprint(w%20)+"/"+name,
			wepValue(fmt.Sprintf("ns%d", w%20), name, node, fmt.Sprintf("cali%011d", w), fmt.Sprintf("10.%d.%d.%d/32", 64+w/65536, (w/256)%256, w%256)))
	}
	return keys, values
}

func loadBench(b *testing.B, cli *clientv3.Client) {
	if benchEtcd.loaded {
		return
	}
	keys, values := benchKVs()
	ctx := context.Background()
	const perTxn = 128 // etcd's default limit of operations per transaction
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var failed atomic.Value
	for i := 0; i < len(keys); i += perTxn {
		ops := make([]clientv3.Op, 0, perTxn)
		for j := i; j < min(i+perTxn, len(keys)); j++ {
			ops = append(ops, clientv3.OpPut(keys[j], values[j]))
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				failed.Store(err)
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	benchEtcd.loaded = true
}

// heapSampler records the peak of live heap objects while it runs.
type heapSampler struct {
	stop chan struct{}
	done chan struct{}
	peak uint64
}

func sampleHeap() *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), done: make(chan struct{})}
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		defer close(h.done)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			h.peak = max(h.peak, s[0].Value.Uint64())
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) Stop() uint64 { close(h.stop); <-h.done; return h.peak }

// BenchmarkInSync100k measures 100,000 objects from start to in-sync: list, decode, index.
func BenchmarkInSync100k(b *testing.B) {
	ep := benchEndpoint(b)
	cfg := store.ClientConfig{Endpoints: []string{ep}}
	loader, err := cfg.New()
	if err != nil {
		b.Fatal(err)
	}
	defer loader.Close()
	loadBench(b, loader)
	var peak uint64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		runtime.GC()
		b.StartTimer()
		h := sampleHeap()
		cli, err := cfg.New()
		if err != nil {
			b.Fatal(err)
		}
		idx := store.NewIndex()
		synced := make(chan struct{})
		in, _ := store.NewIntake(store.IntakeConfig{Client: cli, Handler: store.Fanout{idx, store.HandlerFunc(func(batch []store.Event) {
			if batch[len(batch)-1].Type == store.EventInSync {
				close(synced)
			}
		})}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = in.Run(ctx) }()
		<-synced
		b.StopTimer()
		peak = max(peak, h.Stop())
		cancel()
		<-done
		cli.Close()
		if got := in.Stats().Events.Load(); got != benchObjects+1 {
			b.Fatalf("delivered %d events, want %d", got, benchObjects+1)
		}
		runtime.KeepAlive(idx)
		b.StartTimer()
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
	b.ReportMetric(float64(benchObjects)*float64(b.N)/b.Elapsed().Seconds(), "objects/s")
}

// BenchmarkRawRange100k is the reference for BenchmarkInSync100k: the same paged reads of
// the same keys, with nothing decoded or indexed, at the intake's page size and at smaller
// ones; etcd-cpu-s is the etcd server's own CPU time per read (the child's, from /proc),
// which is what the page size is chosen for.
func BenchmarkRawRange100k(b *testing.B) {
	ep := benchEndpoint(b)
	cli, err := store.ClientConfig{Endpoints: []string{ep}}.New()
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	loadBench(b, cli)
	ctx := context.Background()
	for _, page := range []int64{store.DefaultPageSize, 2000, 500} {
		b.Run(fmt.Sprintf("page=%d", page), func(b *testing.B) {
			cpu0 := procCPU(b, benchEtcd.child.Pid())
			for range b.N {
				n := 0
				for _, prefix := range store.WatchedPrefixes {
					start, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
					for {
						resp, err := cli.Get(ctx, start, clientv3.WithRange(end), clientv3.WithLimit(page))
						if err != nil {
							b.Fatal(err)
						}
						n += len(resp.Kvs)
						if !resp.More {
							break
						}
						start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
					}
				}
				if n != benchObjects {
					b.Fatalf("read %d keys, want %d", n, benchObjects)
				}
			}
			b.ReportMetric(float64(benchObjects)*float64(b.N)/b.Elapsed().Seconds(), "objects/s")
			b.ReportMetric((procCPU(b, benchEtcd.child.Pid())-cpu0)/float64(b.N), "etcd-cpu-s")
		})
	}
}

// procCPU is a process's user and system CPU time so far, in seconds (from /proc).
func procCPU(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	user, _ := strconv.ParseFloat(f[11], 64) // fields 14 and 15 of stat, counted after the name
	sys, _ := strconv.ParseFloat(f[12], 64)
	return (user + sys) / 100 // clock ticks: USER_HZ is 100 on Linux
}

// BenchmarkWatchThroughput writes workload endpoints as fast as etcd takes them from 16
// concurrent writers and measures how fast the events reach the index. etcd-writes/s is
// etcd's own rate in the same run; ratio is intake rate over write rate (1 = keeps up).
func BenchmarkWatchThroughput(b *testing.B) {
	ep := benchEndpoint(b)
	cfg := store.ClientConfig{Endpoints: []string{ep}}
	writer, err := cfg.New()
	if err != nil {
		b.Fatal(err)
	}
	defer writer.Close()
	cli, err := cfg.New()
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	idx := store.NewIndex()
	var synced atomic.Bool
	in, _ := store.NewIntake(store.IntakeConfig{Client: cli, Prefixes: []string{store.WorkloadEndpointPrefix + "watchbench/"},
		Handler: store.Fanout{idx, store.HandlerFunc(func(batch []store.Event) {
			if batch[len(batch)-1].Type == store.EventInSync {
				synced.Store(true)
			}
		})}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = in.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for !synced.Load() {
		time.Sleep(time.Millisecond)
	}
	const writes, writers = 20_000, 16
	var writeTime, intakeTime time.Duration
	b.ResetTimer()
	for iter := range b.N {
		start := time.Now()
		var wg sync.WaitGroup
		var lastRev atomic.Int64
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < writes; i += writers {
					name := fmt.Sprintf("wb-%d-%d", iter, i)
					resp, err := writer.Put(ctx, store.WorkloadEndpointPrefix+"watchbench/"+name,
						wepValue("watchbench", name, "node-0001", "cali0000000001", fmt.Sprintf("10.200.%d.%d/32", i/256, i%256)))
					if err != nil {
						b.Error(err)
						return
					}
					for {
						cur := lastRev.Load()
						if resp.Header.Revision <= cur || lastRev.CompareAndSwap(cur, resp.Header.Revision) {
							break
						}
					}
				}
			}()
		}
		wg.Wait()
		writeTime += time.Since(start)
		for in.Stats().Revision.Load() < lastRev.Load() {
			time.Sleep(100 * time.Microsecond)
		}
		intakeTime += time.Since(start)
	}
	b.StopTimer()
	total := float64(writes * b.N)
	b.ReportMetric(total/writeTime.Seconds(), "etcd-writes/s")
	b.ReportMetric(total/intakeTime.Seconds(), "intake-events/s")
	b.ReportMetric(writeTime.Seconds()/intakeTime.Seconds(), "ratio")
}
