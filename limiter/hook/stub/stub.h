/*
 * stub.h: the simulated device shared by the stub libcuda.so.1 and
 * libnvidia-ml.so.1 (test-only). One device lives in one shared-memory file
 * (GPUBROKER_STUB_STATE); every process that loads either library maps it, so
 * memory, SM time and per-process figures are shared machine-wide, the way a
 * real GPU is.
 *
 * Model:
 *   - Memory: a byte budget (GPUBROKER_STUB_MEMORY_MIB). Every allocation is
 *     recorded with its owner pid; when an owner dies, its allocations are
 *     released, as the real driver does at context teardown.
 *   - Compute: sm_count SMs. A kernel of B blocks whose function runs
 *     block_ns per block is W = B * block_ns SM-nanoseconds of work. The device
 *     drains work at sm_count SM-ns per ns (a fluid, work-conserving model);
 *     a kernel takes at least ceil(B / sm_count) waves of block_ns, and kernels
 *     on one stream run in order. Launches block while the device backlog is
 *     more than queue_ns ahead of now, like a full launch queue.
 *   - Utilization: SM-ns are charged to the launching process at launch. Each
 *     process keeps a ring of STUB_SAMPLES samples (a cumulative SM-ns reading
 *     with its time), one taken lazily at most every sample_ns when NVML is
 *     asked. nvmlDeviceGetProcessUtilization(lastSeen) answers one entry per
 *     process: its use over the samples newer than lastSeen, as NVML's header
 *     documents (lastSeenTimeStamp 0 = every sample in the driver's buffer),
 *     so callers polling at different rates each see their own window.
 */
#ifndef GPUBROKER_STUB_H
#define GPUBROKER_STUB_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#define STUB_EXPORT __attribute__((visibility("default")))

#define STUB_MAGIC      0x42555453u /* "STUB" */
#define STUB_VERSION    7u
#define STUB_MAX_PROCS  64
#define STUB_MAX_ALLOCS 16384
#define STUB_MAX_POOLS  256
#define STUB_SAMPLES    128 /* per process; 6.4 s at the default 50 ms sample window */
#define STUB_POOL_CHUNK (2ull << 20) /* pools and VMM reserve in 2 MiB granules */

enum stub_kind {
	STUB_KIND_FREE = 0,
	STUB_KIND_LINEAR = 1,  /* cuMemAlloc, cuMemAllocPitch */
	STUB_KIND_MANAGED = 2, /* cuMemAllocManaged */
	STUB_KIND_POOL = 3,    /* stream-ordered, from a pool; size counts in the pool, not the device */
	STUB_KIND_VMM = 4,     /* cuMemCreate */
	STUB_KIND_ARRAY = 5,   /* cuArrayCreate, cuArray3DCreate */
	STUB_KIND_MIPMAP = 6,  /* cuMipmappedArrayCreate */
	STUB_KIND_GRAPH = 7    /* graph memory nodes */
};

/* stub_sample is one NVML utilization sample: a process's cumulative SM-ns at a time. */
struct stub_sample {
	uint64_t ts_us;   /* CLOCK_REALTIME, microseconds (NVML's timeStamp) */
	uint64_t mono_ns; /* CLOCK_MONOTONIC */
	uint64_t sm_ns;   /* the process's sm_ns_total then */
};

struct stub_proc {
	uint32_t pid; /* 0 = free */
	uint32_t pad;
	uint64_t start_time;  /* clock ticks after boot */
	uint64_t mem_bytes;   /* device memory held, bytes */
	uint64_t sm_ns_total; /* SM-ns of work launched */
	uint64_t launches;
	uint32_t samples_next;  /* ring index the next sample goes to */
	uint32_t samples_count; /* samples held, at most STUB_SAMPLES */
	uint64_t graph_reserved; /* graph memory reserved for this process, bytes */
	uint64_t last_return_ns; /* CLOCK_MONOTONIC when its last launch returned; 0 = none yet */
	uint64_t stall_ns_total; /* launch gaps beyond the device's stall_ns, summed (see launch) */
	struct stub_sample samples[STUB_SAMPLES]; /* ring, oldest first from samples_next - samples_count */
};

