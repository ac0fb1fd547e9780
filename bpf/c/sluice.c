// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* sluice's service data path: tc programs on host and workload interfaces that translate
 * service traffic (cluster IPs, node ports, external and load-balancer addresses), forward
 * node-port traffic to an endpoint's node through a VXLAN tunnel of their own (the client's
 * address kept), and send replies back the way the request came. See ARCHITECTURE.md ("bpf")
 * for the design and the Go files of package bpf for the other side. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sluice.h"

#ifndef AF_INET
#define AF_INET 2
#endif

#define IP_OFF ETH_HLEN
#define L4_OFF (ETH_HLEN + sizeof(struct iphdr))
#define ENCAP_LEN (sizeof(struct iphdr) + sizeof(struct udphdr) + 8 + ETH_HLEN)
#define IP_RF 0x8000
#define IP_DF 0x4000
#define IP_MF 0x2000
#define IP_OFFMASK 0x1fff
#define NSEC 1000000000ULL
/* bpf_skb_adjust_room's decapsulation flags, newer than the UAPI headers this builds with:
 * the inner protocol is IPv4 (Linux 6.3), the UDP tunnel's GSO state goes (7.0). */
#define ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define ADJ_ROOM_DECAP_L4_UDP  (1ULL << 10)

#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3
#define ICMP_FRAG_NEEDED 4

struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be16 unused;
	__be16 mtu;
};

/* Sizes are the defaults; the agent sets them from its options before loading. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fe_key_v4);
	__type(value, struct fe_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_fe_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct be_key);
	__type(value, struct be_val_v4);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_be_v4 SEC(".maps");

/* Written by the agent only, never by a program: allocated per entry, so its memory follows
 * the long lists there are, not the size option. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct be_idx_key_v4);
	__type(value, __u32);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_be_idx_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_key_v4);
	__type(value, __u32);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_src_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct cnet_key_v4);
	__type(value, struct cnet_val);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_cnet_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct aff_key_v4);
	__type(value, struct aff_val_v4);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_aff_v4 SEC(".maps");

/* A plain hash, not an LRU: an entry of a live flow is never evicted to make room; a full
 * table refuses new flows (counted) and the cleaner makes room by expiry only. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_key_v4);
	__type(value, struct ct_val_v4);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_ct_v4 SEC(".maps");

/* The young-flow ring (struct ct_young_v4), per CPU; its size is set by the agent from the
 * connection table's (an eighth of it over the CPUs). Not pinned: a restart starts an empty
 * ring, and flows left unanswered from before it go by their timeout. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_young_v4);
	__uint(max_entries, 4096);
} sl_ct_young_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} sl_ct_young_pos SEC(".maps");

/* Scratch space for an ICMP error's quote (up to 68 bytes: the longest IPv4 header and 8
 * bytes beyond), off the stack the inlined programs share. */
struct quote_buf {
	__u8 b[68];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct quote_buf);
	__uint(max_entries, 1);
} sl_scratch SEC(".maps");

/* Not pinned: a datagram's fragments arrive within milliseconds; a restart that loses this
 * loses at most the datagrams in flight. An LRU: old datagrams make room. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag_key_v4);
	__type(value, struct frag_val_v4);
	__uint(max_entries, 8192);
} sl_frag_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct cfg);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, C_NUM);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_counters SEC(".maps");

struct pkt {
	__be32 src, dst;
	__be16 sport, dport;
	__u8 proto;
	__u8 tcp_flags; /* TCP header byte 13 */
	__u16 frag;     /* frag_off, host order */
	__u16 tot_len;  /* host order */
	__u8 tos;
	__u8 ttl;
	__u16 l4;       /* offset of the transport header: after the IP header and its options */
	__be16 id;      /* IP identification */
	__u8 later;     /* a later fragment: no transport header, ports from the first fragment */
};

#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_ACK 0x10

static __always_inline void count(__u32 c)
{
	__u64 *v = bpf_map_lookup_elem(&sl_counters, &c);
	if (v)
		*v += 1;
}

static __always_inline struct cfg *config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sl_cfg, &zero);
}

/* parse reads the IPv4 header at ip_off and the transport header after it and its options.
 * Returns 0 when the packet is IPv4; ports are read only for TCP and UDP first fragments. */
static __always_inline int parse(struct __sk_buff *skb, __u32 ip_off, struct pkt *p)
{
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, ip_off, &ip, sizeof(ip)) < 0)
		return -1;
	if (ip.version != 4 || ip.ihl < 5)
		return -1;
	p->src = ip.saddr;
	p->dst = ip.daddr;
	p->proto = ip.protocol;
	p->frag = bpf_ntohs(ip.frag_off);
	p->tot_len = bpf_ntohs(ip.tot_len);
	p->tos = ip.tos;
	p->ttl = ip.ttl;
	p->id = ip.id;
	p->later = 0;
	p->sport = p->dport = 0;
	p->tcp_flags = 0;
	__u32 l4 = ip_off + ip.ihl * 4;
	p->l4 = l4;
	if (p->frag & IP_OFFMASK)
		return 0;
	if (p->proto == IPPROTO_TCP) {
		__u8 th[14];
		if (bpf_skb_load_bytes(skb, l4, th, sizeof(th)) < 0)
			return -1;
		__builtin_memcpy(&p->sport, &th[0], 2);
		__builtin_memcpy(&p->dport, &th[2], 2);
		p->tcp_flags = th[13];
	} else if (p->proto == IPPROTO_UDP) {
		__be16 ports[2];
		if (bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) < 0)
			return -1;
		p->sport = ports[0];
		p->dport = ports[1];
	}
	return 0;
}

static __always_inline int is_l4(struct pkt *p)
{
	return (p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP) && (!(p->frag & IP_OFFMASK) || p->later);
}

/* frag_track gives a later fragment of a TCP or UDP datagram the ports of its first fragment,
 * as the first fragment arrived at this hook (so it is translated as the first was), and
 * remembers a first fragment's ports. A later fragment that comes before its first is left
 * without ports: passed on untranslated, as Cilium does. */
static __always_inline void frag_track(struct pkt *p)
{
	if (!(p->frag & (IP_MF | IP_OFFMASK)) || (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP))
		return;
	struct frag_key_v4 k = {.src = p->src, .dst = p->dst, .id = p->id, .proto = p->proto};
	if (!(p->frag & IP_OFFMASK)) {
		struct frag_val_v4 v = {.sport = p->sport, .dport = p->dport};
		bpf_map_update_elem(&sl_frag_v4, &k, &v, BPF_ANY);
		return;
	}
	struct frag_val_v4 *v = bpf_map_lookup_elem(&sl_frag_v4, &k);
	if (!v)
		return;
	p->sport = v->sport;
	p->dport = v->dport;
	p->later = 1;
}

static __always_inline __u16 csum_fold(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)~csum;
}

/* rewrite changes the source (dst_side 0) or destination address and port of the packet
 * (IP header at the standard offset), fixing the IP and transport checksums incrementally. */
static __always_inline int rewrite(struct __sk_buff *skb, struct pkt *p, int dst_side,
				   __be32 addr, __be16 port)
{
	__u32 csum_off = p->l4 + (p->proto == IPPROTO_TCP ? 16 : 6);
	__u64 mangle = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__be32 old_addr = dst_side ? p->dst : p->src;
	__be16 old_port = dst_side ? p->dport : p->sport;
	/* A later fragment carries no transport header: the first fragment's rewrite covers the
	 * whole datagram's checksum and ports; here only the addresses change. */
	int l4 = !p->later;
	if (old_addr != addr) {
		if (l4 && bpf_l4_csum_replace(skb, csum_off, old_addr, addr, BPF_F_PSEUDO_HDR | mangle | 4) < 0)
			return -1;
		if (bpf_l3_csum_replace(skb, IP_OFF + 10, old_addr, addr, 4) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, IP_OFF + (dst_side ? 16 : 12), &addr, 4, 0) < 0)
			return -1;
	}
	if (old_port != port && l4) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, mangle | 2) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, p->l4 + (dst_side ? 2 : 0), &port, 2, 0) < 0)
			return -1;
	}
	if (dst_side) {
		p->dst = addr;
		p->dport = port;
	} else {
		p->src = addr;
		p->sport = port;
	}
	return 0;
}

/* tcp_track keeps the state bits of a REV or TUN entry for a packet of its flow (reply: from
 * the backend). A flow of another protocol (UDP) is only marked replied, which the cleaner
 * reads as the kernel's "stream": answered UDP lives 120 s, not 30. */
