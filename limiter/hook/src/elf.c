/*
 * elf.c: symbol lookup in a loaded object's own dynamic symbol table, by its
 * GNU hash table (DT_GNU_HASH) or its SysV one (DT_HASH), without dlsym.
 *
 * The hook needs it once: it interposes dlsym, dlvsym, dlopen and dlmopen,
 * and its own references to those names bind to its interposers
 * (-Bsymbolic), so the C library's dlsym is found here, in the C library's
 * table; everything else then comes from that dlsym. The test programs use
 * it too, to show what a program that reads the driver's table itself gets
 * (the driver's own functions: limiter/hook/README.md, "What user space
 * cannot close").
 *
 * The GNU hash layout (nbuckets, symoffset, bloom words, buckets, chain
 * words whose low bit ends a chain) is the one the GNU toolchain and glibc's
 * dl-lookup.c use; the SysV layout is the System V ABI's (gABI "Hash Table").
 */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

#include "hook.h"

/* Dynamic-section addresses are relocated in place by glibc on most targets, but not on all: accept both. */
static uintptr_t at(uintptr_t base, uintptr_t p)
{
	return p < base ? p + base : p;
}

static uint32_t gnu_hash(const char *s)
{
	uint32_t h = 5381;
	for (const unsigned char *c = (const unsigned char *)s; *c; c++)
		h = h * 33 + *c;
	return h;
}

static uint32_t sysv_hash(const char *s)
{
	uint32_t h = 0;
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		h = (h << 4) + *c;
		uint32_t g = h & 0xf0000000u;
		if (g)
			h ^= g >> 24;
		h &= ~g;
	}
	return h;
}

struct table {
	uintptr_t base;
	const ElfW(Sym) * sym;
	const char *str;
	const ElfW(Half) * versym;
};

/* match returns the address of symbol i if it is name, defined and the default version. */
static void *match(const struct table *t, uint32_t i, const char *name)
{
	const ElfW(Sym) *s = &t->sym[i];
	if (s->st_shndx == SHN_UNDEF || s->st_value == 0 || ELF64_ST_TYPE(s->st_info) == STT_GNU_IFUNC)
		return NULL;
	if (t->versym != NULL && (t->versym[i] & 0x8000) != 0) /* a hidden (non-default) version */
		return NULL;
	if (strcmp(t->str + s->st_name, name) != 0)
		return NULL;
	return (void *)(t->base + s->st_value);
}

void *elf_symbol(uintptr_t base, const void *dynamic, const char *name)
{
	const ElfW(Dyn) *dyn = dynamic;
	if (dyn == NULL || name == NULL)
		return NULL;
	struct table t = {.base = base};
	const uint32_t *gnu = NULL;
	const uint32_t *sysv = NULL;
	for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
		switch (d->d_tag) {
		case DT_SYMTAB:
			t.sym = (const ElfW(Sym) *)at(base, d->d_un.d_ptr);
			break;
		case DT_STRTAB:
			t.str = (const char *)at(base, d->d_un.d_ptr);
			break;
		case DT_VERSYM:
			t.versym = (const ElfW(Half) *)at(base, d->d_un.d_ptr);
			break;
		case DT_GNU_HASH:
			gnu = (const uint32_t *)at(base, d->d_un.d_ptr);
			break;
		case DT_HASH:
			sysv = (const uint32_t *)at(base, d->d_un.d_ptr);
			break;
		}
	}
	if (t.sym == NULL || t.str == NULL)
		return NULL;
	if (gnu != NULL) {
		uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_words = gnu[2];
		if (nbuckets == 0)
			return NULL;
		const ElfW(Addr) *bloom = (const ElfW(Addr) *)(const void *)&gnu[4];
		const uint32_t *buckets = (const uint32_t *)(const void *)&bloom[bloom_words];
		const uint32_t *chain = &buckets[nbuckets];
		uint32_t h = gnu_hash(name);
		uint32_t i = buckets[h % nbuckets];
		if (i < symoffset)
			return NULL;
		for (;; i++) {
			uint32_t c = chain[i - symoffset];
			if ((c | 1u) == (h | 1u)) {
				void *p = match(&t, i, name);
				if (p != NULL)
					return p;
			}
			if (c & 1u)
				return NULL;
		}
	}
	if (sysv != NULL) {
		uint32_t nbucket = sysv[0];
		if (nbucket == 0)
			return NULL;
		const uint32_t *bucket = &sysv[2], *chain = &bucket[nbucket];
		for (uint32_t i = bucket[sysv_hash(name) % nbucket]; i != STN_UNDEF; i = chain[i]) {
			void *p = match(&t, i, name);
			if (p != NULL)
				return p;
		}
	}
	return NULL;
}

int elf_needed(uintptr_t base, const void *dynamic, const char **out, int max)
{
	const ElfW(Dyn) *dyn = dynamic;
	const char *str = NULL;
	if (dyn == NULL)
		return 0;
	for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++)
		if (d->d_tag == DT_STRTAB)
			str = (const char *)at(base, d->d_un.d_ptr);
	if (str == NULL)
		return 0;
	int n = 0;
	for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL && n < max; d++)
		if (d->d_tag == DT_NEEDED)
			out[n++] = str + d->d_un.d_val;
	return n;
}

struct find {
	const char *prefix, *name;
	void *found;
};

static int find_in(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	struct find *f = data;
	const char *file = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
	file = file ? file + 1 : info->dlpi_name;
	if (file == NULL || strncmp(file, f->prefix, strlen(f->prefix)) != 0)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type != PT_DYNAMIC)
			continue;
		const void *dyn = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
		f->found = elf_symbol(info->dlpi_addr, dyn, f->name);
		return f->found != NULL;
	}
	return 0;
}

void *elf_loaded_symbol(const char *prefix, const char *name)
{
	struct find f = {prefix, name, NULL};
	dl_iterate_phdr(find_in, &f);
	return f.found;
}
