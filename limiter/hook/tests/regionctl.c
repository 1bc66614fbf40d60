/*
 * regionctl: lays out one slice's directory the way the node agent does
 * (limiter/agent: quota/ and usage/ at mode 0755, usage/usage.bin initialized
 * at mode 0666, quota/quota.bin at generation 1), for the benchmark and the
 * GPU check, which run without Go. The Go tests use limiter/region instead.
 *
 *   regionctl DIR MEMORY_MIB COMPUTE_PERCENT COMPUTE_LIMIT_PERCENT [GPU_UUID]
 *
 * GPU_UUID, in NVML's "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" form, is
 * written as the slice's GPU (the hook warns about other devices).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpulimit_region.h"

static int put(const char *path, const void *buf, size_t n, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
	if (fd < 0 || write(fd, buf, n) != (ssize_t)n || fchmod(fd, mode) != 0 || close(fd) != 0) {
		fprintf(stderr, "regionctl: %s: %s\n", path, strerror(errno));
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 5 && argc != 6) {
		fprintf(stderr, "usage: regionctl DIR MEMORY_MIB COMPUTE_PERCENT COMPUTE_LIMIT_PERCENT [GPU_UUID]\n");
		return 2;
	}
	char path[4096];
	const char *subs[] = {"quota", "usage"};
	if (mkdir(argv[1], 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "regionctl: %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/%s", argv[1], subs[i]);
		if ((mkdir(path, 0755) != 0 && errno != EEXIST) || chmod(path, 0755) != 0) {
			fprintf(stderr, "regionctl: %s: %s\n", path, strerror(errno));
			return 1;
		}
	}
	static struct gpulimit_usage u;
	gpulimit_usage_init(&u);
	snprintf(path, sizeof(path), "%s/usage/usage.bin", argv[1]);
	if (put(path, &u, sizeof(u), 0666) != 0)
		return 1;
	struct gpulimit_quota q;
	memset(&q, 0, sizeof(q));
	q.magic = GPULIMIT_QUOTA_MAGIC;
	q.layout_version = GPULIMIT_LAYOUT_VERSION;
	q.generation = 1;
	snprintf(q.slice_id, sizeof(q.slice_id), "regionctl");
	q.memory_limit_bytes = strtoull(argv[2], NULL, 10) << 20;
	q.compute_percent = (uint32_t)strtoul(argv[3], NULL, 10);
	q.compute_limit_percent = (uint32_t)strtoul(argv[4], NULL, 10);
	if (argc == 6) {
		const char *u = argv[5];
		int n = 0;
		for (u += strncmp(u, "GPU-", 4) == 0 ? 4 : 0; *u && n < 32; u++) {
			if (*u == '-')
				continue;
			unsigned v;
			if (sscanf((char[]){*u, 0}, "%x", &v) != 1) {
				fprintf(stderr, "regionctl: bad GPU UUID %s\n", argv[5]);
				return 2;
			}
			q.gpu_uuid[n / 2] |= (uint8_t)(n % 2 ? v : v << 4);
			n++;
		}
	}
	q.checksum = gpulimit_fnv1a32(&q, offsetof(struct gpulimit_quota, checksum));
	snprintf(path, sizeof(path), "%s/quota/quota.bin", argv[1]);
	return put(path, &q, sizeof(q), 0644) != 0;
}
