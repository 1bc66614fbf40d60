/*
 * cudaprog: a driver-API program for the limiter tests. It links against
 * libcuda like a real program and is run with LD_PRELOAD=libgpulimit.so and
 * LD_LIBRARY_PATH pointing at the stub driver.
 *
 *   cudaprog [-p|-P|-1] [-V VERSION] [-a PATH] [-i] [command ...]
 *     -p  reach every driver function through cuGetProcAddress_v2, obtained
 *         with dlopen("libcuda.so.1") + dlsym, the way the CUDA runtime does
 *     -P  the same with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, which
 *         yields the _ptsz entry points (runtime built for per-thread streams)
 *     -1  the same through cuGetProcAddress (v1, CUDA 11.3..11.8)
 *     -V  the cudaVersion passed to cuGetProcAddress (default 12040)
 *     -a  reach every driver function by dlsym on dlopen(PATH): the driver by
 *         an absolute path, or a copy of it under another path or name
 *     -i  after the argument commands, read commands from stdin, one a line
 *
 * A failed setup (cuInit refused, no device) prints "setup CUresult" and, with
 * -i, the program goes on reading commands, which then fail as the driver
 * says: the tests look at what the hook refuses.
 *
 * Each command prints one line: its name, the CUresult as an integer, then
 * values. Commands:
 *   alloc KIND BYTES     KIND: linear pitch managed async pool vmm array array3d mipmap graph
 *   free                 free the newest live allocation
 *   freeall              free every live allocation, newest first
 *   fill KIND CHUNK      allocate CHUNK-byte blocks until refused; prints count and bytes
 *   churn N BYTES        N x (alloc BYTES linear; free), refusals allowed; prints ok count
 *   asyncloop N BYTES    N x (cuMemAllocAsync; cuMemFreeAsync), then cuStreamSynchronize
 *   freeunknown          cuMemFree of an address nobody allocated
 *   meminfo              cuMemGetInfo: free total
 *   totalmem             cuDeviceTotalMem: bytes
 *   nvmlmem              nvmlDeviceGetMemoryInfo v1 and v2: total used free total2 used2 free2
 *   waitalloc BYTES MS   retry alloc+free of BYTES until it succeeds or MS pass; prints elapsed us
 *   waitoom BYTES MS     retry alloc+free of BYTES until it is refused or MS pass; prints elapsed us
 *   launch KIND FN GRID N  KIND: kernel ex coop graph; N launches of function FN, then synchronize
 *   saturate FN GRID MS  launch FN back to back for MS milliseconds; prints launches
 *   loop CHUNK           forever: fill with CHUNK blocks, free all (for kill tests); prints "looping"
 *                        once, after the first block is held
 *   sync                 cuCtxSynchronize
 *   threads N CHUNK      N threads allocate CHUNK-byte blocks until refused, then free them all;
 *                        prints total blocks held at the peak (sum over threads)
 *   fork CHUNK           fork; the child allocates CHUNK bytes and exits; prints the child's CUresult
 *   reset                cuDevicePrimaryCtxReset (frees everything); forgets the live list
 *   ctxcycle BYTES       cuCtxCreate, allocate BYTES in it, cuCtxDestroy, back to the primary context
 *   dlcheck              dlsym interposition: prints 1/0 for (hooked symbol -> libgpulimit,
 *                        unhooked symbol -> libcuda, RTLD_NEXT malloc == libc malloc,
 *                        dlvsym of a versioned libc symbol == dlsym's)
 *   rawalloc BYTES       cuMemAlloc_v2 found in libcuda's own symbol table (no dlsym): what
 *                        the hook cannot stop in user space (the node agent does)
 *   legacy BYTES         the legacy 32-bit cuMemAlloc, by dlsym
 *   legacyproc BYTES     the same through cuGetProcAddress_v2("cuMemAlloc", cudaVersion 3000)
 *   dlmopen FILE BYTES   dlmopen(LM_ID_NEWLM, FILE); if it loads, initialize the driver there and
 *                        allocate BYTES through it; prints 1/0 (loaded) and the allocation's CUresult
 *   deepbind LIB BYTES   dlopen(LIB, RTLD_NOW | RTLD_DEEPBIND) and call its usescuda_alloc(BYTES),
 *                        which calls cuMemAlloc_v2 from inside LIB; prints the CUresult
 *   nextalloc LIB BYTES  call LIB's usescuda_next(BYTES): cuMemAlloc_v2 by dlsym(RTLD_NEXT) from LIB
 *   runpath              dlopen of a library found only through cudaprog's own RUNPATH; 1/0
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_subset.h"
#include "nvml_subset.h"

#define MAX_LIVE 65536

/*
 * The driver functions cudaprog uses: X(field of struct api, exported
 * (versioned) name, the name cuGetProcAddress takes).
 */
