/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection tracking: TCP state, the tests on it, dropping superseded state, the young-flow
 * ring that evicts unestablished flows, and writing entries. */
#ifndef SLUICE_LIB_CONNTRACK_H
#define SLUICE_LIB_CONNTRACK_H

/* tcp_next is the state bits of a REV or TUN entry after a packet of its flow with these
 * transport protocol and TCP flags (reply: from the backend), for both families. A flow of
 * another protocol (UDP) is only marked replied, which the cleaner reads as the kernel's
 * "stream": answered UDP lives 120 s, not 30. */
static __always_inline __u8 tcp_next(__u8 t, __u8 proto, __u8 f, int reply)
{
	if (proto != IPPROTO_TCP) {
		if (reply)
			t |= TCP_REPLIED;
		return t;
	}
	if ((f & TH_SYN) && !(f & TH_ACK) && !reply)
		t |= TCP_SYN;
	if (reply && !(t & TCP_REPLIED))
		t |= TCP_REPLIED | TCP_OPENING;
	else if (!reply && (t & TCP_OPENING) && (f & TH_ACK) && !(f & (TH_SYN | TH_RST)))
		t &= ~TCP_OPENING;
	if (f & TH_FIN)
		t |= reply ? TCP_FIN_REV : TCP_FIN_FWD;
	if (f & TH_RST) {
		t |= TCP_RST;
		t &= ~(TCP_LIVE_FWD | TCP_LIVE_REV);
	} else if (t & TCP_RST) {
		/* Sequence numbers are not tracked, so an RST out of window (or a middlebox's the
		 * peers ignore) sets the bit too; traffic of both directions after it says the
		 * connection lives on, and gives it its established timeout back. */
		t |= reply ? TCP_LIVE_REV : TCP_LIVE_FWD;
		if ((t & (TCP_LIVE_FWD | TCP_LIVE_REV)) == (TCP_LIVE_FWD | TCP_LIVE_REV))
			t &= ~(TCP_RST | TCP_LIVE_FWD | TCP_LIVE_REV);
	}
	return t;
}

/* tcp_track keeps the state bits of a REV or TUN entry for a packet of its flow, written only
 * when they change (an entry's cache line is not dirtied by every packet). */
static __always_inline void tcp_track(struct ct_val_v4 *v, struct pkt *p, int reply)
{
	__u8 t = tcp_next(v->tcp, p->proto, p->tcp_flags, reply);
	if (t != v->tcp)
		v->tcp = t;
}

/* established says whether a flow's state entry (REV or TUN) is past its handshake: TCP
 * answered and acknowledged, another protocol answered. Only such flows are never evicted. */
static __always_inline int established_state(__u8 t, __u8 proto)
{
	if (proto != IPPROTO_TCP)
		return t & TCP_REPLIED;
	return (t & (TCP_REPLIED | TCP_OPENING)) == TCP_REPLIED;
}

static __always_inline int established(struct ct_val_v4 *v, __u8 proto)
{
	return established_state(v->tcp, proto);
}

/* closed says whether a new SYN may reuse the tuple of an entry in this state. */
static __always_inline int closed_state(__u8 t)
{
	return (t & TCP_RST) || ((t & TCP_FIN_FWD) && (t & TCP_FIN_REV));
}

static __always_inline int closed(struct ct_val_v4 *v)
{
	return closed_state(v->tcp);
}

/* syn_only and syn_ack read a packet's transport protocol and TCP flags (either family). */
static __always_inline int syn_only(__u8 proto, __u8 f)
{
	return proto == IPPROTO_TCP && (f & (TH_SYN | TH_ACK)) == TH_SYN;
}

static __always_inline int syn_ack(__u8 proto, __u8 f)
{
	return proto == IPPROTO_TCP && (f & (TH_SYN | TH_ACK | TH_RST)) == (TH_SYN | TH_ACK);
}

static __always_inline int is_syn(struct pkt *p)
{
	return syn_only(p->proto, p->tcp_flags);
}

static __always_inline int is_synack(struct pkt *p)
{
	return syn_ack(p->proto, p->tcp_flags);
}

