/*
 * parse.c: the C readers of the two region images; pure, fuzzed under
 * ASan/UBSan by tests/fuzz_regions.c.
 */
#include <string.h>

#include "hook.h"

int quota_parse(const void *buf, size_t n, struct quota_values *out, const char **why)
{
	struct gpulimit_quota q;
	if (buf == NULL || n != sizeof(q)) {
		*why = "wrong size";
		return -1;
	}
	memcpy(&q, buf, sizeof(q)); /* no alignment assumption on buf */
	if (q.magic != GPULIMIT_QUOTA_MAGIC) {
		*why = "bad magic";
		return -1;
	}
	if (q.layout_version != GPULIMIT_LAYOUT_VERSION) {
		*why = "unknown layout version";
		return -1;
	}
	if (q.checksum != gpulimit_fnv1a32(&q, offsetof(struct gpulimit_quota, checksum))) {
		*why = "checksum mismatch";
		return -1;
	}
	if (q.generation == 0) {
		*why = "generation 0";
		return -1;
	}
	if (memchr(q.slice_id, '\0', sizeof(q.slice_id)) == NULL) {
		*why = "slice id not NUL-terminated";
		return -1;
	}
	if (q.compute_percent < 1 || q.compute_percent > 100) {
		*why = "compute percent out of 1..100";
		return -1;
	}
	if (q.compute_limit_percent < q.compute_percent || q.compute_limit_percent > 100) {
		*why = "compute limit percent out of compute percent..100";
		return -1;
	}
	out->generation = q.generation;
	out->memory_limit_bytes = q.memory_limit_bytes;
	out->compute_percent = q.compute_percent;
	out->compute_limit_percent = q.compute_limit_percent;
	memcpy(out->slice_id, q.slice_id, sizeof(out->slice_id));
	memcpy(out->gpu_uuid, q.gpu_uuid, sizeof(out->gpu_uuid));
	*why = NULL;
	return 0;
}

int usage_header_check(const void *buf, size_t n, const char **why)
{
	if (buf == NULL || n != sizeof(struct gpulimit_usage)) {
		*why = "wrong size";
		return -1;
	}
	/* The four words are read one at a time: buf may be a live shared mapping. */
	const struct gpulimit_usage *u = buf;
	uint32_t magic = __atomic_load_n(&u->magic, __ATOMIC_ACQUIRE);
	if (magic == 0) {
		*why = "not initialized (the node agent creates it initialized)";
		return -1;
	}
	if (magic != GPULIMIT_USAGE_MAGIC) {
		*why = "bad magic";
		return -1;
	}
	if (__atomic_load_n(&u->layout_version, __ATOMIC_RELAXED) != GPULIMIT_LAYOUT_VERSION) {
		*why = "unknown layout version";
		return -1;
	}
	if (__atomic_load_n(&u->slot_count, __ATOMIC_RELAXED) != GPULIMIT_USAGE_SLOTS ||
	    __atomic_load_n(&u->device_count, __ATOMIC_RELAXED) != GPULIMIT_USAGE_DEVICES) {
		*why = "slot or device count of another layout";
		return -1;
	}
	*why = NULL;
	return 0;
}
