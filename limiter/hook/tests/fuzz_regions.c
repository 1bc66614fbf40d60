/*
 * fuzz_regions: feeds mutated quota and usage region images to the hook's C
 * parsers (quota_parse, usage_header_check) under AddressSanitizer and UBSan
 * (see the Makefile). Each input lives in a heap buffer of exactly its
 * length, so any read past it aborts.
 *
 *   fuzz_regions [ITERATIONS [SEED]]     defaults: 200000, 1
 *
 * Mutations: bit flips, byte overwrites, truncation and extension of a valid
 * image; random field values (the quota's checksum fixed so range checks are
 * reached). Prints "fuzz_regions ITERATIONS QUOTA_ACCEPTED USAGE_ACCEPTED"
 * and exits 0, or aborts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/hook.h"

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

static void seal(struct gpulimit_quota *q)
{
	q->checksum = gpulimit_fnv1a32(q, offsetof(struct gpulimit_quota, checksum));
}

/* fuzz_quota runs one mutated quota image; returns 1 if accepted. */
static int fuzz_quota(const struct gpulimit_quota *good, unsigned long long i)
{
	size_t len = sizeof(*good);
	unsigned char img[sizeof(*good) * 2];
	memcpy(img, good, sizeof(*good));
	memset(img + sizeof(*good), (int)(rnd() & 0xff), sizeof(*good));
	switch (rnd() % 5) {
	case 0: /* flip bits */
		for (int k = 0, n = (int)(rnd() % 8) + 1; k < n; k++)
			img[rnd() % sizeof(*good)] ^= (unsigned char)(1u << (rnd() % 8));
		break;
	case 1: /* truncate or extend */
		len = (size_t)(rnd() % (sizeof(img) + 1));
		break;
	case 2: { /* random fields, sealed */
		struct gpulimit_quota q = *good;
		q.generation = rnd() % 4;
		q.compute_percent = (uint32_t)(rnd() % 130);
		q.compute_limit_percent = (uint32_t)(rnd() % 130);
		q.memory_limit_bytes = rnd();
		if (rnd() % 4 == 0)
			memset(q.slice_id, 'x', sizeof(q.slice_id));
		if (rnd() % 8 == 0)
			q.layout_version = (uint32_t)rnd();
		seal(&q);
		memcpy(img, &q, sizeof(q));
		break;
	}
	case 3: /* random bytes */
		for (size_t k = 0; k < sizeof(img); k++)
			img[k] = (unsigned char)rnd();
		len = rnd() % 2 ? sizeof(*good) : (size_t)(rnd() % sizeof(img));
		break;
	default: /* overwrite one byte, sealed */
		img[rnd() % offsetof(struct gpulimit_quota, checksum)] = (unsigned char)rnd();
		seal((struct gpulimit_quota *)img);
	}
	unsigned char *buf = malloc(len ? len : 1);
	if (buf == NULL)
		abort();
	memcpy(buf, img, len);
	struct quota_values v;
	const char *why;
	int ok = quota_parse(buf, len, &v, &why) == 0;
	if (ok && (v.generation == 0 || v.compute_percent < 1 || v.compute_percent > 100 ||
	           v.compute_limit_percent < v.compute_percent || v.compute_limit_percent > 100 ||
	           memchr(v.slice_id, '\0', sizeof(v.slice_id)) == NULL)) {
		fprintf(stderr, "iteration %llu: accepted an out-of-range quota\n", i);
		abort();
	}
	if (!ok && why == NULL) {
		fprintf(stderr, "iteration %llu: quota rejected without a reason\n", i);
		abort();
	}
	free(buf);
	return ok;
}

/* fuzz_usage runs one mutated usage image; returns 1 if its header was accepted. */
static int fuzz_usage(const struct gpulimit_usage *good, unsigned long long i)
{
	static unsigned char img[sizeof(struct gpulimit_usage) + 512];
	size_t len = sizeof(*good);
	memcpy(img, good, sizeof(*good));
	switch (rnd() % 4) {
	case 0: /* flip header bits */
		for (int k = 0, n = (int)(rnd() % 4) + 1; k < n; k++)
			img[rnd() % 16] ^= (unsigned char)(1u << (rnd() % 8));
		break;
	case 1: /* truncate or extend */
		len = (size_t)(rnd() % (sizeof(img) + 1));
		break;
	case 2: /* random header words */
		for (size_t k = 0; k < 16; k++)
			img[k] = (unsigned char)rnd();
		break;
	default: /* zero the header: not initialized */
		memset(img, 0, 16);
	}
	unsigned char *buf = malloc(len ? len : 1);
	if (buf == NULL)
		abort();
	memcpy(buf, img, len);
	const char *why;
	int ok = usage_header_check(buf, len, &why) == 0;
	const struct gpulimit_usage *u = (const struct gpulimit_usage *)(const void *)buf;
	if (ok && (len != sizeof(*good) || u->magic != GPULIMIT_USAGE_MAGIC ||
	           u->layout_version != GPULIMIT_LAYOUT_VERSION || u->slot_count != GPULIMIT_USAGE_SLOTS ||
	           u->device_count != GPULIMIT_USAGE_DEVICES)) {
		fprintf(stderr, "iteration %llu: accepted a usage header of another layout\n", i);
		abort();
	}
	if (!ok && why == NULL) {
		fprintf(stderr, "iteration %llu: usage rejected without a reason\n", i);
		abort();
	}
	free(buf);
	return ok;
}

int main(int argc, char **argv)
{
	unsigned long long iterations = argc > 1 ? strtoull(argv[1], NULL, 10) : 200000;
	rng_state = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
	if (rng_state == 0)
		rng_state = 1;
	struct gpulimit_quota good;
	memset(&good, 0, sizeof(good));
	good.magic = GPULIMIT_QUOTA_MAGIC;
	good.layout_version = GPULIMIT_LAYOUT_VERSION;
	good.generation = 7;
	strcpy(good.slice_id, "fuzz-slice");
	good.memory_limit_bytes = 1ull << 30;
	good.compute_percent = 25;
	good.compute_limit_percent = 50;
	seal(&good);
	struct quota_values v;
	const char *why;
	if (quota_parse(&good, sizeof(good), &v, &why) != 0) {
		fprintf(stderr, "valid quota image rejected: %s\n", why);
		return 1;
	}
	static struct gpulimit_usage usage;
	gpulimit_usage_init(&usage);
	if (usage_header_check(&usage, sizeof(usage), &why) != 0) {
		fprintf(stderr, "valid usage image rejected: %s\n", why);
		return 1;
	}
	unsigned long long qa = 0, ua = 0;
	for (unsigned long long i = 0; i < iterations; i++) {
		qa += (unsigned long long)fuzz_quota(&good, i);
		ua += (unsigned long long)fuzz_usage(&usage, i);
	}
	printf("fuzz_regions %llu %llu %llu\n", iterations, qa, ua);
	return 0;
}
