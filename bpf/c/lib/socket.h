/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket hooks: host sockets connected straight to a backend (cgroup connect, sendmsg,
 * recvmsg and getpeername, both families; IPv4 services reached from IPv6 sockets through
 * IPv4-mapped addresses, as Java and .NET clients connect). Included once per family
 * (lib/family.h): choosing a socket's backend is one logic, each family has its programs (the
 * IPv6 ones also take IPv4-mapped addresses to IPv4's). */

#ifndef SLUICE_LIB_SOCKET_SHARED
#define SLUICE_LIB_SOCKET_SHARED

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

/* sock_nat's how. */
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

/* sock_proto is the protocol of a socket call the socket programs take: TCP or UDP, in the
 * agent's network namespace; 0 for any other. */
static __always_inline __u8 sock_proto(struct bpf_sock_addr *ctx)
{
	__u8 proto = ctx->protocol;
	if (!our_netns(ctx) || (proto != IPPROTO_TCP && proto != IPPROTO_UDP))
		return 0;
	return proto;
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

#endif /* SLUICE_LIB_SOCKET_SHARED */

/* sock_nat chooses a backend for a host socket asking for the frontend *addr:*port and writes
 * it there; how is SOCK_STICKY and SOCK_REMEMBER. It returns SOCK_PASS, SOCK_NAT or
 * SOCK_REFUSE. */
static __noinline int FN(sock_nat)(__u64 cookie, __u8 proto, addr_t *addr, __be16 *port, __u32 how)
{
	int sticky = how & SOCK_STICKY, remember = how & SOCK_REMEMBER;
	fe_key_t fk = {.addr = *addr, .port = *port, .proto = proto};
	struct fe_val *fe = bpf_map_lookup_elem(&FE_MAP, &fk);
	if (!fe) {
		/* The address-only entry of a cluster IP: fk is free for its key. */
		fk.port = 0;
		fk.proto = 0;
		return bpf_map_lookup_elem(&FE_MAP, &fk) ? SOCK_REFUSE : SOCK_PASS;
	}
	if (fe->flags & FE_ADDR_ONLY)
		return SOCK_PASS;
	__u32 start, end;
	if (!sock_set(fe, &start, &end))
		return SOCK_REFUSE;
	sock_key_t bk = {.cookie = cookie, .addr = fk.addr, .port = fk.port};
	be_val_t *be = 0;
	if (sticky) {
		sock_val_t *had = bpf_map_lookup_elem(&SOCK_BE_MAP, &bk);
		if (had)
			be = FN(in_set)(fe, start, end, AARG(had->fe_addr), had->fe_port);
	}
	addr_t none;
	__builtin_memset(&none, 0, sizeof(none));
	if (!be)
		be = FN(pick)(&fk, fe, start, end, &none, bpf_ktime_get_ns());
	if (!be)
		return SOCK_REFUSE;
	if (sticky) {
		sock_val_t bv = {.fe_addr = be->addr, .fe_port = be->port};
		bpf_map_update_elem(&SOCK_BE_MAP, &bk, &bv, BPF_ANY);
	}
	if (remember) {
		sock_key_t sk = {.cookie = cookie, .addr = be->addr, .port = be->port};
		sock_val_t sv = {.fe_addr = fk.addr, .fe_port = fk.port};
		bpf_map_update_elem(&SOCK_MAP, &sk, &sv, BPF_ANY);
	}
	*addr = be->addr;
	*port = be->port;
	return SOCK_NAT;
}

#if FAMILY == 4

/* sock_to4 points a socket asking for the IPv4 frontend *addr:*port (an IPv4 socket's, or an
 * IPv6 socket's IPv4-mapped) at its backend or, refused, at the loopback. It returns
 * sock_nat's answer, or -1 when the call itself is to be refused (EPERM). */
static __always_inline int sock_to4(struct bpf_sock_addr *ctx, __u64 cookie, __u8 proto, __be32 *addr, __be16 *port,
				    int sticky)
{
	int rc = sock_verdict(sock_nat(cookie, proto, addr, port, sticky | SOCK_REMEMBER));
	if (rc == SOCK_REFUSE) {
		if (proto == IPPROTO_UDP && !discard4_free(ctx))
			return -1;
		*addr = bpf_htonl(LOOPBACK4);
		*port = proto == IPPROTO_TCP ? 0 : bpf_htons(DISCARD_PORT);
	}
	return rc;
}

/* peer_of4 is what a socket asked for, when the IPv4 peer addr (ctx's port) is the backend
 * sluice chose for it. */
static __always_inline struct sock_val_v4 *peer_of4(struct bpf_sock_addr *ctx, __be32 addr)
{
	struct sock_key_v4 sk = {.cookie = bpf_get_socket_cookie(ctx), .addr = addr, .port = (__u16)ctx->user_port};
	return bpf_map_lookup_elem(&sl_sock_v4, &sk);
}

/* sock4 points an IPv4 socket's connect, or send (sticky: SOCK_STICKY), at a service's
 * backend. */
static __always_inline int sock4(struct bpf_sock_addr *ctx, int sticky)
{
	__u8 proto = sock_proto(ctx);
	if (!proto)
		return 1;
	__be32 addr = ctx->user_ip4;
	__be16 port = (__u16)ctx->user_port;
	int rc = sock_to4(ctx, bpf_get_socket_cookie(ctx), proto, &addr, &port, sticky);
	if (rc < 0)
		return 0;
	if (rc != SOCK_PASS) {
		ctx->user_ip4 = addr;
		ctx->user_port = port;
	}
	return 1;
}

/* peer4 shows a datagram's source (recvmsg) or a socket's peer (getpeername) as the frontend
 * the socket asked for, when it is the backend sluice chose. */
static __always_inline int peer4(struct bpf_sock_addr *ctx)
{
	if (!our_netns(ctx))
		return 1;
	struct sock_val_v4 *sv = peer_of4(ctx, ctx->user_ip4);
	if (sv) {
		ctx->user_ip4 = sv->fe_addr;
		ctx->user_port = sv->fe_port;
	}
	return 1;
}

#else /* FAMILY == 6 */

/* sock6: sock4 for an IPv6 socket, whose IPv4-mapped addresses are IPv4's services. */
static __always_inline int sock6(struct bpf_sock_addr *ctx, int sticky)
{
	__u8 proto = sock_proto(ctx);
	if (!proto)
		return 1;
	__u64 cookie = bpf_get_socket_cookie(ctx);
	__be16 port = (__u16)ctx->user_port;
	int rc;
	if (is_mapped(ctx)) {
		/* An IPv4 service asked for by a dual-stack IPv6 socket (a connect: its sends to a
		 * mapped address meet sendmsg4): its backend, mapped. Remembered in the IPv4 map,
		 * where peer6 looks a mapped address up. */
		__be32 addr = ctx->user_ip6[3];
		rc = sock_to4(ctx, cookie, proto, &addr, &port, sticky);
		if (rc < 0)
			return 0;
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

/* peer6: peer4 for an IPv6 socket. */
static __always_inline int peer6(struct bpf_sock_addr *ctx)
{
	if (!our_netns(ctx))
		return 1;
	if (is_mapped(ctx)) {
		/* An IPv4 peer of a dual-stack socket. */
		struct sock_val_v4 *sv = peer_of4(ctx, ctx->user_ip6[3]);
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

#endif /* FAMILY */

/* The family's socket programs (sl_sock_connect4, sl_sock_connect6, ...): connect and sendmsg
 * point a socket at a backend, recvmsg and getpeername show it the frontend it asked for. */
SEC("cgroup/connect" FAMILY_STR)
int FNUM(sl_sock_connect)(struct bpf_sock_addr *ctx)
{
	return FNUM(sock)(ctx, 0);
}

SEC("cgroup/sendmsg" FAMILY_STR)
int FNUM(sl_sock_sendmsg)(struct bpf_sock_addr *ctx)
{
	return FNUM(sock)(ctx, SOCK_STICKY);
}

SEC("cgroup/recvmsg" FAMILY_STR)
int FNUM(sl_sock_recvmsg)(struct bpf_sock_addr *ctx)
{
	return FNUM(peer)(ctx);
}

SEC("cgroup/getpeername" FAMILY_STR)
int FNUM(sl_sock_getpeername)(struct bpf_sock_addr *ctx)
{
	return FNUM(peer)(ctx);
}
