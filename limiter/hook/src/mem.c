/*
 * mem.c: the memory cap. Every device allocation family is charged to the
 * slice before it reaches the driver and refused with
 * CUDA_ERROR_OUT_OF_MEMORY if the slice's use on that device (summed over
 * its processes through the usage region, keyed by device UUID) would pass
 * the limit. Frees return the driver's own result; pointers the hook did not
 * hand out are forwarded untouched. Memory queries show the slice.
 *
 * What is charged:
 *   cuMemAlloc, cuMemAllocPitch (the driver's pitch x height), cuMemAllocManaged,
 *   cuMemCreate: the requested size.
 *   cuMemAllocAsync, cuMemAllocFromPoolAsync: the pool's reservation (pool.c).
 *   Arrays (1D, 3D, mipmapped): width x height x depth x channels x element
 *     size, summed over mip levels (unknown formats count 16 bytes/element).
 *   Graph memory nodes: refused at cuGraphAddMemAllocNode if the node alone
 *     does not fit; the device's graph memory reservation
 *     (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) is charged after each graph
 *     launch and trim.
 * The cap applies to every device the process uses, each on its own.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "hook.h"

uint64_t mem_limit_now(void)
{
	quota_poll(hook_coarse_ns());
	/* 0 while the quota or the usage region is unusable (hook_publish). */
	return __atomic_load_n(&hook_state()->q_memory_limit_bytes, __ATOMIC_ACQUIRE);
}

int device_uuid_of(CUdevice dev, uint8_t out[GPULIMIT_UUID_BYTES])
{
	struct hook_state *s = hook_state();
	const struct real_table *r = hook_real();
	if (dev >= 0 && dev < HOOK_MAX_ORDINALS && __atomic_load_n(&s->ord_known[dev], __ATOMIC_ACQUIRE)) {
		memcpy(out, s->ord_uuid[dev], GPULIMIT_UUID_BYTES);
		return 0;
	}
	CUuuid u;
	if (r->cuDeviceGetUuid == NULL || r->cuDeviceGetUuid(&u, dev) != CUDA_SUCCESS)
		return -1;
	memcpy(out, u.bytes, GPULIMIT_UUID_BYTES);
	/* The slice's GPU comes from the quota file (read-only mount), never from the environment. */
	uint8_t want[GPULIMIT_UUID_BYTES];
	pthread_mutex_lock(&s->poll_lock);
	memcpy(want, s->q_cur.gpu_uuid, sizeof(want));
	pthread_mutex_unlock(&s->poll_lock);
	static const uint8_t none[GPULIMIT_UUID_BYTES];
	if (memcmp(want, none, sizeof(want)) != 0 && memcmp(want, out, sizeof(want)) != 0) {
		char name[48], slice[48];
		uuid_format(out, name, sizeof(name));
		uuid_format(want, slice, sizeof(slice));
		hook_log(HOOK_LOG_WARN, "device %d is %s, not the slice's GPU %s: capped all the same", dev, name,
		         slice);
	}
	if (dev >= 0 && dev < HOOK_MAX_ORDINALS) {
		memcpy(s->ord_uuid[dev], u.bytes, GPULIMIT_UUID_BYTES);
		__atomic_store_n(&s->ord_known[dev], 1, __ATOMIC_RELEASE);
	}
	return 0;
}

int mem_current_device(CUdevice *dev)
{
	const struct real_table *r = hook_real();
	return r->cuCtxGetDevice != NULL && r->cuCtxGetDevice(dev) == CUDA_SUCCESS ? 0 : -1;
}

CUcontext mem_current_ctx(void)
{
	const struct real_table *r = hook_real();
	CUcontext c = NULL;
	if (r->cuCtxGetCurrent == NULL || r->cuCtxGetCurrent(&c) != CUDA_SUCCESS)
		return NULL;
	return c;
}

