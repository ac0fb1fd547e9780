/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Load balancing: finding a packet's frontend and picking a backend (client-IP affinity). */
#ifndef SLUICE_LIB_LB_H
#define SLUICE_LIB_LB_H

/* in_set4 finds the endpoint addr:port in [start, end) of a frontend's list: a list of up to
 * AFF_SCAN entries read whole, a longer one by its index, the entry found there checked. 0
 * when the set does not hold it. Client-IP affinity and the sockets' remembered backends. */
static __noinline struct be_val_v4 *in_set4(struct fe_val *fe, __u32 start, __u32 end, __be32 addr, __be16 port)
{
	struct be_key bk = {.list_id = fe->list_id};
	struct be_val_v4 *be;
	if (fe->count <= AFF_SCAN) {
		for (__u32 i = 0; i < AFF_SCAN; i++) {
			if (start + i >= end)
				break;
			bk.ordinal = start + i;
			be = bpf_map_lookup_elem(&sl_be_v4, &bk);
			if (be && be->addr == addr && be->port == port)
				return be;
		}
		return 0;
	}
	struct be_idx_key_v4 ik = {.list_id = fe->list_id, .addr = addr, .port = port};
	__u32 *ord = bpf_map_lookup_elem(&sl_be_idx_v4, &ik);
	if (!ord || *ord < start || *ord >= end)
		return 0;
	bk.ordinal = *ord;
	be = bpf_map_lookup_elem(&sl_be_v4, &bk);
	return be && be->addr == addr && be->port == port ? be : 0;
}

/* pick chooses a backend of [start, end) for a new flow, keeping client-IP affinity. */
static __always_inline struct be_val_v4 *pick(struct fe_key_v4 *fk, struct fe_val *fe, __u32 start, __u32 end,
					      __be32 client, __u64 now)
{
	struct be_key bk = {.list_id = fe->list_id};
	struct be_val_v4 *be;
	__u32 n = end - start;
	struct aff_key_v4 ak = {.fe_addr = fk->addr, .fe_port = fk->port, .proto = fk->proto, .client = client};
	if (fe->affinity_sec) {
		struct aff_val_v4 *a = bpf_map_lookup_elem(&sl_aff_v4, &ak);
		if (a && now - a->seen < (__u64)fe->affinity_sec * NSEC) {
			be = in_set4(fe, start, end, a->addr, a->port);
			if (be) {
				a->seen = now;
				return be;
			}
		}
	}
	bk.ordinal = start + bpf_get_prandom_u32() % n;
	be = bpf_map_lookup_elem(&sl_be_v4, &bk);
	if (be && fe->affinity_sec) {
		struct aff_val_v4 av = {.seen = now, .addr = be->addr, .port = be->port};
		bpf_map_update_elem(&sl_aff_v4, &ak, &av, BPF_ANY);
	}
	return be;
}

/* lookup_frontend finds the frontend of a packet: the exact address:port, then (for one of
 * this node's own addresses) a node port's wildcard entry. */
static __always_inline struct fe_val *lookup_frontend(struct __sk_buff *skb, struct pkt *p, struct fe_key_v4 *fk)
{
	fk->addr = p->dst;
	fk->port = p->dport;
	fk->proto = p->proto;
	fk->pad = 0;
	struct fe_val *fe = bpf_map_lookup_elem(&sl_fe_v4, fk);
	if (fe)
		return fe;
	struct fe_key_v4 wk = {.addr = 0, .port = p->dport, .proto = p->proto};
	fe = bpf_map_lookup_elem(&sl_fe_v4, &wk);
	if (!fe)
		return 0;
	/* The wildcard serves every address of this node and nothing else. */
	struct cnet_val *cn = cluster_net(p->dst);
	int self = cn && (cn->flags & CNET_SELF);
	if (!self) {
		struct bpf_fib_lookup fib = {};
		fib.family = AF_INET;
		fib.ipv4_src = p->src;
		fib.ipv4_dst = p->dst;
		fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
		self = bpf_fib_lookup(skb, &fib, sizeof(fib), 0) == BPF_FIB_LKUP_RET_NOT_FWDED;
	}
	if (!self)
		return 0;
	*fk = wk;
	return fe;
}

#endif
