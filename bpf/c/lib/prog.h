/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The tc programs, one a hook and family: sl_from_host and sl_from_wep (ingress of host and
 * workload interfaces), sl_to_wep and sl_to_host (egress); sl_from_host6 and so on for IPv6.
 * Each IPv4 program passes an IPv6 packet on to its hook's IPv6 program (to_v6: a tail call,
 * so each family is verified alone). Included once per family (lib/family.h). */

#ifndef SLUICE_LIB_PROG_SHARED
#define SLUICE_LIB_PROG_SHARED

/* prologue's and from_tunnel's answer for a packet that goes on to the hook's decisions. */
#define GO_ON (-20)

#endif /* SLUICE_LIB_PROG_SHARED */

/* prologue is what every program does first: its family's packets only (the IPv4 program
 * passes IPv6 on to the hook's IPv6 program), parsed; the settings; an ICMP error about a
 * translated flow translated; a fragment given its first's ports. GO_ON with p parsed and *cp
 * the settings when the packet is TCP or UDP with its ports, else the verdict. in: the packet
 * comes in (a translated ICMP error is then sent on by the FIB); hook: PROG6_*. */
static __always_inline int FN(prologue)(struct __sk_buff *skb, pkt_t *p, struct cfg **cp, int in, __u32 hook)
{
#if FAMILY == 4
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return to_v6(skb, hook);
#endif
	if (skb->protocol != bpf_htons(ETH_P_FAMILY))
		return TC_ACT_OK;
	if (FN(parse)(skb, IP_OFF, p) < 0)
		return TC_ACT_OK;
	/* The settings are one array entry, always there; older verifiers (6.1) cannot tell, so
	 * every program checks the lookup once, before anything reads it. */
	struct cfg *c = config();
	if (!c)
		return TC_ACT_OK;
	*cp = c;
	if (p->proto == ICMP_PROTO) {
		int rc = FN(icmp_error)(skb, p, in, 0);
		return rc < 0 ? TC_ACT_OK : rc;
	}
#if FAMILY == 4
	/* The rest of a datagram frag_split cut, back in this hook. */
	if (p->frag & IP_RF) {
		int rc = frag_rest(skb, p, c);
		if (rc >= 0)
			return rc;
	}
#endif
	FN(frag_track)(p);
	if (!FN(has_ports)(p))
		return TC_ACT_OK;
	return GO_ON;
}

/* from_tunnel takes a packet to the VXLAN port coming in by a host interface: the node-port
 * tunnel, unwrapped (tunnel_in); GO_ON for any other packet. */
