/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv6 parsing (the extension headers walked to the transport header) and rewriting
 * addresses and ports with the transport checksum (IPv6 has no header checksum). */
#ifndef SLUICE_LIB_PARSE6_H
#define SLUICE_LIB_PARSE6_H

#define IP6_HLEN 40
#define L4_OFF6 (ETH_HLEN + IP6_HLEN)

#define NEXTHDR_HOP 0
#define NEXTHDR_ROUTING 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH 51
#define NEXTHDR_DEST 60
#define NEXTHDR_ICMP6 58
/* Extension headers walked before the transport header: more is no packet's. */
#define EXT_MAX 8

/* pkt6.frag */
#define F6_FRAG  (1 << 0) /* has a fragment header */
#define F6_MORE  (1 << 1) /* more fragments follow */
#define F6_LATER (1 << 2) /* not the first fragment: no transport header */

struct pkt6 {
	struct addr6 src, dst;
	__be16 sport, dport;
	__u8 proto;     /* the transport protocol (after the extension headers) */
	__u8 tcp_flags; /* TCP header byte 13 */
	__u16 l4;       /* offset of the transport header */
	__u16 len;      /* payload length (after the 40-byte header), host order */
	__u8 frag;      /* F6_* */
	__u8 later;     /* a later fragment with the ports of its first */
	__be32 id;      /* the fragment header's identification */
};

/* parse6 reads the IPv6 header at ip_off, walks the extension headers (hop-by-hop, routing,
 * destination options, authentication, fragment) and reads the transport header's ports (TCP
 * and UDP, first fragments only). Returns 0 when the packet is IPv6 and its transport header
 * was found (or it is a later fragment); -1 otherwise (also a routing header with segments
 * left: the destination is not final yet, and such a packet is never translated). */
static __always_inline int parse6(struct __sk_buff *skb, __u32 ip_off, struct pkt6 *p)
{
	struct ipv6hdr ip;
	if (bpf_skb_load_bytes(skb, ip_off, &ip, sizeof(ip)) < 0)
		return -1;
	if (ip.version != 6)
		return -1;
	__builtin_memcpy(&p->src, &ip.saddr, 16);
	__builtin_memcpy(&p->dst, &ip.daddr, 16);
	p->len = bpf_ntohs(ip.payload_len);
	p->frag = 0;
	p->later = 0;
	p->id = 0;
	p->sport = p->dport = 0;
	p->tcp_flags = 0;
	__u8 nh = ip.nexthdr;
	__u32 off = ip_off + IP6_HLEN;
	for (int i = 0; i < EXT_MAX; i++) {
		if (nh == NEXTHDR_HOP || nh == NEXTHDR_ROUTING || nh == NEXTHDR_DEST || nh == NEXTHDR_AUTH) {
			__u8 h[4];
			if (bpf_skb_load_bytes(skb, off, h, sizeof(h)) < 0)
				return -1;
			if (nh == NEXTHDR_ROUTING && h[3] != 0)
				return -1;
			off += nh == NEXTHDR_AUTH ? ((__u32)h[1] + 2) * 4 : ((__u32)h[1] + 1) * 8;
			nh = h[0];
			continue;
		}
		if (nh == NEXTHDR_FRAGMENT) {
			struct {
				__u8 nexthdr;
				__u8 reserved;
				__be16 frag_off;
				__be32 id;
			} fh;
			if (bpf_skb_load_bytes(skb, off, &fh, sizeof(fh)) < 0)
				return -1;
			__u16 fo = bpf_ntohs(fh.frag_off);
			p->frag = F6_FRAG | ((fo & 1) ? F6_MORE : 0) | ((fo & ~7) ? F6_LATER : 0);
			p->id = fh.id;
			off += sizeof(fh);
			nh = fh.nexthdr;
			continue;
		}
		break;
	}
	if (nh == NEXTHDR_HOP || nh == NEXTHDR_ROUTING || nh == NEXTHDR_DEST || nh == NEXTHDR_AUTH ||
	    nh == NEXTHDR_FRAGMENT)
		return -1; /* more than EXT_MAX extension headers */
	p->proto = nh;
	p->l4 = off;
	if (p->frag & F6_LATER)
		return 0;
	/* The whole fixed transport header must be there: rewrites reach its checksum. */
	if ((nh == IPPROTO_TCP && skb->len < off + 20) || (nh == IPPROTO_UDP && skb->len < off + 8))
		return -1;
	if (nh == IPPROTO_TCP) {
		__u8 th[14];
		if (bpf_skb_load_bytes(skb, off, th, sizeof(th)) < 0)
			return -1;
		__builtin_memcpy(&p->sport, &th[0], 2);
		__builtin_memcpy(&p->dport, &th[2], 2);
		p->tcp_flags = th[13];
	} else if (nh == IPPROTO_UDP) {
		__be16 ports[2];
		if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
			return -1;
		p->sport = ports[0];
		p->dport = ports[1];
	}
	return 0;
}

