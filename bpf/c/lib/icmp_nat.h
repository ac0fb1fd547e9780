/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP errors about translated flows, translated as the kernel's NAT does. ICMPv6: Neighbour
 * Discovery, router and echo messages are never touched. Included once per family
 * (lib/family.h): the quote and the checksums are each family's, the translation is one. */

#ifndef SLUICE_LIB_ICMP_NAT_SHARED
#define SLUICE_LIB_ICMP_NAT_SHARED

/* An ICMP error's quoted packet starts after the outer IP header and the 8-byte ICMP header;
 * q->l4 is the offset of its transport header. */
#define Q_IP(outer) ((outer)->l4 + 8)

#endif /* SLUICE_LIB_ICMP_NAT_SHARED */

#if FAMILY == 4

/* icmp_quotes says whether an ICMP message of this type, in this packet, quotes a packet to
 * translate: an error (unreachable, time exceeded, parameter problem) in its first fragment. */
static __always_inline int icmp_quotes(struct pkt *outer, __u8 type)
{
	return !(outer->frag & IP_OFFMASK) && (type == ICMP_DEST_UNREACH || type == 11 /* time exceeded */ ||
					       type == 12 /* parameter problem */);
}

/* parse_quote reads the quoted IPv4 header at off and the ports after it and its options.
 * Only the ports are read: a quote may end 8 bytes into the transport header (RFC 792; routers
 * still send such), which is enough for Linux to match an error to a TCP socket too. */
static __always_inline int parse_quote(struct __sk_buff *skb, __u32 off, struct pkt *q)
{
	struct iphdr ip;
	if (ip4_header(skb, off, &ip, q) < 0 || !has_ports(q))
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
					const __be32 *addr, __be16 port, int outer_dst, const __be32 *outer_addr)
{
	__be32 old_addr = quoted_dst ? q->dst : q->src;
	__be16 old_port = quoted_dst ? q->dport : q->sport;
	__u16 qcheck, icheck;
	__u32 qip = Q_IP(outer);
	if (bpf_skb_load_bytes(skb, qip + 10, &qcheck, 2) < 0 || bpf_skb_load_bytes(skb, outer->l4 + 2, &icheck, 2) < 0)
		return -1;
	if (old_addr != *addr) {
		__u16 nq = csum_replace4(qcheck, old_addr, *addr);
		icheck = csum_replace4(icheck, old_addr, *addr);
		icheck = csum_replace2(icheck, qcheck, nq);
		qcheck = nq;
		if (bpf_skb_store_bytes(skb, qip + (quoted_dst ? 16 : 12), addr, 4, 0) < 0 ||
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
	__be32 *old_outer = outer_dst ? &outer->dst : &outer->src;
	if (*old_outer != *outer_addr) {
		if (bpf_l3_csum_replace(skb, IP_OFF + 10, *old_outer, *outer_addr, 4) < 0 ||
		    bpf_skb_store_bytes(skb, IP_OFF + (outer_dst ? 16 : 12), outer_addr, 4, 0) < 0)
			return -1;
		*old_outer = *outer_addr;
	}
	return 0;
}

#else /* FAMILY == 6 */

/* ICMPv6: an error (destination unreachable, Packet Too Big, time exceeded, parameter problem)
 * not in a fragment. */
static __always_inline int icmp_quotes6(struct pkt6 *outer, __u8 type)
{
	return !(outer->frag & F6_FRAG) && type >= ICMP6_DST_UNREACH && type <= ICMP6_PARAM_PROB;
}

/* The quoted IPv6 packet, its extension headers walked as parse6 walks a packet's. */
static __always_inline int parse_quote6(struct __sk_buff *skb, __u32 off, struct pkt6 *q)
{
	if (parse6(skb, off, q) < 0 || !has_ports6(q))
		return -1;
	return 0;
}

/* icmp_rewrite6: icmp_rewrite for ICMPv6, whose checksum covers the message and the outer
 * pseudo-header. */
static __always_inline int icmp_rewrite6(struct __sk_buff *skb, struct pkt6 *outer, struct pkt6 *q, int quoted_dst,
					 const struct addr6 *addr, __be16 port, int outer_dst,
					 const struct addr6 *outer_addr)
{
	__u32 csum_off = outer->l4 + 2, qip = Q_IP(outer);
	struct addr6 *old = quoted_dst ? &q->dst : &q->src;
	__be16 old_port = quoted_dst ? q->dport : q->sport;
	if (!eq6(old, addr)) {
		__s64 d = bpf_csum_diff(old->w, 16, (__be32 *)addr->w, 16, 0);
		if (bpf_l4_csum_replace(skb, csum_off, 0, d, 0) < 0 ||
		    bpf_skb_store_bytes(skb, qip + (quoted_dst ? 24 : 8), addr, 16, 0) < 0)
			return -1;
		*old = *addr;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, 2) < 0 ||
		    bpf_skb_store_bytes(skb, q->l4 + (quoted_dst ? 2 : 0), &port, 2, 0) < 0)
			return -1;
	}
	struct addr6 *oold = outer_dst ? &outer->dst : &outer->src;
	if (!eq6(oold, outer_addr)) {
		__s64 d = bpf_csum_diff(oold->w, 16, (__be32 *)outer_addr->w, 16, 0);
		if (bpf_l4_csum_replace(skb, csum_off, 0, d, BPF_F_PSEUDO_HDR) < 0 ||
		    bpf_skb_store_bytes(skb, IP_OFF + (outer_dst ? 24 : 8), outer_addr, 16, 0) < 0)
			return -1;
		csum_complete_fix6(skb, oold, outer_addr);
		*oold = *outer_addr;
	}
	return 0;
}