/* reserve charges bytes on ordinal dev; on success *entry is the usage entry to credit back later. */
static CUresult reserve(CUdevice dev, uint64_t bytes, int *entry, const char *what)
{
	uint8_t uuid[GPULIMIT_UUID_BYTES];
	if (device_uuid_of(dev, uuid) != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	int e = usage_dev(uuid);
	uint64_t limit = mem_limit_now();
	if (e < 0 || usage_charge(e, bytes, limit) != 0) {
		hook_log(HOOK_LOG_INFO, "%s of %llu bytes refused: slice uses %llu of %llu bytes on device %d", what,
		         (unsigned long long)bytes, (unsigned long long)usage_total(uuid), (unsigned long long)limit,
		         dev);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*entry = e;
	return CUDA_SUCCESS;
}

/* ---- linear, pitched, managed ---- */

GPULIMIT_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	const struct real_table *r = hook_real();
	if (r->cuMemAlloc_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUdevice dev;
	if (dptr == NULL || bytesize == 0 || mem_current_device(&dev) != 0)
		return r->cuMemAlloc_v2(dptr, bytesize); /* the driver reports the misuse */
	int e;
	CUresult res = reserve(dev, bytesize, &e, "cuMemAlloc");
	if (res != CUDA_SUCCESS)
		return res;
	res = r->cuMemAlloc_v2(dptr, bytesize);
	if (res != CUDA_SUCCESS) {
		usage_adjust(e, -(int64_t)bytesize);
		return res;
	}
	books_put(*dptr, bytesize, AK_LINEAR, e, NULL, mem_current_ctx());
	return res;
}

GPULIMIT_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height,
                                            unsigned int elem)
{
	const struct real_table *r = hook_real();
	if (r->cuMemAllocPitch_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUdevice dev;
	if (dptr == NULL || pPitch == NULL || width == 0 || height == 0 || mem_current_device(&dev) != 0 ||
	    width > UINT64_MAX / height)
		return r->cuMemAllocPitch_v2(dptr, pPitch, width, height, elem);
	/* The pitch is known only afterwards: charge the unpadded size, then the padding. */
	uint64_t guess = (uint64_t)width * height;
	int e;
	CUresult res = reserve(dev, guess, &e, "cuMemAllocPitch");
	if (res != CUDA_SUCCESS)
		return res;
	res = r->cuMemAllocPitch_v2(dptr, pPitch, width, height, elem);
	if (res != CUDA_SUCCESS) {
		usage_adjust(e, -(int64_t)guess);
		return res;
	}
	uint64_t real_bytes = (uint64_t)*pPitch * height;
	if (real_bytes > guess) {
		int e2;
		if (reserve(dev, real_bytes - guess, &e2, "cuMemAllocPitch padding") != CUDA_SUCCESS) {
			r->cuMemFree_v2(*dptr);
			usage_adjust(e, -(int64_t)guess);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	books_put(*dptr, real_bytes > guess ? real_bytes : guess, AK_LINEAR, e, NULL, mem_current_ctx());
	return res;
}

/*
 * The legacy (pre-3.2, 32-bit) allocation entry points are refused: nothing
 * built since CUDA 3.2 calls them, and charging them would need their own
 * books. A program that asks for them (by dlsym, or cuGetProcAddress with an
 * old cudaVersion) gets CUDA_ERROR_NOT_SUPPORTED and one message.
 */
static CUresult legacy_refused(const char *what)
{
	if (!__atomic_exchange_n(&hook_state()->legacy_logged, 1, __ATOMIC_RELAXED))
		hook_log(HOOK_LOG_ERROR, "%s (the legacy 32-bit entry point) is not supported under the GPU slice's "
		                         "limiter: use %s_v2",
		         what, what);
	return CUDA_ERROR_NOT_SUPPORTED;
}

GPULIMIT_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
	(void)dptr;
	(void)bytesize;
	return legacy_refused("cuMemAlloc");
}

GPULIMIT_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int width,
                                         unsigned int height, unsigned int elem)
{
	(void)dptr;
	(void)pPitch;
	(void)width;
	(void)height;
	(void)elem;
	return legacy_refused("cuMemAllocPitch");
}

GPULIMIT_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	const struct real_table *r = hook_real();
	if (r->cuMemAllocManaged == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUdevice dev;
	if (dptr == NULL || bytesize == 0 || mem_current_device(&dev) != 0)
		return r->cuMemAllocManaged(dptr, bytesize, flags);
	int e;
	CUresult res = reserve(dev, bytesize, &e, "cuMemAllocManaged");
	if (res != CUDA_SUCCESS)
		return res;
	res = r->cuMemAllocManaged(dptr, bytesize, flags);
	if (res != CUDA_SUCCESS) {
		usage_adjust(e, -(int64_t)bytesize);
		return res;
	}
	books_put(*dptr, bytesize, AK_MANAGED, e, NULL, mem_current_ctx());
	return res;
}

/* credit gives back what the books say key holds, after the driver freed it. */
static void credit(const struct alloc_rec *rec)
{
	if (rec->kind == AK_POOL)
		pool_settle(rec->pool, 0);
	else
		usage_adjust(rec->dev, -(int64_t)rec->bytes);
}

/* free_common: take the record first (the address may be reused as soon as the driver frees it). */
#define FREE_COMMON(call, k_)                                                                                          \
	do {                                                                                                           \
		struct alloc_rec rec_;                                                                                 \
		int known_ = books_take((k_), &rec_);                                                                  \
		CUresult res_ = (call);                                                                                \
		if (known_) {                                                                                          \
			if (res_ == CUDA_SUCCESS)                                                                      \
				credit(&rec_);                                                                         \
			else                                                                                           \
				books_put(rec_.key, rec_.bytes, (enum alloc_kind)rec_.kind, rec_.dev, rec_.pool,       \
				          rec_.ctx);                                                                   \
		}                                                                                                      \
		return res_;                                                                                           \
	} while (0)

GPULIMIT_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	const struct real_table *r = hook_real();
	if (r->cuMemFree_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	FREE_COMMON(r->cuMemFree_v2(dptr), dptr);
}

GPULIMIT_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuMemFreeAsync == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	FREE_COMMON(r->cuMemFreeAsync(dptr, h), dptr);
}

GPULIMIT_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuMemFreeAsync_ptsz == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	FREE_COMMON(r->cuMemFreeAsync_ptsz(dptr, h), dptr);
}

