// Package agentconfig is sluiced's configuration: one option table that drives the flags, the
// SLUICE_* environment variables, the configuration file, `sluiced --help` and
// docs/configuration.md. sluicectl diff reads it too, so it compares a node's kernel with the
// state that node's sluiced is configured to program.
package agentconfig

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-net/sluice/bpf"
	"github.com/sluice-net/sluice/calc"
	"github.com/sluice-net/sluice/dataplane"
	"github.com/sluice-net/sluice/store"
	yaml "go.yaml.in/yaml/v3"
)

// DefaultConfigFile is read when present; a missing default file is fine.
const DefaultConfigFile = "/etc/sluice/sluiced.yaml"

// Config is the agent's whole configuration.
type Config struct {
	Etcd      store.ClientConfig
	NodeName  string
	LogFormat string
	LogLevel  string
	Record    string
	// StateFile keeps the desired state across restarts ("": none).
	StateFile    string
	Calc         calc.Config
	Dataplane    bool
	DP           dataplane.Config
	HealthListen string
	StatusTTL    time.Duration
	EtcdLiveness time.Duration
	// EtcdWatchStall is how long a watch may stay behind etcd's revision before it is taken
	// for lost (0: never).
	EtcdWatchStall time.Duration
	// Services turns on the eBPF service stage (with the dataplane).
	Services bool
	// BGPSecretsDir holds the BGP sessions' passwords (a secret's key is the file
	// <dir>/<secret>/<key>).
	BGPSecretsDir     string
	BPF               bpf.StageConfig
	ProxyHealthListen string
	Profiling         bool
	// set by systemd, not options
	NotifySocket string
	Watchdog     time.Duration
}

// option is one setting: its flag, environment variable and file key, its default, what it
// accepts, and how it is stored. The one table drives flags, environment, the file,
// `sluiced --help` and docs/configuration.md.
type option struct {
	name, env, key string
	def            string
	accepts        string
	help           string
	boolean        bool
	set            func(c *Config, v string) error
}

func parseBool(v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errors.New("not a boolean")
	}
	return b, nil
}

func parseIntRange(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, errors.New("out of range")
	}
	return n, nil
}

func oneOf(v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return errors.New("not one of the accepted values")
}