static __always_inline int FN(from_tunnel)(struct __sk_buff *skb, pkt_t *p, struct cfg *c)
{
	if (p->proto != IPPROTO_UDP || p->dport != c->vxlan_port)
		return GO_ON;
	/* The tunnel's outer header is never cut by sluice; a fragment of it (an underlay router
	 * fragmented it) cannot be unwrapped piecewise: the kernel's reassembly gets it
	 * (TUNNEL_FRAGS_PASS; IPv6 handles it as any other packet). */
	if (FN(is_frag)(p))
		return TUNNEL_FRAGS_PASS ? TC_ACT_OK : GO_ON;
	/* The unwrapped ICMP error comes back in p (the outer header is not needed after). */
	addr_t tun_src = p->src;
	int rc = FN(tunnel_in)(skb, p, c, p);
	if (rc != TUN_ICMP)
		return rc;
	/* Only errors about flows between this node and the sender travel the tunnel: the
	 * backend's about a flow forwarded there, the ingress node's about a reply. */
	rc = FN(icmp_error)(skb, p, 1, AARG(tun_src));
	if (rc < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return rc;
}

/* known handles a packet of a known flow coming in (a reply, or the client's direction of a
 * flow); NF_NEW or NF_RETRY for one that starts a flow, which the caller passes to new_flow:
 * the stack frames of the known flows' path and of new_flow are never stacked (IPv6's known
 * is a function of its own: KNOWN_INLINE). */
static KNOWN_INLINE int FN(known)(struct __sk_buff *skb, pkt_t *p, int from)
{
	ct_key_t k;
	FN(ct_key)(&k, p, 0);
	ct_val_t *v = bpf_map_lookup_elem(&CT_MAP, &k);
	if (v && (v->type == CT_REV || (v->type == CT_TUN && from == FROM_WEP))) {
		if (FN(stale_reply)(p, &k, v))
			v = 0;
		else if (v->type == CT_REV)
			return FN(reply)(skb, p, v, 1);
		else
			return FN(tun_reply)(skb, p, v, 0); /* a backend's reply to a flow forwarded here */
	}
	return FN(client_flow)(skb, p, &k, v, from);
}

/* from handles a packet coming in: from a host interface or a workload. */
static __always_inline int FN(from)(struct __sk_buff *skb, int from, __u32 hook)
{
	pkt_t p = {};
	struct cfg *c;
	int rc = FN(prologue)(skb, &p, &c, 1, hook);
	if (rc != GO_ON)
		return rc;
	if (from == FROM_HOST) {
		rc = FN(from_tunnel)(skb, &p, c);
		if (rc != GO_ON)
			return rc;
	}
	rc = FN(known)(skb, &p, from);
	if ((__u32)(rc - NF_RETRY) > NF_NEW - NF_RETRY)
		return rc;
	/* NF_NEW or NF_RETRY. The retry flag is computed, not compared for: a flag the verifier
	 * knew to be 0 or 1 would have it verify new_flow once for each (Linux 6.1: 2.5 times the
	 * work for sl_from_host). */
	return FN(new_flow_verdict)(skb, &p, c, from, NF_NEW - rc);
}

/* leaving undoes the translation of replies as they leave by an interface (egress).
 *
 * On a workload interface (sl_to_wep): replies to a workload client whose backend is
 * elsewhere, or in the host's own namespace; those reach the node by routing, through any
 * interface, and only here meet the client's side.
 *
 * On a host interface (sl_to_host): replies of a backend in the host's own namespace (a
 * host-networked endpoint, at one of the node's addresses), which answers from the host stack
 * that no ingress hook of ours sees. A reply to a client that came in by a host interface
 * leaves by that interface to the hop it came from; a reply to a flow forwarded here through
 * the tunnel goes back through it to the ingress node. Workload backends' replies were
 * translated at sl_from_wep already, and match nothing here. */
static __always_inline int FN(leaving)(struct __sk_buff *skb, int host)
{
	/* Tagged by a VLAN device on its way out of the parent: that device's hook saw it. */
	if (skb->vlan_present)
		return TC_ACT_OK;
	pkt_t p = {};
	struct cfg *c;
	int rc = FN(prologue)(skb, &p, &c, 0, host ? PROG6_TO_HOST : PROG6_TO_WEP);
	if (rc != GO_ON)
		return rc;
	if (!host && FN(is_syn)(&p)) {
		/* A SYN on its way to a workload after the translation (or straight to its address)
		 * on the tuple of a closed flow: a new connection, which the closed flow's state must
		 * not answer for. A SYN through the service renewed that state before it got here. */
		ct_key_t rk;
		FN(ct_key)(&rk, &p, 1);
		ct_val_t *r = bpf_map_lookup_elem(&CT_MAP, &rk);
		if (r && (r->type == CT_REV || r->type == CT_TUN) && closed_state(r->tcp))
			FN(ct_drop)(&rk, r);
		return TC_ACT_OK;
	}
	ct_key_t k;
	FN(ct_key)(&k, &p, 0);
	ct_val_t *v = bpf_map_lookup_elem(&CT_MAP, &k);
	if (!v || (v->type != CT_REV && v->type != CT_TUN) || FN(stale_reply)(&p, &k, v))
		return TC_ACT_OK;
	if (v->type == CT_TUN)
		/* A host-networked backend's reply to a flow forwarded here: back through the
		 * tunnel (on a workload interface such a flow's replies were sent at sl_from_wep). */
		return host ? FN(tun_reply)(skb, &p, v, 1) : TC_ACT_OK;
	if (!host)
		return (v->flags & CT_F_REDIRECT) ? TC_ACT_OK : FN(reply)(skb, &p, v, 0);
	/* Already on the way out of the interface the request came in by: the MACs are set and
	 * the packet goes on, rather than being queued to this device again. */
	if ((v->flags & CT_F_REDIRECT) && v->ifindex == skb->ifindex) {
		rc = FN(reply)(skb, &p, v, 0);
		return rc == TC_ACT_REDIRECT ? TC_ACT_OK : rc;
	}
	return FN(reply)(skb, &p, v, 0);
}

SEC("tc")
int FN(sl_from_host)(struct __sk_buff *skb)
{
	/* A tagged packet on a VLAN's parent: the VLAN device's own hook takes it next (the
	 * kernel untags before this hook, so it reads as IPv4 here). Replies recorded on the
	 * parent would leave untagged. */
	if (skb->vlan_present)
		return TC_ACT_OK;
	return FN(from)(skb, FROM_HOST, PROG6_FROM_HOST);
}

SEC("tc")
int FN(sl_from_wep)(struct __sk_buff *skb)
{
	if (skb->vlan_present && VLAN_WEP_PASS)
		return TC_ACT_OK;
	return FN(from)(skb, FROM_WEP, PROG6_FROM_WEP);
}

SEC("tc")
int FN(sl_to_wep)(struct __sk_buff *skb)
{
	return FN(leaving)(skb, 0);
}

SEC("tc")
int FN(sl_to_host)(struct __sk_buff *skb)
{
	return FN(leaving)(skb, 1);
}