/* clang-format off */
#define API_FUNCS(X)                                                                    \
	X(init, cuInit, "cuInit")                                                       \
	X(deviceGet, cuDeviceGet, "cuDeviceGet")                                        \
	X(ctxRetain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")              \
	X(ctxSetCurrent, cuCtxSetCurrent, "cuCtxSetCurrent")                            \
	X(ctxSynchronize, cuCtxSynchronize, "cuCtxSynchronize")                         \
	X(ctxCreate, cuCtxCreate_v2, "cuCtxCreate")                                     \
	X(ctxDestroy, cuCtxDestroy_v2, "cuCtxDestroy")                                  \
	X(ctxReset, cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset")              \
	X(moduleLoad, cuModuleLoadData, "cuModuleLoadData")                             \
	X(getFunction, cuModuleGetFunction, "cuModuleGetFunction")                      \
	X(streamSynchronize, cuStreamSynchronize, "cuStreamSynchronize")                \
	X(memGetInfo, cuMemGetInfo_v2, "cuMemGetInfo")                                  \
	X(totalMem, cuDeviceTotalMem_v2, "cuDeviceTotalMem")                            \
	X(memAlloc, cuMemAlloc_v2, "cuMemAlloc")                                        \
	X(memAllocPitch, cuMemAllocPitch_v2, "cuMemAllocPitch")                         \
	X(memAllocManaged, cuMemAllocManaged, "cuMemAllocManaged")                      \
	X(memFree, cuMemFree_v2, "cuMemFree")                                           \
	X(memAllocAsync, cuMemAllocAsync, "cuMemAllocAsync")                            \
	X(memAllocFromPoolAsync, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync")    \
	X(memFreeAsync, cuMemFreeAsync, "cuMemFreeAsync")                               \
	X(poolCreate, cuMemPoolCreate, "cuMemPoolCreate")                               \
	X(memCreate, cuMemCreate, "cuMemCreate")                                        \
	X(memRelease, cuMemRelease, "cuMemRelease")                                     \
	X(arrayCreate, cuArrayCreate_v2, "cuArrayCreate")                               \
	X(array3DCreate, cuArray3DCreate_v2, "cuArray3DCreate")                         \
	X(arrayDestroy, cuArrayDestroy, "cuArrayDestroy")                               \
	X(mipmapCreate, cuMipmappedArrayCreate, "cuMipmappedArrayCreate")               \
	X(mipmapDestroy, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy")            \
	X(graphCreate, cuGraphCreate, "cuGraphCreate")                                  \
	X(graphAddMemAllocNode, cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode")       \
	X(graphAddKernelNode, cuGraphAddKernelNode_v2, "cuGraphAddKernelNode")          \
	X(graphInstantiate, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags") \
	X(graphLaunch, cuGraphLaunch, "cuGraphLaunch")                                  \
	X(launchKernel, cuLaunchKernel, "cuLaunchKernel")                               \
	X(launchKernelEx, cuLaunchKernelEx, "cuLaunchKernelEx")                         \
	X(launchCoop, cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel")
/* clang-format on */

struct api {
#define API_FIELD(field, sym, base) __typeof__(&sym) field;
	API_FUNCS(API_FIELD)
#undef API_FIELD
};

static struct api A;
static CUmemoryPool g_pool;
static CUcontext g_ctx;
static CUstream g_stream;

struct live {
	int kind;
	uint64_t h;
};
static struct live live[MAX_LIVE];
static int nlive;

enum { K_LINEAR, K_PITCH, K_MANAGED, K_ASYNC, K_POOL, K_VMM, K_ARRAY, K_ARRAY3D, K_MIPMAP, K_GRAPH, K_N };
static const char *kinds[K_N] = {"linear", "pitch", "managed", "async",  "pool",
                                 "vmm",    "array", "array3d", "mipmap", "graph"};

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000;
}

