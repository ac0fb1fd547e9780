/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Parsing (header offsets carried from the parser: IPv4 options and IPv6 extension headers
 * move the transport header) and rewriting addresses and ports with their checksums. Included
 * once per family (lib/family.h): the IP headers are each family's, the transport header's
 * reading and rewriting are one. */

#ifndef SLUICE_LIB_PARSE_SHARED
#define SLUICE_LIB_PARSE_SHARED

static __always_inline __u16 csum_fold(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)~csum;
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

#endif /* SLUICE_LIB_PARSE_SHARED */

/* parse_l4 reads the ports and TCP's flags of p's transport header (proto) at off; the
 * whole fixed header must be there: rewrites reach its checksum. */
static __always_inline int FN(parse_l4)(struct __sk_buff *skb, pkt_t *p, __u8 proto, __u32 off)
{
	if ((proto == IPPROTO_TCP && skb->len < off + 20) || (proto == IPPROTO_UDP && skb->len < off + 8))
		return -1;
	if (proto == IPPROTO_TCP) {
		__u8 th[14];
		if (bpf_skb_load_bytes(skb, off, th, sizeof(th)) < 0)
			return -1;
		__builtin_memcpy(&p->sport, &th[0], 2);
		__builtin_memcpy(&p->dport, &th[2], 2);
		p->tcp_flags = th[13];
	} else if (proto == IPPROTO_UDP) {
		__be16 ports[2];
		if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
			return -1;
		p->sport = ports[0];
		p->dport = ports[1];
	}
	return 0;
}

#if FAMILY == 4

/* ip4_header reads the IPv4 header at off (into ip) and its addresses, protocol, fragment
 * field and transport header's offset (after its options) into p. -1 when it is none. */
static __always_inline int ip4_header(struct __sk_buff *skb, __u32 off, struct iphdr *ip, struct pkt *p)
{
	if (bpf_skb_load_bytes(skb, off, ip, sizeof(*ip)) < 0)
		return -1;
	if (ip->version != 4 || ip->ihl < 5)
		return -1;
	p->src = ip->saddr;
	p->dst = ip->daddr;
	p->proto = ip->protocol;
	p->frag = bpf_ntohs(ip->frag_off);
	p->l4 = off + ip->ihl * 4;
	return 0;
}

/* parse reads the IPv4 header at ip_off and the transport header after it and its options.
 * Returns 0 when the packet is IPv4; ports are read only for TCP and UDP first fragments. */
static __always_inline int parse(struct __sk_buff *skb, __u32 ip_off, struct pkt *p)
{
	struct iphdr ip;
	if (ip4_header(skb, ip_off, &ip, p) < 0)
		return -1;
	p->tot_len = bpf_ntohs(ip.tot_len);
	p->tos = ip.tos;
	p->ttl = ip.ttl;
	p->id = ip.id;
	p->later = 0;
	p->sport = p->dport = 0;
	p->tcp_flags = 0;
	if (p->frag & IP_OFFMASK)
		return 0;
	return parse_l4(skb, p, ip.protocol, ip_off + ip.ihl * 4);
}

/* is_frag: a fragment of a datagram; later_frag: a fragment after the first (no transport
 * header). */
static __always_inline int is_frag(struct pkt *p)
{
	return p->frag & (IP_MF | IP_OFFMASK);
}

static __always_inline int later_frag(struct pkt *p)
{
	return p->frag & IP_OFFMASK;
}

/* rewrite_addr stores an IPv4 address (dst_side: the destination) and fixes the checksums
 * that hold it: the header's, and the transport one's pseudo-header (l4). */
static __always_inline int rewrite_addr(struct __sk_buff *skb, __u32 csum_off, __u64 mangle, int l4, int dst_side,
					const __be32 *old, const __be32 *addr)
{
	if (l4 && bpf_l4_csum_replace(skb, csum_off, *old, *addr, BPF_F_PSEUDO_HDR | mangle | 4) < 0)
		return -1;
	if (bpf_l3_csum_replace(skb, IP_OFF + 10, *old, *addr, 4) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, IP_OFF + (dst_side ? 16 : 12), addr, 4, 0);
}

/* ip_len is the packet's IP length, its header included. */
static __always_inline __u32 ip_len(struct pkt *p)
{
	return p->tot_len;
}

/* ip_answer fills the IPv4 header of an answer sluice sends itself (an ICMP error, a reset, the
 * tunnel's outer header) of payload bytes after it: no options, TTL 64, its checksum. */
