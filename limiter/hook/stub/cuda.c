/*
 * cuda.c: stub libcuda.so.1 (test-only). Implements the driver API subset of
 * cuda_subset.h against the shared simulated device of stub.h. It simulates:
 * it keeps real books of memory, pools, streams and SM time, so the hook and
 * the tests observe behaviour, not canned answers.
 */
#define _GNU_SOURCE
#include "stub.h"

#include "cuda_subset.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FUNC_MAGIC   0x46554e43u
#define STREAM_MAGIC 0x5354524du
#define GRAPH_MAGIC  0x47524150u
#define EXEC_MAGIC   0x45584543u
#define MAX_NODES    64

struct stub_func {
	uint32_t magic;
	uint64_t block_ns; /* run time of one block on one SM */
};

struct stub_stream {
	uint32_t magic;
	uint64_t free_ns; /* CLOCK_MONOTONIC when the stream's queued work is done */
};

struct stub_node {
	int is_alloc;
	CUfunction func;
	uint64_t blocks;
	uint64_t bytes;
};

struct stub_graph {
	uint32_t magic;
	int n;
	struct stub_node nodes[MAX_NODES];
};

struct stub_exec {
	uint32_t magic;
	int n;
	struct stub_node nodes[MAX_NODES];
	uint64_t graph_bytes; /* Σ alloc node bytes */
	int allocated;        /* graph memory reserved by a launch */
};

static int g_inited;
static struct stub_stream g_default_stream = {STREAM_MAGIC, 0};
static uint64_t g_all_free_ns; /* max over this process's streams */
static __thread CUcontext t_ctx;
static char g_ctx_token, g_created_token;
static int g_primary_refs, g_primary_active;

static struct stub_device *dev_or_null(void)
{
	if (!__atomic_load_n(&g_inited, __ATOMIC_ACQUIRE))
		return NULL;
	return stub_dev();
}

static uint64_t round_up(uint64_t x, uint64_t m)
{
	return (x + m - 1) / m * m;
}

