/*
 * gpulimit_region.h: the ABI of the two per-slice files that the in-pod hook
 * (libgpulimit.so) and the node agent share. It is the single source of truth;
 * the Go mirror in limiter/region is tested against it (layout_test.go), so a
 * change here without a change there fails the build.
 *
 * Both files are little-endian, naturally aligned, with no implicit padding.
 *
 * Where they are (ARCHITECTURE.md "Pod contract"): at the fixed paths below,
 * inside the pod. Nothing a notebook user controls (environment, argv,
 * writable files) chooses another path or adds a limit: the hook reads these
 * two files and nothing else. Both are opened with O_NONBLOCK | O_NOFOLLOW |
 * O_CLOEXEC and used only when fstat(2) shows a regular file of exactly the
 * size below; a FIFO, socket, device, directory, symbolic link or a file of
 * another size is refused (the hook fails closed) and never blocks or
 * redirects anyone.
 *
 * Quota region (quota.bin, ARCHITECTURE.md "Quota region"): written only by
 * the node agent, by writing a temporary file and rename(2)-ing it over the
 * old one, each time with a higher generation; the agent writes the first one
 * from the pod's annotations as soon as it sees the pod, before the container
 * normally starts. The pod mounts its directory read-only, and the hook uses
 * a quota file only if it lies on a read-only mount (fstatvfs ST_RDONLY), so
 * a file the tenant made in a writable place is never taken for it. The hook
 * never writes it; it re-reads the file when the name starts to point at a
 * different file (see src/state.c). A file is valid when its size is exactly
 * sizeof(struct gpulimit_quota), magic and layout_version match, checksum
 * matches, generation >= 1, compute_percent is 1..100, compute_limit_percent
 * is compute_percent..100 and slice_id is NUL-terminated.
 *
 * Usage region (usage.bin, ARCHITECTURE.md "Usage region"): created by the
 * node agent with its header initialized (magic, layout_version, slot_count,
 * device_count) and mode 0666 in a directory only root can write (0755), so a
 * notebook user who is not root can write the region's bytes but cannot
 * delete, rename or replace the file. It is mapped shared and read-write by
 * every hooked process of the slice and read by the agent. A region whose
 * header is not initialized or not of this layout is refused. It is advisory:
 * the agent's NVML view is the authority (ARCHITECTURE.md invariant 3).
 * There is no lock: each process owns one slot, claimed with a compare-and-swap
 * of pid from 0 (free) or from a dead owner's pid to its own pid; only the
 * owner writes its slot. A slot whose pid no longer exists (kill(pid, 0) fails
 * with ESRCH) or whose start_time differs from the live process's start time
 * (pid reuse) is dead: readers ignore it and claimers may take it. A process
 * killed at any instruction therefore leaves nothing held.
 */
#ifndef GPUBROKER_GPULIMIT_REGION_H
#define GPUBROKER_GPULIMIT_REGION_H

#include <stddef.h>
#include <stdint.h>

#define GPULIMIT_QUOTA_MAGIC    0x51425047u /* bytes "GPBQ" */
#define GPULIMIT_USAGE_MAGIC    0x55425047u /* bytes "GPBU" */
#define GPULIMIT_LAYOUT_VERSION 1u

#define GPULIMIT_SLICE_ID_LEN  64 /* bytes, including the terminating NUL */
#define GPULIMIT_UUID_BYTES    16 /* binary device UUID, as cuDeviceGetUuid returns it */
#define GPULIMIT_USAGE_SLOTS   64 /* processes per slice that are accounted at once */
#define GPULIMIT_USAGE_DEVICES 4  /* devices per process that are accounted */

/* The fixed in-pod paths; equal to broker/api/v1 PodQuotaFile and PodUsageFile (tested). */
#define GPULIMIT_QUOTA_FILE "/var/run/gpubroker/quota/quota.bin"
#define GPULIMIT_USAGE_FILE "/var/run/gpubroker/usage/usage.bin"

/* Quota region: 128 bytes. */
struct gpulimit_quota {
	uint32_t magic;                       /* GPULIMIT_QUOTA_MAGIC */
	uint32_t layout_version;              /* GPULIMIT_LAYOUT_VERSION */
	uint64_t generation;                  /* >= 1; higher wins */
	char slice_id[GPULIMIT_SLICE_ID_LEN]; /* NUL-terminated, NUL-padded */
	uint64_t memory_limit_bytes;          /* device memory cap per device, bytes; 0 refuses every allocation */
	uint32_t compute_percent;             /* guaranteed SM share, 1..100 */
	uint32_t compute_limit_percent;       /* burst ceiling, compute_percent..100 */
	uint8_t gpu_uuid[GPULIMIT_UUID_BYTES]; /* the slice's GPU, binary; all-zero = not stated */
	uint8_t reserved[12];                 /* zero */
	uint32_t checksum;                    /* FNV-1a 32 over bytes [0, offsetof(checksum)) */
};

/* One device's use by one process. */
struct gpulimit_usage_device {
	uint8_t uuid[GPULIMIT_UUID_BYTES]; /* all-zero: entry unused */
	uint64_t bytes_in_use;             /* device memory charged to this process, bytes */
};