static __always_inline void tcp_track(struct ct_val_v4 *v, struct pkt *p, int reply)
{
	if (p->proto != IPPROTO_TCP) {
		if (reply && !(v->tcp & TCP_REPLIED))
			v->tcp |= TCP_REPLIED;
		return;
	}
	__u8 f = p->tcp_flags, t = v->tcp;
	if ((f & TH_SYN) && !(f & TH_ACK) && !reply)
		t |= TCP_SYN;
	if (reply && !(t & TCP_REPLIED))
		t |= TCP_REPLIED | TCP_OPENING;
	else if (!reply && (t & TCP_OPENING) && (f & TH_ACK) && !(f & (TH_SYN | TH_RST)))
		t &= ~TCP_OPENING;
	if (f & TH_FIN)
		t |= reply ? TCP_FIN_REV : TCP_FIN_FWD;
	if (f & TH_RST) {
		t |= TCP_RST;
		t &= ~(TCP_LIVE_FWD | TCP_LIVE_REV);
	} else if (t & TCP_RST) {
		/* Sequence numbers are not tracked, so an RST out of window (or a middlebox's the
		 * peers ignore) sets the bit too; traffic of both directions after it says the
		 * connection lives on, and gives it its established timeout back. */
		t |= reply ? TCP_LIVE_REV : TCP_LIVE_FWD;
		if ((t & (TCP_LIVE_FWD | TCP_LIVE_REV)) == (TCP_LIVE_FWD | TCP_LIVE_REV))
			t &= ~(TCP_RST | TCP_LIVE_FWD | TCP_LIVE_REV);
	}
	if (t != v->tcp)
		v->tcp = t;
}

/* established says whether a flow's state entry (REV or TUN) is past its handshake: TCP
 * answered and acknowledged, another protocol answered. Only such flows are never evicted. */
static __always_inline int established(struct ct_val_v4 *v, __u8 proto)
{
	if (proto != IPPROTO_TCP)
		return v->tcp & TCP_REPLIED;
	return (v->tcp & (TCP_REPLIED | TCP_OPENING)) == TCP_REPLIED;
}

/* closed says whether a new SYN may reuse the tuple of this entry. */
static __always_inline int closed(struct ct_val_v4 *v)
{
	return (v->tcp & TCP_RST) || ((v->tcp & TCP_FIN_FWD) && (v->tcp & TCP_FIN_REV));
}

static __always_inline int is_syn(struct pkt *p)
{
	return p->proto == IPPROTO_TCP && (p->tcp_flags & (TH_SYN | TH_ACK)) == TH_SYN;
}

static __always_inline int is_synack(struct pkt *p)
{
	return p->proto == IPPROTO_TCP && (p->tcp_flags & (TH_SYN | TH_ACK | TH_RST)) == (TH_SYN | TH_ACK);
}

/* ct_drop deletes a reverse or tunnel entry and, for a reverse entry, its forward pair: the
 * state of a flow that a new connection on the same tuple supersedes. */
static __always_inline void ct_forget(struct ct_key_v4 *k, struct ct_val_v4 *v)
{
	if (v->type == CT_REV) {
		struct ct_key_v4 fk = {.src = v->nat_saddr ? v->nat_saddr : k->dst, .dst = v->nat_addr,
				       .sport = v->nat_sport, .dport = v->nat_port, .proto = k->proto};
		bpf_map_delete_elem(&sl_ct_v4, &fk);
	}
	bpf_map_delete_elem(&sl_ct_v4, k);
}

static __always_inline void ct_drop(struct ct_key_v4 *k, struct ct_val_v4 *v)
{
	ct_forget(k, v);
	count(C_CT_SUPERSEDED);
}

/* young records a new flow's state entry in this CPU's ring, evicting the flow whose slot it
 * takes if that one is still not established. */
static __noinline void young(struct ct_key_v4 *k, __u64 created)
{
	__u32 zero = 0;
	__u32 *pos = bpf_map_lookup_elem(&sl_ct_young_pos, &zero);
	if (!pos)
		return;
	__u32 i = *pos;
	struct ct_young_v4 *y = bpf_map_lookup_elem(&sl_ct_young_v4, &i);
	if (!y) {
		/* Past the ring's end (its size is the agent's): round to the start. */
		i = 0;
		y = bpf_map_lookup_elem(&sl_ct_young_v4, &i);
		if (!y)
			return;
	}
	*pos = i + 1;
	if (y->created) {
		struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &y->key);
		if (v && v->created == y->created && (v->type == CT_REV || v->type == CT_TUN) &&
		    !established(v, y->key.proto)) {
			ct_forget(&y->key, v);
			count(C_CT_EVICTED);
		}
	}
	y->key = *k;
	y->created = created;
}

/* stale_reply says whether a packet that matched a reverse or tunnel entry (k, v) in the
 * reply direction belongs to another connection than the entry's flow: a SYN (a new
 * connection opened from the backend's side), or a SYN-ACK while the flow is closed (an
 * answer to a new connection whose SYN came some other way: straight to the backend's own
 * address; a SYN through the service would have renewed the entry). Such state is dropped,
 * and the packet goes on untranslated. */
static __always_inline int stale_reply(struct pkt *p, struct ct_key_v4 *k, struct ct_val_v4 *v)
{
	if (!(is_syn(p) || (is_synack(p) && closed(v))))
		return 0;
	ct_drop(k, v);
	return 1;
}

/* supersede drops the reverse or tunnel state of the tuple a SYN that is addressed to no
 * frontend opens: a client reusing a port towards an endpoint's own address after a flow
 * through a service must never have its answers translated by the old flow's state. */
static __always_inline void supersede(struct pkt *p)
{
	if (!is_syn(p))
		return;
	struct ct_key_v4 rk = {.src = p->dst, .dst = p->src, .sport = p->dport, .dport = p->sport, .proto = p->proto};
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &rk);
	if (v && (v->type == CT_REV || v->type == CT_TUN))
		ct_drop(&rk, v);
}

static __always_inline struct cnet_val *cluster_net(__be32 addr)
{
	struct cnet_key_v4 k = {.prefixlen = 32, .addr = addr};
	return bpf_map_lookup_elem(&sl_cnet_v4, &k);
}

/* swap_macs turns the frame around: replies and rejects go back to the hop that sent it. */
static __always_inline int swap_macs(struct __sk_buff *skb)
{
	__u8 m[12], s[12];
	if (bpf_skb_load_bytes(skb, 0, m, 12) < 0)
		return -1;
	__builtin_memcpy(s, m + 6, 6);
	__builtin_memcpy(s + 6, m, 6);
	return bpf_skb_store_bytes(skb, 0, s, 12, 0);
}


/* icmp_back answers the packet with an ICMP error (type 3: port unreachable or fragmentation
 * needed) from the address it was sent to: back is 0 for a packet that came in (the answer
 * leaves by the same interface) and BPF_F_INGRESS for one leaving by it (the answer goes up to
 * the host's own stack, which sent it). It quotes the IP header and 28 bytes beyond when the
 * packet has them (a whole TCP header: a packet from a local TCP stack still owes its checksum,
 * and the kernel will not cut into it), else the IP header and 20 bytes (TCP) or 8 (UDP, the
 * minimum); with IP options, the longest header (60 bytes) and 8 bytes beyond. A slow path, as
 * the resets, the fragment cutting, ICMP errors and the tunnel's unwrapping are: functions of
 * their own (BPF-to-BPF calls), whose stack is not the programs' (512 bytes in all). */
static __noinline int icmp_back(struct __sk_buff *skb, struct pkt *p, __u8 code, __u16 mtu, __u64 back)
{
	__u32 q = 28;
	if (p->l4 > L4_OFF && skb->len >= ETH_HLEN + 68)
		q = 68;
	else if (skb->len >= ETH_HLEN + 48)
		q = 48;
	else if (p->proto == IPPROTO_TCP)
		q = 40;
	if (bpf_skb_change_tail(skb, ETH_HLEN + q, 0) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_adjust_room(skb, sizeof(struct iphdr) + sizeof(struct icmphdr), BPF_ADJ_ROOM_MAC, 0) < 0)
		return TC_ACT_SHOT;
	struct iphdr ip = {};
	ip.version = 4;
	ip.ihl = 5;
	ip.ttl = 64;
	ip.protocol = IPPROTO_ICMP;
	ip.tot_len = bpf_htons(sizeof(struct iphdr) + sizeof(struct icmphdr) + q);
	ip.saddr = p->dst;
	ip.daddr = p->src;
	ip.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)&ip, sizeof(ip), 0));
	struct icmphdr ic = {};
	ic.type = ICMP_DEST_UNREACH;
	ic.code = code;
	ic.mtu = bpf_htons(mtu);
	__u32 zero = 0;
	struct quote_buf *quote = bpf_map_lookup_elem(&sl_scratch, &zero);
	if (!quote || bpf_skb_load_bytes(skb, ETH_HLEN + 28, quote->b, q) < 0)
		return TC_ACT_SHOT;
	__s64 cs = bpf_csum_diff(0, 0, (__be32 *)quote->b, q, 0);
	cs = bpf_csum_diff(0, 0, (__be32 *)&ic, sizeof(ic), cs);
	ic.checksum = csum_fold(cs);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(ip), &ic, sizeof(ic), 0) < 0 || swap_macs(skb) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, back);
}

/* too_big_back answers an oversized packet with fragmentation-needed, counted when sent. */
static __always_inline int too_big_back(struct __sk_buff *skb, struct pkt *p, __u16 mtu, __u64 back)
{
	int rc = icmp_back(skb, p, ICMP_FRAG_NEEDED, mtu, back);
	if (rc == TC_ACT_REDIRECT)
		count(C_ICMP_TOO_BIG);
	return rc;
}

