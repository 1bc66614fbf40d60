/*
 * stubctl: prints the simulated device's state as one JSON object, for tests.
 * Usage: GPUBROKER_STUB_STATE=<file> stubctl
 * Dead processes are reaped first, as any driver call would.
 */
#define _GNU_SOURCE
#include "stub.h"

#include <inttypes.h>
#include <stdio.h>

int main(void)
{
	struct stub_device *d = stub_dev();
	if (d == NULL)
		return 1;
	stub_lock(d);
	stub_reap_locked(d);
	uint64_t now = stub_now_ns();
	char uuid[96];
	stub_format_uuid(d->uuid, uuid, sizeof(uuid));
	printf("{\"uuid\":\"%s\",\"total_bytes\":%" PRIu64 ",\"used_bytes\":%" PRIu64 ",\"sm_count\":%u,"
	       "\"now_ns\":%" PRIu64 ",\"backlog_end_ns\":%" PRIu64 ",\"sm_ns_total\":%" PRIu64 ",",
	       uuid, d->total_bytes, d->used_bytes, d->sm_count, now, d->backlog_end_ns,
	       __atomic_load_n(&d->sm_ns_total, __ATOMIC_RELAXED));
	printf("\"counters\":{\"alloc\":%" PRIu64 ",\"free\":%" PRIu64 ",\"free_unknown\":%" PRIu64 ",\"oom\":%" PRIu64
	       ",\"launch\":%" PRIu64 ",\"reaped\":%" PRIu64 ",\"trim\":%" PRIu64 "},",
	       d->c_alloc, d->c_free, d->c_free_unknown, d->c_oom, __atomic_load_n(&d->c_launch, __ATOMIC_RELAXED),
	       d->c_reaped, d->c_trim);
	printf("\"procs\":[");
	int first = 1;
	for (int i = 0; i < STUB_MAX_PROCS; i++) {
		struct stub_proc *p = &d->procs[i];
		if (p->pid == 0)
			continue;
		printf("%s{\"pid\":%u,\"mem_bytes\":%" PRIu64 ",\"sm_ns\":%" PRIu64 ",\"launches\":%" PRIu64
		       ",\"stall_ns\":%" PRIu64 "}",
		       first ? "" : ",", p->pid, p->mem_bytes, __atomic_load_n(&p->sm_ns_total, __ATOMIC_RELAXED),
		       __atomic_load_n(&p->launches, __ATOMIC_RELAXED), __atomic_load_n(&p->stall_ns_total, __ATOMIC_RELAXED));
		first = 0;
	}
	printf("]}\n");
	stub_unlock(d);
	return 0;
}
