/*
 * cuda_mem.c: stub libcuda.so.1 (test-only), part 2 of 3: device memory,
 * stream-ordered pools, virtual memory management and arrays.
 */
#define _GNU_SOURCE
#include "cuda_local.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- memory ---- */

static int find_alloc_locked(struct stub_device *d, uint64_t handle)
{
	uint32_t me = (uint32_t)getpid();
	for (int i = 0; i < STUB_MAX_ALLOCS; i++)
		if (d->allocs[i].kind != STUB_KIND_FREE && d->allocs[i].handle == handle && d->allocs[i].pid == me)
			return i;
	return -1;
}

/* record_locked books an allocation; charge_device says whether size comes out of device memory now. */
static CUresult record_locked(struct stub_device *d, uint64_t size, int kind, int pool, int charge_device,
                              uint64_t *handle)
{
	struct stub_proc *me = stub_self_locked(d);
	if (me == NULL)
		return CUDA_ERROR_UNKNOWN;
	if (charge_device && d->used_bytes + size > d->total_bytes) {
		d->c_oom++;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	for (int n = 0; n < STUB_MAX_ALLOCS; n++) {
		int i = (int)((d->alloc_hint + (uint32_t)n) % STUB_MAX_ALLOCS);
		struct stub_alloc *a = &d->allocs[i];
		if (a->kind != STUB_KIND_FREE)
			continue;
		d->alloc_hint = (uint32_t)(i + 1) % STUB_MAX_ALLOCS;
		a->handle = d->next_handle;
		d->next_handle += stub_round_up(size ? size : 1, 512);
		a->size = size;
		a->pid = me->pid;
		a->kind = (uint16_t)kind;
		a->pool = (uint16_t)pool;
		if (charge_device) {
			d->used_bytes += size;
			me->mem_bytes += size;
		}
		d->c_alloc++;
		*handle = a->handle;
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_OUT_OF_MEMORY; /* allocation table full */
}

static CUresult alloc_kind(uint64_t size, int kind, uint64_t *handle)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (handle == NULL || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	stub_lock(d);
	stub_reap_soon_locked(d);
	CUresult r = record_locked(d, size, kind, 0, 1, handle);
	stub_unlock(d);
	return r;
}

/* free_kinds releases handle if it is one of the kinds in mask (bit per enum stub_kind). */
static CUresult free_kinds(uint64_t handle, unsigned mask)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	stub_lock(d);
	int i = find_alloc_locked(d, handle);
	if (i < 0 || !(mask & (1u << d->allocs[i].kind))) {
		d->c_free_unknown++;
		stub_unlock(d);
		return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
	}
	struct stub_alloc *a = &d->allocs[i];
	struct stub_proc *me = stub_self_locked(d);
	if (a->kind == STUB_KIND_POOL) {
		d->pools[a->pool - 1].used -= a->size;
	} else {
		d->used_bytes -= a->size;
		if (me)
			me->mem_bytes -= a->size;
	}
	memset(a, 0, sizeof(*a));
	d->c_free++;
	stub_unlock(d);
	return CUDA_SUCCESS;
}

#define LINEAR_KINDS                                                                                                   \
	((1u << STUB_KIND_LINEAR) | (1u << STUB_KIND_MANAGED) | (1u << STUB_KIND_POOL) | (1u << STUB_KIND_GRAPH))

STUB_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (free_b == NULL || total == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	stub_lock(d);
	stub_reap_soon_locked(d);
	*total = d->total_bytes;
	*free_b = d->total_bytes - d->used_bytes;
	stub_unlock(d);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	return alloc_kind(bytesize, STUB_KIND_LINEAR, (uint64_t *)dptr);
}

/*
 * The legacy 32-bit entry point, which real drivers still export: it
 * allocates like cuMemAlloc_v2 and hands back the low 32 bits of the address
 * (all a pre-3.2 program can hold). Memory it takes is freed with the process.
 */
STUB_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
	if (dptr == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t p = 0;
	CUresult r = alloc_kind(bytesize, STUB_KIND_LINEAR, &p);
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr_v1)p;
	return r;
}

STUB_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height,
                                        unsigned int elem)
{
	if (pPitch == NULL || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
		return CUDA_ERROR_INVALID_VALUE;
	size_t pitch = (size_t)stub_round_up(width, 512);
	CUresult r = alloc_kind((uint64_t)pitch * height, STUB_KIND_LINEAR, (uint64_t *)dptr);
	if (r == CUDA_SUCCESS)
		*pPitch = pitch;
	return r;
}

STUB_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	(void)flags;
	return alloc_kind(bytesize, STUB_KIND_MANAGED, (uint64_t *)dptr);
}

