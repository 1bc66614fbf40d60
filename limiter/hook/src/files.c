/*
 * files.c: opening the two region files without trusting what is at their
 * paths. A notebook user cannot write the quota directory and, unless root,
 * cannot write the usage directory, but what is there may still be anything
 * (root in the container, a host-side mistake): a FIFO would block open(2)
 * forever in every process of the pod (the hook is in /etc/ld.so.preload),
 * a symbolic link would redirect the hook, a directory or a short file would
 * be misread. So every open is non-blocking, never follows a final symbolic
 * link, and is used only for a regular file of exactly the expected size;
 * everything else is refused with a reason (the callers fail closed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "hook.h"

const char *file_kind(unsigned int mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
		return "a regular file";
	case S_IFDIR:
		return "a directory";
	case S_IFIFO:
		return "a FIFO";
	case S_IFSOCK:
		return "a socket";
	case S_IFCHR:
		return "a character device";
	case S_IFBLK:
		return "a block device";
	case S_IFLNK:
		return "a symbolic link";
	}
	return "a file of unknown type";
}

int region_open(const char *path, int rw, size_t size, int need_ro, struct stat *st, char *why, size_t n)
{
	struct stat pre;
	if (lstat(path, &pre) != 0) {
		if (errno == ENOENT)
			return REGION_MISSING;
		snprintf(why, n, "cannot be examined: %s", strerror(errno));
		return -1;
	}
	if (!S_ISREG(pre.st_mode)) { /* refused without opening it: a FIFO's open could block */
		snprintf(why, n, "is %s, not a regular file", file_kind(pre.st_mode));
		return -1;
	}
	int fd = open(path, (rw ? O_RDWR : O_RDONLY) | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		int e = errno;
		if (e == ENOENT)
			return REGION_MISSING;
		if (e == ELOOP)
			snprintf(why, n, "is a symbolic link, which is never followed");
		else if (e == ENXIO)
			snprintf(why, n, "is a FIFO or socket, not a regular file");
		else
			snprintf(why, n, "cannot be opened: %s", strerror(e));
		return -1;
	}
	/* Replaced between lstat and open: judge what was opened. */
	if (fstat(fd, st) != 0) {
		snprintf(why, n, "cannot be examined: %s", strerror(errno));
		close(fd);
		return -1;
	}
	if (!S_ISREG(st->st_mode)) {
		snprintf(why, n, "is %s, not a regular file", file_kind(st->st_mode));
		close(fd);
		return -1;
	}
	if ((uint64_t)st->st_size != (uint64_t)size) {
		snprintf(why, n, "has %lld bytes, not %zu", (long long)st->st_size, size);
		close(fd);
		return -1;
	}
	struct statvfs vfs;
	if (need_ro && (fstatvfs(fd, &vfs) != 0 || (vfs.f_flag & ST_RDONLY) == 0)) {
		snprintf(why, n, "is not on a read-only mount (the pod mounts the quota directory read-only)");
		close(fd);
		return -1;
	}
	return fd;
}
