/*
 * dispatch.c: how programs reach the hooks, and the loader paths that could
 * reach the driver past them. Direct calls bind to the exported symbols
 * through LD_PRELOAD or /etc/ld.so.preload. Programs that look the driver up
 * at run time, or load it in unusual ways, are caught here:
 *   - dlsym and dlvsym: the interposer returns the hook whenever the C
 *     library's answer is exactly the driver function the hook wraps (the one
 *     in the dispatch table), whatever the handle, RTLD_NEXT included
 *     (resolved relative to the caller, not to this library). An answer from
 *     another copy of the driver (a second libcuda.so.1 or libnvidia-ml.so.1
 *     loaded from another path or under another name) is replaced by the
 *     canonical driver's function, or by the hook for a hooked name, so a copy
 *     is never used past the hook. Everything else, including same-named
 *     symbols of other libraries, passes through unchanged.
 *   - dlopen: RTLD_DEEPBIND is dropped. A library loaded deep-bound resolves
 *     its references in its own dependencies first, so one that links the
 *     driver would call it directly. The call reaches the C library as a
 *     sibling call, so glibc still sees the caller's return address (its
 *     RUNPATH, its namespace).
 *   - dlmopen into any namespace but the base one: refused (NULL, one message)
 *     when the new namespace holds the driver or NVML, directly or as a
 *     dependency; the preloaded hook is not in other namespaces.
 *   - cuGetProcAddress (v1 and v2, which the CUDA runtime uses for every
 *     driver entry point, itself included): the driver's answer is replaced
 *     by the hook if it is the wrapped driver function; if the driver answers
 *     with another address for a hooked name, the hook whose base name,
 *     version (newest <= cudaVersion) and per-thread-stream flavour match is
 *     returned.
 * What user space cannot close (the driver's table read by hand, raw ioctls,
 * a driver loaded later by a namespace's own dlopen) is listed in
 * ../README.md with the node agent's check that catches it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "hook.h"

/* ---- the C library's loader functions ---- */

static int find_dlsym(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	const char *file = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
	file = file ? file + 1 : info->dlpi_name;
	/* glibc >= 2.34 has dlsym in libc.so.6; older ones in libdl.so.2 (which libgpulimit links). */
	if (file == NULL || (strcmp(file, "libc.so.6") != 0 && strcmp(file, "libdl.so.2") != 0))
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
			void *p = elf_symbol(info->dlpi_addr,
			                     (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr), "dlsym");
			if (p != NULL) {
				*(void **)data = p;
				return 1;
			}
		}
	return 0;
}

/*
 * loader finds the C library's functions once. Racing threads compute the
 * same values; the first complete set is published.
 */
static const struct hook_loader *loader(void)
{
	struct hook_state *s = hook_state();
	if (__atomic_load_n(&s->loader_ready, __ATOMIC_ACQUIRE))
		return &s->loader;
	void *sym = NULL;
	dl_iterate_phdr(find_dlsym, &sym);
	if (sym == NULL)
		return &s->loader; /* all NULL: the interposers then answer NULL */
	struct hook_loader l;
	memcpy(&l.dlsym, &sym, sizeof(sym));
	/* RTLD_NEXT relative to this library: the definitions after it, the C library's. */
	void *p = l.dlsym(RTLD_NEXT, "dlvsym");
	memcpy(&l.dlvsym, &p, sizeof(p));
	p = l.dlsym(RTLD_NEXT, "dlopen");
	memcpy(&l.dlopen, &p, sizeof(p));
	p = l.dlsym(RTLD_NEXT, "dlmopen");
	memcpy(&l.dlmopen, &p, sizeof(p));
	__atomic_store_n(&s->loader.dlsym, l.dlsym, __ATOMIC_RELAXED);
	__atomic_store_n(&s->loader.dlvsym, l.dlvsym, __ATOMIC_RELAXED);
	__atomic_store_n(&s->loader.dlopen, l.dlopen, __ATOMIC_RELAXED);
	__atomic_store_n(&s->loader.dlmopen, l.dlmopen, __ATOMIC_RELAXED);
	__atomic_store_n(&s->loader_ready, 1, __ATOMIC_RELEASE);
	return &s->loader;
}