STUB_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return free_kinds(dptr, LINEAR_KINDS);
}

/* ---- stream-ordered allocator ---- */

static CUmemoryPool pool_handle(int idx)
{
	return (CUmemoryPool)(uintptr_t)(0x900000ull + (uint64_t)idx + 1);
}

static int pool_index(struct stub_device *d, CUmemoryPool h)
{
	uint64_t v = (uint64_t)(uintptr_t)h;
	if (v <= 0x900000ull || v > 0x900000ull + STUB_MAX_POOLS)
		return -1;
	int idx = (int)(v - 0x900000ull - 1);
	return d->pools[idx].pid == (uint32_t)getpid() ? idx : -1;
}

static int new_pool_locked(struct stub_device *d, int is_default)
{
	for (int i = 0; i < STUB_MAX_POOLS; i++)
		if (d->pools[i].pid == 0) {
			memset(&d->pools[i], 0, sizeof(d->pools[i]));
			d->pools[i].pid = (uint32_t)getpid();
			d->pools[i].is_default = (uint32_t)is_default;
			return i;
		}
	return -1;
}

static int default_pool_locked(struct stub_device *d)
{
	for (int i = 0; i < STUB_MAX_POOLS; i++)
		if (d->pools[i].pid == (uint32_t)getpid() && d->pools[i].is_default)
			return i;
	return new_pool_locked(d, 1);
}

STUB_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *out, CUdevice dev)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (out == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	stub_lock(d);
	int i = default_pool_locked(d);
	stub_unlock(d);
	if (i < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*out = pool_handle(i);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *out, CUdevice dev)
{
	return cuDeviceGetDefaultMemPool(out, dev);
}

STUB_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (pool == NULL || props == NULL || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    props->location.id != 0)
		return CUDA_ERROR_INVALID_VALUE;
	stub_lock(d);
	int i = new_pool_locked(d, 0);
	stub_unlock(d);
	if (i < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*pool = pool_handle(i);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	stub_lock(d);
	int i = pool_index(d, pool);
	if (i < 0 || d->pools[i].is_default) {
		stub_unlock(d);
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (int k = 0; k < STUB_MAX_ALLOCS; k++)
		if (d->allocs[k].kind == STUB_KIND_POOL && d->allocs[k].pool == i + 1)
			memset(&d->allocs[k], 0, sizeof(d->allocs[k]));
	d->used_bytes -= d->pools[i].reserved;
	struct stub_proc *me = stub_self_locked(d);
	if (me)
		me->mem_bytes -= d->pools[i].reserved;
	memset(&d->pools[i], 0, sizeof(d->pools[i]));
	stub_unlock(d);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	stub_lock(d);
	int i = pool_index(d, pool);
	if (i >= 0)
		stub_trim_pools_locked(d, (uint32_t)getpid(), i, keep, 1);
	stub_unlock(d);
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (value == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	stub_lock(d);
	int i = pool_index(d, pool);
	CUresult r = CUDA_SUCCESS;
	if (i < 0) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		struct stub_pool *p = &d->pools[i];
		switch (attr) {
		case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
			*(cuuint64_t *)value = p->release_threshold;
			break;
		case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
			*(cuuint64_t *)value = p->reserved;
			break;
		case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
			*(cuuint64_t *)value = p->reserved_high;
			break;
		case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
			*(cuuint64_t *)value = p->used;
			break;
		case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
			*(cuuint64_t *)value = p->used_high;
			break;
		default:
			*(int *)value = 0;
		}
	}
	stub_unlock(d);
	return r;
}

STUB_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (value == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	stub_lock(d);
	int i = pool_index(d, pool);
	if (i >= 0 && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
		d->pools[i].release_threshold = *(cuuint64_t *)value;
	stub_unlock(d);
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream h, int use_default)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dptr == NULL || bytesize == 0 || stub_stream_of(h) == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	stub_lock(d);
	stub_reap_soon_locked(d);
	int i = use_default ? default_pool_locked(d) : pool_index(d, pool);
	if (i < 0) {
		stub_unlock(d);
		return CUDA_ERROR_INVALID_VALUE;
	}
	struct stub_pool *p = &d->pools[i];
	uint64_t size = stub_round_up(bytesize, 512);
	uint64_t grow = 0;
	if (p->used + size > p->reserved)
		grow = stub_round_up(p->used + size - p->reserved, STUB_POOL_CHUNK);
	if (d->used_bytes + grow > d->total_bytes) {
		d->c_oom++;
		stub_unlock(d);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUresult r = record_locked(d, size, STUB_KIND_POOL, i + 1, 0, (uint64_t *)dptr);
	if (r == CUDA_SUCCESS) {
		struct stub_proc *me = stub_self_locked(d);
		p->reserved += grow;
		d->used_bytes += grow;
		if (me)
			me->mem_bytes += grow;
		p->used += size;
		if (p->used > p->used_high)
			p->used_high = p->used;
		if (p->reserved > p->reserved_high)
			p->reserved_high = p->reserved;
	}
	stub_unlock(d);
	return r;
}

STUB_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream h)
{
	return pool_alloc(dptr, bytesize, NULL, h, 1);
}

STUB_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream h)
{
	return pool_alloc(dptr, bytesize, NULL, h, 1);
}

STUB_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream h)
{
	return pool_alloc(dptr, bytesize, pool, h, 0);
}

