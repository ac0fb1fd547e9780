/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket hooks: host sockets connected straight to a backend (cgroup connect, sendmsg,
 * recvmsg and getpeername, both families; IPv4 services reached from IPv6 sockets through
 * IPv4-mapped addresses, as Java and .NET clients connect). */
#ifndef SLUICE_LIB_SOCKET_H
#define SLUICE_LIB_SOCKET_H

/* A socket's backend, by the backend: what recvmsg and getpeername show instead (the
 * frontend the application asked for). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_key_v4);
	__type(value, struct sock_val_v4);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_sock_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_key_v6);
	__type(value, struct sock_val_v6);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_sock_v6 SEC(".maps");

/* An unconnected UDP socket's backend, by the frontend it sends to (same layouts, the other
 * way round): every datagram of one socket to one frontend goes to one endpoint while the
 * endpoint stays in the frontend's set, so a resolver's retries meet the server that has its
 * query, as they do through the kernel's conntrack. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_key_v4);
	__type(value, struct sock_val_v4);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_sock_be_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_key_v6);
	__type(value, struct sock_val_v6);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_sock_be_v6 SEC(".maps");

/* sock_nat4 and sock_nat6's how. */
#define SOCK_STICKY 1   /* an unconnected UDP send: keeps the socket's backend for the frontend */
#define SOCK_REMEMBER 2 /* keep the backend for recvmsg and getpeername */

/* What a socket hook decided. */
#define SOCK_PASS 0   /* not a service: the call goes on as it is */
#define SOCK_NAT 1    /* pointed at a backend */
#define SOCK_REFUSE 2 /* a service that cannot be reached: refused as kube-proxy refuses */

static __always_inline int our_netns(void *ctx)
{
	struct cfg *c = config();
	return c && c->netns_cookie && bpf_get_netns_cookie(ctx) == c->netns_cookie;
}

/* sock_set narrows a frontend's list to what the node's own sockets may use: its cluster set,
 * or its local set under internalTrafficPolicy Local. 0 when empty. */
static __always_inline int sock_set(struct fe_val *fe, __u32 *start, __u32 *end)
{
	*start = fe->cluster_start;
	*end = fe->count;
	if (fe->flags & FE_INT_LOCAL) {
		*start = 0;
		*end = fe->local;
	}
	if (*end > fe->count)
		*end = fe->count;
	return *start < *end;
}

/* sock_nat4 chooses a backend for a host socket asking for the IPv4 frontend *addr:*port and
 * writes it there; how is SOCK_STICKY and SOCK_REMEMBER. It returns SOCK_PASS, SOCK_NAT or
 * SOCK_REFUSE. */
static __noinline int sock_nat4(__u64 cookie, __u8 proto, __be32 *addr, __be16 *port, __u32 how)
{
	int sticky = how & SOCK_STICKY, remember = how & SOCK_REMEMBER;
	struct fe_key_v4 fk = {.addr = *addr, .port = *port, .proto = proto};
	struct fe_val *fe = bpf_map_lookup_elem(&sl_fe_v4, &fk);
	if (!fe) {
		struct fe_key_v4 ak = {.addr = *addr};
		return bpf_map_lookup_elem(&sl_fe_v4, &ak) ? SOCK_REFUSE : SOCK_PASS;
	}
	if (fe->flags & FE_ADDR_ONLY)
		return SOCK_PASS;
	__u32 start, end;
	if (!sock_set(fe, &start, &end))
		return SOCK_REFUSE;
	struct sock_key_v4 bk = {.cookie = cookie, .addr = fk.addr, .port = fk.port};
	struct be_val_v4 *be = 0;
	if (sticky) {
		struct sock_val_v4 *had = bpf_map_lookup_elem(&sl_sock_be_v4, &bk);
		if (had)
			be = in_set4(fe, start, end, had->fe_addr, had->fe_port);
	}
	if (!be)
		be = pick(&fk, fe, start, end, 0, bpf_ktime_get_ns());
	if (!be)
		return SOCK_REFUSE;
	if (sticky) {
		struct sock_val_v4 bv = {.fe_addr = be->addr, .fe_port = be->port};
		bpf_map_update_elem(&sl_sock_be_v4, &bk, &bv, BPF_ANY);
	}
	if (remember) {
		struct sock_key_v4 sk = {.cookie = cookie, .addr = be->addr, .port = be->port};
		struct sock_val_v4 sv = {.fe_addr = fk.addr, .fe_port = fk.port};
		bpf_map_update_elem(&sl_sock_v4, &sk, &sv, BPF_ANY);
	}
	*addr = be->addr;
	*port = be->port;
	return SOCK_NAT;
}