static __always_inline int is_l4_6(struct pkt6 *p)
{
	return (p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP) && (!(p->frag & F6_LATER) || p->later);
}

/* csum_complete_fix6 accounts in skb->csum for an IPv6 address changed from from to to.
 * Given a complete receive checksum (CHECKSUM_COMPLETE, from NICs that sum the whole packet),
 * bpf_skb_store_bytes leaves skb->csum as it was, and bpf_l4_csum_replace with the
 * pseudo-header flag moves it by the transport checksum's change, as IPv4 needs: there the
 * header checksum cancels the address change. IPv6 has no header checksum, so the address's
 * own change is added here, or the stack logs "hw csum failure" and sums the packet again in
 * software. It holds with and without the transport checksum's change (a later fragment, a UDP
 * checksum of 0 that the helper leaves). Linux 6.16's BPF_F_IPV6 flag stops the helper from
 * moving skb->csum instead, but older kernels refuse the flag. bpf_csum_update touches only a
 * CHECKSUM_COMPLETE skb. */
static __always_inline void csum_complete_fix6(struct __sk_buff *skb, const struct addr6 *from, const struct addr6 *to)
{
	/* The difference is summed again rather than kept from the transport checksum's fix: a
	 * value live across the store costs the caller a stack slot, and 5.10 counts the call
	 * chain's frames to 512 bytes. */
	bpf_csum_update(skb, (__wsum)bpf_csum_diff((__be32 *)from->w, 16, (__be32 *)to->w, 16, 0));
}

/* rewrite6 changes the source (dst_side 0) or destination address and port of the packet,
 * fixing the transport checksum, whose pseudo-header holds the addresses. A UDP checksum
 * never becomes 0 (no checksum, which IPv6 forbids): a result of 0 is written as 0xffff. */
static __always_inline int rewrite6(struct __sk_buff *skb, struct pkt6 *p, int dst_side, const struct addr6 *addr,
				    __be16 port)
{
	__u32 csum_off = p->l4 + (p->proto == IPPROTO_TCP ? 16 : 6);
	__u64 mangle = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	struct addr6 *old = dst_side ? &p->dst : &p->src;
	__be16 old_port = dst_side ? p->dport : p->sport;
	int l4 = !p->later;
	if (!eq6(old, addr)) {
		if (l4) {
			__s64 d = bpf_csum_diff(old->w, 16, (__be32 *)addr->w, 16, 0);
			if (bpf_l4_csum_replace(skb, csum_off, 0, d, BPF_F_PSEUDO_HDR | mangle) < 0)
				return -1;
		}
		if (bpf_skb_store_bytes(skb, IP_OFF + (dst_side ? 24 : 8), addr, 16, 0) < 0)
			return -1;
		csum_complete_fix6(skb, old, addr);
		*old = *addr;
	}
	if (old_port != port && l4) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, mangle | 2) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, p->l4 + (dst_side ? 2 : 0), &port, 2, 0) < 0)
			return -1;
	}
	if (dst_side)
		p->dport = port;
	else
		p->sport = port;
	return 0;
}

/* ip6_answer fills the IPv6 header of an answer sluice sends itself. */
static __always_inline void ip6_answer(struct ipv6hdr *ip, __u8 proto, __u16 payload, const struct addr6 *src,
				       const struct addr6 *dst)
{
	ip->version = 6;
	ip->nexthdr = proto;
	ip->hop_limit = 64;
	ip->payload_len = bpf_htons(payload);
	__builtin_memcpy(&ip->saddr, src, 16);
	__builtin_memcpy(&ip->daddr, dst, 16);
}

/* csum6_pseudo is the checksum of IPv6's pseudo-header for an answer of this protocol and
 * length, to go on with the payload's. */
static __always_inline __s64 csum6_pseudo(const struct addr6 *src, const struct addr6 *dst, __u32 len, __u8 proto)
{
	__be32 tail[2] = {bpf_htonl(len), bpf_htonl(proto)};
	__s64 cs = bpf_csum_diff(0, 0, (__be32 *)src->w, 16, 0);
	cs = bpf_csum_diff(0, 0, (__be32 *)dst->w, 16, cs);
	return bpf_csum_diff(0, 0, tail, sizeof(tail), cs);
}

#endif
