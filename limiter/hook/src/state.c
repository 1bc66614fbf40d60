/*
 * state.c: owns struct hook_state. Reads the configuration once (constructor),
 * resolves the driver lazily, polls the quota file and logs.
 *
 * Quota policy (fail-closed, documented in ../README.md):
 *   - The pod env (GPUBROKER_MEMORY_LIMIT_MIB, GPUBROKER_COMPUTE_PERCENT,
 *     GPUBROKER_COMPUTE_LIMIT_PERCENT) is generation 0. A valid quota file
 *     with a higher generation than the one in force replaces it, within
 *     GPULIMIT_POLL_NS plus one hot-path call.
 *   - A missing quota file changes nothing: the values in force stay.
 *   - No valid values at all (env absent or invalid, no valid file yet), or a
 *     quota file that exists but is invalid (size, magic, layout, checksum,
 *     ranges, or a slice id other than GPUBROKER_SLICE_ID): FAIL CLOSED. The memory limit becomes 0, so every new
 * device allocation fails with CUDA_ERROR_OUT_OF_MEMORY and memory queries show 0 total and 0 free; compute is paced at
 * 1 %. Frees, launches and all other calls keep working; a message saying why goes to stderr at level error each time
 * the state is entered. The next valid file (generation
 *     >= the last valid one) lifts it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hook.h"

static struct hook_state g_state = {
    .log_level = HOOK_LOG_WARN,
    .books_lock = PTHREAD_MUTEX_INITIALIZER,
    .pace_lock = PTHREAD_MUTEX_INITIALIZER,
    .poll_lock = PTHREAD_MUTEX_INITIALIZER,
    .config_once = PTHREAD_ONCE_INIT,
    .slot = -1,
    .q_fail_closed = 1,
    .q_compute_percent = 1,
    .q_compute_limit_percent = 1,
};
/* Thread-local, so it cannot live in struct hook_state: set while this thread resolves the driver. */
static __thread int t_in_init;

static void report_fail_closed(void);
static void poll_locked(struct hook_state *s);
static void read_env(struct hook_state *s);

struct hook_state *hook_state(void)
{
	return &g_state;
}

int hook_in_init(void)
{
	return t_in_init;
}

uint64_t hook_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t hook_coarse_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void hook_log(enum hook_log_level level, const char *fmt, ...)
{
	static const char *names[] = {"error", "warn", "info", "debug"};
	if ((int)level > g_state.log_level)
		return;
	char buf[512];
	int n = snprintf(buf, sizeof(buf), "gpulimit[%d]: %s: ", (int)getpid(), names[level]);
	size_t room = sizeof(buf) - (size_t)n - 1; /* one byte stays free for the newline */
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(buf + n, room, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < room ? (size_t)m : room - 1)); /* truncated if long */
	buf[len++] = '\n';
	/* One write(2): lines from several threads do not interleave; stdio is not touched. */
	ssize_t w = write(STDERR_FILENO, buf, len);
	(void)w;
}

/* ---- driver resolution ---- */

typedef void *(*dlsym_fn)(void *, const char *);

void *hook_real_dlsym(void *handle, const char *name)
{
	dlsym_fn f = (dlsym_fn)__atomic_load_n(&g_state.real_dlsym, __ATOMIC_ACQUIRE);
	if (f == NULL) {
		f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
		if (f == NULL)
			f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
		if (f == NULL)
			return NULL;
		__atomic_store_n(&g_state.real_dlsym, (void *)f, __ATOMIC_RELEASE);
	}
	return f(handle, name);
}