/* ct_drop deletes a reverse or tunnel entry and, for a reverse entry, its forward pair: the
 * state of a flow that a new connection on the same tuple supersedes. */
static __always_inline void ct_forget(struct ct_key_v4 *k, struct ct_val_v4 *v)
{
	if (v->type == CT_REV) {
		struct ct_key_v4 fk = {.src = v->nat_saddr ? v->nat_saddr : k->dst, .dst = v->nat_addr,
				       .sport = v->nat_sport, .dport = v->nat_port, .proto = k->proto};
		bpf_map_delete_elem(&sl_ct_v4, &fk);
	}
	bpf_map_delete_elem(&sl_ct_v4, k);
}

static __always_inline void ct_drop(struct ct_key_v4 *k, struct ct_val_v4 *v)
{
	ct_forget(k, v);
	count(C_CT_SUPERSEDED);
}

/* young records a new flow's state entry in this CPU's ring, evicting the flow whose slot it
 * takes if that one is still not established. */
static __noinline void young(struct ct_key_v4 *k, __u64 created)
{
	__u32 zero = 0;
	__u32 *pos = bpf_map_lookup_elem(&sl_ct_young_pos, &zero);
	if (!pos)
		return;
	__u32 i = *pos;
	struct ct_young_v4 *y = bpf_map_lookup_elem(&sl_ct_young_v4, &i);
	if (!y) {
		/* Past the ring's end (its size is the agent's): round to the start. */
		i = 0;
		y = bpf_map_lookup_elem(&sl_ct_young_v4, &i);
		if (!y)
			return;
	}
	*pos = i + 1;
	/* TCP only: a handshake not done a ring's turn later (every CPU's share of an eighth of
	 * the table's flows made since) is a SYN flood's or dead. A UDP flow is left alone: one
	 * that never answers may be a one-way stream (syslog), and a slow answer (a resolver
	 * asking upstream) must still find its flow on a busy node. */
	if (y->created && y->key.proto == IPPROTO_TCP) {
		struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &y->key);
		if (v && v->created == y->created && (v->type == CT_REV || v->type == CT_TUN) &&
		    !established(v, y->key.proto)) {
			ct_forget(&y->key, v);
			count(C_CT_EVICTED);
		}
	}
	y->key = *k;
	y->created = created;
}

/* stale_reply says whether a packet that matched a reverse or tunnel entry (k, v) in the
 * reply direction belongs to another connection than the entry's flow: a SYN (a new
 * connection opened from the backend's side), or a SYN-ACK while the flow is closed (an
 * answer to a new connection whose SYN came some other way: straight to the backend's own
 * address; a SYN through the service would have renewed the entry). Such state is dropped,
 * and the packet goes on untranslated. */
static __always_inline int stale_reply(struct pkt *p, struct ct_key_v4 *k, struct ct_val_v4 *v)
{
	if (!(is_syn(p) || (is_synack(p) && closed(v))))
		return 0;
	ct_drop(k, v);
	return 1;
}

/* supersede drops the reverse or tunnel state of the tuple a SYN that is addressed to no
 * frontend opens: a client reusing a port towards an endpoint's own address after a flow
 * through a service must never have its answers translated by the old flow's state. */
static __always_inline void supersede(struct pkt *p)
{
	if (!is_syn(p))
		return;
	struct ct_key_v4 rk = {.src = p->dst, .dst = p->src, .sport = p->dport, .dport = p->sport, .proto = p->proto};
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &rk);
	if (v && (v->type == CT_REV || v->type == CT_TUN))
		ct_drop(&rk, v);
}

static __always_inline int ct_put(struct ct_key_v4 *k, struct ct_val_v4 *v, __u64 flags)
{
	long rc = bpf_map_update_elem(&sl_ct_v4, k, v, flags);
	if (rc == -17 /* EEXIST: another CPU took the tuple first */) {
		count(C_DROP_COLLISION);
		return -1;
	}
	if (rc < 0) {
		count(C_DROP_CT_FULL);
		return -1;
	}
	return 0;
}

#endif
