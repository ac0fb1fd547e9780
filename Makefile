# sluice: the node agent. `make demo` runs the lab, `make test` runs every test.
GO      ?= go
BIN     := bin
PKGS    := ./...

.PHONY: bench-bgp all build test vet fmt-check demo faults churn bench bench-dataplane bench-fanout bench-services fuzz install clean generate generate-check test-kernels test-kernels-ci

PREFIX  ?= /usr/local
DESTDIR ?=
ROUTE_PROTOCOL ?= 83

all: build

# -buildvcs=auto: the commit goes into the binaries (`sluiced --version`, sluice_build_info)
# where git can say it, whatever GOFLAGS says. CGO_ENABLED=0: static binaries, which run on
# any distribution's libc and map none (sluiced resident at 20,000 nodes: 1.8 MiB less).
build:
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -o $(BIN)/ ./cmd/...

# go vet, then staticcheck (a tool of go.mod: its version is pinned there).
vet:
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The eBPF programs: bpf/c/*.c compiled by bpf2go (needs clang, llvm-strip and libbpf's
# headers: apt-get install clang llvm libbpf-dev). The generated Go and object are committed,
# so building and testing need none of them; generate-check fails when they are stale.
generate:
	cd bpf && $(GO) generate ./

generate-check: generate
	@git diff --exit-code --stat -- bpf/ || { echo "bpf: the committed object or generated Go is not what bpf/c produces: run make generate and commit"; exit 1; }

# Every test, against real embedded etcd servers; the fuzz corpus in store/testdata runs as seeds.
# Then the service stage's real-kernel tests again with the programs attached as classic tc
# filters (bpf-attach tc, the path of kernels before 6.6; the first run takes TCX here).
test: fmt-check vet
	$(GO) test -count=1 -timeout 15m $(PKGS)
	SLUICE_BPF_ATTACH=tc $(GO) test -count=1 -timeout 10m -run 'Stage|ServiceStage' ./bpf/ ./cmd/sluiced/

# The lab, as root: three nodes as network namespaces, etcd, the sample cluster loaded with
# sluicectl, one sluiced per node, and real traffic checked. DEMO_FLAGS=--keep leaves it up.
demo: build
	./$(BIN)/sluice-lab demo --testdata testdata/sample $(DEMO_FLAGS)

# The fault suite (issue #10), as root: the lab, then faults injected into node-a's agent,
# one PASS/FAIL line each with its figure (README: "What the agent promises under faults").
faults: build
	./$(BIN)/sluice-lab faults --testdata testdata/sample

# The long run of churn (issue #36), as root: the lab, then workloads (with real interfaces),
# blocks, slices and services changing at 20 a second for CHURN (10 minutes) while clients
# connect through node ports throughout: no connection may fail, no drift may be counted.
CHURN ?= 10m
churn: build
	./$(BIN)/sluice-lab churn --duration $(CHURN) --testdata testdata/sample

# Benchmarks with their references from the same run, printed as a table: the intake
# (100,000 objects to in-sync beside a raw etcd range read; watch rate beside etcd's write
# rate; decoding one block), calc (sluiced's cold start as calc sees it; full computation;
# one change at 1,000, 5,000 and 20,000 nodes), the dataplane and the service stage (below).
BENCHTIME ?= 3x
bench:
	@{ $(GO) test -run '^$$' -bench 'InSync|RawRange|Watch' -benchtime $(BENCHTIME) -benchmem ./store/ && \
	   $(GO) test -run '^$$' -bench DecodeBlock -benchmem ./store/ && \
	   $(GO) test -run '^$$' -bench ColdStartBatches -benchmem ./calc/ && \
	   $(GO) test -run '^$$' -bench Full -benchtime $(BENCHTIME) -benchmem ./calc/ && \
	   $(GO) test -run '^$$' -bench OneChange -benchtime 20000x -benchmem ./calc/ && \
	   $(MAKE) -s bench-dataplane && \
	   $(GO) test -run '^$$' -bench OutgoingNAT -benchtime 1x ./dataplane/ && \
	   $(MAKE) -s bench-fanout && \
	   $(MAKE) -s bench-services && \
	   $(MAKE) -s bench-bgp ; } | tee /dev/stderr | awk -f testdata/benchtable.awk

# BGP (issue #38), as root with BIRD 2 installed: a route reflector (BIRD) announcing 20,000
# /26s to sluiced (--bgp) and to BIRD's own kernel protocol on the same machine, each in a
# namespace of its own on one bridge: time to all routes in the kernel both ways, one prefix
# announced and withdrawn to the kernel (p50), sluiced's memory with and without BGP.
# SLUICE_BENCH_CPUPROFILE=FILE / SLUICE_BENCH_HEAP=FILE save sluiced's CPU and heap profiles.
BENCH_BGP_NS = sl-bench sl-bench-rr sl-bench-bird
bench-bgp:
	@command -v bird >/dev/null || { echo "bench-bgp needs BIRD 2 (apt-get install bird2)"; exit 1; }; \
	for ns in $(BENCH_BGP_NS); do ip netns del $$ns 2>/dev/null; done; \
	for ns in $(BENCH_BGP_NS); do ip netns add $$ns && ip -n $$ns link set lo up || exit 1; done; \
	ip -n sl-bench-rr link add br0 type bridge && ip -n sl-bench-rr addr add 192.0.2.1/24 dev br0 && ip -n sl-bench-rr link set br0 up && \
	ip -n sl-bench link add eth0 type veth peer name p-node netns sl-bench-rr && \
	ip -n sl-bench-bird link add eth0 type veth peer name p-bird netns sl-bench-rr && \
	ip -n sl-bench-rr link set p-node master br0 up && ip -n sl-bench-rr link set p-bird master br0 up && \
	ip -n sl-bench addr add 192.0.2.11/24 dev eth0 && ip -n sl-bench link set eth0 up && \
	ip -n sl-bench-bird addr add 192.0.2.12/24 dev eth0 && ip -n sl-bench-bird link set eth0 up && \
	ip netns exec sl-bench env SLUICE_BENCH_BGP=1 $(GO) test -run '^$$' -bench BGPLearned -benchtime 1x ./cmd/sluiced/ ; \
	rc=$$?; for ns in $(BENCH_BGP_NS); do ip netns del $$ns; done; exit $$rc

# Fan-out (issue #11): 1,000 watchers of sluice's prefixes straight to etcd, then through one
# etcd gRPC proxy, while a writer makes 200 changes: etcd's CPU and memory both ways, the
# proxy's, and delivery latency, from the same run.
bench-fanout:
	@$(GO) test -run '^$$' -bench WatchFanout -benchtime 1x ./store/

# The dataplane benchmark programs a kernel, so it runs in a network namespace of its own
# (as root): sluiced with 20,000 remote blocks on 1,000 nodes and on 20,000 nodes (each its
# own VTEP), beside `ip -batch` in Felix's layout and through nexthop objects and etcd's watch
# latency (SLUICE_BENCH_HEAP=PREFIX saves the settled agent's heap profiles);
# then the route writer alone (20,000 routes, packed) beside one request per route and ip -batch.
bench-dataplane:
	@ip netns del sl-bench 2>/dev/null; ip netns add sl-bench && \
	  ip netns exec sl-bench env SLUICE_BENCH_NETNS=1 $(GO) test -run '^$$' -bench Dataplane -benchtime 1x ./cmd/sluiced/ ; \
	  rc=$$?; ip netns del sl-bench; [ $$rc = 0 ] && $(GO) test -run '^$$' -bench RouteWrite -benchtime 3x ./dataplane/ && \
	  $(GO) test -run '^$$' -bench 'NewNodeKernelCost|RestartRead' -benchtime 1x ./dataplane/

# The service stage's benchmarks (issue #9), as root, each part in a network namespace of its
# own, deleted after it even when it fails or is interrupted; every part runs, the target
# fails if one did:
#   maps     10,000 services of 10 endpoints programmed from cold through the driver, beside a
#            bare BatchUpdate of the same entries (median of 3);
#   agent    sluiced against an etcd child holding them: one endpoint changed in etcd to the
#            new backend in the pinned map (p50, p99), beside etcd's put-to-watch latency;
#   arriving sluiced running while the 10,000 services and slices are written by four writers,
#            one transaction per object: the last commit to the maps complete, beside the
#            writes' own time, and sluiced's CPU beside a bare etcd watcher's;
#   traffic  connections per second, bulk TCP throughput and UDP-GSO through a node port to a
#            local and a remote endpoint (namespaces of its own for client, nodes and servers),
#            beside the same traffic sent straight to the endpoint;
#   conntrack reading a connection table of 65,536 entries in batches, beside one at a time.
bench-services:
	@rc=0; ns=; trap '[ -z "$$ns" ] || ip netns del "$$ns" 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	for part in "maps ServicesColdApply 3x ./bpf/" "agent ServiceEndpointChange 1x ./cmd/sluiced/" \
	            "arriving ServicesArriving 1x ./cmd/sluiced/" \
	            "traffic NodePortTraffic 1x ./bpf/" "conntrack ConntrackWalk 5x ./bpf/"; do \
	  set -- $$part; ns=sl-bench-svc-$$1; \
	  ip netns del $$ns 2>/dev/null; \
	  if ip netns add $$ns; then \
	    ip netns exec $$ns env SLUICE_BENCH_NETNS=1 $(GO) test -run '^$$' -bench "^Benchmark$$2\$$" -benchtime $$3 $$4 || rc=1; \
	    ip netns del $$ns; \
	  else rc=1; fi; \
	  ns=; \
	done; exit $$rc

FUZZTIME ?= 60s
fuzz:
	$(GO) test ./store/ -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME)

# Binaries, the systemd unit, an example configuration, and the route protocol's name so
# `ip route` shows "proto sluice".
UNITDIR ?= /etc/systemd/system
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)/etc/iproute2/rt_protos.d $(DESTDIR)$(UNITDIR) $(DESTDIR)/etc/sluice
	install -m 0755 $(BIN)/sluiced $(BIN)/sluicectl $(DESTDIR)$(PREFIX)/bin/
	sed 's|/usr/local/bin/sluiced|$(PREFIX)/bin/sluiced|' deploy/systemd/sluiced.service > $(DESTDIR)$(UNITDIR)/sluiced.service
	install -m 0644 deploy/sluiced.yaml.example $(DESTDIR)/etc/sluice/sluiced.yaml.example
	printf '%s\tsluice\n' $(ROUTE_PROTOCOL) > $(DESTDIR)/etc/iproute2/rt_protos.d/sluice.conf
	install -d $(DESTDIR)$(PREFIX)/share/doc/sluice
	install -m 0644 docs/*.md $(DESTDIR)$(PREFIX)/share/doc/sluice/
	@echo
	@echo "Installed. Next (docs/operator-guide.md, also in $(PREFIX)/share/doc/sluice/):"
	@echo "  cp /etc/sluice/sluiced.yaml.example /etc/sluice/sluiced.yaml   # set etcdEndpoints (and TLS)"
	@echo "  sluicectl plan --node \$$(hostname | tr A-Z a-z)                  # this node's Node must be in etcd"
	@echo "  systemctl daemon-reload && systemctl enable --now sluiced"
	@echo "  curl -s 127.0.0.1:9097/readyz; sluicectl status"

clean:
	rm -rf $(BIN)

# The kernel matrix (docs/kernels.md): Debian's stock kernels booted in qemu (KVM where it
# works, TCG otherwise), each running the bpf package's tests and `sluice-lab smoke` inside
# the guest; one summary row per kernel. Kernels are downloaded with apt-get (never
# installed) into ~/.cache/sluice-vmtest. KERNELS picks the series (newest package of each),
# ATTACH sets SLUICE_BPF_ATTACH (auto, tcx or tc) in the guest, VMTEST_FLAGS adds flags.
# The default: Debian 11's 5.10 (the floor, and the strictest verifier: from the bullseye
# suite, fetched through a private apt state), Debian 12's 6.1 and 6.12. A point release can
# be named too: linux-image-6.1.0-47-cloud-amd64 (6.1.170) refused what 6.1.192 accepts.
# BPF_RUN picks the bpf tests the guests run (a go test -run pattern; all of them by default).
KERNELS ?= bullseye/5.10 6.1 6.12
ATTACH ?=
BPF_RUN ?= .
VMTEST_FLAGS ?=
test-kernels: build
	CGO_ENABLED=0 $(GO) test -c -o $(BIN)/bpf.test ./bpf
	./$(BIN)/sluice-vmtest --kernels "$(KERNELS)" --testdata testdata/sample --bpf-src bpf --bpf-run '$(BPF_RUN)' $(if $(ATTACH),--attach $(ATTACH)) $(VMTEST_FLAGS)

# The matrix as CI runs it (docs/kernels.md, "In CI"): the same kernels, each verifying every
# program of both families, making a first apply through the real stage (TCX or classic tc,
# as the kernel has) and running the smoke scenario (three agents, real traffic). The whole
# bpf suite in every guest takes about 33 minutes under TCG, past CI's budget; it is make
# test-kernels, which a change to the C, the stage or the loader runs before it lands.
CI_BPF_RUN := ^(TestProgramsPassVerifier|TestStageFirstApply)
test-kernels-ci:
	$(MAKE) test-kernels BPF_RUN='$(CI_BPF_RUN)'