static __always_inline void ip_answer(struct iphdr *ip, __u8 proto, __u16 payload, const __be32 *src,
				      const __be32 *dst)
{
	ip->version = 4;
	ip->ihl = 5;
	ip->ttl = 64;
	ip->protocol = proto;
	ip->tot_len = bpf_htons(sizeof(struct iphdr) + payload);
	ip->saddr = *src;
	ip->daddr = *dst;
	ip->check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0));
}

/* csum_pseudo is the checksum of IPv4's pseudo-header for a transport header of this protocol
 * and length, to go on with its own. */
static __always_inline __s64 csum_pseudo(const __be32 *src, const __be32 *dst, __u32 len, __u8 proto)
{
	struct {
		__be32 src, dst;
		__u8 zero, proto;
		__be16 len;
	} ph = {.src = *src, .dst = *dst, .proto = proto, .len = bpf_htons(len)};
	return bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), 0);
}

#else /* FAMILY == 6 */

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
	return parse_l46(skb, p, nh, off);
}

static __always_inline int is_frag6(struct pkt6 *p)
{
	return p->frag & F6_FRAG;
}

static __always_inline int later_frag6(struct pkt6 *p)
{
	return p->frag & F6_LATER;
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

/* rewrite_addr6 stores an IPv6 address (dst_side: the destination) and fixes the transport
 * checksum, whose pseudo-header holds it (l4; IPv6 has no header checksum). */
static __always_inline int rewrite_addr6(struct __sk_buff *skb, __u32 csum_off, __u64 mangle, int l4, int dst_side,
					 const struct addr6 *old, const struct addr6 *addr)
{
	if (l4) {
		__s64 d = bpf_csum_diff((__be32 *)old->w, 16, (__be32 *)addr->w, 16, 0);
		if (bpf_l4_csum_replace(skb, csum_off, 0, d, BPF_F_PSEUDO_HDR | mangle) < 0)
			return -1;
	}
	if (bpf_skb_store_bytes(skb, IP_OFF + (dst_side ? 24 : 8), addr, 16, 0) < 0)
		return -1;
	csum_complete_fix6(skb, old, addr);
	return 0;
}

static __always_inline __u32 ip_len6(struct pkt6 *p)
{
	return IP6_HLEN + p->len;
}

/* ip_answer6 fills the IPv6 header of an answer sluice sends itself. */
static __always_inline void ip_answer6(struct ipv6hdr *ip, __u8 proto, __u16 payload, const struct addr6 *src,
				       const struct addr6 *dst)
{
	ip->version = 6;
	ip->nexthdr = proto;
	ip->hop_limit = 64;
	ip->payload_len = bpf_htons(payload);
	__builtin_memcpy(&ip->saddr, src, 16);
	__builtin_memcpy(&ip->daddr, dst, 16);
}

/* csum_pseudo6 is the checksum of IPv6's pseudo-header for an answer of this protocol and
 * length, to go on with the payload's. */
static __always_inline __s64 csum_pseudo6(const struct addr6 *src, const struct addr6 *dst, __u32 len, __u8 proto)
{
	__be32 tail[2] = {bpf_htonl(len), bpf_htonl(proto)};
	__s64 cs = bpf_csum_diff(0, 0, (__be32 *)src->w, 16, 0);
	cs = bpf_csum_diff(0, 0, (__be32 *)dst->w, 16, cs);
	return bpf_csum_diff(0, 0, tail, sizeof(tail), cs);
}

#endif /* FAMILY */

/* has_ports says whether p is a TCP or UDP packet with its ports: not a later fragment, or
 * one given the ports of its first (frag_track). */
static __always_inline int FN(has_ports)(pkt_t *p)
{
	return (p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP) && (!FN(later_frag)(p) || p->later);
}

/* rewrite changes the source (dst_side 0) or destination address and port of the packet (IP
 * header at the standard offset), fixing the checksums incrementally. A UDP checksum never
 * becomes 0 (no checksum, which IPv6 forbids): the helpers write a result of 0 as 0xffff. */
static __always_inline int FN(rewrite)(struct __sk_buff *skb, pkt_t *p, int dst_side, const addr_t *addr, __be16 port)
{
	__u32 csum_off = p->l4 + (p->proto == IPPROTO_TCP ? 16 : 6);
	__u64 mangle = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	addr_t *old = dst_side ? &p->dst : &p->src;
	__be16 old_port = dst_side ? p->dport : p->sport;
	/* A later fragment carries no transport header: the first fragment's rewrite covers the
	 * whole datagram's checksum and ports; here only the addresses change. */
	int l4 = !p->later;
	if (!ADDR_EQ(*old, *addr)) {
		if (FN(rewrite_addr)(skb, csum_off, mangle, l4, dst_side, old, addr) < 0)
			return -1;
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
