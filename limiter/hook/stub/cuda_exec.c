/*
 * cuda_exec.c: stub libcuda.so.1 (test-only), part 3 of 3: modules and
 * functions, streams and synchronization, kernel launches and graphs.
 */
#define _GNU_SOURCE
#include "cuda_local.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct stub_stream g_default_stream = {STREAM_MAGIC, 0};
static uint64_t g_all_free_ns; /* max over this process's streams */

static void sleep_until(uint64_t t_ns)
{
	struct timespec ts = {(time_t)(t_ns / 1000000000ull), (long)(t_ns % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
	}
}

struct stub_stream *stub_stream_of(CUstream s)
{
	if ((uintptr_t)s <= 2) /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */
		return &g_default_stream;
	struct stub_stream *st = (struct stub_stream *)s;
	return st->magic == STREAM_MAGIC ? st : NULL;
}

/* ---- modules, functions, streams ---- */

STUB_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	if (stub_cuda_dev() == NULL)
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
	if (stub_cuda_dev() == NULL)
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
	struct stub_stream *s = stub_stream_of(h);
	if (s == NULL || s == &g_default_stream)
		return CUDA_ERROR_INVALID_HANDLE;
	s->magic = 0;
	free(s);
	return CUDA_SUCCESS;
}

static CUresult sync_until(uint64_t t)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (t > stub_now_ns())
		sleep_until(t);
	stub_lock(d);
	stub_trim_pools_locked(d, (uint32_t)getpid(), -1, 0, 0);
	stub_unlock(d);
	return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuStreamSynchronize(CUstream h)
{
	struct stub_stream *s = stub_stream_of(h);
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

/* ---- launches ---- */

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, CUstream h)
{
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	struct stub_func *fn = (struct stub_func *)f;
	if (fn == NULL || fn->magic != FUNC_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	struct stub_stream *s = stub_stream_of(h);
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
	/*
	 * A gap since this process's previous launch returned that is longer
	 * than stall_ns is time it asked for nothing although it launches back
	 * to back: its launcher was off the CPU (descheduled, stopped) or held
	 * that long before calling. The excess is counted, so that a test can
	 * measure a saturating process's share over the time it was asking.
	 */
	uint64_t last = __atomic_load_n(&me->last_return_ns, __ATOMIC_RELAXED);
	if (last != 0 && now > last + d->stall_ns)
		__atomic_add_fetch(&me->stall_ns_total, now - last - d->stall_ns, __ATOMIC_RELAXED);
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
	__atomic_store_n(&me->last_return_ns, stub_now_ns(), __ATOMIC_RELAXED);
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
	struct stub_device *d = stub_cuda_dev();
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
	struct stub_device *d = stub_cuda_dev();
	if (d == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (p == NULL || p->bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct stub_node n = {1, NULL, 0, stub_round_up(p->bytesize, 512)};
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
	struct stub_device *d = stub_cuda_dev();
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
	struct stub_device *d = stub_cuda_dev();
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
	struct stub_device *d = stub_cuda_dev();
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
