/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The connection table's cleaner, run by the agent through BPF_PROG_TEST_RUN. */
#ifndef SLUICE_LIB_CLEAN_H
#define SLUICE_LIB_CLEAN_H

/* The cleaner's batch of requests: userspace writes it, runs sl_ct_clean, reads the counts. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_clean_ctx_v4);
	__uint(max_entries, 1);
} sl_ct_cleanq SEC(".maps");

/* sl_ct_clean deletes the connection-tracking entries userspace judged expired, each only if
 * no packet refreshed it since it was judged: cleanup never races live traffic. Run through
 * BPF_PROG_TEST_RUN after writing a batch of requests into sl_ct_cleanq. */
SEC("syscall")
int sl_ct_clean(void *ctx)
{
	__u32 zero = 0;
	struct ct_clean_ctx_v4 *q = bpf_map_lookup_elem(&sl_ct_cleanq, &zero);
	if (!q)
		return 1;
	q->deleted = 0;
	q->kept = 0;
	for (__u32 i = 0; i < CLEAN_BATCH; i++) {
		if (i >= q->n)
			break;
		struct ct_clean_req_v4 r = q->req[i];
		struct ct_val_v4 *v = bpf_map_lookup_elem(&sl_ct_v4, &r.key);
		if (!v)
			continue;
		if (v->last_seen != r.seen) {
			q->kept++;
			continue;
		}
		bpf_map_delete_elem(&sl_ct_v4, &r.key);
		q->deleted++;
		if (r.pair.proto)
			bpf_map_delete_elem(&sl_ct_v4, &r.pair);
	}
	return 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_clean_ctx_v6);
	__uint(max_entries, 1);
} sl_ct_cleanq6 SEC(".maps");

/* sl_ct_clean6 is sl_ct_clean for the IPv6 table. */
SEC("syscall")
int sl_ct_clean6(void *ctx)
{
	__u32 zero = 0;
	struct ct_clean_ctx_v6 *q = bpf_map_lookup_elem(&sl_ct_cleanq6, &zero);
	if (!q)
		return 1;
	q->deleted = 0;
	q->kept = 0;
	for (__u32 i = 0; i < CLEAN_BATCH6; i++) {
		if (i >= q->n)
			break;
		struct ct_clean_req_v6 *r = &q->req[i];
		struct ct_val_v6 *v = bpf_map_lookup_elem(&sl_ct_v6, &r->key);
		if (!v)
			continue;
		if (v->last_seen != r->seen) {
			q->kept++;
			continue;
		}
		bpf_map_delete_elem(&sl_ct_v6, &r->key);
		q->deleted++;
		if (r->pair.proto)
			bpf_map_delete_elem(&sl_ct_v6, &r->pair);
	}
	return 0;
}

#endif
