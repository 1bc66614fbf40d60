/*
 * usescuda.c: a library that links the driver (-lcuda) and calls it from
 * inside, as a framework's extension does. Loaded with RTLD_DEEPBIND, its
 * call would bind to the driver ahead of the preloaded hook; the hook drops
 * that flag (src/dispatch.c). Built with -DRUNPATH_PROBE it is an empty
 * library that only cudaprog's RUNPATH finds.
 */
#ifndef RUNPATH_PROBE
#include "cuda_subset.h"

/* usescuda_alloc allocates bytes in the current context; returns the CUresult. */
__attribute__((visibility("default"))) CUresult usescuda_alloc(unsigned long long bytes)
{
	CUdeviceptr p;
	return cuMemAlloc_v2(&p, bytes);
}
#else
__attribute__((visibility("default"))) int gpulimit_runpath_probe(void)
{
	return 1;
}
#endif