func optionTable() []option {
	str := func(dst func(c *Config) *string) func(*Config, string) error {
		return func(c *Config, v string) error { *dst(c) = v; return nil }
	}
	return []option{
		{name: "etcd-endpoints", env: "SLUICE_ETCD_ENDPOINTS", key: "etcdEndpoints", def: "",
			accepts: "comma-separated URLs", help: "etcd endpoints; without them, etcdctl's ETCDCTL_ENDPOINTS, Calico's ETCD_ENDPOINTS, then " + store.DefaultEndpoint,
			set: func(c *Config, v string) error { c.Etcd.Endpoints = store.SplitEndpoints(v); return nil }},
		{name: "etcd-cacert", env: "SLUICE_ETCD_CACERT", key: "etcdCACert", accepts: "a file", help: "CA certificate for etcd's TLS (or ETCDCTL_CACERT, ETCD_CA_CERT_FILE)",
			set: str(func(c *Config) *string { return &c.Etcd.CACert })},
		{name: "etcd-cert", env: "SLUICE_ETCD_CERT", key: "etcdCert", accepts: "a file", help: "client certificate for etcd (or ETCDCTL_CERT, ETCD_CERT_FILE)",
			set: str(func(c *Config) *string { return &c.Etcd.Cert })},
		{name: "etcd-key", env: "SLUICE_ETCD_KEY", key: "etcdKey", accepts: "a file", help: "client key for etcd (or ETCDCTL_KEY, ETCD_KEY_FILE)",
			set: str(func(c *Config) *string { return &c.Etcd.Key })},
		{name: "etcd-username", env: "SLUICE_ETCD_USERNAME", key: "etcdUsername", accepts: "a name", help: "etcd user (or ETCDCTL_USER, ETCD_USERNAME)",
			set: str(func(c *Config) *string { return &c.Etcd.Username })},
		{name: "etcd-password", env: "SLUICE_ETCD_PASSWORD", key: "etcdPassword", accepts: "a string", help: "etcd password (or ETCDCTL_PASSWORD, ETCD_PASSWORD)",
			set: str(func(c *Config) *string { return &c.Etcd.Password })},
		{name: "node-name", env: "SLUICE_NODE_NAME", key: "nodeName", accepts: "a node name", help: "this node's name as in Calico's Node resources; default the hostname",
			set: str(func(c *Config) *string { return &c.NodeName })},
		{name: "node-address", env: "SLUICE_NODE_ADDRESS", key: "nodeAddress", accepts: "an IP address", help: "this node's underlay address, when VXLAN is off and no Node gives it",
			set: func(c *Config, v string) error {
				if v == "" {
					c.DP.ParentAddr = netip.Addr{}
					return nil
				}
				a, err := netip.ParseAddr(v)
				if err != nil {
					return errors.New("not an IP address")
				}
				c.DP.ParentAddr = a
				return nil
			}},
		{name: "log-format", env: "SLUICE_LOG_FORMAT", key: "logFormat", accepts: "json, console, or empty for console on a terminal and json elsewhere", help: "log line format",
			set: func(c *Config, v string) error { c.LogFormat = v; return oneOf(v, "", "json", "console") }},
		{name: "log-level", env: "SLUICE_LOG_LEVEL", key: "logLevel", def: "info", accepts: "debug, info, warn or error", help: "least severe level logged",
			set: func(c *Config, v string) error { c.LogLevel = v; return oneOf(v, "debug", "info", "warn", "error") }},
		{name: "record", env: "SLUICE_RECORD", key: "record", accepts: "a file", help: "also record every event to this file as JSON lines (replay with sluicectl replay)",
			set: str(func(c *Config) *string { return &c.Record })},
		{name: "state-file", env: "SLUICE_STATE_FILE", key: "stateFile", def: "/var/lib/sluice/desired-state", accepts: `a file, or "" for none`, help: "where the agent keeps the desired state when it stops; started again, it programs that state at once when etcd shows the watched keys unchanged since (a count and the newest key; no value sent), before it has read and computed everything again",
			set: str(func(c *Config) *string { return &c.StateFile })},
		{name: "route-source", env: "SLUICE_ROUTE_SOURCE", key: "routeSource", def: "CalicoIPAM", accepts: "CalicoIPAM or WorkloadIPs", help: "where routes come from: IPAM blocks, or workload endpoints (OpenStack without blocks)",
			set: func(c *Config, v string) error {
				c.Calc.RouteSource = calc.RouteSource(v)
				return oneOf(v, "CalicoIPAM", "WorkloadIPs")
			}},
		{name: "vxlan", env: "SLUICE_VXLAN", key: "vxlan", def: "true", boolean: true, accepts: "true or false", help: "program VXLAN routes, the VXLAN device and its VTEPs",
			set: func(c *Config, v string) (err error) { c.Calc.VXLAN, err = parseBool(v); return }},
		{name: "vxlan-device", env: "SLUICE_VXLAN_DEVICE", key: "vxlanDevice", def: dataplane.DefaultVXLANName, accepts: "an interface name (at most 15 characters)", help: "name of sluice's VXLAN device",
			set: ifName(func(c *Config) (*string, *string) { return &c.Calc.VXLANDevice, &c.DP.VXLAN.Name })},
		{name: "vxlan-device-v6", env: "SLUICE_VXLAN_DEVICE_V6", key: "vxlanDeviceV6", def: dataplane.DefaultVXLANNameV6, accepts: "an interface name (at most 15 characters)", help: "name of sluice's IPv6 VXLAN device (IPv6 tunnel addresses over an IPv6 underlay; same VNI and port)",
			set: ifName(func(c *Config) (*string, *string) { return &c.Calc.VXLANDeviceV6, &c.DP.VXLANv6.Name })},
		{name: "vxlan-vni", env: "SLUICE_VXLAN_VNI", key: "vxlanVNI", def: strconv.Itoa(dataplane.DefaultVNI), accepts: "1 to 16777215", help: "VXLAN network identifier (4096 matches Calico)",
			set: func(c *Config, v string) (err error) { c.DP.VXLAN.VNI, err = parseIntRange(v, 1, 1<<24-1); return }},
		{name: "vxlan-port", env: "SLUICE_VXLAN_PORT", key: "vxlanPort", def: strconv.Itoa(dataplane.DefaultVXLANPort), accepts: "1 to 65535", help: "VXLAN UDP port (4789 matches Calico)",
			set: func(c *Config, v string) (err error) { c.DP.VXLAN.Port, err = parseIntRange(v, 1, 65535); return }},
		{name: "vxlan-mtu", env: "SLUICE_VXLAN_MTU", key: "vxlanMTU", def: "0", accepts: "0, or 68 to 65485", help: "MTU of the VXLAN device; 0 means the parent interface's MTU minus 50",
			set: zeroOr(68, 65485, func(c *Config) *int { return &c.DP.VXLAN.MTU })},
		{name: "vxlan-mtu-v6", env: "SLUICE_VXLAN_MTU_V6", key: "vxlanMTUV6", def: "0", accepts: "0, or 1280 to 65465", help: "MTU of the IPv6 VXLAN device; 0 means the parent interface's MTU minus 70",
			set: zeroOr(1280, 65465, func(c *Config) *int { return &c.DP.VXLANv6.MTU })},
		{name: "blackhole-type", env: "SLUICE_BLACKHOLE_TYPE", key: "blackholeType", def: "blackhole", accepts: "blackhole, unreachable or prohibit", help: "route type for local blocks: silent drop, or ICMP errors",
			set: func(c *Config, v string) error {
				c.Calc.BlackholeType = calc.RouteType(v)
				return oneOf(v, "blackhole", "unreachable", "prohibit")
			}},
		{name: "blackhole-metric", env: "SLUICE_BLACKHOLE_METRIC", key: "blackholeMetric", def: "1024", accepts: "1 to 4294967294", help: "metric of local-block blackholes (high, so an operator's route wins)",
			set: func(c *Config, v string) (err error) {
				c.Calc.BlackholeMetric, err = parseIntRange(v, 1, 1<<32-2)
				return
			}},
		{name: "pool-blackholes", env: "SLUICE_POOL_BLACKHOLES", key: "poolBlackholes", def: "false", boolean: true, accepts: "true or false", help: "also blackhole whole pools at the lowest priority (a pool may share its range with other users)",
			set: func(c *Config, v string) (err error) { c.Calc.PoolBlackholes, err = parseBool(v); return }},
		{name: "nat-outgoing", env: "SLUICE_NAT_OUTGOING", key: "natOutgoing", def: "true", boolean: true, accepts: "true or false", help: "program pools' natOutgoing and floating IPs (nftables table sluice-nat); false leaves nftables alone",
			set: func(c *Config, v string) (err error) {
				var on bool
				on, err = parseBool(v)
				c.DP.NAT.Disabled = !on
				return
			}},
		{name: "nat-outgoing-address", env: "SLUICE_NAT_OUTGOING_ADDRESS", key: "natOutgoingAddress", def: "", accepts: "an IPv4 or IPv6 address, or empty", help: "source address of natOutgoing traffic of its family instead of the outgoing interface's",
			set: func(c *Config, v string) error {
				c.DP.NAT.Address4, c.DP.NAT.Address6 = netip.Addr{}, netip.Addr{}
				if v == "" {
					return nil
				}
				a, err := netip.ParseAddr(v)
				if err != nil || a.Zone() != "" {
					return errors.New("not an IP address")
				}
				if a.Is4() || a.Is4In6() {
					c.DP.NAT.Address4 = a.Unmap()
				} else {
					c.DP.NAT.Address6 = a
				}
				return nil
			}},
		{name: "nat-outgoing-exclusions", env: "SLUICE_NAT_OUTGOING_EXCLUSIONS", key: "natOutgoingExclusions", def: "IPPoolsOnly", accepts: "IPPoolsOnly or IPPoolsAndHostIPs", help: "destinations natOutgoing traffic reaches unchanged: pools, or nodes' addresses too",
			set: func(c *Config, v string) error {
				if err := oneOf(v, "IPPoolsOnly", "IPPoolsAndHostIPs"); err != nil {
					return err
				}
				c.Calc.NATOutgoingExclusions = calc.NATExclusions(v)
				return nil
			}},
		{name: "dataplane", env: "SLUICE_DATAPLANE", key: "dataplane", def: "true", boolean: true, accepts: "true or false", help: "program the kernel; false reads etcd and computes only",
			set: func(c *Config, v string) (err error) { c.Dataplane, err = parseBool(v); return }},
		{name: "route-table", env: "SLUICE_ROUTE_TABLE", key: "routeTable", def: "254", accepts: "1 to 4294967295, not 255 (local)", help: "routing table sluice's routes go in (254 is main)",
			set: func(c *Config, v string) error {
				n, err := parseIntRange(v, 1, 1<<32-1)
				if n == 255 {
					err = errors.New("the local table is the kernel's")
				}
				c.DP.Routes.Table = n
				return err
			}},
		{name: "route-protocol", env: "SLUICE_ROUTE_PROTOCOL", key: "routeProtocol", def: strconv.Itoa(dataplane.DefaultRouteProtocol), accepts: "3 to 255, one no other program uses", help: "route protocol number that marks sluice's routes",
			set: func(c *Config, v string) (err error) { c.DP.Routes.Protocol, err = parseIntRange(v, 3, 255); return }},
		{name: "route-layout", env: "SLUICE_ROUTE_LAYOUT", key: "routeLayout", def: "nexthops", accepts: "nexthops or gateways", help: "how routes to other nodes are laid out: through one kernel nexthop object per node (Linux 5.3 or later; fast at thousands of nodes), or each with its own gateway and device as Felix lays them out",
			set: func(c *Config, v string) error {
				c.DP.Routes.Nexthops = v == "nexthops"
				return oneOf(v, "nexthops", "gateways")
			}},
		{name: "resync-interval", env: "SLUICE_RESYNC_INTERVAL", key: "resyncInterval", def: "90s", accepts: "a duration of at least 1s", help: "period of the full dataplane resync, routes and service maps alike (a safety net behind the kernel watch: service map entries, programs detached and map pins removed by someone are found by it)",
			set: func(c *Config, v string) error {
				if err := atLeastOneSecond(func(c *Config) *time.Duration { return &c.DP.ResyncInterval })(c, v); err != nil {
					return err
				}
				c.BPF.ResyncInterval = c.DP.ResyncInterval
				return nil
			}},
		{name: "clean-conflicts", env: "SLUICE_CLEAN_CONFLICTS", key: "cleanConflicts", def: "false", boolean: true, accepts: "true or false", help: "remove what other networking software left that breaks sluice's routes, and Calico's or Cilium's programs that take its hooks' traffic first; without it they are only reported",
			set: func(c *Config, v string) (err error) { c.DP.CleanConflicts, err = parseBool(v); return }},
		{name: "services", env: "SLUICE_SERVICES", key: "services", def: "true", boolean: true, accepts: "true or false", help: "program service NAT in eBPF (cluster IPs, node ports, load-balancer and external IPs); false removes sluice's programs, links and pins",
			set: func(c *Config, v string) (err error) { c.Services, err = parseBool(v); return }},
		{name: "bgp", env: "SLUICE_BGP", key: "bgp", def: "false", boolean: true, accepts: "true or false", help: "run this node's BGP speaker (when its Node has spec.bgp), as calico/node's BIRD does: sessions and announcements from Calico's BGPConfiguration and BGPPeer; needs the dataplane",
			set: func(c *Config, v string) (err error) { c.Calc.BGP, err = parseBool(v); return }},
		{name: "bgp-default-route-metric", env: "SLUICE_BGP_DEFAULT_ROUTE_METRIC", key: "bgpDefaultRouteMetric", def: "0", accepts: "0 (never) or a metric, 1 to 2147483647", help: "program a default route the BGP speaker learns (a top-of-rack router's), at this metric; 0 never does, as calico/node; the node's own default route stays, the lower metric wins",
			set: func(c *Config, v string) (err error) {
				c.Calc.BGPDefaultRouteMetric, err = parseIntRange(v, 0, 1<<31-1)
				return
			}},
		{name: "bgp-secrets-dir", env: "SLUICE_BGP_SECRETS_DIR", key: "bgpSecretsDir", def: "/etc/sluice/bgp-secrets", accepts: "an absolute directory", help: "where BGP passwords are: a BGPPeer's password.secretKeyRef {name, key} is the file <dir>/<name>/<key> (a Kubernetes secret mounted as a volume has this layout)",
			set: func(c *Config, v string) error {
				c.BGPSecretsDir = v
				if !strings.HasPrefix(v, "/") {
					return errors.New("not an absolute path")
				}
				return nil
			}},
		{name: "bpf-pin-dir", env: "SLUICE_BPF_PIN_DIR", key: "bpfPinDir", def: "/sys/fs/bpf/sluice", accepts: "an absolute directory", help: "where sluice pins its eBPF maps and program links (bpffs is mounted there when it is not on one); one per agent",
			set: func(c *Config, v string) error {
				c.BPF.PinDir = v
				if !strings.HasPrefix(v, "/") {
					return errors.New("not an absolute path")
				}
				return nil
			}},
		{name: "host-interfaces", env: "SLUICE_HOST_INTERFACES", key: "hostInterfaces", def: bpf.DefaultHostInterfaces, accepts: "a regular expression", help: "host interfaces that get the service programs (node ports, tunnel from other nodes)",
			set: func(c *Config, v string) (err error) { c.BPF.HostInterfaces, err = regexp.Compile(v); return }},
		{name: "conntrack-tcp-established", env: "SLUICE_CONNTRACK_TCP_ESTABLISHED", key: "conntrackTCPEstablished", def: "120h", accepts: "a duration of at least 1s", help: "how long an idle established TCP connection through a service is kept (the kernel conntrack's default)",
			set: atLeastOneSecond(func(c *Config) *time.Duration { return &c.BPF.Timeouts.TCPEstablished })},
		{name: "conntrack-tcp-syn", env: "SLUICE_CONNTRACK_TCP_SYN", key: "conntrackTCPSyn", def: "60s", accepts: "a duration of at least 1s", help: "how long an idle TCP connection through a service is kept before its handshake completes (unanswered, or answered and not acknowledged: a SYN flood's; Cilium's 60 s, Calico's 20 s)",
			set: atLeastOneSecond(func(c *Config) *time.Duration { return &c.BPF.Timeouts.TCPSyn })},
		{name: "conntrack-cleanup-interval", env: "SLUICE_CONNTRACK_CLEANUP_INTERVAL", key: "conntrackCleanupInterval", def: "10s", accepts: "a duration of at least 1s", help: "period of the connection table's cleanup",
			set: atLeastOneSecond(func(c *Config) *time.Duration { return &c.BPF.CleanupInterval })},
		{name: "bpf-map-size-frontends", env: "SLUICE_BPF_MAP_SIZE_FRONTENDS", key: "bpfMapSizeFrontends", def: strconv.Itoa(bpf.DefaultMapSizes.Frontends), accepts: "16 to 16777216", help: "entries of the frontend map (one per service address:port, node port address and cluster IP)",
			set: func(c *Config, v string) (err error) {
				c.BPF.Sizes.Frontends, err = parseIntRange(v, 16, 1<<24)
				return
			}},
		{name: "bpf-map-size-backends", env: "SLUICE_BPF_MAP_SIZE_BACKENDS", key: "bpfMapSizeBackends", def: strconv.Itoa(bpf.DefaultMapSizes.Backends), accepts: "16 to 16777216", help: "entries of the backend map (one per endpoint of each distinct backend list)",
			set: func(c *Config, v string) (err error) { c.BPF.Sizes.Backends, err = parseIntRange(v, 16, 1<<24); return }},
		{name: "bpf-map-size-conntrack", env: "SLUICE_BPF_MAP_SIZE_CONNTRACK", key: "bpfMapSizeConntrack", def: strconv.Itoa(bpf.DefaultMapSizes.Conntrack), accepts: "1024 to 16777216", help: "entries of the connection table (two per translated connection); full, new connections are refused, live ones are never evicted",
			set: func(c *Config, v string) (err error) {
				c.BPF.Sizes.Conntrack, err = parseIntRange(v, 1024, 1<<24)
				return
			}},
		{name: "bpf-map-size-affinity", env: "SLUICE_BPF_MAP_SIZE_AFFINITY", key: "bpfMapSizeAffinity", def: strconv.Itoa(bpf.DefaultMapSizes.Affinity), accepts: "16 to 16777216", help: "entries of the client-IP affinity table (least recently used entries go first)",
			set: func(c *Config, v string) (err error) { c.BPF.Sizes.Affinity, err = parseIntRange(v, 16, 1<<24); return }},
		{name: "bpf-map-size-source-ranges", env: "SLUICE_BPF_MAP_SIZE_SOURCE_RANGES", key: "bpfMapSizeSourceRanges", def: strconv.Itoa(bpf.DefaultMapSizes.SourceRanges), accepts: "16 to 16777216", help: "entries of the loadBalancerSourceRanges map",
			set: func(c *Config, v string) (err error) {
				c.BPF.Sizes.SourceRanges, err = parseIntRange(v, 16, 1<<24)
				return
			}},
		{name: "bpf-map-size-cluster-nets", env: "SLUICE_BPF_MAP_SIZE_CLUSTER_NETS", key: "bpfMapSizeClusterNets", def: strconv.Itoa(bpf.DefaultMapSizes.ClusterNets), accepts: "16 to 16777216", help: "entries of the cluster network map (pools and node addresses)",
			set: func(c *Config, v string) (err error) {
				c.BPF.Sizes.ClusterNets, err = parseIntRange(v, 16, 1<<24)
				return
			}},
		{name: "nodeport-tunnel-mtu", env: "SLUICE_NODEPORT_TUNNEL_MTU", key: "nodeportTunnelMTU", def: "0", accepts: "0, or 576 to 65485", help: "largest packet forwarded to another node's endpoint; 0 means the node interface's MTU minus 50, which is also the most it may be (a larger value is refused, said in the service stage's status); larger packets get ICMP fragmentation-needed, or are cut when they may be fragmented",
			set: zeroOr(576, 65485, func(c *Config) *int { return &c.BPF.TunnelMTU })},
		{name: "nodeport-vni", env: "SLUICE_NODEPORT_VNI", key: "nodeportVNI", def: strconv.Itoa(bpf.DefaultVNI), accepts: "1 to 16777215, not the overlay's VNI", help: "VXLAN network identifier of node-port forwarding between nodes (on the VXLAN port)",
			set: func(c *Config, v string) (err error) {
				n, err := parseIntRange(v, 1, 1<<24-1)
				c.BPF.Services.VNI = uint32(n)
				return err
			}},
		{name: "nodeport-source-ports", env: "SLUICE_NODEPORT_SOURCE_PORTS", key: "nodeportSourcePorts", def: fmt.Sprintf("%d-%d", bpf.DefaultPSNATMin, bpf.DefaultPSNATMax), accepts: "a range like 20000-29999", help: "source ports given to connections forwarded to another node (the client's address is kept)",
			set: func(c *Config, v string) error {
				lo, hi, ok := strings.Cut(v, "-")
				a, err1 := parseIntRange(lo, 1, 65535)
				b, err2 := parseIntRange(hi, 1, 65535)
				if !ok || err1 != nil || err2 != nil || a > b {
					return errors.New("not a port range")
				}
				c.BPF.Services.PSNATMin, c.BPF.Services.PSNATMax = uint16(a), uint16(b)
				return nil
			}},
		{name: "reserve-node-ports", env: "SLUICE_RESERVE_NODE_PORTS", key: "reserveNodePorts", def: "30000-32767", accepts: "a port range LOW-HIGH, or none", help: "the node-port range, added to net.ipv4.ip_local_reserved_ports so that the node's own sockets never take one of its ports as their source (UDP answers to it would be taken for node-port traffic; TCP ones are told apart); none leaves the setting alone",
			set: func(c *Config, v string) error {
				if v == "none" {
					c.BPF.ReservePorts = [2]uint16{}
					return nil
				}
				lo, hi, ok := strings.Cut(v, "-")
				a, err1 := parseIntRange(lo, 1, 65535)
				b, err2 := parseIntRange(hi, 1, 65535)
				if !ok || err1 != nil || err2 != nil || a > b {
					return errors.New("not a port range")
				}
				c.BPF.ReservePorts = [2]uint16{uint16(a), uint16(b)}
				return nil
			}},
		{name: "bpf-attach", env: "SLUICE_BPF_ATTACH", key: "bpfAttach", def: "auto", accepts: "auto, tcx or tc", help: "how the service programs are attached to interfaces: tcx (TCX links, Linux 6.6 or later), tc (classic clsact and cls_bpf filters, every supported kernel), auto (tcx where the kernel has it, else tc)",
			set: func(c *Config, v string) (err error) { c.BPF.Attach, err = bpf.ParseAttachMode(v); return }},
		{name: "cgroup-path", env: "SLUICE_CGROUP_PATH", key: "cgroupPath", accepts: "a cgroup v2 directory, empty for the hierarchy's root, or none", help: "where the socket programs attach that point the node's own connections to services at a backend (empty: the cgroup v2 root, mounted at /run/sluice/cgroup when the host has none mounted); none leaves them alone",
			set: func(c *Config, v string) error { c.BPF.CgroupPath = v; return nil }},
		{name: "profiling", env: "SLUICE_PROFILING", key: "profiling", def: "false", boolean: true, accepts: "true or false", help: "also serve Go's CPU, heap and trace profiles under /debug/pprof/ on the health address",
			set: func(c *Config, v string) (err error) { c.Profiling, err = parseBool(v); return }},
		{name: "proxy-health-listen", env: "SLUICE_PROXY_HEALTH_LISTEN", key: "proxyHealthListen", def: "0.0.0.0:10256", accepts: "host:port, or empty to turn it off", help: "address of the proxy health check (/healthz, as kube-proxy's) for load balancers of Cluster-policy services",
			set: func(c *Config, v string) error { c.ProxyHealthListen = v; return nil }},
		{name: "status-ttl", env: "SLUICE_STATUS_TTL", key: "statusTTL", def: "15s", accepts: "a duration of at least 1s", help: "lease of this node's status key in etcd: how long after the agent dies `sluicectl status` says gone",
			set: atLeastOneSecond(func(c *Config) *time.Duration { return &c.StatusTTL })},
		{name: "etcd-liveness", env: "SLUICE_ETCD_LIVENESS", key: "etcdLiveness", def: "10s", accepts: "a duration of at least 1s", help: "how soon the agent reports not ready (on /readyz and sluice_etcd_in_sync) when etcd stops answering; the dataplane stays as it is meanwhile",
			set: atLeastOneSecond(func(c *Config) *time.Duration { return &c.EtcdLiveness })},
		{name: "etcd-watch-stall", env: "SLUICE_ETCD_WATCH_STALL", key: "etcdWatchStall", def: "1h", accepts: "0, or a duration of at least 1s", help: "how long a watch may stay behind the revision etcd reports before the agent takes it for lost and reads everything again (a watch etcd's gRPC proxy stopped serving); keep it above three times etcd's watch progress notify interval (10m by default)",
			set: func(c *Config, v string) error {
				if v == "0" {
					c.EtcdWatchStall = 0
					return nil
				}
				return atLeastOneSecond(func(c *Config) *time.Duration { return &c.EtcdWatchStall })(c, v)
			}},
		{name: "health-listen", env: "SLUICE_HEALTH_LISTEN", key: "healthListen", def: "127.0.0.1:9097", accepts: "host:port, or empty to turn it off", help: "address of /livez, /readyz and /metrics",
			set: func(c *Config, v string) error { c.HealthListen = v; return nil }},
	}
}