static void fill_direct(void)
{
#define DIRECT(field, sym, base) A.field = sym;
	API_FUNCS(DIRECT)
#undef DIRECT
}

/* elf.c (linked in): a symbol from a loaded object's own table, without dlsym. */
void *elf_loaded_symbol(const char *prefix, const char *name);

static int g_cuda_version = 12040;
static __typeof__(&cuGetProcAddress_v2) g_gpa2;
static __typeof__(&cuGetProcAddress) g_gpa1;

static CUresult get_proc(const char *name, void **p, cuuint64_t flags)
{
	return g_gpa2 ? g_gpa2(name, p, g_cuda_version, flags, NULL) : g_gpa1(name, p, g_cuda_version, flags);
}

/* fill_procaddr reaches every function through cuGetProcAddress (v2, or v1 with v1 set). */
static int fill_procaddr(cuuint64_t flags, int v1)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
		return -1;
	}
	void *entry = dlsym(lib, v1 ? "cuGetProcAddress" : "cuGetProcAddress_v2");
	if (entry == NULL)
		return -1;
	if (v1)
		memcpy(&g_gpa1, &entry, sizeof(entry));
	else
		memcpy(&g_gpa2, &entry, sizeof(entry));
	/* The runtime (v2) also asks the driver for cuGetProcAddress itself, and uses the answer. */
	if (!v1) {
		void *self = NULL;
		if (get_proc("cuGetProcAddress", &self, 0) != CUDA_SUCCESS || self == NULL)
			return -1;
		memcpy(&g_gpa2, &self, sizeof(self));
	}
#define GET(field, name)                                                                                               \
	do {                                                                                                           \
		void *p_ = NULL;                                                                                       \
		if (get_proc(name, &p_, flags) != CUDA_SUCCESS || p_ == NULL) {                                        \
			fprintf(stderr, "cuGetProcAddress(%s) failed\n", name);                                        \
			return -1;                                                                                     \
		}                                                                                                      \
		memcpy(&A.field, &p_, sizeof(p_));                                                                     \
	} while (0)
#define GET_API(field, sym, base) GET(field, base);
	API_FUNCS(GET_API)
#undef GET_API
#undef GET
	return 0;
}

/* fill_dlsym reaches every function by dlsym on dlopen(path), under the exported (versioned) names. */
static int fill_dlsym(const char *path)
{
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
		return -1;
	}
#define SYM(field, name)                                                                                               \
	do {                                                                                                           \
		void *p_ = dlsym(lib, name);                                                                           \
		if (p_ == NULL) {                                                                                      \
			fprintf(stderr, "dlsym(%s) failed\n", name);                                                   \
			return -1;                                                                                     \
		}                                                                                                      \
		memcpy(&A.field, &p_, sizeof(p_));                                                                     \
	} while (0)
#define SYM_API(field, sym, base) SYM(field, #sym);
	API_FUNCS(SYM_API)
#undef SYM_API
#undef SYM
	return 0;
}

/* dlmopen_alloc loads file into a new link-map namespace and, if that works, allocates there. */
static void dlmopen_alloc(const char *file, uint64_t bytes)
{
	void *h = dlmopen(LM_ID_NEWLM, file, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		printf("dlmopen %d 0\n", CUDA_ERROR_NOT_PERMITTED);
		return;
	}
	/* The driver may be file itself or one of its dependencies: look it up through h. */
	__typeof__(&cuInit) init = (__typeof__(&cuInit))dlsym(h, "cuInit");
	__typeof__(&cuDevicePrimaryCtxRetain) retain =
	    (__typeof__(&cuDevicePrimaryCtxRetain))dlsym(h, "cuDevicePrimaryCtxRetain");
	__typeof__(&cuCtxSetCurrent) set = (__typeof__(&cuCtxSetCurrent))dlsym(h, "cuCtxSetCurrent");
	__typeof__(&cuMemAlloc_v2) alloc = (__typeof__(&cuMemAlloc_v2))dlsym(h, "cuMemAlloc_v2");
	CUresult r = CUDA_ERROR_NOT_FOUND;
	CUcontext c;
	CUdeviceptr p;
	if (init && retain && set && alloc && (r = init(0)) == CUDA_SUCCESS && (r = retain(&c, 0)) == CUDA_SUCCESS &&
	    (r = set(c)) == CUDA_SUCCESS)
		r = alloc(&p, bytes);
	A.ctxSetCurrent(g_ctx);
	printf("dlmopen %d 1\n", r);
}

