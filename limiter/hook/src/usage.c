/*
 * usage.c: this process's slot in the slice's usage region, and the
 * slice-wide memory accounting built on it.
 *
 * The region is the file at the fixed path GPULIMIT_USAGE_FILE, created and
 * initialized by the node agent. It is never created here and never replaced
 * by a private copy: a region that is missing, not a regular file of the right
 * size, not initialized, or that stops being the file that was mapped (deleted,
 * replaced, its header or this process's slot overwritten: usage_verify, every
 * poll) puts the process in the fail-closed state for good (memory limit 0,
 * compute 1 %), with one message on stderr. Per-process accounting would let
 * N processes hold N times the slice. What the node agent sees then: the
 * region's file on the host and the slice's processes in NVML, which is what
 * it judges by (limiter/agent).
 *
 * Cross-process admission without a lock: a process first adds the bytes to
 * its own slot (sequentially consistent), then sums all live slots; if the
 * sum exceeds the limit it takes them back and refuses. Two racing processes
 * can both refuse, never both succeed past the limit: each one's add is
 * ordered before its sum, so at least one sees the other's bytes.
 *
 * Liveness: a foreign slot counts while kill(pid, 0) does not fail with
 * ESRCH and the process's start time (proc(5) stat field 22, re-checked at
 * most every LIVENESS_RECHECK_NS) matches the slot's. A slot whose pid is
 * gone is freed by whoever notices (compare-and-swap pid -> 0); a killed
 * process therefore stops counting as soon as it is reaped. The slice's
 * processes must share one pid namespace (one container, or a pod with
 * shareProcessNamespace).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hook.h"

#define LIVENESS_RECHECK_NS (1000ull * 1000 * 1000)

static const uint8_t zero_uuid[GPULIMIT_UUID_BYTES];

static uint64_t proc_start_time(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	char *p = strrchr(buf, ')'); /* the command name may contain spaces and parentheses */
	if (p == NULL || p[1] == '\0')
		return 0;
	p += 2; /* field 3 */
	for (int field = 3; *p && field < 22; p++)
		if (*p == ' ')
			field++;
	return strtoull(p, NULL, 10);
}

static struct gpulimit_usage *region(void)
{
	return __atomic_load_n(&hook_state()->usage, __ATOMIC_ACQUIRE);
}

int usage_ok(void)
{
	struct hook_state *s = hook_state();
	return __atomic_load_n(&s->usage_shared, __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&s->usage_broken, __ATOMIC_ACQUIRE);
}

/*
 * usage_break puts the process in the fail-closed state for good, once, and
 * moves its accounting and pacing to a private region (the shared mapping is
 * left mapped: other threads may still be reading it).
 */
static void usage_break(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void usage_break(const char *fmt, ...)
{
	struct hook_state *s = hook_state();
	if (__atomic_exchange_n(&s->usage_broken, 1, __ATOMIC_ACQ_REL))
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->usage_why, sizeof(s->usage_why), fmt, ap);
	va_end(ap);
	hook_publish();
	void *p = mmap(NULL, sizeof(struct gpulimit_usage), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED) {
		struct gpulimit_usage *u = p;
		gpulimit_usage_init(u);
		__atomic_store_n(&s->usage_shared, 0, __ATOMIC_RELEASE);
		__atomic_store_n(&s->usage, u, __ATOMIC_RELEASE);
	}
	hook_log(HOOK_LOG_ERROR,
	         "usage region %s: failing closed, every new device allocation returns CUDA_ERROR_OUT_OF_MEMORY and "
	         "compute is held at 1%% for the rest of this process (the slice's processes share that region; "
	         "accounting alone would let each of them hold the whole slice)",
	         s->usage_why);
}

