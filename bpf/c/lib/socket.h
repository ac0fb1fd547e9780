/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket hooks: host sockets connected straight to a backend (cgroup connect4, sendmsg4,
 * recvmsg4). */
#ifndef SLUICE_LIB_SOCKET_H
#define SLUICE_LIB_SOCKET_H

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_key_v4);
	__type(value, struct sock_val_v4);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_sock_v4 SEC(".maps");

/* sock_nat points a host socket at a backend of the frontend it asks for: the node's own
 * connections to cluster IPs, external and load-balancer addresses and its node ports never
 * need per-packet translation (Cilium's socket load balancing). Only sockets of this agent's
 * network namespace are touched. Returns 0 to refuse (no endpoint, unknown port of a cluster
 * IP), 1 to let the call go on. */
static __always_inline int sock_nat(struct bpf_sock_addr *ctx, int remember)
{
	struct cfg *c = config();
	if (!c || !c->netns_cookie || bpf_get_netns_cookie(ctx) != c->netns_cookie)
		return 1;
	__u8 proto = ctx->protocol;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	struct fe_key_v4 fk = {.addr = ctx->user_ip4, .port = (__u16)ctx->user_port, .proto = proto};
	struct fe_val *fe = bpf_map_lookup_elem(&sl_fe_v4, &fk);
	if (!fe) {
		struct fe_key_v4 ak = {.addr = ctx->user_ip4};
		if (bpf_map_lookup_elem(&sl_fe_v4, &ak)) {
			count(C_REJECT_SOCK);
			return 0;
		}
		return 1;
	}
	if (fe->flags & FE_ADDR_ONLY)
		return 1;
	__u32 start = fe->cluster_start, end = fe->count;
	if (fe->flags & FE_INT_LOCAL) {
		start = 0;
		end = fe->local;
	}
	if (end > fe->count)
		end = fe->count;
	if (start >= end) {
		count(C_REJECT_SOCK);
		return 0;
	}
	struct be_val_v4 *be = pick(&fk, fe, start, end, 0, bpf_ktime_get_ns());
	if (!be) {
		count(C_REJECT_SOCK);
		return 0;
	}
	if (remember) {
		struct sock_key_v4 sk = {.cookie = bpf_get_socket_cookie(ctx), .addr = be->addr, .port = be->port};
		struct sock_val_v4 sv = {.fe_addr = fk.addr, .fe_port = fk.port};
		bpf_map_update_elem(&sl_sock_v4, &sk, &sv, BPF_ANY);
	}
	ctx->user_ip4 = be->addr;
	ctx->user_port = be->port;
	count(C_SOCK_NAT);
	return 1;
}

SEC("cgroup/connect4")
int sl_sock_connect4(struct bpf_sock_addr *ctx)
{
	return sock_nat(ctx, ctx->protocol == IPPROTO_UDP);
}

SEC("cgroup/sendmsg4")
int sl_sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock_nat(ctx, 1);
}

/* sl_sock_recvmsg4 shows a datagram from a backend as coming from the frontend the socket
 * sent to. */
SEC("cgroup/recvmsg4")
int sl_sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	struct cfg *c = config();
	if (!c || !c->netns_cookie || bpf_get_netns_cookie(ctx) != c->netns_cookie)
		return 1;
	struct sock_key_v4 sk = {.cookie = bpf_get_socket_cookie(ctx), .addr = ctx->user_ip4, .port = (__u16)ctx->user_port};
	struct sock_val_v4 *sv = bpf_map_lookup_elem(&sl_sock_v4, &sk);
	if (sv) {
		ctx->user_ip4 = sv->fe_addr;
		ctx->user_port = sv->fe_port;
	}
	return 1;
}

#endif
