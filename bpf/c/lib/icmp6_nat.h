/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMPv6 errors about translated flows, translated as the kernel's NAT does (icmp_nat.h).
 * Neighbour Discovery, router and echo messages are never touched. */
#ifndef SLUICE_LIB_ICMP6_NAT_H
#define SLUICE_LIB_ICMP6_NAT_H

/* quoted6 reads the packet an ICMPv6 error quotes: 0 when it is a TCP or UDP packet (not a
 * later fragment) whose ports are there, its extension headers walked as parse6 walks a
 * packet's. */
static __always_inline int quoted6(struct __sk_buff *skb, struct pkt6 *outer, struct pkt6 *q)
{
	if (outer->proto != NEXTHDR_ICMP6 || (outer->frag & F6_FRAG))
		return -1;
	__u8 type;
	if (bpf_skb_load_bytes(skb, outer->l4, &type, 1) < 0)
		return -1;
	if (type < ICMP6_DST_UNREACH || type > ICMP6_PARAM_PROB)
		return -1;
	if (parse6(skb, outer->l4 + 8, q) < 0 || (q->frag & F6_LATER) ||
	    (q->proto != IPPROTO_TCP && q->proto != IPPROTO_UDP))
		return -1;
	return 0;
}

/* icmp6_rewrite changes the quoted packet's source (quoted_dst 0) or destination address and
 * port, and the outer destination or source address when outer_addr differs, keeping the
 * ICMPv6 checksum (over the message and the outer pseudo-header) right. */
static __always_inline int icmp6_rewrite(struct __sk_buff *skb, struct pkt6 *outer, struct pkt6 *q, int quoted_dst,
					 const struct addr6 *addr, __be16 port, int outer_dst,
					 const struct addr6 *outer_addr)
{
	__u32 csum_off = outer->l4 + 2, qip = outer->l4 + 8;
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

/* icmp6_error translates an ICMPv6 error about a translated flow (icmp_error): about a packet
 * a client sent to a backend, to the client as if about the packet it sent to the frontend;
 * about a reply, to the backend as if about the reply it sent; through the tunnel where the
 * flow went through it. tun_src is the node that tunnelled the error here (0: it did not
 * come through the tunnel): only the node a flow was forwarded to, or from, may send errors
 * about it. -1: not such an error. */
static __noinline int icmp6_error(struct __sk_buff *skb, struct pkt6 *outer, int route, struct addr6 *tun_src)
{
	struct pkt6 q = {};
	if (quoted6(skb, outer, &q) < 0)
		return -1;
	struct ct_key_v6 k;
	ct_key6(&k, &q, 1);
	struct ct_val_v6 *v = bpf_map_lookup_elem(&sl_ct_v6, &k);
	if (tun_src && !(v && v->type == CT_REV)) {
		/* On the backend's node: the ingress node translated an error about a reply; the
		 * quoted tuple as it is (backend to client) names the flow's tunnel entry. */
		ct_key6(&k, &q, 0);
		struct ct_val_v6 *t = bpf_map_lookup_elem(&sl_ct_v6, &k);
		if (!t || t->type != CT_TUN)
			return -1;
		if (!eq6(&t->nat_addr, tun_src)) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		return fib_out6(skb, &outer->src, &outer->dst, 1);
	}
	if (!v)
		return -1;
	if (v->type == CT_REV) {
		if (tun_src && (!(v->flags & CT_F_REMOTE) || !eq6(&v->tun_addr, tun_src))) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		/* The backend itself answering speaks for the frontend; a router keeps its address.
		 * An error about a hairpin packet goes to the client's own address. */
		struct addr6 src = eq6(&outer->src, &q.dst) ? v->nat_addr : outer->src;
		int hp = !zero6(&v->nat_saddr);
		struct addr6 client = hp ? v->nat_saddr : q.src;
		if (icmp6_rewrite(skb, outer, &q, 1, &v->nat_addr, v->nat_port, 0, &src) < 0 ||
		    icmp6_rewrite(skb, outer, &q, 0, &client, v->nat_sport, 1, hp ? &client : &outer->dst) < 0) {
			count(C_DROP_MALFORMED);
			return TC_ACT_SHOT;
		}
		return reply_out6(skb, v, route, &outer->src, &outer->dst);
	}
	struct cfg *c = config();
	struct cfg_v6 *c6 = config6();
	if (v->type == CT_TUN) {
		/* On the backend's node: back through the tunnel, translated by the ingress node. */
		if (!c || !c6)
			return TC_ACT_SHOT;
		struct addr6 peer = v->nat_addr;
		return encap6_out(skb, outer, c, c6, &peer);
	}
	if (v->type == CT_FWD) {
		int hp = !zero6(&v->nat_saddr);
		struct addr6 saddr = hp ? v->nat_saddr : q.dst;
		if (icmp6_rewrite(skb, outer, &q, 0, &v->nat_addr, v->nat_port, 1, &v->nat_addr) < 0 ||
		    icmp6_rewrite(skb, outer, &q, 1, &saddr, v->nat_sport, 0, hp ? &saddr : &outer->src) < 0) {
			count(C_DROP_MALFORMED);
			return TC_ACT_SHOT;
		}
		if ((v->flags & CT_F_REMOTE) && c && c6) {
			struct addr6 node = v->tun_addr;
			return encap6_out(skb, outer, c, c6, &node);
		}
		if (route)
			return fib_out6(skb, &outer->src, &outer->dst, 1);
		return TC_ACT_OK;
	}
	return -1;
}

#endif