/* ---- virtual memory management ---- */

GPULIMIT_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                     unsigned long long flags)
{
	const struct real_table *r = hook_real();
	if (r->cuMemCreate == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (handle == NULL || prop == NULL || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return r->cuMemCreate(handle, size, prop, flags);
	int e;
	CUresult res = reserve(prop->location.id, size, &e, "cuMemCreate");
	if (res != CUDA_SUCCESS)
		return res == CUDA_ERROR_INVALID_DEVICE ? r->cuMemCreate(handle, size, prop, flags) : res;
	res = r->cuMemCreate(handle, size, prop, flags);
	if (res != CUDA_SUCCESS) {
		usage_adjust(e, -(int64_t)size);
		return res;
	}
	books_put(*handle, size, AK_VMM, e, NULL, mem_current_ctx());
	return res;
}

GPULIMIT_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	const struct real_table *r = hook_real();
	if (r->cuMemRelease == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	FREE_COMMON(r->cuMemRelease(handle), handle);
}

/* ---- arrays ---- */

static uint64_t element_bytes(CUarray_format f)
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
	return 16; /* formats this list does not know: count the widest element */
}

/* array_bytes returns the size of one level, saturating at UINT64_MAX. */
static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch)
{
	uint64_t v[5] = {w ? w : 1, h ? h : 1, d ? d : 1, ch ? ch : 1, element_bytes(f)};
	uint64_t n = 1;
	for (int i = 0; i < 5; i++) {
		if (v[i] != 0 && n > UINT64_MAX / v[i])
			return UINT64_MAX;
		n *= v[i];
	}
	return n;
}

