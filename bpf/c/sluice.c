// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* sluice's service data path: tc programs on host and workload interfaces that translate
 * service traffic (cluster IPs, node ports, external and load-balancer addresses), forward
 * node-port traffic to an endpoint's node through a VXLAN tunnel of their own (the client's
 * address kept), and send replies back the way the request came. See docs/internals.md ("bpf")
 * for the design and the Go files of package bpf for the other side.
 *
 * The parts are headers under lib/, by concern, included once here in the order their
 * definitions need (and that keeps the slow paths, BPF-to-BPF functions, in one order). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sluice.h"

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/conntrack.h"
#include "lib/icmp.h"
#include "lib/frag.h"
#include "lib/fib.h"
#include "lib/tunnel.h"
#include "lib/lb.h"
#include "lib/nat.h"
#include "lib/icmp_nat.h"
#include "lib/tunnel_in.h"
#include "lib/maps6.h"
#include "lib/parse6.h"
#include "lib/conntrack6.h"
#include "lib/icmp6.h"
#include "lib/lb6.h"
#include "lib/tunnel6.h"
#include "lib/nat6.h"
#include "lib/tunnel_in6.h"
#include "lib/icmp6_nat.h"

SEC("tc")
int sl_from_host(struct __sk_buff *skb)
{
	/* A tagged packet on a VLAN's parent: the VLAN device's own hook takes it next (the
	 * kernel untags before this hook, so it reads as IPv4 here). Replies recorded on the
	 * parent would leave untagged. */
	if (skb->vlan_present)
		return TC_ACT_OK;
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return to_v6(skb, PROG6_FROM_HOST);
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	struct pkt p = {};
	if (parse(skb, IP_OFF, &p) < 0)
		return TC_ACT_OK;
	/* The settings are one array entry, always there; older verifiers (6.1) cannot tell, so
	 * every program checks the lookup once, before anything reads it. */
	struct cfg *c = config();
	if (!c)
		return TC_ACT_OK;
	if (p.proto == IPPROTO_ICMP) {
		int rc = icmp_error(skb, &p, c, 1, 0);
		return rc < 0 ? TC_ACT_OK : rc;
	}
	if (p.frag & IP_RF) {
		int rc = frag_rest(skb, &p, c);
		if (rc >= 0)
			return rc;
	}
	frag_track(&p);
	if (!is_l4(&p))
		return TC_ACT_OK;
	if (p.proto == IPPROTO_UDP && p.dport == c->vxlan_port) {
		/* The tunnel's outer header is never cut by sluice; a fragment of it (an underlay
		 * router fragmented it) cannot be unwrapped piecewise: the kernel's reassembly gets it. */
		if (p.frag & (IP_MF | IP_OFFMASK))
			return TC_ACT_OK;
		/* The unwrapped ICMP error comes back in p (the outer header is not needed after). */
		__be32 tun_src = p.src;
		int rc = tunnel_in(skb, &p, c, &p);
		if (rc != TUN_ICMP)
			return rc;
		/* Only errors about flows between this node and the sender travel the tunnel: the
		 * backend's about a flow forwarded there, the ingress node's about a reply. */
		rc = icmp_error(skb, &p, c, 1, tun_src);
		if (rc < 0) {
			count(C_DROP_MALFORMED);
			return TC_ACT_SHOT;
		}
		return rc;
	}
	struct ct_key_v4 k = {.src = p.src, .dst = p.dst, .sport = p.sport, .dport = p.dport, .proto = p.proto};
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &k);
	if (v && v->type == CT_REV) {
		if (!stale_reply(&p, &k, v))
			return reply(skb, &p, v, 1);
		v = 0;
	}
	return client_flow(skb, &p, c, &k, v, FROM_HOST);
}

