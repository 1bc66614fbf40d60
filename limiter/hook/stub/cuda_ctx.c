/*
 * cuda_ctx.c: stub libcuda.so.1 (test-only), part 1 of 3: initialization,
 * devices, contexts, error strings and cuGetProcAddress. The stub simulates:
 * it keeps real books of memory, pools, streams and SM time (cuda_mem.c,
 * cuda_exec.c) against the shared device of stub.h, so the hook and the
 * tests observe behaviour, not canned answers.
 */
#define _GNU_SOURCE
#include "cuda_local.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_inited;
static __thread CUcontext t_ctx;
static char g_ctx_token, g_created_token;
static int g_primary_refs, g_primary_active;

struct stub_device *stub_cuda_dev(void)
{
	if (!__atomic_load_n(&g_inited, __ATOMIC_ACQUIRE))
		return NULL;
	return stub_dev();
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
	if (stub_cuda_dev() == NULL)
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
	if (stub_cuda_dev() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (count == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*count = 1;
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	struct stub_device *d = stub_cuda_dev();
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
	struct stub_device *d = stub_cuda_dev();
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
	struct stub_device *d = stub_cuda_dev();
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
	struct stub_device *d = stub_cuda_dev();
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
	struct stub_device *d = stub_cuda_dev();
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
	if (stub_cuda_dev() == NULL)
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
	if (stub_cuda_dev() == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	forget_process_memory();
	__atomic_store_n(&g_primary_active, 0, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	if (stub_cuda_dev() == NULL)
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
	if (stub_cuda_dev() == NULL)
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
	if (stub_cuda_dev() == NULL)
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
    P("cuMemAlloc", 2000, 0, cuMemAlloc),
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
