/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The node-port tunnel's receiving side: unwrapping, the peer check, the tunnel entry.
 * Included once per family (lib/family.h). */

#ifndef SLUICE_LIB_TUNNEL_IN_SHARED
#define SLUICE_LIB_TUNNEL_IN_SHARED

#define TUN_ICMP (-2) /* tunnel_in unwrapped an ICMP error: the caller translates it */

#endif /* SLUICE_LIB_TUNNEL_IN_SHARED */

#if FAMILY == 4

/* tun_outer_ok says whether the tunnel's outer headers are as nodes send them: without
 * options (the unwrapping takes off exactly ENCAP_LEN bytes). */
static __always_inline int tun_outer_ok(struct __sk_buff *skb, struct pkt *outer)
{
	return outer->l4 == L4_OFF;
}

#else /* FAMILY == 6 */

/* Over IPv6: without extension headers, and IPv6 inside. */
static __always_inline int tun_outer_ok6(struct __sk_buff *skb, struct pkt6 *outer)
{
	__be16 proto;
	return outer->l4 == L4_OFF6 && bpf_skb_load_bytes(skb, L4_OFF6 + 16 + 12, &proto, 2) >= 0 &&
	       proto == bpf_htons(ETH_P_IPV6);
}

#endif /* FAMILY */

/* tunnel_in takes a VXLAN packet arriving on a host interface: any from an address that is
 * no known node is dropped; node-port forwarding (our VNI) is unwrapped here, the rest is
 * left to the kernel's VXLAN device. An unwrapped ICMP error is left in in (which may be outer
 * itself, not read after that) for the caller, whose stack frame is not under this one's. */
static __noinline int FN(tunnel_in)(struct __sk_buff *skb, pkt_t *outer, struct cfg *c, pkt_t *in)
{
	struct cnet_val *peer = FN(cluster_net)(&outer->src);
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
	if (!FN(tun_outer_ok)(skb, outer)) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	pkt_t p = {};
	int bad = FN(parse)(skb, ETH_HLEN + ENCAP_HLEN, &p) < 0;
	/* A later fragment gets its first's ports before it is judged: judged without them, every
	 * later fragment through the tunnel was dropped as malformed. */
	if (!bad)
		FN(frag_track)(&p);
	if (bad || !(FN(has_ports)(&p) || p.proto == ICMP_PROTO)) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	/* FIXED_GSO: a segmented packet (the sender's GSO carried through, or the kernel's GRO
	 * merging tunnel packets) keeps its segment size, the inner one; without it the kernel
	 * adds the tunnel's 50 bytes to a TCP aggregate's and refuses a UDP one's. DECAP_L4_UDP
	 * (with DECAP_L3_IPV4; ADJ_DECAP) also drops the aggregate's tunnel GSO state, where the
	 * kernel has it (Linux 7.0); an older one refuses the flags, and the aggregate keeps that
	 * state: see docs/internals.md ("bpf", "Cross-node node ports") for what that means. */
	if ((!ADJ_DECAP ||
	     bpf_skb_adjust_room(skb, -(__s32)ENCAP_HLEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO | ADJ_DECAP) < 0) &&
	    bpf_skb_adjust_room(skb, -(__s32)ENCAP_HLEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	count(C_TUN_IN);
	p.l4 -= ENCAP_HLEN;
	if (p.proto == ICMP_PROTO) {
		*in = p;
		return TUN_ICMP;
	}
	__u64 now = bpf_ktime_get_ns();
	ct_key_t k;
	FN(ct_key)(&k, &p, 0);
	ct_val_t *v = bpf_map_lookup_elem(&CT_MAP, &k);
	if (v && v->type == CT_REV && (v->flags & CT_F_REMOTE)) {
		/* A reply to a flow this node forwarded: it must come from the backend's node. */
		if (!ADDR_EQ(v->tun_addr, outer->src)) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		return FN(reply)(skb, &p, v, 1);
	}
	/* A flow forwarded to a backend here: remember the ingress node for the replies. */
	FN(ct_key)(&k, &p, 1);
	ct_val_t *t = bpf_map_lookup_elem(&CT_MAP, &k);
	if (t && t->type == CT_TUN && ADDR_EQ(t->nat_addr, outer->src)) {
		/* The ingress node sends a SYN on a closed flow's tuple only for a new connection,
		 * which it starts afresh: so does this node, or the new flow would inherit the closed
		 * one's timeout. */
		if (FN(is_syn)(&p) && closed_state(t->tcp)) {
			t->created = now;
			t->tcp = 0;
			FN(young)(&k, now);
		}
		t->last_seen = now;
		FN(tcp_track)(t, &p, 0);
	} else if (t && !(t->type == CT_TUN && (closed_state(t->tcp) || (FN(is_syn)(&p) && !(t->tcp & TCP_REPLIED))))) {
		/* The same tuple is live from another node (or is a local flow): never merge two. A
		 * SYN takes the tuple over only from a flow that is closed or was never answered (its
		 * ingress node has given it up); one that was answered stays, and the newcomer's
		 * ingress node picks another source port when its client sends the SYN again. */
		count(C_DROP_COLLISION);
		return TC_ACT_SHOT;
	} else {
		ct_val_t nv = {.created = now, .last_seen = now, .type = CT_TUN, .nat_addr = outer->src};
		FN(tcp_track)(&nv, &p, 0);
		if (FN(ct_put)(&k, &nv, BPF_ANY) < 0)
			return TC_ACT_SHOT;
		FN(young)(&k, now);
	}
	return FN(fib_out)(skb, AARG(p.src), AARG(p.dst), 1);
}