// ifName sets an interface name into the calc and dataplane fields dst gives.
func ifName(dst func(*Config) (*string, *string)) func(*Config, string) error {
	return func(c *Config, v string) error {
		a, b := dst(c)
		*a, *b = v, v
		if v == "" || len(v) > 15 || strings.ContainsAny(v, "/ ") {
			return errors.New("not an interface name")
		}
		return nil
	}
}

// zeroOr sets 0, or a number from lo to hi, into the field dst gives.
func zeroOr(lo, hi int, dst func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := parseIntRange(v, 0, hi)
		if err == nil && n != 0 && n < lo {
			err = errors.New("out of range")
		}
		*dst(c) = n
		return err
	}
}

// atLeastOneSecond sets a duration of at least a second into the field dst gives.
func atLeastOneSecond(dst func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return errors.New("not a duration of at least 1s")
		}
		*dst(c) = d
		return nil
	}
}

// optionError names the option, where the value came from, and what it accepts.
func optionError(o option, source, value string, err error) error {
	return fmt.Errorf("option %s (from %s): %q: %v; it accepts %s", o.name, source, value, err, o.accepts)
}

// Parse is ParseEnv with an environment where only non-empty variables count as set.
func Parse(args []string, getenv func(string) string, stderr io.Writer) (*Config, error) {
	return ParseEnv(args, func(k string) (string, bool) { v := getenv(k); return v, v != "" }, stderr)
}

