/*
 * nvml.c: NVML's memory query shows the slice, like cuMemGetInfo: total is
 * the limit, used is the slice's use on that device (all its processes),
 * free is limit - used saturating at zero. Other NVML calls are not touched.
 */
#include <stdio.h>
#include <string.h>

#include "hook.h"

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* parse_uuid reads NVML's "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" into 16 bytes. */
static int parse_uuid(const char *s, uint8_t out[GPULIMIT_UUID_BYTES])
{
	if (strncmp(s, "GPU-", 4) != 0)
		return -1;
	int n = 0;
	for (s += 4; *s != '\0'; s++) {
		if (*s == '-')
			continue;
		int v = hexval(*s);
		if (v < 0 || n >= 32)
			return -1;
		out[n / 2] = (uint8_t)(n % 2 ? (out[n / 2] | v) : (v << 4));
		n++;
	}
	return n == 32 ? 0 : -1;
}

void uuid_format(const uint8_t u[GPULIMIT_UUID_BYTES], char *out, size_t n)
{
	snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
	         u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* slice_view computes total/used/free for device; -1 if the device cannot be identified. */
static int slice_view(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
                      unsigned long long *free_b)
{
	const struct real_table *r = hook_real();
	char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	uint8_t uuid[GPULIMIT_UUID_BYTES];
	if (r->nvmlDeviceGetUUID == NULL || r->nvmlDeviceGetUUID(device, buf, sizeof(buf)) != NVML_SUCCESS ||
	    parse_uuid(buf, uuid) != 0)
		return -1;
	uint64_t limit = mem_limit_now();
	uint64_t u = usage_total(uuid);
	if (*total > limit)
		*total = limit;
	*used = u;
	*free_b = limit > u ? limit - u : 0;
	return 0;
}

GPULIMIT_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	const struct real_table *r = hook_real();
	if (r->nvmlDeviceGetMemoryInfo == NULL)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	nvmlReturn_t res = r->nvmlDeviceGetMemoryInfo(device, memory);
	if (res == NVML_SUCCESS)
		slice_view(device, &memory->total, &memory->used, &memory->free);
	return res;
}

GPULIMIT_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	const struct real_table *r = hook_real();
	if (r->nvmlDeviceGetMemoryInfo_v2 == NULL)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	nvmlReturn_t res = r->nvmlDeviceGetMemoryInfo_v2(device, memory);
	if (res == NVML_SUCCESS && slice_view(device, &memory->total, &memory->used, &memory->free) == 0)
		memory->reserved = 0; /* the slice has no driver reservation of its own */
	return res;
}
