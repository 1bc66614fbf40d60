/*
 * hook.h: internals shared by the files of libgpulimit. Everything mutable
 * lives in struct hook_state, defined and owned by state.c and reached through
 * hook_state(); every other file keeps only static functions and constants.
 */
#ifndef GPULIMIT_HOOK_H
#define GPULIMIT_HOOK_H

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "cuda_subset.h"
#include "gpulimit_region.h"
#include "nvml_subset.h"
#include "symbols.h"

/* GPULIMIT_EXPORT marks the only symbols libgpulimit exports (built with -fvisibility=hidden). */
#define GPULIMIT_EXPORT __attribute__((visibility("default")))

/* Every hooked symbol is exported, straight from the list. */
#define GPULIMIT_DECLARE_HOOK(lib, name, base, since, ptsz) extern GPULIMIT_EXPORT __typeof__(name) name;
#define GPULIMIT_DECLARE_NONE(lib, name)
GPULIMIT_SYMBOLS(GPULIMIT_DECLARE_HOOK, GPULIMIT_DECLARE_NONE)
#undef GPULIMIT_DECLARE_HOOK
#undef GPULIMIT_DECLARE_NONE

/* struct real_table: the driver's functions, resolved from libcuda.so.1 and libnvidia-ml.so.1. NULL = absent. */
#define GPULIMIT_REAL_HOOK(lib, name, base, since, ptsz) __typeof__(&name) name;
#define GPULIMIT_REAL_CALL(lib, name)                    __typeof__(&name) name;
struct real_table {
	GPULIMIT_SYMBOLS(GPULIMIT_REAL_HOOK, GPULIMIT_REAL_CALL)
};
#undef GPULIMIT_REAL_HOOK
#undef GPULIMIT_REAL_CALL

enum { LIB_CUDA = 0, LIB_NVML = 1 };

