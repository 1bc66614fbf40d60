/*
 * dispatch.c: how programs reach the hooks. Direct calls bind to the
 * exported symbols through LD_PRELOAD. Programs that look the driver up at
 * run time are caught in two places:
 *   - dlsym: the interposer returns the hook whenever the C library's dlsym
 *     would have returned exactly the driver function the hook wraps (the one
 *     in the dispatch table), whatever the handle. Everything else, including
 *     same-named symbols of other libraries, passes through unchanged.
 *     RTLD_NEXT is resolved relative to the caller, not to this library.
 *   - cuGetProcAddress (v1 and v2, which the CUDA runtime uses for every
 *     driver entry point, itself included): the driver's answer is replaced
 *     by the hook if it is the wrapped driver function; if the driver answers
 *     with another address for a hooked name, the hook whose base name,
 *     version (newest <= cudaVersion) and per-thread-stream flavour match is
 *     returned.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <string.h>

#include "hook.h"

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

/* hook_for returns the hook that replaces p, the address dlsym found for name, or NULL. */
static void *hook_for(const char *name, void *p)
{
	if (p == NULL || hook_in_init())
		return NULL;
	if (!(name[0] == 'c' && name[1] == 'u') && strncmp(name, "nvml", 4) != 0)
		return NULL;
	/* Only a hooked name resolves the driver: other programs' "cu..." lookups load nothing. */
	for (size_t i = 0; i < N_ENTRIES; i++) {
		if (strcmp(entries[i].name, name) != 0)
			continue;
		const struct real_table *r = hook_real_nowait();
		if (r != NULL)
			return real_of(r, &entries[i]) == p ? entries[i].hook : NULL;
		/*
		 * Another thread is loading the driver, maybe holding what this
		 * thread's caller needs: do not wait; judge p by the library it is in.
		 */
		Dl_info info;
		const char *lib = entries[i].lib == LIB_CUDA ? "libcuda.so" : "libnvidia-ml.so";
		if (dladdr(p, &info) == 0 || info.dli_fname == NULL)
			return NULL;
		const char *base = strrchr(info.dli_fname, '/');
		base = base ? base + 1 : info.dli_fname;
		return strncmp(base, lib, strlen(lib)) == 0 ? entries[i].hook : NULL;
	}
	return NULL;
}

/* next_after emulates RTLD_NEXT for the object containing caller. */
static void *next_after(const void *caller, const char *name)
{
	Dl_info info;
	struct link_map *lm = NULL;
	if (dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) == 0 || lm == NULL)
		return hook_real_dlsym(RTLD_NEXT, name);
	for (struct link_map *l = lm->l_next; l != NULL; l = l->l_next) {
		if (l->l_name == NULL || l->l_name[0] == '\0')
			continue;
		/* A link_map is not a valid handle for every object (the vDSO): get a real one. */
		void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
		if (h == NULL)
			continue;
		void *p = hook_real_dlsym(h, name);
		dlclose(h);
		if (p == NULL)
			continue;
		struct link_map *owner = NULL;
		Dl_info pi;
		/* dlsym on a handle searches its dependencies too: take p only if l itself defines it. */
		if (dladdr1(p, &pi, (void **)&owner, RTLD_DL_LINKMAP) != 0 && owner == l)
			return p;
	}
	return NULL;
}

GPULIMIT_EXPORT void *dlsym(void *handle, const char *name)
{
	if (handle == RTLD_NEXT)
		return next_after(__builtin_return_address(0), name);
	void *p = hook_real_dlsym(handle, name);
	void *h = hook_for(name, p);
	return h != NULL ? h : p;
}

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
