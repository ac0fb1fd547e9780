/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The node-port tunnel's receiving side: unwrapping, the peer check, the tunnel entry. */
#ifndef SLUICE_LIB_TUNNEL_IN_H
#define SLUICE_LIB_TUNNEL_IN_H

#define TUN_ICMP (-2) /* tunnel_in unwrapped an ICMP error: the caller translates it */

/* tunnel_in takes a VXLAN packet arriving on a host interface: any from an address that is
 * no known node is dropped; node-port forwarding (our VNI) is unwrapped here, the rest is
 * left to the kernel's VXLAN device. An unwrapped ICMP error is left in in (which may be outer
 * itself, not read after that) for the caller, whose stack frame is not under this one's. */
static __noinline int tunnel_in(struct __sk_buff *skb, struct pkt *outer, struct cfg *c, struct pkt *in)
{
	struct cnet_val *peer = cluster_net(outer->src);
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
	if (outer->l4 != L4_OFF) {
		/* Nodes send the tunnel's outer header without options; the unwrapping below
		 * takes off exactly ENCAP_LEN bytes. */
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	struct pkt p = {};
	int bad = parse(skb, ETH_HLEN + ENCAP_LEN, &p) < 0;
	if (!bad)
		frag_track(&p);
	if (bad || !(is_l4(&p) || p.proto == IPPROTO_ICMP)) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	/* FIXED_GSO: a segmented packet (the sender's GSO carried through, or the kernel's GRO
	 * merging tunnel packets) keeps its segment size, the inner one; without it the kernel
	 * adds the tunnel's 50 bytes to a TCP aggregate's and refuses a UDP one's. DECAP_L4_UDP
	 * (with DECAP_L3_IPV4) also drops the aggregate's tunnel GSO state, where the kernel has
	 * it (Linux 7.0); an older one refuses the flags, and the aggregate keeps that state: see
	 * docs/internals.md ("bpf", "Cross-node node ports") for what that means. */
	if (bpf_skb_adjust_room(skb, -(__s32)ENCAP_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | ADJ_ROOM_DECAP_L3_IPV4 | ADJ_ROOM_DECAP_L4_UDP) < 0 &&
	    bpf_skb_adjust_room(skb, -(__s32)ENCAP_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	count(C_TUN_IN);
	p.l4 -= ENCAP_LEN;
	if (p.proto == IPPROTO_ICMP) {
		*in = p;
		return TUN_ICMP;
	}
	__u64 now = bpf_ktime_get_ns();
	struct ct_key_v4 k = {.src = p.src, .dst = p.dst, .sport = p.sport, .dport = p.dport, .proto = p.proto};
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &k);
	if (v && v->type == CT_REV && (v->flags & CT_F_REMOTE)) {
		/* A reply to a flow this node forwarded: it must come from the backend's node. */
		if (v->tun_addr != outer->src) {
			count(C_DROP_FORGED_TUNNEL);
			return TC_ACT_SHOT;
		}
		return reply(skb, &p, v, 1);
	}
	/* A flow forwarded to a backend here: remember the ingress node for the replies. */
	struct ct_key_v4 tk = {.src = p.dst, .dst = p.src, .sport = p.dport, .dport = p.sport, .proto = p.proto};
	struct ct_val_v4 *t = bpf_map_lookup_elem(&sl_ct_v4, &tk);
	if (t && t->type == CT_TUN && t->nat_addr == outer->src) {
		/* The ingress node sends a SYN on a closed flow's tuple only for a new connection,
		 * which it starts afresh: so does this node, or the new flow would inherit the closed
		 * one's timeout. */
		if (is_syn(&p) && closed(t)) {
			t->created = now;
			t->tcp = 0;
			young(&tk, now);
		}
		t->last_seen = now;
		tcp_track(t, &p, 0);
	} else if (t && !(t->type == CT_TUN && (closed(t) || (is_syn(&p) && !(t->tcp & TCP_REPLIED))))) {
		/* The same tuple is live from another node (or is a local flow): never merge two. A
		 * SYN takes the tuple over only from a flow that is closed or was never answered (its
		 * ingress node has given it up); one that was answered stays, and the newcomer's
		 * ingress node picks another source port when its client sends the SYN again. */
		count(C_DROP_COLLISION);
		return TC_ACT_SHOT;
	} else {
		struct ct_val_v4 nv = {.created = now, .last_seen = now, .type = CT_TUN, .nat_addr = outer->src};
		tcp_track(&nv, &p, 0);
		if (ct_put(&tk, &nv, BPF_ANY) < 0)
			return TC_ACT_SHOT;
		young(&tk, now);
	}
	return fib_out(skb, p.src, p.dst, 1);
}

#endif