SEC("tc")
int sl_from_wep(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return to_v6(skb, PROG6_FROM_WEP);
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	struct pkt p = {};
	if (parse(skb, IP_OFF, &p) < 0)
		return TC_ACT_OK;
	struct cfg *c = config();
	if (!c)
		return TC_ACT_OK;
	if (p.proto == IPPROTO_ICMP) {
		int rc = icmp_error(skb, &p, c, 1, 0);
		return rc < 0 ? TC_ACT_OK : rc;
	}
	if (p.frag & IP_RF) {
		int rc = frag_rest(skb, &p, c);
		if (rc >= 0)
			return rc;
	}
	frag_track(&p);
	if (!is_l4(&p))
		return TC_ACT_OK;
	struct ct_key_v4 k = {.src = p.src, .dst = p.dst, .sport = p.sport, .dport = p.dport, .proto = p.proto};
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &k);
	if (v && (v->type == CT_REV || v->type == CT_TUN) && stale_reply(&p, &k, v))
		v = 0;
	if (v) {
		if (v->type == CT_REV)
			return reply(skb, &p, v, 1);
		if (v->type == CT_TUN) {
			v->last_seen = bpf_ktime_get_ns();
			tcp_track(v, &p, 1);
			__be32 peer = v->nat_addr;
			int rc = oversize(skb, &p, c, 0);
			if (rc >= 0)
				return rc;
			return encap_out(skb, &p, c, peer);
		}
	}
	return client_flow(skb, &p, c, &k, v, FROM_WEP);
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
static __always_inline int leaving(struct __sk_buff *skb, int host)
{
	/* Tagged by a VLAN device on its way out of the parent: that device's hook saw it. */
	if (skb->vlan_present)
		return TC_ACT_OK;
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return to_v6(skb, host ? PROG6_TO_HOST : PROG6_TO_WEP);
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	struct pkt p = {};
	if (parse(skb, IP_OFF, &p) < 0)
		return TC_ACT_OK;
	struct cfg *c = config();
	if (!c)
		return TC_ACT_OK;
	if (p.proto == IPPROTO_ICMP) {
		int rc = icmp_error(skb, &p, c, 0, 0);
		return rc < 0 ? TC_ACT_OK : rc;
	}
	if (p.frag & IP_RF) {
		int rc = frag_rest(skb, &p, c);
		if (rc >= 0)
			return rc;
	}
	frag_track(&p);
	if (!is_l4(&p))
		return TC_ACT_OK;
	struct ct_key_v4 k = {.src = p.src, .dst = p.dst, .sport = p.sport, .dport = p.dport, .proto = p.proto};
	if (!host && is_syn(&p)) {
		/* A SYN on its way to a workload after the translation (or straight to its address)
		 * on the tuple of a closed flow: a new connection, which the closed flow's state must
		 * not answer for. A SYN through the service renewed that state before it got here. */
		struct ct_key_v4 rk = {.src = p.dst, .dst = p.src, .sport = p.dport, .dport = p.sport, .proto = p.proto};
		struct ct_val_v4 *r = bpf_map_lookup_elem(&sl_ct_v4, &rk);
		if (r && (r->type == CT_REV || r->type == CT_TUN) && closed(r))
			ct_drop(&rk, r);
		return TC_ACT_OK;
	}
	struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &k);
	if (!v)
		return TC_ACT_OK;
	if ((v->type == CT_REV || v->type == CT_TUN) && stale_reply(&p, &k, v))
		return TC_ACT_OK;
	if (v->type == CT_REV && !host)
		return (v->flags & CT_F_REDIRECT) ? TC_ACT_OK : reply(skb, &p, v, 0);
	if (v->type == CT_REV) {
		/* Already on the way out of the interface the request came in by: the MACs are
		 * set and the packet goes on, rather than being queued to this device again. */
		if ((v->flags & CT_F_REDIRECT) && v->ifindex == skb->ifindex) {
			int rc = reply(skb, &p, v, 0);
			return rc == TC_ACT_REDIRECT ? TC_ACT_OK : rc;
		}
		return reply(skb, &p, v, 0);
	}
	if (v->type == CT_TUN && host) {
		v->last_seen = bpf_ktime_get_ns();
		tcp_track(v, &p, 1);
		__be32 peer = v->nat_addr;
		int rc = oversize(skb, &p, c, 1);
		if (rc >= 0)
			return rc;
		return encap_out(skb, &p, c, peer);
	}
	return TC_ACT_OK;
}

SEC("tc")
int sl_to_wep(struct __sk_buff *skb)
{
	return leaving(skb, 0);
}

SEC("tc")
int sl_to_host(struct __sk_buff *skb)
{
	return leaving(skb, 1);
}

#include "lib/prog6.h"
#include "lib/socket.h"
#include "lib/clean.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
