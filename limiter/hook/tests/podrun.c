/*
 * podrun: runs a program the way a notebook pod runs it, as far as the hook
 * can tell: in its own mount namespace, with a slice's quota directory
 * mounted read-only and its usage directory read-write at the fixed in-pod
 * paths (GPULIMIT_QUOTA_FILE, GPULIMIT_USAGE_FILE), and without any
 * capability, as the pod's container runs (so a root "tenant" cannot remount
 * or override permissions). The hook tests run the production libgpulimit.so
 * under it: the library has no variable for other paths, so there is nothing
 * else to point it at a test's files.
 *
 *   podrun [-q QUOTA_DIR] [-u USAGE_DIR] [-U UID] PROGRAM [ARGS...]
 *
 * The directory that holds the fixed paths (the real path of /var/run, /run
 * on most systems) is covered with an empty tmpfs in the new namespace. With
 * -U the program runs as that uid and gid (a tenant that is not root); else
 * as uid 0 without capabilities. Run as root, podrun unshares the mount
 * namespace directly; otherwise it first enters a new user namespace
 * (unprivileged user namespaces), where -U is not available. Exits 126 with a
 * message when the namespace cannot be set up.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/capability.h>

#include "gpulimit_region.h"

static void die(const char *what)
{
	fprintf(stderr, "podrun: %s: %s\n", what, strerror(errno));
	exit(126);
}

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
		die(path);
	close(fd);
}

/* dir_of copies the directory part of path into out. */
static void dir_of(const char *path, char *out, size_t n)
{
	snprintf(out, n, "%s", path);
	char *slash = strrchr(out, '/');
	if (slash != NULL)
		*slash = '\0';
}

static void bind(const char *from, const char *to, int ro)
{
	if (mkdir(to, 0755) != 0 && errno != EEXIST)
		die(to);
	if (mount(from, to, NULL, MS_BIND, NULL) != 0)
		die(from);
	if (ro && mount(NULL, to, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) != 0)
		die("read-only remount");
}

int main(int argc, char **argv)
{
	const char *quota = NULL, *usage = NULL;
	long uid = -1;
	int opt;
	while ((opt = getopt(argc, argv, "+q:u:U:")) != -1) {
		switch (opt) {
		case 'q':
			quota = optarg;
			break;
		case 'u':
			usage = optarg;
			break;
		case 'U':
			uid = strtol(optarg, NULL, 10);
			break;
		default:
			fprintf(stderr, "usage: podrun [-q QUOTA_DIR] [-u USAGE_DIR] [-U UID] PROGRAM [ARGS...]\n");
			return 126;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "podrun: no program\n");
		return 126;
	}
	uid_t me = geteuid();
	gid_t mygid = getegid();
	if (me == 0) {
		if (unshare(CLONE_NEWNS) != 0)
			die("unshare mount namespace");
	} else {
		if (uid >= 0) {
			fprintf(stderr, "podrun: -U needs root\n");
			return 126;
		}
		if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
			die("unshare user and mount namespaces");
		char map[64];
		write_file("/proc/self/setgroups", "deny");
		snprintf(map, sizeof(map), "0 %u 1", (unsigned)me);
		write_file("/proc/self/uid_map", map);
		snprintf(map, sizeof(map), "0 %u 1", (unsigned)mygid);
		write_file("/proc/self/gid_map", map);
	}
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		die("make mounts private");

	/* GPULIMIT_QUOTA_FILE is <run>/gpubroker/quota/quota.bin; cover <run>. */
	char quota_dir[PATH_MAX], usage_dir[PATH_MAX], top[PATH_MAX], run[PATH_MAX];
	dir_of(GPULIMIT_QUOTA_FILE, quota_dir, sizeof(quota_dir));
	dir_of(GPULIMIT_USAGE_FILE, usage_dir, sizeof(usage_dir));
	dir_of(quota_dir, top, sizeof(top));
	dir_of(top, run, sizeof(run));
	char real_run[PATH_MAX];
	if (realpath(run, real_run) == NULL)
		die(run);
	if (mount("tmpfs", real_run, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755") != 0)
		die("tmpfs");
	if (mkdir(top, 0755) != 0)
		die(top);
	if (quota != NULL)
		bind(quota, quota_dir, 1);
	if (usage != NULL)
		bind(usage, usage_dir, 0);

	if (uid >= 0) {
		if (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0)
			die("drop to the tenant's uid");
	}
	/* No capabilities, now or after exec (the bounding set goes first, while CAP_SETPCAP is still held). */
	for (int cap = 0; cap <= 63; cap++)
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL && errno != EPERM)
			die("drop the capability bounding set");
	prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct data[2];
	memset(data, 0, sizeof(data));
	if (syscall(SYS_capset, &hdr, data) != 0)
		die("drop capabilities");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		die("no new privileges");
	execvp(argv[optind], &argv[optind]);
	die(argv[optind]);
}