STUB_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream h)
{
	return pool_alloc(dptr, bytesize, pool, h, 0);
}

STUB_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream h)
{
	if (stub_stream_of(h) == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return free_kinds(dptr, LINEAR_KINDS);
}

STUB_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream h)
{
	return cuMemFreeAsync(dptr, h);
}

/* ---- virtual memory management ---- */

STUB_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags)
{
	if (prop == NULL || flags != 0 || size == 0 || size % STUB_POOL_CHUNK != 0 ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	if (prop->location.id != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	return alloc_kind(size, STUB_KIND_VMM, (uint64_t *)handle);
}

STUB_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	return free_kinds(handle, 1u << STUB_KIND_VMM);
}

/* ---- arrays ---- */

static uint64_t format_bytes(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8:
		return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF:
		return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32:
	case CU_AD_FORMAT_SIGNED_INT32:
	case CU_AD_FORMAT_FLOAT:
		return 4;
	}
	return 0;
}

static uint64_t array_bytes(size_t w, size_t h, size_t dpt, CUarray_format f, unsigned ch)
{
	uint64_t e = format_bytes(f);
	if (e == 0 || w == 0 || (ch != 1 && ch != 2 && ch != 4))
		return 0;
	return (uint64_t)w * (h ? h : 1) * (dpt ? dpt : 1) * ch * e;
}

STUB_EXPORT CUresult cuArrayCreate_v2(CUarray *ph, const CUDA_ARRAY_DESCRIPTOR *desc)
{
	if (desc == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t n = array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels);
	if (n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_kind(n, STUB_KIND_ARRAY, (uint64_t *)ph);
}

STUB_EXPORT CUresult cuArray3DCreate_v2(CUarray *ph, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	if (desc == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t n = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
	if (n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_kind(n, STUB_KIND_ARRAY, (uint64_t *)ph);
}

STUB_EXPORT CUresult cuArrayDestroy(CUarray h)
{
	return free_kinds((uint64_t)(uintptr_t)h, 1u << STUB_KIND_ARRAY);
}

STUB_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *ph, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int levels)
{
	if (desc == NULL || levels == 0)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t total = 0;
	size_t w = desc->Width, h = desc->Height, dp = desc->Depth;
	for (unsigned l = 0; l < levels; l++) {
		uint64_t n = array_bytes(w, h, dp, desc->Format, desc->NumChannels);
		if (n == 0)
			return CUDA_ERROR_INVALID_VALUE;
		total += n;
		w = w > 1 ? w / 2 : 1;
		h = h > 1 ? h / 2 : h;
		dp = dp > 1 ? dp / 2 : dp;
	}
	return alloc_kind(total, STUB_KIND_MIPMAP, (uint64_t *)ph);
}

STUB_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h)
{
	return free_kinds((uint64_t)(uintptr_t)h, 1u << STUB_KIND_MIPMAP);
}

/* trim_pools_locked releases pool memory above each pool's release threshold, as synchronization does. */
void stub_trim_pools_locked(struct stub_device *d, uint32_t pid, int pool_idx, uint64_t keep, int explicit_trim)
{
	for (int i = 0; i < STUB_MAX_POOLS; i++) {
		struct stub_pool *p = &d->pools[i];
		if (p->pid != pid || (pool_idx >= 0 && i != pool_idx))
			continue;
		uint64_t floor = stub_round_up(p->used, STUB_POOL_CHUNK);
		uint64_t target = explicit_trim ? stub_round_up(keep, STUB_POOL_CHUNK) : p->release_threshold;
		if (target < floor)
			target = floor;
		if (p->reserved > target) {
			uint64_t rel = p->reserved - target;
			p->reserved -= rel;
			d->used_bytes -= rel;
			struct stub_proc *me = stub_self_locked(d);
			if (me)
				me->mem_bytes -= rel;
			d->c_trim++;
		}
	}
}
