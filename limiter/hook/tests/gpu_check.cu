// gpu_check.cu: the real-GPU checks of libgpulimit, driven by ../gpu-check.sh.
// Build: nvcc -O2 -o gpu_check gpu_check.cu   (CUDA 12.x, sm_90 for H100/H200)
//
//   gpu_check mem LIMIT_MIB          cap checks: cudaMemGetInfo, cudaMalloc, cudaMallocAsync, cudaMalloc3DArray
//   gpu_check spin SECONDS BLOCK_US  saturating launches of one-wave spin kernels; prints kernels/s
//   gpu_check launch N               N empty launches; prints host ns per launch
//
// Every line it prints starts with the mode; "FAIL" marks a violated check and
// makes the exit status 1.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <vector>

#include <cuda_runtime.h>

static int failures = 0;

#define CHECK(cond, ...)                                                                                   \
	do {                                                                                               \
		if (!(cond)) {                                                                             \
			failures++;                                                                        \
			printf("FAIL ");                                                                   \
		} else {                                                                                   \
			printf("ok   ");                                                                   \
		}                                                                                          \
		printf(__VA_ARGS__);                                                                       \
		printf("\n");                                                                              \
	} while (0)

static double now_s()
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__global__ void spin(long long cycles)
{
	long long t0 = clock64();
	while (clock64() - t0 < cycles) {
	}
}

__global__ void empty() {}

static int mem(size_t limit_mib)
{
	const size_t limit = limit_mib << 20, chunk = 64ull << 20;
	size_t free_b = 0, total_b = 0;
	cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
	CHECK(e == cudaSuccess && total_b == limit, "mem cudaMemGetInfo total=%zu free=%zu (slice %zu)", total_b, free_b,
	      limit);

	// cudaMalloc until refused.
	std::vector<void *> ptrs;
	void *p = nullptr;
	while ((e = cudaMalloc(&p, chunk)) == cudaSuccess)
		ptrs.push_back(p);
	size_t got = ptrs.size() * chunk;
	CHECK(e == cudaErrorMemoryAllocation && got <= limit && got + 2 * chunk > limit,
	      "mem cudaMalloc got %zu MiB of %zu, refused with %s", got >> 20, limit_mib, cudaGetErrorName(e));
	cudaGetLastError();
	for (void *q : ptrs)
		cudaFree(q);
	ptrs.clear();

	// cudaMallocAsync until refused; the pool's reservation is what counts.
	cudaStream_t s;
	cudaStreamCreate(&s);
	while ((e = cudaMallocAsync(&p, chunk, s)) == cudaSuccess)
		ptrs.push_back(p);
	got = ptrs.size() * chunk;
	CHECK(e == cudaErrorMemoryAllocation && got <= limit, "mem cudaMallocAsync got %zu MiB of %zu, refused with %s",
	      got >> 20, limit_mib, cudaGetErrorName(e));
	cudaGetLastError();
	for (void *q : ptrs)
		cudaFreeAsync(q, s);
	cudaStreamSynchronize(s);
	ptrs.clear();
	for (int i = 0; i < 1000; i++) {
		if (cudaMallocAsync(&p, chunk, s) == cudaSuccess)
			cudaFreeAsync(p, s);
	}
	cudaStreamSynchronize(s);
	cudaMemPool_t pool;
	cudaDeviceGetDefaultMemPool(&pool, 0);
	cudaMemPoolTrimTo(pool, 0);
	cudaMemGetInfo(&free_b, &total_b);
	CHECK(free_b + chunk >= limit, "mem 1000 cudaMallocAsync/cudaFreeAsync cycles then trim: free %zu MiB of %zu",
	      free_b >> 20, limit_mib);

	// cudaMalloc3DArray until refused (256 MiB each).
	std::vector<cudaArray_t> arrays;
	cudaChannelFormatDesc fmt = cudaCreateChannelDesc<float>();
	cudaExtent ext = make_cudaExtent(1024, 1024, 64);
	cudaArray_t a;
	while ((e = cudaMalloc3DArray(&a, &fmt, ext)) == cudaSuccess)
		arrays.push_back(a);
	got = arrays.size() * (256ull << 20);
	CHECK(e == cudaErrorMemoryAllocation && got <= limit, "mem cudaMalloc3DArray got %zu MiB of %zu, refused with %s",
	      got >> 20, limit_mib, cudaGetErrorName(e));
	cudaGetLastError();
	for (cudaArray_t q : arrays)
		cudaFreeArray(q);
	return failures ? 1 : 0;
}

static int spin_mode(double seconds, double block_us)
{
	cudaDeviceProp prop;
	cudaGetDeviceProperties(&prop, 0);
	int clock_khz = 0;
	cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
	long long cycles = (long long)(block_us * clock_khz / 1000.0);
	cudaStream_t s;
	cudaStreamCreate(&s);
	// Warm up one second (the pacer converges), then count.
	double t_end = now_s() + 1.0;
	while (now_s() < t_end)
		spin<<<prop.multiProcessorCount, 128, 0, s>>>(cycles);
	cudaStreamSynchronize(s);
	long long n = 0;
	double t0 = now_s();
	t_end = t0 + seconds;
	while (now_s() < t_end) {
		spin<<<prop.multiProcessorCount, 128, 0, s>>>(cycles);
		n++;
	}
	cudaStreamSynchronize(s);
	double dt = now_s() - t0;
	printf("spin kernels_per_s=%.1f sms=%d block_us=%.0f\n", n / dt, prop.multiProcessorCount, block_us);
	return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

static int launch_mode(long long n)
{
	cudaStream_t s;
	cudaStreamCreate(&s);
	for (int i = 0; i < 10000; i++)
		empty<<<1, 32, 0, s>>>();
	cudaStreamSynchronize(s);
	double best = 1e30;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_s();
		for (long long i = 0; i < n; i++)
			empty<<<1, 32, 0, s>>>();
		double dt = now_s() - t0;
		cudaStreamSynchronize(s);
		if (dt < best)
			best = dt;
	}
	printf("launch ns_per_launch=%.1f\n", best * 1e9 / n);
	return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && strcmp(argv[1], "mem") == 0)
		return mem(strtoull(argv[2], nullptr, 10));
	if (argc >= 4 && strcmp(argv[1], "spin") == 0)
		return spin_mode(atof(argv[2]), atof(argv[3]));
	if (argc >= 3 && strcmp(argv[1], "launch") == 0)
		return launch_mode(atoll(argv[2]));
	fprintf(stderr, "usage: gpu_check mem LIMIT_MIB | spin SECONDS BLOCK_US | launch N\n");
	return 2;
}