void *hook_real_dlsym(void *handle, const char *name)
{
	const struct hook_loader *l = loader();
	return l->dlsym ? l->dlsym(handle, name) : NULL;
}

void *hook_real_dlopen(const char *file, int mode)
{
	const struct hook_loader *l = loader();
	return l->dlopen ? l->dlopen(file, mode) : NULL;
}

/* ---- the hook table ---- */

struct hook_entry {
	const char *name;
	const char *base;
	int since;
	int ptsz;
	int lib;
	size_t real_off; /* offset of the driver's function in struct real_table */
	void *hook;
};

static const struct hook_entry entries[] = {
#define ENTRY_HOOK(lib, name, base, since, ptsz)                                                                       \
	{#name, base, since, ptsz, LIB_##lib, offsetof(struct real_table, name), (void *)&name},
#define ENTRY_CALL(lib, name)
    GPULIMIT_SYMBOLS(ENTRY_HOOK, ENTRY_CALL)
#undef ENTRY_HOOK
#undef ENTRY_CALL
};
#define N_ENTRIES (sizeof(entries) / sizeof(entries[0]))

static void *real_of(const struct real_table *r, const struct hook_entry *e)
{
	void *p;
	memcpy(&p, (const char *)r + e->real_off, sizeof(p));
	return p;
}

static const struct hook_entry *entry_named(const char *name)
{
	for (size_t i = 0; i < N_ENTRIES; i++)
		if (strcmp(entries[i].name, name) == 0)
			return &entries[i];
	return NULL;
}

static int driver_name(const char *name)
{
	return (name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0;
}

/* ---- which loaded objects are the driver ---- */

static const char *base_name(const char *path)
{
	const char *b = path ? strrchr(path, '/') : NULL;
	return b ? b + 1 : (path ? path : "");
}

/*
 * driver_lib tells whether object l is a CUDA driver (LIB_CUDA) or NVML
 * (LIB_NVML), by its file name or, for a copy under another name, by the
 * entry points every driver exports; -1 otherwise. libgpulimit itself
 * exports cuGetProcAddress and is not a driver.
 */
static int driver_lib(const struct link_map *l)
{
	static const char self_marker = 0;
	Dl_info self;
	struct link_map *self_map = NULL;
	if (dladdr1(&self_marker, &self, (void **)&self_map, RTLD_DL_LINKMAP) != 0 && self_map == l)
		return -1;
	const char *b = base_name(l->l_name);
	if (strncmp(b, "libcuda.so", 10) == 0)
		return LIB_CUDA;
	if (strncmp(b, "libnvidia-ml.so", 15) == 0)
		return LIB_NVML;
	if (elf_symbol(l->l_addr, l->l_ld, "cuGetProcAddress") != NULL)
		return LIB_CUDA;
	if (elf_symbol(l->l_addr, l->l_ld, "nvmlInit_v2") != NULL)
		return LIB_NVML;
	return -1;
}

static struct link_map *map_of_handle(void *h)
{
	struct link_map *lm = NULL;
	if (h == NULL || dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0)
		return NULL;
	return lm;
}

/* ---- dlsym and dlvsym ---- */

/* hook_for returns the hook that replaces p, the address dlsym found for name, or NULL. */
static void *hook_for(const char *name, void *p)
{
	const struct hook_entry *e = entry_named(name);
	if (e == NULL)
		return NULL;
	/* Only a hooked name resolves the driver: other programs' "cu..." lookups load nothing. */
	const struct real_table *r = hook_real_nowait();
	if (r != NULL)
		return real_of(r, e) == p ? e->hook : NULL;
	/*
	 * Another thread is loading the driver, maybe holding what this
	 * thread's caller needs: do not wait; judge p by the library it is in.
	 */
	Dl_info info;
	const char *lib = e->lib == LIB_CUDA ? "libcuda.so" : "libnvidia-ml.so";
	if (dladdr(p, &info) == 0 || info.dli_fname == NULL)
		return NULL;
	return strncmp(base_name(info.dli_fname), lib, strlen(lib)) == 0 ? e->hook : NULL;
}

/*
 * from_copy replaces p, found for name in a second copy of the driver, by the
 * canonical driver's answer (the hook for a hooked name). NULL: p is not in a
 * copy.
 */
static void *from_copy(const char *name, void *p)
{
	Dl_info info;
	struct link_map *lm = NULL;
	if (dladdr1(p, &info, (void **)&lm, RTLD_DL_LINKMAP) == 0 || lm == NULL)
		return NULL;
	int lib = driver_lib(lm);
	if (lib < 0)
		return NULL;
	const struct real_table *r = hook_real_nowait();
	struct hook_state *s = hook_state();
	if (r == NULL)
		return NULL; /* resolving: the next lookup decides */
	void *canonical = lib == LIB_CUDA ? s->cuda_lib : s->nvml_lib;
	if (canonical != NULL && map_of_handle(canonical) == lm)
		return NULL; /* the canonical driver's own function */
	const struct hook_entry *e = entry_named(name);
	if (e != NULL)
		return e->hook;
	hook_log(HOOK_LOG_INFO, "%s from %s answered by the canonical driver", name, info.dli_fname);
	return canonical ? hook_real_dlsym(canonical, name) : NULL;
}

/* redirect is what dlsym and dlvsym hand out for name when the C library found p. */
static void *redirect(const char *name, void *p)
{
	if (p == NULL || name == NULL || hook_in_init() || !driver_name(name))
		return p;
	void *h = hook_for(name, p);
	if (h != NULL)
		return h;
	void *c = from_copy(name, p);
	return c != NULL ? c : p;
}

/* defined_in returns name's definition in the loaded object called file if it is not in skip; NULL otherwise. */
static void *defined_in(const char *file, const char *name, const char *version, const struct link_map *skip,
                        const struct link_map *only)
{
	const struct hook_loader *ld = loader();
	/* A link_map is not a valid handle for every object (the vDSO): get a real one. */
	void *h = hook_real_dlopen(file, RTLD_LAZY | RTLD_NOLOAD);
	if (h == NULL)
		return NULL;
	void *p = version ? ld->dlvsym(h, name, version) : ld->dlsym(h, name);
	dlclose(h);
	struct link_map *owner = NULL;
	Dl_info pi;
	if (p == NULL || dladdr1(p, &pi, (void **)&owner, RTLD_DL_LINKMAP) == 0 || owner == skip ||
	    (only != NULL && owner != only))
		return NULL;
	return p;
}

/*
 * next_after emulates RTLD_NEXT for the object containing caller: the
 * objects loaded after it, in load order (where glibc searches for an object
 * of the global scope); failing that, the caller's own dependencies in
 * DT_NEEDED order (its local scope, where glibc searches for an object loaded
 * by dlopen).
 */
static void *next_after(const void *caller, const char *name, const char *version)
{
	const struct hook_loader *ld = loader();
	Dl_info info;
	struct link_map *lm = NULL;
	if (dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) == 0 || lm == NULL)
		return version ? ld->dlvsym(RTLD_NEXT, name, version) : ld->dlsym(RTLD_NEXT, name);
	for (struct link_map *l = lm->l_next; l != NULL; l = l->l_next) {
		if (l->l_name == NULL || l->l_name[0] == '\0')
			continue;
		/* dlsym on a handle searches its dependencies too: take p only if l itself defines it. */
		void *p = defined_in(l->l_name, name, version, NULL, l);
		if (p != NULL)
			return p;
	}
	const char *needed[64];
	int n = elf_needed(lm->l_addr, lm->l_ld, needed, 64);
	for (int i = 0; i < n; i++) {
		void *p = defined_in(needed[i], name, version, lm, NULL);
		if (p != NULL)
			return p;
	}
	return NULL;
}

GPULIMIT_EXPORT void *dlsym(void *handle, const char *name)
{
	if (handle == RTLD_NEXT)
		return redirect(name, next_after(__builtin_return_address(0), name, NULL));
	return redirect(name, hook_real_dlsym(handle, name));
}

GPULIMIT_EXPORT void *dlvsym(void *handle, const char *name, const char *version)
{
	const struct hook_loader *l = loader();
	if (l->dlvsym == NULL)
		return NULL;
	if (handle == RTLD_NEXT)
		return redirect(name, next_after(__builtin_return_address(0), name, version));
	return redirect(name, l->dlvsym(handle, name, version));
}

/* ---- dlopen and dlmopen ---- */

GPULIMIT_EXPORT void *dlopen(const char *file, int mode)
{
	void *(*real)(const char *, int) = loader()->dlopen;
	if (real == NULL)
		return NULL;
	if (mode & RTLD_DEEPBIND) {
		hook_log(HOOK_LOG_INFO, "dlopen(%s): RTLD_DEEPBIND dropped (a deep-bound library would call the GPU "
		                        "driver past the slice's limiter)",
		         file ? file : "NULL");
		mode &= ~RTLD_DEEPBIND;
	}
	return real(file, mode); /* a sibling call: glibc sees the caller's return address */
}

/* namespace_driver returns the file name of a driver object in h's namespace, or NULL. */
static const char *namespace_driver(void *h)
{
	struct link_map *l = map_of_handle(h);
	if (l == NULL)
		return NULL;
	while (l->l_prev != NULL)
		l = l->l_prev;
	for (; l != NULL; l = l->l_next)
		if (driver_lib(l) >= 0)
			return l->l_name;
	return NULL;
}

GPULIMIT_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode)
{
	void *(*real)(Lmid_t, const char *, int) = loader()->dlmopen; /* Lmid_t is long */
	if (real == NULL)
		return NULL;
	if (lmid == LM_ID_BASE)
		return real(lmid, file, mode & ~RTLD_DEEPBIND); /* the base namespace has the hook */
	void *h = real(lmid, file, mode);
	if (h == NULL)
		return NULL;
	const char *drv = namespace_driver(h);
	if (drv == NULL)
		return h;
	char name[256];
	snprintf(name, sizeof(name), "%s", drv);
	dlclose(h);
	hook_log(HOOK_LOG_ERROR,
	         "dlmopen(%s) refused: it loads the GPU driver (%s) into a separate link-map namespace, out of reach "
	         "of the slice's limiter; load it with dlopen instead",
	         file ? file : "NULL", name);
	return NULL;
}