/* tcp_rst answers a TCP segment with a reset, as a closed port does. */
static __noinline int tcp_rst(struct __sk_buff *skb, struct pkt *p)
{
	struct tcphdr th;
	if (bpf_skb_load_bytes(skb, p->l4, &th, sizeof(th)) < 0)
		return TC_ACT_SHOT;
	__u32 payload = p->tot_len - (p->l4 - IP_OFF) - th.doff * 4;
	__u32 seq = bpf_ntohl(th.seq), ack = 0;
	if (th.syn)
		payload++;
	if (th.fin)
		payload++;
	struct tcphdr rst = {};
	rst.source = p->dport;
	rst.dest = p->sport;
	rst.doff = 5;
	rst.rst = 1;
	if (th.ack) {
		rst.seq = th.ack_seq;
	} else {
		ack = seq + payload;
		rst.ack = 1;
		rst.ack_seq = bpf_htonl(ack);
	}
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(struct iphdr) + sizeof(struct tcphdr), 0) < 0)
		return TC_ACT_SHOT;
	struct iphdr ip = {};
	ip.version = 4;
	ip.ihl = 5;
	ip.ttl = 64;
	ip.protocol = IPPROTO_TCP;
	ip.tot_len = bpf_htons(sizeof(struct iphdr) + sizeof(struct tcphdr));
	ip.saddr = p->dst;
	ip.daddr = p->src;
	ip.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)&ip, sizeof(ip), 0));
	struct {
		__be32 src, dst;
		__u8 zero, proto;
		__be16 len;
	} ph = {.src = p->dst, .dst = p->src, .proto = IPPROTO_TCP, .len = bpf_htons(sizeof(struct tcphdr))};
	__s64 cs = bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), 0);
	cs = bpf_csum_diff(0, 0, (__be32 *)&rst, sizeof(rst), cs);
	rst.check = csum_fold(cs);
	if (bpf_skb_store_bytes(skb, IP_OFF, &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, L4_OFF, &rst, sizeof(rst), 0) < 0 || swap_macs(skb) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

static __always_inline int reject(struct __sk_buff *skb, struct pkt *p, __u32 why)
{
	count(why);
	if (p->proto == IPPROTO_TCP) {
		if (p->tcp_flags & TH_RST)
			return TC_ACT_SHOT;
		return tcp_rst(skb, p);
	}
	return icmp_back(skb, p, ICMP_PORT_UNREACH, 0, 0);
}

/* frag_split cuts a packet too large for the tunnel that may be fragmented (no DF) in two,
 * as a router fragments: the packet becomes the first part, which fits, and the caller goes on
 * with it (-1); a copy marked with the reserved flag goes back into this hook (the same
 * interface, the same direction), where frag_rest makes it the rest of the datagram: a later
 * fragment, translated as the first part was, cut again if it is still too large. Only a
 * 20-byte header is cut (options would have to be sorted into those copied and those not). */
static __noinline int frag_split(struct __sk_buff *skb, struct pkt *p, struct cfg *c, int egress)
{
	__u32 hlen = p->l4 - IP_OFF;
	__u32 cut = (c->tunnel_mtu - sizeof(struct iphdr)) & ~7;
	if (hlen != sizeof(struct iphdr) || cut < 8 || p->tot_len <= hlen + cut) {
		count(C_DROP_TOO_BIG);
		return TC_ACT_SHOT;
	}
	if (!(p->frag & IP_OFFMASK) && (p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP)) {
		/* The rest carries no ports: it finds the first part's, as any later fragment does. */
		struct frag_key_v4 k = {.src = p->src, .dst = p->dst, .id = p->id, .proto = p->proto};
		struct frag_val_v4 v = {.sport = p->sport, .dport = p->dport};
		bpf_map_update_elem(&sl_frag_v4, &k, &v, BPF_ANY);
	}
	__be16 old = bpf_htons(p->frag), marked = bpf_htons(p->frag | IP_RF);
	if (bpf_l3_csum_replace(skb, IP_OFF + 10, old, marked, 2) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 6, &marked, 2, 0) < 0 ||
	    bpf_clone_redirect(skb, skb->ifindex, egress ? 0 : BPF_F_INGRESS) < 0) {
		count(C_DROP_TOO_BIG);
		return TC_ACT_SHOT;
	}
	__u16 frag = (p->frag & ~IP_RF) | IP_MF, tot = hlen + cut;
	__be16 nfrag = bpf_htons(frag), otot = bpf_htons(p->tot_len), ntot = bpf_htons(tot);
	if (bpf_l3_csum_replace(skb, IP_OFF + 10, marked, nfrag, 2) < 0 ||
	    bpf_l3_csum_replace(skb, IP_OFF + 10, otot, ntot, 2) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 6, &nfrag, 2, 0) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 2, &ntot, 2, 0) < 0 ||
	    bpf_skb_change_tail(skb, ETH_HLEN + tot, 0) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	p->frag = frag;
	p->tot_len = tot;
	count(C_FRAG_SPLIT);
	return -1;
}

/* frag_rest makes a copy frag_split marked the rest of its datagram: the bytes the first part
 * carries are taken out and the header says where the rest begins. Returns -1 when the packet
 * is that rest (reparsed into p), a verdict otherwise. */
static __noinline int frag_rest(struct __sk_buff *skb, struct pkt *p, struct cfg *c)
{
	__u32 hlen = p->l4 - IP_OFF;
	__u32 cut = (c->tunnel_mtu - sizeof(struct iphdr)) & ~7;
	if (hlen != sizeof(struct iphdr) || cut < 8 || p->tot_len <= hlen + cut) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	__u16 frag = (((p->frag & IP_OFFMASK) + cut / 8) & IP_OFFMASK) | (p->frag & IP_MF), tot = p->tot_len - cut;
	__be16 ofrag = bpf_htons(p->frag), nfrag = bpf_htons(frag), otot = bpf_htons(p->tot_len), ntot = bpf_htons(tot);
	if (bpf_skb_adjust_room(skb, -(__s32)cut, BPF_ADJ_ROOM_NET, 0) < 0 ||
	    bpf_l3_csum_replace(skb, IP_OFF + 10, ofrag, nfrag, 2) < 0 ||
	    bpf_l3_csum_replace(skb, IP_OFF + 10, otot, ntot, 2) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 6, &nfrag, 2, 0) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 2, &ntot, 2, 0) < 0 || parse(skb, IP_OFF, p) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return -1;
}

/* oversize answers a packet that cannot cross the tunnel whole: one that may be fragmented
 * (no DF) is cut (frag_split), one that may not gets fragmentation-needed back: out of the
 * interface it came in by, or, on an egress hook, up into the host's own stack that sent it.
 * It returns -1 when the packet (or its first part) fits. A segmented packet (GSO: a local
 * stack's, or GRO's merge of received ones) is cut after encapsulation with its segment size
 * kept (BPF_F_ADJ_ROOM_FIXED_GSO), so one segment must fit: judged by gso_size, as the
 * kernel's forwarding judges it (gso_segs is no guide: VM tap devices leave it 0). */
static __always_inline int oversize(struct __sk_buff *skb, struct pkt *p, struct cfg *c, int egress)
{
	if (!c) {
		count(C_DROP_TOO_BIG);
		return TC_ACT_SHOT;
	}
	__u32 len = p->tot_len;
	__u32 gso = skb->gso_size;
	if (gso) {
		__u32 l4 = sizeof(struct udphdr);
		if (p->proto == IPPROTO_TCP) {
			__u8 doff;
			if (bpf_skb_load_bytes(skb, p->l4 + 12, &doff, 1) < 0)
				return TC_ACT_SHOT;
			l4 = (doff >> 4) * 4;
		}
		len = (p->l4 - IP_OFF) + l4 + gso;
	}
	if (len <= c->tunnel_mtu)
		return -1;
	if (!(p->frag & IP_DF)) {
		if (gso) {
			count(C_DROP_TOO_BIG);
			return TC_ACT_SHOT;
		}
		return frag_split(skb, p, c, egress);
	}
	return too_big_back(skb, p, c->tunnel_mtu, egress ? BPF_F_INGRESS : 0);
}

/* fib_out sends the packet, whose IP header is at the standard offset, to its destination
 * through the kernel's FIB: the MACs are filled in and the packet leaves by the route's
 * interface without passing the kernel's forwarding path (no rp_filter on a multi-homed
 * node, no dependence on routes back to the client). */
static __noinline int fib_out(struct __sk_buff *skb, __be32 src, __be32 dst, int fallback_ok)
{
	struct bpf_fib_lookup fib = {};
	fib.family = AF_INET;
	fib.ipv4_src = src;
	fib.ipv4_dst = dst;
	fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		if (bpf_skb_store_bytes(skb, 0, fib.dmac, 6, 0) < 0 || bpf_skb_store_bytes(skb, 6, fib.smac, 6, 0) < 0)
			return TC_ACT_SHOT;
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = {.nh_family = AF_INET, .ipv4_nh = fib.ipv4_dst};
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	if (fallback_ok)
		return TC_ACT_OK;
	/* Each answer of the lookup its own counter: "no route" alone misled operators whose
	 * tunnel MTU the underlay could not carry. */
	switch (rc) {
	case BPF_FIB_LKUP_RET_BLACKHOLE:
		count(C_DROP_FIB_BLACKHOLE);
		break;
	case BPF_FIB_LKUP_RET_PROHIBIT:
		count(C_DROP_FIB_PROHIBIT);
		break;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		count(C_DROP_FIB_FRAG);
		break;
	case BPF_FIB_LKUP_RET_UNREACHABLE:
	case BPF_FIB_LKUP_RET_NOT_FWDED:
		count(C_DROP_FIB);
		break;
	default:
		count(C_DROP_FIB_OTHER);
	}
	return TC_ACT_SHOT;
}

