/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Load balancing of IPv6 flows: lb.h's rules on the IPv6 maps. */
#ifndef SLUICE_LIB_LB6_H
#define SLUICE_LIB_LB6_H

/* in_set6 is in_set4 for an IPv6 list. */
static __noinline struct be_val_v6 *in_set6(struct fe_val *fe, __u32 start, __u32 end, struct addr6 *addr,
						 __be16 port)
{
	struct be_key bk = {.list_id = fe->list_id};
	struct be_val_v6 *be;
	if (fe->count <= AFF_SCAN) {
		for (__u32 i = 0; i < AFF_SCAN; i++) {
			if (start + i >= end)
				break;
			bk.ordinal = start + i;
			be = bpf_map_lookup_elem(&sl_be_v6, &bk);
			if (be && eq6(&be->addr, addr) && be->port == port)
				return be;
		}
		return 0;
	}
	struct be_idx_key_v6 ik = {.list_id = fe->list_id, .addr = *addr, .port = port};
	__u32 *ord = bpf_map_lookup_elem(&sl_be_idx_v6, &ik);
	if (!ord || *ord < start || *ord >= end)
		return 0;
	bk.ordinal = *ord;
	be = bpf_map_lookup_elem(&sl_be_v6, &bk);
	return be && eq6(&be->addr, addr) && be->port == port ? be : 0;
}

/* pick6 chooses a backend of [start, end) for a new flow, keeping client-IP affinity (pick). */
static __always_inline struct be_val_v6 *pick6(struct fe_key_v6 *fk, struct fe_val *fe, __u32 start, __u32 end,
					       const struct addr6 *client, __u64 now)
{
	struct be_key bk = {.list_id = fe->list_id};
	struct be_val_v6 *be;
	__u32 n = end - start;
	if (fe->affinity_sec) {
		struct aff_key_v6 ak = {.fe_addr = fk->addr, .fe_port = fk->port, .proto = fk->proto, .client = *client};
		struct aff_val_v6 *a = bpf_map_lookup_elem(&sl_aff_v6, &ak);
		if (a && now - a->seen < (__u64)fe->affinity_sec * NSEC) {
			be = in_set6(fe, start, end, &a->addr, a->port);
			if (be) {
				a->seen = now;
				return be;
			}
		}
		bk.ordinal = start + bpf_get_prandom_u32() % n;
		be = bpf_map_lookup_elem(&sl_be_v6, &bk);
		if (be) {
			struct aff_val_v6 av = {.seen = now, .addr = be->addr, .port = be->port};
			bpf_map_update_elem(&sl_aff_v6, &ak, &av, BPF_ANY);
		}
		return be;
	}
	bk.ordinal = start + bpf_get_prandom_u32() % n;
	return bpf_map_lookup_elem(&sl_be_v6, &bk);
}

/* lookup_frontend6 finds the frontend of a packet: the exact address:port, then (for one of
 * this node's own addresses) a node port's wildcard entry (lookup_frontend). */
static __always_inline struct fe_val *lookup_frontend6(struct __sk_buff *skb, struct pkt6 *p, struct fe_key_v6 *fk)
{
	fk->addr = p->dst;
	fk->port = p->dport;
	fk->proto = p->proto;
	fk->pad = 0;
	struct fe_val *fe = bpf_map_lookup_elem(&sl_fe_v6, fk);
	if (fe)
		return fe;
	__builtin_memset(&fk->addr, 0, sizeof(fk->addr));
	fe = bpf_map_lookup_elem(&sl_fe_v6, fk);
	if (!fe)
		return 0;
	struct cnet_val *cn = cluster_net6(&p->dst);
	int self = cn && (cn->flags & CNET_SELF);
	if (!self) {
		struct bpf_fib_lookup fib = {};
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_src, &p->src, 16);
		__builtin_memcpy(fib.ipv6_dst, &p->dst, 16);
		fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
		self = bpf_fib_lookup(skb, &fib, sizeof(fib), 0) == BPF_FIB_LKUP_RET_NOT_FWDED;
	}
	return self ? fe : 0;
}

#endif