/* sock_nat6 is sock_nat4 for an IPv6 frontend. */
static __noinline int sock_nat6(__u64 cookie, __u8 proto, struct addr6 *addr, __be16 *port, __u32 how)
{
	int sticky = how & SOCK_STICKY, remember = how & SOCK_REMEMBER;
	struct fe_key_v6 fk = {.addr = *addr, .port = *port, .proto = proto};
	struct fe_val *fe = bpf_map_lookup_elem(&sl_fe_v6, &fk);
	if (!fe) {
		fk.port = 0;
		fk.proto = 0;
		return bpf_map_lookup_elem(&sl_fe_v6, &fk) ? SOCK_REFUSE : SOCK_PASS;
	}
	if (fe->flags & FE_ADDR_ONLY)
		return SOCK_PASS;
	__u32 start, end;
	if (!sock_set(fe, &start, &end))
		return SOCK_REFUSE;
	struct sock_key_v6 bk = {.cookie = cookie, .addr = fk.addr, .port = fk.port};
	struct be_val_v6 *be = 0;
	if (sticky) {
		struct sock_val_v6 *had = bpf_map_lookup_elem(&sl_sock_be_v6, &bk);
		if (had)
			be = in_set6(fe, start, end, &had->fe_addr, had->fe_port);
	}
	struct addr6 none = {};
	if (!be)
		be = pick6(&fk, fe, start, end, &none, bpf_ktime_get_ns());
	if (!be)
		return SOCK_REFUSE;
	if (sticky) {
		struct sock_val_v6 bv = {.fe_addr = be->addr, .fe_port = be->port};
		bpf_map_update_elem(&sl_sock_be_v6, &bk, &bv, BPF_ANY);
	}
	if (remember) {
		struct sock_key_v6 sk = {.cookie = cookie, .addr = be->addr, .port = be->port};
		struct sock_val_v6 sv = {.fe_addr = fk.addr, .fe_port = fk.port};
		bpf_map_update_elem(&sl_sock_v6, &sk, &sv, BPF_ANY);
	}
	*addr = be->addr;
	*port = be->port;
	return SOCK_NAT;
}

/* A refused TCP connect goes to the loopback's port 0, where no socket can listen: it gets the
 * reset a closed port sends (ECONNREFUSED, what kube-proxy's reject gives a client). UDP cannot
 * go to port 0 (the kernel refuses a send there with EINVAL, a connected IPv6 socket's send to
 * a mapped address too): it goes to the loopback's discard port (9), where the port
 * unreachable that comes back makes a connected socket's next call ECONNREFUSED and reaches an
 * unconnected one only if it asked for errors (IP_RECVERR): the send itself succeeds, as with
 * kube-proxy's reject. Where a socket of the node listens on 127.0.0.1's, the datagram would
 * reach it: the send is then refused with EPERM instead (IPv4 and mapped addresses; not yet
 * for ::1, see sock6). */
#define LOOPBACK4 0x7f000001
#define DISCARD_PORT 9

/* discard4_free says whether no UDP socket of the namespace listens on the loopback's discard
 * port (127.0.0.1). */
static __always_inline int discard4_free(struct bpf_sock_addr *ctx)
{
	struct bpf_sock_tuple t = {};
	t.ipv4.daddr = bpf_htonl(LOOPBACK4);
	t.ipv4.dport = bpf_htons(DISCARD_PORT);
	struct bpf_sock *sk = bpf_sk_lookup_udp(ctx, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 1;
	bpf_sk_release(sk);
	return 0;
}

static __always_inline int sock_verdict(int rc)
{
	if (rc == SOCK_NAT)
		count(C_SOCK_NAT);
	else if (rc == SOCK_REFUSE)
		count(C_REJECT_SOCK);
	return rc;
}

/* is_mapped says whether an IPv6 socket address is IPv4-mapped (::ffff:a.b.c.d). */
static __always_inline int is_mapped(struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 && ctx->user_ip6[2] == bpf_htonl(0xffff);
}

static __always_inline int sock4(struct bpf_sock_addr *ctx, int sticky)
{
	if (!our_netns(ctx))
		return 1;
	__u8 proto = ctx->protocol;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	__be32 addr = ctx->user_ip4;
	__be16 port = (__u16)ctx->user_port;
	int rc = sock_verdict(sock_nat4(bpf_get_socket_cookie(ctx), proto, &addr, &port, sticky | SOCK_REMEMBER));
	if (rc == SOCK_REFUSE) {
		if (proto == IPPROTO_UDP && !discard4_free(ctx))
			return 0;
		addr = bpf_htonl(LOOPBACK4);
		port = proto == IPPROTO_TCP ? 0 : bpf_htons(DISCARD_PORT);
	}
	if (rc != SOCK_PASS) {
		ctx->user_ip4 = addr;
		ctx->user_port = port;
	}
	return 1;
}

static __always_inline int sock6(struct bpf_sock_addr *ctx, int sticky)
{
	if (!our_netns(ctx))
		return 1;
	__u8 proto = ctx->protocol;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	__u64 cookie = bpf_get_socket_cookie(ctx);
	__be16 port = (__u16)ctx->user_port;
	int rc;
	if (is_mapped(ctx)) {
		/* An IPv4 service asked for by a dual-stack IPv6 socket (a connect: its sends to a
		 * mapped address meet sendmsg4): its backend, mapped. Remembered in the IPv4 map,
		 * where peer6 looks a mapped address up. */
		__be32 addr = ctx->user_ip6[3];
		rc = sock_verdict(sock_nat4(cookie, proto, &addr, &port, sticky | SOCK_REMEMBER));
		if (rc == SOCK_REFUSE) {
			if (proto == IPPROTO_UDP && !discard4_free(ctx))
				return 0;
			addr = bpf_htonl(LOOPBACK4);
			port = proto == IPPROTO_TCP ? 0 : bpf_htons(DISCARD_PORT);
		}
		if (rc != SOCK_PASS) {
			ctx->user_ip6[3] = addr;
			ctx->user_port = port;
		}
		return 1;
	}
	struct addr6 a;
	a.w[0] = ctx->user_ip6[0];
	a.w[1] = ctx->user_ip6[1];
	a.w[2] = ctx->user_ip6[2];
	a.w[3] = ctx->user_ip6[3];
	rc = sock_verdict(sock_nat6(cookie, proto, &a, &port, sticky | SOCK_REMEMBER));
	if (rc == SOCK_REFUSE) {
		/* No discard6_free here: on Linux 6.1 a socket lookup from sendmsg6 left the
		 * rewritten port 0 (the send failed with EINVAL; measured in the kernel matrix). */
		__builtin_memset(&a, 0, sizeof(a));
		a.w[3] = bpf_htonl(1); /* ::1 */
		port = proto == IPPROTO_TCP ? 0 : bpf_htons(DISCARD_PORT);
	}
	if (rc != SOCK_PASS) {
		ctx->user_ip6[0] = a.w[0];
		ctx->user_ip6[1] = a.w[1];
		ctx->user_ip6[2] = a.w[2];
		ctx->user_ip6[3] = a.w[3];
		ctx->user_port = port;
	}
	return 1;
}

SEC("cgroup/connect4")
int sl_sock_connect4(struct bpf_sock_addr *ctx)
{
	return sock4(ctx, 0);
}

SEC("cgroup/sendmsg4")
int sl_sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock4(ctx, SOCK_STICKY);
}

