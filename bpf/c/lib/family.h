/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The address family the per-family headers are compiled for (FAMILY, 4 or 6).
 *
 * sluice.c includes lib/datapath.h twice: once with FAMILY 4 and once with FAMILY 6. Each
 * header there holds one logic for both families (conntrack, load balancing, NAT, the tunnel,
 * ICMP, the programs), written against the names defined here: the family's types, maps and
 * address operations, and FN(name), the family's function of that name (name for IPv4, name6
 * for IPv6: new_flow and new_flow6; FNUM(name) where both carry the number: sock4, sock6). What
 * really differs between the families (header layouts and offsets, checksums, the fragment
 * rules, ICMP against ICMPv6) stays in small helpers of each header under `#if FAMILY == 4`,
 * named by what they do; what is the same (TCP state, the closed and stale rules, backend
 * choice, the flows' entries, counters) is written once.
 *
 * Addresses: addr_t is the family's address (IPv4's __be32, or struct addr6); code reads and
 * assigns them as values and compares them with ADDR_EQ and ADDR_ZERO. A function that is not
 * inlined takes an address as addr_arg_t: IPv4's by value, IPv6's by pointer (AARG(x) passes
 * the address x, AVAL(a) is the address argument a names), so an IPv4 call keeps its address
 * in a register, not in a stack slot of its caller (the call chains' stack is counted to the
 * 512 bytes Linux 5.10 allows); APTR(a) is a pointer to it, for the inlined helpers that take
 * addresses by pointer.
 *
 * KNOWN_INLINE: how the known flows' path (prog.h's known) is compiled. Inlined into IPv4's
 * programs, whose frames are small; a function of its own for IPv6, whose chain of frames
 * would pass 512 bytes otherwise. As a function, IPv4's had Linux 6.1's verifier go through
 * new_flow again for each way back from it: sl_from_host took 143,561 instructions to verify,
 * against 68,248 inlined (the old IPv4 code: 91,737).
 *
 * Settings: IPv4's tunnel settings are the global ones (struct cfg); IPv6's are their own
 * (struct cfg_v6, tun_cfg_t). TUN_CFG(c) is the tunnel's given the global settings' lookup c,
 * which IPv6 does not make; VXLAN_CFG(tc) the global ones (the VNI, the port) given the
 * tunnel's.
 *
 * What the families still do differently. The code is one; these decisions were made apart,
 * each is kept as it was and used in one place, so that joining them is a change of its own:
 *   WEP_TUNNEL        a workload's flow to an endpoint on another node goes through the
 *                     node-port tunnel (IPv4), or is translated here and routed by the kernel
 *                     over the pools' routes (IPv6).
 *   HOST_EMPTY_DROPS  a flow from a host interface to a service that has endpoints but none it
 *                     may use is dropped, counted as no local endpoint (IPv6), or rejected
 *                     (IPv4).
 *   YOUNG_AT_REV      a new flow enters the young-flow ring as soon as its reverse entry is in
 *                     (IPv6), or once both its entries are (IPv4).
 *   TUNNEL_FRAGS_PASS a fragment of a packet to the VXLAN port coming in by a host interface
 *                     passes untouched (IPv4), or is handled as any other packet (IPv6).
 *   VLAN_WEP_PASS     a tagged packet from a workload passes untouched (IPv6), or is handled as
 *                     any other (IPv4).
 *   ADJ_DECAP         unwrapping the tunnel asks the kernel to drop the aggregate's tunnel GSO
 *                     state (IPv4, Linux 7.0); IPv6 asks for FIXED_GSO alone.
 * Joined since, IPv6 doing as IPv4 did: a SYN sent again for a forwarded flow that got no
 * answer takes a source port of its own (IPv6 kept the client's, so each retry met the same
 * collision at the endpoint's node: TestProg6ForwardedSYNRetryNewPort); a SYN on its way to
 * a workload drops the closed tunnel entry of its tuple (a reset from the workload went back
 * through the tunnel, to be ignored by the client: TestProg6DirectAfterNodePort); a
 * workload's flow to itself through a routed backend is a hairpin too (the kernel got a
 * packet from the workload to itself: TestProg6HairpinRoutedBackend). */
