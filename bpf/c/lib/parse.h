/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Parsing (header offsets carried from the parser: IP options move the transport header) and
 * rewriting addresses and ports with their checksums. */
#ifndef SLUICE_LIB_PARSE_H
#define SLUICE_LIB_PARSE_H

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
	/* The whole fixed transport header must be there: rewrites reach its checksum. */
	if ((p->proto == IPPROTO_TCP && skb->len < l4 + 20) || (p->proto == IPPROTO_UDP && skb->len < l4 + 8))
		return -1;
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

/* ip_answer fills the IPv4 header of an answer sluice sends itself (an ICMP error, a reset):
 * no options, TTL 64, its checksum. */
static __always_inline void ip_answer(struct iphdr *ip, __u8 proto, __u16 len, __be32 src, __be32 dst)
{
	ip->version = 4;
	ip->ihl = 5;
	ip->ttl = 64;
	ip->protocol = proto;
	ip->tot_len = bpf_htons(len);
	ip->saddr = src;
	ip->daddr = dst;
	ip->check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0));
}

#endif
