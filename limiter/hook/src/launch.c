/*
 * launch.c: kernel and graph launches. Each one records itself in the usage
 * slot, gives the quota poller its chance, and passes the compute pacer
 * (pace.c) before it reaches the driver. The hot path is a coarse clock read,
 * two comparisons, a few relaxed stores and one atomic subtraction.
 */
#include "hook.h"

static inline uint64_t grid(unsigned gx, unsigned gy, unsigned gz)
{
	return (uint64_t)gx * gy * gz;
}

static inline void gate(uint64_t blocks)
{
	uint64_t now = hook_coarse_ns();
	quota_poll(now);
	usage_note_launch();
	pace_admit(blocks, now);
}

GPULIMIT_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                        CUstream h, void **params, void **extra)
{
	const struct real_table *r = hook_real();
	if (r->cuLaunchKernel == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	gate(grid(gx, gy, gz));
	return r->cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, h, params, extra);
}

GPULIMIT_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                             CUstream h, void **params, void **extra)
{
	const struct real_table *r = hook_real();
	if (r->cuLaunchKernel_ptsz == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	gate(grid(gx, gy, gz));
	return r->cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, h, params, extra);
}

GPULIMIT_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	const struct real_table *r = hook_real();
	if (r->cuLaunchKernelEx == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (c != NULL)
		gate(grid(c->gridDimX, c->gridDimY, c->gridDimZ));
	return r->cuLaunchKernelEx(c, f, params, extra);
}

GPULIMIT_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	const struct real_table *r = hook_real();
	if (r->cuLaunchKernelEx_ptsz == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (c != NULL)
		gate(grid(c->gridDimX, c->gridDimY, c->gridDimZ));
	return r->cuLaunchKernelEx_ptsz(c, f, params, extra);
}

GPULIMIT_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                   unsigned int bx, unsigned int by, unsigned int bz,
                                                   unsigned int shmem, CUstream h, void **params)
{
	const struct real_table *r = hook_real();
	if (r->cuLaunchCooperativeKernel == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	gate(grid(gx, gy, gz));
	return r->cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, h, params);
}

GPULIMIT_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                        unsigned int bx, unsigned int by, unsigned int bz,
                                                        unsigned int shmem, CUstream h, void **params)
{
	const struct real_table *r = hook_real();
	if (r->cuLaunchCooperativeKernel_ptsz == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	gate(grid(gx, gy, gz));
	return r->cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, h, params);
}

/*
 * A graph's kernels are not visible at launch; it is charged one full wave
 * (one block per SM). The controller's feedback corrects the rate for what
 * graphs really cost, since it measures the slice's utilization, not blocks.
 */
static uint64_t graph_blocks(void)
{
	return pace_sm_count();
}

GPULIMIT_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuGraphLaunch == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	gate(graph_blocks());
	CUresult res = r->cuGraphLaunch(g, h);
	graph_mem_settle();
	return res;
}

GPULIMIT_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream h)
{
	const struct real_table *r = hook_real();
	if (r->cuGraphLaunch_ptsz == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	gate(graph_blocks());
	CUresult res = r->cuGraphLaunch_ptsz(g, h);
	graph_mem_settle();
	return res;
}