/* ---- cuGetProcAddress ---- */

/* procaddr_hook picks the hook for the driver's answer p to cuGetProcAddress(symbol, cudaVersion, flags). */
static void *procaddr_hook(const char *symbol, void *p, int cuda_version, cuuint64_t flags)
{
	const struct real_table *r = hook_real();
	int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	const struct hook_entry *best = NULL;
	for (size_t i = 0; i < N_ENTRIES; i++) {
		const struct hook_entry *e = &entries[i];
		if (e->lib != LIB_CUDA || strcmp(e->base, symbol) != 0)
			continue;
		if (real_of(r, e) == p)
			return e->hook;
		if (e->since > cuda_version || (e->ptsz && !want_ptsz))
			continue;
		if (best == NULL || e->since > best->since || (e->since == best->since && e->ptsz))
			best = e;
	}
	return best != NULL ? best->hook : p;
}

GPULIMIT_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult *status)
{
	const struct real_table *r = hook_real();
	if (r->cuGetProcAddress_v2 == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, status);
	if (res == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
		*pfn = procaddr_hook(symbol, *pfn, cudaVersion, flags);
	return res;
}

GPULIMIT_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	const struct real_table *r = hook_real();
	if (r->cuGetProcAddress == NULL)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult res = r->cuGetProcAddress(symbol, pfn, cudaVersion, flags);
	if (res == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
		*pfn = procaddr_hook(symbol, *pfn, cudaVersion, flags);
	return res;
}
