/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service NAT of IPv6 flows: nat.h's rules on the IPv6 maps.
 *
 * A flow that came in by a host interface to an endpoint on another node goes through the
 * IPv6 node-port tunnel (tunnel6.h) when this node has an IPv6 underlay address; without one
 * it is given this node's endpoints only, as with externalTrafficPolicy Local, since its
 * replies would not come back through this node. A workload's flow to an endpoint on another
 * node is translated here and routed by the kernel (the pools' routes), its replies translated
 * back on the way into the workload (sl_to_wep). */
#ifndef SLUICE_LIB_NAT6_H
#define SLUICE_LIB_NAT6_H

/* new_flow6's answers besides a tc verdict: the caller sends the reject (reject6), so that its
 * stack frame is not stacked on new_flow6's. */
#define NF6_REJECT_PORT (-10)
#define NF6_REJECT_NONE (-11)
#define NF6_TUNNEL (-13) /* translated; the caller sends it through the tunnel (tunnel_out6) */

static __always_inline void hairpin6(struct addr6 *a)
{
	a->w[0] = bpf_htonl(HAIRPIN6_W0);
	a->w[1] = 0;
	a->w[2] = 0;
	a->w[3] = bpf_htonl(HAIRPIN6_W3);
}

/* src_allowed6 says whether a client may use a frontend limited by loadBalancerSourceRanges;
 * a function of its own, so its key is not on new_flow6's stack. */
static __noinline int src_allowed6(struct fe_key_v6 *fk, struct addr6 *src)
{
	struct src_key_v6 sk = {.prefixlen = 288, .fe_addr = fk->addr, .fe_port = fk->port, .proto = fk->proto,
				.src = *src};
	return bpf_map_lookup_elem(&sl_src_v6, &sk) != 0;
}

/* new_flow6 translates the first packet of a flow to a service (new_flow). */
static __noinline int new_flow6(struct __sk_buff *skb, struct pkt6 *p, int from)
{
	struct fe_key_v6 fk;
	struct fe_val *fe = lookup_frontend6(skb, p, &fk);
	if (!fe) {
		/* The address-only entry of a cluster IP: fk is free for its key. */
		fk.addr = p->dst;
		fk.port = 0;
		fk.proto = 0;
		if (bpf_map_lookup_elem(&sl_fe_v6, &fk))
			return NF6_REJECT_PORT;
		supersede6(p);
		return TC_ACT_OK;
	}
	if ((fe->flags & FE_NODE_PORT) && p->proto == IPPROTO_TCP && !is_syn6(p))
		return TC_ACT_OK;
	int outside = 0;
	if (from == FROM_HOST)
		outside = !cluster_net6(&p->src);
	if ((fe->flags & FE_SRC_RANGES) && outside && !src_allowed6(&fk, &p->src)) {
		count(C_DROP_SRC_RANGE);
		return TC_ACT_SHOT;
	}
	__u32 start = fe->cluster_start, end = fe->count;
	int local_only = outside ? (fe->flags & FE_EXT_LOCAL) : (fe->flags & FE_INT_LOCAL);
	struct cfg_v6 *c6 = config6();
	int tunnel = c6 && !zero6(&c6->host_ip);
	if (local_only || (from == FROM_HOST && !tunnel)) {
		start = 0;
		end = fe->local;
	}
	if (end > fe->count)
		end = fe->count;
	if (start >= end) {
		if (local_only || (from == FROM_HOST && fe->count > 0)) {
			count(C_DROP_NO_LOCAL);
			return TC_ACT_SHOT;
		}
		return NF6_REJECT_NONE;
	}
	__u64 now = bpf_ktime_get_ns();
	struct be_val_v6 *be = pick6(&fk, fe, start, end, &p->src, now);
	if (!be)
		return NF6_REJECT_NONE;
	__u16 beflags = be->flags;
	/* Through the tunnel: a flow from a host interface to an endpoint on another node. */
	int remote = from == FROM_HOST && !(beflags & (BE_LOCAL | BE_ROUTED));
	if (remote) {
		if (!c6 || !is_v6_node(&be->node_addr)) {
			count(C_DROP_FIB);
			return TC_ACT_SHOT;
		}
		int rc = oversize6(skb, p, c6, 0);
		if (rc >= 0)
			return rc;
	}
	int hairpin = (beflags & BE_LOCAL) && from == FROM_WEP && eq6(&be->addr, &p->src);
	struct ct_key_v6 rk = {.src = be->addr, .sport = be->port, .dport = p->sport, .proto = p->proto};
	if (hairpin)
		hairpin6(&rk.dst);
	else
		rk.dst = p->src;
	/* A second flow of the same client address and port to another frontend of the same
	 * endpoint gets a port of its own (new_flow). */
	if (bpf_map_lookup_elem(&sl_ct_v6, &rk)) {
		struct cfg *c = config();
		if (c && c->psnat_max > c->psnat_min) {
			__u32 span = c->psnat_max - c->psnat_min + 1;
			for (int i = 0; i < 8; i++) {
				rk.dport = bpf_htons(c->psnat_min + bpf_get_prandom_u32() % span);
				if (!bpf_map_lookup_elem(&sl_ct_v6, &rk))
					break;
			}
		}
		if (bpf_map_lookup_elem(&sl_ct_v6, &rk)) {
			count(C_DROP_COLLISION);
			return TC_ACT_SHOT;
		}
	}
	__u8 flags = 0;
	if (remote)
		flags |= CT_F_REMOTE;
	if (rk.dport != p->sport)
		flags |= CT_F_PSNAT;
	if (beflags & BE_LOCAL)
		flags |= CT_F_LOCAL;
	/* The entry is made in a per-CPU scratch value, not on the stack: new_flow6's frame
	 * stays clear of the 512 bytes the programs' call chain may use on every kernel. */
	__u32 zero = 0;
	struct ct_val_v6 *v = bpf_map_lookup_elem(&sl_scratch_ct6, &zero);
	if (!v)
		return TC_ACT_SHOT;
	__builtin_memset(v, 0, sizeof(*v));
	v->created = now;
	v->last_seen = now;
	v->type = CT_REV;
	v->flags = flags;
	v->nat_addr = p->dst;
	v->nat_port = p->dport;
	v->nat_sport = p->sport;
	if (hairpin)
		v->nat_saddr = p->src;
	if (remote)
		v->tun_addr = be->node_addr;
	if (from == FROM_HOST) {
		if (bpf_skb_load_bytes(skb, 0, v->mac_local, 6) < 0 || bpf_skb_load_bytes(skb, 6, v->mac_peer, 6) < 0)
			return TC_ACT_SHOT;
		v->ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
		v->flags |= CT_F_REDIRECT;
	}
	tcp_track6(v, p, 0);
	if (ct_put6(&rk, v, BPF_NOEXIST) < 0)
		return TC_ACT_SHOT;
	young6(&rk, now);
	/* The same value becomes the forward entry, and the same key its key: the translation
	 * is read back from the entry. */
	__builtin_memset(v, 0, sizeof(*v));
	v->created = now;
	v->last_seen = now;
	v->type = CT_FWD;
	v->flags = flags;
	v->nat_addr = rk.src;
	v->nat_port = rk.sport;
	v->nat_sport = rk.dport;
	if (hairpin)
		v->nat_saddr = rk.dst;
	if (remote)
		v->tun_addr = be->node_addr;
	ct_key6(&rk, p, 0);
	if (ct_put6(&rk, v, BPF_ANY) < 0) {
		rk.src = v->nat_addr;
		rk.dst = hairpin ? v->nat_saddr : p->src;
		rk.sport = v->nat_port;
		rk.dport = v->nat_sport;
		bpf_map_delete_elem(&sl_ct_v6, &rk);
		return TC_ACT_SHOT;
	}
	count(C_NAT_NEW);
	if (rewrite6(skb, p, 1, &v->nat_addr, v->nat_port) < 0 ||
	    rewrite6(skb, p, 0, hairpin ? &v->nat_saddr : &p->src, v->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (remote) {
		count(C_NAT_FWD_REMOTE);
		return NF6_TUNNEL;
	}
	if (from == FROM_HOST || hairpin || (beflags & BE_LOCAL))
		return fib_out6(skb, &p->src, &p->dst, 1);
	return TC_ACT_OK;
}

/* tunnel_out6 sends a flow's first packet, translated by new_flow6, through the tunnel to its
 * backend's node, read from the flow's reverse entry: a function of the program's, so its
 * frame is not stacked on new_flow6's. */
static __noinline int tunnel_out6(struct __sk_buff *skb, struct pkt6 *p)
{
	struct cfg *c = config();
	struct cfg_v6 *c6 = config6();
	struct ct_key_v6 rk;
	ct_key6(&rk, p, 1);
	struct ct_val_v6 *rev = bpf_map_lookup_elem(&sl_ct_v6, &rk);
	if (!c || !c6 || !rev) {
		count(C_DROP_FIB);
		return TC_ACT_SHOT;
	}
	struct addr6 node = rev->tun_addr;
	return encap6_out(skb, p, c, c6, &node);
}

/* forward6 handles a packet of a known flow in the client's direction (forward). */
static __noinline int forward6(struct __sk_buff *skb, struct pkt6 *p, struct ct_val_v6 *fwd, int from)
{
	struct ct_key_v6 rk = {.src = fwd->nat_addr, .sport = fwd->nat_port, .dport = fwd->nat_sport, .proto = p->proto};
	rk.dst = zero6(&fwd->nat_saddr) ? p->src : fwd->nat_saddr;
	struct ct_val_v6 *rev = bpf_map_lookup_elem(&sl_ct_v6, &rk);
	if (rev) {
		rev->last_seen = bpf_ktime_get_ns();
		tcp_track6(rev, p, 0);
	}
	struct cfg_v6 *c6 = 0;
	if (fwd->flags & CT_F_REMOTE) {
		c6 = config6();
		if (!c6) {
			count(C_DROP_FIB);
			return TC_ACT_SHOT;
		}
		int rc = oversize6(skb, p, c6, 0);
		if (rc >= 0)
			return rc;
	}
	if (rewrite6(skb, p, 1, &fwd->nat_addr, fwd->nat_port) < 0 || rewrite6(skb, p, 0, &rk.dst, fwd->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (c6) {
		struct cfg *c = config();
		if (!c) {
			count(C_DROP_FIB);
			return TC_ACT_SHOT;
		}
		return encap6_out(skb, p, c, c6, &fwd->tun_addr);
	}
	if (from == FROM_HOST || !zero6(&fwd->nat_saddr) || (fwd->flags & CT_F_LOCAL))
		return fib_out6(skb, &p->src, &p->dst, 1);
	return TC_ACT_OK;
}

/* redirect_back6 is redirect_back for an IPv6 flow's reply. */
static __always_inline int redirect_back6(struct __sk_buff *skb, const struct ct_val_v6 *rev)
{
	__u8 m[12];
	__builtin_memcpy(m, rev->mac_peer, 6);
	__builtin_memcpy(m + 6, rev->mac_local, 6);
	if (bpf_skb_store_bytes(skb, 0, m, 12, 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(rev->ifindex, 0);
}

static __always_inline int reply_out6(struct __sk_buff *skb, const struct ct_val_v6 *rev, int route,
				      const struct addr6 *src, const struct addr6 *dst)
{
	count(C_REV_NAT);
	if (rev->flags & CT_F_REDIRECT)
		return redirect_back6(skb, rev);
	if (route)
		return fib_out6(skb, src, dst, 1);
	return TC_ACT_OK;
}

/* reply6 undoes the translation of a reply from a backend and sends it back (reply). */
static __always_inline int reply6(struct __sk_buff *skb, struct pkt6 *p, struct ct_val_v6 *rev, int route)
{
	rev->last_seen = bpf_ktime_get_ns();
	tcp_track6(rev, p, 1);
	if (rewrite6(skb, p, 0, &rev->nat_addr, rev->nat_port) < 0 ||
	    rewrite6(skb, p, 1, zero6(&rev->nat_saddr) ? &p->dst : &rev->nat_saddr, rev->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return reply_out6(skb, rev, route, &p->src, &p->dst);
}

#define NF6_NEW (-12) /* client_flow6: a new flow; the caller calls new_flow6 */

/* client_flow6 handles a packet in the client's direction (client_flow); a packet that starts
 * a flow is the caller's to pass to new_flow6 (NF6_NEW), whose frame is then not stacked on
 * this one's. */
static __always_inline int client_flow6(struct __sk_buff *skb, struct pkt6 *p, struct ct_key_v6 *k,
					struct ct_val_v6 *v, int from)
{
	if (p->later && !(v && v->type == CT_FWD))
		return TC_ACT_OK;
	if (v && v->type == CT_FWD) {
		if (!is_syn6(p))
			return forward6(skb, p, v, from);
		struct ct_key_v6 rk = {.src = v->nat_addr, .sport = v->nat_port, .dport = v->nat_sport, .proto = p->proto};
		rk.dst = zero6(&v->nat_saddr) ? p->src : v->nat_saddr;
		struct ct_val_v6 *r = bpf_map_lookup_elem(&sl_ct_v6, &rk);
		if (r && !closed_state(r->tcp) && (r->tcp & TCP_REPLIED))
			return forward6(skb, p, v, from);
		bpf_map_delete_elem(&sl_ct_v6, &rk);
		bpf_map_delete_elem(&sl_ct_v6, k);
	}
	return NF6_NEW;
}

/* new_flow6_verdict runs new_flow6 and sends the reject it asks for. */
static __always_inline int new_flow6_verdict(struct __sk_buff *skb, struct pkt6 *p, int from)
{
	int rc = new_flow6(skb, p, from);
	if (rc == NF6_TUNNEL)
		return tunnel_out6(skb, p);
	if (rc == NF6_REJECT_PORT)
		return reject6(skb, p, C_REJECT_PORT);
	if (rc == NF6_REJECT_NONE)
		return reject6(skb, p, C_REJECT_NO_BACKEND);
	return rc;
}

#endif