/* One process of the slice: 128 bytes. Written only by its owner. */
struct gpulimit_usage_slot {
	uint32_t pid;            /* owner in the writer's pid namespace; 0 = free */
	uint32_t reserved0;      /* zero */
	uint64_t start_time;     /* owner's start time, clock ticks after boot (proc(5) stat field 22) */
	uint64_t last_launch_ns; /* CLOCK_REALTIME of the last kernel launch, ns since the epoch; 0 = none */
	uint64_t launch_count;   /* kernel and graph launches since the slot was claimed */
	struct gpulimit_usage_device devices[GPULIMIT_USAGE_DEVICES];
};

/*
 * Usage region: 256-byte header, then the slots. The pace_* fields are the
 * slice-wide compute pacing state shared by the slice's processes (see
 * src/pace.c); the agent may read them for diagnostics.
 */
struct gpulimit_usage {
	uint32_t magic;          /* GPULIMIT_USAGE_MAGIC once initialized; 0 before */
	uint32_t layout_version; /* GPULIMIT_LAYOUT_VERSION */
	uint32_t slot_count;     /* GPULIMIT_USAGE_SLOTS */
	uint32_t device_count;   /* GPULIMIT_USAGE_DEVICES */

	/*
	 * Written by the node agent, which sees host pids: the slice's measured SM
	 * use. The agent writes the two utilizations, then agent_sample_ns; the
	 * hook reads agent_sample_ns before and after them and ignores the sample
	 * if it changed. The hook prefers a fresh sample (under 500 ms old) to its
	 * own NVML query, whose pids do not match inside a pid namespace.
	 */
	uint64_t agent_sample_ns;            /* CLOCK_REALTIME of the sample, ns since the epoch; 0 = none */
	uint32_t agent_util_permille;        /* the slice's SM use, per mille of the device */
	uint32_t agent_device_util_permille; /* the whole device's SM use, per mille */
	uint8_t reserved0[32];               /* zero */

	/* Token bucket, in 1/1024 thread blocks (Q10 fixed point). */
	int64_t pace_tokens_q10;            /* balance; negative = debt */
	uint64_t pace_refill_ns;            /* CLOCK_MONOTONIC ns of the last refill */
	uint64_t pace_rate_q10_per_ms;      /* refill rate, 1/1024 blocks per millisecond; 0 = not set yet */
	uint64_t pace_blocks_total;         /* thread blocks launched by the slice */
	uint64_t pace_wait_ns_total;        /* time launches of the slice waited for tokens, ns */
	uint64_t pace_next_control_ns;      /* CLOCK_MONOTONIC ns at which the controller runs next */
	uint32_t pace_target_permille;      /* effective SM share target, per mille of the device */
	uint32_t pace_util_permille;        /* last measured SM share of the slice, per mille */
	uint32_t pace_device_util_permille; /* last measured SM use of the whole device, per mille */
	uint32_t pace_sm_count;             /* SMs of the device the controller measured */

	/* Controller memory between runs. */
	uint64_t ctl_blocks_prev;   /* pace_blocks_total at the previous run */
	uint64_t ctl_wait_ns_prev;  /* pace_wait_ns_total at the previous run */
	uint64_t ctl_run_ns_prev;   /* CLOCK_MONOTONIC ns of the previous run */
	uint64_t ctl_nvml_seen_us;  /* newest NVML sample time stamp consumed, microseconds */
	uint64_t ctl_agent_seen_ns; /* newest agent sample consumed (agent_sample_ns) */
	uint8_t reserved1[88];      /* zero */

	struct gpulimit_usage_slot slots[GPULIMIT_USAGE_SLOTS];
};

_Static_assert(sizeof(struct gpulimit_quota) == 128, "quota region is 128 bytes");
_Static_assert(offsetof(struct gpulimit_quota, checksum) == 124, "checksum is the last word");
_Static_assert(offsetof(struct gpulimit_quota, gpu_uuid) == 96, "gpu_uuid took the first reserved bytes");
_Static_assert(sizeof(struct gpulimit_usage_device) == 24, "usage device entry is 24 bytes");
_Static_assert(sizeof(struct gpulimit_usage_slot) == 128, "usage slot is 128 bytes");
_Static_assert(offsetof(struct gpulimit_usage, slots) == 256, "usage header is 256 bytes");
_Static_assert(sizeof(struct gpulimit_usage) == 256 + 128 * GPULIMIT_USAGE_SLOTS, "usage region size");

/*
 * gpulimit_usage_init sets the header of an empty usage region (magic last):
 * what the node agent writes when it creates one (limiter/region CreateUsage
 * writes the same).
 */
static inline void gpulimit_usage_init(struct gpulimit_usage *u)
{
	u->layout_version = GPULIMIT_LAYOUT_VERSION;
	u->slot_count = GPULIMIT_USAGE_SLOTS;
	u->device_count = GPULIMIT_USAGE_DEVICES;
	u->magic = GPULIMIT_USAGE_MAGIC;
}

/* gpulimit_fnv1a32 is the quota checksum: FNV-1a, 32 bits, over n bytes. */
static inline uint32_t gpulimit_fnv1a32(const void *p, size_t n)
{
	const uint8_t *b = (const uint8_t *)p;
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 16777619u;
	}
	return h;
}

#endif /* GPUBROKER_GPULIMIT_REGION_H */
