/* device.c: the shared simulated device (see stub.h). Test-only code. */
#define _GNU_SOURCE
#include "stub.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static struct stub_device *g_dev;
static char g_path[512];
static pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_atfork_done;
static pid_t g_proc_pid; /* pid the cached index belongs to (fork resets) */
static int g_proc_idx = -1;

uint64_t stub_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t stub_realtime_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000;
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	if (v == NULL || *v == '\0')
		return def;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno != 0 || *end != '\0')
		return def;
	return x;
}

static int parse_uuid(const char *s, uint8_t out[16])
{
	if (strncmp(s, "GPU-", 4) != 0)
		return -1;
	s += 4;
	int n = 0;
	for (; *s && n < 32; s++) {
		if (*s == '-')
			continue;
		int v;
		if (*s >= '0' && *s <= '9')
			v = *s - '0';
		else if (*s >= 'a' && *s <= 'f')
			v = *s - 'a' + 10;
		else if (*s >= 'A' && *s <= 'F')
			v = *s - 'A' + 10;
		else
			return -1;
		if (n % 2 == 0)
			out[n / 2] = (uint8_t)(v << 4);
		else
			out[n / 2] |= (uint8_t)v;
		n++;
	}
	return n == 32 && *s == '\0' ? 0 : -1;
}

void stub_format_uuid(const uint8_t u[16], char *out, size_t n)
{
	snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
	         u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static void init_device(struct stub_device *d)
{
	memset(d, 0, sizeof(*d));
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&d->lock, &a);
	pthread_mutexattr_destroy(&a);
	d->total_bytes = env_u64("GPUBROKER_STUB_MEMORY_MIB", 81559) << 20;
	d->sm_count = (uint32_t)env_u64("GPUBROKER_STUB_SM_COUNT", 132);
	if (d->sm_count == 0)
		d->sm_count = 1;
	d->max_threads_per_sm = 2048;
	d->queue_ns = env_u64("GPUBROKER_STUB_QUEUE_US", 20000) * 1000;
	d->sample_ns = env_u64("GPUBROKER_STUB_SAMPLE_MS", 50) * 1000000;
	d->stall_ns = env_u64("GPUBROKER_STUB_STALL_MS", 10) * 1000000;
	d->nvml_pid_offset = (uint32_t)env_u64("GPUBROKER_STUB_NVML_PID_OFFSET", 0);
	const char *uuid = getenv("GPUBROKER_STUB_UUID");
	if (uuid == NULL || parse_uuid(uuid, d->uuid) != 0)
		parse_uuid("GPU-5bd3a1e2-7c4f-4e8a-9b1d-2f6e8c0a4d17", d->uuid);
	const char *name = getenv("GPUBROKER_STUB_NAME");
	snprintf(d->name, sizeof(d->name), "%s", name && *name ? name : "NVIDIA H100 80GB HBM3");
	d->next_handle = 0x7f0000000000ull;
	d->version = STUB_VERSION;
	__atomic_store_n(&d->magic, STUB_MAGIC, __ATOMIC_RELEASE);
}

static void reset_after_fork(void)
{
	g_proc_pid = 0;
	g_proc_idx = -1;
}

static void state_path(char *out, size_t n)
{
	const char *path = getenv("GPUBROKER_STUB_STATE");
	if (path == NULL || *path == '\0')
		snprintf(out, n, "/tmp/gpubroker-stub-%u.state", (unsigned)getuid());
	else
		snprintf(out, n, "%s", path);
}

