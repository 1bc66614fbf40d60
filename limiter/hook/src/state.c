/*
 * state.c: owns struct hook_state. Reads the one setting the environment
 * may carry (the log level) once, resolves the driver lazily, polls the
 * quota file, publishes the limits in force and logs.
 *
 * Where the limits come from (ARCHITECTURE.md invariant 3, "Quota region"):
 * only the quota file at the fixed path GPULIMIT_QUOTA_FILE, inside the
 * slice's read-only quota mount. No environment variable, argument or
 * writable file names another file or adds a limit; the slice a file
 * belongs to is the mount it lies in, not the process's word.
 *
 * Quota policy (fail closed, documented in ../README.md):
 *   - A valid quota file with a higher generation than the one in force
 *     replaces it within GPULIMIT_POLL_NS plus one hot-path call.
 *   - Until a first valid file is seen, the process fails closed; at its
 *     first driver call it waits up to GPULIMIT_QUOTA_WAIT_NS for the node
 *     agent to write one (the agent writes it as soon as it sees the pod).
 *   - A quota path that holds anything but a valid file (missing after a
 *     valid one, invalid, not a regular file, the wrong size, not on a
 *     read-only mount): FAIL CLOSED. So does an unusable usage region
 *     (usage.c). The memory limit in force becomes 0, so every new device
 *     allocation fails with CUDA_ERROR_OUT_OF_MEMORY and memory queries show
 *     0 total and 0 free; compute is paced at 1 %. Frees, launches and all
 *     other calls keep working; one message saying why goes to stderr at
 *     level error when the state is entered (or, in a process that had not
 *     used the driver yet, at its first driver call). The next valid quota
 *     file (generation >= the last valid one) lifts a quota problem; a usage
 *     region problem lasts for the process's life.
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
    .publish_lock = PTHREAD_MUTEX_INITIALIZER,
    .config_once = PTHREAD_ONCE_INIT,
    .slot = -1,
    .q_fail_closed = 1,
    .q_compute_percent = 1,
    .q_compute_limit_percent = 1,
    .q_why = "no quota file yet",
};
/* Thread-local, so it cannot live in struct hook_state: set while this thread resolves the driver. */
static __thread int t_in_init;

static void report_fail_closed(void);
static void poll_locked(struct hook_state *s);
static void quota_await(struct hook_state *s);

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

static void resolve_real(void)
{
	t_in_init = 1;
	struct hook_state *s = &g_state;
	s->cuda_lib = hook_real_dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
	if (s->cuda_lib == NULL)
		s->cuda_lib = hook_real_dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	s->nvml_lib = hook_real_dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
	if (s->nvml_lib == NULL)
		s->nvml_lib = hook_real_dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
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
	quota_await(s);
	__atomic_store_n(&s->driver_seen, 1, __ATOMIC_RELEASE);
	pthread_mutex_lock(&s->poll_lock);
	if (__atomic_load_n(&s->q_fail_closed, __ATOMIC_ACQUIRE) && !s->q_reported)
		report_fail_closed();
	pthread_mutex_unlock(&s->poll_lock);
	usage_open();
}