#ifndef FAMILY
#error "lib/family.h: FAMILY (4 or 6) must be defined"
#endif

#undef FN
#undef FNUM
#undef FAMILY_STR
#undef pkt_t
#undef addr_t
#undef addr_arg_t
#undef iphdr_t
#undef tun_cfg_t
#undef ct_key_t
#undef ct_val_t
#undef ct_young_t
#undef fe_key_t
#undef be_val_t
#undef be_idx_key_t
#undef src_key_t
#undef cnet_key_t
#undef aff_key_t
#undef aff_val_t
#undef frag_key_t
#undef clean_ctx_t
#undef clean_req_t
#undef sock_key_t
#undef sock_val_t
#undef CT_MAP
#undef YOUNG_MAP
#undef YOUNG_POS_MAP
#undef FE_MAP
#undef BE_MAP
#undef BE_IDX_MAP
#undef SRC_MAP
#undef CNET_MAP
#undef AFF_MAP
#undef FRAG_MAP
#undef CLEANQ_MAP
#undef SOCK_MAP
#undef SOCK_BE_MAP
#undef CLEAN_N
#undef ETH_P_FAMILY
#undef ICMP_PROTO
#undef ENCAP_HLEN
#undef ADJ_ENCAP_L3
#undef ADJ_DECAP
#undef ICMP_UNREACH_PORT
#undef ICMP_TOO_BIG
#undef ADDR_EQ
#undef ADDR_ZERO
#undef ADDR_HASH
#undef AARG
#undef AVAL
#undef APTR
#undef TUN_CFG
#undef VXLAN_CFG
#undef WEP_TUNNEL
#undef HOST_EMPTY_DROPS
#undef YOUNG_AT_REV
#undef TUNNEL_FRAGS_PASS
#undef VLAN_WEP_PASS
#undef KNOWN_INLINE

#if FAMILY == 4

#define FN(name) name
#define FNUM(name) name##4
#define FAMILY_STR "4"
#define pkt_t struct pkt
#define addr_t __be32
#define addr_arg_t __be32
#define iphdr_t struct iphdr
#define tun_cfg_t struct cfg /* IPv4's tunnel settings are the global ones */
#define ct_key_t struct ct_key_v4
#define ct_val_t struct ct_val_v4
#define ct_young_t struct ct_young_v4
#define fe_key_t struct fe_key_v4
#define be_val_t struct be_val_v4
#define be_idx_key_t struct be_idx_key_v4
#define src_key_t struct src_key_v4
#define cnet_key_t struct cnet_key_v4
#define aff_key_t struct aff_key_v4
#define aff_val_t struct aff_val_v4
#define frag_key_t struct frag_key_v4
#define clean_ctx_t struct ct_clean_ctx_v4
#define clean_req_t struct ct_clean_req_v4
#define sock_key_t struct sock_key_v4
#define sock_val_t struct sock_val_v4
#define CT_MAP sl_ct_v4
#define YOUNG_MAP sl_ct_young_v4
#define YOUNG_POS_MAP sl_ct_young_pos
#define FE_MAP sl_fe_v4
#define BE_MAP sl_be_v4
#define BE_IDX_MAP sl_be_idx_v4
#define SRC_MAP sl_src_v4
#define CNET_MAP sl_cnet_v4
#define AFF_MAP sl_aff_v4
#define FRAG_MAP sl_frag_v4
#define CLEANQ_MAP sl_ct_cleanq
#define SOCK_MAP sl_sock_v4
#define SOCK_BE_MAP sl_sock_be_v4
#define CLEAN_N CLEAN_BATCH
#define ETH_P_FAMILY ETH_P_IP
#define ICMP_PROTO IPPROTO_ICMP
#define ENCAP_HLEN ENCAP_LEN
#define ADJ_ENCAP_L3 BPF_F_ADJ_ROOM_ENCAP_L3_IPV4
#define ADJ_DECAP (ADJ_ROOM_DECAP_L3_IPV4 | ADJ_ROOM_DECAP_L4_UDP)
#define ICMP_UNREACH_PORT ICMP_PORT_UNREACH
#define ICMP_TOO_BIG ICMP_FRAG_NEEDED
#define ADDR_EQ(a, b) ((a) == (b))
#define ADDR_ZERO(a) ((a) == 0)
#define ADDR_HASH(a) (a)
#define AARG(a) (a)
#define AVAL(a) (a)
#define APTR(a) (&(a))
#define TUN_CFG(c) (c)   /* the tunnel's settings, given the global ones' lookup */
#define VXLAN_CFG(tc) (tc) /* the VNI and port, given the tunnel's settings */
#define WEP_TUNNEL 1
#define HOST_EMPTY_DROPS 0
#define YOUNG_AT_REV 0
#define TUNNEL_FRAGS_PASS 1
#define VLAN_WEP_PASS 0
#define KNOWN_INLINE __always_inline

