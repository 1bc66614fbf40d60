/*
 * symbols.h: THE list of driver symbols libgpulimit touches. It is the only
 * list: the dispatch table of real functions (hook.h), the exported
 * declarations (hook.h), the dlsym and cuGetProcAddress interposition
 * (dispatch.c) and the symbol resolution (state.c) are all generated from it.
 *
 * HOOK(lib, name, base, since, ptsz): interposed. libgpulimit exports `name`
 *   (defined in mem.c, launch.c or nvml.c); dlsym and cuGetProcAddress hand
 *   out the hook in place of the driver's `name`. base, since and ptsz say how
 *   cuGetProcAddress asks for it: the unversioned base name, the first CUDA
 *   version (1000*major + 10*minor) that resolves base to `name`, and whether
 *   it is the per-thread-default-stream variant.
 * CALL(lib, name): only called by the hook, through the dispatch table.
 * lib is CUDA (libcuda.so.1) or NVML (libnvidia-ml.so.1).
 */
#ifndef GPULIMIT_SYMBOLS_H
#define GPULIMIT_SYMBOLS_H

/* clang-format off */
#define GPULIMIT_SYMBOLS(HOOK, CALL)                                                   \
	/* entry points; cuInit joins the process to its slice (usage.c) */            \
	HOOK(CUDA, cuInit, "cuInit", 2000, 0)                                           \
	HOOK(CUDA, cuGetProcAddress, "cuGetProcAddress", 11030, 0)                      \
	HOOK(CUDA, cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)                   \
	/* memory: the legacy 32-bit entry points, refused (mem.c) */                   \
	HOOK(CUDA, cuMemAlloc, "cuMemAlloc", 2000, 0)                                   \
	HOOK(CUDA, cuMemAllocPitch, "cuMemAllocPitch", 2000, 0)                         \
	/* memory: linear, pitched, managed */                                          \
	HOOK(CUDA, cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                                \
	HOOK(CUDA, cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                      \
	HOOK(CUDA, cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                     \
	HOOK(CUDA, cuMemFree_v2, "cuMemFree", 3020, 0)                                  \
	/* memory: stream-ordered allocator and pools */                                \
	HOOK(CUDA, cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)                        \
	HOOK(CUDA, cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                   \
	HOOK(CUDA, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0)        \
	HOOK(CUDA, cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1)   \
	HOOK(CUDA, cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                          \
	HOOK(CUDA, cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                     \
	HOOK(CUDA, cuMemPoolCreate, "cuMemPoolCreate", 11020, 0)                        \
	HOOK(CUDA, cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0)                      \
	HOOK(CUDA, cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, 0)                        \
	HOOK(CUDA, cuStreamSynchronize, "cuStreamSynchronize", 2000, 0)                 \
	HOOK(CUDA, cuStreamSynchronize_ptsz, "cuStreamSynchronize", 7000, 1)            \
	HOOK(CUDA, cuCtxSynchronize, "cuCtxSynchronize", 2000, 0)                       \
	/* memory: virtual memory management, arrays, graphs */                         \
	HOOK(CUDA, cuMemCreate, "cuMemCreate", 10020, 0)                                \
	HOOK(CUDA, cuMemRelease, "cuMemRelease", 10020, 0)                              \
	HOOK(CUDA, cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                          \
	HOOK(CUDA, cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                      \
	HOOK(CUDA, cuArrayDestroy, "cuArrayDestroy", 2000, 0)                           \
	HOOK(CUDA, cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)           \
	HOOK(CUDA, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0)         \
	HOOK(CUDA, cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 11040, 0)          \
	HOOK(CUDA, cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", 11040, 0)              \
	/* memory: contexts whose end frees their allocations */                         \
	HOOK(CUDA, cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                            \
	HOOK(CUDA, cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)     \
	HOOK(CUDA, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0) \
	/* memory: what the program is told */                                          \
	HOOK(CUDA, cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                            \
	HOOK(CUDA, cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                    \
	/* launches */                                                                  \
	HOOK(CUDA, cuLaunchKernel, "cuLaunchKernel", 4000, 0)                           \
	HOOK(CUDA, cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)                      \
	HOOK(CUDA, cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)                      \
	HOOK(CUDA, cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                 \
	HOOK(CUDA, cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0)     \
	HOOK(CUDA, cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1) \
	HOOK(CUDA, cuGraphLaunch, "cuGraphLaunch", 10000, 0)                            \
	HOOK(CUDA, cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)                       \
	/* called only */                                                               \
	CALL(CUDA, cuCtxGetDevice)                                                      \
	CALL(CUDA, cuCtxGetCurrent)                                                     \
	CALL(CUDA, cuDevicePrimaryCtxGetState)                                          \
	CALL(CUDA, cuDevicePrimaryCtxRetain)                                            \
	CALL(CUDA, cuDeviceGetUuid)                                                     \
	CALL(CUDA, cuDeviceGetAttribute)                                                \
	CALL(CUDA, cuDeviceGetMemPool)                                                  \
	CALL(CUDA, cuMemPoolGetAttribute)                                               \
	CALL(CUDA, cuDeviceGetGraphMemAttribute)                                        \
	/* NVML */                                                                      \
	HOOK(NVML, nvmlDeviceGetMemoryInfo, "", 0, 0)                                   \
	HOOK(NVML, nvmlDeviceGetMemoryInfo_v2, "", 0, 0)                                \
	CALL(NVML, nvmlInit_v2)                                                         \
	CALL(NVML, nvmlDeviceGetUUID)                                                   \
	CALL(NVML, nvmlDeviceGetHandleByUUID)                                           \
	CALL(NVML, nvmlDeviceGetProcessUtilization)
/* clang-format on */

#endif