static CUresult array_create(uint64_t bytes, const char *what, void *out, const void *desc, unsigned levels,
                             enum alloc_kind kind, CUresult (*call)(void *, const void *, unsigned))
{
	CUdevice dev;
	if (out == NULL || desc == NULL || mem_current_device(&dev) != 0)
		return call(out, desc, levels);
	int e;
	CUresult res = reserve(dev, bytes, &e, what);
	if (res != CUDA_SUCCESS)
		return res;
	res = call(out, desc, levels);
	if (res != CUDA_SUCCESS) {
		usage_adjust(e, -(int64_t)bytes);
		return res;
	}
	books_put((uint64_t)(uintptr_t) * (void **)out, bytes, kind, e, NULL, mem_current_ctx());
	return res;
}

static CUresult call_array(void *out, const void *desc, unsigned levels)
{
	(void)levels;
	return hook_real()->cuArrayCreate_v2(out, desc);
}

static CUresult call_array3d(void *out, const void *desc, unsigned levels)
{
	(void)levels;
	return hook_real()->cuArray3DCreate_v2(out, desc);
}

static CUresult call_mipmap(void *out, const void *desc, unsigned levels)
{
	return hook_real()->cuMipmappedArrayCreate(out, desc, levels);
}

GPULIMIT_EXPORT CUresult cuArrayCreate_v2(CUarray *ph, const CUDA_ARRAY_DESCRIPTOR *d)
{
	if (hook_real()->cuArrayCreate_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	uint64_t n = d ? array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels) : 0;
	return array_create(n, "cuArrayCreate", ph, d, 0, AK_ARRAY, call_array);
}

GPULIMIT_EXPORT CUresult cuArray3DCreate_v2(CUarray *ph, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	if (hook_real()->cuArray3DCreate_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	uint64_t n = d ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels) : 0;
	return array_create(n, "cuArray3DCreate", ph, d, 0, AK_ARRAY, call_array3d);
}

