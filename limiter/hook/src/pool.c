/*
 * pool.c: the stream-ordered allocator (cuMemAllocAsync,
 * cuMemAllocFromPoolAsync) and its pools. A pool is charged what it
 * reserves from the device (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not the
 * sum of its live allocations: growth is charged before the call, and after
 * it, after every free (mem.c), synchronization and trim, the charge is set
 * to what the pool really holds. Memory a pool caches counts; memory it gives
 * back stops counting.
 */
#define _GNU_SOURCE
#include <string.h>

#include "hook.h"

static struct pool_rec *pool_find_locked(CUmemoryPool pool)
{
	struct hook_state *s = hook_state();
	for (int i = 0; i < HOOK_MAX_POOLS; i++)
		if (s->pools[i].pool == pool)
			return &s->pools[i];
	return NULL;
}

/* pool_note records pool on ordinal dev; returns its usage entry or -1. */
static int pool_note(CUmemoryPool pool, CUdevice dev)
{
	struct hook_state *s = hook_state();
	uint8_t uuid[GPULIMIT_UUID_BYTES];
	if (pool == NULL || device_uuid_of(dev, uuid) != 0)
		return -1;
	int e = usage_dev(uuid);
	if (e < 0)
		return -1;
	pthread_mutex_lock(&s->books_lock);
	struct pool_rec *p = pool_find_locked(pool);
	if (p == NULL)
		p = pool_find_locked(NULL);
	if (p != NULL && p->pool == NULL)
		*p = (struct pool_rec){.pool = pool, .dev = e, .charged = 0};
	int got = p != NULL ? p->dev : -1;
	pthread_mutex_unlock(&s->books_lock);
	if (got < 0)
		hook_log(HOOK_LOG_ERROR, "more than %d memory pools: pool not accounted", HOOK_MAX_POOLS);
	return got;
}

/* pool_attr reads a cuuint64_t attribute of pool; 0 if the driver refuses. */
static uint64_t pool_attr_res(CUmemoryPool pool, CUmemPool_attribute a, CUresult *res)
{
	const struct real_table *r = hook_real();
	cuuint64_t v = 0;
	*res = r->cuMemPoolGetAttribute == NULL ? CUDA_ERROR_NOT_INITIALIZED : r->cuMemPoolGetAttribute(pool, a, &v);
	return *res == CUDA_SUCCESS ? v : 0;
}

static uint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute a)
{
	CUresult res;
	return pool_attr_res(pool, a, &res);
}

/*
 * pool_settle sets the charge of pool to its reservation, given precharged
 * bytes already added. A pool the driver no longer knows (destroyed with its
 * context) holds nothing: its charge goes to 0 and its record is dropped.
 */
void pool_settle(CUmemoryPool pool, uint64_t precharged)
{
	struct hook_state *s = hook_state();
	CUresult res;
	uint64_t reserved = pool_attr_res(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
	int gone = res == CUDA_ERROR_INVALID_VALUE || res == CUDA_ERROR_INVALID_HANDLE ||
	           res == CUDA_ERROR_INVALID_CONTEXT || res == CUDA_ERROR_DEINITIALIZED;
	if (res != CUDA_SUCCESS && !gone)
		return; /* cannot tell: keep the charge */
	pthread_mutex_lock(&s->books_lock);
	struct pool_rec *p = pool_find_locked(pool);
	if (p != NULL) {
		int64_t delta = (int64_t)reserved - (int64_t)p->charged - (int64_t)precharged;
		p->charged = reserved;
		usage_adjust(p->dev, delta);
		if (gone)
			*p = (struct pool_rec){0};
	}
	pthread_mutex_unlock(&s->books_lock);
}

void pools_settle_all(void)
{
	struct hook_state *s = hook_state();
	CUmemoryPool pools[HOOK_MAX_POOLS];
	int n = 0;
	pthread_mutex_lock(&s->books_lock);
	for (int i = 0; i < HOOK_MAX_POOLS; i++)
		if (s->pools[i].pool != NULL)
			pools[n++] = s->pools[i].pool;
	pthread_mutex_unlock(&s->books_lock);
	for (int i = 0; i < n; i++)
		pool_settle(pools[i], 0);
}

typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*alloc_async_default_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

/* alloc_async serves both stream-ordered entry points: from_pool == NULL means the device's current pool. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream,
                            alloc_async_fn from_pool, alloc_async_default_fn current, free_async_fn undo)
{
	const struct real_table *r = hook_real();
	CUdevice dev;
	if (dptr == NULL || bytesize == 0 || mem_current_device(&dev) != 0 ||
	    (pool == NULL && (r->cuDeviceGetMemPool == NULL || r->cuDeviceGetMemPool(&pool, dev) != CUDA_SUCCESS)))
		return current ? current(dptr, bytesize, stream) : from_pool(dptr, bytesize, pool, stream);
	int e = pool_note(pool, dev);
	if (e < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	uint64_t used = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
	uint64_t reserved = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
	uint64_t growth = used + bytesize > reserved ? used + bytesize - reserved : 0;
	uint64_t limit = mem_limit_now();
	if (growth > 0 && usage_charge(e, growth, limit) != 0) {
		hook_log(HOOK_LOG_INFO,
		         "stream-ordered allocation of %zu bytes refused: pool would grow past the slice", bytesize);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUresult res = current ? current(dptr, bytesize, stream) : from_pool(dptr, bytesize, pool, stream);
	if (res != CUDA_SUCCESS) {
		usage_adjust(e, -(int64_t)growth);
		return res;
	}
	pool_settle(pool, growth);
	uint8_t uuid[GPULIMIT_UUID_BYTES];
	usage_dev_uuid(e, uuid);
	if (usage_total(uuid) > limit) {
		/* The pool grew by more than asked (granularity) and that passes the cap: undo. */
		undo(*dptr, stream);
		pool_settle(pool, 0);
		hook_log(HOOK_LOG_INFO,
		         "stream-ordered allocation of %zu bytes refused: pool reservation passes the slice", bytesize);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	books_put(*dptr, bytesize, AK_POOL, e, pool, mem_current_ctx());
	return res;
}

