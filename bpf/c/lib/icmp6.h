/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What sluice answers itself over IPv6 (ICMPv6 errors, TCP resets) and sending IPv6 packets
 * on by the FIB. Slow paths: functions with a stack of their own, as in icmp.h. */
#ifndef SLUICE_LIB_ICMP6_H
#define SLUICE_LIB_ICMP6_H

#ifndef AF_INET6
#define AF_INET6 10
#endif

#define ICMP6_DST_UNREACH 1
#define ICMP6_PKT_TOO_BIG 2
#define ICMP6_TIME_EXCEED 3
#define ICMP6_PARAM_PROB 4
#define ICMP6_PORT_UNREACH 4 /* code of ICMP6_DST_UNREACH */

struct icmp6hdr_ {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be32 data; /* the MTU of a Packet Too Big, else unused */
};

/* fib_out6 is fib_out (fib.h) for an IPv6 packet. */
static __noinline int fib_out6(struct __sk_buff *skb, const struct addr6 *src, const struct addr6 *dst, int fallback_ok)
{
	struct bpf_fib_lookup fib = {};
	fib.family = AF_INET6;
	__builtin_memcpy(fib.ipv6_src, src, 16);
	__builtin_memcpy(fib.ipv6_dst, dst, 16);
	fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		if (bpf_skb_store_bytes(skb, 0, fib.dmac, 6, 0) < 0 || bpf_skb_store_bytes(skb, 6, fib.smac, 6, 0) < 0)
			return TC_ACT_SHOT;
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = {.nh_family = AF_INET6};
		__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	return fib_fail(rc, fallback_ok);
}

/* ICMP6(type, code) is icmp6_back's type_code. */
#define ICMP6(type, code) ((__u16)((type) << 8 | (code)))

/* icmp6_back answers the packet with an ICMPv6 error (port unreachable, Packet Too Big) from
 * the address it was sent to, as icmp_back does for IPv4: back is 0 for a packet that came in,
 * BPF_F_INGRESS for one leaving (the answer goes up to the local stack that sent it). The
 * quote is the packet from its IPv6 header: 128 bytes, or 64, or 48 (the header and 8 bytes
 * of the transport header), whichever the packet has. */
static __noinline int icmp6_back(struct __sk_buff *skb, struct pkt6 *p, __u16 type_code, __u32 mtu, __u64 back)
{
	__u32 q = 48;
	if (skb->len >= ETH_HLEN + QUOTE6)
		q = QUOTE6;
	else if (skb->len >= ETH_HLEN + 64)
		q = 64;
	if (bpf_skb_change_tail(skb, ETH_HLEN + q, 0) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_adjust_room(skb, IP6_HLEN + sizeof(struct icmp6hdr_), BPF_ADJ_ROOM_MAC, 0) < 0)
		return TC_ACT_SHOT;
	__u32 len = sizeof(struct icmp6hdr_) + q;
	__u32 zero = 0;
	struct quote6_buf *a = bpf_map_lookup_elem(&sl_scratch6, &zero);
	if (!a || bpf_skb_load_bytes(skb, ETH_HLEN + IP6_HLEN + sizeof(struct icmp6hdr_), a->b, q) < 0)
		return TC_ACT_SHOT;
	struct ipv6hdr *ip = (struct ipv6hdr *)a->ip;
	__builtin_memset(ip, 0, sizeof(*ip));
	ip6_answer(ip, NEXTHDR_ICMP6, len, &p->dst, &p->src);
	struct icmp6hdr_ *ic = (struct icmp6hdr_ *)a->icmp;
	ic->type = type_code >> 8;
	ic->code = type_code & 0xff;
	ic->checksum = 0;
	ic->data = bpf_htonl(mtu);
	__s64 cs = csum6_pseudo(&p->dst, &p->src, len, NEXTHDR_ICMP6);
	cs = bpf_csum_diff(0, 0, (__be32 *)a->icmp, sizeof(a->icmp), cs);
	cs = bpf_csum_diff(0, 0, (__be32 *)a->b, q, cs);
	ic->checksum = csum_fold(cs);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, a, sizeof(a->ip) + sizeof(a->icmp), 0) < 0 || swap_macs(skb) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, back);
}

/* tcp_rst6 answers a TCP segment with a reset, as a closed port does (tcp_rst for IPv6). */
static __noinline int tcp_rst6(struct __sk_buff *skb, struct pkt6 *p)
{
	struct tcphdr th;
	if (bpf_skb_load_bytes(skb, p->l4, &th, sizeof(th)) < 0)
		return TC_ACT_SHOT;
	__u32 payload = p->len - (p->l4 - L4_OFF6) - th.doff * 4;
	__u32 seq = bpf_ntohl(th.seq);
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
		rst.ack = 1;
		rst.ack_seq = bpf_htonl(seq + payload);
	}
	if (bpf_skb_change_tail(skb, L4_OFF6 + sizeof(struct tcphdr), 0) < 0)
		return TC_ACT_SHOT;
	struct ipv6hdr ip = {};
	ip6_answer(&ip, IPPROTO_TCP, sizeof(struct tcphdr), &p->dst, &p->src);
	__s64 cs = csum6_pseudo(&p->dst, &p->src, sizeof(struct tcphdr), IPPROTO_TCP);
	cs = bpf_csum_diff(0, 0, (__be32 *)&rst, sizeof(rst), cs);
	rst.check = csum_fold(cs);
	if (bpf_skb_store_bytes(skb, IP_OFF, &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, L4_OFF6, &rst, sizeof(rst), 0) < 0 || swap_macs(skb) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

static __always_inline int reject6(struct __sk_buff *skb, struct pkt6 *p, __u32 why)
{
	count(why);
	if (p->proto == IPPROTO_TCP) {
		if (p->tcp_flags & TH_RST)
			return TC_ACT_SHOT;
		return tcp_rst6(skb, p);
	}
	return icmp6_back(skb, p, ICMP6(ICMP6_DST_UNREACH, ICMP6_PORT_UNREACH), 0, 0);
}

#endif