static void sleep_until(uint64_t t_ns)
{
	struct timespec ts = {(time_t)(t_ns / 1000000000ull), (long)(t_ns % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
	}
}

static struct stub_stream *stream_of(CUstream s)
{
	if ((uintptr_t)s <= 2) /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */
		return &g_default_stream;
	struct stub_stream *st = (struct stub_stream *)s;
	return st->magic == STREAM_MAGIC ? st : NULL;
}

/* ---- initialization, devices, contexts ---- */

STUB_EXPORT CUresult cuInit(unsigned int flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct stub_device *d = stub_dev();
	if (d == NULL)
		return CUDA_ERROR_NO_DEVICE;
	stub_lock(d);
	struct stub_proc *p = stub_self_locked(d);
	stub_unlock(d);
	if (p == NULL)
		return CUDA_ERROR_UNKNOWN;
	__atomic_store_n(&g_inited, 1, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDriverGetVersion(int *v)
{
	if (v == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*v = 12040;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	if (dev_or_null() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = 0;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetCount(int *count)
{
	if (dev_or_null() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (count == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*count = 1;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (name == NULL || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	strncpy(name, d->name, (size_t)len - 1);
	name[len - 1] = '\0';
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (uuid == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(uuid->bytes, d->uuid, 16);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	return cuDeviceGetUuid(uuid, dev);
}

STUB_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (pi == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
		*pi = (int)d->sm_count;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
		*pi = (int)d->max_threads_per_sm;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
		*pi = 1024;
		break;
	case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
		*pi = 1;
		break;
	default:
		*pi = 0;
	}
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (bytes == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*bytes = d->total_bytes;
	return CUDA_SUCCESS;
}

/*
 * Contexts: the primary context (&g_ctx_token, reference counted) and one
 * created context (&g_created_token). The stub keeps one set of books per
 * process, so destroying a context, resetting the primary context or
 * releasing its last reference frees everything the process holds, as it
 * does for the common single-context program on a real driver.
 */
static void forget_process_memory(void)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return;
	stub_lock(d);
	struct stub_proc *me = stub_self_locked(d);
	if (me != NULL) {
		stub_release_proc_locked(d, me->pid);
		d->used_bytes -= me->graph_reserved;
		me->graph_reserved = 0;
		me->mem_bytes = 0;
	}
	stub_unlock(d);
}

STUB_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	if (dev_or_null() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	__atomic_add_fetch(&g_primary_refs, 1, __ATOMIC_ACQ_REL);
	__atomic_store_n(&g_primary_active, 1, __ATOMIC_RELEASE);
	*pctx = (CUcontext)&g_ctx_token;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	int refs = __atomic_load_n(&g_primary_refs, __ATOMIC_ACQUIRE);
	if (refs <= 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (__atomic_sub_fetch(&g_primary_refs, 1, __ATOMIC_ACQ_REL) == 0) {
		forget_process_memory();
		__atomic_store_n(&g_primary_active, 0, __ATOMIC_RELEASE);
	}
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	if (dev_or_null() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	forget_process_memory();
	__atomic_store_n(&g_primary_active, 0, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	if (dev_or_null() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (flags == NULL || active == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*flags = 0;
	*active = __atomic_load_n(&g_primary_active, __ATOMIC_ACQUIRE);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	(void)flags;
	if (dev_or_null() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = (CUcontext)&g_created_token;
	t_ctx = *pctx;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	if (ctx != (CUcontext)&g_created_token)
		return CUDA_ERROR_INVALID_CONTEXT; /* the primary context is released, not destroyed */
	forget_process_memory();
	if (t_ctx == ctx)
		t_ctx = NULL;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
	if (ctx != NULL && ctx != (CUcontext)&g_ctx_token && ctx != (CUcontext)&g_created_token)
		return CUDA_ERROR_INVALID_CONTEXT;
	t_ctx = ctx;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = t_ctx;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
	if (dev_or_null() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (t_ctx == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = 0;
	return CUDA_SUCCESS;
}

static const struct {
	CUresult code;
	const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

STUB_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	if (pStr == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == error) {
			*pStr = errors[i].text;
			return CUDA_SUCCESS;
		}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

STUB_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	if (pStr == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == error) {
			*pStr = errors[i].name;
			return CUDA_SUCCESS;
		}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

/* ---- modules, functions, streams ---- */

STUB_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	if (dev_or_null() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (module == NULL || image == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*module = (CUmodule)malloc(1);
	return *module ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

STUB_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
	free(hmod);
	return CUDA_SUCCESS;
}

/*
 * cuModuleGetFunction: "busy_<N>us" or "busy_<N>ns" names a kernel whose
 * blocks each run N microseconds (nanoseconds) on one SM; any other name
 * runs 10 us per block.
 */
STUB_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	if (hfunc == NULL || hmod == NULL || name == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	struct stub_func *f = malloc(sizeof(*f));
	if (f == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	f->magic = FUNC_MAGIC;
	f->block_ns = 10000;
	if (strncmp(name, "busy_", 5) == 0) {
		char *end;
		unsigned long long n = strtoull(name + 5, &end, 10);
		if (n > 0 && strcmp(end, "us") == 0)
			f->block_ns = n * 1000;
		else if (n > 0 && strcmp(end, "ns") == 0)
			f->block_ns = n;
	}
	*hfunc = (CUfunction)f;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
	(void)flags;
	if (dev_or_null() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ph == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	struct stub_stream *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->magic = STREAM_MAGIC;
	*ph = (CUstream)s;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuStreamDestroy_v2(CUstream h)
{
	struct stub_stream *s = stream_of(h);
	if (s == NULL || s == &g_default_stream)
		return CUDA_ERROR_INVALID_HANDLE;
	s->magic = 0;
	free(s);
	return CUDA_SUCCESS;
}

/* trim_pools_locked releases pool memory above each pool's release threshold, as synchronization does. */
static void trim_pools_locked(struct stub_device *d, uint32_t pid, int pool_idx, uint64_t keep, int explicit_trim)
{
	for (int i = 0; i < STUB_MAX_POOLS; i++) {
		struct stub_pool *p = &d->pools[i];
		if (p->pid != pid || (pool_idx >= 0 && i != pool_idx))
			continue;
		uint64_t floor = round_up(p->used, STUB_POOL_CHUNK);
		uint64_t target = explicit_trim ? round_up(keep, STUB_POOL_CHUNK) : p->release_threshold;
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

static CUresult sync_until(uint64_t t)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (t > stub_now_ns())
		sleep_until(t);
	stub_lock(d);
	trim_pools_locked(d, (uint32_t)getpid(), -1, 0, 0);
	stub_unlock(d);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuStreamSynchronize(CUstream h)
{
	struct stub_stream *s = stream_of(h);
	if (s == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	return sync_until(__atomic_load_n(&s->free_ns, __ATOMIC_ACQUIRE));
}

STUB_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream h)
{
	return cuStreamSynchronize(h);
}

STUB_EXPORT CUresult cuCtxSynchronize(void)
{
	return sync_until(__atomic_load_n(&g_all_free_ns, __ATOMIC_ACQUIRE));
}

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
		d->next_handle += round_up(size ? size : 1, 512);
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
	struct stub_device *d = dev_or_null();
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
	struct stub_device *d = dev_or_null();
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
	struct stub_device *d = dev_or_null();
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

STUB_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height,
                                        unsigned int elem)
{
	if (pPitch == NULL || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
		return CUDA_ERROR_INVALID_VALUE;
	size_t pitch = (size_t)round_up(width, 512);
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
	struct stub_device *d = dev_or_null();
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
	struct stub_device *d = dev_or_null();
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
	struct stub_device *d = dev_or_null();
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
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	stub_lock(d);
	int i = pool_index(d, pool);
	if (i >= 0)
		trim_pools_locked(d, (uint32_t)getpid(), i, keep, 1);
	stub_unlock(d);
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	struct stub_device *d = dev_or_null();
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
	struct stub_device *d = dev_or_null();
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
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dptr == NULL || bytesize == 0 || stream_of(h) == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	stub_lock(d);
	stub_reap_soon_locked(d);
	int i = use_default ? default_pool_locked(d) : pool_index(d, pool);
	if (i < 0) {
		stub_unlock(d);
		return CUDA_ERROR_INVALID_VALUE;
	}
	struct stub_pool *p = &d->pools[i];
	uint64_t size = round_up(bytesize, 512);
	uint64_t grow = 0;
	if (p->used + size > p->reserved)
		grow = round_up(p->used + size - p->reserved, STUB_POOL_CHUNK);
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
	if (stream_of(h) == NULL)
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

/* ---- launches ---- */

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, CUstream h)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	struct stub_func *fn = (struct stub_func *)f;
	if (fn == NULL || fn->magic != FUNC_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	struct stub_stream *s = stream_of(h);
	if (s == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	uint64_t blocks = (uint64_t)gx * gy * gz;
	if (blocks == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct stub_proc *me = stub_self_cached(d);
	if (me == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	uint64_t sms = d->sm_count;
	uint64_t work = blocks * fn->block_ns;
	uint64_t waves = (blocks + sms - 1) / sms;
	uint64_t now = stub_now_ns();
	uint64_t start = s->free_ns > now ? s->free_ns : now;
	uint64_t b = __atomic_load_n(&d->backlog_end_ns, __ATOMIC_RELAXED), nb;
	do {
		nb = (b > start ? b : start) + work / sms;
	} while (!__atomic_compare_exchange_n(&d->backlog_end_ns, &b, nb, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
	uint64_t finish = start + waves * fn->block_ns;
	if (nb > finish)
		finish = nb;
	__atomic_store_n(&s->free_ns, finish, __ATOMIC_RELEASE);
	uint64_t all = __atomic_load_n(&g_all_free_ns, __ATOMIC_RELAXED);
	while (finish > all &&
	       !__atomic_compare_exchange_n(&g_all_free_ns, &all, finish, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
	}
	__atomic_add_fetch(&me->sm_ns_total, work, __ATOMIC_RELAXED);
	__atomic_add_fetch(&me->launches, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&d->sm_ns_total, work, __ATOMIC_RELAXED);
	__atomic_add_fetch(&d->c_launch, 1, __ATOMIC_RELAXED);
	if (finish > now + d->queue_ns)
		sleep_until(finish - d->queue_ns);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                    unsigned int by, unsigned int bz, unsigned int shmem, CUstream h, void **params,
                                    void **extra)
{
	(void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
	return launch(f, gx, gy, gz, h);
}

STUB_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                         unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                         CUstream h, void **params, void **extra)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, h, params, extra);
}

STUB_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	(void)params, (void)extra;
	if (c == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->hStream);
}

STUB_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	return cuLaunchKernelEx(c, f, params, extra);
}

STUB_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                               unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                               CUstream h, void **params)
{
	(void)bx, (void)by, (void)bz, (void)shmem, (void)params;
	struct stub_device *d = dev_or_null();
	/* A cooperative grid must be co-resident: at most one block per SM here. */
	if (d != NULL && (uint64_t)gx * gy * gz > d->sm_count)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, gx, gy, gz, h);
}

STUB_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                    unsigned int bx, unsigned int by, unsigned int bz,
                                                    unsigned int shmem, CUstream h, void **params)
{
	return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, h, params);
}

/* ---- graphs ---- */

STUB_EXPORT CUresult cuGraphCreate(CUgraph *ph, unsigned int flags)
{
	if (ph == NULL || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct stub_graph *g = calloc(1, sizeof(*g));
	if (g == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	g->magic = GRAPH_MAGIC;
	*ph = (CUgraph)g;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuGraphDestroy(CUgraph h)
{
	struct stub_graph *g = (struct stub_graph *)h;
	if (g == NULL || g->magic != GRAPH_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	g->magic = 0;
	free(g);
	return CUDA_SUCCESS;
}

static CUresult add_node(CUgraphNode *ph, CUgraph h, struct stub_node n)
{
	struct stub_graph *g = (struct stub_graph *)h;
	if (ph == NULL || g == NULL || g->magic != GRAPH_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	if (g->n == MAX_NODES)
		return CUDA_ERROR_OUT_OF_MEMORY;
	g->nodes[g->n] = n;
	*ph = (CUgraphNode)(uintptr_t)(g->n + 1);
	g->n++;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *ph, CUgraph h, const CUgraphNode *deps, size_t ndeps,
                                             const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
	(void)deps, (void)ndeps;
	if (p == NULL || p->func == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	struct stub_node n = {0, p->func, (uint64_t)p->gridDimX * p->gridDimY * p->gridDimZ, 0};
	return add_node(ph, h, n);
}

STUB_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *ph, CUgraph h, const CUgraphNode *deps, size_t ndeps,
                                            CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
	(void)deps, (void)ndeps;
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (p == NULL || p->bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct stub_node n = {1, NULL, 0, round_up(p->bytesize, 512)};
	CUresult r = add_node(ph, h, n);
	if (r == CUDA_SUCCESS)
		p->dptr = __atomic_fetch_add(&d->next_handle, n.bytes, __ATOMIC_RELAXED);
	return r;
}

STUB_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph h, unsigned long long flags)
{
	(void)flags;
	struct stub_graph *g = (struct stub_graph *)h;
	if (pe == NULL || g == NULL || g->magic != GRAPH_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	struct stub_exec *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->magic = EXEC_MAGIC;
	e->n = g->n;
	memcpy(e->nodes, g->nodes, sizeof(g->nodes));
	for (int i = 0; i < e->n; i++)
		if (e->nodes[i].is_alloc)
			e->graph_bytes += e->nodes[i].bytes;
	*pe = (CUgraphExec)e;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuGraphExecDestroy(CUgraphExec h)
{
	struct stub_exec *e = (struct stub_exec *)h;
	if (e == NULL || e->magic != EXEC_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	e->magic = 0;
	free(e);
	return CUDA_SUCCESS;
}

/*
 * cuGraphLaunch: the first launch of an executable graph with memory nodes
 * reserves their bytes in the process's graph memory pool (kept until
 * cuDeviceGraphMemTrim, as the real driver keeps it cached); kernel nodes run
 * in order on the stream.
 */
STUB_EXPORT CUresult cuGraphLaunch(CUgraphExec h, CUstream s)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	struct stub_exec *e = (struct stub_exec *)h;
	if (e == NULL || e->magic != EXEC_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	if (e->graph_bytes && !e->allocated) {
		stub_lock(d);
		stub_reap_soon_locked(d);
		struct stub_proc *me = stub_self_locked(d);
		if (me == NULL || d->used_bytes + e->graph_bytes > d->total_bytes) {
			d->c_oom++;
			stub_unlock(d);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		d->used_bytes += e->graph_bytes;
		me->mem_bytes += e->graph_bytes;
		me->graph_reserved += e->graph_bytes;
		e->allocated = 1;
		stub_unlock(d);
	}
	for (int i = 0; i < e->n; i++) {
		if (e->nodes[i].is_alloc)
			continue;
		CUresult r = launch(e->nodes[i].func, (unsigned)e->nodes[i].blocks, 1, 1, s);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec h, CUstream s)
{
	return cuGraphLaunch(h, s);
}

STUB_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (value == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	stub_lock(d);
	struct stub_proc *me = stub_self_locked(d);
	uint64_t v = me ? me->graph_reserved : 0;
	stub_unlock(d);
	(void)attr; /* used == reserved: graph memory is not freed before trim here */
	*(cuuint64_t *)value = v;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
	struct stub_device *d = dev_or_null();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	/* Without tracking which executable graphs are alive, the stub releases all graph memory on trim. */
	stub_lock(d);
	struct stub_proc *me = stub_self_locked(d);
	if (me) {
		d->used_bytes -= me->graph_reserved;
		me->mem_bytes -= me->graph_reserved;
		me->graph_reserved = 0;
	}
	stub_unlock(d);
	return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */

/* procs lists what cuGetProcAddress resolves: base name, minimum CUDA version, per-thread-stream variant. */
static const struct {
	const char *base;
	int since;
	int ptsz;
	void *fn;
} procs[] = {
#define P(base, since, ptsz, fn)                                                                                       \
	{                                                                                                              \
		base, since, ptsz, (void *)fn                                                                          \
	}
    P("cuInit", 2000, 0, cuInit),
    P("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
    P("cuDeviceGet", 2000, 0, cuDeviceGet),
    P("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
    P("cuDeviceGetName", 2000, 0, cuDeviceGetName),
    P("cuDeviceGetUuid", 9020, 0, cuDeviceGetUuid),
    P("cuDeviceGetUuid", 11040, 0, cuDeviceGetUuid_v2),
    P("cuDeviceGetAttribute", 2000, 0, cuDeviceGetAttribute),
    P("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2),
    P("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 11000, 0, cuDevicePrimaryCtxReset_v2),
    P("cuDevicePrimaryCtxGetState", 7000, 0, cuDevicePrimaryCtxGetState),
    P("cuCtxCreate", 3020, 0, cuCtxCreate_v2),
    P("cuCtxDestroy", 4000, 0, cuCtxDestroy_v2),
    P("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent),
    P("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent),
    P("cuCtxGetDevice", 2000, 0, cuCtxGetDevice),
    P("cuCtxSynchronize", 2000, 0, cuCtxSynchronize),
    P("cuGetErrorString", 6000, 0, cuGetErrorString),
    P("cuGetErrorName", 6000, 0, cuGetErrorName),
    P("cuGetProcAddress", 11030, 0, cuGetProcAddress),
    P("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2),
    P("cuModuleLoadData", 2000, 0, cuModuleLoadData),
    P("cuModuleUnload", 2000, 0, cuModuleUnload),
    P("cuModuleGetFunction", 2000, 0, cuModuleGetFunction),
    P("cuStreamCreate", 2000, 0, cuStreamCreate),
    P("cuStreamDestroy", 4000, 0, cuStreamDestroy_v2),
    P("cuStreamSynchronize", 2000, 0, cuStreamSynchronize),
    P("cuStreamSynchronize", 7000, 1, cuStreamSynchronize_ptsz),
    P("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2),
    P("cuMemAlloc", 3020, 0, cuMemAlloc_v2),
    P("cuMemAllocPitch", 3020, 0, cuMemAllocPitch_v2),
    P("cuMemAllocManaged", 6000, 0, cuMemAllocManaged),
    P("cuMemFree", 3020, 0, cuMemFree_v2),
    P("cuMemAllocAsync", 11020, 0, cuMemAllocAsync),
    P("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync),
    P("cuMemAllocFromPoolAsync", 11020, 1, cuMemAllocFromPoolAsync_ptsz),
    P("cuMemFreeAsync", 11020, 0, cuMemFreeAsync),
    P("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz),
    P("cuMemPoolCreate", 11020, 0, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, 0, cuMemPoolDestroy),
    P("cuMemPoolTrimTo", 11020, 0, cuMemPoolTrimTo),
    P("cuMemPoolGetAttribute", 11020, 0, cuMemPoolGetAttribute),
    P("cuMemPoolSetAttribute", 11020, 0, cuMemPoolSetAttribute),
    P("cuDeviceGetDefaultMemPool", 11020, 0, cuDeviceGetDefaultMemPool),
    P("cuDeviceGetMemPool", 11020, 0, cuDeviceGetMemPool),
    P("cuMemCreate", 10020, 0, cuMemCreate),
    P("cuMemRelease", 10020, 0, cuMemRelease),
    P("cuArrayCreate", 3020, 0, cuArrayCreate_v2),
    P("cuArray3DCreate", 3020, 0, cuArray3DCreate_v2),
    P("cuArrayDestroy", 2000, 0, cuArrayDestroy),
    P("cuMipmappedArrayCreate", 5000, 0, cuMipmappedArrayCreate),
    P("cuMipmappedArrayDestroy", 5000, 0, cuMipmappedArrayDestroy),
    P("cuLaunchKernel", 4000, 0, cuLaunchKernel),
    P("cuLaunchKernel", 7000, 1, cuLaunchKernel_ptsz),
    P("cuLaunchKernelEx", 11060, 0, cuLaunchKernelEx),
    P("cuLaunchKernelEx", 11060, 1, cuLaunchKernelEx_ptsz),
    P("cuLaunchCooperativeKernel", 9000, 0, cuLaunchCooperativeKernel),
    P("cuLaunchCooperativeKernel", 9000, 1, cuLaunchCooperativeKernel_ptsz),
    P("cuGraphCreate", 10000, 0, cuGraphCreate),
    P("cuGraphDestroy", 10000, 0, cuGraphDestroy),
    P("cuGraphAddKernelNode", 12000, 0, cuGraphAddKernelNode_v2),
    P("cuGraphAddMemAllocNode", 11040, 0, cuGraphAddMemAllocNode),
    P("cuGraphInstantiateWithFlags", 11040, 0, cuGraphInstantiateWithFlags),
    P("cuGraphExecDestroy", 10000, 0, cuGraphExecDestroy),
    P("cuGraphLaunch", 10000, 0, cuGraphLaunch),
    P("cuGraphLaunch", 10000, 1, cuGraphLaunch_ptsz),
    P("cuDeviceGetGraphMemAttribute", 11040, 0, cuDeviceGetGraphMemAttribute),
    P("cuDeviceGraphMemTrim", 11040, 0, cuDeviceGraphMemTrim),
#undef P
};

STUB_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *status)
{
	if (symbol == NULL || pfn == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	int best = -1, found_name = 0;
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		if (strcmp(procs[i].base, symbol) != 0)
			continue;
		found_name = 1;
		if (procs[i].since > cudaVersion)
			continue;
		if (procs[i].ptsz && !want_ptsz)
			continue;
		if (best < 0 || procs[i].since > procs[best].since ||
		    (procs[i].since == procs[best].since && procs[i].ptsz))
			best = (int)i;
	}
	if (best < 0) {
		*pfn = NULL;
		if (status)
			*status = found_name ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
			                     : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		return CUDA_ERROR_NOT_FOUND;
	}
	*pfn = procs[best].fn;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SUCCESS;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
