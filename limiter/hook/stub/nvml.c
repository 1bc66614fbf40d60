/*
 * nvml.c: stub libnvidia-ml.so.1 (test-only), reporting the shared simulated
 * device of stub.h the way NVML reports a real one. It exports every symbol
 * go-nvml looks up or calls at Init, plus the queries the hook and the node
 * agent use; see README.md for the list. Calling an NVML function the stub
 * does not export fails at symbol lookup, so extend the list before use.
 */
#define _GNU_SOURCE
#include "stub.h"

#include "nvml_subset.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int g_refs;
static char g_handle_token;
#define HANDLE ((nvmlDevice_t)&g_handle_token)

static struct stub_device *ready(nvmlDevice_t dev, nvmlReturn_t *r)
{
	if (__atomic_load_n(&g_refs, __ATOMIC_ACQUIRE) <= 0) {
		*r = NVML_ERROR_UNINITIALIZED;
		return NULL;
	}
	if (dev != HANDLE) {
		*r = NVML_ERROR_INVALID_ARGUMENT;
		return NULL;
	}
	struct stub_device *d = stub_dev();
	*r = d ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
	return d;
}

STUB_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
	if (stub_dev_refresh() == NULL)
		return NVML_ERROR_DRIVER_NOT_LOADED;
	__atomic_add_fetch(&g_refs, 1, __ATOMIC_ACQ_REL);
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlInit(void)
{
	return nvmlInit_v2();
}

STUB_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	return nvmlInit_v2();
}

STUB_EXPORT nvmlReturn_t nvmlShutdown(void)
{
	int n = __atomic_load_n(&g_refs, __ATOMIC_ACQUIRE);
	while (n > 0 && !__atomic_compare_exchange_n(&g_refs, &n, n - 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
	}
	return n > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

STUB_EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case NVML_SUCCESS:
		return "Success";
	case NVML_ERROR_UNINITIALIZED:
		return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT:
		return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED:
		return "Not Supported";
	case NVML_ERROR_NOT_FOUND:
		return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED:
		return "Driver Not Loaded";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
		return "Argument Version Mismatch";
	default:
		return "Unknown Error";
	}
}

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
	if (dst == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (strlen(src) + 1 > len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(dst, src, strlen(src) + 1);
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	return copy_str(version, length, "550.54.15");
}

STUB_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	return copy_str(version, length, "12.550.54.15");
}