static int kind_of(const char *s)
{
	for (int k = 0; k < K_N; k++)
		if (strcmp(s, kinds[k]) == 0)
			return k;
	return -1;
}

static CUresult do_alloc(int kind, uint64_t bytes)
{
	uint64_t h = 0;
	CUresult r;
	switch (kind) {
	case K_LINEAR:
		r = A.memAlloc((CUdeviceptr *)&h, bytes);
		break;
	case K_PITCH: {
		size_t pitch;
		r = A.memAllocPitch((CUdeviceptr *)&h, &pitch, bytes / 64, 64, 4);
		break;
	}
	case K_MANAGED:
		r = A.memAllocManaged((CUdeviceptr *)&h, bytes, 1);
		break;
	case K_ASYNC:
		r = A.memAllocAsync((CUdeviceptr *)&h, bytes, g_stream);
		break;
	case K_POOL:
		r = A.memAllocFromPoolAsync((CUdeviceptr *)&h, bytes, g_pool, g_stream);
		break;
	case K_VMM: {
		CUmemAllocationProp p = {0};
		p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		p.location.id = 0;
		r = A.memCreate((CUmemGenericAllocationHandle *)&h, (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20),
		                &p, 0);
		break;
	}
	case K_ARRAY: {
		CUDA_ARRAY_DESCRIPTOR d = {bytes / 4, 0, CU_AD_FORMAT_FLOAT, 1};
		r = A.arrayCreate((CUarray *)&h, &d);
		break;
	}
	case K_ARRAY3D: {
		CUDA_ARRAY3D_DESCRIPTOR d = {bytes / 4 / 16 / 16, 16, 16, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
		r = A.array3DCreate((CUarray *)&h, &d);
		break;
	}
	case K_MIPMAP: {
		/* Two levels, 64w + 16w bytes: bytes is the total. */
		CUDA_ARRAY3D_DESCRIPTOR d = {bytes / 80, 16, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
		r = A.mipmapCreate((CUmipmappedArray *)&h, &d, 2);
		break;
	}
	case K_GRAPH: {
		CUgraph g;
		CUgraphNode node;
		r = A.graphCreate(&g, 0);
		if (r != CUDA_SUCCESS)
			return r;
		CUDA_MEM_ALLOC_NODE_PARAMS p;
		memset(&p, 0, sizeof(p));
		p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		p.poolProps.location.id = 0;
		p.bytesize = bytes;
		r = A.graphAddMemAllocNode(&node, g, NULL, 0, &p);
		if (r != CUDA_SUCCESS)
			return r;
		CUgraphExec e;
		r = A.graphInstantiate(&e, g, 0);
		if (r == CUDA_SUCCESS)
			r = A.graphLaunch(e, g_stream);
		return r; /* graph memory stays with the graph; not freed by this program */
	}
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (r == CUDA_SUCCESS && nlive < MAX_LIVE)
		live[nlive++] = (struct live){kind, h};
	return r;
}

static CUresult do_free(void)
{
	if (nlive == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct live l = live[--nlive];
	switch (l.kind) {
	case K_ASYNC:
	case K_POOL:
		return A.memFreeAsync(l.h, g_stream);
	case K_VMM:
		return A.memRelease(l.h);
	case K_ARRAY:
	case K_ARRAY3D:
		return A.arrayDestroy((CUarray)(uintptr_t)l.h);
	case K_MIPMAP:
		return A.mipmapDestroy((CUmipmappedArray)(uintptr_t)l.h);
	default:
		return A.memFree(l.h);
	}
}

static CUresult free_all(void)
{
	CUresult worst = CUDA_SUCCESS;
	while (nlive > 0) {
		CUresult r = do_free();
		if (r != CUDA_SUCCESS)
			worst = r;
	}
	A.streamSynchronize(g_stream);
	return worst;
}

struct filler {
	uint64_t chunk, count;
	pthread_barrier_t *ready;
};

static void *fill_thread(void *arg)
{
	struct filler *f = arg;
	CUdeviceptr *ptrs = calloc(4096, sizeof(*ptrs)); /* NULL: allocate nothing, keep the barriers */
	A.ctxSetCurrent(g_ctx);                          /* contexts are current per thread */
	pthread_barrier_wait(f->ready);
	while (ptrs != NULL && f->count < 4096 && A.memAlloc(&ptrs[f->count], f->chunk) == CUDA_SUCCESS)
		f->count++;
	pthread_barrier_wait(f->ready); /* everyone holds its peak */
	pthread_barrier_wait(f->ready); /* main has looked */
	for (uint64_t i = 0; i < f->count; i++)
		A.memFree(ptrs[i]);
	free(ptrs);
	return NULL;
}

static CUfunction function(const char *name)
{
	static CUmodule mod;
	CUfunction f = NULL;
	if (mod == NULL && A.moduleLoad(&mod, "stub-image") != CUDA_SUCCESS)
		return NULL;
	if (A.getFunction(&f, mod, name) != CUDA_SUCCESS)
		return NULL;
	return f;
}

static CUresult launch_one(const char *kind, CUfunction f, unsigned grid)
{
	if (strcmp(kind, "ex") == 0) {
		CUlaunchConfig c = {grid, 1, 1, 128, 1, 1, 0, g_stream, NULL, 0};
		return A.launchKernelEx(&c, f, NULL, NULL);
	}
	if (strcmp(kind, "coop") == 0)
		return A.launchCoop(f, grid, 1, 1, 128, 1, 1, 0, g_stream, NULL);
	if (strcmp(kind, "graph") == 0) {
		static CUgraphExec exec;
		static CUfunction exec_f;
		if (exec == NULL || exec_f != f) {
			CUgraph g;
			CUgraphNode n;
			CUDA_KERNEL_NODE_PARAMS_v2 p;
			memset(&p, 0, sizeof(p));
			p.func = f;
			p.gridDimX = grid;
			p.gridDimY = p.gridDimZ = 1;
			p.blockDimX = 128;
			p.blockDimY = p.blockDimZ = 1;
			CUresult r = A.graphCreate(&g, 0);
			if (r == CUDA_SUCCESS)
				r = A.graphAddKernelNode(&n, g, NULL, 0, &p);
			if (r == CUDA_SUCCESS)
				r = A.graphInstantiate(&exec, g, 0);
			if (r != CUDA_SUCCESS)
				return r;
			exec_f = f;
		}
		return A.graphLaunch(exec, g_stream);
	}
	return A.launchKernel(f, grid, 1, 1, 128, 1, 1, 0, g_stream, NULL, NULL);
}

static int run(char **argv, int argc)
{
	const char *cmd = argv[0];
#define ARG(i) (argc > (i) ? strtoull(argv[i], NULL, 0) : 0)
	if (strcmp(cmd, "alloc") == 0 && argc >= 3) {
		int k = kind_of(argv[1]);
		CUresult r = k < 0 ? CUDA_ERROR_INVALID_VALUE : do_alloc(k, ARG(2));
		printf("alloc %d\n", r);
	} else if (strcmp(cmd, "free") == 0) {
		printf("free %d\n", do_free());
	} else if (strcmp(cmd, "freeall") == 0) {
		printf("freeall %d\n", free_all());
	} else if (strcmp(cmd, "fill") == 0 && argc >= 3) {
		int k = kind_of(argv[1]);
		uint64_t n = 0;
		CUresult r = CUDA_ERROR_INVALID_VALUE;
		while (k >= 0 && (r = do_alloc(k, ARG(2))) == CUDA_SUCCESS)
			n++;
		printf("fill %d %llu %llu\n", r, (unsigned long long)n, (unsigned long long)(n * ARG(2)));
	} else if (strcmp(cmd, "churn") == 0 && argc >= 3) {
		uint64_t ok = 0;
		for (uint64_t i = 0; i < ARG(1); i++) {
			CUdeviceptr p;
			if (A.memAlloc(&p, ARG(2)) == CUDA_SUCCESS) {
				ok++;
				A.memFree(p);
			}
		}
		printf("churn 0 %llu\n", (unsigned long long)ok);
	} else if (strcmp(cmd, "asyncloop") == 0 && argc >= 3) {
		CUresult worst = CUDA_SUCCESS;
		for (uint64_t i = 0; i < ARG(1); i++) {
			CUdeviceptr p;
			CUresult r = A.memAllocAsync(&p, ARG(2), g_stream);
			if (r == CUDA_SUCCESS)
				r = A.memFreeAsync(p, g_stream);
			if (r != CUDA_SUCCESS)
				worst = r;
			if (i % 100 == 99)
				A.streamSynchronize(g_stream);
		}
		A.streamSynchronize(g_stream);
		printf("asyncloop %d\n", worst);
	} else if (strcmp(cmd, "freeunknown") == 0) {
		printf("freeunknown %d\n", A.memFree(0x1234567000ull));
	} else if (strcmp(cmd, "meminfo") == 0) {
		size_t f = 0, t = 0;
		CUresult r = A.memGetInfo(&f, &t);
		printf("meminfo %d %zu %zu\n", r, f, t);
	} else if (strcmp(cmd, "totalmem") == 0) {
		size_t t = 0;
		CUresult r = A.totalMem(&t, 0);
		printf("totalmem %d %zu\n", r, t);
	} else if (strcmp(cmd, "nvmlmem") == 0) {
		nvmlDevice_t d;
		nvmlMemory_t m = {0};
		nvmlMemory_v2_t m2 = {0};
		m2.version = nvmlMemory_v2;
		nvmlReturn_t r = nvmlInit_v2();
		if (r == NVML_SUCCESS)
			r = nvmlDeviceGetHandleByIndex_v2(0, &d);
		if (r == NVML_SUCCESS)
			r = nvmlDeviceGetMemoryInfo(d, &m);
		if (r == NVML_SUCCESS)
			r = nvmlDeviceGetMemoryInfo_v2(d, &m2);
		printf("nvmlmem %d %llu %llu %llu %llu %llu %llu\n", r, m.total, m.used, m.free, m2.total, m2.used,
		       m2.free);
	} else if ((strcmp(cmd, "waitalloc") == 0 || strcmp(cmd, "waitoom") == 0) && argc >= 3) {
		int want_ok = strcmp(cmd, "waitalloc") == 0;
		uint64_t t0 = now_us(), deadline = t0 + ARG(2) * 1000;
		CUresult r;
		for (;;) {
			CUdeviceptr p;
			r = A.memAlloc(&p, ARG(1));
			if (r == CUDA_SUCCESS)
				A.memFree(p);
			if ((r == CUDA_SUCCESS) == want_ok || now_us() > deadline)
				break;
			struct timespec ts = {0, 200000};
			nanosleep(&ts, NULL);
		}
		printf("%s %d %llu\n", cmd, r, (unsigned long long)(now_us() - t0));
	} else if (strcmp(cmd, "launch") == 0 && argc >= 5) {
		CUfunction f = function(argv[2]);
		CUresult r = f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
		for (uint64_t i = 0; r == CUDA_SUCCESS && i < ARG(4); i++)
			r = launch_one(argv[1], f, (unsigned)ARG(3));
		if (r == CUDA_SUCCESS)
			r = A.ctxSynchronize();
		printf("launch %d\n", r);
	} else if (strcmp(cmd, "saturate") == 0 && argc >= 4) {
		CUfunction f = function(argv[1]);
		CUresult r = f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
		uint64_t end = now_us() + ARG(3) * 1000, n = 0;
		while (r == CUDA_SUCCESS && now_us() < end) {
			r = A.launchKernel(f, (unsigned)ARG(2), 1, 1, 128, 1, 1, 0, g_stream, NULL, NULL);
			n++;
		}
		printf("saturate %d %llu\n", r, (unsigned long long)n);
	} else if (strcmp(cmd, "loop") == 0 && argc >= 2) {
		/* "looping" once the first allocation holds memory: the process is in its loop. */
		CUresult first = do_alloc(K_LINEAR, ARG(1));
		printf("looping %d\n", first);
		fflush(stdout);
		for (;;) {
			while (do_alloc(K_LINEAR, ARG(1)) == CUDA_SUCCESS) {
			}
			free_all();
		}
	} else if (strcmp(cmd, "threads") == 0 && argc >= 3) {
		int n = (int)ARG(1);
		if (n < 1 || n > 64)
			n = 1;
		pthread_t th[64];
		struct filler f[64];
		pthread_barrier_t ready;
		pthread_barrier_init(&ready, NULL, (unsigned)n + 1);
		for (int k = 0; k < n; k++) {
			f[k] = (struct filler){ARG(2), 0, &ready};
			pthread_create(&th[k], NULL, fill_thread, &f[k]);
		}
		pthread_barrier_wait(&ready); /* start */
		pthread_barrier_wait(&ready); /* peak */
		uint64_t total = 0;
		for (int k = 0; k < n; k++)
			total += f[k].count;
		size_t fr = 0, tot = 0;
		A.memGetInfo(&fr, &tot);
		pthread_barrier_wait(&ready); /* free */
		for (int k = 0; k < n; k++)
			pthread_join(th[k], NULL);
		pthread_barrier_destroy(&ready);
		printf("threads 0 %llu %zu\n", (unsigned long long)total, fr);
	} else if (strcmp(cmd, "fork") == 0 && argc >= 2) {
		fflush(stdout);
		pid_t child = fork();
		if (child == 0) {
			CUdeviceptr p;
			CUresult r = A.memAlloc(&p, ARG(1));
			_exit(r);
		}
		int status = 0;
		waitpid(child, &status, 0);
		printf("fork 0 %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 255);
	} else if (strcmp(cmd, "reset") == 0) {
		CUresult r = A.ctxReset(0);
		if (r == CUDA_SUCCESS)
			nlive = 0; /* the driver freed them */
		printf("reset %d\n", r);
	} else if (strcmp(cmd, "ctxcycle") == 0 && argc >= 2) {
		CUcontext c;
		CUdeviceptr p;
		CUresult r = A.ctxCreate(&c, 0, 0);
		CUresult ra = r == CUDA_SUCCESS ? A.memAlloc(&p, ARG(1)) : r;
		if (r == CUDA_SUCCESS)
			r = A.ctxDestroy(c);
		A.ctxSetCurrent(g_ctx);
		printf("ctxcycle %d %d\n", r, ra);
	} else if (strcmp(cmd, "dlcheck") == 0) {
		void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
		Dl_info a, b;
		void *hooked = lib ? dlsym(lib, "cuMemAlloc_v2") : NULL;
		void *plain = lib ? dlsym(lib, "cuDeviceGet") : NULL;
		int hook_ok = hooked && dladdr(hooked, &a) && strstr(a.dli_fname, "libgpulimit") != NULL;
		int plain_ok = plain && dladdr(plain, &b) && strstr(b.dli_fname, "libcuda") != NULL;
		void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
		int next_ok = libc && dlsym(RTLD_NEXT, "malloc") == dlsym(libc, "malloc");
		int vsym_ok = libc && dlvsym(libc, "malloc", "GLIBC_2.2.5") == dlsym(libc, "malloc");
		printf("dlcheck 0 %d %d %d %d\n", hook_ok, plain_ok, next_ok, vsym_ok);
	} else if (strcmp(cmd, "rawalloc") == 0 && argc >= 2) {
		__typeof__(&cuMemAlloc_v2) raw =
		    (__typeof__(&cuMemAlloc_v2))elf_loaded_symbol("libcuda.so", "cuMemAlloc_v2");
		CUdeviceptr p;
		printf("rawalloc %d\n", raw ? raw(&p, ARG(1)) : CUDA_ERROR_NOT_FOUND);
	} else if (strcmp(cmd, "legacy") == 0 && argc >= 2) {
		void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
		__typeof__(&cuMemAlloc) v1 = lib ? (__typeof__(&cuMemAlloc))dlsym(lib, "cuMemAlloc") : NULL;
		CUdeviceptr_v1 p;
		printf("legacy %d\n", v1 ? v1(&p, (unsigned int)ARG(1)) : CUDA_ERROR_NOT_FOUND);
	} else if (strcmp(cmd, "legacyproc") == 0 && argc >= 2) {
		void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
		__typeof__(&cuGetProcAddress_v2) gpa =
		    lib ? (__typeof__(&cuGetProcAddress_v2))dlsym(lib, "cuGetProcAddress_v2") : NULL;
		void *p = NULL;
		CUresult r = gpa ? gpa("cuMemAlloc", &p, 3000, 0, NULL) : CUDA_ERROR_NOT_FOUND;
		__typeof__(&cuMemAlloc) v1 = NULL;
		memcpy(&v1, &p, sizeof(p));
		CUdeviceptr_v1 d;
		printf("legacyproc %d\n", r == CUDA_SUCCESS && v1 ? v1(&d, (unsigned int)ARG(1)) : r);
	} else if (strcmp(cmd, "dlmopen") == 0 && argc >= 3) {
		dlmopen_alloc(argv[1], ARG(2));
	} else if (strcmp(cmd, "deepbind") == 0 && argc >= 3) {
		void *lib = dlopen(argv[1], RTLD_NOW | RTLD_DEEPBIND);
		CUresult (*f)(uint64_t) = NULL;
		void *sym = lib ? dlsym(lib, "usescuda_alloc") : NULL;
		memcpy(&f, &sym, sizeof(sym));
		printf("deepbind %d\n", f ? f(ARG(2)) : CUDA_ERROR_NOT_FOUND);
	} else if (strcmp(cmd, "nextalloc") == 0 && argc >= 3) {
		void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
		CUresult (*f)(uint64_t) = NULL;
		void *sym = lib ? dlsym(lib, "usescuda_next") : NULL;
		memcpy(&f, &sym, sizeof(sym));
		printf("nextalloc %d\n", f ? f(ARG(2)) : CUDA_ERROR_NOT_FOUND);
	} else if (strcmp(cmd, "runpath") == 0) {
		void *lib = dlopen("libgpulimit-runpath-probe.so", RTLD_NOW | RTLD_LOCAL);
		printf("runpath 0 %d\n", lib != NULL);
	} else if (strcmp(cmd, "sync") == 0) {
		printf("sync %d\n", A.ctxSynchronize());
	} else {
		printf("%s %d unknown-command\n", cmd, CUDA_ERROR_INVALID_VALUE);
	}
#undef ARG
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	int procaddr = 0, interactive = 0, i = 1;
	const char *path = NULL;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "-p") == 0)
			procaddr = 1;
		else if (strcmp(argv[i], "-P") == 0)
			procaddr = 2;
		else if (strcmp(argv[i], "-1") == 0)
			procaddr = 3;
		else if (strcmp(argv[i], "-V") == 0 && i + 1 < argc)
			g_cuda_version = atoi(argv[++i]);
		else if (strcmp(argv[i], "-a") == 0 && i + 1 < argc)
			path = argv[++i];
		else if (strcmp(argv[i], "-i") == 0)
			interactive = 1;
	}
	int bad;
	if (path != NULL)
		bad = fill_dlsym(path);
	else if (procaddr)
		bad = fill_procaddr(procaddr == 2 ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, procaddr == 3);
	else
		bad = (fill_direct(), 0);
	if (bad) {
		printf("setup %d\n", CUDA_ERROR_NOT_FOUND);
		return 1;
	}
	CUdevice dev;
	CUcontext ctx = NULL;
	CUresult r = A.init(0);
	if (r == CUDA_SUCCESS)
		r = A.deviceGet(&dev, 0);
	if (r == CUDA_SUCCESS)
		r = A.ctxRetain(&ctx, dev);
	if (r == CUDA_SUCCESS)
		r = A.ctxSetCurrent(ctx);
	g_ctx = ctx;
	if (r == CUDA_SUCCESS) {
		CUmemPoolProps pp;
		memset(&pp, 0, sizeof(pp));
		pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		pp.location.id = 0;
		r = A.poolCreate(&g_pool, &pp);
	}
	if (r != CUDA_SUCCESS) {
		printf("setup %d\n", r);
		fflush(stdout);
		if (!interactive)
			return 1;
	}
	/* Commands: argv words split at "," so one invocation can run several. */
	char *words[16];
	int n = 0;
	for (; i <= argc; i++) {
		if (i == argc || strcmp(argv[i], ",") == 0) {
			if (n > 0)
				run(words, n);
			n = 0;
			continue;
		}
		if (n < 16)
			words[n++] = argv[i];
	}
	if (interactive) {
		char line[512];
		while (fgets(line, sizeof(line), stdin) != NULL) {
			n = 0;
			for (char *tok = strtok(line, " \t\r\n"); tok && n < 16; tok = strtok(NULL, " \t\r\n"))
				words[n++] = tok;
			if (n > 0)
				run(words, n);
		}
	}
	return 0;
}
