/*
 * usescuda.c: a library that links the driver (-lcuda) and calls it from
 * inside, as a framework's extension does. Loaded with RTLD_DEEPBIND, its
 * call would bind to the driver ahead of the preloaded hook; the hook drops
 * that flag (src/dispatch.c). Built with -DRUNPATH_PROBE it is an empty
 * library that only cudaprog's RUNPATH finds.
 */
#ifndef RUNPATH_PROBE
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "cuda_subset.h"

/* usescuda_alloc allocates bytes in the current context; returns the CUresult. */
__attribute__((visibility("default"))) CUresult usescuda_alloc(unsigned long long bytes)
{
	CUdeviceptr p;
	return cuMemAlloc_v2(&p, bytes);
}

/*
 * usescuda_next allocates through the cuMemAlloc_v2 that dlsym(RTLD_NEXT)
 * finds from this library, loaded after the hook: the driver's own, which
 * the hook's dlsym hands out as the hook.
 */
__attribute__((visibility("default"))) CUresult usescuda_next(unsigned long long bytes)
{
	void *sym = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
	__typeof__(&cuMemAlloc_v2) f = NULL;
	memcpy(&f, &sym, sizeof(sym));
	CUdeviceptr p;
	return f ? f(&p, bytes) : CUDA_ERROR_NOT_FOUND;
}
#else
__attribute__((visibility("default"))) int gpulimit_runpath_probe(void)
{
	return 1;
}
#endif