/* map_device maps the state file at path (lock held); on success it becomes the device. */
static void map_device(const char *path)
{
	if (!g_atfork_done) {
		pthread_atfork(NULL, NULL, reset_after_fork);
		g_atfork_done = 1;
	}
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0) {
		fprintf(stderr, "gpubroker stub: open %s: %s\n", path, strerror(errno));
		return;
	}
	/* flock is released by the kernel if we die here, so it cannot be left held. */
	if (flock(fd, LOCK_EX) != 0) {
		fprintf(stderr, "gpubroker stub: flock %s: %s\n", path, strerror(errno));
		close(fd);
		return;
	}
	struct stat st;
	int fresh = 0;
	if (fstat(fd, &st) == 0 && st.st_size != (off_t)sizeof(struct stub_device)) {
		if (ftruncate(fd, 0) != 0 || ftruncate(fd, sizeof(struct stub_device)) != 0) {
			fprintf(stderr, "gpubroker stub: size %s: %s\n", path, strerror(errno));
			close(fd);
			return;
		}
		fresh = 1;
	}
	void *p = mmap(NULL, sizeof(struct stub_device), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		fprintf(stderr, "gpubroker stub: mmap %s: %s\n", path, strerror(errno));
		close(fd);
		return;
	}
	struct stub_device *d = p;
	if (fresh || d->magic != STUB_MAGIC || d->version != STUB_VERSION)
		init_device(d);
	flock(fd, LOCK_UN);
	close(fd);
	snprintf(g_path, sizeof(g_path), "%s", path);
	g_proc_pid = 0;
	__atomic_store_n(&g_proc_idx, -1, __ATOMIC_RELEASE);
	__atomic_store_n(&g_dev, d, __ATOMIC_RELEASE);
}

struct stub_device *stub_dev(void)
{
	struct stub_device *d = __atomic_load_n(&g_dev, __ATOMIC_ACQUIRE);
	if (d != NULL)
		return d;
	pthread_mutex_lock(&g_map_lock);
	if (g_dev == NULL) {
		char path[512];
		state_path(path, sizeof(path));
		map_device(path);
	}
	pthread_mutex_unlock(&g_map_lock);
	return g_dev;
}

struct stub_device *stub_dev_refresh(void)
{
	pthread_mutex_lock(&g_map_lock);
	char path[512];
	state_path(path, sizeof(path));
	/* A test process may point the library at another device between inits; the old mapping is left as is. */
	if (g_dev == NULL || strcmp(path, g_path) != 0)
		map_device(path);
	struct stub_device *d = strcmp(path, g_path) == 0 ? g_dev : NULL; /* NULL: the new one failed to map */
	pthread_mutex_unlock(&g_map_lock);
	return d;
}

void stub_lock(struct stub_device *d)
{
	int rc = pthread_mutex_lock(&d->lock);
	if (rc == EOWNERDEAD)
		pthread_mutex_consistent(&d->lock);
}

void stub_unlock(struct stub_device *d)
{
	pthread_mutex_unlock(&d->lock);
}

uint64_t stub_proc_start_time(pid_t pid)
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
	char *p = strrchr(buf, ')');
	if (p == NULL)
		return 0;
	/* After ") " come fields 3 (state) .. ; start time is field 22. */
	p += 2;
	int field = 3;
	char state = *p;
	while (*p && field < 22) {
		if (*p == ' ')
			field++;
		p++;
	}
	if (state == 'Z' || state == 'X')
		return 0;
	return strtoull(p, NULL, 10);
}

int stub_proc_alive(uint32_t pid, uint64_t start_time)
{
	if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
		return 0;
	uint64_t st = stub_proc_start_time((pid_t)pid);
	return st != 0 && st == start_time;
}

void stub_release_proc_locked(struct stub_device *d, uint32_t pid)
{
	for (int i = 0; i < STUB_MAX_ALLOCS; i++) {
		struct stub_alloc *a = &d->allocs[i];
		if (a->kind != STUB_KIND_FREE && a->pid == pid) {
			if (a->kind != STUB_KIND_POOL)
				d->used_bytes -= a->size;
			memset(a, 0, sizeof(*a));
		}
	}
	for (int i = 0; i < STUB_MAX_POOLS; i++) {
		struct stub_pool *p = &d->pools[i];
		if (p->pid == pid) {
			d->used_bytes -= p->reserved;
			memset(p, 0, sizeof(*p));
		}
	}
}

void stub_reap_locked(struct stub_device *d)
{
	for (int i = 0; i < STUB_MAX_PROCS; i++) {
		struct stub_proc *p = &d->procs[i];
		if (p->pid == 0 || stub_proc_alive(p->pid, p->start_time))
			continue;
		d->used_bytes -= p->graph_reserved;
		stub_release_proc_locked(d, p->pid);
		memset(p, 0, sizeof(*p));
		d->c_reaped++;
	}
}

void stub_reap_soon_locked(struct stub_device *d)
{
	uint64_t now = stub_now_ns();
	if (now - d->last_reap_ns < 1000000)
		return;
	d->last_reap_ns = now;
	stub_reap_locked(d);
}