static void read_env(struct hook_state *s)
{
	/* The log level is the one setting the environment may carry: it widens nothing. */
	const char *lvl = getenv("GPUBROKER_LIMITER_LOG");
	if (lvl == NULL)
		return;
	if (strcmp(lvl, "error") == 0)
		s->log_level = HOOK_LOG_ERROR;
	else if (strcmp(lvl, "info") == 0)
		s->log_level = HOOK_LOG_INFO;
	else if (strcmp(lvl, "debug") == 0)
		s->log_level = HOOK_LOG_DEBUG;
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
	/* Another thread is loading the driver (and maybe waiting for the quota): wait, but not forever. */
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

/* ---- limits in force ---- */

void hook_publish(void)
{
	struct hook_state *s = &g_state;
	pthread_mutex_lock(&s->publish_lock);
	int closed = __atomic_load_n(&s->q_fail_closed, __ATOMIC_ACQUIRE) ||
	             __atomic_load_n(&s->usage_broken, __ATOMIC_ACQUIRE);
	const struct quota_values *q = &s->q_cur;
	__atomic_store_n(&s->q_memory_limit_bytes, closed ? 0 : q->memory_limit_bytes, __ATOMIC_RELEASE);
	__atomic_store_n(&s->q_compute_percent, closed ? 1 : q->compute_percent, __ATOMIC_RELEASE);
	__atomic_store_n(&s->q_compute_limit_percent, closed ? 1 : q->compute_limit_percent, __ATOMIC_RELEASE);
	__atomic_store_n(&s->q_generation, q->generation, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&s->publish_lock);
}

/* apply makes q the quota in force (poll lock held). */
static void apply(const struct quota_values *q)
{
	struct hook_state *s = &g_state;
	s->q_cur = *q;
	int was_closed = __atomic_exchange_n(&s->q_fail_closed, 0, __ATOMIC_ACQ_REL);
	s->q_reported = 0;
	hook_publish();
	hook_log(was_closed && s->q_waited ? HOOK_LOG_WARN : HOOK_LOG_INFO,
	         "quota generation %llu for slice %s: memory %llu MiB, compute %u%% (limit %u%%)",
	         (unsigned long long)q->generation, q->slice_id, (unsigned long long)(q->memory_limit_bytes >> 20),
	         q->compute_percent, q->compute_limit_percent);
}

static void report_fail_closed(void)
{
	g_state.q_reported = 1;
	hook_log(HOOK_LOG_ERROR,
	         "no valid GPU quota (%s): failing closed, every new device allocation returns "
	         "CUDA_ERROR_OUT_OF_MEMORY and compute is held at 1%% until a valid quota arrives",
	         g_state.q_why);
}

/*
 * fail_closed enters the fail-closed state (poll lock held). The message goes
 * to stderr now if the process already uses the driver, else at its first
 * driver call, so processes that never touch the GPU (shells, ls) stay quiet.
 */
static void fail_closed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_closed(const char *fmt, ...)
{
	struct hook_state *s = &g_state;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->q_why, sizeof(s->q_why), fmt, ap);
	va_end(ap);
	__atomic_store_n(&s->q_fail_closed, 1, __ATOMIC_RELEASE);
	hook_publish();
	s->q_reported = 0;
	if (__atomic_load_n(&s->driver_seen, __ATOMIC_ACQUIRE))
		report_fail_closed();
}

/* read_quota_file reads the quota path (poll lock held): 1 valid, 0 missing, -1 refused or invalid. */
static int read_quota_file(void)
{
	struct hook_state *s = &g_state;
	char why[200];
	struct stat st;
	int fd = region_open(GPULIMIT_QUOTA_FILE, 0, sizeof(struct gpulimit_quota), 1, &st, why, sizeof(why));
	if (fd == REGION_MISSING)
		return 0; /* replaced between the look and the open; the next poll sees the new one */
	if (fd < 0) {
		fail_closed("quota file %s %s", GPULIMIT_QUOTA_FILE, why);
		return -1;
	}
	unsigned char buf[sizeof(struct gpulimit_quota)];
	ssize_t n = pread(fd, buf, sizeof(buf), 0);
	int e = errno;
	close(fd);
	struct quota_values q;
	const char *bad;
	if (n < 0 || quota_parse(buf, (size_t)n, &q, &bad) != 0) {
		fail_closed("quota file %s is invalid: %s", GPULIMIT_QUOTA_FILE, n < 0 ? strerror(e) : bad);
		return -1;
	}
	int closed = __atomic_load_n(&s->q_fail_closed, __ATOMIC_ACQUIRE);
	if (q.generation > s->q_cur.generation || (closed && q.generation >= s->q_cur.generation)) {
		apply(&q);
		return 1;
	}
	hook_log(HOOK_LOG_DEBUG, "quota file generation %llu not newer than %llu: ignored",
	         (unsigned long long)q.generation, (unsigned long long)s->q_cur.generation);
	return 1;
}