struct stub_alloc {
	uint64_t handle; /* device address, array handle or VMM handle */
	uint64_t size;   /* bytes charged */
	uint32_t pid;
	uint16_t kind; /* enum stub_kind */
	uint16_t pool; /* pool index + 1 for STUB_KIND_POOL */
};

struct stub_pool {
	uint32_t pid; /* owner; 0 = free */
	uint32_t is_default;
	uint64_t reserved; /* bytes taken from the device */
	uint64_t used;     /* bytes handed out */
	uint64_t release_threshold;
	uint64_t reserved_high, used_high;
};

struct stub_device {
	uint32_t magic, version;
	pthread_mutex_t lock; /* robust, process-shared */
	uint64_t total_bytes;
	uint64_t used_bytes;
	uint32_t sm_count;
	uint32_t max_threads_per_sm;
	uint8_t uuid[16];
	char name[96];
	uint64_t queue_ns;  /* launch queue horizon */
	uint64_t sample_ns; /* minimum NVML sample window */
	uint64_t next_handle;
	uint32_t alloc_hint; /* where the search for a free allocation record starts */
	uint64_t last_reap_ns;
	uint32_t nvml_pid_offset; /* added to pids NVML reports, to mimic a pid namespace */
	uint32_t pad4;
	uint32_t pad3;
	uint64_t stall_ns; /* a gap between a process's launches longer than this is a stall */
	uint64_t backlog_end_ns; /* CLOCK_MONOTONIC when queued work would finish at full occupancy */
	uint64_t sm_ns_total;    /* device-wide SM-ns launched */
	uint64_t dev_sample_prev_sm_ns, dev_sample_prev_ns;
	uint32_t dev_sample_permille, pad;
	/* Counters for tests (monotonic). */
	uint64_t c_alloc, c_free, c_free_unknown, c_oom, c_launch, c_reaped, c_trim;
	struct stub_proc procs[STUB_MAX_PROCS];
	struct stub_pool pools[STUB_MAX_POOLS];
	struct stub_alloc allocs[STUB_MAX_ALLOCS];
};

/* stub_dev maps the device (creating it if needed); NULL on failure, with a message on stderr. */
struct stub_device *stub_dev(void);
/* stub_dev_refresh re-reads GPUBROKER_STUB_STATE and maps that device if it is another one (nvmlInit). */
struct stub_device *stub_dev_refresh(void);
/* stub_lock takes the device lock, recovering it from a dead owner. */
void stub_lock(struct stub_device *d);
void stub_unlock(struct stub_device *d);
/* stub_self returns this process's slot (registering it; lock held). NULL if the table is full. */
struct stub_proc *stub_self_locked(struct stub_device *d);
/* stub_self_cached returns this process's slot without locking, or NULL before registration. */
struct stub_proc *stub_self_cached(struct stub_device *d);
/* stub_reap_locked releases everything of processes that have died. */
void stub_reap_locked(struct stub_device *d);
/* stub_release_proc_locked frees every allocation and pool of pid (not its graph memory). */
void stub_release_proc_locked(struct stub_device *d, uint32_t pid);
/* stub_reap_soon_locked does the same at most every millisecond (allocation paths). */
void stub_reap_soon_locked(struct stub_device *d);
uint64_t stub_now_ns(void);
uint64_t stub_realtime_us(void);
/* stub_sample_locked takes new NVML samples where a window has passed. */
void stub_sample_locked(struct stub_device *d, uint64_t now);
/*
 * stub_proc_util_locked gives p's SM use in per mille of the device over its
 * samples newer than last_seen_us (all held if 0 or older than the ring) and
 * the newest sample's time; 0 when no sample is newer than last_seen_us or
 * the window is empty.
 */
int stub_proc_util_locked(const struct stub_device *d, const struct stub_proc *p, uint64_t last_seen_us,
                          uint32_t *permille, uint64_t *ts_us);
/* stub_proc_alive reports whether pid is alive, not a zombie, and started at start_time. */
int stub_proc_alive(uint32_t pid, uint64_t start_time);
uint64_t stub_proc_start_time(pid_t pid);
void stub_format_uuid(const uint8_t uuid[16], char *out, size_t n);

#endif