#endif /* FAMILY */

/* quoted reads the packet an ICMP error quotes: 0 when it is a TCP or UDP packet (not a later
 * fragment) whose ports are there. */
static __always_inline int FN(quoted)(struct __sk_buff *skb, pkt_t *outer, pkt_t *q)
{
	if (outer->proto != ICMP_PROTO)
		return -1;
	__u8 type;
	if (bpf_skb_load_bytes(skb, outer->l4, &type, 1) < 0)
		return -1;
	if (!FN(icmp_quotes)(outer, type))
		return -1;
	return FN(parse_quote)(skb, Q_IP(outer), q);
}

/* icmp_error translates an ICMP error about a translated flow, as the kernel's NAT does:
 * an error about a packet a client sent to a backend (a backend's port unreachable, a
 * router's fragmentation-needed on the way) goes to the client as if about the packet it sent
 * to the frontend; an error about a reply (sent by a client or a router on its side) goes to
 * the backend as if about the reply it sent; through the tunnel where the flow went through
 * it. tun_src is the node that tunnelled the error here (none: it did not come through the
 * tunnel): only the node a flow was forwarded to, or from, may send errors about it. Returns
 * -1 when it is not such an error. */
static __noinline int FN(icmp_error)(struct __sk_buff *skb, pkt_t *outer, int route, addr_arg_t tun_src)
{
	pkt_t q = {};
	if (FN(quoted)(skb, outer, &q) < 0)
		return -1;
	/* The quoted tuple turned round is the flow's reverse entry for an error about a client's
	 * packet after DNAT, its forward entry for one about a reply from the frontend, and its
	 * tunnel entry for a backend's error about a flow forwarded to this node. */
	ct_key_t k;
	FN(ct_key)(&k, &q, 1);
	ct_val_t *v = bpf_map_lookup_elem(&CT_MAP, &k);
	if (tun_src && !(v && v->type == CT_REV)) {
		/* On the backend's node: the ingress node translated an error about a reply; the
		 * quoted tuple as it is (backend to client) names the flow's tunnel entry. */
		FN(ct_key)(&k, &q, 0);
		ct_val_t *t = bpf_map_lookup_elem(&CT_MAP, &k);
		if (!t || t->type != CT_TUN)
			return -1;
		if (!ADDR_EQ(t->nat_addr, AVAL(tun_src))) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		return FN(fib_out)(skb, AARG(outer->src), AARG(outer->dst), 1);
	}
	if (!v)
		return -1;
	if (v->type == CT_REV) {
		if (tun_src && (!(v->flags & CT_F_REMOTE) || !ADDR_EQ(v->tun_addr, AVAL(tun_src)))) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		/* The backend itself answering speaks for the frontend; a router keeps its address.
		 * An error about a hairpin packet goes to the client's own address. */
		addr_t src = ADDR_EQ(outer->src, q.dst) ? v->nat_addr : outer->src;
		int hp = !ADDR_ZERO(v->nat_saddr);
		addr_t client = hp ? v->nat_saddr : q.src;
		if (FN(icmp_rewrite)(skb, outer, &q, 1, &v->nat_addr, v->nat_port, 0, &src) < 0 ||
		    FN(icmp_rewrite)(skb, outer, &q, 0, &client, v->nat_sport, 1, hp ? &client : &outer->dst) < 0) {
			count(C_DROP_MALFORMED);
			return TC_ACT_SHOT;
		}
		return FN(reply_out)(skb, v, route, AARG(outer->src), AARG(outer->dst));
	}
	tun_cfg_t *tc = TUN_CFG(config());
	if (v->type == CT_TUN) {
		/* On the backend's node: back through the tunnel, translated by the ingress node. */
		if (!tc)
			return TC_ACT_SHOT;
		addr_t peer = v->nat_addr;
		return FN(encap_out)(skb, outer, tc, AARG(peer));
	}
	if (v->type == CT_FWD) {
		/* About a reply to a hairpin flow: from the client as the backend knows it. */
		int hp = !ADDR_ZERO(v->nat_saddr);
		addr_t saddr = hp ? v->nat_saddr : q.dst;
		if (FN(icmp_rewrite)(skb, outer, &q, 0, &v->nat_addr, v->nat_port, 1, &v->nat_addr) < 0 ||
		    FN(icmp_rewrite)(skb, outer, &q, 1, &saddr, v->nat_sport, 0, hp ? &saddr : &outer->src) < 0) {
			count(C_DROP_MALFORMED);
			return TC_ACT_SHOT;
		}
		if ((v->flags & CT_F_REMOTE) && tc) {
			addr_t node = v->tun_addr;
			return FN(encap_out)(skb, outer, tc, AARG(node));
		}
		if (route)
			return FN(fib_out)(skb, AARG(outer->src), AARG(outer->dst), 1);
		return TC_ACT_OK;
	}
	return -1;
}
