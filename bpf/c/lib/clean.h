/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The connection table's cleaner, run by the agent through BPF_PROG_TEST_RUN: sl_ct_clean for
 * the IPv4 table, sl_ct_clean6 for the IPv6 one. Included once per family (lib/family.h). */

#ifndef SLUICE_LIB_CLEAN_SHARED
#define SLUICE_LIB_CLEAN_SHARED

/* The cleaner's batches of requests, one a family: userspace writes one, runs its family's
 * cleaner, reads the counts. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_clean_ctx_v4);
	__uint(max_entries, 1);
} sl_ct_cleanq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_clean_ctx_v6);
	__uint(max_entries, 1);
} sl_ct_cleanq6 SEC(".maps");

#endif /* SLUICE_LIB_CLEAN_SHARED */

/* sl_ct_clean deletes the connection-tracking entries userspace judged expired, each only if
 * no packet refreshed it since it was judged: cleanup never races live traffic. Run through
 * BPF_PROG_TEST_RUN after writing a batch of requests into sl_ct_cleanq (sl_ct_cleanq6). */
SEC("syscall")
int FN(sl_ct_clean)(void *ctx)
{
	__u32 zero = 0;
	clean_ctx_t *q = bpf_map_lookup_elem(&CLEANQ_MAP, &zero);
	if (!q)
		return 1;
	q->deleted = 0;
	q->kept = 0;
	for (__u32 i = 0; i < CLEAN_N; i++) {
		if (i >= q->n)
			break;
		clean_req_t *r = &q->req[i];
		ct_val_t *v = bpf_map_lookup_elem(&CT_MAP, &r->key);
		if (!v)
			continue;
		if (v->last_seen != r->seen) {
			q->kept++;
			continue;
		}
		bpf_map_delete_elem(&CT_MAP, &r->key);
		q->deleted++;
		if (r->pair.proto)
			bpf_map_delete_elem(&CT_MAP, &r->pair);
	}
	return 0;
}
