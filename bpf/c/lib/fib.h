/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Sending a translated packet on by the FIB (bpf_redirect_neigh), each lookup result that
 * stops it counted by name. Included once per family (lib/family.h). */

#ifndef SLUICE_LIB_FIB_SHARED
#define SLUICE_LIB_FIB_SHARED

/* fib_fail is the verdict on a FIB lookup that found no way out: the kernel's own path when
 * fallback_ok, else a drop counted by the lookup's answer. */
static __always_inline int fib_fail(long rc, int fallback_ok)
{
	if (fallback_ok)
		return TC_ACT_OK;
	/* Each answer of the lookup its own counter: "no route" alone misled operators whose
	 * tunnel MTU the underlay could not carry. */
	switch (rc) {
	case BPF_FIB_LKUP_RET_BLACKHOLE:
		count(C_DROP_FIB_BLACKHOLE);
		break;
	case BPF_FIB_LKUP_RET_PROHIBIT:
		count(C_DROP_FIB_PROHIBIT);
		break;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		count(C_DROP_FIB_FRAG);
		break;
	case BPF_FIB_LKUP_RET_UNREACHABLE:
	case BPF_FIB_LKUP_RET_NOT_FWDED:
		count(C_DROP_FIB);
		break;
	default:
		count(C_DROP_FIB_OTHER);
	}
	return TC_ACT_SHOT;
}

#endif /* SLUICE_LIB_FIB_SHARED */

#if FAMILY == 4

/* fib_addrs and fib_neigh fill the family's part of a FIB lookup and of the next hop it found. */
static __always_inline void fib_addrs(struct bpf_fib_lookup *fib, __be32 src, __be32 dst)
{
	fib->family = AF_INET;
	fib->ipv4_src = src;
	fib->ipv4_dst = dst;
}

static __always_inline void fib_neigh(struct bpf_redir_neigh *nh, struct bpf_fib_lookup *fib)
{
	*nh = (struct bpf_redir_neigh){.nh_family = AF_INET, .ipv4_nh = fib->ipv4_dst};
}

#else /* FAMILY == 6 */

static __always_inline void fib_addrs6(struct bpf_fib_lookup *fib, const struct addr6 *src, const struct addr6 *dst)
{
	fib->family = AF_INET6;
	__builtin_memcpy(fib->ipv6_src, src, 16);
	__builtin_memcpy(fib->ipv6_dst, dst, 16);
}

static __always_inline void fib_neigh6(struct bpf_redir_neigh *nh, struct bpf_fib_lookup *fib)
{
	*nh = (struct bpf_redir_neigh){.nh_family = AF_INET6};
	__builtin_memcpy(nh->ipv6_nh, fib->ipv6_dst, 16);
}

#endif /* FAMILY */

/* fib_out sends the packet, whose IP header is at the standard offset, to its destination
 * through the kernel's FIB: the MACs are filled in and the packet leaves by the route's
 * interface without passing the kernel's forwarding path (no rp_filter on a multi-homed
 * node, no dependence on routes back to the client). */
static __noinline int FN(fib_out)(struct __sk_buff *skb, addr_arg_t src, addr_arg_t dst, int fallback_ok)
{
	struct bpf_fib_lookup fib = {};
	FN(fib_addrs)(&fib, src, dst);
	fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		if (bpf_skb_store_bytes(skb, 0, fib.dmac, 6, 0) < 0 || bpf_skb_store_bytes(skb, 6, fib.smac, 6, 0) < 0)
			return TC_ACT_SHOT;
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh;
		FN(fib_neigh)(&nh, &fib);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	return fib_fail(rc, fallback_ok);
}