// ParseEnv builds the configuration: defaults, then the file, then the environment, then
// flags, each overriding the one before. lookupEnv is os.LookupEnv or a stand-in: a variable
// that is set but empty counts as set, like an empty flag (SLUICE_HEALTH_LISTEN= turns the
// endpoint off even when the file sets it).
func ParseEnv(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*Config, error) {
	getenv := func(k string) string { v, _ := lookupEnv(k); return v }
	c := &Config{Calc: calc.DefaultConfig(""), BPF: bpf.StageConfig{Timeouts: bpf.DefaultTimeouts, Services: bpf.Config{VXLANPort: bpf.DefaultVXLANPort}}}
	table := optionTable()
	fromFlags := map[string]string{}
	fs := flag.NewFlagSet("sluiced", flag.ContinueOnError)
	// The flag package would print the whole help under a mistyped flag's error; the error
	// alone is returned, with a pointer to --help, and --help prints the help. The pointer is
	// short: after "sluiced: ", the line fits 80 columns for a flag of up to 18 characters.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	configFile := fs.String("config", "", "configuration file (env SLUICE_CONFIG; default "+DefaultConfigFile+" when present)")
	for _, o := range table {
		o := o
		usage := fmt.Sprintf("%s (env %s; accepts %s)", o.help, o.env, o.accepts)
		if o.boolean { // a bare --flag means true
			fs.Var(&boolFlag{set: func(v string) { fromFlags[o.name] = v }}, o.name, usage)
			continue
		}
		fs.Func(o.name, usage, func(v string) error { fromFlags[o.name] = v; return nil })
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			WriteHelp(stderr)
			return nil, err
		}
		return nil, fmt.Errorf("%v (see sluiced --help)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, o := range table {
		if o.def != "" {
			if err := o.set(c, o.def); err != nil {
				return nil, optionError(o, "default", o.def, err)
			}
		}
	}
	path, explicit := *configFile, true
	if path == "" {
		path = getenv("SLUICE_CONFIG")
	}
	if path == "" {
		path, explicit = DefaultConfigFile, false
	}
	file, err := readConfigFile(path, explicit, table)
	if err != nil {
		return nil, err
	}
	for _, o := range table {
		if v, ok := file[o.key]; ok {
			if err := o.set(c, v); err != nil {
				return nil, optionError(o, "file "+path+" key "+o.key, v, err)
			}
		}
		if v, ok := lookupEnv(o.env); ok {
			if err := o.set(c, v); err != nil {
				return nil, optionError(o, "environment "+o.env, v, err)
			}
		}
		if v, ok := fromFlags[o.name]; ok {
			if err := o.set(c, v); err != nil {
				return nil, optionError(o, "flag --"+o.name, v, err)
			}
		}
	}
	if c.Calc.VXLANDevice == c.Calc.VXLANDeviceV6 {
		return nil, fmt.Errorf("options vxlan-device and vxlan-device-v6 both name %q: the IPv4 and IPv6 devices need names of their own", c.Calc.VXLANDevice)
	}
	c.Etcd = c.Etcd.WithEnv(getenv)
	c.NotifySocket = getenv("NOTIFY_SOCKET")
	c.Watchdog = WatchdogInterval(getenv("WATCHDOG_USEC"), getenv("WATCHDOG_PID"), os.Getpid())
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("option node-name is not set and the hostname is unknown: %w", err)
		}
		c.NodeName = strings.ToLower(h) // as Calico names a node after its host
	}
	c.Calc.NodeName = c.NodeName
	if _, err := calc.New(c.Calc); err != nil {
		return nil, err
	}
	c.BPF.Services.NodeName = c.NodeName
	c.DP.Routes.NodeName = c.NodeName
	c.BPF.Services.VXLANPort = uint16(c.DP.VXLAN.Port)
	c.BPF.TunnelDevices = []string{c.Calc.VXLANDevice, c.Calc.VXLANDeviceV6}
	c.BPF.CleanConflicts = c.DP.CleanConflicts
	// Without socket programs, netfilter's service rules take the node's own connections.
	c.DP.SocketProgramsOff = !c.Services || c.BPF.CgroupPath == "none"
	if c.BPF.Services.VNI == uint32(c.DP.VXLAN.VNI) {
		return nil, fmt.Errorf("options nodeport-vni and vxlan-vni are both %d: node-port forwarding needs a VNI of its own", c.DP.VXLAN.VNI)
	}
	return c, nil
}