/*
 * quota_poll: the hot path calls this with a coarse clock. At most every
 * GPULIMIT_POLL_NS one thread (winner of a compare-and-swap) lstat(2)s the
 * quota path; only if what is there changed (inode, device, size, mtime or
 * type) is it opened and read. The agent replaces the file by rename, so a
 * new inode is the normal signal; an in-place rewrite changes mtime.
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
	usage_verify();
	pthread_mutex_unlock(&s->poll_lock);
}

enum { PATH_UNSEEN = 0, PATH_MISSING = 1, PATH_PRESENT = 2 };

static void poll_locked(struct hook_state *s)
{
	struct stat st;
	if (lstat(GPULIMIT_QUOTA_FILE, &st) != 0) {
		int e = errno;
		if (s->q_path_state == PATH_MISSING)
			return;
		s->q_path_state = PATH_MISSING;
		if (s->q_cur.generation != 0)
			fail_closed("quota file %s disappeared", GPULIMIT_QUOTA_FILE);
		else if (e == ENOENT)
			fail_closed("no quota file at %s (the node agent writes it when the pod starts)",
			            GPULIMIT_QUOTA_FILE);
		else
			fail_closed("quota file %s cannot be examined: %s", GPULIMIT_QUOTA_FILE, strerror(e));
		return;
	}
	uint64_t mtime = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
	if (s->q_path_state == PATH_PRESENT && s->q_file_ino == (uint64_t)st.st_ino &&
	    s->q_file_dev == (uint64_t)st.st_dev && s->q_file_size == (uint64_t)st.st_size &&
	    s->q_file_mtime_ns == mtime && s->q_file_mode == (uint64_t)st.st_mode)
		return;
	s->q_path_state = PATH_PRESENT;
	s->q_file_ino = (uint64_t)st.st_ino;
	s->q_file_dev = (uint64_t)st.st_dev;
	s->q_file_size = (uint64_t)st.st_size;
	s->q_file_mtime_ns = mtime;
	s->q_file_mode = (uint64_t)st.st_mode;
	read_quota_file();
}

/*
 * quota_await: at the first driver call of a process that has no quota yet
 * because nothing is at the quota path, wait up to GPULIMIT_QUOTA_WAIT_NS for
 * the node agent to write one (a notebook started in the instant between its
 * pod's creation and the agent's first write). A path that holds something
 * invalid is not waited for.
 */
static void quota_await(struct hook_state *s)
{
	pthread_mutex_lock(&s->poll_lock);
	if (s->q_waited) {
		pthread_mutex_unlock(&s->poll_lock);
		return;
	}
	s->q_waited = 1;
	poll_locked(s);
	if (s->q_path_state == PATH_MISSING && s->q_cur.generation == 0) {
		hook_log(HOOK_LOG_INFO, "waiting up to %llu s for the quota file %s",
		         (unsigned long long)(GPULIMIT_QUOTA_WAIT_NS / 1000000000ull), GPULIMIT_QUOTA_FILE);
		uint64_t until = hook_now_ns() + GPULIMIT_QUOTA_WAIT_NS;
		while (s->q_path_state == PATH_MISSING && hook_now_ns() < until) {
			struct timespec ts = {0, (long)GPULIMIT_POLL_NS};
			nanosleep(&ts, NULL);
			poll_locked(s);
		}
		if (s->q_path_state == PATH_MISSING)
			fail_closed("no quota file at %s after waiting %llu s (the node agent writes it when the pod "
			            "starts)",
			            GPULIMIT_QUOTA_FILE, (unsigned long long)(GPULIMIT_QUOTA_WAIT_NS / 1000000000ull));
	}
	pthread_mutex_unlock(&s->poll_lock);
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
	pthread_mutex_init(&g_state.publish_lock, NULL);
}

__attribute__((constructor)) static void hook_init(void)
{
	struct hook_state *s = &g_state;
	hook_config();
	/* Read the file now (not lazily) so the first allocation already sees it; nothing is logged yet. */
	pthread_mutex_lock(&s->poll_lock);
	poll_locked(s);
	pthread_mutex_unlock(&s->poll_lock);
	pthread_atfork(NULL, NULL, after_fork_child);
}
