/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The IPv6 programs, one a hook, reached from the hook's IPv4 program (to_v6): the same
 * decisions as sluice.c's programs make for IPv4, on the IPv6 maps. */
#ifndef SLUICE_LIB_PROG6_H
#define SLUICE_LIB_PROG6_H

/* known6 handles a packet of a known flow (a reply, or the client's direction of a flow)
 * coming in; NF6_NEW for one that starts a flow. A function of its own: the stack frames of
 * the known flows' path and of new_flow6 are never stacked. */
static __noinline int known6(struct __sk_buff *skb, struct pkt6 *p, int from)
{
	struct ct_key_v6 k;
	ct_key6(&k, p, 0);
	struct ct_val_v6 *v = bpf_map_lookup_elem(&sl_ct_v6, &k);
	if (v && v->type == CT_REV) {
		if (!stale_reply6(p, &k, v))
			return reply6(skb, p, v, 1);
		v = 0;
	}
	return client_flow6(skb, p, &k, v, from);
}

/* from6 handles an IPv6 packet coming in: from a host interface or a workload. */
static __always_inline int from6(struct __sk_buff *skb, int from)
{
	if (skb->protocol != bpf_htons(ETH_P_IPV6) || skb->vlan_present)
		return TC_ACT_OK;
	struct pkt6 p = {};
	if (parse6(skb, IP_OFF, &p) < 0)
		return TC_ACT_OK;
	if (p.proto == NEXTHDR_ICMP6) {
		int rc = icmp6_error(skb, &p, 1);
		return rc < 0 ? TC_ACT_OK : rc;
	}
	frag_track6(&p);
	if (!is_l4_6(&p))
		return TC_ACT_OK;
	int rc = known6(skb, &p, from);
	if (rc != NF6_NEW)
		return rc;
	return new_flow6_verdict(skb, &p, from);
}

SEC("tc")
int sl_from_host6(struct __sk_buff *skb)
{
	return from6(skb, FROM_HOST);
}

SEC("tc")
int sl_from_wep6(struct __sk_buff *skb)
{
	return from6(skb, FROM_WEP);
}

/* leaving6 undoes the translation of IPv6 replies as they leave by an interface (leaving). */
static __always_inline int leaving6(struct __sk_buff *skb, int host)
{
	if (skb->protocol != bpf_htons(ETH_P_IPV6) || skb->vlan_present)
		return TC_ACT_OK;
	struct pkt6 p = {};
	if (parse6(skb, IP_OFF, &p) < 0)
		return TC_ACT_OK;
	if (p.proto == NEXTHDR_ICMP6) {
		int rc = icmp6_error(skb, &p, 0);
		return rc < 0 ? TC_ACT_OK : rc;
	}
	frag_track6(&p);
	if (!is_l4_6(&p))
		return TC_ACT_OK;
	if (!host && is_syn6(&p)) {
		struct ct_key_v6 rk;
		ct_key6(&rk, &p, 1);
		struct ct_val_v6 *r = bpf_map_lookup_elem(&sl_ct_v6, &rk);
		if (r && r->type == CT_REV && closed_state(r->tcp))
			ct_drop6(&rk, r);
		return TC_ACT_OK;
	}
	struct ct_key_v6 k;
	ct_key6(&k, &p, 0);
	struct ct_val_v6 *v = bpf_map_lookup_elem(&sl_ct_v6, &k);
	if (!v || v->type != CT_REV || stale_reply6(&p, &k, v))
		return TC_ACT_OK;
	if (!host)
		return (v->flags & CT_F_REDIRECT) ? TC_ACT_OK : reply6(skb, &p, v, 0);
	if ((v->flags & CT_F_REDIRECT) && v->ifindex == skb->ifindex) {
		int rc = reply6(skb, &p, v, 0);
		return rc == TC_ACT_REDIRECT ? TC_ACT_OK : rc;
	}
	return reply6(skb, &p, v, 0);
}

SEC("tc")
int sl_to_wep6(struct __sk_buff *skb)
{
	return leaving6(skb, 0);
}

SEC("tc")
int sl_to_host6(struct __sk_buff *skb)
{
	return leaving6(skb, 1);
}

#endif
