/* Shared layouts of sluice's eBPF maps. The Go side (bpf/maps.go) mirrors every struct here
 * field for field; bpf2go checks the sizes. Maps are per address family (the _v4 suffix):
 * IPv6 gets its own maps with 16-byte addresses rather than a rewrite of these. A layout
 * change must change the map's name (pinned maps of the old layout are then left for the
 * agent to remove), never reuse it. */
#ifndef SLUICE_H
#define SLUICE_H

#include <linux/types.h>

/* Frontend flags. */
#define FE_EXT_LOCAL   (1 << 0) /* externalTrafficPolicy Local: outside clients use local backends only */
#define FE_INT_LOCAL   (1 << 1) /* internalTrafficPolicy Local: cluster clients use local backends only */
#define FE_SRC_RANGES  (1 << 2) /* loadBalancerSourceRanges: the client must match sl_src_v4 */
#define FE_ADDR_ONLY   (1 << 3) /* port 0: the address is a cluster IP; other ports are rejected */
#define FE_NODE_PORT   (1 << 4) /* a node port (the wildcard or one of the node's addresses) */

struct fe_key_v4 {
	__be32 addr;   /* 0.0.0.0 for a node port's wildcard */
	__be16 port;   /* 0 with proto 0: the address-only entry of a cluster IP */
	__u8 proto;
	__u8 pad;
};

struct fe_val {
	__u64 list_id;       /* the backend list (sl_be_v4 keys) */
	__u64 svc_id;        /* the service's identity, for operators and affinity */
	__u32 count;         /* backends in the list */
	__u32 local;         /* backends [0, local) are on this node */
	__u32 cluster_start; /* the cluster-wide set is [cluster_start, count) */
	__u32 affinity_sec;  /* sessionAffinity ClientIP timeout; 0 = none */
	__u32 flags;
	__u32 pad;
};

/* Backend flags. */
#define BE_LOCAL  (1 << 0) /* on this node: delivered directly, never tunnelled */
#define BE_ROUTED (1 << 1) /* on no node of the cluster (an endpoint without nodeName, an address
			    * outside the cluster): plain DNAT, then the FIB or the kernel's
			    * routing as for a local backend; never tunnelled */

struct be_key {
	__u64 list_id;
	__u32 ordinal;
	__u32 pad;
};

struct be_val_v4 {
	__be32 addr;
	__be32 node_addr; /* the backend's node, outer destination of the node-port tunnel */
	__be16 port;
	__u16 flags;
	__u32 pad;
};

/* Client-IP affinity finds the endpoint it remembers in a list of up to AFF_SCAN backends by
 * reading them; in a longer list by its address in the index, written with the list by the
 * agent (lists of AFF_SCAN or fewer have no index entries: the usual service costs nothing). */
#define AFF_SCAN 16

/* A backend's ordinal in its list, by address (lists longer than AFF_SCAN). */
struct be_idx_key_v4 {
	__u64 list_id;
	__be32 addr;
	__be16 port;
	__u16 pad;
};

/* loadBalancerSourceRanges: prefixlen = 64 + the source prefix's length. */
struct src_key_v4 {
	__u32 prefixlen;
	__be32 fe_addr;
	__be16 fe_port;
	__u8 proto;
	__u8 pad;
	__be32 src;
};

/* Cluster networks: pools and node addresses. */
#define CNET_POOL (1 << 0)
#define CNET_HOST (1 << 1) /* a node's underlay address: a trusted tunnel peer */
#define CNET_SELF (1 << 2) /* one of this node's own addresses */

struct cnet_key_v4 {
	__u32 prefixlen;
	__be32 addr;
};

struct cnet_val {
	__u32 flags;
};

/* Client-IP affinity. */
struct aff_key_v4 {
	__be32 fe_addr;
	__be16 fe_port;
	__u8 proto;
	__u8 pad;
	__be32 client;
};

struct aff_val_v4 {
	__u64 seen;   /* ns, CLOCK_MONOTONIC */
	__be32 addr;
	__be16 port;
	__u16 pad;
};