GPULIMIT_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *ph, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                                unsigned int levels)
{
	if (hook_real()->cuMipmappedArrayCreate == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	uint64_t total = 0;
	if (d != NULL) {
		uint64_t w = d->Width, h = d->Height, dp = d->Depth;
		for (unsigned l = 0; l < levels && l < 64; l++) {
			uint64_t n = array_bytes(w, h, dp, d->Format, d->NumChannels);
			total = total > UINT64_MAX - n ? UINT64_MAX : total + n;
			w = w > 1 ? w / 2 : 1;
			h = h > 1 ? h / 2 : h;
			dp = dp > 1 ? dp / 2 : dp;
		}
	}
	return array_create(total, "cuMipmappedArrayCreate", ph, d, levels, AK_MIPMAP, call_mipmap);
}

GPULIMIT_EXPORT CUresult cuArrayDestroy(CUarray h)
{
	const struct real_table *r = hook_real();
	if (r->cuArrayDestroy == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	FREE_COMMON(r->cuArrayDestroy(h), (uint64_t)(uintptr_t)h);
}

GPULIMIT_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h)
{
	const struct real_table *r = hook_real();
	if (r->cuMipmappedArrayDestroy == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	FREE_COMMON(r->cuMipmappedArrayDestroy(h), (uint64_t)(uintptr_t)h);
}

/* ---- graph memory ---- */

GPULIMIT_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t n,
                                                CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
	const struct real_table *r = hook_real();
	if (r->cuGraphAddMemAllocNode == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	uint8_t uuid[GPULIMIT_UUID_BYTES];
	if (p != NULL && p->poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
	    device_uuid_of(p->poolProps.location.id, uuid) == 0) {
		uint64_t limit = mem_limit_now(), used = usage_total(uuid);
		if (p->bytesize > limit || used > limit - p->bytesize) {
			hook_log(HOOK_LOG_INFO, "graph memory node of %zu bytes refused: slice uses %llu of %llu bytes",
			         p->bytesize, (unsigned long long)used, (unsigned long long)limit);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	return r->cuGraphAddMemAllocNode(ph, g, deps, n, p);
}

void graph_mem_settle(void)
{
	struct hook_state *s = hook_state();
	const struct real_table *r = hook_real();
	if (r->cuDeviceGetGraphMemAttribute == NULL)
		return;
	for (CUdevice dev = 0; dev < HOOK_MAX_ORDINALS; dev++) {
		if (!__atomic_load_n(&s->ord_known[dev], __ATOMIC_ACQUIRE))
			continue;
		cuuint64_t reserved = 0;
		if (r->cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) !=
		    CUDA_SUCCESS)
			continue;
		int e = usage_dev(s->ord_uuid[dev]);
		if (e < 0)
			continue;
		pthread_mutex_lock(&s->books_lock);
		int64_t delta = (int64_t)reserved - (int64_t)s->graph_charged[e];
		s->graph_charged[e] = reserved;
		pthread_mutex_unlock(&s->books_lock);
		usage_adjust(e, delta);
	}
}

GPULIMIT_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
	const struct real_table *r = hook_real();
	if (r->cuDeviceGraphMemTrim == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuDeviceGraphMemTrim(dev);
	graph_mem_settle();
	return res;
}

/* ---- contexts: their end frees their allocations ---- */

/* forget_ctx credits back everything context ctx held, after the driver freed it. */
static void forget_ctx(CUcontext ctx)
{
	books_drop_ctx(ctx);
	pools_settle_all(); /* pools of a destroyed context stop existing: their charge goes to 0 */
	graph_mem_settle();
}

/* primary_ctx returns the active primary context of dev, or NULL. */
static CUcontext primary_ctx(CUdevice dev)
{
	const struct real_table *r = hook_real();
	unsigned int flags;
	int active = 0;
	CUcontext c = NULL;
	if (r->cuDevicePrimaryCtxGetState == NULL || r->cuDevicePrimaryCtxRetain == NULL ||
	    r->cuDevicePrimaryCtxRelease_v2 == NULL ||
	    r->cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || !active)
		return NULL;
	/* Retain and release again: the count ends where it was, and the handle is known. */
	if (r->cuDevicePrimaryCtxRetain(&c, dev) != CUDA_SUCCESS)
		return NULL;
	r->cuDevicePrimaryCtxRelease_v2(dev);
	return c;
}

GPULIMIT_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	const struct real_table *r = hook_real();
	if (r->cuCtxDestroy_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuCtxDestroy_v2(ctx);
	if (res == CUDA_SUCCESS)
		forget_ctx(ctx);
	return res;
}

GPULIMIT_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	const struct real_table *r = hook_real();
	if (r->cuDevicePrimaryCtxReset_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUcontext c = primary_ctx(dev);
	CUresult res = r->cuDevicePrimaryCtxReset_v2(dev);
	if (res == CUDA_SUCCESS && c != NULL)
		forget_ctx(c);
	return res;
}

GPULIMIT_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	const struct real_table *r = hook_real();
	if (r->cuDevicePrimaryCtxRelease_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUcontext c = primary_ctx(dev);
	CUresult res = r->cuDevicePrimaryCtxRelease_v2(dev);
	unsigned int flags;
	int active = 1;
	if (res == CUDA_SUCCESS && c != NULL && r->cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS &&
	    !active)
		forget_ctx(c); /* that was the last reference */
	return res;
}

/* ---- what the program is told ---- */

GPULIMIT_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
	const struct real_table *r = hook_real();
	if (r->cuMemGetInfo_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuMemGetInfo_v2(free_b, total);
	CUdevice dev;
	uint8_t uuid[GPULIMIT_UUID_BYTES];
	if (res != CUDA_SUCCESS || mem_current_device(&dev) != 0 || device_uuid_of(dev, uuid) != 0)
		return res;
	uint64_t limit = mem_limit_now(), used = usage_total(uuid);
	uint64_t slice_free = limit > used ? limit - used : 0;
	if (*total > limit)
		*total = (size_t)limit;
	if (*free_b > slice_free)
		*free_b = (size_t)slice_free;
	return res;
}

GPULIMIT_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	const struct real_table *r = hook_real();
	if (r->cuDeviceTotalMem_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuDeviceTotalMem_v2(bytes, dev);
	uint64_t limit = mem_limit_now();
	if (res == CUDA_SUCCESS && *bytes > limit)
		*bytes = (size_t)limit;
	return res;
}
