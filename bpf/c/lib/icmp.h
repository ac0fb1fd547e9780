/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What sluice answers itself: ICMP errors (port unreachable, fragmentation needed; ICMPv6's
 * port unreachable and Packet Too Big) and TCP resets. Slow paths: BPF-to-BPF functions with a
 * stack of their own. Included once per family (lib/family.h): each family has its ICMP, the
 * reset and the choice between them are one. */

#ifndef SLUICE_LIB_ICMP_SHARED
#define SLUICE_LIB_ICMP_SHARED

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

#endif /* SLUICE_LIB_ICMP_SHARED */

#if FAMILY == 4

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
	ip_answer(&ip, IPPROTO_ICMP, sizeof(struct icmphdr) + q, &p->dst, &p->src);
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

#else /* FAMILY == 6 */

/* icmp6_back answers the packet with an ICMPv6 error (type_code, ICMP6(): port unreachable,
 * Packet Too Big) from the address it was sent to, as icmp_back does for IPv4. The quote is
 * the packet from its IPv6 header: 128 bytes, or 64, or 48 (the header and 8 bytes of the
 * transport header), whichever the packet has; the ICMPv6 checksum covers the pseudo-header. */
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
	ip_answer6(ip, NEXTHDR_ICMP6, len, &p->dst, &p->src);
	struct icmp6hdr_ *ic = (struct icmp6hdr_ *)a->icmp;
	ic->type = type_code >> 8;
	ic->code = type_code & 0xff;
	ic->checksum = 0;
	ic->data = bpf_htonl(mtu);
	__s64 cs = csum_pseudo6(&p->dst, &p->src, len, NEXTHDR_ICMP6);
	cs = bpf_csum_diff(0, 0, (__be32 *)a->icmp, sizeof(a->icmp), cs);
	cs = bpf_csum_diff(0, 0, (__be32 *)a->b, q, cs);
	ic->checksum = csum_fold(cs);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, a, sizeof(a->ip) + sizeof(a->icmp), 0) < 0 || swap_macs(skb) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, back);
}

#endif /* FAMILY */

/* too_big_back answers an oversized packet with fragmentation-needed (ICMPv6: Packet Too Big)
 * and the MTU it may have, counted when sent. */
static __always_inline int FN(too_big_back)(struct __sk_buff *skb, pkt_t *p, __u32 mtu, __u64 back)
{
	int rc = FN(icmp_back)(skb, p, ICMP_TOO_BIG, mtu, back);
	if (rc == TC_ACT_REDIRECT)
		count(C_ICMP_TOO_BIG);
	return rc;
}

/* tcp_rst answers a TCP segment with a reset, as a closed port does. */
static __noinline int FN(tcp_rst)(struct __sk_buff *skb, pkt_t *p)
{
	struct tcphdr th;
	if (bpf_skb_load_bytes(skb, p->l4, &th, sizeof(th)) < 0)
		return TC_ACT_SHOT;
	__u32 payload = FN(ip_len)(p) - (p->l4 - IP_OFF) - th.doff * 4;
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
	if (bpf_skb_change_tail(skb, IP_OFF + sizeof(iphdr_t) + sizeof(struct tcphdr), 0) < 0)
		return TC_ACT_SHOT;
	iphdr_t ip = {};
	FN(ip_answer)(&ip, IPPROTO_TCP, sizeof(struct tcphdr), &p->dst, &p->src);
	__s64 cs = FN(csum_pseudo)(&p->dst, &p->src, sizeof(struct tcphdr), IPPROTO_TCP);
	cs = bpf_csum_diff(0, 0, (__be32 *)&rst, sizeof(rst), cs);
	rst.check = csum_fold(cs);
	if (bpf_skb_store_bytes(skb, IP_OFF, &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + sizeof(ip), &rst, sizeof(rst), 0) < 0 || swap_macs(skb) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* reject refuses a packet to a service that cannot take it (counted as why): a TCP reset, or
 * ICMP port unreachable. */
static __always_inline int FN(reject)(struct __sk_buff *skb, pkt_t *p, __u32 why)
{
	count(why);
	if (p->proto == IPPROTO_TCP) {
		if (p->tcp_flags & TH_RST)
			return TC_ACT_SHOT;
		return FN(tcp_rst)(skb, p);
	}
	return FN(icmp_back)(skb, p, ICMP_UNREACH_PORT, 0, 0);
}