/* ---- logging (GPUBROKER_LIMITER_LOG=error|warn|info|debug, default warn) ---- */
enum hook_log_level { HOOK_LOG_ERROR = 0, HOOK_LOG_WARN = 1, HOOK_LOG_INFO = 2, HOOK_LOG_DEBUG = 3 };
void hook_log(enum hook_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- region files (files.c) ---- */

/* REGION_MISSING is region_open's answer when nothing exists at the path. */
#define REGION_MISSING (-2)

/*
 * region_open opens the region file at path (read-write if rw, else
 * read-only) with O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, so nothing at the path
 * can block or redirect the caller, and returns the descriptor only if fstat
 * shows a regular file of exactly size bytes (and, with need_ro, one on a
 * read-only mount). A FIFO, socket or device found by lstat is not even
 * opened. Returns the descriptor and fills *st; REGION_MISSING if the path
 * does not exist; -1 with the reason in why (n bytes) otherwise.
 */
int region_open(const char *path, int rw, size_t size, int need_ro, struct stat *st, char *why, size_t n);
/* file_kind names the type of mode for messages: "a FIFO", "a directory", ... */
const char *file_kind(unsigned int mode);

/* ---- symbol tables of loaded objects (elf.c) ---- */

/*
 * elf_symbol returns the address of the defined, default-version symbol name
 * in the object loaded at base whose dynamic section is dyn, by its GNU or
 * SysV hash table, without calling dlsym; NULL if it has none.
 */
void *elf_symbol(uintptr_t base, const void *dyn, const char *name);
/* elf_needed lists up to max DT_NEEDED names of the object at base (dynamic section dyn); returns the count. */
int elf_needed(uintptr_t base, const void *dyn, const char **out, int max);
/* elf_loaded_symbol is elf_symbol in the first loaded object (any namespace) whose file name starts with prefix. */
void *elf_loaded_symbol(const char *prefix, const char *name);

/* ---- quota ---- */

/* struct quota_values is one parsed quota file. */
struct quota_values {
	uint64_t generation;
	uint64_t memory_limit_bytes;
	uint32_t compute_percent;
	uint32_t compute_limit_percent;
	char slice_id[GPULIMIT_SLICE_ID_LEN];
	uint8_t gpu_uuid[GPULIMIT_UUID_BYTES]; /* all-zero: not stated */
};

/*
 * quota_parse validates a quota region image of n bytes (see
 * gpulimit_region.h for the rules). Returns 0 and fills out, or -1 and sets
 * *why to a static reason. Pure; safe on any input.
 */
int quota_parse(const void *buf, size_t n, struct quota_values *out, const char **why);

/*
 * usage_header_check validates the header of a usage region image of n
 * bytes: size, magic (initialized), layout version, slot and device counts.
 * Returns 0, or -1 and sets *why to a static reason. Pure; safe on any input.
 */
int usage_header_check(const void *buf, size_t n, const char **why);

/* ---- allocation and pool books (process-local) ---- */
enum alloc_kind { AK_LINEAR = 1, AK_MANAGED, AK_POOL, AK_VMM, AK_ARRAY, AK_MIPMAP };

struct alloc_rec {
	uint64_t key; /* device pointer or handle; 0 = empty, 1 = tombstone */
	uint64_t bytes;
	uint32_t kind; /* enum alloc_kind */
	int32_t dev;   /* index into this process's usage slot devices */
	CUmemoryPool pool;
	CUcontext ctx; /* context current at allocation; its end frees the allocation */
};

struct pool_rec {
	CUmemoryPool pool;
	int32_t dev;
	uint64_t charged; /* bytes of the pool's reservation charged to the slice */
};

#define HOOK_MAX_POOLS    64
#define HOOK_MAX_ORDINALS 32

/* struct hook_loader: the C library's loader functions, which the hook interposes (dispatch.c). */
struct hook_loader {
	void *(*dlsym)(void *, const char *);
	void *(*dlvsym)(void *, const char *, const char *);
	void *(*dlopen)(const char *, int);
	void *(*dlmopen)(long, const char *, int);
};

/* struct hook_state: all mutable state of libgpulimit in this process. */
struct hook_state {
	/* configuration, read once (constructor, or the first call that comes earlier) */
	pthread_once_t config_once;
	int log_level;

	/*
	 * The limits in force, read lock-free on hot paths: the quota file's
	 * values, or the fail-closed values (0 bytes, 1 %) while the quota or the
	 * usage region is unusable. Published by state.c only.
	 */
	uint64_t q_generation;
	uint64_t q_memory_limit_bytes;
	uint32_t q_compute_percent;
	uint32_t q_compute_limit_percent;
	int q_fail_closed;         /* the quota is unusable (missing, invalid) */
	struct quota_values q_cur; /* the last valid quota file's values; generation 0 = none yet */
	uint64_t q_poll_next_ns;   /* next time the quota path may be looked at */
	pthread_mutex_t poll_lock;    /* held (trylock) by the one thread polling */
	pthread_mutex_t publish_lock; /* serializes hook_publish: the last publisher saw the last state */
	/* what was at the quota path at the last look: 0 = not looked, 1 = nothing, 2 = the identity below */
	int q_path_state;
	uint64_t q_file_ino, q_file_dev, q_file_size, q_file_mtime_ns, q_file_mode;
	char q_why[320];   /* why the hook fails closed */
	int q_reported;    /* the current fail-closed reason went to stderr */
	int q_waited;      /* the bounded wait for a first quota file is over */
	int driver_seen;   /* the driver was resolved: fail-closed messages go out at once */

	/* loader and driver */
	struct hook_loader loader; /* found once (dispatch.c); complete when loader_ready */
	int loader_ready;
	int legacy_logged; /* the refusal of a legacy entry point went to stderr */
	int real_state;    /* 0 unresolved, 1 resolving, 2 ready; see hook_real */
	struct real_table real;
	void *cuda_lib, *nvml_lib;
	int nvml_inited;

	/* devices: binary UUIDs by ordinal */
	uint8_t ord_uuid[HOOK_MAX_ORDINALS][GPULIMIT_UUID_BYTES];
	int ord_known[HOOK_MAX_ORDINALS];

	/* usage region */
	struct gpulimit_usage *usage; /* the shared region, or a private one once broken; atomic pointer */
	int usage_shared;             /* 1: usage is the slice's region */
	int usage_broken;             /* the region was unusable or tampered with: fail closed for good */
	uint64_t usage_ino, usage_dev;
	char usage_why[320];
	int slot; /* claimed slot, -1 before */
	pid_t slot_pid;
	uint64_t slot_verified[GPULIMIT_USAGE_SLOTS][3]; /* pid, start_time, verified_at_ns */

	/* books */
	pthread_mutex_t books_lock;
	struct alloc_rec *recs;
	size_t recs_cap, recs_used;
	struct pool_rec pools[HOOK_MAX_POOLS];
	uint64_t graph_charged[GPULIMIT_USAGE_DEVICES]; /* graph memory reservation charged per device entry */

	/* pacing (process-local part) */
	nvmlDevice_t pace_nvml_dev;
	uint32_t pace_sm_count;
	int pace_ready; /* 1 = measured device known, -1 = unavailable */
	int pace_invisible_logged;
	pthread_mutex_t pace_lock;
};

/* hook_state returns the process's single state; initialized by the constructor. */
struct hook_state *hook_state(void);
/* hook_real returns the driver table, resolving it on first use (waiting for another thread doing so). Fields may be
 * NULL. */
const struct real_table *hook_real(void);
/* hook_real_nowait is hook_real, except that it returns NULL instead of waiting for another thread's resolution. */
const struct real_table *hook_real_nowait(void);
/* hook_in_init reports whether this thread is resolving the driver (dlsym must not hook then). */
int hook_in_init(void);
/* hook_real_dlsym is the C library's dlsym, bypassing the interposer (dispatch.c). */
void *hook_real_dlsym(void *handle, const char *name);
/* hook_real_dlopen is the C library's dlopen, bypassing the interposer (dispatch.c). */
void *hook_real_dlopen(const char *file, int mode);

/*
 * quota_poll looks at the quota path at most every GPULIMIT_POLL_NS and
 * re-reads the file if it changed; the same pass checks that the usage
 * region is still the one mapped (usage_verify). Cheap otherwise.
 */
void quota_poll(uint64_t now_ns);
#define GPULIMIT_POLL_NS (10ull * 1000 * 1000)
/* GPULIMIT_QUOTA_WAIT_NS bounds the wait for a first quota file at a process's first driver call. */
#define GPULIMIT_QUOTA_WAIT_NS (5ull * 1000 * 1000 * 1000)
/* hook_publish recomputes the limits in force from the quota and the usage region's state. */
void hook_publish(void);

/* time */
uint64_t hook_now_ns(void);    /* CLOCK_MONOTONIC */
uint64_t hook_coarse_ns(void); /* CLOCK_MONOTONIC_COARSE: ~ns cost, few ms resolution */

/* ---- usage region (usage.c) ---- */
/* usage_open maps the slice's usage region, or marks it broken (fail closed) with one message. */
void usage_open(void);
/* usage_verify checks that the path still names the mapped, intact region; called from the quota poll. */
void usage_verify(void);
/* usage_ok reports whether this process accounts in the slice's shared region. */
int usage_ok(void);
/* usage_dev returns this process's device entry index for uuid, claiming the slot and entry if needed; -1 if none. */
int usage_dev(const uint8_t uuid[GPULIMIT_UUID_BYTES]);
/* usage_charge adds bytes to entry dev if the slice's total on that device stays <= limit. 0 = charged, -1 = refused.
 */
int usage_charge(int dev, uint64_t bytes, uint64_t limit);
/* usage_adjust adds delta (may be negative) to entry dev without a limit check. */
void usage_adjust(int dev, int64_t delta);
/* usage_total sums the bytes of every live process of the slice on the device uuid. */
uint64_t usage_total(const uint8_t uuid[GPULIMIT_UUID_BYTES]);
/* usage_dev_uuid copies the uuid of this process's entry dev. */
void usage_dev_uuid(int dev, uint8_t out[GPULIMIT_UUID_BYTES]);
/* usage_note_launch records a launch in this process's slot. */
void usage_note_launch(void);
/* usage_pids lists the pids of the slice's live processes; returns the count (<= max). */
int usage_pids(uint32_t *pids, int max);
/* usage_reset_after_fork forgets the parent's slot in a forked child. */
void usage_reset_after_fork(void);

/* uuid_format writes a binary device UUID in NVML's "GPU-xxxxxxxx-xxxx-..." form (nvml.c). */
void uuid_format(const uint8_t u[GPULIMIT_UUID_BYTES], char *out, size_t n);

/* ---- devices (mem.c) ---- */
/* device_uuid_of returns 0 and the binary UUID of ordinal dev. */
int device_uuid_of(CUdevice dev, uint8_t out[GPULIMIT_UUID_BYTES]);

/* mem_limit_now polls the quota (cheaply) and returns the memory limit in force, bytes. */
uint64_t mem_limit_now(void);
/* mem_current_device reports the current context's device; -1 without a current context. */
int mem_current_device(CUdevice *dev);
/* mem_current_ctx returns the current context, or NULL. */
CUcontext mem_current_ctx(void);

/* ---- pools (pool.c) ---- */
/* pool_settle sets pool's charge to its reservation; precharged bytes were already added for it. */
void pool_settle(CUmemoryPool pool, uint64_t precharged);
/* pools_settle_all settles every pool this process has used. */
void pools_settle_all(void);

/* graph_mem_settle charges each known device's graph memory reservation (after graph launches and trims). */
void graph_mem_settle(void);

/* ---- books (books.c) ---- */
void books_put(uint64_t key, uint64_t bytes, enum alloc_kind kind, int dev, CUmemoryPool pool, CUcontext ctx);
/*
 * books_drop_ctx forgets every record of context ctx except pool allocations
 * (pools are settled from the driver) and credits their bytes back.
 */
void books_drop_ctx(CUcontext ctx);
/* books_take removes key and returns 1 with its record, or 0 if unknown. */
int books_take(uint64_t key, struct alloc_rec *out);
/* books_find copies key's record without removing it. */
int books_find(uint64_t key, struct alloc_rec *out);
void books_reset_after_fork(void);

/* ---- pacing (pace.c) ---- */
/*
 * pace_admit charges blocks thread blocks to the slice's token bucket, waiting
 * (bounded) while it is in debt; now_coarse is hook_coarse_ns() of the caller.
 */
void pace_admit(uint64_t blocks, uint64_t now_coarse);
/* pace_sm_count returns the SM count of the current device (cached; 1 if unknown). */
uint32_t pace_sm_count(void);

#endif