static void resolve_real(void)
{
	t_in_init = 1;
	struct hook_state *s = &g_state;
	s->cuda_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
	if (s->cuda_lib == NULL)
		s->cuda_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	s->nvml_lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
	if (s->nvml_lib == NULL)
		s->nvml_lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (s->cuda_lib == NULL)
		hook_log(HOOK_LOG_WARN, "libcuda.so.1 not loadable: %s", dlerror());
	void *libs[2] = {s->cuda_lib, s->nvml_lib};
#define RESOLVE_HOOK(lib, name, base, since, ptsz)                                                                     \
	do {                                                                                                           \
		if (libs[LIB_##lib])                                                                                   \
			s->real.name = (__typeof__(&name))hook_real_dlsym(libs[LIB_##lib], #name);                     \
	} while (0);
#define RESOLVE_CALL(lib, name) RESOLVE_HOOK(lib, name, "", 0, 0)
	GPULIMIT_SYMBOLS(RESOLVE_HOOK, RESOLVE_CALL)
#undef RESOLVE_HOOK
#undef RESOLVE_CALL
	t_in_init = 0;
	__atomic_store_n(&s->driver_seen, 1, __ATOMIC_RELEASE);
	if (__atomic_load_n(&s->q_fail_closed, __ATOMIC_ACQUIRE))
		report_fail_closed();
	usage_open();
}

static void config_once(void)
{
	read_env(&g_state);
}

/* hook_config reads the env once; the constructor calls it, and so does anything that may run before it. */
static void hook_config(void)
{
	pthread_once(&g_state.config_once, config_once);
}

/*
 * Resolution runs once, in the first thread that needs it (state 0 -> 1 ->
 * 2). It is not a pthread_once: a thread that must not wait for it (dlsym,
 * which may run under the loader's lock that the resolving thread's dlopen
 * needs) can ask whether it is done instead of blocking.
 */
enum { REAL_UNRESOLVED = 0, REAL_RESOLVING = 1, REAL_READY = 2 };

const struct real_table *hook_real(void)
{
	if (__atomic_load_n(&g_state.real_state, __ATOMIC_ACQUIRE) == REAL_READY)
		return &g_state.real;
	hook_config();
	int expected = REAL_UNRESOLVED;
	if (__atomic_compare_exchange_n(&g_state.real_state, &expected, REAL_RESOLVING, 0, __ATOMIC_ACQ_REL,
	                                __ATOMIC_ACQUIRE)) {
		resolve_real();
		__atomic_store_n(&g_state.real_state, REAL_READY, __ATOMIC_RELEASE);
		return &g_state.real;
	}
	if (t_in_init)
		return &g_state.real; /* re-entered from our own dlopen: what is resolved so far */
	/* Another thread is loading the driver: wait for its dlopen, but not forever. */
	for (int i = 0; __atomic_load_n(&g_state.real_state, __ATOMIC_ACQUIRE) != REAL_READY; i++) {
		if (i == 300000) { /* 30 s of 100 us naps */
			hook_log(HOOK_LOG_ERROR,
			         "driver resolution by another thread takes over 30 s: going on without it");
			break;
		}
		struct timespec ts = {0, 100000};
		nanosleep(&ts, NULL);
	}
	return &g_state.real;
}

const struct real_table *hook_real_nowait(void)
{
	if (__atomic_load_n(&g_state.real_state, __ATOMIC_ACQUIRE) == REAL_RESOLVING && !t_in_init)
		return NULL;
	return hook_real();
}

/* ---- configuration ---- */

static int parse_u64(const char *v, uint64_t *out)
{
	if (v == NULL || *v == '\0')
		return -1;
	for (const char *p = v; *p; p++)
		if (*p < '0' || *p > '9')
			return -1;
	errno = 0;
	unsigned long long x = strtoull(v, NULL, 10);
	if (errno != 0)
		return -1;
	*out = x;
	return 0;
}

static void read_env(struct hook_state *s)
{
	const char *lvl = getenv("GPUBROKER_LIMITER_LOG");
	if (lvl != NULL) {
		if (strcmp(lvl, "error") == 0)
			s->log_level = HOOK_LOG_ERROR;
		else if (strcmp(lvl, "info") == 0)
			s->log_level = HOOK_LOG_INFO;
		else if (strcmp(lvl, "debug") == 0)
			s->log_level = HOOK_LOG_DEBUG;
	}
	const char *qf = getenv("GPUBROKER_QUOTA_FILE");
	snprintf(s->quota_path, sizeof(s->quota_path), "%s", qf && *qf ? qf : GPULIMIT_DEFAULT_QUOTA_FILE);
	const char *uf = getenv("GPUBROKER_USAGE_FILE");
	snprintf(s->usage_path, sizeof(s->usage_path), "%s", uf && *uf ? uf : GPULIMIT_DEFAULT_USAGE_FILE);
	const char *uuid = getenv("GPUBROKER_GPU_UUID");
	snprintf(s->gpu_uuid_env, sizeof(s->gpu_uuid_env), "%s", uuid ? uuid : "");
	const char *sid = getenv("GPUBROKER_SLICE_ID");
	snprintf(s->env_quota.slice_id, sizeof(s->env_quota.slice_id), "%s", sid ? sid : "");

	uint64_t mib, pct, lim;
	const char *bad = NULL;
	if (parse_u64(getenv("GPUBROKER_MEMORY_LIMIT_MIB"), &mib) != 0 || mib > (UINT64_MAX >> 20))
		bad = "GPUBROKER_MEMORY_LIMIT_MIB";
	else if (parse_u64(getenv("GPUBROKER_COMPUTE_PERCENT"), &pct) != 0 || pct < 1 || pct > 100)
		bad = "GPUBROKER_COMPUTE_PERCENT";
	else if (getenv("GPUBROKER_COMPUTE_LIMIT_PERCENT") == NULL)
		lim = pct;
	else if (parse_u64(getenv("GPUBROKER_COMPUTE_LIMIT_PERCENT"), &lim) != 0 || lim < pct || lim > 100)
		bad = "GPUBROKER_COMPUTE_LIMIT_PERCENT";
	if (bad != NULL) {
		s->env_valid = 0;
		hook_log(HOOK_LOG_DEBUG, "env quota unusable: %s missing or out of range", bad);
		return;
	}
	s->env_quota.generation = 0;
	s->env_quota.memory_limit_bytes = mib << 20;
	s->env_quota.compute_percent = (uint32_t)pct;
	s->env_quota.compute_limit_percent = (uint32_t)lim;
	s->env_valid = 1;
}

/* ---- quota in force ---- */

static void apply(const struct quota_values *q, int from_file)
{
	struct hook_state *s = &g_state;
	__atomic_store_n(&s->q_memory_limit_bytes, q->memory_limit_bytes, __ATOMIC_RELEASE);
	__atomic_store_n(&s->q_compute_percent, q->compute_percent, __ATOMIC_RELEASE);
	__atomic_store_n(&s->q_compute_limit_percent, q->compute_limit_percent, __ATOMIC_RELEASE);
	__atomic_store_n(&s->q_generation, q->generation, __ATOMIC_RELEASE);
	int was_closed = __atomic_exchange_n(&s->q_fail_closed, 0, __ATOMIC_ACQ_REL);
	s->q_from_file = from_file;
	hook_log(was_closed && from_file ? HOOK_LOG_WARN : HOOK_LOG_INFO,
	         "quota generation %llu from %s: memory %llu MiB, compute %u%% (limit %u%%)",
	         (unsigned long long)q->generation, from_file ? s->quota_path : "environment",
	         (unsigned long long)(q->memory_limit_bytes >> 20), q->compute_percent, q->compute_limit_percent);
}

static void report_fail_closed(void)
{
	hook_log(HOOK_LOG_ERROR,
	         "no valid GPU quota (%s): failing closed, every new device allocation returns "
	         "CUDA_ERROR_OUT_OF_MEMORY and compute is held at 1%% until a valid quota arrives",
	         g_state.q_why);
}

/*
 * fail_closed enters the fail-closed state. The message goes to stderr now if
 * the process already uses the driver, else at its first driver call, so
 * processes that never touch the GPU (shells, ls) stay quiet.
 */
static void fail_closed(const char *why)
{
	struct hook_state *s = &g_state;
	__atomic_store_n(&s->q_memory_limit_bytes, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&s->q_compute_percent, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&s->q_compute_limit_percent, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&s->q_fail_closed, 1, __ATOMIC_RELEASE);
	snprintf(s->q_why, sizeof(s->q_why), "%.299s", why);
	if (__atomic_load_n(&s->driver_seen, __ATOMIC_ACQUIRE))
		report_fail_closed();
}

/* read_quota_file returns 1 if a valid file was applied, 0 if missing, -1 if invalid. */
static int read_quota_file(void)
{
	struct hook_state *s = &g_state;
	char why_buf[300];
	unsigned char buf[sizeof(struct gpulimit_quota) + 1];
	int fd = open(s->quota_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return 0; /* replaced between stat and open; the next poll sees the new one */
	if (fd < 0) {
		snprintf(why_buf, sizeof(why_buf), "quota file %.200s cannot be opened: %.60s", s->quota_path,
		         strerror(errno));
		fail_closed(why_buf);
		return -1;
	}
	ssize_t n = pread(fd, buf, sizeof(buf), 0);
	close(fd);
	struct quota_values q;
	const char *why;
	if (n < 0 || quota_parse(buf, (size_t)n, &q, &why) != 0) {
		snprintf(why_buf, sizeof(why_buf), "quota file %.200s is invalid: %.60s", s->quota_path,
		         n < 0 ? strerror(errno) : why);
		fail_closed(why_buf);
		return -1;
	}
	if (s->env_quota.slice_id[0] != '\0' && strcmp(q.slice_id, s->env_quota.slice_id) != 0) {
		snprintf(why_buf, sizeof(why_buf), "quota file %.180s is for slice %.40s, not %.40s", s->quota_path,
		         q.slice_id, s->env_quota.slice_id);
		fail_closed(why_buf);
		return -1;
	}
	uint64_t cur = __atomic_load_n(&s->q_generation, __ATOMIC_ACQUIRE);
	int closed = __atomic_load_n(&s->q_fail_closed, __ATOMIC_ACQUIRE);
	if (q.generation > cur || (closed && q.generation >= cur)) {
		apply(&q, 1);
		return 1;
	}
	hook_log(HOOK_LOG_DEBUG, "quota file generation %llu not newer than %llu: ignored",
	         (unsigned long long)q.generation, (unsigned long long)cur);
	return 1;
}

/*
 * quota_poll: the hot path calls this with a coarse clock. At most every
 * GPULIMIT_POLL_NS one thread (winner of a compare-and-swap) stat(2)s the
 * quota path; only if the file behind the name changed (inode, device, size
 * or mtime) is it read. The agent replaces the file by rename, so a new
 * inode is the normal signal; an in-place rewrite changes mtime.
 */
void quota_poll(uint64_t now)
{
	struct hook_state *s = &g_state;
	uint64_t next = __atomic_load_n(&s->q_poll_next_ns, __ATOMIC_RELAXED);
	if (now < next)
		return;
	if (!__atomic_compare_exchange_n(&s->q_poll_next_ns, &next, now + GPULIMIT_POLL_NS, 0, __ATOMIC_ACQ_REL,
	                                 __ATOMIC_RELAXED))
		return;
	/* A poll slower than GPULIMIT_POLL_NS must not overlap the next one. */
	if (pthread_mutex_trylock(&s->poll_lock) != 0)
		return;
	poll_locked(s);
	pthread_mutex_unlock(&s->poll_lock);
}

static void poll_locked(struct hook_state *s)
{
	struct stat st;
	if (stat(s->quota_path, &st) != 0) {
		if (errno != ENOENT)
			hook_log(HOOK_LOG_DEBUG, "stat %s: %s", s->quota_path, strerror(errno));
		s->q_file_seen = 0;
		return;
	}
	uint64_t mtime = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
	if (s->q_file_seen && s->q_file_ino == (uint64_t)st.st_ino && s->q_file_dev == (uint64_t)st.st_dev &&
	    s->q_file_size == (uint64_t)st.st_size && s->q_file_mtime_ns == mtime)
		return;
	s->q_file_seen = 1;
	s->q_file_ino = (uint64_t)st.st_ino;
	s->q_file_dev = (uint64_t)st.st_dev;
	s->q_file_size = (uint64_t)st.st_size;
	s->q_file_mtime_ns = mtime;
	read_quota_file();
}

static void after_fork_child(void)
{
	/* A thread that was resolving the driver does not exist in the child. */
	int resolving = REAL_RESOLVING;
	__atomic_compare_exchange_n(&g_state.real_state, &resolving, REAL_UNRESOLVED, 0, __ATOMIC_ACQ_REL,
	                            __ATOMIC_RELAXED);
	usage_reset_after_fork();
	books_reset_after_fork();
	pthread_mutex_init(&g_state.books_lock, NULL);
	pthread_mutex_init(&g_state.pace_lock, NULL);
	pthread_mutex_init(&g_state.poll_lock, NULL);
}

__attribute__((constructor)) static void hook_init(void)
{
	struct hook_state *s = &g_state;
	hook_config();
	if (s->env_valid)
		apply(&s->env_quota, 0);
	/* Read the file now (not lazily) so the first allocation already sees it. */
	s->q_poll_next_ns = 0;
	quota_poll(hook_coarse_ns());
	if (!s->env_valid && !s->q_file_seen)
		fail_closed("GPUBROKER_MEMORY_LIMIT_MIB or GPUBROKER_COMPUTE_PERCENT unset or invalid, and no quota "
		            "file");
	pthread_atfork(NULL, NULL, after_fork_child);
}
