/*
 * usage.c: this process's slot in the slice's usage region, and the
 * slice-wide memory accounting built on it.
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
	int fd = open(path, O_RDONLY | O_CLOEXEC);
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

static void init_header(struct gpulimit_usage *u)
{
	/* Idempotent: racing initializers write the same values; magic goes last. */
	__atomic_store_n(&u->layout_version, GPULIMIT_LAYOUT_VERSION, __ATOMIC_RELAXED);
	__atomic_store_n(&u->slot_count, GPULIMIT_USAGE_SLOTS, __ATOMIC_RELAXED);
	__atomic_store_n(&u->device_count, GPULIMIT_USAGE_DEVICES, __ATOMIC_RELAXED);
	uint32_t zero = 0;
	__atomic_compare_exchange_n(&u->magic, &zero, GPULIMIT_USAGE_MAGIC, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

static struct gpulimit_usage *map_shared(const char *path, const char **why)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
	if (fd < 0) {
		*why = strerror(errno);
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		*why = strerror(errno);
		close(fd);
		return NULL;
	}
	if (st.st_size == 0 && ftruncate(fd, sizeof(struct gpulimit_usage)) != 0) {
		*why = strerror(errno);
		close(fd);
		return NULL;
	}
	if (st.st_size != 0 && st.st_size != (off_t)sizeof(struct gpulimit_usage)) {
		*why = "file has the wrong size";
		close(fd);
		return NULL;
	}
	void *p = mmap(NULL, sizeof(struct gpulimit_usage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		*why = strerror(errno);
		return NULL;
	}
	struct gpulimit_usage *u = p;
	if (__atomic_load_n(&u->magic, __ATOMIC_ACQUIRE) == 0)
		init_header(u);
	if (__atomic_load_n(&u->magic, __ATOMIC_ACQUIRE) != GPULIMIT_USAGE_MAGIC ||
	    u->layout_version != GPULIMIT_LAYOUT_VERSION || u->slot_count != GPULIMIT_USAGE_SLOTS ||
	    u->device_count != GPULIMIT_USAGE_DEVICES) {
		*why = "not a usage region of this layout";
		munmap(p, sizeof(struct gpulimit_usage));
		return NULL;
	}
	return u;
}

void usage_open(void)
{
	struct hook_state *s = hook_state();
	const char *why = NULL;
	struct gpulimit_usage *u = map_shared(s->usage_path, &why);
	if (u != NULL) {
		s->usage = u;
		s->usage_shared = 1;
		return;
	}
	/* Fall back to a private region: the cap still holds for this process alone. */
	hook_log(HOOK_LOG_WARN, "usage region %s unusable (%s): memory is accounted for this process only",
	         s->usage_path, why);
	void *p = mmap(NULL, sizeof(struct gpulimit_usage), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		hook_log(HOOK_LOG_ERROR, "cannot map a private usage region: %s", strerror(errno));
		return;
	}
	init_header(p);
	s->usage = p;
	s->usage_shared = 0;
}

static struct gpulimit_usage_slot *my_slot(void)
{
	struct hook_state *s = hook_state();
	return s->usage && s->slot >= 0 ? &s->usage->slots[s->slot] : NULL;
}

/* claim_slot_locked takes a free slot for this process; -1 if the region is full of live processes. */
static int claim_slot_locked(void)
{
	struct hook_state *s = hook_state();
	if (s->slot >= 0)
		return s->slot;
	struct gpulimit_usage *u = s->usage;
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
	hook_log(HOOK_LOG_ERROR, "usage region %s has no free slot for this process", s->usage_path);
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
static int slot_alive(int i, uint32_t pid)
{
	struct hook_state *s = hook_state();
	struct gpulimit_usage_slot *sl = &s->usage->slots[i];
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
	struct gpulimit_usage *u = s->usage;
	if (u == NULL)
		return 0;
	uint64_t sum = 0;
	for (int i = 0; i < GPULIMIT_USAGE_SLOTS; i++) {
		struct gpulimit_usage_slot *sl = &u->slots[i];
		uint32_t pid = __atomic_load_n(&sl->pid, __ATOMIC_SEQ_CST);
		if (pid == 0 || (i != s->slot && !slot_alive(i, pid)))
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
	if (s->usage == NULL)
		return 0;
	int n = 0;
	for (int i = 0; i < GPULIMIT_USAGE_SLOTS && n < max; i++) {
		uint32_t pid = __atomic_load_n(&s->usage->slots[i].pid, __ATOMIC_ACQUIRE);
		if (pid != 0 && (i == s->slot || slot_alive(i, pid)))
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
