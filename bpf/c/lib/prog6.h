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
	if (v && (v->type == CT_REV || (v->type == CT_TUN && from == FROM_WEP))) {
		if (stale_reply6(p, &k, v))
			v = 0;
		else if (v->type == CT_REV)
			return reply6(skb, p, v, 1);
		else
			return tun_reply6(skb, p, v, 0); /* a backend's reply to a flow forwarded here */
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
		int rc = icmp6_error(skb, &p, 1, 0);
		return rc < 0 ? TC_ACT_OK : rc;
	}
	if (from == FROM_HOST && p.proto == IPPROTO_UDP && !(p.frag & F6_FRAG)) {
		struct cfg *c = config();
		if (c && p.dport == c->vxlan_port) {
			/* The node-port tunnel over IPv6: unwrapped here; an ICMPv6 error it carried
			 * comes back in p (the outer header is not needed after). */
			struct addr6 tun_src = p.src;
			int rc = tunnel_in6(skb, &p, &p);
			if (rc != TUN6_ICMP)
				return rc;
			rc = icmp6_error(skb, &p, 1, &tun_src);
			if (rc < 0) {
				count(C_DROP_MALFORMED);
				return TC_ACT_SHOT;
			}
			return rc;
		}
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
		int rc = icmp6_error(skb, &p, 0, 0);
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
	if (!v || (v->type != CT_REV && v->type != CT_TUN) || stale_reply6(&p, &k, v))
		return TC_ACT_OK;
	if (v->type == CT_TUN)
		/* A host-networked backend's reply to a flow forwarded here: back through the
		 * tunnel (on a workload interface such a flow's replies were sent at sl_from_wep). */
		return host ? tun_reply6(skb, &p, v, 1) : TC_ACT_OK;
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
