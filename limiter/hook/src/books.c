/*
 * books.c: what this process allocated through the hook, by device pointer
 * or handle: an open-addressing hash table under hook_state.books_lock,
 * doubled when half full. Unknown keys are the caller's business: frees of
 * pointers not in the books are forwarded to the driver untouched.
 */
#include <stdlib.h>
#include <string.h>

#include "hook.h"

#define KEY_EMPTY 0
#define KEY_TOMB  1

static size_t slot_of(uint64_t key, size_t cap)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdull;
	key ^= key >> 33;
	return (size_t)key & (cap - 1);
}

/* grow_locked rehashes without tombstones, doubling the capacity while live records fill half of it. */
static int grow_locked(struct hook_state *s)
{
	size_t live = 0;
	for (size_t i = 0; i < s->recs_cap; i++)
		live += s->recs[i].key > KEY_TOMB;
	size_t cap = s->recs_cap ? s->recs_cap : 1024;
	while ((live + 1) * 2 > cap)
		cap *= 2;
	struct alloc_rec *n = calloc(cap, sizeof(*n));
	if (n == NULL)
		return -1;
	for (size_t i = 0; i < s->recs_cap; i++) {
		struct alloc_rec *r = &s->recs[i];
		if (r->key == KEY_EMPTY || r->key == KEY_TOMB)
			continue;
		size_t j = slot_of(r->key, cap);
		while (n[j].key != KEY_EMPTY)
			j = (j + 1) & (cap - 1);
		n[j] = *r;
	}
	free(s->recs);
	s->recs = n;
	s->recs_cap = cap;
	s->recs_used = live;
	return 0;
}

void books_put(uint64_t key, uint64_t bytes, enum alloc_kind kind, int dev, CUmemoryPool pool, CUcontext ctx)
{
	struct hook_state *s = hook_state();
	if (key <= KEY_TOMB)
		return;
	pthread_mutex_lock(&s->books_lock);
	if ((s->recs_used + 1) * 2 > s->recs_cap && grow_locked(s) != 0) {
		pthread_mutex_unlock(&s->books_lock);
		hook_log(HOOK_LOG_ERROR, "out of host memory for allocation books: %llu bytes stay charged",
		         (unsigned long long)bytes);
		return;
	}
	size_t j = slot_of(key, s->recs_cap);
	while (s->recs[j].key != KEY_EMPTY && s->recs[j].key != KEY_TOMB && s->recs[j].key != key)
		j = (j + 1) & (s->recs_cap - 1);
	if (s->recs[j].key != key)
		s->recs_used++;
	s->recs[j] = (struct alloc_rec){.key = key, .bytes = bytes, .kind = kind, .dev = dev, .pool = pool, .ctx = ctx};
	pthread_mutex_unlock(&s->books_lock);
}

static struct alloc_rec *find_locked(struct hook_state *s, uint64_t key)
{
	if (s->recs_cap == 0 || key <= KEY_TOMB)
		return NULL;
	size_t j = slot_of(key, s->recs_cap);
	for (size_t n = 0; n < s->recs_cap && s->recs[j].key != KEY_EMPTY; n++) {
		if (s->recs[j].key == key)
			return &s->recs[j];
		j = (j + 1) & (s->recs_cap - 1);
	}
	return NULL;
}

int books_take(uint64_t key, struct alloc_rec *out)
{
	struct hook_state *s = hook_state();
	pthread_mutex_lock(&s->books_lock);
	struct alloc_rec *r = find_locked(s, key);
	if (r != NULL) {
		*out = *r;
		r->key = KEY_TOMB; /* tombstones count toward the load factor until the next grow */
	}
	pthread_mutex_unlock(&s->books_lock);
	return r != NULL;
}

int books_find(uint64_t key, struct alloc_rec *out)
{
	struct hook_state *s = hook_state();
	pthread_mutex_lock(&s->books_lock);
	struct alloc_rec *r = find_locked(s, key);
	if (r != NULL)
		*out = *r;
	pthread_mutex_unlock(&s->books_lock);
	return r != NULL;
}

void books_drop_ctx(CUcontext ctx)
{
	struct hook_state *s = hook_state();
	int64_t credit[GPULIMIT_USAGE_DEVICES] = {0};
	pthread_mutex_lock(&s->books_lock);
	for (size_t i = 0; i < s->recs_cap; i++) {
		struct alloc_rec *r = &s->recs[i];
		if (r->key <= KEY_TOMB || r->ctx != ctx || r->kind == AK_POOL)
			continue;
		if (r->dev >= 0 && r->dev < GPULIMIT_USAGE_DEVICES)
			credit[r->dev] += (int64_t)r->bytes;
		r->key = KEY_TOMB;
	}
	pthread_mutex_unlock(&s->books_lock);
	for (int k = 0; k < GPULIMIT_USAGE_DEVICES; k++)
		usage_adjust(k, -credit[k]);
}

void books_reset_after_fork(void)
{
	struct hook_state *s = hook_state();
	/* The child has no device allocations of its own; the parent's records are not its to free. */
	free(s->recs);
	s->recs = NULL;
	s->recs_cap = 0;
	s->recs_used = 0;
	memset(s->pools, 0, sizeof(s->pools));
	memset(s->graph_charged, 0, sizeof(s->graph_charged));
}
