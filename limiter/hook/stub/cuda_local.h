/*
 * cuda_local.h: what the three files of the stub libcuda.so.1 share
 * (cuda_ctx.c, cuda_mem.c, cuda_exec.c). Test-only.
 */
#ifndef GPUBROKER_STUB_CUDA_LOCAL_H
#define GPUBROKER_STUB_CUDA_LOCAL_H

#include "cuda_subset.h"
#include "stub.h"

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

/* stub_cuda_dev returns the device once cuInit succeeded in this process, else NULL. */
struct stub_device *stub_cuda_dev(void);
/* stub_stream_of returns the stream behind a handle (NULL and the legacy/per-thread handles: the default stream), or
 * NULL. */
struct stub_stream *stub_stream_of(CUstream s);
/* stub_trim_pools_locked releases pool memory of pid above the threshold (synchronize) or down to keep (trim). */
void stub_trim_pools_locked(struct stub_device *d, uint32_t pid, int pool_idx, uint64_t keep, int explicit_trim);

static inline uint64_t stub_round_up(uint64_t x, uint64_t m)
{
	return (x + m - 1) / m * m;
}

#endif
