/*
 * bench: added cost of the hook per cuLaunchKernel and per cuMemAlloc,
 * against the stub driver called directly, in the same process and run.
 * Run under podrun (the slice's quota and usage files at the fixed in-pod
 * paths) with LD_PRELOAD=libgpulimit.so and LD_LIBRARY_PATH at the stub.
 *
 * The hooked functions come from dlsym on libcuda.so.1 (the interposer hands
 * out the hooks); the direct ones from the stub's own symbol table (elf.c),
 * which no interposer sees: the same functions the hooks call. Launches use
 * a 1-block, 1 ns kernel so the simulated device never pushes back; the
 * slice is warmed up first so the pacer has settled and launches run under
 * the share.
 *
 * Output (one line each): bench launch direct_ns=D hooked_ns=H added_ns=A ratio=R
 *                         bench memalloc direct_ns=D hooked_ns=H added_ns=A ratio=R
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_subset.h"

struct drv {
	__typeof__(&cuInit) init;
	__typeof__(&cuDevicePrimaryCtxRetain) retain;
	__typeof__(&cuCtxSetCurrent) set;
	__typeof__(&cuModuleLoadData) load;
	__typeof__(&cuModuleGetFunction) get;
	__typeof__(&cuLaunchKernel) launch;
	__typeof__(&cuMemAlloc_v2) alloc;
	__typeof__(&cuMemFree_v2) free;
	__typeof__(&cuCtxSynchronize) sync;
	CUfunction fn;
};

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* elf.c (linked in): a symbol from a loaded object's own table, without dlsym. */
void *elf_loaded_symbol(const char *prefix, const char *name);

static void *lookup(void *h, const char *name)
{
	return h != NULL ? dlsym(h, name) : elf_loaded_symbol("libcuda.so", name);
}

/* open_drv fills d from handle h by dlsym, or from libcuda's own table when h is NULL. */
static int open_drv(void *h, struct drv *d)
{
#define SYM(f, n)                                                                                                      \
	do {                                                                                                           \
		void *p_ = lookup(h, n);                                                                               \
		if (p_ == NULL)                                                                                        \
			return -1;                                                                                     \
		memcpy(&d->f, &p_, sizeof(p_));                                                                        \
	} while (0)
	SYM(init, "cuInit");
	SYM(retain, "cuDevicePrimaryCtxRetain");
	SYM(set, "cuCtxSetCurrent");
	SYM(load, "cuModuleLoadData");
	SYM(get, "cuModuleGetFunction");
	SYM(launch, "cuLaunchKernel");
	SYM(alloc, "cuMemAlloc_v2");
	SYM(free, "cuMemFree_v2");
	SYM(sync, "cuCtxSynchronize");
#undef SYM
	CUcontext ctx;
	CUmodule mod;
	if (d->init(0) != CUDA_SUCCESS || d->retain(&ctx, 0) != CUDA_SUCCESS || d->set(ctx) != CUDA_SUCCESS ||
	    d->load(&mod, "bench") != CUDA_SUCCESS || d->get(&d->fn, mod, "busy_1ns") != CUDA_SUCCESS)
		return -1;
	return 0;
}

static double per_launch(struct drv *d, int n)
{
	double t0 = now_ns();
	for (int i = 0; i < n; i++)
		d->launch(d->fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
	return (now_ns() - t0) / n;
}

static double per_alloc(struct drv *d, int n, CUdeviceptr *ptrs)
{
	double t = 0;
	for (int round = 0; round < 5; round++) {
		double t0 = now_ns();
		for (int i = 0; i < n; i++)
			d->alloc(&ptrs[i], 4096);
		t += now_ns() - t0;
		for (int i = 0; i < n; i++)
			d->free(ptrs[i]);
	}
	return t / (5.0 * n);
}

static double best(double a, double b)
{
	return a < b ? a : b;
}

int main(int argc, char **argv)
{
	int launches = argc > 1 ? atoi(argv[1]) : 2000000;
	int allocs = argc > 2 ? atoi(argv[2]) : 2000;
	void *hooked_h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	struct drv hooked, direct;
	if (hooked_h == NULL || open_drv(hooked_h, &hooked) != 0 || open_drv(NULL, &direct) != 0) {
		fprintf(stderr, "bench: cannot reach the driver both ways (is the slice mounted? run under podrun)\n");
		return 1;
	}
	if (hooked.launch == direct.launch) {
		fprintf(stderr, "bench: hooked and direct launch are the same function\n");
		return 1;
	}
	/* Warm up: let the pacer's controller raise the rate above what the loop needs. */
	double until = now_ns() + 1.5e9;
	while (now_ns() < until)
		per_launch(&hooked, 10000);
	double dl = 1e18, hl = 1e18;
	/* Best of several interleaved repetitions: on a shared machine the best one is the least disturbed. */
	for (int rep = 0; rep < 9; rep++) {
		dl = best(dl, per_launch(&direct, launches / 9));
		hl = best(hl, per_launch(&hooked, launches / 9));
	}
	CUdeviceptr *ptrs = calloc((size_t)allocs, sizeof(*ptrs));
	if (ptrs == NULL)
		return 1;
	double da = 1e18, ha = 1e18;
	for (int rep = 0; rep < 9; rep++) {
		da = best(da, per_alloc(&direct, allocs, ptrs));
		ha = best(ha, per_alloc(&hooked, allocs, ptrs));
	}
	printf("bench launch direct_ns=%.1f hooked_ns=%.1f added_ns=%.1f ratio=%.2f\n", dl, hl, hl - dl, hl / dl);
	printf("bench memalloc direct_ns=%.1f hooked_ns=%.1f added_ns=%.1f ratio=%.2f\n", da, ha, ha - da, ha / da);
	return 0;
}
