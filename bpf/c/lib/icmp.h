/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What sluice answers itself: ICMP errors (port unreachable, fragmentation needed) and TCP
 * resets. Slow paths: BPF-to-BPF functions with a stack of their own. */
#ifndef SLUICE_LIB_ICMP_H
#define SLUICE_LIB_ICMP_H

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
	ip_answer(&ip, IPPROTO_ICMP, sizeof(struct iphdr) + sizeof(struct icmphdr) + q, p->dst, p->src);
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
	ip_answer(&ip, IPPROTO_TCP, sizeof(struct iphdr) + sizeof(struct tcphdr), p->dst, p->src);
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

#endif
