/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP errors about translated flows, translated as the kernel's NAT does. */
#ifndef SLUICE_LIB_ICMP_NAT_H
#define SLUICE_LIB_ICMP_NAT_H

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
		return reply_out(skb, rev, route, outer->src, outer->dst);
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

#endif
