/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The IPv6 node-port tunnel: IPv6 flows forwarded to an endpoint's node in VXLAN over the
 * nodes' IPv6 underlay (tunnel.h and tunnel_in.h for IPv6; inner and outer IPv6, so no
 * kernel has to switch the packet's protocol on the way in or out). */
#ifndef SLUICE_LIB_TUNNEL6_H
#define SLUICE_LIB_TUNNEL6_H

#define ENCAP6_LEN (IP6_HLEN + sizeof(struct udphdr) + 8 + ETH_HLEN)

/* is_v6_node says whether a node address in an IPv6 entry is an IPv6 one (not IPv4-mapped,
 * not unset): only such nodes are reached through the IPv6 tunnel. */
static __always_inline int is_v6_node(const struct addr6 *a)
{
	return !zero6(a) && !(a->w[0] == 0 && a->w[1] == 0 && a->w[2] == bpf_htonl(0xffff));
}

/* encap6 wraps the packet in VXLAN over IPv6 to the node at dst: 0 when done, a verdict when
 * not. The outer UDP checksum is 0, as RFC 6935 allows a tunnel: the far end is sluice's own
 * program, which accepts it (the inner packet carries its own checksum). */
static __noinline int encap6(struct __sk_buff *skb, struct pkt6 *p, struct cfg *c, struct cfg_v6 *c6,
			     const struct addr6 *dst)
{
	__u32 inner = skb->len - ETH_HLEN;
	__u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN) |
		      BPF_F_ADJ_ROOM_FIXED_GSO;
	if (bpf_skb_adjust_room(skb, ENCAP6_LEN, BPF_ADJ_ROOM_MAC, flags | BPF_F_ADJ_ROOM_ENCAP_L2_ETH) < 0 &&
	    bpf_skb_adjust_room(skb, ENCAP6_LEN, BPF_ADJ_ROOM_MAC, flags) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	struct {
		struct ipv6hdr ip;
		struct udphdr udp;
		__u8 vxlan[8];
		struct ethhdr eth;
	} __attribute__((packed)) h = {};
	__u32 len = inner + ENCAP6_LEN - IP6_HLEN;
	struct ipv6hdr ip = {};
	ip6_answer(&ip, IPPROTO_UDP, len, &c6->host_ip, dst);
	__builtin_memcpy(&h.ip, &ip, sizeof(ip));
	/* The source port spreads flows over ECMP paths and receive queues, as VXLAN does. */
	__u32 hash = p->src.w[3] ^ p->dst.w[3] ^ ((__u32)p->sport << 16 | p->dport);
	hash ^= hash >> 16;
	h.udp.source = bpf_htons(0xc000 | (hash & 0x3fff));
	h.udp.dest = c->vxlan_port;
	h.udp.len = bpf_htons(len);
	h.vxlan[0] = 0x08;
	h.vxlan[4] = (c->vni >> 16) & 0xff;
	h.vxlan[5] = (c->vni >> 8) & 0xff;
	h.vxlan[6] = c->vni & 0xff;
	h.eth.h_proto = bpf_htons(ETH_P_IPV6);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return 0;
}

/* oversize6 answers a packet that cannot cross the IPv6 tunnel whole with Packet Too Big:
 * IPv6 routers never fragment, so this is how the client learns the path's MTU. Out of the
 * interface it came in by, or on an egress hook up into the host's own stack. -1 when it
 * fits; a segmented packet is judged by one segment, as oversize does. */
static __always_inline int oversize6(struct __sk_buff *skb, struct pkt6 *p, struct cfg_v6 *c6, int egress)
{
	__u32 len = IP6_HLEN + p->len;
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
	if (len <= c6->tunnel_mtu)
		return -1;
	int rc = icmp6_back(skb, p, ICMP6(ICMP6_PKT_TOO_BIG, 0), c6->tunnel_mtu, egress ? BPF_F_INGRESS : 0);
	if (rc == TC_ACT_REDIRECT)
		count(C_ICMP_TOO_BIG);
	return rc;
}

/* encap6_out wraps the packet and sends it to the node at dst (two calls of the caller's, so
 * their frames do not stack). */
static __always_inline int encap6_out(struct __sk_buff *skb, struct pkt6 *p, struct cfg *c, struct cfg_v6 *c6,
				      const struct addr6 *dst)
{
	int rc = encap6(skb, p, c, c6, dst);
	if (rc)
		return rc;
	return fib_out6(skb, &c6->host_ip, dst, 0);
}

#endif