GPULIMIT_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuMemAllocAsync == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	return alloc_async(dptr, bytesize, NULL, h, NULL, r->cuMemAllocAsync, r->cuMemFreeAsync);
}

GPULIMIT_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuMemAllocAsync_ptsz == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	return alloc_async(dptr, bytesize, NULL, h, NULL, r->cuMemAllocAsync_ptsz, r->cuMemFreeAsync_ptsz);
}

GPULIMIT_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuMemAllocFromPoolAsync == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (pool == NULL)
		return r->cuMemAllocFromPoolAsync(dptr, bytesize, pool, h);
	return alloc_async(dptr, bytesize, pool, h, r->cuMemAllocFromPoolAsync, NULL, r->cuMemFreeAsync);
}

GPULIMIT_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuMemAllocFromPoolAsync_ptsz == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (pool == NULL)
		return r->cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, h);
	return alloc_async(dptr, bytesize, pool, h, r->cuMemAllocFromPoolAsync_ptsz, NULL, r->cuMemFreeAsync_ptsz);
}

GPULIMIT_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	const struct real_table *r = hook_real();
	if (r->cuMemPoolCreate == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuMemPoolCreate(pool, props);
	if (res == CUDA_SUCCESS && props != NULL && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
		pool_note(*pool, props->location.id);
	return res;
}

GPULIMIT_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	struct hook_state *s = hook_state();
	const struct real_table *r = hook_real();
	if (r->cuMemPoolDestroy == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuMemPoolDestroy(pool);
	if (res != CUDA_SUCCESS)
		return res;
	pthread_mutex_lock(&s->books_lock);
	struct pool_rec *p = pool_find_locked(pool);
	if (p != NULL) {
		usage_adjust(p->dev, -(int64_t)p->charged);
		*p = (struct pool_rec){0};
	}
	pthread_mutex_unlock(&s->books_lock);
	return res;
}

GPULIMIT_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
	const struct real_table *r = hook_real();
	if (r->cuMemPoolTrimTo == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuMemPoolTrimTo(pool, keep);
	pool_settle(pool, 0);
	return res;
}

/* Synchronization is where pools give memory above their release threshold back. */
GPULIMIT_EXPORT CUresult cuStreamSynchronize(CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuStreamSynchronize == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuStreamSynchronize(h);
	pools_settle_all();
	return res;
}

GPULIMIT_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuStreamSynchronize_ptsz == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuStreamSynchronize_ptsz(h);
	pools_settle_all();
	return res;
}

GPULIMIT_EXPORT CUresult cuCtxSynchronize(void)
{
	const struct real_table *r = hook_real();
	if (r->cuCtxSynchronize == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuCtxSynchronize();
	pools_settle_all();
	return res;
}
