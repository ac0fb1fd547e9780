/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service NAT flows: a new flow (backend chosen, entries made, translated, sent), a known
 * flow in the client's direction, and replies sent back the way the request came. */
#ifndef SLUICE_LIB_NAT_H
#define SLUICE_LIB_NAT_H

/* Where a new flow came from. */
#define FROM_HOST 0 /* a host interface: outside the cluster unless the source is a node or pool */
#define FROM_WEP 1  /* a workload: inside the cluster */

/* new_flow translates the first packet of a flow to a service: picks a backend, records the
 * flow, rewrites the packet and sends it on. Returns a tc verdict; TC_ACT_OK when the packet
 * is not for a service. */
static __noinline int new_flow(struct __sk_buff *skb, struct pkt *p, struct cfg *c, int from, int retry)
{
	struct fe_key_v4 fk;
	struct fe_val *fe = lookup_frontend(skb, p, &fk);
	if (!fe) {
		struct fe_key_v4 ak = {.addr = p->dst};
		if (bpf_map_lookup_elem(&sl_fe_v4, &ak))
			return reject(skb, p, C_REJECT_PORT);
		supersede(p);
		return TC_ACT_OK;
	}
	/* A node port is one of the node's own ports: a host socket whose ephemeral port falls in
	 * the node-port range gets its answers there. A TCP segment that opens no connection (no
	 * SYN) and belongs to no flow is such an answer, never a client's new flow: it goes to the
	 * host's stack. (UDP cannot be told apart: sluiced reserves the range for the node's own
	 * sockets, ip_local_reserved_ports.) */
	if ((fe->flags & FE_NODE_PORT) && p->proto == IPPROTO_TCP && !is_syn(p))
		return TC_ACT_OK;
	int outside = 0;
	if (from == FROM_HOST) {
		struct cnet_val *cn = cluster_net(p->src);
		outside = !cn;
	}
	if ((fe->flags & FE_SRC_RANGES) && outside) {
		struct src_key_v4 sk = {.prefixlen = 96, .fe_addr = fk.addr, .fe_port = fk.port, .proto = fk.proto, .src = p->src};
		if (!bpf_map_lookup_elem(&sl_src_v4, &sk)) {
			count(C_DROP_SRC_RANGE);
			return TC_ACT_SHOT;
		}
	}
	__u32 start = fe->cluster_start, end = fe->count;
	int local_only = outside ? (fe->flags & FE_EXT_LOCAL) : (fe->flags & FE_INT_LOCAL);
	if (local_only) {
		start = 0;
		end = fe->local;
	}
	if (end > fe->count)
		end = fe->count;
	if (start >= end) {
		if (local_only) {
			count(C_DROP_NO_LOCAL);
			return TC_ACT_SHOT;
		}
		return reject(skb, p, C_REJECT_NO_BACKEND);
	}
	__u64 now = bpf_ktime_get_ns();
	struct be_val_v4 *bep = pick(&fk, fe, start, end, p->src, now);
	if (!bep)
		return reject(skb, p, C_REJECT_NO_BACKEND);
	struct be_val_v4 be = *bep;
	/* A routed backend (on no node) is reached as a local one is: DNAT only, never the
	 * tunnel; its replies come back by a host interface and meet the REV entry there. */
	int remote = !(be.flags & (BE_LOCAL | BE_ROUTED));
	/* Hairpin: a workload whose flow lands on itself would answer itself inside its own
	 * namespace, from its own address, and the client (itself) would reset the connection.
	 * As Cilium does, such a flow also gets the source HAIRPIN_ADDR: the answer leaves the
	 * workload by its default route and comes back here, to the REV entry. The workload
	 * sees the hairpin address as its client (Cilium #26100). Only for a workload's flow to
	 * a backend here: the address must never leave the node (Cilium #10841). */
	int hairpin = !remote && from == FROM_WEP && be.addr == p->src;
	__be32 saddr = hairpin ? bpf_htonl(HAIRPIN_ADDR) : p->src;
	if (remote && !c)
		return TC_ACT_SHOT;
	if (remote) {
		int rc = oversize(skb, p, c, 0);
		if (rc >= 0)
			return rc;
	}
	__be16 sport = p->sport;
	struct ct_key_v4 rk = {.src = be.addr, .dst = saddr, .sport = be.port, .proto = p->proto};
	rk.dport = sport;
	/* The client's own port is kept when nothing here uses the backend-side tuple, as the
	 * kernel's NAT keeps it: the endpoint then sees the ports the client's own stack manages
	 * (a port of ours reused while the endpoint still holds the last connection in
	 * TIME_WAIT would be refused by PAWS). A flow of the same client ip:port to another
	 * frontend of the same backend (Cilium #11810) gets a port of its own from the range, and
	 * so does a SYN sent again for a forwarded flow that got no answer: two clients behind
	 * one load balancer reusing a source port towards two nodes meet on the endpoint's node,
	 * which drops the second (counted), and its retry comes with another port. */
	if (bpf_map_lookup_elem(&sl_ct_v4, &rk) || (remote && retry)) {
		if (c && c->psnat_max > c->psnat_min) {
			__u32 span = c->psnat_max - c->psnat_min + 1;
			for (int i = 0; i < 8; i++) {
				sport = bpf_htons(c->psnat_min + bpf_get_prandom_u32() % span);
				rk.dport = sport;
				if (!bpf_map_lookup_elem(&sl_ct_v4, &rk))
					break;
			}
		}
		if (bpf_map_lookup_elem(&sl_ct_v4, &rk)) {
			/* No free port: drop (the client retries) rather than take a live flow's entry. */
			count(C_DROP_COLLISION);
			return TC_ACT_SHOT;
		}
	}
	/* One entry on the stack, written as the reverse entry and then as the forward one. */
	__u8 flags = 0;
	if (remote)
		flags |= CT_F_REMOTE;
	if (sport != p->sport)
		flags |= CT_F_PSNAT;
	if (be.flags & BE_LOCAL)
		flags |= CT_F_LOCAL;
	struct ct_val_v4 rev = {.created = now, .last_seen = now, .type = CT_REV, .flags = flags, .nat_addr = p->dst,
				.nat_port = p->dport, .nat_sport = p->sport};
	if (hairpin)
		rev.nat_saddr = p->src;
	if (remote)
		rev.tun_addr = be.node_addr;
	if (from == FROM_HOST) {
		__u8 m[12];
		if (bpf_skb_load_bytes(skb, 0, m, 12) < 0)
			return TC_ACT_SHOT;
		__builtin_memcpy(rev.mac_local, m, 6);
		__builtin_memcpy(rev.mac_peer, m + 6, 6);
		/* On the ingress hook both name the same interface; a test run before 5.15 cannot set
		 * ingress_ifindex, so fall back as the FIB lookups do. */
		rev.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
		rev.flags |= CT_F_REDIRECT;
	}
	tcp_track(&rev, p, 0);
	if (ct_put(&rk, &rev, BPF_NOEXIST) < 0)
		return TC_ACT_SHOT;
	struct ct_val_v4 *fwd = &rev;
	__builtin_memset(fwd, 0, sizeof(*fwd));
	fwd->created = now;
	fwd->last_seen = now;
	fwd->type = CT_FWD;
	fwd->flags = flags;
	fwd->nat_addr = be.addr;
	fwd->nat_port = be.port;
	fwd->nat_sport = sport;
	if (hairpin)
		fwd->nat_saddr = saddr;
	if (remote)
		fwd->tun_addr = be.node_addr;
	struct ct_key_v4 *fk2 = &rk; /* the reverse key is in the map: its stack slot is reused */
	fk2->src = p->src;
	fk2->dst = p->dst;
	fk2->sport = p->sport;
	fk2->dport = p->dport;
	struct ct_key_v4 yk = {.src = be.addr, .dst = saddr, .sport = be.port, .dport = sport, .proto = p->proto};
	if (ct_put(fk2, fwd, BPF_ANY) < 0) {
		bpf_map_delete_elem(&sl_ct_v4, &yk);
		return TC_ACT_SHOT;
	}
	young(&yk, now);
	count(C_NAT_NEW);
	if (rewrite(skb, p, 1, be.addr, be.port) < 0 || rewrite(skb, p, 0, saddr, sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (remote) {
		count(C_NAT_FWD_REMOTE);
		return encap_out(skb, p, c, be.node_addr);
	}
	/* A hairpin packet goes straight back to the workload's interface: to the kernel's
	 * forwarding it is a link-local source coming in from a workload, which a strict
	 * rp_filter drops. A workload's flow to a workload here goes the same way: its replies
	 * are sent around the kernel's forwarding path (reply), so the requests must be too, or
	 * conntrack, seeing one direction only, calls the client's ACKs INVALID and firewalls that
	 * drop those (kube-proxy's KUBE-FORWARD) break the flow. A routed endpoint's flow (on no
	 * node) keeps the kernel's path: outgoing NAT may have to masquerade it. */
	if (from == FROM_HOST || hairpin || (be.flags & BE_LOCAL))
		return fib_out(skb, p->src, p->dst, 1);
	return TC_ACT_OK;
}

/* forward handles a packet of a known flow in the client's direction. */
static __always_inline int forward(struct __sk_buff *skb, struct pkt *p, struct cfg *c, struct ct_val_v4 *f, int from)
{
	/* The entry is read in place: a copy would cost the programs' stack 64 bytes. */
	struct ct_val_v4 *fwd = f;
	__be32 saddr = fwd->nat_saddr ? fwd->nat_saddr : p->src;
	struct ct_key_v4 rk = {.src = fwd->nat_addr, .dst = saddr, .sport = fwd->nat_port, .dport = fwd->nat_sport, .proto = p->proto};
	struct ct_val_v4 *rev = bpf_map_lookup_elem(&sl_ct_v4, &rk);
	__u64 now = bpf_ktime_get_ns();
	if (rev) {
		rev->last_seen = now;
		tcp_track(rev, p, 0);
	}
	int remote = fwd->flags & CT_F_REMOTE;
	if (remote) {
		int rc = oversize(skb, p, c, 0);
		if (rc >= 0)
			return rc;
	}
	if (rewrite(skb, p, 1, fwd->nat_addr, fwd->nat_port) < 0 || rewrite(skb, p, 0, saddr, fwd->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (remote)
		return encap_out(skb, p, c, fwd->tun_addr);
	if (from == FROM_HOST || fwd->nat_saddr || (fwd->flags & CT_F_LOCAL))
		return fib_out(skb, p->src, p->dst, 1);
	return TC_ACT_OK;
}

/* redirect_back sends a packet of a flow that came in from outside back the way its request
 * came: out of that interface, to the hop it came from. */
static __always_inline int redirect_back(struct __sk_buff *skb, const struct ct_val_v4 *rev)
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
static __always_inline int reply_out(struct __sk_buff *skb, const struct ct_val_v4 *rev, int route, __be32 src,
				     __be32 dst)
{
	count(C_REV_NAT);
	if (rev->flags & CT_F_REDIRECT)
		return redirect_back(skb, rev);
	if (route)
		return fib_out(skb, src, dst, 1);
	return TC_ACT_OK;
}

/* reply undoes the translation of a reply from a backend and sends it back the way the
 * request came: out of the interface it arrived on, to the hop it came from. Other replies
 * (the client is a workload) are sent straight to the client through the FIB when route is
 * set: a reply whose source became one of this node's own addresses (a node port) would be
 * dropped by the kernel's input path as a martian. */
static __always_inline int reply(struct __sk_buff *skb, struct pkt *p, struct ct_val_v4 *r, int route)
{
	r->last_seen = bpf_ktime_get_ns();
	tcp_track(r, p, 1);
	struct ct_val_v4 *rev = r;
	/* A hairpin reply is addressed to HAIRPIN_ADDR: it goes to the client's own address. */
	__be32 client = rev->nat_saddr ? rev->nat_saddr : p->dst;
	if (rewrite(skb, p, 0, rev->nat_addr, rev->nat_port) < 0 || rewrite(skb, p, 1, client, rev->nat_sport) < 0) {
		count(C_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	return reply_out(skb, rev, route, p->src, p->dst);
}

/* client_flow handles a packet in the client's direction: a known flow goes on as it
 * began; a SYN on a closed or unanswered flow starts afresh (a new backend; for an unanswered
 * one, a new source port); anything else is a new flow, or not a service's. */
static __always_inline int client_flow(struct __sk_buff *skb, struct pkt *p, struct cfg *c, struct ct_key_v4 *k,
				       struct ct_val_v4 *v, int from)
{
	int retry = 0;
	if (p->later && !(v && v->type == CT_FWD))
		return TC_ACT_OK; /* a later fragment never starts a flow */
	if (v && v->type == CT_FWD) {
		if (!is_syn(p))
			return forward(skb, p, c, v, from);
		__be32 saddr = v->nat_saddr ? v->nat_saddr : p->src;
		struct ct_key_v4 rk = {.src = v->nat_addr, .dst = saddr, .sport = v->nat_port, .dport = v->nat_sport, .proto = p->proto};
		struct ct_val_v4 *r = bpf_map_lookup_elem(&sl_ct_v4, &rk);
		if (r && !closed(r) && (r->tcp & TCP_REPLIED))
			return forward(skb, p, c, v, from);
		retry = r && !closed(r);
		bpf_map_delete_elem(&sl_ct_v4, &rk);
		bpf_map_delete_elem(&sl_ct_v4, k);
	}
	return new_flow(skb, p, c, from, retry);
}

#endif