struct stub_proc *stub_self_cached(struct stub_device *d)
{
	int idx = __atomic_load_n(&g_proc_idx, __ATOMIC_ACQUIRE);
	return idx >= 0 ? &d->procs[idx] : NULL;
}

struct stub_proc *stub_self_locked(struct stub_device *d)
{
	pid_t me = getpid();
	if (g_proc_pid == me && g_proc_idx >= 0 && d->procs[g_proc_idx].pid == (uint32_t)me)
		return &d->procs[g_proc_idx];
	int free_idx = -1;
	for (int i = 0; i < STUB_MAX_PROCS; i++) {
		if (d->procs[i].pid == (uint32_t)me) {
			free_idx = i;
			goto found;
		}
		if (d->procs[i].pid == 0 && free_idx < 0)
			free_idx = i;
	}
	if (free_idx < 0) {
		stub_reap_locked(d);
		for (int i = 0; i < STUB_MAX_PROCS && free_idx < 0; i++)
			if (d->procs[i].pid == 0)
				free_idx = i;
		if (free_idx < 0)
			return NULL;
	}
	memset(&d->procs[free_idx], 0, sizeof(d->procs[free_idx]));
	d->procs[free_idx].pid = (uint32_t)me;
	d->procs[free_idx].start_time = stub_proc_start_time(me);
	d->procs[free_idx].samples[0] = (struct stub_sample){stub_realtime_us(), stub_now_ns(), 0};
	d->procs[free_idx].samples_next = 1;
	d->procs[free_idx].samples_count = 1;
found:
	g_proc_pid = me;
	__atomic_store_n(&g_proc_idx, free_idx, __ATOMIC_RELEASE);
	return &d->procs[free_idx];
}

static const struct stub_sample *sample_at(const struct stub_proc *p, uint32_t age)
{
	return &p->samples[(p->samples_next + STUB_SAMPLES - 1 - age) % STUB_SAMPLES];
}

void stub_sample_locked(struct stub_device *d, uint64_t now)
{
	uint64_t ts = stub_realtime_us();
	for (int i = 0; i < STUB_MAX_PROCS; i++) {
		struct stub_proc *p = &d->procs[i];
		if (p->pid == 0 || (p->samples_count > 0 && now < sample_at(p, 0)->mono_ns + d->sample_ns))
			continue;
		p->samples[p->samples_next] =
		    (struct stub_sample){ts, now, __atomic_load_n(&p->sm_ns_total, __ATOMIC_RELAXED)};
		p->samples_next = (p->samples_next + 1) % STUB_SAMPLES;
		if (p->samples_count < STUB_SAMPLES)
			p->samples_count++;
	}
	if (now >= d->dev_sample_prev_ns + d->sample_ns) {
		uint64_t total = __atomic_load_n(&d->sm_ns_total, __ATOMIC_RELAXED);
		uint64_t span = (now - d->dev_sample_prev_ns) * d->sm_count;
		uint64_t pm = span ? (total - d->dev_sample_prev_sm_ns) * 1000 / span : 0;
		d->dev_sample_permille = (uint32_t)(pm > 1000 ? 1000 : pm);
		d->dev_sample_prev_sm_ns = total;
		d->dev_sample_prev_ns = now;
	}
}

int stub_proc_util_locked(const struct stub_device *d, const struct stub_proc *p, uint64_t last_seen_us,
                          uint32_t *permille, uint64_t *ts_us)
{
	if (p->pid == 0 || p->samples_count < 2)
		return 0;
	const struct stub_sample *newest = sample_at(p, 0);
	if (newest->ts_us <= last_seen_us)
		return 0;
	/* The window starts at the newest sample not newer than last_seen_us, else at the oldest held. */
	const struct stub_sample *base = sample_at(p, p->samples_count - 1);
	for (uint32_t age = 1; age < p->samples_count; age++)
		if (sample_at(p, age)->ts_us <= last_seen_us) {
			base = sample_at(p, age);
			break;
		}
	uint64_t span = (newest->mono_ns - base->mono_ns) * d->sm_count;
	if (span == 0)
		return 0;
	uint64_t pm = (newest->sm_ns - base->sm_ns) * 1000 / span;
	*permille = (uint32_t)(pm > 1000 ? 1000 : pm);
	*ts_us = newest->ts_us;
	return 1;
}