SEC("cgroup/connect6")
int sl_sock_connect6(struct bpf_sock_addr *ctx)
{
	return sock6(ctx, 0);
}

SEC("cgroup/sendmsg6")
int sl_sock_sendmsg6(struct bpf_sock_addr *ctx)
{
	return sock6(ctx, SOCK_STICKY);
}

/* peer4 shows a datagram's source (recvmsg) or a socket's peer (getpeername) as the frontend
 * the socket asked for, when it is the backend sluice chose. */
static __always_inline int peer4(struct bpf_sock_addr *ctx)
{
	if (!our_netns(ctx))
		return 1;
	struct sock_key_v4 sk = {.cookie = bpf_get_socket_cookie(ctx), .addr = ctx->user_ip4, .port = (__u16)ctx->user_port};
	struct sock_val_v4 *sv = bpf_map_lookup_elem(&sl_sock_v4, &sk);
	if (sv) {
		ctx->user_ip4 = sv->fe_addr;
		ctx->user_port = sv->fe_port;
	}
	return 1;
}

static __always_inline int peer6(struct bpf_sock_addr *ctx)
{
	if (!our_netns(ctx))
		return 1;
	if (is_mapped(ctx)) {
		/* An IPv4 peer of a dual-stack socket. */
		struct sock_key_v4 sk = {.cookie = bpf_get_socket_cookie(ctx), .addr = ctx->user_ip6[3],
					 .port = (__u16)ctx->user_port};
		struct sock_val_v4 *sv = bpf_map_lookup_elem(&sl_sock_v4, &sk);
		if (sv) {
			ctx->user_ip6[3] = sv->fe_addr;
			ctx->user_port = sv->fe_port;
		}
		return 1;
	}
	struct sock_key_v6 sk = {.cookie = bpf_get_socket_cookie(ctx), .port = (__u16)ctx->user_port};
	sk.addr.w[0] = ctx->user_ip6[0];
	sk.addr.w[1] = ctx->user_ip6[1];
	sk.addr.w[2] = ctx->user_ip6[2];
	sk.addr.w[3] = ctx->user_ip6[3];
	struct sock_val_v6 *sv = bpf_map_lookup_elem(&sl_sock_v6, &sk);
	if (sv) {
		ctx->user_ip6[0] = sv->fe_addr.w[0];
		ctx->user_ip6[1] = sv->fe_addr.w[1];
		ctx->user_ip6[2] = sv->fe_addr.w[2];
		ctx->user_ip6[3] = sv->fe_addr.w[3];
		ctx->user_port = sv->fe_port;
	}
	return 1;
}

SEC("cgroup/recvmsg4")
int sl_sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	return peer4(ctx);
}

SEC("cgroup/recvmsg6")
int sl_sock_recvmsg6(struct bpf_sock_addr *ctx)
{
	return peer6(ctx);
}

SEC("cgroup/getpeername4")
int sl_sock_getpeername4(struct bpf_sock_addr *ctx)
{
	return peer4(ctx);
}

SEC("cgroup/getpeername6")
int sl_sock_getpeername6(struct bpf_sock_addr *ctx)
{
	return peer6(ctx);
}

#endif