#elif FAMILY == 6

#define FN(name) name##6
#define FNUM(name) name##6
#define FAMILY_STR "6"
#define pkt_t struct pkt6
#define addr_t struct addr6
#define addr_arg_t const struct addr6 *
#define iphdr_t struct ipv6hdr
#define tun_cfg_t struct cfg_v6
#define ct_key_t struct ct_key_v6
#define ct_val_t struct ct_val_v6
#define ct_young_t struct ct_young_v6
#define fe_key_t struct fe_key_v6
#define be_val_t struct be_val_v6
#define be_idx_key_t struct be_idx_key_v6
#define src_key_t struct src_key_v6
#define cnet_key_t struct cnet_key_v6
#define aff_key_t struct aff_key_v6
#define aff_val_t struct aff_val_v6
#define frag_key_t struct frag_key_v6
#define clean_ctx_t struct ct_clean_ctx_v6
#define clean_req_t struct ct_clean_req_v6
#define sock_key_t struct sock_key_v6
#define sock_val_t struct sock_val_v6
#define CT_MAP sl_ct_v6
#define YOUNG_MAP sl_ct_young_v6
#define YOUNG_POS_MAP sl_ct_young_pos6
#define FE_MAP sl_fe_v6
#define BE_MAP sl_be_v6
#define BE_IDX_MAP sl_be_idx_v6
#define SRC_MAP sl_src_v6
#define CNET_MAP sl_cnet_v6
#define AFF_MAP sl_aff_v6
#define FRAG_MAP sl_frag_v6
#define CLEANQ_MAP sl_ct_cleanq6
#define SOCK_MAP sl_sock_v6
#define SOCK_BE_MAP sl_sock_be_v6
#define CLEAN_N CLEAN_BATCH6
#define ETH_P_FAMILY ETH_P_IPV6
#define ICMP_PROTO NEXTHDR_ICMP6
#define ENCAP_HLEN ENCAP6_LEN
#define ADJ_ENCAP_L3 BPF_F_ADJ_ROOM_ENCAP_L3_IPV6
#define ADJ_DECAP 0
#define ICMP_UNREACH_PORT ICMP6(ICMP6_DST_UNREACH, ICMP6_PORT_UNREACH)
#define ICMP_TOO_BIG ICMP6(ICMP6_PKT_TOO_BIG, 0)
#define ADDR_EQ(a, b) eq6(&(a), &(b))
#define ADDR_ZERO(a) zero6(&(a))
#define ADDR_HASH(a) ((a).w[3])
#define AARG(a) (&(a))
#define AVAL(a) (*(a))
#define APTR(a) (a)
#define TUN_CFG(c) config6()
#define VXLAN_CFG(tc) config()
#define WEP_TUNNEL 0
#define HOST_EMPTY_DROPS 1
#define YOUNG_AT_REV 1
#define TUNNEL_FRAGS_PASS 0
#define VLAN_WEP_PASS 1
#define KNOWN_INLINE __noinline

/* IPv6 functions named before the families shared their code: FN(icmp_back) is icmp6_back. */
#define icmp_back6 icmp6_back
#define icmp_error6 icmp6_error

#else
#error "lib/family.h: FAMILY must be 4 or 6"
#endif
