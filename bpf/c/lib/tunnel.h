/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The node-port tunnel's sending side: VXLAN encapsulation towards another node. */
#ifndef SLUICE_LIB_TUNNEL_H
#define SLUICE_LIB_TUNNEL_H

/* encap wraps the packet (IP header at the standard offset) in VXLAN to the node at dst:
 * 0 when done, a verdict (drop) when it cannot be. */
static __noinline int encap(struct __sk_buff *skb, struct pkt *p, struct cfg *c, __be32 dst)
{
	__u32 inner = skb->len - ETH_HLEN;
	/* FIXED_GSO: a segmented packet keeps its segment size (oversize judged it against the
	 * tunnel MTU); without it the kernel shrinks TCP segments and refuses UDP ones (UDP-GSO's
	 * segment size delimits datagrams). */
	__u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN) |
		      BPF_F_ADJ_ROOM_FIXED_GSO;
	/* ENCAP_L2_ETH (the inner protocol is Ethernet) is Linux 5.12's: an older kernel refuses
	 * the flag, and takes the rest; its GSO then segments the inner IP packet behind the
	 * inner Ethernet header all the same (inner_mac_len is set). */
	if (bpf_skb_adjust_room(skb, ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags | BPF_F_ADJ_ROOM_ENCAP_L2_ETH) < 0 &&
	    bpf_skb_adjust_room(skb, ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	struct {
		struct iphdr ip;
		struct udphdr udp;
		__u8 vxlan[8];
		struct ethhdr eth;
	} __attribute__((packed)) h = {};
	h.ip.version = 4;
	h.ip.ihl = 5;
	h.ip.ttl = 64;
	h.ip.protocol = IPPROTO_UDP;
	h.ip.tot_len = bpf_htons(inner + ENCAP_LEN);
	h.ip.saddr = c->host_ip;
	h.ip.daddr = dst;
	h.ip.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)&h, sizeof(h.ip), 0));
	/* The source port spreads flows over ECMP paths and receive queues, as VXLAN does. */
	__u32 hash = p->src ^ p->dst ^ ((__u32)p->sport << 16 | p->dport);
	hash ^= hash >> 16;
	h.udp.source = bpf_htons(0xc000 | (hash & 0x3fff));
	h.udp.dest = c->vxlan_port;
	h.udp.len = bpf_htons(inner + ENCAP_LEN - sizeof(struct iphdr));
	h.vxlan[0] = 0x08;
	h.vxlan[4] = (c->vni >> 16) & 0xff;
	h.vxlan[5] = (c->vni >> 8) & 0xff;
	h.vxlan[6] = c->vni & 0xff;
	h.eth.h_proto = bpf_htons(ETH_P_IP);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return 0;
}

/* encap_out wraps the packet and sends it to the node at dst. The two steps are two calls of
 * the caller's: one after the other, their stack frames are not stacked. */
static __always_inline int encap_out(struct __sk_buff *skb, struct pkt *p, struct cfg *c, __be32 dst)
{
	int rc = encap(skb, p, c, dst);
	if (rc)
		return rc;
	return fib_out(skb, c->host_ip, dst, 0);
}

#endif
