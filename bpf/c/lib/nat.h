/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service NAT flows: a new flow (backend chosen, entries made, translated, sent), a known
 * flow in the client's direction, and replies sent back the way the request came. Included
 * once per family (lib/family.h).
 *
 * IPv6: a flow that came in by a host interface to an endpoint on another node goes through
 * the IPv6 node-port tunnel when this node has an IPv6 underlay address; without one it is
 * given this node's endpoints only, as with externalTrafficPolicy Local, since its replies
 * would not come back through this node. A workload's flow to an endpoint on another node is
 * translated here and routed by the kernel (the pools' routes), its replies translated back on
 * the way into the workload (sl_to_wep6; WEP_TUNNEL in lib/family.h). */

#ifndef SLUICE_LIB_NAT_SHARED
#define SLUICE_LIB_NAT_SHARED

/* Where a new flow came from. */
#define FROM_HOST 0 /* a host interface: outside the cluster unless the source is a node or pool */
#define FROM_WEP 1  /* a workload: inside the cluster */

/* new_flow's answers besides a tc verdict: the caller sends the reject (new_flow_verdict), so
 * that its stack frame is not stacked on new_flow's. */
#define NF_REJECT_PORT (-10)
#define NF_REJECT_NONE (-11)
/* client_flow's: a packet that starts a flow, for the caller to pass to new_flow (whose frame
 * is then not stacked on the known flow's path); NF_RETRY, a SYN sent again on a forwarded
 * flow that got no answer. */
#define NF_NEW (-12)
#define NF_RETRY (-13)

#endif /* SLUICE_LIB_NAT_SHARED */

#if FAMILY == 4

/* hairpin_addr is the source a workload's flow to itself gets (HAIRPIN_ADDR). */
static __always_inline void hairpin_addr(__be32 *a)
{
	*a = bpf_htonl(HAIRPIN_ADDR);
}

/* tunnel_up: whether flows may be forwarded through the tunnel (tc, TUN_CFG); tunnel_peer:
 * whether a backend's node is reached through it. IPv4's tunnel is always there. */
static __always_inline int tunnel_up(struct cfg *tc)
{
	return tc != 0;
}

static __always_inline int tunnel_peer(const __be32 *node)
{
	return 1;
}

#else /* FAMILY == 6 */

static __always_inline void hairpin_addr6(struct addr6 *a)
{
	a->w[0] = bpf_htonl(HAIRPIN6_W0);
	a->w[1] = 0;
	a->w[2] = 0;
	a->w[3] = bpf_htonl(HAIRPIN6_W3);
}

/* The IPv6 tunnel is there when this node has an IPv6 underlay address, and reaches the nodes
 * that have one. */
static __always_inline int tunnel_up6(struct cfg_v6 *tc)
{
	return tc && !zero6(&tc->host_ip);
}

static __always_inline int tunnel_peer6(const struct addr6 *node)
{
	return is_v6_node(node);
}

#endif /* FAMILY */

/* rev_key is the key of a flow's reverse entry, from its forward entry f and a packet p of
 * the client's direction as it came (before the translation). */
static __always_inline void FN(rev_key)(ct_key_t *rk, pkt_t *p, ct_val_t *f)
{
	rk->src = f->nat_addr;
	rk->dst = ADDR_ZERO(f->nat_saddr) ? p->src : f->nat_saddr;
	rk->sport = f->nat_port;
	rk->dport = f->nat_sport;
	rk->proto = p->proto;
	rk->pad[0] = rk->pad[1] = rk->pad[2] = 0;
}

/* src_allowed says whether a client may use a frontend limited by loadBalancerSourceRanges;
 * a function of its own, so its key is not on new_flow's stack. */
static __noinline int FN(src_allowed)(fe_key_t *fk, addr_arg_t src)
{
	/* The whole key after prefixlen: the frontend's and the client's every bit. */
	src_key_t sk = {.prefixlen = 8 * (sizeof(src_key_t) - sizeof(__u32)), .fe_addr = fk->addr, .fe_port = fk->port,
			.proto = fk->proto, .src = AVAL(src)};
	return bpf_map_lookup_elem(&SRC_MAP, &sk) != 0;
}

/* new_flow translates the first packet of a flow to a service: picks a backend, records the
 * flow, rewrites the packet and sends it on. Returns a tc verdict (TC_ACT_OK when the packet
 * is not for a service) or a reject for the caller to send (NF_REJECT_*). retry: a SYN sent
 * again on a forwarded flow that got no answer. */
static __noinline int FN(new_flow)(struct __sk_buff *skb, pkt_t *p, struct cfg *c, int from, int retry)
{
	fe_key_t fk;
	struct fe_val *fe = FN(lookup_frontend)(skb, p, &fk);
	if (!fe) {
		/* The address-only entry of a cluster IP: fk is free for its key. */
		fk.addr = p->dst;
		fk.port = 0;
		fk.proto = 0;
		if (bpf_map_lookup_elem(&FE_MAP, &fk))
			return NF_REJECT_PORT;
		FN(supersede)(p);
		return TC_ACT_OK;
	}
	/* A node port is one of the node's own ports: a host socket whose ephemeral port falls in
	 * the node-port range gets its answers there. A TCP segment that opens no connection (no
	 * SYN) and belongs to no flow is such an answer, never a client's new flow: it goes to the
	 * host's stack. (UDP cannot be told apart: sluiced reserves the range for the node's own
	 * sockets, ip_local_reserved_ports.) */
	if ((fe->flags & FE_NODE_PORT) && p->proto == IPPROTO_TCP && !FN(is_syn)(p))
		return TC_ACT_OK;
	int outside = 0;
	if (from == FROM_HOST)
		outside = !FN(cluster_net)(&p->src);
	if ((fe->flags & FE_SRC_RANGES) && outside && !FN(src_allowed)(&fk, AARG(p->src))) {
		count(C_DROP_SRC_RANGE);
		return TC_ACT_SHOT;
	}
	__u32 start = fe->cluster_start, end = fe->count;
	int local_only = outside ? (fe->flags & FE_EXT_LOCAL) : (fe->flags & FE_INT_LOCAL);
	tun_cfg_t *tc = TUN_CFG(c);
	/* Without a tunnel, a flow from outside gets this node's endpoints only. */
	if (local_only || (from == FROM_HOST && !FN(tunnel_up)(tc))) {
		start = 0;
		end = fe->local;
	}
	if (end > fe->count)
		end = fe->count;
	if (start >= end) {
		if (local_only || (HOST_EMPTY_DROPS && from == FROM_HOST && fe->count > 0)) {
			count(C_DROP_NO_LOCAL);
			return TC_ACT_SHOT;
		}
		return NF_REJECT_NONE;
	}
	__u64 now = bpf_ktime_get_ns();
	be_val_t *be = FN(pick)(&fk, fe, start, end, &p->src, now);
	if (!be)
		return NF_REJECT_NONE;
	__u16 beflags = be->flags;
	/* Through the tunnel: a flow to an endpoint on another node. A routed backend (on no node)
	 * is reached as a local one is: DNAT only, never the tunnel; its replies come back by a
	 * host interface and meet the REV entry there. */
	int remote = (from == FROM_HOST || WEP_TUNNEL) && !(beflags & (BE_LOCAL | BE_ROUTED));
	if (remote) {
		if (!tc || !FN(tunnel_peer)(&be->node_addr)) {
			count(C_DROP_FIB);
			return TC_ACT_SHOT;
		}
		int rc = FN(oversize)(skb, p, tc, 0);
		if (rc >= 0)
			return rc;
	}
	/* Hairpin: a workload whose flow lands on itself would answer itself inside its own
	 * namespace, from its own address, and the client (itself) would reset the connection.
	 * As Cilium does, such a flow also gets the source HAIRPIN_ADDR: the answer leaves the
	 * workload by its default route and comes back here, to the REV entry. The workload
	 * sees the hairpin address as its client (Cilium #26100). Only for a workload's flow to
	 * a backend here: the address must never leave the node (Cilium #10841). */
	int hairpin = (beflags & (BE_LOCAL | BE_ROUTED)) && from == FROM_WEP && ADDR_EQ(be->addr, p->src);
	ct_key_t rk = {.src = be->addr, .sport = be->port, .dport = p->sport, .proto = p->proto};
	if (hairpin)
		FN(hairpin_addr)(&rk.dst);
	else
		rk.dst = p->src;
	/* The client's own port is kept when nothing here uses the backend-side tuple, as the
	 * kernel's NAT keeps it: the endpoint then sees the ports the client's own stack manages
	 * (a port of ours reused while the endpoint still holds the last connection in
	 * TIME_WAIT would be refused by PAWS). A flow of the same client ip:port to another
	 * frontend of the same backend (Cilium #11810) gets a port of its own from the range, and
	 * so does a SYN sent again for a forwarded flow that got no answer: two clients behind
	 * one load balancer reusing a source port towards two nodes meet on the endpoint's node,
	 * which drops the second (counted), and its retry comes with another port. */
	if (bpf_map_lookup_elem(&CT_MAP, &rk) || (remote && retry)) {
		if (c && c->psnat_max > c->psnat_min) {
			__u32 span = c->psnat_max - c->psnat_min + 1;
			for (int i = 0; i < 8; i++) {
				rk.dport = bpf_htons(c->psnat_min + bpf_get_prandom_u32() % span);
				if (!bpf_map_lookup_elem(&CT_MAP, &rk))
					break;
			}
		}
		if (bpf_map_lookup_elem(&CT_MAP, &rk)) {
			/* No free port: drop (the client retries) rather than take a live flow's entry. */
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
	/* One entry, written as the reverse entry and then as the forward one. IPv6's is made in a
	 * per-CPU scratch value, not on the stack: new_flow6's frame stays clear of the 512 bytes
	 * the programs' call chain may use on every kernel. */
#if FAMILY == 4
	ct_val_t entry, *v = &entry;
#else
	__u32 zero = 0;
	ct_val_t *v = bpf_map_lookup_elem(&sl_scratch_ct6, &zero);
	if (!v)
		return TC_ACT_SHOT;
#endif
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
		/* On the ingress hook both name the same interface; a test run before 5.15 cannot set
		 * ingress_ifindex, so fall back as the FIB lookups do. */
		v->ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
		v->flags |= CT_F_REDIRECT;
	}
	FN(tcp_track)(v, p, 0);
	if (FN(ct_put)(&rk, v, BPF_NOEXIST) < 0)
		return TC_ACT_SHOT;
	if (YOUNG_AT_REV)
		FN(young)(&rk, now);
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
	FN(ct_key)(&rk, p, 0);
	if (FN(ct_put)(&rk, v, BPF_ANY) < 0) {
		FN(rev_key)(&rk, p, v);
		bpf_map_delete_elem(&CT_MAP, &rk);
		return TC_ACT_SHOT;
	}
	if (!YOUNG_AT_REV) {
		FN(rev_key)(&rk, p, v);
		FN(young)(&rk, now);
	}
	count(C_NAT_NEW);
	if (FN(rewrite)(skb, p, 1, &v->nat_addr, v->nat_port) < 0 ||
	    FN(rewrite)(skb, p, 0, hairpin ? &v->nat_saddr : &p->src, v->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (remote) {
		count(C_NAT_FWD_REMOTE);
		return FN(encap_out)(skb, p, tc, AARG(v->tun_addr));
	}
	/* A hairpin packet goes straight back to the workload's interface: to the kernel's
	 * forwarding it is a link-local source coming in from a workload, which a strict
	 * rp_filter drops. A workload's flow to a workload here goes the same way: its replies
	 * are sent around the kernel's forwarding path (reply), so the requests must be too, or
	 * conntrack, seeing one direction only, calls the client's ACKs INVALID and firewalls that
	 * drop those (kube-proxy's KUBE-FORWARD) break the flow. A routed endpoint's flow (on no
	 * node) keeps the kernel's path: outgoing NAT may have to masquerade it. */
	if (from == FROM_HOST || hairpin || (beflags & BE_LOCAL))
		return FN(fib_out)(skb, AARG(p->src), AARG(p->dst), 1);
	return TC_ACT_OK;
}

/* new_flow_verdict runs new_flow and sends the reject it asks for. */
static __always_inline int FN(new_flow_verdict)(struct __sk_buff *skb, pkt_t *p, struct cfg *c, int from, int retry)
{
	int rc = FN(new_flow)(skb, p, c, from, retry);
	if (rc == NF_REJECT_PORT)
		return FN(reject)(skb, p, C_REJECT_PORT);
	if (rc == NF_REJECT_NONE)
		return FN(reject)(skb, p, C_REJECT_NO_BACKEND);
	return rc;
}

/* forward handles a packet of a known flow in the client's direction (fwd: its forward
 * entry, read in place: a copy would cost the stack its size). */
static __noinline int FN(forward)(struct __sk_buff *skb, pkt_t *p, ct_val_t *fwd, int from)
{
	ct_key_t rk;
	FN(rev_key)(&rk, p, fwd);
	ct_val_t *rev = bpf_map_lookup_elem(&CT_MAP, &rk);
	if (rev) {
		rev->last_seen = bpf_ktime_get_ns();
		FN(tcp_track)(rev, p, 0);
	}
	tun_cfg_t *tc = 0;
	if (fwd->flags & CT_F_REMOTE) {
		tc = TUN_CFG(config());
		if (!tc) {
			count(C_DROP_FIB);
			return TC_ACT_SHOT;
		}
		int rc = FN(oversize)(skb, p, tc, 0);
		if (rc >= 0)
			return rc;
	}
	if (FN(rewrite)(skb, p, 1, &fwd->nat_addr, fwd->nat_port) < 0 || FN(rewrite)(skb, p, 0, &rk.dst, fwd->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (tc)
		return FN(encap_out)(skb, p, tc, AARG(fwd->tun_addr));
	if (from == FROM_HOST || !ADDR_ZERO(fwd->nat_saddr) || (fwd->flags & CT_F_LOCAL))
		return FN(fib_out)(skb, AARG(p->src), AARG(p->dst), 1);
	return TC_ACT_OK;
}

/* redirect_back sends a packet of a flow that came in from outside back the way its request
 * came: out of that interface, to the hop it came from. */
static __always_inline int FN(redirect_back)(struct __sk_buff *skb, const ct_val_t *rev)
{
	__u8 m[12];
	__builtin_memcpy(m, rev->mac_peer, 6);
	__builtin_memcpy(m + 6, rev->mac_local, 6);
	if (bpf_skb_store_bytes(skb, 0, m, 12, 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(rev->ifindex, 0);
}

/* reply_out sends a translated reply (or an error about one) on: back the way the request
 * came (a client outside), or by the FIB (route), or on as it is. */
static __always_inline int FN(reply_out)(struct __sk_buff *skb, const ct_val_t *rev, int route, addr_arg_t src,
					 addr_arg_t dst)
{
	count(C_REV_NAT);
	if (rev->flags & CT_F_REDIRECT)
		return FN(redirect_back)(skb, rev);
	if (route)
		return FN(fib_out)(skb, src, dst, 1);
	return TC_ACT_OK;
}

/* reply undoes the translation of a reply from a backend and sends it back the way the
 * request came: out of the interface it arrived on, to the hop it came from. Other replies
 * (the client is a workload) are sent straight to the client through the FIB when route is
 * set: a reply whose source became one of this node's own addresses (a node port) would be
 * dropped by the kernel's input path as a martian. */
static __always_inline int FN(reply)(struct __sk_buff *skb, pkt_t *p, ct_val_t *rev, int route)
{
	rev->last_seen = bpf_ktime_get_ns();
	FN(tcp_track)(rev, p, 1);
	/* A hairpin reply is addressed to HAIRPIN_ADDR: it goes to the client's own address. */
	if (FN(rewrite)(skb, p, 0, &rev->nat_addr, rev->nat_port) < 0 ||
	    FN(rewrite)(skb, p, 1, ADDR_ZERO(rev->nat_saddr) ? &p->dst : &rev->nat_saddr, rev->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return FN(reply_out)(skb, rev, route, AARG(p->src), AARG(p->dst));
}

/* tun_reply sends a backend's packet of a flow forwarded here back through the tunnel to the
 * ingress node (t: the flow's CT_TUN entry, refreshed); egress: leaving by a host interface
 * (oversize's answer goes up into the host's stack). */
static __noinline int FN(tun_reply)(struct __sk_buff *skb, pkt_t *p, ct_val_t *t, int egress)
{
	tun_cfg_t *tc = TUN_CFG(config());
	if (!FN(tunnel_up)(tc)) {
		count(C_DROP_FIB);
		return TC_ACT_SHOT;
	}
	t->last_seen = bpf_ktime_get_ns();
	FN(tcp_track)(t, p, 1);
	addr_t peer = t->nat_addr;
	int rc = FN(oversize)(skb, p, tc, egress);
	if (rc >= 0)
		return rc;
	return FN(encap_out)(skb, p, tc, AARG(peer));
}

/* client_flow handles a packet in the client's direction (k, v: its tuple's entry, if any):
 * a known flow goes on as it began; a SYN on a closed or unanswered flow starts afresh (a new
 * backend; for an unanswered one, a new source port: NF_RETRY); anything else is a new flow
 * (NF_NEW), or not a service's. */
static __always_inline int FN(client_flow)(struct __sk_buff *skb, pkt_t *p, ct_key_t *k, ct_val_t *v, int from)
{
	if (p->later && !(v && v->type == CT_FWD))
		return TC_ACT_OK; /* a later fragment never starts a flow */
	if (v && v->type == CT_FWD) {
		if (!FN(is_syn)(p))
			return FN(forward)(skb, p, v, from);
		ct_key_t rk;
		FN(rev_key)(&rk, p, v);
		ct_val_t *r = bpf_map_lookup_elem(&CT_MAP, &rk);
		if (r && !closed_state(r->tcp) && (r->tcp & TCP_REPLIED))
			return FN(forward)(skb, p, v, from);
		int retry = r && !closed_state(r->tcp);
		bpf_map_delete_elem(&CT_MAP, &rk);
		bpf_map_delete_elem(&CT_MAP, k);
		if (retry)
			return NF_RETRY;
	}
	return NF_NEW;
}
