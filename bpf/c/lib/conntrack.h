/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection tracking: TCP state, the tests on it, dropping superseded state, the young-flow
 * ring that evicts unestablished flows, and writing entries. Included once per family
 * (lib/family.h): the state bits and rules are one, the tables are each family's. */

#ifndef SLUICE_LIB_CONNTRACK_SHARED
#define SLUICE_LIB_CONNTRACK_SHARED

/* tcp_next is the state bits of a REV or TUN entry after a packet of its flow with these
 * transport protocol and TCP flags (reply: from the backend). A flow of another protocol
 * (UDP) is only marked replied, which the cleaner reads as the kernel's "stream": answered UDP
 * lives 120 s, not 30. */
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

/* established_state says whether a flow's state entry (REV or TUN) is past its handshake: TCP
 * answered and acknowledged, another protocol answered. Only such flows are never evicted. */
static __always_inline int established_state(__u8 t, __u8 proto)
{
	if (proto != IPPROTO_TCP)
		return t & TCP_REPLIED;
	return (t & (TCP_REPLIED | TCP_OPENING)) == TCP_REPLIED;
}

/* closed_state says whether a new SYN may reuse the tuple of an entry in this state. */
static __always_inline int closed_state(__u8 t)
{
	return (t & TCP_RST) || ((t & TCP_FIN_FWD) && (t & TCP_FIN_REV));
}

/* syn_only and syn_ack read a packet's transport protocol and TCP flags. */
static __always_inline int syn_only(__u8 proto, __u8 f)
{
	return proto == IPPROTO_TCP && (f & (TH_SYN | TH_ACK)) == TH_SYN;
}

static __always_inline int syn_ack(__u8 proto, __u8 f)
{
	return proto == IPPROTO_TCP && (f & (TH_SYN | TH_ACK | TH_RST)) == (TH_SYN | TH_ACK);
}

#endif /* SLUICE_LIB_CONNTRACK_SHARED */

/* ct_key is the key of p's tuple as it travels (rev 0) or turned round (rev 1). */
static __always_inline void FN(ct_key)(ct_key_t *k, pkt_t *p, int rev)
{
	k->src = rev ? p->dst : p->src;
	k->dst = rev ? p->src : p->dst;
	k->sport = rev ? p->dport : p->sport;
	k->dport = rev ? p->sport : p->dport;
	k->proto = p->proto;
	k->pad[0] = k->pad[1] = k->pad[2] = 0;
}

/* tcp_track keeps the state bits of a REV or TUN entry for a packet of its flow, written only
 * when they change (an entry's cache line is not dirtied by every packet). */
static __always_inline void FN(tcp_track)(ct_val_t *v, pkt_t *p, int reply)
{
	__u8 t = tcp_next(v->tcp, p->proto, p->tcp_flags, reply);
	if (t != v->tcp)
		v->tcp = t;
}

static __always_inline int FN(is_syn)(pkt_t *p)
{
	return syn_only(p->proto, p->tcp_flags);
}

/* ct_forget deletes a reverse or tunnel entry and, for a reverse entry, its forward pair. A
 * function of its own: its key is not on the stack of the paths that call it. */
static __noinline void FN(ct_forget)(ct_key_t *k, ct_val_t *v)
{
	if (v->type == CT_REV) {
		ct_key_t fk = {.dst = v->nat_addr, .sport = v->nat_sport, .dport = v->nat_port, .proto = k->proto};
		fk.src = ADDR_ZERO(v->nat_saddr) ? k->dst : v->nat_saddr;
		bpf_map_delete_elem(&CT_MAP, &fk);
	}
	bpf_map_delete_elem(&CT_MAP, k);
}

/* ct_drop deletes the state of a flow that a new connection on the same tuple supersedes. */
static __always_inline void FN(ct_drop)(ct_key_t *k, ct_val_t *v)
{
	FN(ct_forget)(k, v);
	count(C_CT_SUPERSEDED);
}

/* young records a new flow's state entry in this CPU's ring (the family's own, of the same
 * size), evicting the flow whose slot it takes if that one is still not established. */
static __noinline void FN(young)(ct_key_t *k, __u64 created)
{
	__u32 zero = 0;
	__u32 *pos = bpf_map_lookup_elem(&YOUNG_POS_MAP, &zero);
	if (!pos)
		return;
	__u32 i = *pos;
	ct_young_t *y = bpf_map_lookup_elem(&YOUNG_MAP, &i);
	if (!y) {
		/* Past the ring's end (its size is the agent's): round to the start. */
		i = 0;
		y = bpf_map_lookup_elem(&YOUNG_MAP, &i);
		if (!y)
			return;
	}
	*pos = i + 1;
	/* TCP only: a handshake not done a ring's turn later (every CPU's share of an eighth of
	 * the table's flows made since) is a SYN flood's or dead. A UDP flow is left alone: one
	 * that never answers may be a one-way stream (syslog), and a slow answer (a resolver
	 * asking upstream) must still find its flow on a busy node. */
	if (y->created && y->key.proto == IPPROTO_TCP) {
		ct_val_t *v = bpf_map_lookup_elem(&CT_MAP, &y->key);
		if (v && v->created == y->created && (v->type == CT_REV || v->type == CT_TUN) &&
		    !established_state(v->tcp, y->key.proto)) {
			FN(ct_forget)(&y->key, v);
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
static __always_inline int FN(stale_reply)(pkt_t *p, ct_key_t *k, ct_val_t *v)
{
	if (!(FN(is_syn)(p) || (syn_ack(p->proto, p->tcp_flags) && closed_state(v->tcp))))
		return 0;
	FN(ct_drop)(k, v);
	return 1;
}

/* supersede drops the reverse or tunnel state of the tuple a SYN that is addressed to no
 * frontend opens: a client reusing a port towards an endpoint's own address after a flow
 * through a service must never have its answers translated by the old flow's state. */
static __always_inline void FN(supersede)(pkt_t *p)
{
	if (!FN(is_syn)(p))
		return;
	ct_key_t rk;
	FN(ct_key)(&rk, p, 1);
	ct_val_t *v = bpf_map_lookup_elem(&CT_MAP, &rk);
	if (v && (v->type == CT_REV || v->type == CT_TUN))
		FN(ct_drop)(&rk, v);
}

static __always_inline int FN(ct_put)(ct_key_t *k, ct_val_t *v, __u64 flags)
{
	long rc = bpf_map_update_elem(&CT_MAP, k, v, flags);
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
