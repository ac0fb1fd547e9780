/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IP fragments: later fragments translated as their first, and packets too large for the
 * tunnel cut as a router would (or answered with fragmentation-needed). */
#ifndef SLUICE_LIB_FRAG_H
#define SLUICE_LIB_FRAG_H

/* frag_track gives a later fragment of a TCP or UDP datagram the ports of its first fragment,
 * as the first fragment arrived at this hook (so it is translated as the first was), and
 * remembers a first fragment's ports. A later fragment that comes before its first is left
 * without ports: passed on untranslated, as Cilium does. */
static __always_inline void frag_track(struct pkt *p)
{
	if (!(p->frag & (IP_MF | IP_OFFMASK)) || (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP))
		return;
	struct frag_key_v4 k = {.src = p->src, .dst = p->dst, .id = p->id, .proto = p->proto};
	if (!(p->frag & IP_OFFMASK)) {
		struct frag_val_v4 v = {.sport = p->sport, .dport = p->dport};
		bpf_map_update_elem(&sl_frag_v4, &k, &v, BPF_ANY);
		return;
	}
	struct frag_val_v4 *v = bpf_map_lookup_elem(&sl_frag_v4, &k);
	if (!v)
		return;
	p->sport = v->sport;
	p->dport = v->dport;
	p->later = 1;
}

/* frag_split cuts a packet too large for the tunnel that may be fragmented (no DF) in two,
 * as a router fragments: the packet becomes the first part, which fits, and the caller goes on
 * with it (-1); a copy marked with the reserved flag goes back into this hook (the same
 * interface, the same direction), where frag_rest makes it the rest of the datagram: a later
 * fragment, translated as the first part was, cut again if it is still too large. Only a
 * 20-byte header is cut (options would have to be sorted into those copied and those not). */
static __noinline int frag_split(struct __sk_buff *skb, struct pkt *p, struct cfg *c, int egress)
{
	__u32 hlen = p->l4 - IP_OFF;
	__u32 cut = (c->tunnel_mtu - sizeof(struct iphdr)) & ~7;
	if (hlen != sizeof(struct iphdr) || cut < 8 || p->tot_len <= hlen + cut) {
		count(C_DROP_TOO_BIG);
		return TC_ACT_SHOT;
	}
	if (!(p->frag & IP_OFFMASK) && (p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP)) {
		/* The rest carries no ports: it finds the first part's, as any later fragment does. */
		struct frag_key_v4 k = {.src = p->src, .dst = p->dst, .id = p->id, .proto = p->proto};
		struct frag_val_v4 v = {.sport = p->sport, .dport = p->dport};
		bpf_map_update_elem(&sl_frag_v4, &k, &v, BPF_ANY);
	}
	__be16 old = bpf_htons(p->frag), marked = bpf_htons(p->frag | IP_RF);
	if (bpf_l3_csum_replace(skb, IP_OFF + 10, old, marked, 2) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 6, &marked, 2, 0) < 0 ||
	    bpf_clone_redirect(skb, skb->ifindex, egress ? 0 : BPF_F_INGRESS) < 0) {
		count(C_DROP_TOO_BIG);
		return TC_ACT_SHOT;
	}
	__u16 frag = (p->frag & ~IP_RF) | IP_MF, tot = hlen + cut;
	__be16 nfrag = bpf_htons(frag), otot = bpf_htons(p->tot_len), ntot = bpf_htons(tot);
	if (bpf_l3_csum_replace(skb, IP_OFF + 10, marked, nfrag, 2) < 0 ||
	    bpf_l3_csum_replace(skb, IP_OFF + 10, otot, ntot, 2) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 6, &nfrag, 2, 0) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 2, &ntot, 2, 0) < 0 ||
	    bpf_skb_change_tail(skb, ETH_HLEN + tot, 0) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	p->frag = frag;
	p->tot_len = tot;
	count(C_FRAG_SPLIT);
	return -1;
}

/* frag_rest makes a copy frag_split marked the rest of its datagram: the bytes the first part
 * carries are taken out and the header says where the rest begins. Returns -1 when the packet
 * is that rest (reparsed into p), a verdict otherwise. */
static __noinline int frag_rest(struct __sk_buff *skb, struct pkt *p, struct cfg *c)
{
	__u32 hlen = p->l4 - IP_OFF;
	__u32 cut = (c->tunnel_mtu - sizeof(struct iphdr)) & ~7;
	if (hlen != sizeof(struct iphdr) || cut < 8 || p->tot_len <= hlen + cut) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	__u16 frag = (((p->frag & IP_OFFMASK) + cut / 8) & IP_OFFMASK) | (p->frag & IP_MF), tot = p->tot_len - cut;
	__be16 ofrag = bpf_htons(p->frag), nfrag = bpf_htons(frag), otot = bpf_htons(p->tot_len), ntot = bpf_htons(tot);
	if (bpf_skb_adjust_room(skb, -(__s32)cut, BPF_ADJ_ROOM_NET, 0) < 0 ||
	    bpf_l3_csum_replace(skb, IP_OFF + 10, ofrag, nfrag, 2) < 0 ||
	    bpf_l3_csum_replace(skb, IP_OFF + 10, otot, ntot, 2) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 6, &nfrag, 2, 0) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + 2, &ntot, 2, 0) < 0 || parse(skb, IP_OFF, p) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return -1;
}

/* oversize answers a packet that cannot cross the tunnel whole: one that may be fragmented
 * (no DF) is cut (frag_split), one that may not gets fragmentation-needed back: out of the
 * interface it came in by, or, on an egress hook, up into the host's own stack that sent it.
 * It returns -1 when the packet (or its first part) fits. A segmented packet (GSO: a local
 * stack's, or GRO's merge of received ones) is cut after encapsulation with its segment size
 * kept (BPF_F_ADJ_ROOM_FIXED_GSO), so one segment must fit: judged by gso_size, as the
 * kernel's forwarding judges it (gso_segs is no guide: VM tap devices leave it 0). */
static __always_inline int oversize(struct __sk_buff *skb, struct pkt *p, struct cfg *c, int egress)
{
	if (!c) {
		count(C_DROP_TOO_BIG);
		return TC_ACT_SHOT;
	}
	__u32 len = p->tot_len;
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
	if (len <= c->tunnel_mtu)
		return -1;
	if (!(p->frag & IP_DF)) {
		if (gso) {
			count(C_DROP_TOO_BIG);
			return TC_ACT_SHOT;
		}
		return frag_split(skb, p, c, egress);
	}
	return too_big_back(skb, p, c->tunnel_mtu, egress ? BPF_F_INGRESS : 0);
}

#endif
