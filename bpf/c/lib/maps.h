/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The maps the tc programs share, both families' (the _v6 maps are the _v4 ones with 16-byte
 * addresses, sized by the same options), and the lookups of the settings and counters. */
#ifndef SLUICE_LIB_MAPS_H
#define SLUICE_LIB_MAPS_H

/* Sizes are the defaults; the agent sets them from its options before loading. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fe_key_v4);
	__type(value, struct fe_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_fe_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fe_key_v6);
	__type(value, struct fe_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_fe_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct be_key);
	__type(value, struct be_val_v4);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_be_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct be_key);
	__type(value, struct be_val_v6);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_be_v6 SEC(".maps");

/* Written by the agent only, never by a program: allocated per entry, so its memory follows
 * the long lists there are, not the size option. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct be_idx_key_v4);
	__type(value, __u32);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_be_idx_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct be_idx_key_v6);
	__type(value, __u32);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_be_idx_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_key_v4);
	__type(value, __u32);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_src_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_key_v6);
	__type(value, __u32);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_src_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct cnet_key_v4);
	__type(value, struct cnet_val);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_cnet_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct cnet_key_v6);
	__type(value, struct cnet_val);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_cnet_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct aff_key_v4);
	__type(value, struct aff_val_v4);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_aff_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct aff_key_v6);
	__type(value, struct aff_val_v6);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_aff_v6 SEC(".maps");

/* A plain hash, not an LRU: an entry of a live flow is never evicted to make room; a full
 * table refuses new flows (counted) and the cleaner makes room by expiry only. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_key_v4);
	__type(value, struct ct_val_v4);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_ct_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_key_v6);
	__type(value, struct ct_val_v6);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_ct_v6 SEC(".maps");

/* The young-flow rings (struct ct_young_v4, _v6), per CPU, one a family; their size is set by
 * the agent from the connection table's (an eighth of it over the CPUs). Not pinned: a restart
 * starts an empty ring, and flows left unanswered from before it go by their timeout. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_young_v4);
	__uint(max_entries, 4096);
} sl_ct_young_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_young_v6);
	__uint(max_entries, 4096);
} sl_ct_young_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} sl_ct_young_pos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} sl_ct_young_pos6 SEC(".maps");

/* Scratch space off the stack the inlined programs share: an ICMP error's quote (up to 68
 * bytes: the longest IPv4 header and 8 bytes beyond), or a piece of a datagram whose checksum
 * frag_csum sums (CSUM_CHUNK bytes at a time). */
#define CSUM_CHUNK 256
struct quote_buf {
	__u8 b[CSUM_CHUNK];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct quote_buf);
	__uint(max_entries, 1);
} sl_scratch SEC(".maps");

/* Scratch space for an ICMPv6 error sluice sends: its headers and its quote (the offending
 * packet from its IPv6 header, up to 128 bytes), off the stack. */
#define QUOTE6 128
struct quote6_buf {
	__u8 ip[40];  /* struct ipv6hdr */
	__u8 icmp[8]; /* the ICMPv6 header */
	__u8 b[QUOTE6];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct quote6_buf);
	__uint(max_entries, 1);
} sl_scratch6 SEC(".maps");

/* Scratch space for a new IPv6 flow's connection entry, off new_flow6's stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_val_v6);
	__uint(max_entries, 1);
} sl_scratch_ct6 SEC(".maps");

/* Not pinned: a datagram's fragments arrive within milliseconds; a restart that loses this
 * loses at most the datagrams in flight. An LRU: old datagrams make room. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag_key_v4);
	__type(value, struct frag_val_v4);
	__uint(max_entries, 8192);
} sl_frag_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag_key_v6);
	__type(value, struct frag_val_v4);
	__uint(max_entries, 8192);
} sl_frag_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct cfg);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct cfg_v6);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_cfg_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, C_NUM);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_counters SEC(".maps");

/* The IPv6 programs by hook (PROG6_*), filled by the agent. Pinned: a program of an agent
 * that has stopped keeps its IPv6 half (the kernel empties a program array no file and no pin
 * holds), so a restart is invisible to IPv6 flows too. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, PROG6_NUM);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_progs_v6 SEC(".maps");

static __always_inline void count(__u32 c)
{
	__u64 *v = bpf_map_lookup_elem(&sl_counters, &c);
	if (v)
		*v += 1;
}

static __always_inline struct cfg *config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sl_cfg, &zero);
}

static __always_inline struct cfg_v6 *config6(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sl_cfg_v6, &zero);
}

static __always_inline int eq6(const struct addr6 *a, const struct addr6 *b)
{
	return ((a->w[0] ^ b->w[0]) | (a->w[1] ^ b->w[1]) | (a->w[2] ^ b->w[2]) | (a->w[3] ^ b->w[3])) == 0;
}

static __always_inline int zero6(const struct addr6 *a)
{
	return (a->w[0] | a->w[1] | a->w[2] | a->w[3]) == 0;
}

/* to_v6 passes an IPv6 packet on to its hook's IPv6 program; a packet that cannot be (the
 * agent has not filled the array yet) goes on untouched, as before IPv6 services existed. */
static __always_inline int to_v6(struct __sk_buff *skb, __u32 hook)
{
	bpf_tail_call(skb, &sl_progs_v6, hook);
	return TC_ACT_OK;
}

#endif