void usage_open(void)
{
	struct hook_state *s = hook_state();
	char why[200];
	struct stat st;
	int fd = region_open(GPULIMIT_USAGE_FILE, 1, sizeof(struct gpulimit_usage), 0, &st, why, sizeof(why));
	if (fd == REGION_MISSING) {
		usage_break("%s does not exist (the node agent creates it when the pod starts)", GPULIMIT_USAGE_FILE);
		return;
	}
	if (fd < 0) {
		usage_break("%s %s", GPULIMIT_USAGE_FILE, why);
		return;
	}
	void *p = mmap(NULL, sizeof(struct gpulimit_usage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED) {
		usage_break("%s cannot be mapped: %s", GPULIMIT_USAGE_FILE, strerror(e));
		return;
	}
	const char *bad;
	if (usage_header_check(p, sizeof(struct gpulimit_usage), &bad) != 0) {
		munmap(p, sizeof(struct gpulimit_usage));
		usage_break("%s is not a usage region: %s", GPULIMIT_USAGE_FILE, bad);
		return;
	}
	s->usage_ino = (uint64_t)st.st_ino;
	s->usage_dev = (uint64_t)st.st_dev;
	__atomic_store_n(&s->usage, (struct gpulimit_usage *)p, __ATOMIC_RELEASE);
	__atomic_store_n(&s->usage_shared, 1, __ATOMIC_RELEASE);
}

void usage_verify(void)
{
	struct hook_state *s = hook_state();
	if (!usage_ok())
		return;
	struct stat st;
	if (lstat(GPULIMIT_USAGE_FILE, &st) != 0) {
		usage_break("%s was deleted while in use", GPULIMIT_USAGE_FILE);
		return;
	}
	if (!S_ISREG(st.st_mode)) {
		usage_break("%s was replaced by %s while in use", GPULIMIT_USAGE_FILE, file_kind(st.st_mode));
		return;
	}
	if ((uint64_t)st.st_ino != s->usage_ino || (uint64_t)st.st_dev != s->usage_dev) {
		usage_break("%s was replaced by another file while in use", GPULIMIT_USAGE_FILE);
		return;
	}
	if ((uint64_t)st.st_size != sizeof(struct gpulimit_usage)) {
		usage_break("%s was cut or extended to %lld bytes while in use", GPULIMIT_USAGE_FILE,
		            (long long)st.st_size);
		return;
	}
	struct gpulimit_usage *u = region();
	const char *bad;
	if (usage_header_check(u, sizeof(*u), &bad) != 0) {
		usage_break("%s: its header was overwritten (%s)", GPULIMIT_USAGE_FILE, bad);
		return;
	}
	int slot = __atomic_load_n(&s->slot, __ATOMIC_ACQUIRE);
	if (slot >= 0 && __atomic_load_n(&u->slots[slot].pid, __ATOMIC_ACQUIRE) != (uint32_t)s->slot_pid)
		usage_break("%s: this process's slot %d was overwritten", GPULIMIT_USAGE_FILE, slot);
}

static struct gpulimit_usage_slot *my_slot(void)
{
	struct hook_state *s = hook_state();
	struct gpulimit_usage *u = region();
	int slot = __atomic_load_n(&s->slot, __ATOMIC_ACQUIRE);
	return u && slot >= 0 ? &u->slots[slot] : NULL;
}

/* claim_slot_locked takes a free slot for this process; -1 if the region is full of live processes. */
static int claim_slot_locked(void)
{
	struct hook_state *s = hook_state();
	if (s->slot >= 0)
		return s->slot;
	struct gpulimit_usage *u = region();
	if (u == NULL)
		return -1;
	uint32_t me = (uint32_t)getpid();
	uint64_t start = proc_start_time((pid_t)me);
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < GPULIMIT_USAGE_SLOTS; i++) {
			uint32_t zero = 0;
			struct gpulimit_usage_slot *sl = &u->slots[i];
			if (!__atomic_compare_exchange_n(&sl->pid, &zero, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
				continue;
			for (int k = 0; k < GPULIMIT_USAGE_DEVICES; k++) {
				__atomic_store_n(&sl->devices[k].bytes_in_use, 0, __ATOMIC_RELAXED);
				memset(sl->devices[k].uuid, 0, GPULIMIT_UUID_BYTES);
			}
			__atomic_store_n(&sl->launch_count, 0, __ATOMIC_RELAXED);
			__atomic_store_n(&sl->last_launch_ns, 0, __ATOMIC_RELAXED);
			__atomic_store_n(&sl->start_time, start, __ATOMIC_SEQ_CST); /* publishes the reset */
			s->slot_pid = (pid_t)me;
			__atomic_store_n(&s->slot, i, __ATOMIC_RELEASE);
			hook_log(HOOK_LOG_DEBUG, "claimed usage slot %d", i);
			return i;
		}
		/* Full: free the slots of processes that no longer exist, then try once more. */
		for (int i = 0; i < GPULIMIT_USAGE_SLOTS; i++) {
			uint32_t pid = __atomic_load_n(&u->slots[i].pid, __ATOMIC_ACQUIRE);
			if (pid != 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
				__atomic_compare_exchange_n(&u->slots[i].pid, &pid, 0, 0, __ATOMIC_SEQ_CST,
				                            __ATOMIC_RELAXED);
		}
	}
	hook_log(HOOK_LOG_ERROR, "usage region %s has no free slot for this process (%d processes of the slice use the "
	                         "GPU)",
	         GPULIMIT_USAGE_FILE, GPULIMIT_USAGE_SLOTS);
	return -1;
}

/* claim_slot returns this process's slot, claiming one on first use (serialized within the process). */
static int claim_slot(void)
{
	struct hook_state *s = hook_state();
	int slot = __atomic_load_n(&s->slot, __ATOMIC_ACQUIRE);
	if (slot >= 0)
		return slot;
	pthread_mutex_lock(&s->books_lock);
	slot = claim_slot_locked();
	pthread_mutex_unlock(&s->books_lock);
	return slot;
}

/* slot_alive decides whether foreign slot i, owned by pid, counts. */
static int slot_alive(struct gpulimit_usage *u, int i, uint32_t pid)
{
	struct hook_state *s = hook_state();
	struct gpulimit_usage_slot *sl = &u->slots[i];
	if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
		__atomic_compare_exchange_n(&sl->pid, &pid, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
		return 0;
	}
	uint64_t st = __atomic_load_n(&sl->start_time, __ATOMIC_SEQ_CST);
	uint64_t now = hook_coarse_ns();
	uint64_t *c = s->slot_verified[i];
	if (__atomic_load_n(&c[0], __ATOMIC_RELAXED) == pid && __atomic_load_n(&c[1], __ATOMIC_RELAXED) == st &&
	    now - __atomic_load_n(&c[2], __ATOMIC_RELAXED) < LIVENESS_RECHECK_NS)
		return 1;
	uint64_t real = proc_start_time((pid_t)pid);
	if (real != 0 && real != st)
		return 0; /* pid reused by another process, or a claim still being published */
	__atomic_store_n(&c[0], pid, __ATOMIC_RELAXED);
	__atomic_store_n(&c[1], st, __ATOMIC_RELAXED);
	__atomic_store_n(&c[2], now, __ATOMIC_RELAXED);
	return 1;
}

int usage_dev(const uint8_t uuid[GPULIMIT_UUID_BYTES])
{
	if (claim_slot() < 0)
		return -1;
	struct gpulimit_usage_slot *sl = my_slot();
	for (int k = 0; k < GPULIMIT_USAGE_DEVICES; k++)
		if (memcmp(sl->devices[k].uuid, uuid, GPULIMIT_UUID_BYTES) == 0)
			return k;
	struct hook_state *s = hook_state();
	pthread_mutex_lock(&s->books_lock);
	for (int k = 0; k < GPULIMIT_USAGE_DEVICES; k++)
		if (memcmp(sl->devices[k].uuid, uuid, GPULIMIT_UUID_BYTES) == 0) {
			pthread_mutex_unlock(&s->books_lock);
			return k;
		}
	for (int k = 0; k < GPULIMIT_USAGE_DEVICES; k++)
		if (memcmp(sl->devices[k].uuid, zero_uuid, GPULIMIT_UUID_BYTES) == 0) {
			memcpy(sl->devices[k].uuid, uuid, GPULIMIT_UUID_BYTES);
			pthread_mutex_unlock(&s->books_lock);
			return k;
		}
	pthread_mutex_unlock(&s->books_lock);
	hook_log(HOOK_LOG_ERROR, "more than %d devices in one process: not accounted", GPULIMIT_USAGE_DEVICES);
	return -1;
}

void usage_dev_uuid(int dev, uint8_t out[GPULIMIT_UUID_BYTES])
{
	struct gpulimit_usage_slot *sl = my_slot();
	if (sl == NULL || dev < 0) {
		memset(out, 0, GPULIMIT_UUID_BYTES);
		return;
	}
	memcpy(out, sl->devices[dev].uuid, GPULIMIT_UUID_BYTES);
}

uint64_t usage_total(const uint8_t uuid[GPULIMIT_UUID_BYTES])
{
	struct hook_state *s = hook_state();
	struct gpulimit_usage *u = region();
	if (u == NULL)
		return 0;
	int self = __atomic_load_n(&s->slot, __ATOMIC_ACQUIRE);
	uint64_t sum = 0;
	for (int i = 0; i < GPULIMIT_USAGE_SLOTS; i++) {
		struct gpulimit_usage_slot *sl = &u->slots[i];
		uint32_t pid = __atomic_load_n(&sl->pid, __ATOMIC_SEQ_CST);
		if (pid == 0 || (i != self && !slot_alive(u, i, pid)))
			continue;
		for (int k = 0; k < GPULIMIT_USAGE_DEVICES; k++)
			if (memcmp(sl->devices[k].uuid, uuid, GPULIMIT_UUID_BYTES) == 0)
				sum += __atomic_load_n(&sl->devices[k].bytes_in_use, __ATOMIC_SEQ_CST);
	}
	return sum;
}

int usage_charge(int dev, uint64_t bytes, uint64_t limit)
{
	struct gpulimit_usage_slot *sl = my_slot();
	if (sl == NULL || dev < 0 || bytes > limit)
		return -1;
	struct gpulimit_usage_device *e = &sl->devices[dev];
	__atomic_add_fetch(&e->bytes_in_use, bytes, __ATOMIC_SEQ_CST);
	if (usage_total(e->uuid) > limit) {
		__atomic_sub_fetch(&e->bytes_in_use, bytes, __ATOMIC_SEQ_CST);
		return -1;
	}
	return 0;
}

void usage_adjust(int dev, int64_t delta)
{
	struct gpulimit_usage_slot *sl = my_slot();
	if (sl == NULL || dev < 0 || delta == 0)
		return;
	uint64_t *b = &sl->devices[dev].bytes_in_use;
	if (delta > 0) {
		__atomic_add_fetch(b, (uint64_t)delta, __ATOMIC_SEQ_CST);
		return;
	}
	/* Never below zero, even if the books and the driver disagree. */
	uint64_t cur = __atomic_load_n(b, __ATOMIC_RELAXED), next;
	do {
		next = cur > (uint64_t)-delta ? cur - (uint64_t)-delta : 0;
	} while (!__atomic_compare_exchange_n(b, &cur, next, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
}

void usage_note_launch(void)
{
	if (claim_slot() < 0)
		return;
	struct gpulimit_usage_slot *sl = my_slot();
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	__atomic_store_n(&sl->last_launch_ns, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
	                 __ATOMIC_RELAXED);
	__atomic_store_n(&sl->launch_count, __atomic_load_n(&sl->launch_count, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

int usage_pids(uint32_t *pids, int max)
{
	struct hook_state *s = hook_state();
	struct gpulimit_usage *u = region();
	if (u == NULL)
		return 0;
	int self = __atomic_load_n(&s->slot, __ATOMIC_ACQUIRE);
	int n = 0;
	for (int i = 0; i < GPULIMIT_USAGE_SLOTS && n < max; i++) {
		uint32_t pid = __atomic_load_n(&u->slots[i].pid, __ATOMIC_ACQUIRE);
		if (pid != 0 && (i == self || slot_alive(u, i, pid)))
			pids[n++] = pid;
	}
	return n;
}

void usage_reset_after_fork(void)
{
	struct hook_state *s = hook_state();
	s->slot = -1;
	memset(s->slot_verified, 0, sizeof(s->slot_verified));
}

/*
 * cuInit joins the process to its slice before the driver creates anything
 * the node agent could see: the first driver call resolves the hook (waiting,
 * bounded, for a first quota file) and maps the usage region, and cuInit
 * claims this process's slot, so every process with a CUDA context has one
 * (the agent stops GPU processes of a slice that have none). Without a usable
 * region or a free slot cuInit is refused with CUDA_ERROR_NOT_PERMITTED: the
 * process cannot use the GPU past the slice, and says why on stderr.
 */
GPULIMIT_EXPORT CUresult cuInit(unsigned int flags)
{
	const struct real_table *r = hook_real();
	if (r->cuInit == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!usage_ok() || claim_slot() < 0)
		return CUDA_ERROR_NOT_PERMITTED;
	return r->cuInit(flags);
}

/* At a normal exit the driver frees the process's memory: give the slot back. */
__attribute__((destructor)) static void usage_release(void)
{
	struct hook_state *s = hook_state();
	struct gpulimit_usage_slot *sl = my_slot();
	if (sl == NULL)
		return;
	for (int k = 0; k < GPULIMIT_USAGE_DEVICES; k++)
		__atomic_store_n(&sl->devices[k].bytes_in_use, 0, __ATOMIC_SEQ_CST);
	uint32_t me = (uint32_t)getpid();
	__atomic_compare_exchange_n(&sl->pid, &me, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
	s->slot = -1;
}
