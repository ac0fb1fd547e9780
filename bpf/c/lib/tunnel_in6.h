/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The IPv6 node-port tunnel's receiving side (tunnel_in.h for IPv6), and the backend's node
 * sending replies back through it. */
#ifndef SLUICE_LIB_TUNNEL_IN6_H
#define SLUICE_LIB_TUNNEL_IN6_H

#define TUN6_ICMP (-2) /* tunnel_in6 unwrapped an ICMPv6 error: the caller translates it */

/* tunnel_in6 takes a VXLAN packet over IPv6 arriving on a host interface (tunnel_in): any
 * from an address that is no known node is dropped; node-port forwarding (our VNI) is
 * unwrapped here, the rest left to the kernel's VXLAN device. An unwrapped ICMPv6 error is left
 * in in for the caller. */
static __noinline int tunnel_in6(struct __sk_buff *skb, struct pkt6 *outer, struct pkt6 *in)
{
	struct cfg *c = config();
	if (!c)
		return TC_ACT_OK;
	struct cnet_val *peer = cluster_net6(&outer->src);
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
	__be16 proto;
	if (outer->l4 != L4_OFF6 || bpf_skb_load_bytes(skb, L4_OFF6 + 16 + 12, &proto, 2) < 0 ||
	    proto != bpf_htons(ETH_P_IPV6)) {
		/* Nodes send the outer header without extension headers, and IPv6 inside. */
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	struct pkt6 p = {};
	int bad = parse6(skb, ETH_HLEN + ENCAP6_LEN, &p) < 0;
	/* A later fragment gets its first's ports before it is judged, as tunnel_in does: judged
	 * without them, every later fragment through the tunnel was dropped as malformed. */
	if (!bad)
		frag_track6(&p);
	if (bad || !(is_l4_6(&p) || p.proto == NEXTHDR_ICMP6)) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (bpf_skb_adjust_room(skb, -(__s32)ENCAP6_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	count(C_TUN_IN);
	p.l4 -= ENCAP6_LEN;
	if (p.proto == NEXTHDR_ICMP6) {
		*in = p;
		return TUN6_ICMP;
	}
	__u64 now = bpf_ktime_get_ns();
	struct ct_key_v6 k;
	ct_key6(&k, &p, 0);
	struct ct_val_v6 *v = bpf_map_lookup_elem(&sl_ct_v6, &k);
	if (v && v->type == CT_REV && (v->flags & CT_F_REMOTE)) {
		/* A reply to a flow this node forwarded: it must come from the backend's node. */
		if (!eq6(&v->tun_addr, &outer->src)) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		return reply6(skb, &p, v, 1);
	}
	/* A flow forwarded to a backend here: remember the ingress node for the replies. */
	ct_key6(&k, &p, 1);
	struct ct_val_v6 *t = bpf_map_lookup_elem(&sl_ct_v6, &k);
	if (t && t->type == CT_TUN && eq6(&t->nat_addr, &outer->src)) {
		if (is_syn6(&p) && closed_state(t->tcp)) {
			t->created = now;
			t->tcp = 0;
			young6(&k, now);
		}
		t->last_seen = now;
		tcp_track6(t, &p, 0);
	} else if (t && !(t->type == CT_TUN && (closed_state(t->tcp) || (is_syn6(&p) && !(t->tcp & TCP_REPLIED))))) {
		/* The same tuple is live from another node (or is a local flow): never merge two. */
		count(C_DROP_COLLISION);
		return TC_ACT_SHOT;
	} else {
		struct ct_val_v6 nv = {.created = now, .last_seen = now, .type = CT_TUN, .nat_addr = outer->src};
		tcp_track6(&nv, &p, 0);
		if (ct_put6(&k, &nv, BPF_ANY) < 0)
			return TC_ACT_SHOT;
		young6(&k, now);
	}
	return fib_out6(skb, &p.src, &p.dst, 1);
}

/* tun_reply6 sends a backend's packet of a flow forwarded here back through the tunnel to
 * the ingress node (a CT_TUN entry), refreshing the entry. */
static __noinline int tun_reply6(struct __sk_buff *skb, struct pkt6 *p, struct ct_val_v6 *t, int egress)
{
	struct cfg *c = config();
	struct cfg_v6 *c6 = config6();
	if (!c || !c6 || zero6(&c6->host_ip)) {
		count(C_DROP_FIB);
		return TC_ACT_SHOT;
	}
	t->last_seen = bpf_ktime_get_ns();
	tcp_track6(t, p, 1);
	struct addr6 peer = t->nat_addr;
	int rc = oversize6(skb, p, c6, egress);
	if (rc >= 0)
		return rc;
	return encap6_out(skb, p, c, c6, &peer);
}

#endif
