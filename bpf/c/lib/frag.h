/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IP fragments: later fragments translated as their first (both families), and IPv4 packets
 * too large for the tunnel cut as a router would (frag_cut, for oversize in tunnel.h).
 * Included once per family (lib/family.h). */

/* frag_track gives a later fragment of a TCP or UDP datagram the ports of its first fragment,
 * as the first fragment arrived at this hook (so it is translated as the first was), and
 * remembers a first fragment's ports. A later fragment that comes before its first is left
 * without ports: passed on untranslated, as Cilium does. A function of its own: its key is not
 * on the stack of the programs that call it. */
static __noinline void FN(frag_track)(pkt_t *p)
{
	if (!FN(is_frag)(p) || (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP))
		return;
	frag_key_t k = {.src = p->src, .dst = p->dst, .id = p->id, .proto = p->proto};
	if (!FN(later_frag)(p)) {
		struct frag_val_v4 v = {.sport = p->sport, .dport = p->dport};
		bpf_map_update_elem(&FRAG_MAP, &k, &v, BPF_ANY);
		return;
	}
	struct frag_val_v4 *v = bpf_map_lookup_elem(&FRAG_MAP, &k);
	if (!v)
		return;
	p->sport = v->sport;
	p->dport = v->dport;
	p->later = 1;
}

#if FAMILY == 4

/* Datagrams of more than CSUM_CHUNKS pieces of CSUM_CHUNK bytes (16 KB) are cut without a
 * look at their checksum: no interface carries such a packet whole. */
#define CSUM_CHUNKS 64
/* Bytes frag_csum takes out from the transport header on and puts back: more than lie before
 * the checksum's start (the Ethernet and IPv4 headers, 34). */
#define CSUM_PULL 64

/* frag_csum finishes the transport checksum of a whole TCP segment or UDP datagram about to
 * be cut when the sender left it pending (CHECKSUM_PARTIAL: a stack on this host, or one
 * behind a veth or a VM's virtio NIC, writes the pseudo-header's sum alone, and the sum is
 * finished at transmit over what the packet then holds). Cut as it was, the first part carried
 * that unfinished sum, and the receiver's stack, reassembling the datagram, dropped it as
 * corrupt (UdpInCsumErrors; TestNodePortFragmentTraffic sends such datagrams through real
 * kernels). The field tells: it holds exactly the pseudo-header's sum. The datagram is summed
 * here and its checksum written; then the bytes from the transport header on are taken out and
 * put back, which ends the kernel's pending state (a pull past the checksum's start makes the
 * packet CHECKSUM_NONE in skb_postpull_rcsum, once bpf_skb_adjust_room pulls before it calls
 * that: upstream 54c3f1a81421, Linux 6.2, and the stable series since January 2023), so
 * nothing finishes the sum again over the first part alone. A finished checksum (a NIC's
 * packet, fragments a host made) is left as it is, right or wrong. Returns 0, or -1 when the
 * packet could not be rewritten. */
static __noinline int frag_csum(struct __sk_buff *skb, struct pkt *p)
{
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return 0;
	/* 64-bit counts: a 32-bit one is compared on a copy the verifier cannot relate to it. */
	__u64 hlen = p->l4 - IP_OFF, len = p->tot_len;
	if (len < hlen + CSUM_PULL)
		return 0; /* never too large for a tunnel */
	len -= hlen;
	__u32 coff = p->l4 + (p->proto == IPPROTO_TCP ? 16 : 6);
	__u16 check;
	if (bpf_skb_load_bytes(skb, coff, &check, 2) < 0)
		return -1;
	if (p->proto == IPPROTO_UDP && check == 0)
		return 0; /* sent without a checksum */
	__s64 cs = csum_pseudo(&p->src, &p->dst, len, p->proto);
	if (check != (__u16)~csum_fold(cs))
		return 0;
	__u32 zero = 0;
	struct quote_buf *b = bpf_map_lookup_elem(&sl_scratch, &zero);
	if (!b)
		return -1;
	/* Whole pieces, then the rest: one way through each turn, so the verifier follows the
	 * loop once, not once for every way the pieces could fall. */
	__u64 pieces = len / CSUM_CHUNK, rest = len % CSUM_CHUNK;
	if (pieces > CSUM_CHUNKS)
		return 0;
	for (int i = 0; i < CSUM_CHUNKS && i < pieces; i++) {
		if (bpf_skb_load_bytes(skb, p->l4 + i * CSUM_CHUNK, b->b, CSUM_CHUNK) < 0)
			return -1;
		cs = bpf_csum_diff(0, 0, (__be32 *)b->b, CSUM_CHUNK, cs);
	}
	if (rest) {
		*(__u32 *)(b->b + (rest & (CSUM_CHUNK - 4))) = 0; /* summed in words of 4 */
		/* rest again, but provably 1 to CSUM_CHUNK in the register the call reads: Linux
		 * 5.10's verifier does not carry "rest != 0" over to a copy, and refuses a length
		 * that may be 0 ("invalid access to map value, size=0"). */
		__u64 n = ((rest - 1) & (CSUM_CHUNK - 1)) + 1;
		if (bpf_skb_load_bytes(skb, p->l4 + pieces * CSUM_CHUNK, b->b, n) < 0)
			return -1;
		__u64 rest4 = (rest + 3) & (2 * CSUM_CHUNK - 4);
		if (rest4 > CSUM_CHUNK)
			rest4 = CSUM_CHUNK;
		cs = bpf_csum_diff(0, 0, (__be32 *)b->b, rest4, cs);
	}
	/* The sum took the field in: it comes out again (a word of the same alignment). */
	__u8 w[4] = {};
	__builtin_memcpy(w, &check, 2);
	__u16 sum = csum_fold(bpf_csum_diff((__be32 *)w, 4, 0, 0, cs));
	if (p->proto == IPPROTO_UDP && sum == 0)
		sum = 0xffff; /* 0 would say none */
	if (bpf_skb_store_bytes(skb, coff, &sum, 2, 0) < 0 || bpf_skb_load_bytes(skb, p->l4, b->b, CSUM_PULL) < 0 ||
	    bpf_skb_adjust_room(skb, -CSUM_PULL, BPF_ADJ_ROOM_NET, 0) < 0 ||
	    bpf_skb_adjust_room(skb, CSUM_PULL, BPF_ADJ_ROOM_NET, 0) < 0 ||
	    bpf_skb_store_bytes(skb, p->l4, b->b, CSUM_PULL, 0) < 0)
		return -1;
	return 0;
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

/* frag_cut handles a packet too large for the tunnel that may be fragmented (no DF, oversize):
 * cut (frag_split), unless it is segmented (gso), whose segments would each need cutting. */
static __always_inline int frag_cut(struct __sk_buff *skb, struct pkt *p, struct cfg *c, __u32 gso, int egress)
{
	if (gso) {
		count(C_DROP_TOO_BIG);
		return TC_ACT_SHOT;
	}
	/* Only a whole datagram can carry a pending checksum: a stack finishes it before it
	 * fragments. Called before frag_split, not from it: the two frames never stack. */
	if (!(p->frag & (IP_MF | IP_OFFMASK)) && frag_csum(skb, p) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return frag_split(skb, p, c, egress);
}

#endif /* FAMILY == 4 */