/* encap wraps the packet (IP header at the standard offset) in VXLAN to the node at dst:
 * 0 when done, a verdict (drop) when it cannot be. */
static __noinline int encap(struct __sk_buff *skb, struct pkt *p, struct cfg *c, __be32 dst)
{
	__u32 inner = skb->len - ETH_HLEN;
	/* FIXED_GSO: a segmented packet keeps its segment size (oversize judged it against the
	 * tunnel MTU); without it the kernel shrinks TCP segments and refuses UDP ones (UDP-GSO's
	 * segment size delimits datagrams). */
	__u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN) |
		      BPF_F_ADJ_ROOM_FIXED_GSO;
	/* ENCAP_L2_ETH (the inner protocol is Ethernet) is Linux 5.12's: an older kernel refuses
	 * the flag, and takes the rest; its GSO then segments the inner IP packet behind the
	 * inner Ethernet header all the same (inner_mac_len is set). */
	if (bpf_skb_adjust_room(skb, ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags | BPF_F_ADJ_ROOM_ENCAP_L2_ETH) < 0 &&
	    bpf_skb_adjust_room(skb, ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	struct {
		struct iphdr ip;
		struct udphdr udp;
		__u8 vxlan[8];
		struct ethhdr eth;
	} __attribute__((packed)) h = {};
	h.ip.version = 4;
	h.ip.ihl = 5;
	h.ip.ttl = 64;
	h.ip.protocol = IPPROTO_UDP;
	h.ip.tot_len = bpf_htons(inner + ENCAP_LEN);
	h.ip.saddr = c->host_ip;
	h.ip.daddr = dst;
	h.ip.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)&h, sizeof(h.ip), 0));
	/* The source port spreads flows over ECMP paths and receive queues, as VXLAN does. */
	__u32 hash = p->src ^ p->dst ^ ((__u32)p->sport << 16 | p->dport);
	hash ^= hash >> 16;
	h.udp.source = bpf_htons(0xc000 | (hash & 0x3fff));
	h.udp.dest = c->vxlan_port;
	h.udp.len = bpf_htons(inner + ENCAP_LEN - sizeof(struct iphdr));
	h.vxlan[0] = 0x08;
	h.vxlan[4] = (c->vni >> 16) & 0xff;
	h.vxlan[5] = (c->vni >> 8) & 0xff;
	h.vxlan[6] = c->vni & 0xff;
	h.eth.h_proto = bpf_htons(ETH_P_IP);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return 0;
}

/* encap_out wraps the packet and sends it to the node at dst. The two steps are two calls of
 * the caller's: one after the other, their stack frames are not stacked. */
static __always_inline int encap_out(struct __sk_buff *skb, struct pkt *p, struct cfg *c, __be32 dst)
{
	int rc = encap(skb, p, c, dst);
	if (rc)
		return rc;
	return fib_out(skb, c->host_ip, dst, 0);
}

static __always_inline int ct_put(struct ct_key_v4 *k, struct ct_val_v4 *v, __u64 flags)
{
	long rc = bpf_map_update_elem(&sl_ct_v4, k, v, flags);
	if (rc == -17 /* EEXIST: another CPU took the tuple first */) {
		count(C_DROP_COLLISION);
		return -1;
	}
	if (rc < 0) {
		count(C_DROP_CT_FULL);
		return -1;
	}
	return 0;
}

/* pick chooses a backend of [start, end) for a new flow, keeping client-IP affinity. */
static __always_inline struct be_val_v4 *pick(struct fe_key_v4 *fk, struct fe_val *fe, __u32 start, __u32 end,
					      __be32 client, __u64 now)
{
	struct be_key bk = {.list_id = fe->list_id};
	struct be_val_v4 *be;
	__u32 n = end - start;
	struct aff_key_v4 ak = {.fe_addr = fk->addr, .fe_port = fk->port, .proto = fk->proto, .client = client};
	if (fe->affinity_sec) {
		struct aff_val_v4 *a = bpf_map_lookup_elem(&sl_aff_v4, &ak);
		if (a && now - a->seen < (__u64)fe->affinity_sec * NSEC) {
			if (fe->count <= AFF_SCAN) {
				for (__u32 i = 0; i < AFF_SCAN; i++) {
					if (i >= n)
						break;
					bk.ordinal = start + i;
					be = bpf_map_lookup_elem(&sl_be_v4, &bk);
					if (be && be->addr == a->addr && be->port == a->port) {
						a->seen = now;
						return be;
					}
				}
			} else {
				/* The remembered endpoint, if this frontend's list still holds it
				 * within the set this flow may use. */
				struct be_idx_key_v4 ik = {.list_id = fe->list_id, .addr = a->addr, .port = a->port};
				__u32 *ord = bpf_map_lookup_elem(&sl_be_idx_v4, &ik);
				if (ord && *ord >= start && *ord < end) {
					bk.ordinal = *ord;
					be = bpf_map_lookup_elem(&sl_be_v4, &bk);
					if (be && be->addr == a->addr && be->port == a->port) {
						a->seen = now;
						return be;
					}
				}
			}
		}
	}
	bk.ordinal = start + bpf_get_prandom_u32() % n;
	be = bpf_map_lookup_elem(&sl_be_v4, &bk);
	if (be && fe->affinity_sec) {
		struct aff_val_v4 av = {.seen = now, .addr = be->addr, .port = be->port};
		bpf_map_update_elem(&sl_aff_v4, &ak, &av, BPF_ANY);
	}
	return be;
}

/* lookup_frontend finds the frontend of a packet: the exact address:port, then (for one of
 * this node's own addresses) a node port's wildcard entry. */
static __always_inline struct fe_val *lookup_frontend(struct __sk_buff *skb, struct pkt *p, struct fe_key_v4 *fk)
{
	fk->addr = p->dst;
	fk->port = p->dport;
	fk->proto = p->proto;
	fk->pad = 0;
	struct fe_val *fe = bpf_map_lookup_elem(&sl_fe_v4, fk);
	if (fe)
		return fe;
	struct fe_key_v4 wk = {.addr = 0, .port = p->dport, .proto = p->proto};
	fe = bpf_map_lookup_elem(&sl_fe_v4, &wk);
	if (!fe)
		return 0;
	/* The wildcard serves every address of this node and nothing else. */
	struct cnet_val *cn = cluster_net(p->dst);
	int self = cn && (cn->flags & CNET_SELF);
	if (!self) {
		struct bpf_fib_lookup fib = {};
		fib.family = AF_INET;
		fib.ipv4_src = p->src;
		fib.ipv4_dst = p->dst;
		fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
		self = bpf_fib_lookup(skb, &fib, sizeof(fib), 0) == BPF_FIB_LKUP_RET_NOT_FWDED;
	}
	if (!self)
		return 0;
	*fk = wk;
	return fe;
}

/* Where a new flow came from. */
#define FROM_HOST 0 /* a host interface: outside the cluster unless the source is a node or pool */
#define FROM_WEP 1  /* a workload: inside the cluster */

/* new_flow translates the first packet of a flow to a service: picks a backend, records the
 * flow, rewrites the packet and sends it on. Returns a tc verdict; TC_ACT_OK when the packet
 * is not for a service. */