// boolFlag lets a boolean option be given bare (--vxlan) or with a value (--vxlan=false).
type boolFlag struct{ set func(string) }

func (b *boolFlag) String() string     { return "" }
func (b *boolFlag) Set(v string) error { b.set(v); return nil }
func (b *boolFlag) IsBoolFlag() bool   { return true }

// readConfigFile reads a flat YAML map of option keys. Unknown keys are errors.
func readConfigFile(path string, explicit bool, table []option) (map[string]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !explicit {
			return nil, nil
		}
		return nil, fmt.Errorf("reading configuration file: %w", err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("configuration file %s: not a YAML map of options: %v", path, err)
	}
	known := map[string]bool{}
	for _, o := range table {
		known[o.key] = true
	}
	out := map[string]string{}
	for k, v := range m {
		if !known[k] {
			return nil, fmt.Errorf("configuration file %s: unknown key %q (see docs/configuration.md)", path, k)
		}
		switch v := v.(type) {
		case []any:
			parts := make([]string, len(v))
			for i, p := range v {
				parts[i] = fmt.Sprint(p)
			}
			out[k] = strings.Join(parts, ",")
		case nil:
			out[k] = ""
		default:
			out[k] = fmt.Sprint(v)
		}
	}
	return out, nil
}

// WriteOptionTable prints every option: the source of `sluiced --help` and
// docs/configuration.md.
func WriteOptionTable(w io.Writer) {
	table := optionTable()
	fmt.Fprintln(w, "\n| flag | environment | file key | default | accepts | what it does |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	fmt.Fprintf(w, "| `--config` | `SLUICE_CONFIG` | | `%s` (absent is fine) | a file | the configuration file: a YAML map of the keys below |\n", DefaultConfigFile)
	for _, o := range table {
		def := "`" + o.def + "`"
		if o.def == "" {
			def = ""
		}
		fmt.Fprintf(w, "| `--%s` | `%s` | `%s` | %s | %s | %s |\n", o.name, o.env, o.key, def, o.accepts, o.help)
	}
}

// WriteHelp writes `sluiced --help`: every option with what it does, its default, what it
// accepts, its environment variable and file key, in 80 columns. (docs/configuration.md has
// the same as a table.)
func WriteHelp(w io.Writer) {
	fmt.Fprint(w, `usage: sluiced [flags]
       sluiced --check-kernel   what this kernel has of what sluice uses
       sluiced --version

Kernels: routes and VXLAN on any (nexthop objects from Linux 5.3); the eBPF
service stage from 5.10 (proven on 5.10, 6.1, 6.12 and 6.18: make test-kernels),
through TCX links from 6.6 and classic tc filters before (option bpf-attach). A
service stage the kernel refuses leaves the rest running; /readyz says why.

Every option is also an environment variable and a key of the configuration
file; precedence: flags, then environment, then file, then defaults. A variable
set but empty counts, as an empty flag does. docs/configuration.md has the same
as a table.

  --config FILE
      configuration file (env SLUICE_CONFIG; default `+DefaultConfigFile+`
      when present)
`)
	for _, o := range optionTable() {
		arg := " VALUE"
		if o.boolean {
			arg = "[=true|false]"
		}
		fmt.Fprintf(w, "  --%s%s\n", o.name, arg)
		def := o.def
		if def == "" {
			def = "none"
		}
		for _, l := range Wrap(fmt.Sprintf("%s. Default %s; accepts %s; env %s; file key %s.", o.help, def, o.accepts, o.env, o.key), 80-6) {
			fmt.Fprintf(w, "      %s\n", l)
		}
	}
}

// Wrap breaks text into lines of at most width runes at spaces, never inside a bracketed
// group such as a synopsis's "[--from-log FILE]" (a longer word or group stands alone): the
// help of sluiced and sluicectl, in 80 columns.
func Wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range words(text) {
		if line != "" && utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// words splits text at spaces, keeping a bracketed group ("[--from-log FILE]") whole.
func words(text string) []string {
	var out []string
	depth := 0
	for _, f := range strings.Fields(text) {
		if depth > 0 {
			out[len(out)-1] += " " + f
		} else {
			out = append(out, f)
		}
		depth += strings.Count(f, "[") - strings.Count(f, "]")
		depth = max(depth, 0)
	}
	return out
}

// Doc writes docs/configuration.md, generated from the table.
func Doc(w io.Writer) {
	fmt.Fprintln(w, "# sluiced configuration")
	fmt.Fprintln(w, "\nGenerated from sluiced's option table (`sluiced --help` prints the same); do not edit by hand.")
	fmt.Fprintln(w, "Every option can be a flag, an environment variable or a key of the configuration file.")
	fmt.Fprintln(w, "Precedence: flags, then environment, then the file, then the defaults. An invalid value")
	fmt.Fprintln(w, "stops the start with a message naming the option, where the value came from and what it accepts.")
	fmt.Fprintln(w, "An environment variable set but empty counts, as an empty flag does: `SLUICE_HEALTH_LISTEN=`")
	fmt.Fprintln(w, "turns the endpoint off even when the file sets an address.")
	WriteOptionTable(w)
	fmt.Fprintln(w, "\nExample file:\n\n```yaml\netcdEndpoints: [https://10.0.0.1:2379, https://10.0.0.2:2379]\netcdCACert: /etc/sluice/etcd-ca.pem\netcdCert: /etc/sluice/etcd-cert.pem\netcdKey: /etc/sluice/etcd-key.pem\nlogLevel: info\ncleanConflicts: false\n```")
	fmt.Fprintln(w, "\nTwo more flags are commands, not options: each must be the only argument (`-check-kernel`,")
	fmt.Fprintln(w, "`-version` and `version` work too). They read no configuration and start no agent.")
	fmt.Fprintln(w, "\n| flag | what it does |\n|---|---|")
	fmt.Fprintln(w, "| `--check-kernel` | as root (the probes load programs), print the kernel's release and every kernel feature sluice uses: the Linux version that brought it, whether this kernel has it (or the probe's error), and what sluice does without it; exit 0 when sluice can do its whole job here, 1 when a feature is missing that nothing stands in for (classic tc filters stand in for TCX, a cleaner in user space for syscall programs) |")
	fmt.Fprintln(w, "| `--version` | print which build this is and exit: `sluiced version V, commit C, goX.Y`, the commit followed by \"(with uncommitted changes)\" when the tree had some |")
}

// OptionNames lists every option's flag and environment variable, for tests.
func OptionNames() (flags, envs []string) {
	for _, o := range optionTable() {
		flags, envs = append(flags, o.name), append(envs, o.env)
	}
	return flags, envs
}

// WatchdogInterval reads WATCHDOG_USEC (and WATCHDOG_PID, which must be ours when set).
func WatchdogInterval(usec, pid string, self int) time.Duration {
	if usec == "" {
		return 0
	}
	if pid != "" && pid != strconv.Itoa(self) {
		return 0
	}
	n, err := strconv.ParseInt(usec, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Microsecond
}

// calcOptions are the options that shape calc's computation: what `sluicectl plan` takes too.
var calcOptions = []string{"route-source", "vxlan", "vxlan-device", "vxlan-device-v6", "blackhole-type", "blackhole-metric", "pool-blackholes"}

// CalcFlags registers on fs the options of the table that shape calc's computation, with
// sluiced's names, defaults and checks; the returned function builds the calc configuration
// for a node once fs is parsed.
func CalcFlags(fs *flag.FlagSet) func(node string) (calc.Config, error) {
	var opts []option
	given := map[string]string{}
	for _, o := range optionTable() {
		if !slices.Contains(calcOptions, o.name) {
			continue
		}
		opts = append(opts, o)
		usage := fmt.Sprintf("%s (accepts %s; default %q)", o.help, o.accepts, o.def)
		if o.boolean {
			fs.Var(&boolFlag{set: func(v string) { given[o.name] = v }}, o.name, usage)
			continue
		}
		fs.Func(o.name, usage, func(v string) error { given[o.name] = v; return nil })
	}
	return func(node string) (calc.Config, error) {
		c := &Config{Calc: calc.DefaultConfig(node)}
		for _, o := range opts {
			v, ok := given[o.name]
			source := "flag --" + o.name
			if !ok {
				v, source = o.def, "default"
			}
			if err := o.set(c, v); err != nil {
				return calc.Config{}, optionError(o, source, v, err)
			}
		}
		c.Calc.NodeName = node
		return c.Calc, nil // what the options cannot check alone, calc.New does
	}
}