/* Connection tracking. Keys are directional: as the packet of that direction carries them. */
struct ct_key_v4 {
	__be32 src;
	__be32 dst;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* Entry types. */
#define CT_FWD 1 /* client->frontend as sent: where to DNAT; the pair's REV holds the state */
#define CT_REV 2 /* backend->client as replied: how to undo the NAT and where to send it */
#define CT_TUN 3 /* backend->client on the backend's node: reply through the tunnel to nat_addr */

/* Entry flags. */
#define CT_F_REMOTE    (1 << 0) /* forwarded to the backend's node through the tunnel */
#define CT_F_REDIRECT  (1 << 1) /* REV: replies leave by ifindex with macs (came in from outside) */
#define CT_F_PSNAT     (1 << 2) /* the source port was rewritten to nat_sport */
#define CT_F_LOCAL     (1 << 3) /* the backend is a workload on this node */

/* TCP state bits, kept in REV and TUN entries. Flows of other protocols (UDP) keep
 * TCP_REPLIED only: an answered one gets the longer timeout, as the kernel's "stream". */
#define TCP_SYN      (1 << 0)
#define TCP_REPLIED  (1 << 1) /* the responder answered: established for the timeouts */
#define TCP_FIN_FWD  (1 << 2)
#define TCP_FIN_REV  (1 << 3)
#define TCP_RST      (1 << 4)
/* After an RST, a packet of each direction that is no RST: both set means the peers talked
 * past the reset (out of window, or a middlebox's), and the flow is established again. */
#define TCP_LIVE_FWD (1 << 5)
#define TCP_LIVE_REV (1 << 6)
/* Answered, but the client has not acknowledged the answer yet (the kernel's SYN_RECV): a
 * spoofed SYN's flow, whose backend's SYN-ACK went to an address that never answers, stays
 * here. Set by the first reply, cleared by the client's next ACK. A flow established before
 * the bit existed never has it, so it reads as established, as it is. */
#define TCP_OPENING  (1 << 7)

struct ct_val_v4 {
	__u64 created;   /* ns, CLOCK_MONOTONIC */
	__u64 last_seen; /* ns; refreshed by packets of both directions (REV, TUN) */
	__u8 type;
	__u8 flags;
	__u8 tcp;
	__u8 pad;
	__u32 ifindex;    /* REV with CT_F_REDIRECT: the interface the request came in on */
	__be32 nat_addr;  /* FWD: backend; REV: frontend; TUN: the ingress node (tunnel peer) */
	__be32 tun_addr;  /* FWD/REV with CT_F_REMOTE: the backend's node */
	__be16 nat_port;  /* FWD: backend port; REV: frontend port */
	__be16 nat_sport; /* FWD: source port towards the backend; REV: the client's own */
	__u8 mac_local[6]; /* REV: our MAC on ifindex (source of replies) */
	__u8 mac_peer[6];  /* REV: the hop the request came from (destination of replies) */
	/* FWD: source address written towards the backend, 0 = unchanged (the client's own);
	 * REV: the client's own address, where replies go, 0 = the reply's destination as it
	 * is. Set for hairpin flows only (HAIRPIN_ADDR). It took the place of a padding word
	 * that was always 0, so the layout and the map's name are unchanged and entries of an
	 * older agent read as "unchanged". */
	__be32 nat_saddr;
	__u32 pad3; /* named, so no byte of an entry is left uninitialised */
};

/* Young flows: each new flow's state entry (REV, or TUN on the backend's node), in the order
 * the flows came, per CPU, in a ring. A flow still not established when its slot comes round
 * again is evicted to make room (the kernel conntrack's early drop), so unanswered flows,
 * a SYN flood's, hold at most the ring's share of the connection table, and established ones
 * are never evicted. */
struct ct_young_v4 {
	struct ct_key_v4 key;
	__u64 created; /* the entry's, so a newer flow on the same tuple is not taken for it */
};

/* Hairpin: a workload reaching itself through a service gets this link-local source (host
 * order; 169.254.42.1, Cilium's service loopback address), so that its answer leaves it for
 * the reverse translation instead of staying inside its own namespace. */
#define HAIRPIN_ADDR 0xa9fe2a01

/* IP fragments: the ports of a datagram's first fragment, for its later fragments (which
 * carry none), by the datagram as the fragments arrive at a hook. */
struct frag_key_v4 {
	__be32 src;
	__be32 dst;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct frag_val_v4 {
	__be16 sport;
	__be16 dport;
};

/* Global settings, one entry. */
struct cfg {
	__be32 host_ip;     /* this node's underlay address: outer source of tunnelled packets */
	__u32 tunnel_mtu;   /* largest inner IP packet the tunnel carries */
	__u32 vni;          /* VXLAN network identifier of node-port forwarding */
	__be16 vxlan_port;  /* UDP port, network order */
	__u16 psnat_min;    /* source ports for forwarded flows, host order */
	__u16 psnat_max;
	__u16 pad;
	__u32 flags;
	__u64 netns_cookie; /* the agent's network namespace: socket hooks act only there */
};

/* Sockets connected by the socket hooks: a datagram from the backend is shown to the
 * application as coming from the frontend it asked for. */
struct sock_key_v4 {
	__u64 cookie;
	__be32 addr;
	__be16 port;
	__u16 pad;
};

struct sock_val_v4 {
	__be32 fe_addr;
	__be16 fe_port;
	__u16 pad;
};

/* Counters (per CPU), by index. */
enum counter {
	C_NAT_NEW = 0,        /* new flows translated */
	C_NAT_FWD_REMOTE,     /* new flows forwarded to another node */
	C_TUN_IN,             /* tunnelled packets unwrapped (before the reply and collision checks) */
	C_DROP_FORGED_TUNNEL, /* tunnel packet from an address that is no known node */
	C_DROP_NO_LOCAL,      /* traffic policy Local with no local endpoint */
	C_DROP_SRC_RANGE,     /* client outside loadBalancerSourceRanges */
	C_DROP_CT_FULL,       /* connection table full */
	C_DROP_TOO_BIG,       /* too large for the tunnel and not allowed to fragment */
	C_DROP_COLLISION,     /* a flow's tuple is taken by a live one (another node's, or no free source port) */
	C_DROP_FIB,           /* no route for a translated or tunnelled packet (unreachable, or not forwarded) */
	C_DROP_MALFORMED,     /* headers that could not be read or rewritten */
	C_REJECT_NO_BACKEND,  /* service without usable endpoint: RST or ICMP unreachable */
	C_REJECT_PORT,        /* cluster IP on a port the service does not have */
	C_ICMP_TOO_BIG,       /* ICMP fragmentation-needed sent */
	C_REV_NAT,            /* replies translated back */
	C_SOCK_NAT,           /* host sockets connected straight to a backend */
	C_REJECT_SOCK,        /* host socket refused: no endpoint or unknown port */
	C_CT_SUPERSEDED,      /* a new connection (a SYN) took a tuple from a closed or unrelated flow's state */
	C_FRAG_SPLIT,         /* packets too large for the tunnel that may be fragmented, cut in two */
	C_DROP_FIB_BLACKHOLE, /* the route to the destination is a blackhole */
	C_DROP_FIB_PROHIBIT,  /* the route to the destination is prohibit */
	C_DROP_FIB_FRAG,      /* larger than the route's interface carries: nodeport-tunnel-mtu past the underlay */
	C_DROP_FIB_OTHER,     /* forwarding disabled on the interface, or a route the lookup cannot use */
	C_CT_EVICTED,         /* flows not established when their young-flow slot came round: evicted */
	C_NUM,
};

/* Cleanup requests for the cleaner program: delete key if last_seen is unchanged. */
struct ct_clean_req_v4 {
	struct ct_key_v4 key;
	struct ct_key_v4 pair; /* the other entry of the pair, or all zero */
	__u64 seen;            /* last_seen as judged */
};

#define CLEAN_BATCH 64

struct ct_clean_ctx_v4 {
	__u32 n;
	__u32 deleted;
	__u32 kept;
	__u32 pad;
	struct ct_clean_req_v4 req[CLEAN_BATCH];
};

/* IPv6: the same maps with 16-byte addresses (the _v6 suffix), read by the IPv6 programs. An
 * address is four words in network order, as the IPv6 header carries it. A node's underlay
 * address in an IPv6 entry (a backend's node, a tunnel peer) may be IPv4: then it is
 * IPv4-mapped (::ffff:a.b.c.d). */
struct addr6 {
	__be32 w[4];
};

struct fe_key_v6 {
	struct addr6 addr; /* :: for a node port's wildcard */
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct be_val_v6 {
	struct addr6 addr;
	struct addr6 node_addr;
	__be16 port;
	__u16 flags;
	__u32 pad;
};

struct be_idx_key_v6 {
	__u64 list_id;
	struct addr6 addr;
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

/* loadBalancerSourceRanges: prefixlen = 160 + the source prefix's length. */
struct src_key_v6 {
	__u32 prefixlen;
	struct addr6 fe_addr;
	__be16 fe_port;
	__u8 proto;
	__u8 pad;
	struct addr6 src;
};

struct cnet_key_v6 {
	__u32 prefixlen;
	struct addr6 addr;
};

struct aff_key_v6 {
	struct addr6 fe_addr;
	__be16 fe_port;
	__u8 proto;
	__u8 pad;
	struct addr6 client;
};

struct aff_val_v6 {
	__u64 seen;
	struct addr6 addr;
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

struct ct_key_v6 {
	struct addr6 src;
	struct addr6 dst;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* As ct_val_v4, field for field. */
struct ct_val_v6 {
	__u64 created;
	__u64 last_seen;
	__u8 type;
	__u8 flags;
	__u8 tcp;
	__u8 pad;
	__u32 ifindex;
	struct addr6 nat_addr;
	struct addr6 tun_addr;
	__be16 nat_port;
	__be16 nat_sport;
	__u8 mac_local[6];
	__u8 mac_peer[6];
	struct addr6 nat_saddr; /* all zero: unchanged */
	__u32 pad3;
};

struct ct_young_v6 {
	struct ct_key_v6 key;
	__u64 created;
};

/* Hairpin over IPv6: 100::5c1c (host order words), in the discard-only prefix (RFC 6666):
 * routers drop it, so should it ever leave the node it goes nowhere. */
#define HAIRPIN6_W0 0x01000000
#define HAIRPIN6_W3 0x00005c1c

struct frag_key_v6 {
	struct addr6 src;
	struct addr6 dst;
	__be32 id;
	__u8 proto;
	__u8 pad[3];
};

struct sock_key_v6 {
	__u64 cookie;
	struct addr6 addr;
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

struct sock_val_v6 {
	struct addr6 fe_addr;
	__be16 fe_port;
	__u16 pad;
};

struct ct_clean_req_v6 {
	struct ct_key_v6 key;
	struct ct_key_v6 pair;
	__u64 seen;
};

#define CLEAN_BATCH6 32

struct ct_clean_ctx_v6 {
	__u32 n;
	__u32 deleted;
	__u32 kept;
	__u32 pad;
	struct ct_clean_req_v6 req[CLEAN_BATCH6];
};

/* IPv6 settings, one entry: the node-port tunnel over the node's IPv6 underlay. */
struct cfg_v6 {
	struct addr6 host_ip; /* this node's IPv6 underlay address; all zero: no IPv6 tunnel */
	__u32 tunnel_mtu;     /* largest inner IPv6 packet the tunnel carries */
	__u32 pad;
};

/* The IPv6 programs, by hook, in sl_progs_v6: each IPv4 program passes an IPv6 packet on to
 * its hook's IPv6 program (a tail call: one program a hook, each family verified alone). */
#define PROG6_FROM_HOST 0
#define PROG6_FROM_WEP  1
#define PROG6_TO_WEP    2
#define PROG6_TO_HOST   3
#define PROG6_NUM       4

#endif