static __noinline int new_flow(struct __sk_buff *skb, struct pkt *p, struct cfg *c, int from, int retry)
{
	struct fe_key_v4 fk;
	struct fe_val *fe = lookup_frontend(skb, p, &fk);
	if (!fe) {
		struct fe_key_v4 ak = {.addr = p->dst};
		if (bpf_map_lookup_elem(&sl_fe_v4, &ak))
			return reject(skb, p, C_REJECT_PORT);
		supersede(p);
		return TC_ACT_OK;
	}
	/* A node port is one of the node's own ports: a host socket whose ephemeral port falls in
	 * the node-port range gets its answers there. A TCP segment that opens no connection (no
	 * SYN) and belongs to no flow is such an answer, never a client's new flow: it goes to the
	 * host's stack. (UDP cannot be told apart: sluiced reserves the range for the node's own
	 * sockets, ip_local_reserved_ports.) */
	if ((fe->flags & FE_NODE_PORT) && p->proto == IPPROTO_TCP && !is_syn(p))
		return TC_ACT_OK;
	int outside = 0;
	if (from == FROM_HOST) {
		struct cnet_val *cn = cluster_net(p->src);
		outside = !cn;
	}
	if ((fe->flags & FE_SRC_RANGES) && outside) {
		struct src_key_v4 sk = {.prefixlen = 96, .fe_addr = fk.addr, .fe_port = fk.port, .proto = fk.proto, .src = p->src};
		if (!bpf_map_lookup_elem(&sl_src_v4, &sk)) {
			count(C_DROP_SRC_RANGE);
			return TC_ACT_SHOT;
		}
	}
	__u32 start = fe->cluster_start, end = fe->count;
	int local_only = outside ? (fe->flags & FE_EXT_LOCAL) : (fe->flags & FE_INT_LOCAL);
	if (local_only) {
		start = 0;
		end = fe->local;
	}
	if (end > fe->count)
		end = fe->count;
	if (start >= end) {
		if (local_only) {
			count(C_DROP_NO_LOCAL);
			return TC_ACT_SHOT;
		}
		return reject(skb, p, C_REJECT_NO_BACKEND);
	}
	__u64 now = bpf_ktime_get_ns();
	struct be_val_v4 *bep = pick(&fk, fe, start, end, p->src, now);
	if (!bep)
		return reject(skb, p, C_REJECT_NO_BACKEND);
	struct be_val_v4 be = *bep;
	/* A routed backend (on no node) is reached as a local one is: DNAT only, never the
	 * tunnel; its replies come back by a host interface and meet the REV entry there. */
	int remote = !(be.flags & (BE_LOCAL | BE_ROUTED));
	/* Hairpin: a workload whose flow lands on itself would answer itself inside its own
	 * namespace, from its own address, and the client (itself) would reset the connection.
	 * As Cilium does, such a flow also gets the source HAIRPIN_ADDR: the answer leaves the
	 * workload by its default route and comes back here, to the REV entry. The workload
	 * sees the hairpin address as its client (Cilium #26100). Only for a workload's flow to
	 * a backend here: the address must never leave the node (Cilium #10841). */
	int hairpin = !remote && from == FROM_WEP && be.addr == p->src;
	__be32 saddr = hairpin ? bpf_htonl(HAIRPIN_ADDR) : p->src;
	if (remote && !c)
		return TC_ACT_SHOT;
	if (remote) {
		int rc = oversize(skb, p, c, 0);
		if (rc >= 0)
			return rc;
	}
	__be16 sport = p->sport;
	struct ct_key_v4 rk = {.src = be.addr, .dst = saddr, .sport = be.port, .proto = p->proto};
	rk.dport = sport;
	/* The client's own port is kept when nothing here uses the backend-side tuple, as the
	 * kernel's NAT keeps it: the endpoint then sees the ports the client's own stack manages
	 * (a port of ours reused while the endpoint still holds the last connection in
	 * TIME_WAIT would be refused by PAWS). A flow of the same client ip:port to another
	 * frontend of the same backend (Cilium #11810) gets a port of its own from the range, and
	 * so does a SYN sent again for a forwarded flow that got no answer: two clients behind
	 * one load balancer reusing a source port towards two nodes meet on the endpoint's node,
	 * which drops the second (counted), and its retry comes with another port. */
	if (bpf_map_lookup_elem(&sl_ct_v4, &rk) || (remote && retry)) {
		if (c && c->psnat_max > c->psnat_min) {
			__u32 span = c->psnat_max - c->psnat_min + 1;
			for (int i = 0; i < 8; i++) {
				sport = bpf_htons(c->psnat_min + bpf_get_prandom_u32() % span);
				rk.dport = sport;
				if (!bpf_map_lookup_elem(&sl_ct_v4, &rk))
					break;
			}
		}
		if (bpf_map_lookup_elem(&sl_ct_v4, &rk)) {
			/* No free port: drop (the client retries) rather than take a live flow's entry. */
			count(C_DROP_COLLISION);
			return TC_ACT_SHOT;
		}
	}
	/* One entry on the stack, written as the reverse entry and then as the forward one. */
	__u8 flags = 0;
	if (remote)
		flags |= CT_F_REMOTE;
	if (sport != p->sport)
		flags |= CT_F_PSNAT;
	if (be.flags & BE_LOCAL)
		flags |= CT_F_LOCAL;
	struct ct_val_v4 rev = {.created = now, .last_seen = now, .type = CT_REV, .flags = flags, .nat_addr = p->dst,
				.nat_port = p->dport, .nat_sport = p->sport};
	if (hairpin)
		rev.nat_saddr = p->src;
	if (remote)
		rev.tun_addr = be.node_addr;
	if (from == FROM_HOST) {
		__u8 m[12];
		if (bpf_skb_load_bytes(skb, 0, m, 12) < 0)
			return TC_ACT_SHOT;
		__builtin_memcpy(rev.mac_local, m, 6);
		__builtin_memcpy(rev.mac_peer, m + 6, 6);
		/* On the ingress hook both name the same interface; a test run before 5.15 cannot set
		 * ingress_ifindex, so fall back as the FIB lookups do. */
		rev.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
		rev.flags |= CT_F_REDIRECT;
	}
	tcp_track(&rev, p, 0);
	if (ct_put(&rk, &rev, BPF_NOEXIST) < 0)
		return TC_ACT_SHOT;
	struct ct_val_v4 *fwd = &rev;
	__builtin_memset(fwd, 0, sizeof(*fwd));
	fwd->created = now;
	fwd->last_seen = now;
	fwd->type = CT_FWD;
	fwd->flags = flags;
	fwd->nat_addr = be.addr;
	fwd->nat_port = be.port;
	fwd->nat_sport = sport;
	if (hairpin)
		fwd->nat_saddr = saddr;
	if (remote)
		fwd->tun_addr = be.node_addr;
	struct ct_key_v4 *fk2 = &rk; /* the reverse key is in the map: its stack slot is reused */
	fk2->src = p->src;
	fk2->dst = p->dst;
	fk2->sport = p->sport;
	fk2->dport = p->dport;
	struct ct_key_v4 yk = {.src = be.addr, .dst = saddr, .sport = be.port, .dport = sport, .proto = p->proto};
	if (ct_put(fk2, fwd, BPF_ANY) < 0) {
		bpf_map_delete_elem(&sl_ct_v4, &yk);
		return TC_ACT_SHOT;
	}
	young(&yk, now);
	count(C_NAT_NEW);
	if (rewrite(skb, p, 1, be.addr, be.port) < 0 || rewrite(skb, p, 0, saddr, sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (remote) {
		count(C_NAT_FWD_REMOTE);
		return encap_out(skb, p, c, be.node_addr);
	}
	/* A hairpin packet goes straight back to the workload's interface: to the kernel's
	 * forwarding it is a link-local source coming in from a workload, which a strict
	 * rp_filter drops. A workload's flow to a workload here goes the same way: its replies
	 * are sent around the kernel's forwarding path (reply), so the requests must be too, or
	 * conntrack, seeing one direction only, calls the client's ACKs INVALID and firewalls that
	 * drop those (kube-proxy's KUBE-FORWARD) break the flow. A routed endpoint's flow (on no
	 * node) keeps the kernel's path: outgoing NAT may have to masquerade it. */
	if (from == FROM_HOST || hairpin || (be.flags & BE_LOCAL))
		return fib_out(skb, p->src, p->dst, 1);
	return TC_ACT_OK;
}

/* forward handles a packet of a known flow in the client's direction. */
static __always_inline int forward(struct __sk_buff *skb, struct pkt *p, struct cfg *c, struct ct_val_v4 *f, int from)
{
	/* The entry is read in place: a copy would cost the programs' stack 64 bytes. */
	struct ct_val_v4 *fwd = f;
	__be32 saddr = fwd->nat_saddr ? fwd->nat_saddr : p->src;
	struct ct_key_v4 rk = {.src = fwd->nat_addr, .dst = saddr, .sport = fwd->nat_port, .dport = fwd->nat_sport, .proto = p->proto};
	struct ct_val_v4 *rev = bpf_map_lookup_elem(&sl_ct_v4, &rk);
	__u64 now = bpf_ktime_get_ns();
	if (rev) {
		rev->last_seen = now;
		tcp_track(rev, p, 0);
	}
	int remote = fwd->flags & CT_F_REMOTE;
	if (remote) {
		int rc = oversize(skb, p, c, 0);
		if (rc >= 0)
			return rc;
	}
	if (rewrite(skb, p, 1, fwd->nat_addr, fwd->nat_port) < 0 || rewrite(skb, p, 0, saddr, fwd->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (remote)
		return encap_out(skb, p, c, fwd->tun_addr);
	if (from == FROM_HOST || fwd->nat_saddr || (fwd->flags & CT_F_LOCAL))
		return fib_out(skb, p->src, p->dst, 1);
	return TC_ACT_OK;
}

/* redirect_back sends a packet of a flow that came in from outside back the way its request
 * came: out of that interface, to the hop it came from. */
static __always_inline int redirect_back(struct __sk_buff *skb, const struct ct_val_v4 *rev)
{
	__u8 m[12];
	__builtin_memcpy(m, rev->mac_peer, 6);
	__builtin_memcpy(m + 6, rev->mac_local, 6);
	if (bpf_skb_store_bytes(skb, 0, m, 12, 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(rev->ifindex, 0);
}

/* reply undoes the translation of a reply from a backend and sends it back the way the
 * request came: out of the interface it arrived on, to the hop it came from. Other replies
 * (the client is a workload) are sent straight to the client through the FIB when route is
 * set: a reply whose source became one of this node's own addresses (a node port) would be
 * dropped by the kernel's input path as a martian. */
static __always_inline int reply(struct __sk_buff *skb, struct pkt *p, struct ct_val_v4 *r, int route)
{
	r->last_seen = bpf_ktime_get_ns();
	tcp_track(r, p, 1);
	struct ct_val_v4 *rev = r;
	/* A hairpin reply is addressed to HAIRPIN_ADDR: it goes to the client's own address. */
	__be32 client = rev->nat_saddr ? rev->nat_saddr : p->dst;
	if (rewrite(skb, p, 0, rev->nat_addr, rev->nat_port) < 0 || rewrite(skb, p, 1, client, rev->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	count(C_REV_NAT);
	if (rev->flags & CT_F_REDIRECT) {
		return redirect_back(skb, rev);
	}
	if (route)
		return fib_out(skb, p->src, p->dst, 1);
	return TC_ACT_OK;
}

/* csum_replace4 updates a 16-bit one's complement checksum for a 32-bit field changed from
 * from to to (both as stored in the packet). */
static __always_inline __u16 csum_replace4(__u16 check, __u32 from, __u32 to)
{
	__u32 sum = (__u16)~check;
	sum += (__u16)~from + (__u16)(~from >> 16);
	sum += (__u16)to + (__u16)(to >> 16);
	return csum_fold(sum);
}

static __always_inline __u16 csum_replace2(__u16 check, __u16 from, __u16 to)
{
	__u32 sum = (__u16)~check;
	sum += (__u16)~from;
	sum += to;
	return csum_fold(sum);
}

/* An ICMP error's quoted packet starts after the outer IP header and the 8-byte ICMP header;
 * q->l4 is the offset of its transport header. */
#define Q_IP(outer) ((outer)->l4 + 8)

/* quoted reads the packet an ICMP error quotes: 0 when it is an IPv4 TCP or UDP packet
 * whose ports are there (after its options, if any). Only the ports are read: a quote may end 8 bytes into
 * the transport header (RFC 792; routers still send such), which is enough for Linux to
 * match an error to a TCP socket too. */
static __always_inline int quoted(struct __sk_buff *skb, struct pkt *outer, struct pkt *q)
{
	if (outer->proto != IPPROTO_ICMP || (outer->frag & IP_OFFMASK))
		return -1;
	__u8 type;
	if (bpf_skb_load_bytes(skb, outer->l4, &type, 1) < 0)
		return -1;
	if (type != ICMP_DEST_UNREACH && type != 11 /* time exceeded */ && type != 12 /* parameter problem */)
		return -1;
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, Q_IP(outer), &ip, sizeof(ip)) < 0)
		return -1;
	if (ip.version != 4 || ip.ihl < 5)
		return -1;
	q->l4 = Q_IP(outer) + ip.ihl * 4;
	q->src = ip.saddr;
	q->dst = ip.daddr;
	q->proto = ip.protocol;
	q->frag = bpf_ntohs(ip.frag_off);
	if (!is_l4(q))
		return -1;
	__be16 ports[2];
	if (bpf_skb_load_bytes(skb, q->l4, ports, sizeof(ports)) < 0)
		return -1;
	q->sport = ports[0];
	q->dport = ports[1];
	return 0;
}

/* icmp_rewrite changes the quoted packet's source (quoted_dst 0) or destination address and
 * port, and the outer destination or source address when outer_addr differs, keeping the
 * quoted IP checksum and the ICMP checksum right. */
static __always_inline int icmp_rewrite(struct __sk_buff *skb, struct pkt *outer, struct pkt *q, int quoted_dst,
					__be32 addr, __be16 port, int outer_dst, __be32 outer_addr)
{
	__be32 old_addr = quoted_dst ? q->dst : q->src;
	__be16 old_port = quoted_dst ? q->dport : q->sport;
	__u16 qcheck, icheck;
	__u32 qip = Q_IP(outer);
	if (bpf_skb_load_bytes(skb, qip + 10, &qcheck, 2) < 0 || bpf_skb_load_bytes(skb, outer->l4 + 2, &icheck, 2) < 0)
		return -1;
	if (old_addr != addr) {
		__u16 nq = csum_replace4(qcheck, old_addr, addr);
		icheck = csum_replace4(icheck, old_addr, addr);
		icheck = csum_replace2(icheck, qcheck, nq);
		qcheck = nq;
		if (bpf_skb_store_bytes(skb, qip + (quoted_dst ? 16 : 12), &addr, 4, 0) < 0 ||
		    bpf_skb_store_bytes(skb, qip + 10, &qcheck, 2, 0) < 0)
			return -1;
	}
	if (old_port != port) {
		icheck = csum_replace2(icheck, old_port, port);
		if (bpf_skb_store_bytes(skb, q->l4 + (quoted_dst ? 2 : 0), &port, 2, 0) < 0)
			return -1;
	}
	if (bpf_skb_store_bytes(skb, outer->l4 + 2, &icheck, 2, 0) < 0)
		return -1;
	__be32 old_outer = outer_dst ? outer->dst : outer->src;
	if (old_outer != outer_addr) {
		if (bpf_l3_csum_replace(skb, IP_OFF + 10, old_outer, outer_addr, 4) < 0 ||
		    bpf_skb_store_bytes(skb, IP_OFF + (outer_dst ? 16 : 12), &outer_addr, 4, 0) < 0)
			return -1;
		if (outer_dst)
			outer->dst = outer_addr;
		else
			outer->src = outer_addr;
	}
	return 0;
}

/* icmp_error translates an ICMP error about a translated flow, as the kernel's NAT does:
 * an error about a packet a client sent to a backend (a backend's port unreachable, a
 * router's fragmentation-needed on the way) goes to the client as if about the packet it sent
 * to the frontend; an error about a reply (sent by a client or a router on its side) goes to
 * the backend as if about the reply it sent. tun_src is the node that tunnelled the error
 * here (0: it did not come through the tunnel): only the node a flow was forwarded to, or
 * from, may send errors about it. Returns -1 when it is not such an error. */
static __noinline int icmp_error(struct __sk_buff *skb, struct pkt *outer, struct cfg *c, int route,
				      __be32 tun_src)
{
	struct pkt q = {};
	if (quoted(skb, outer, &q) < 0)
		return -1;
	/* The quoted tuple turned round is the flow's reverse entry for an error about a client's
	 * packet after DNAT, its forward entry for one about a reply from the frontend, and its
	 * tunnel entry for a backend's error about a flow forwarded to this node. */
	struct ct_key_v4 k = {.src = q.dst, .dst = q.src, .sport = q.dport, .dport = q.sport, .proto = q.proto};
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &k);
	if (tun_src && !(v && v->type == CT_REV)) {
		/* On the backend's node: the ingress node translated an error about a reply; the
		 * quoted tuple as it is (backend to client) names the flow's tunnel entry. */
		struct ct_key_v4 tk = {.src = q.src, .dst = q.dst, .sport = q.sport, .dport = q.dport, .proto = q.proto};
		struct ct_val_v4 *t = bpf_map_lookup_elem(&sl_ct_v4, &tk);
		if (!t || t->type != CT_TUN)
			return -1;
		if (t->nat_addr != tun_src) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		return fib_out(skb, outer->src, outer->dst, 1);
	}
	if (v && v->type == CT_REV) {
		struct ct_val_v4 *rev = v;
		if (tun_src && (!(rev->flags & CT_F_REMOTE) || rev->tun_addr != tun_src)) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		/* The backend itself answering speaks for the frontend; a router keeps its address.
		 * An error about a hairpin packet goes to the client's own address. */
		__be32 src = outer->src == q.dst ? rev->nat_addr : outer->src;
		__be32 client = rev->nat_saddr ? rev->nat_saddr : q.src;
		if (icmp_rewrite(skb, outer, &q, 1, rev->nat_addr, rev->nat_port, 0, src) < 0 ||
		    icmp_rewrite(skb, outer, &q, 0, client, rev->nat_sport, 1, rev->nat_saddr ? client : outer->dst) < 0) {
			count(C_DROP_MALFORMED);
			return TC_ACT_SHOT;
		}
		count(C_REV_NAT);
		if (rev->flags & CT_F_REDIRECT) {
			return redirect_back(skb, rev);
		}
		if (route)
			return fib_out(skb, outer->src, outer->dst, 1);
		return TC_ACT_OK;
	}
	if (v && v->type == CT_TUN && c) {
		/* On the backend's node: back through the tunnel, translated by the ingress node. */
		return encap_out(skb, outer, c, v->nat_addr);
	}
	if (v && v->type == CT_FWD) {
		struct ct_val_v4 *fwd = v;
		/* About a reply to a hairpin flow: from the client as the backend knows it. */
		__be32 saddr = fwd->nat_saddr ? fwd->nat_saddr : q.dst;
		if (icmp_rewrite(skb, outer, &q, 0, fwd->nat_addr, fwd->nat_port, 1, fwd->nat_addr) < 0 ||
		    icmp_rewrite(skb, outer, &q, 1, saddr, fwd->nat_sport, 0, fwd->nat_saddr ? saddr : outer->src) < 0) {
			count(C_DROP_MALFORMED);
			return TC_ACT_SHOT;
		}
		if ((fwd->flags & CT_F_REMOTE) && c)
			return encap_out(skb, outer, c, fwd->tun_addr);
		if (route)
			return fib_out(skb, outer->src, outer->dst, 1);
		return TC_ACT_OK;
	}
	return -1;
}

#define TUN_ICMP (-2) /* tunnel_in unwrapped an ICMP error: the caller translates it */

/* tunnel_in takes a VXLAN packet arriving on a host interface: any from an address that is
 * no known node is dropped; node-port forwarding (our VNI) is unwrapped here, the rest is
 * left to the kernel's VXLAN device. An unwrapped ICMP error is left in in (which may be outer
 * itself, not read after that) for the caller, whose stack frame is not under this one's. */
static __noinline int tunnel_in(struct __sk_buff *skb, struct pkt *outer, struct cfg *c, struct pkt *in)
{
	struct cnet_val *peer = cluster_net(outer->src);
	if (!peer || !(peer->flags & CNET_HOST)) {
		count(C_DROP_FORGED_TUNNEL);
		return TC_ACT_SHOT;
	}
	__u8 vx[8];
	if (bpf_skb_load_bytes(skb, outer->l4 + sizeof(struct udphdr), vx, sizeof(vx)) < 0)
		return TC_ACT_OK;
	__u32 vni = ((__u32)vx[4] << 16) | ((__u32)vx[5] << 8) | vx[6];
	if (vni != c->vni)
		return TC_ACT_OK;
	if (outer->l4 != L4_OFF) {
		/* Nodes send the tunnel's outer header without options; the unwrapping below
		 * takes off exactly ENCAP_LEN bytes. */
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	struct pkt p = {};
	int bad = parse(skb, ETH_HLEN + ENCAP_LEN, &p) < 0;
	if (!bad)
		frag_track(&p);
	if (bad || !(is_l4(&p) || p.proto == IPPROTO_ICMP)) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	/* FIXED_GSO: a segmented packet (the sender's GSO carried through, or the kernel's GRO
	 * merging tunnel packets) keeps its segment size, the inner one; without it the kernel
	 * adds the tunnel's 50 bytes to a TCP aggregate's and refuses a UDP one's. DECAP_L4_UDP
	 * (with DECAP_L3_IPV4) also drops the aggregate's tunnel GSO state, where the kernel has
	 * it (Linux 7.0); an older one refuses the flags, and the aggregate keeps that state: see
	 * ARCHITECTURE.md (bpf, segmented packets) for what that means. */
	if (bpf_skb_adjust_room(skb, -(__s32)ENCAP_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | ADJ_ROOM_DECAP_L3_IPV4 | ADJ_ROOM_DECAP_L4_UDP) < 0 &&
	    bpf_skb_adjust_room(skb, -(__s32)ENCAP_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	count(C_TUN_IN);
	p.l4 -= ENCAP_LEN;
	if (p.proto == IPPROTO_ICMP) {
		*in = p;
		return TUN_ICMP;
	}
	__u64 now = bpf_ktime_get_ns();
	struct ct_key_v4 k = {.src = p.src, .dst = p.dst, .sport = p.sport, .dport = p.dport, .proto = p.proto};
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &k);
	if (v && v->type == CT_REV && (v->flags & CT_F_REMOTE)) {
		/* A reply to a flow this node forwarded: it must come from the backend's node. */
		if (v->tun_addr != outer->src) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		return reply(skb, &p, v, 1);
	}
	/* A flow forwarded to a backend here: remember the ingress node for the replies. */
	struct ct_key_v4 tk = {.src = p.dst, .dst = p.src, .sport = p.dport, .dport = p.sport, .proto = p.proto};
	struct ct_val_v4 *t = bpf_map_lookup_elem(&sl_ct_v4, &tk);
	if (t && t->type == CT_TUN && t->nat_addr == outer->src) {
		/* The ingress node sends a SYN on a closed flow's tuple only for a new connection,
		 * which it starts afresh: so does this node, or the new flow would inherit the closed
		 * one's timeout. */
		if (is_syn(&p) && closed(t)) {
			t->created = now;
			t->tcp = 0;
			young(&tk, now);
		}
		t->last_seen = now;
		tcp_track(t, &p, 0);
	} else if (t && !(t->type == CT_TUN && (closed(t) || (is_syn(&p) && !(t->tcp & TCP_REPLIED))))) {
		/* The same tuple is live from another node (or is a local flow): never merge two. A
		 * SYN takes the tuple over only from a flow that is closed or was never answered (its
		 * ingress node has given it up); one that was answered stays, and the newcomer's
		 * ingress node picks another source port when its client sends the SYN again. */
		count(C_DROP_COLLISION);
		return TC_ACT_SHOT;
	} else {
		struct ct_val_v4 nv = {.created = now, .last_seen = now, .type = CT_TUN, .nat_addr = outer->src};
		tcp_track(&nv, &p, 0);
		if (ct_put(&tk, &nv, BPF_ANY) < 0)
			return TC_ACT_SHOT;
		young(&tk, now);
	}
	return fib_out(skb, p.src, p.dst, 1);
}

/* client_flow handles a packet in the client's direction: a known flow goes on as it
 * began; a SYN on a closed or unanswered flow starts afresh (a new backend; for an unanswered
 * one, a new source port); anything else is a new flow, or not a service's. */
static __always_inline int client_flow(struct __sk_buff *skb, struct pkt *p, struct cfg *c, struct ct_key_v4 *k,
				       struct ct_val_v4 *v, int from)
{
	int retry = 0;
	if (p->later && !(v && v->type == CT_FWD))
		return TC_ACT_OK; /* a later fragment never starts a flow */
	if (v && v->type == CT_FWD) {
		if (!is_syn(p))
			return forward(skb, p, c, v, from);
		__be32 saddr = v->nat_saddr ? v->nat_saddr : p->src;
		struct ct_key_v4 rk = {.src = v->nat_addr, .dst = saddr, .sport = v->nat_port, .dport = v->nat_sport, .proto = p->proto};
		struct ct_val_v4 *r = bpf_map_lookup_elem(&sl_ct_v4, &rk);
		if (r && !closed(r) && (r->tcp & TCP_REPLIED))
			return forward(skb, p, c, v, from);
		retry = r && !closed(r);
		bpf_map_delete_elem(&sl_ct_v4, &rk);
		bpf_map_delete_elem(&sl_ct_v4, k);
	}
	return new_flow(skb, p, c, from, retry);
}

SEC("tc")
int sl_from_host(struct __sk_buff *skb)
{
	/* A tagged packet on a VLAN's parent: the VLAN device's own hook takes it next (the
	 * kernel untags before this hook, so it reads as IPv4 here). Replies recorded on the
	 * parent would leave untagged. */
	if (skb->protocol != bpf_htons(ETH_P_IP) || skb->vlan_present)
		return TC_ACT_OK;
	struct pkt p = {};
	if (parse(skb, IP_OFF, &p) < 0)
		return TC_ACT_OK;
	/* The settings are one array entry, always there; older verifiers (6.1) cannot tell, so
	 * every program checks the lookup once, before anything reads it. */
	struct cfg *c = config();
	if (!c)
		return TC_ACT_OK;
	if (p.proto == IPPROTO_ICMP) {
		int rc = icmp_error(skb, &p, c, 1, 0);
		return rc < 0 ? TC_ACT_OK : rc;
	}
	if (p.frag & IP_RF) {
		int rc = frag_rest(skb, &p, c);
		if (rc >= 0)
			return rc;
	}
	frag_track(&p);
	if (!is_l4(&p))
		return TC_ACT_OK;
	if (p.proto == IPPROTO_UDP && p.dport == c->vxlan_port) {
		/* The tunnel's outer header is never cut by sluice; a fragment of it (an underlay
		 * router fragmented it) cannot be unwrapped piecewise: the kernel's reassembly gets it. */
		if (p.frag & (IP_MF | IP_OFFMASK))
			return TC_ACT_OK;
		/* The unwrapped ICMP error comes back in p (the outer header is not needed after). */
		__be32 tun_src = p.src;
		int rc = tunnel_in(skb, &p, c, &p);
		if (rc != TUN_ICMP)
			return rc;
		/* Only errors about flows between this node and the sender travel the tunnel: the
		 * backend's about a flow forwarded there, the ingress node's about a reply. */
		rc = icmp_error(skb, &p, c, 1, tun_src);
		if (rc < 0) {
			count(C_DROP_MALFORMED);
			return TC_ACT_SHOT;
		}
		return rc;
	}
	struct ct_key_v4 k = {.src = p.src, .dst = p.dst, .sport = p.sport, .dport = p.dport, .proto = p.proto};
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &k);
	if (v && v->type == CT_REV) {
		if (!stale_reply(&p, &k, v))
			return reply(skb, &p, v, 1);
		v = 0;
	}
	return client_flow(skb, &p, c, &k, v, FROM_HOST);
}

SEC("tc")
int sl_from_wep(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	struct pkt p = {};
	if (parse(skb, IP_OFF, &p) < 0)
		return TC_ACT_OK;
	struct cfg *c = config();
	if (!c)
		return TC_ACT_OK;
	if (p.proto == IPPROTO_ICMP) {
		int rc = icmp_error(skb, &p, c, 1, 0);
		return rc < 0 ? TC_ACT_OK : rc;
	}
	if (p.frag & IP_RF) {
		int rc = frag_rest(skb, &p, c);
		if (rc >= 0)
			return rc;
	}
	frag_track(&p);
	if (!is_l4(&p))
		return TC_ACT_OK;
	struct ct_key_v4 k = {.src = p.src, .dst = p.dst, .sport = p.sport, .dport = p.dport, .proto = p.proto};
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &k);
	if (v && (v->type == CT_REV || v->type == CT_TUN) && stale_reply(&p, &k, v))
		v = 0;
	if (v) {
		if (v->type == CT_REV)
			return reply(skb, &p, v, 1);
		if (v->type == CT_TUN) {
			v->last_seen = bpf_ktime_get_ns();
			tcp_track(v, &p, 1);
			__be32 peer = v->nat_addr;
			int rc = oversize(skb, &p, c, 0);
			if (rc >= 0)
				return rc;
			return encap_out(skb, &p, c, peer);
		}
	}
	return client_flow(skb, &p, c, &k, v, FROM_WEP);
}

/* leaving undoes the translation of replies as they leave by an interface (egress).
 *
 * On a workload interface (sl_to_wep): replies to a workload client whose backend is
 * elsewhere, or in the host's own namespace; those reach the node by routing, through any
 * interface, and only here meet the client's side.
 *
 * On a host interface (sl_to_host): replies of a backend in the host's own namespace (a
 * host-networked endpoint, at one of the node's addresses), which answers from the host stack
 * that no ingress hook of ours sees. A reply to a client that came in by a host interface
 * leaves by that interface to the hop it came from; a reply to a flow forwarded here through
 * the tunnel goes back through it to the ingress node. Workload backends' replies were
 * translated at sl_from_wep already, and match nothing here. */
static __always_inline int leaving(struct __sk_buff *skb, int host)
{
	/* Tagged by a VLAN device on its way out of the parent: that device's hook saw it. */
	if (skb->protocol != bpf_htons(ETH_P_IP) || skb->vlan_present)
		return TC_ACT_OK;
	struct pkt p = {};
	if (parse(skb, IP_OFF, &p) < 0)
		return TC_ACT_OK;
	struct cfg *c = config();
	if (!c)
		return TC_ACT_OK;
	if (p.proto == IPPROTO_ICMP) {
		int rc = icmp_error(skb, &p, c, 0, 0);
		return rc < 0 ? TC_ACT_OK : rc;
	}
	if (p.frag & IP_RF) {
		int rc = frag_rest(skb, &p, c);
		if (rc >= 0)
			return rc;
	}
	frag_track(&p);
	if (!is_l4(&p))
		return TC_ACT_OK;
	struct ct_key_v4 k = {.src = p.src, .dst = p.dst, .sport = p.sport, .dport = p.dport, .proto = p.proto};
	if (!host && is_syn(&p)) {
		/* A SYN on its way to a workload after the translation (or straight to its address)
		 * on the tuple of a closed flow: a new connection, which the closed flow's state must
		 * not answer for. A SYN through the service renewed that state before it got here. */
		struct ct_key_v4 rk = {.src = p.dst, .dst = p.src, .sport = p.dport, .dport = p.sport, .proto = p.proto};
		struct ct_val_v4 *r = bpf_map_lookup_elem(&sl_ct_v4, &rk);
		if (r && (r->type == CT_REV || r->type == CT_TUN) && closed(r))
			ct_drop(&rk, r);
		return TC_ACT_OK;
	}
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &k);
	if (!v)
		return TC_ACT_OK;
	if ((v->type == CT_REV || v->type == CT_TUN) && stale_reply(&p, &k, v))
		return TC_ACT_OK;
	if (v->type == CT_REV && !host)
		return (v->flags & CT_F_REDIRECT) ? TC_ACT_OK : reply(skb, &p, v, 0);
	if (v->type == CT_REV) {
		/* Already on the way out of the interface the request came in by: the MACs are
		 * set and the packet goes on, rather than being queued to this device again. */
		if ((v->flags & CT_F_REDIRECT) && v->ifindex == skb->ifindex) {
			int rc = reply(skb, &p, v, 0);
			return rc == TC_ACT_REDIRECT ? TC_ACT_OK : rc;
		}
		return reply(skb, &p, v, 0);
	}
	if (v->type == CT_TUN && host) {
		v->last_seen = bpf_ktime_get_ns();
		tcp_track(v, &p, 1);
		__be32 peer = v->nat_addr;
		int rc = oversize(skb, &p, c, 1);
		if (rc >= 0)
			return rc;
		return encap_out(skb, &p, c, peer);
	}
	return TC_ACT_OK;
}

SEC("tc")
int sl_to_wep(struct __sk_buff *skb)
{
	return leaving(skb, 0);
}

SEC("tc")
int sl_to_host(struct __sk_buff *skb)
{
	return leaving(skb, 1);
}

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_key_v4);
	__type(value, struct sock_val_v4);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_sock_v4 SEC(".maps");

/* sock_nat points a host socket at a backend of the frontend it asks for: the node's own
 * connections to cluster IPs, external and load-balancer addresses and its node ports never
 * need per-packet translation (Cilium's socket load balancing). Only sockets of this agent's
 * network namespace are touched. Returns 0 to refuse (no endpoint, unknown port of a cluster
 * IP), 1 to let the call go on. */
static __always_inline int sock_nat(struct bpf_sock_addr *ctx, int remember)
{
	struct cfg *c = config();
	if (!c || !c->netns_cookie || bpf_get_netns_cookie(ctx) != c->netns_cookie)
		return 1;
	__u8 proto = ctx->protocol;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	struct fe_key_v4 fk = {.addr = ctx->user_ip4, .port = (__u16)ctx->user_port, .proto = proto};
	struct fe_val *fe = bpf_map_lookup_elem(&sl_fe_v4, &fk);
	if (!fe) {
		struct fe_key_v4 ak = {.addr = ctx->user_ip4};
		if (bpf_map_lookup_elem(&sl_fe_v4, &ak)) {
			count(C_REJECT_SOCK);
			return 0;
		}
		return 1;
	}
	if (fe->flags & FE_ADDR_ONLY)
		return 1;
	__u32 start = fe->cluster_start, end = fe->count;
	if (fe->flags & FE_INT_LOCAL) {
		start = 0;
		end = fe->local;
	}
	if (end > fe->count)
		end = fe->count;
	if (start >= end) {
		count(C_REJECT_SOCK);
		return 0;
	}
	struct be_val_v4 *be = pick(&fk, fe, start, end, 0, bpf_ktime_get_ns());
	if (!be) {
		count(C_REJECT_SOCK);
		return 0;
	}
	if (remember) {
		struct sock_key_v4 sk = {.cookie = bpf_get_socket_cookie(ctx), .addr = be->addr, .port = be->port};
		struct sock_val_v4 sv = {.fe_addr = fk.addr, .fe_port = fk.port};
		bpf_map_update_elem(&sl_sock_v4, &sk, &sv, BPF_ANY);
	}
	ctx->user_ip4 = be->addr;
	ctx->user_port = be->port;
	count(C_SOCK_NAT);
	return 1;
}

SEC("cgroup/connect4")
int sl_sock_connect4(struct bpf_sock_addr *ctx)
{
	return sock_nat(ctx, ctx->protocol == IPPROTO_UDP);
}

SEC("cgroup/sendmsg4")
int sl_sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock_nat(ctx, 1);
}

/* sl_sock_recvmsg4 shows a datagram from a backend as coming from the frontend the socket
 * sent to. */
SEC("cgroup/recvmsg4")
int sl_sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	struct cfg *c = config();
	if (!c || !c->netns_cookie || bpf_get_netns_cookie(ctx) != c->netns_cookie)
		return 1;
	struct sock_key_v4 sk = {.cookie = bpf_get_socket_cookie(ctx), .addr = ctx->user_ip4, .port = (__u16)ctx->user_port};
	struct sock_val_v4 *sv = bpf_map_lookup_elem(&sl_sock_v4, &sk);
	if (sv) {
		ctx->user_ip4 = sv->fe_addr;
		ctx->user_port = sv->fe_port;
	}
	return 1;
}

/* The cleaner's batch of requests: userspace writes it, runs sl_ct_clean, reads the counts. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_clean_ctx_v4);
	__uint(max_entries, 1);
} sl_ct_cleanq SEC(".maps");

/* sl_ct_clean deletes the connection-tracking entries userspace judged expired, each only if
 * no packet refreshed it since it was judged: cleanup never races live traffic. Run through
 * BPF_PROG_TEST_RUN after writing a batch of requests into sl_ct_cleanq. */
SEC("syscall")
int sl_ct_clean(void *ctx)
{
	__u32 zero = 0;
	struct ct_clean_ctx_v4 *q = bpf_map_lookup_elem(&sl_ct_cleanq, &zero);
	if (!q)
		return 1;
	q->deleted = 0;
	q->kept = 0;
	for (__u32 i = 0; i < CLEAN_BATCH; i++) {
		if (i >= q->n)
			break;
		struct ct_clean_req_v4 r = q->req[i];
		struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &r.key);
		if (!v)
			continue;
		if (v->last_seen != r.seen) {
			q->kept++;
			continue;
		}
		bpf_map_delete_elem(&sl_ct_v4, &r.key);
		q->deleted++;
		if (r.pair.proto)
			bpf_map_delete_elem(&sl_ct_v4, &r.pair);
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
