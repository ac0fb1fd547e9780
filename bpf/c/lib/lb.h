/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Load balancing: finding a packet's frontend and picking a backend (client-IP affinity).
 * Included once per family (lib/family.h). */

/* cluster_net finds the cluster network (a pool, a node's address) an address is in. */
static __always_inline struct cnet_val *FN(cluster_net)(const addr_t *a)
{
	cnet_key_t k = {.prefixlen = 8 * sizeof(addr_t), .addr = *a};
	return bpf_map_lookup_elem(&CNET_MAP, &k);
}

/* in_set finds the endpoint addr:port in [start, end) of a frontend's list: a list of up to
 * AFF_SCAN entries read whole, a longer one by its index, the entry found there checked. 0
 * when the set does not hold it. Client-IP affinity and the sockets' remembered backends. */
static __noinline be_val_t *FN(in_set)(struct fe_val *fe, __u32 start, __u32 end, addr_arg_t addr, __be16 port)
{
	struct be_key bk = {.list_id = fe->list_id};
	be_val_t *be;
	if (fe->count <= AFF_SCAN) {
		for (__u32 i = 0; i < AFF_SCAN; i++) {
			if (start + i >= end)
				break;
			bk.ordinal = start + i;
			be = bpf_map_lookup_elem(&BE_MAP, &bk);
			if (be && ADDR_EQ(be->addr, AVAL(addr)) && be->port == port)
				return be;
		}
		return 0;
	}
	be_idx_key_t ik = {.list_id = fe->list_id, .addr = AVAL(addr), .port = port};
	__u32 *ord = bpf_map_lookup_elem(&BE_IDX_MAP, &ik);
	if (!ord || *ord < start || *ord >= end)
		return 0;
	bk.ordinal = *ord;
	be = bpf_map_lookup_elem(&BE_MAP, &bk);
	return be && ADDR_EQ(be->addr, AVAL(addr)) && be->port == port ? be : 0;
}

/* pick chooses a backend of [start, end) for a new flow, keeping client-IP affinity. */
static __always_inline be_val_t *FN(pick)(fe_key_t *fk, struct fe_val *fe, __u32 start, __u32 end,
					 const addr_t *client, __u64 now)
{
	struct be_key bk = {.list_id = fe->list_id};
	be_val_t *be;
	__u32 n = end - start;
	aff_key_t ak = {.fe_addr = fk->addr, .fe_port = fk->port, .proto = fk->proto, .client = *client};
	if (fe->affinity_sec) {
		aff_val_t *a = bpf_map_lookup_elem(&AFF_MAP, &ak);
		if (a && now - a->seen < (__u64)fe->affinity_sec * NSEC) {
			be = FN(in_set)(fe, start, end, AARG(a->addr), a->port);
			if (be) {
				a->seen = now;
				return be;
			}
		}
	}
	bk.ordinal = start + bpf_get_prandom_u32() % n;
	be = bpf_map_lookup_elem(&BE_MAP, &bk);
	if (be && fe->affinity_sec) {
		aff_val_t av = {.seen = now, .addr = be->addr, .port = be->port};
		bpf_map_update_elem(&AFF_MAP, &ak, &av, BPF_ANY);
	}
	return be;
}

/* lookup_frontend finds the frontend of a packet: the exact address:port, then (for one of
 * this node's own addresses) a node port's wildcard entry; fk is the key found. */
static __always_inline struct fe_val *FN(lookup_frontend)(struct __sk_buff *skb, pkt_t *p, fe_key_t *fk)
{
	fk->addr = p->dst;
	fk->port = p->dport;
	fk->proto = p->proto;
	fk->pad = 0;
	struct fe_val *fe = bpf_map_lookup_elem(&FE_MAP, fk);
	if (fe)
		return fe;
	__builtin_memset(&fk->addr, 0, sizeof(fk->addr));
	fe = bpf_map_lookup_elem(&FE_MAP, fk);
	if (!fe)
		return 0;
	/* The wildcard serves every address of this node and nothing else. */
	struct cnet_val *cn = FN(cluster_net)(&p->dst);
	int self = cn && (cn->flags & CNET_SELF);
	if (!self) {
		struct bpf_fib_lookup fib = {};
		FN(fib_addrs)(&fib, AARG(p->src), AARG(p->dst));
		fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
		self = bpf_fib_lookup(skb, &fib, sizeof(fib), 0) == BPF_FIB_LKUP_RET_NOT_FWDED;
	}
	return self ? fe : 0;
}
