/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection tracking of IPv6 flows: conntrack.h's rules (the state bits are shared) on the
 * IPv6 table. */
#ifndef SLUICE_LIB_CONNTRACK6_H
#define SLUICE_LIB_CONNTRACK6_H

static __always_inline void tcp_track6(struct ct_val_v6 *v, struct pkt6 *p, int reply)
{
	__u8 t = tcp_next(v->tcp, p->proto, p->tcp_flags, reply);
	if (t != v->tcp)
		v->tcp = t;
}

static __always_inline int is_syn6(struct pkt6 *p)
{
	return syn_only(p->proto, p->tcp_flags);
}

/* ct_key6 is the key of p's tuple as it travels (rev 0) or turned round (rev 1). */
static __always_inline void ct_key6(struct ct_key_v6 *k, struct pkt6 *p, int rev)
{
	k->src = rev ? p->dst : p->src;
	k->dst = rev ? p->src : p->dst;
	k->sport = rev ? p->dport : p->sport;
	k->dport = rev ? p->sport : p->dport;
	k->proto = p->proto;
	k->pad[0] = k->pad[1] = k->pad[2] = 0;
}

/* ct_forget6 deletes a reverse or tunnel entry and, for a reverse entry, its forward pair. */
static __noinline void ct_forget6(struct ct_key_v6 *k, struct ct_val_v6 *v)
{
	if (v->type == CT_REV) {
		struct ct_key_v6 fk = {.dst = v->nat_addr, .sport = v->nat_sport, .dport = v->nat_port, .proto = k->proto};
		fk.src = zero6(&v->nat_saddr) ? k->dst : v->nat_saddr;
		bpf_map_delete_elem(&sl_ct_v6, &fk);
	}
	bpf_map_delete_elem(&sl_ct_v6, k);
}

static __always_inline void ct_drop6(struct ct_key_v6 *k, struct ct_val_v6 *v)
{
	ct_forget6(k, v);
	count(C_CT_SUPERSEDED);
}

/* young6 is young (conntrack.h) for the IPv6 table: its own ring, of the same size. */
static __noinline void young6(struct ct_key_v6 *k, __u64 created)
{
	__u32 zero = 0;
	__u32 *pos = bpf_map_lookup_elem(&sl_ct_young_pos6, &zero);
	if (!pos)
		return;
	__u32 i = *pos;
	struct ct_young_v6 *y = bpf_map_lookup_elem(&sl_ct_young_v6, &i);
	if (!y) {
		i = 0;
		y = bpf_map_lookup_elem(&sl_ct_young_v6, &i);
		if (!y)
			return;
	}
	*pos = i + 1;
	if (y->created && y->key.proto == IPPROTO_TCP) {
		struct ct_val_v6 *v = bpf_map_lookup_elem(&sl_ct_v6, &y->key);
		if (v && v->created == y->created && (v->type == CT_REV || v->type == CT_TUN) &&
		    !established_state(v->tcp, y->key.proto)) {
			ct_forget6(&y->key, v);
			count(C_CT_EVICTED);
		}
	}
	y->key = *k;
	y->created = created;
}

/* stale_reply6: stale_reply (conntrack.h) for IPv6. */
static __always_inline int stale_reply6(struct pkt6 *p, struct ct_key_v6 *k, struct ct_val_v6 *v)
{
	if (!(is_syn6(p) || (syn_ack(p->proto, p->tcp_flags) && closed_state(v->tcp))))
		return 0;
	ct_drop6(k, v);
	return 1;
}

/* supersede6: supersede (conntrack.h) for IPv6. */
static __always_inline void supersede6(struct pkt6 *p)
{
	if (!is_syn6(p))
		return;
	struct ct_key_v6 rk;
	ct_key6(&rk, p, 1);
	struct ct_val_v6 *v = bpf_map_lookup_elem(&sl_ct_v6, &rk);
	if (v && (v->type == CT_REV || v->type == CT_TUN))
		ct_drop6(&rk, v);
}

static __always_inline int ct_put6(struct ct_key_v6 *k, struct ct_val_v6 *v, __u64 flags)
{
	long rc = bpf_map_update_elem(&sl_ct_v6, k, v, flags);
	if (rc == -17 /* EEXIST */) {
		count(C_DROP_COLLISION);
		return -1;
	}
	if (rc < 0) {
		count(C_DROP_CT_FULL);
		return -1;
	}
	return 0;
}

/* frag_track6 gives a later fragment the ports of its first, as frag_track does for IPv4. */
static __noinline void frag_track6(struct pkt6 *p)
{
	if (!(p->frag & F6_FRAG) || (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP))
		return;
	struct frag_key_v6 k = {.src = p->src, .dst = p->dst, .id = p->id, .proto = p->proto};
	if (!(p->frag & F6_LATER)) {
		struct frag_val_v4 v = {.sport = p->sport, .dport = p->dport};
		bpf_map_update_elem(&sl_frag_v6, &k, &v, BPF_ANY);
		return;
	}
	struct frag_val_v4 *v = bpf_map_lookup_elem(&sl_frag_v6, &k);
	if (!v)
		return;
	p->sport = v->sport;
	p->dport = v->dport;
	p->later = 1;
}

#endif
