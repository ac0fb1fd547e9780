/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The node-port tunnel's sending side: VXLAN encapsulation towards another node, and what is
 * too large for it. Included once per family (lib/family.h): IPv4 flows go in VXLAN over the
 * nodes' IPv4 underlay, IPv6 flows over their IPv6 underlay (inner and outer of one family, so
 * no kernel has to switch the packet's protocol on the way in or out). */

#if FAMILY == 6

/* is_v6_node says whether a node address in an IPv6 entry is an IPv6 one (not IPv4-mapped,
 * not unset): only such nodes are reached through the IPv6 tunnel. */
static __always_inline int is_v6_node(const struct addr6 *a)
{
	return !zero6(a) && !(a->w[0] == 0 && a->w[1] == 0 && a->w[2] == bpf_htonl(0xffff));
}

#endif

/* encap wraps the packet (IP header at the standard offset) in VXLAN to the node at dst, from
 * this node's underlay address (tc: the family's tunnel settings; c: the VNI and port): 0 when
 * done, a verdict (drop) when it cannot be. Over IPv6 the outer UDP checksum is 0, as RFC 6935
 * allows a tunnel: the far end is sluice's own program, which accepts it (the inner packet
 * carries its own checksum). */
static __noinline int FN(encap)(struct __sk_buff *skb, pkt_t *p, struct cfg *c, tun_cfg_t *tc, addr_arg_t dst)
{
	__u32 inner = skb->len - ETH_HLEN;
	/* FIXED_GSO: a segmented packet keeps its segment size (oversize judged it against the
	 * tunnel MTU); without it the kernel shrinks TCP segments and refuses UDP ones (UDP-GSO's
	 * segment size delimits datagrams). */
	__u64 flags = ADJ_ENCAP_L3 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN) |
		      BPF_F_ADJ_ROOM_FIXED_GSO;
	/* ENCAP_L2_ETH (the inner protocol is Ethernet) is Linux 5.12's: an older kernel refuses
	 * the flag, and takes the rest; its GSO then segments the inner IP packet behind the
	 * inner Ethernet header all the same (inner_mac_len is set). */
	if (bpf_skb_adjust_room(skb, ENCAP_HLEN, BPF_ADJ_ROOM_MAC, flags | BPF_F_ADJ_ROOM_ENCAP_L2_ETH) < 0 &&
	    bpf_skb_adjust_room(skb, ENCAP_HLEN, BPF_ADJ_ROOM_MAC, flags) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	/* Not packed (the IP header is filled in place): ENCAP_HLEN bytes of it are the headers,
	 * the rest is the struct's tail padding. */
	struct {
		iphdr_t ip;
		struct udphdr udp;
		__u8 vxlan[8];
		struct ethhdr eth;
	} h = {};
	__u32 len = inner + ENCAP_HLEN - sizeof(iphdr_t);
	FN(ip_answer)(&h.ip, IPPROTO_UDP, len, &tc->host_ip, APTR(dst));
	/* The source port spreads flows over ECMP paths and receive queues, as VXLAN does. */
	__u32 hash = ADDR_HASH(p->src) ^ ADDR_HASH(p->dst) ^ ((__u32)p->sport << 16 | p->dport);
	hash ^= hash >> 16;
	h.udp.source = bpf_htons(0xc000 | (hash & 0x3fff));
	h.udp.dest = c->vxlan_port;
	h.udp.len = bpf_htons(len);
	h.vxlan[0] = 0x08;
	h.vxlan[4] = (c->vni >> 16) & 0xff;
	h.vxlan[5] = (c->vni >> 8) & 0xff;
	h.vxlan[6] = c->vni & 0xff;
	h.eth.h_proto = bpf_htons(ETH_P_FAMILY);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &h, ENCAP_HLEN, 0) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return 0;
}

/* encap_out wraps the packet and sends it to the node at dst. The two steps are two calls of
 * the caller's: one after the other, their stack frames are not stacked. */
static __always_inline int FN(encap_out)(struct __sk_buff *skb, pkt_t *p, tun_cfg_t *tc, addr_arg_t dst)
{
	struct cfg *c = VXLAN_CFG(tc);
	if (!c) {
		count(C_DROP_FIB);
		return TC_ACT_SHOT;
	}
	int rc = FN(encap)(skb, p, c, tc, dst);
	if (rc)
		return rc;
	return FN(fib_out)(skb, AARG(tc->host_ip), dst, 0);
}

/* oversize answers a packet that cannot cross the tunnel whole. An IPv4 packet that may be
 * fragmented (no DF) is cut (frag_cut); any other gets fragmentation-needed (IPv6: Packet Too
 * Big, IPv6 routers never fragment; this is how the client learns the path's MTU) back: out of
 * the interface it came in by, or, on an egress hook, up into the host's own stack that sent
 * it. It returns -1 when the packet (or its first part) fits. A segmented packet (GSO: a local
 * stack's, or GRO's merge of received ones) is cut after encapsulation with its segment size
 * kept (BPF_F_ADJ_ROOM_FIXED_GSO), so one segment must fit: judged by gso_size, as the
 * kernel's forwarding judges it (gso_segs is no guide: VM tap devices leave it 0). */
static __always_inline int FN(oversize)(struct __sk_buff *skb, pkt_t *p, tun_cfg_t *tc, int egress)
{
	if (!tc) {
		count(C_DROP_TOO_BIG);
		return TC_ACT_SHOT;
	}
	__u32 len = FN(ip_len)(p);
	__u32 gso = skb->gso_size;
	if (gso) {
		__u32 l4 = sizeof(struct udphdr);
		if (p->proto == IPPROTO_TCP) {
			__u8 doff;
			if (bpf_skb_load_bytes(skb, p->l4 + 12, &doff, 1) < 0)
				return TC_ACT_SHOT;
			l4 = (doff >> 4) * 4;
		}
		len = (p->l4 - IP_OFF) + l4 + gso;
	}
	if (len <= tc->tunnel_mtu)
		return -1;
#if FAMILY == 4
	if (!(p->frag & IP_DF))
		return frag_cut(skb, p, tc, gso, egress);
#endif
	return FN(too_big_back)(skb, p, tc->tunnel_mtu, egress ? BPF_F_INGRESS : 0);
}