STUB_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
	if (v == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*v = 12040;
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
	return nvmlSystemGetCudaDriverVersion(v);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
	if (__atomic_load_n(&g_refs, __ATOMIC_ACQUIRE) <= 0)
		return NVML_ERROR_UNINITIALIZED;
	if (n == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*n = 1;
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n)
{
	return nvmlDeviceGetCount_v2(n);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev)
{
	if (__atomic_load_n(&g_refs, __ATOMIC_ACQUIRE) <= 0)
		return NVML_ERROR_UNINITIALIZED;
	if (dev == NULL || index != 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	*dev = HANDLE;
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *dev)
{
	return nvmlDeviceGetHandleByIndex_v2(index, dev);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev)
{
	nvmlReturn_t r;
	struct stub_device *d = ready(HANDLE, &r);
	if (d == NULL)
		return r;
	if (uuid == NULL || dev == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	char mine[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	stub_format_uuid(d->uuid, mine, sizeof(mine));
	if (strcasecmp(uuid, mine) != 0)
		return NVML_ERROR_NOT_FOUND;
	*dev = HANDLE;
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index)
{
	nvmlReturn_t r;
	if (ready(dev, &r) == NULL)
		return r;
	if (index == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*index = 0;
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor)
{
	return nvmlDeviceGetIndex(dev, minor);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length)
{
	nvmlReturn_t r;
	struct stub_device *d = ready(dev, &r);
	if (d == NULL)
		return r;
	char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	stub_format_uuid(d->uuid, buf, sizeof(buf));
	return copy_str(uuid, length, buf);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length)
{
	nvmlReturn_t r;
	struct stub_device *d = ready(dev, &r);
	if (d == NULL)
		return r;
	return copy_str(name, length, d->name);
}

static void mem_locked(struct stub_device *d, unsigned long long *total, unsigned long long *used)
{
	stub_lock(d);
	stub_reap_locked(d);
	*total = d->total_bytes;
	*used = d->used_bytes;
	stub_unlock(d);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m)
{
	nvmlReturn_t r;
	struct stub_device *d = ready(dev, &r);
	if (d == NULL)
		return r;
	if (m == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	mem_locked(d, &m->total, &m->used);
	m->free = m->total - m->used;
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m)
{
	nvmlReturn_t r;
	struct stub_device *d = ready(dev, &r);
	if (d == NULL)
		return r;
	if (m == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (m->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	mem_locked(d, &m->total, &m->used);
	m->reserved = 0;
	m->free = m->total - m->used;
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t dev, nvmlDeviceAttributes_t *a)
{
	nvmlReturn_t r;
	struct stub_device *d = ready(dev, &r);
	if (d == NULL)
		return r;
	if (a == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(a, 0, sizeof(*a));
	a->multiprocessorCount = d->sm_count;
	a->memorySizeMB = d->total_bytes >> 20;
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u)
{
	nvmlReturn_t r;
	struct stub_device *d = ready(dev, &r);
	if (d == NULL)
		return r;
	if (u == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	stub_lock(d);
	stub_sample_locked(d, stub_now_ns());
	u->gpu = (d->dev_sample_permille + 5) / 10;
	u->memory = 0;
	stub_unlock(d);
	return NVML_SUCCESS;
}

/* running fills up to *count process infos via put; NVML's size protocol. */
static nvmlReturn_t running(nvmlDevice_t dev, unsigned int *count, void *infos,
                            void (*put)(void *infos, unsigned i, uint32_t pid, uint64_t mem))
{
	nvmlReturn_t r;
	struct stub_device *d = ready(dev, &r);
	if (d == NULL)
		return r;
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	stub_lock(d);
	stub_reap_locked(d);
	unsigned n = 0;
	for (int i = 0; i < STUB_MAX_PROCS; i++)
		if (d->procs[i].pid != 0)
			n++;
	if (n > *count || (infos == NULL && n > 0)) {
		*count = n;
		stub_unlock(d);
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	unsigned k = 0;
	for (int i = 0; i < STUB_MAX_PROCS; i++)
		if (d->procs[i].pid != 0)
			put(infos, k++, d->procs[i].pid + d->nvml_pid_offset, d->procs[i].mem_bytes);
	*count = k;
	stub_unlock(d);
	return NVML_SUCCESS;
}

static void put_v1(void *infos, unsigned i, uint32_t pid, uint64_t mem)
{
	nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
	p->pid = pid;
	p->usedGpuMemory = mem;
}

static void put_v2(void *infos, unsigned i, uint32_t pid, uint64_t mem)
{
	nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + i;
	p->pid = pid;
	p->usedGpuMemory = mem;
	p->gpuInstanceId = 0xFFFFFFFFu;
	p->computeInstanceId = 0xFFFFFFFFu;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned int *count,
                                                              nvmlProcessInfo_v1_t *infos)
{
	return running(dev, count, infos, put_v1);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned int *count,
                                                                 nvmlProcessInfo_v2_t *infos)
{
	return running(dev, count, infos, put_v2);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count,
                                                                 nvmlProcessInfo_t *infos)
{
	return running(dev, count, infos, put_v2);
}

/*
 * nvmlDeviceGetProcessUtilization: one entry per process with a sample newer
 * than lastSeen (microseconds), its SM use over the samples since lastSeen
 * (see stub.h). With utilization == NULL it reports the buffer size needed
 * and NVML_ERROR_INSUFFICIENT_SIZE, as NVML does; with no newer samples it
 * returns NVML_ERROR_NOT_FOUND.
 */
STUB_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *util,
                                                         unsigned int *count, unsigned long long lastSeen)
{
	nvmlReturn_t r;
	struct stub_device *d = ready(dev, &r);
	if (d == NULL)
		return r;
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	stub_lock(d);
	stub_reap_locked(d);
	stub_sample_locked(d, stub_now_ns());
	uint32_t pm;
	uint64_t ts;
	unsigned n = 0;
	for (int i = 0; i < STUB_MAX_PROCS; i++)
		n += stub_proc_util_locked(d, &d->procs[i], lastSeen, &pm, &ts);
	if (util == NULL || n > *count) {
		*count = n;
		stub_unlock(d);
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	unsigned k = 0;
	for (int i = 0; i < STUB_MAX_PROCS; i++) {
		struct stub_proc *p = &d->procs[i];
		if (!stub_proc_util_locked(d, p, lastSeen, &pm, &ts))
			continue;
		util[k].pid = p->pid + d->nvml_pid_offset;
		util[k].timeStamp = ts;
		util[k].smUtil = (pm + 5) / 10;
		util[k].memUtil = 0;
		util[k].encUtil = 0;
		util[k].decUtil = 0;
		k++;
	}
	*count = k;
	stub_unlock(d);
	return k ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
	nvmlReturn_t r;
	if (ready(dev, &r) == NULL)
		return r;
	if (pci == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(pci, 0, sizeof(*pci));
	pci->bus = 0x1b;
	pci->pciDeviceId = 0x233010de; /* H100 SXM5 80GB, NVIDIA vendor id */
	pci->pciSubSystemId = 0x16c110de;
	snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:1B:00.0");
	snprintf(pci->busId, sizeof(pci->busId), "00000000:1B:00.0");
	return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int *major, int *minor)
{
	nvmlReturn_t r;
	if (ready(dev, &r) == NULL)
		return r;
	if (major == NULL || minor == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*major = 9;
	*minor = 0;
	return NVML_SUCCESS;
}

/* The simulated device has no MIG. */
STUB_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending)
{
	nvmlReturn_t r;
	if (ready(dev, &r) == NULL)
		return r;
	(void)current, (void)pending;
	return NVML_ERROR_NOT_SUPPORTED;
}
