/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The maps the tc programs share, and the lookups of the settings, counters and cluster
 * networks. */
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
	__type(key, struct be_key);
	__type(value, struct be_val_v4);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_be_v4 SEC(".maps");

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
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_key_v4);
	__type(value, __u32);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_src_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct cnet_key_v4);
	__type(value, struct cnet_val);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_cnet_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct aff_key_v4);
	__type(value, struct aff_val_v4);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_aff_v4 SEC(".maps");

/* A plain hash, not an LRU: an entry of a live flow is never evicted to make room; a full
 * table refuses new flows (counted) and the cleaner makes room by expiry only. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_key_v4);
	__type(value, struct ct_val_v4);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_ct_v4 SEC(".maps");

/* The young-flow ring (struct ct_young_v4), per CPU; its size is set by the agent from the
 * connection table's (an eighth of it over the CPUs). Not pinned: a restart starts an empty
 * ring, and flows left unanswered from before it go by their timeout. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_young_v4);
	__uint(max_entries, 4096);
} sl_ct_young_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} sl_ct_young_pos SEC(".maps");

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

/* Not pinned: a datagram's fragments arrive within milliseconds; a restart that loses this
 * loses at most the datagrams in flight. An LRU: old datagrams make room. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag_key_v4);
	__type(value, struct frag_val_v4);
	__uint(max_entries, 8192);
} sl_frag_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct cfg);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, C_NUM);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_counters SEC(".maps");

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

static __always_inline struct cnet_val *cluster_net(__be32 addr)
{
	struct cnet_key_v4 k = {.prefixlen = 32, .addr = addr};
	return bpf_map_lookup_elem(&sl_cnet_v4, &k);
}

#endif
