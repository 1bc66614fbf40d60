/*
 * pace.c: the compute share. A slice-wide token bucket, denominated in thread
 * blocks and kept in the usage region header so that every process of the
 * slice draws from it, paces kernel launches; a feedback controller sets the
 * bucket's refill rate from the SM utilization NVML measures.
 *
 * Where the idea comes from: GaiaGPU (Gu et al., "GaiaGPU: Sharing GPUs in
 * Container Clouds", ISPA 2018) and its implementation tkestack/vcuda-controller
 * pace launches with a token bucket of thread blocks whose refill is adjusted
 * from nvmlDeviceGetProcessUtilization; HAMi-core inherited the scheme. Their
 * controller adds to the bucket an increment computed from the utilization
 * error with fixed constants (a scale factor and a minimum step), so how
 * quickly and how tightly it binds depends on the device's size and the
 * kernels' shape; public reports show caps that barely bind on large GPUs.
 * Here the update is multiplicative, rate *= 1 + GAIN * (target/measured - 1):
 * a ratio has no unit, so the gain is normalized to the device size by
 * construction, and the starting rate scales with the SM count.
 *
 * Algorithm (all shared state is in struct gpulimit_usage, lock-free):
 *   - Each launch subtracts its grid size (blocks, Q10 fixed point) from
 *     pace_tokens_q10. A non-negative balance launches at once.
 *   - In debt, the launch refills the bucket (rate x elapsed time, capped at
 *     PACE_BUCKET_MS of rate; one process wins each refill by compare-and-swap
 *     on pace_refill_ns) and sleeps until the debt would be repaid, in steps of
 *     at most PACE_SLEEP_NS and PACE_MAX_WAIT_NS in all: a launch is never
 *     held longer, whatever the quota says (no unbounded wait).
 *   - Every PACE_PERIOD_NS one launch (winner of a compare-and-swap on
 *     pace_next_control_ns) runs the controller. It takes the slice's share u
 *     and the device's use U from a new node-agent sample in the usage header
 *     if the agent publishes fresh ones (it sees host pids), else from the
 *     NVML per-process samples newer than the last it consumed, summing
 *     smUtil over the slice's live pids (u) and over all pids (U); if NVML
 *     lists none of the slice's pids (pid namespace) it has no measurement.
 *     With a measurement it sets the target
 *       T = g                                 if limit L == guarantee g
 *       T = clamp(u + (1000 - U) - MARGIN, g, L) otherwise
 *     in per mille: a slice may burst into the room the card leaves, and
 *     backs off toward its guarantee by MARGIN per period while the card is
 *     full, so a slice below its own guarantee gets room back (the burster
 *     cannot know the others' guarantees; it yields until the card has
 *     MARGIN free). If the slice was held back by the bucket (it waited and
 *     launched at least BOUND_FRACTION of the blocks the rate allowed since
 *     the last run) or is above T,
 *     rate *= 1 + GAIN * (clamp(T/u, RATIO_MIN, RATIO_MAX) - 1). A slice
 *     under T that the bucket did not bound keeps its rate (no wind-up): a
 *     launcher stalled on the CPU also waits around the stall and measures
 *     low, and a rate raised then would burst past the share afterwards.
 *   - Start: rate = T x SMs x (1 block per PACE_INIT_BLOCK_NS per SM): it
 *     assumes 100 us blocks, then converges in a few periods.
 *   - Without a measurement (no NVML, or NVML cannot see the slice's pids,
 *     and no agent samples) the rate stays where it is, at first its start
 *     value: pacing still bounds the slice, but not to an exact share.
 * A slice with guarantee and limit both 100 % is not paced; launches are
 * only counted.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "hook.h"

#define PACE_PERIOD_NS       (50ull * 1000 * 1000)
#define PACE_MAX_WAIT_NS     (200ull * 1000 * 1000)
#define PACE_SLEEP_NS        (2ull * 1000 * 1000)
#define PACE_BUCKET_MS       10u
#define PACE_INIT_BLOCK_NS   100000u
#define PACE_MARGIN_PERMILLE 50u
#define PACE_GAIN            0.7
#define PACE_RATIO_MIN       0.1
#define PACE_RATIO_MAX       2.0
#define PACE_MAX_PIDS        GPULIMIT_USAGE_SLOTS
#define PACE_AGENT_FRESH_NS  (500ull * 1000 * 1000)
#define PACE_BOUND_FRACTION  0.8

uint32_t pace_sm_count(void)
{
	struct hook_state *s = hook_state();
	uint32_t n = __atomic_load_n(&s->pace_sm_count, __ATOMIC_ACQUIRE);
	if (n != 0)
		return n;
	const struct real_table *r = hook_real();
	CUdevice dev;
	int sms = 0;
	if (r->cuCtxGetDevice && r->cuCtxGetDevice(&dev) == CUDA_SUCCESS && r->cuDeviceGetAttribute &&
	    r->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) == CUDA_SUCCESS && sms > 0) {
		__atomic_store_n(&s->pace_sm_count, (uint32_t)sms, __ATOMIC_RELEASE);
		return (uint32_t)sms;
	}
	return 1;
}

/* pace_device finds the SM count and the NVML handle of the current device, once per process. */
static int pace_device(void)
{
	struct hook_state *s = hook_state();
	int ready = __atomic_load_n(&s->pace_ready, __ATOMIC_ACQUIRE);
	if (ready != 0)
		return ready;
	pthread_mutex_lock(&s->pace_lock);
	if (s->pace_ready != 0) {
		pthread_mutex_unlock(&s->pace_lock);
		return s->pace_ready;
	}
	const struct real_table *r = hook_real();
	CUdevice dev;
	int sms = 0;
	uint8_t uuid[GPULIMIT_UUID_BYTES];
	int result = -1;
	if (r->cuCtxGetDevice && r->cuCtxGetDevice(&dev) == CUDA_SUCCESS && r->cuDeviceGetAttribute &&
	    r->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) == CUDA_SUCCESS && sms > 0 &&
	    device_uuid_of(dev, uuid) == 0) {
		s->pace_sm_count = (uint32_t)sms;
		char name[64];
		uuid_format(uuid, name, sizeof(name));
		if (r->nvmlInit_v2 && r->nvmlDeviceGetHandleByUUID && r->nvmlDeviceGetProcessUtilization &&
		    r->nvmlInit_v2() == NVML_SUCCESS &&
		    r->nvmlDeviceGetHandleByUUID(name, &s->pace_nvml_dev) == NVML_SUCCESS)
			result = 1;
		else
			hook_log(HOOK_LOG_WARN, "NVML unavailable for %s: compute pacing runs without feedback", name);
		struct gpulimit_usage *region = __atomic_load_n(&s->usage, __ATOMIC_ACQUIRE);
		if (region)
			__atomic_store_n(&region->pace_sm_count, (uint32_t)sms, __ATOMIC_RELAXED);
	}
	if (s->pace_sm_count == 0)
		s->pace_sm_count = 1;
	__atomic_store_n(&s->pace_ready, result == 1 ? 1 : -1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&s->pace_lock);
	return result;
}

/*
 * agent_sample reads the node agent's sample from the usage header: 1 = a new
 * one (consumed), 0 = a fresh one already consumed, -1 = none fresh.
 */
static int agent_sample(struct gpulimit_usage *u, uint32_t *slice_pm, uint32_t *device_pm)
{
	uint64_t t1 = __atomic_load_n(&u->agent_sample_ns, __ATOMIC_ACQUIRE);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	if (t1 == 0 || t1 > now + PACE_AGENT_FRESH_NS || now - t1 > PACE_AGENT_FRESH_NS)
		return -1;
	if (t1 <= __atomic_load_n(&u->ctl_agent_seen_ns, __ATOMIC_RELAXED))
		return 0;
	uint32_t sp = __atomic_load_n(&u->agent_util_permille, __ATOMIC_ACQUIRE);
	uint32_t dp = __atomic_load_n(&u->agent_device_util_permille, __ATOMIC_ACQUIRE);
	if (__atomic_load_n(&u->agent_sample_ns, __ATOMIC_ACQUIRE) != t1)
		return 0; /* being rewritten; next period */
	__atomic_store_n(&u->ctl_agent_seen_ns, t1, __ATOMIC_RELAXED);
	*slice_pm = sp > 1000 ? 1000 : sp;
	*device_pm = dp > 1000 ? 1000 : dp;
	return 1;
}

/*
 * measure fills the slice's and the device's SM use in per mille: from a new
 * agent sample if the agent publishes fresh ones, else from NVML samples newer
 * than the last consumed. -1 = nothing new (the rate is left alone).
 */
static int measure(struct gpulimit_usage *u, int have_nvml, uint32_t *slice_pm, uint32_t *device_pm)
{
	struct hook_state *s = hook_state();
	const struct real_table *r = hook_real();
	int agent = agent_sample(u, slice_pm, device_pm);
	if (agent >= 0)
		return agent == 1 ? 0 : -1;
	if (have_nvml <= 0)
		return -1;
	nvmlProcessUtilizationSample_t samples[PACE_MAX_PIDS * 2];
	unsigned int n = sizeof(samples) / sizeof(samples[0]);
	unsigned long long seen = __atomic_load_n(&u->ctl_nvml_seen_us, __ATOMIC_RELAXED);
	if (r->nvmlDeviceGetProcessUtilization(s->pace_nvml_dev, samples, &n, seen) != NVML_SUCCESS || n == 0)
		return -1;
	uint32_t pids[PACE_MAX_PIDS];
	int np = usage_pids(pids, PACE_MAX_PIDS);
	uint32_t mine = 0, all = 0;
	int visible = 0;
	unsigned long long newest = seen;
	for (unsigned i = 0; i < n; i++) {
		all += samples[i].smUtil;
		for (int k = 0; k < np; k++)
			if (pids[k] == samples[i].pid) {
				mine += samples[i].smUtil;
				visible = 1;
			}
		if (samples[i].timeStamp > newest)
			newest = samples[i].timeStamp;
	}
	__atomic_store_n(&u->ctl_nvml_seen_us, newest, __ATOMIC_RELAXED);
	if (!visible) {
		/* NVML sees other pids than ours (a pid namespace): its figures cannot steer this slice. */
		if (!__atomic_exchange_n(&s->pace_invisible_logged, 1, __ATOMIC_RELAXED))
			hook_log(HOOK_LOG_WARN, "NVML does not report this slice's processes (pid namespace?): compute "
			                        "pacing follows the agent's samples, or its start rate without them");
		return -1;
	}
	*slice_pm = mine * 10 > 1000 ? 1000 : mine * 10;
	*device_pm = all * 10 > 1000 ? 1000 : all * 10;
	return 0;
}

static uint32_t target_permille(uint32_t slice_pm, uint32_t device_pm)
{
	struct hook_state *s = hook_state();
	uint32_t g = __atomic_load_n(&s->q_compute_percent, __ATOMIC_ACQUIRE) * 10;
	uint32_t l = __atomic_load_n(&s->q_compute_limit_percent, __ATOMIC_ACQUIRE) * 10;
	if (l <= g)
		return g;
	int64_t room = 1000 - (int64_t)(device_pm < 1000 ? device_pm : 1000);
	int64_t t = (int64_t)slice_pm + room - PACE_MARGIN_PERMILLE;
	return t < (int64_t)g ? g : (t > (int64_t)l ? l : (uint32_t)t);
}

static uint64_t start_rate(uint32_t target_pm)
{
	/* blocks per ms at the target share if each block takes PACE_INIT_BLOCK_NS of one SM; Q10. */
	uint64_t sms = hook_state()->pace_sm_count;
	uint64_t r = ((uint64_t)target_pm * sms * (1000000ull / PACE_INIT_BLOCK_NS) << 10) / 1000;
	return r ? r : 1;
}

/*
 * bound reports whether the bucket was what limited the slice over the last
 * period: it launched at least PACE_BOUND_FRACTION of the blocks the rate
 * allowed in elapsed ns. A slice whose launcher was descheduled (a loaded
 * CPU, a stopped process) also waited for tokens around the stall, and its
 * measured share is low, yet raising its rate then would only let it burst
 * past its share once it runs again (integral wind-up); the rate is raised
 * only when it was the limit.
 */
static int bound(uint64_t rate_q10_per_ms, uint64_t blocks, uint64_t elapsed_ns)
{
	if (elapsed_ns == 0 || elapsed_ns > 10 * PACE_PERIOD_NS)
		return 0;
	double allowed = (double)rate_q10_per_ms / 1024.0 * (double)elapsed_ns / 1e6;
	return (double)blocks >= PACE_BOUND_FRACTION * allowed;
}

static void control(struct gpulimit_usage *u, int have_nvml)
{
	uint64_t next = __atomic_load_n(&u->pace_next_control_ns, __ATOMIC_ACQUIRE);
	uint64_t now = hook_now_ns();
	if (now < next || !__atomic_compare_exchange_n(&u->pace_next_control_ns, &next, now + PACE_PERIOD_NS, 0,
	                                               __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		return;
	uint64_t blocks = __atomic_load_n(&u->pace_blocks_total, __ATOMIC_RELAXED);
	uint64_t waited = __atomic_load_n(&u->pace_wait_ns_total, __ATOMIC_RELAXED);
	uint64_t rate = __atomic_load_n(&u->pace_rate_q10_per_ms, __ATOMIC_RELAXED);
	uint32_t slice_pm = 0, device_pm = 0;
	int fresh = measure(u, have_nvml, &slice_pm, &device_pm) == 0;
	uint32_t target = target_permille(fresh ? slice_pm : 0, fresh ? device_pm : 0);
	if (rate == 0) {
		rate = start_rate(target);
	} else if (fresh) {
		int held = waited > __atomic_load_n(&u->ctl_wait_ns_prev, __ATOMIC_RELAXED) &&
		           bound(rate, blocks - __atomic_load_n(&u->ctl_blocks_prev, __ATOMIC_RELAXED),
		                 now - __atomic_load_n(&u->ctl_run_ns_prev, __ATOMIC_RELAXED));
		if (slice_pm > 0 && (held || slice_pm > target)) {
			double ratio = (double)target / slice_pm;
			ratio =
			    ratio < PACE_RATIO_MIN ? PACE_RATIO_MIN : (ratio > PACE_RATIO_MAX ? PACE_RATIO_MAX : ratio);
			double next_rate = (double)rate * (1.0 + PACE_GAIN * (ratio - 1.0));
			rate = next_rate < 1.0 ? 1 : (next_rate > 1e18 ? (uint64_t)1e18 : (uint64_t)next_rate);
		} else if (slice_pm == 0 && held) {
			rate = rate > (uint64_t)1e17 ? rate : rate * 2; /* held back yet invisible: open up */
		}
		__atomic_store_n(&u->pace_util_permille, slice_pm, __ATOMIC_RELAXED);
		__atomic_store_n(&u->pace_device_util_permille, device_pm, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&u->pace_target_permille, target, __ATOMIC_RELAXED);
	__atomic_store_n(&u->pace_rate_q10_per_ms, rate, __ATOMIC_RELEASE);
	__atomic_store_n(&u->ctl_blocks_prev, blocks, __ATOMIC_RELAXED);
	__atomic_store_n(&u->ctl_wait_ns_prev, waited, __ATOMIC_RELAXED);
	__atomic_store_n(&u->ctl_run_ns_prev, now, __ATOMIC_RELAXED);
}

static void refill(struct gpulimit_usage *u, uint64_t now)
{
	uint64_t last = __atomic_load_n(&u->pace_refill_ns, __ATOMIC_ACQUIRE);
	if (now <= last ||
	    !__atomic_compare_exchange_n(&u->pace_refill_ns, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		return;
	uint64_t rate = __atomic_load_n(&u->pace_rate_q10_per_ms, __ATOMIC_ACQUIRE);
	if (last == 0 || rate == 0)
		return;
	uint64_t dt = now - last;
	if (dt > 100ull * 1000 * 1000)
		dt = 100ull * 1000 * 1000;
	int64_t add = (int64_t)((double)rate * (double)dt / 1e6);
	int64_t cap = (int64_t)(rate * PACE_BUCKET_MS);
	int64_t cur = __atomic_add_fetch(&u->pace_tokens_q10, add, __ATOMIC_ACQ_REL);
	while (cur > cap &&
	       !__atomic_compare_exchange_n(&u->pace_tokens_q10, &cur, cap, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
	}
}

void pace_admit(uint64_t blocks, uint64_t now_coarse)
{
	struct hook_state *s = hook_state();
	struct gpulimit_usage *u = __atomic_load_n(&s->usage, __ATOMIC_ACQUIRE);
	if (u == NULL)
		return;
	if (__atomic_load_n(&s->q_compute_percent, __ATOMIC_RELAXED) >= 100 &&
	    __atomic_load_n(&s->q_compute_limit_percent, __ATOMIC_RELAXED) >= 100) {
		__atomic_add_fetch(&u->pace_blocks_total, blocks, __ATOMIC_RELAXED);
		return;
	}
	int nvml = pace_device();
	if (blocks > (UINT64_MAX >> 12))
		blocks = UINT64_MAX >> 12;
	int64_t tokens = __atomic_sub_fetch(&u->pace_tokens_q10, (int64_t)(blocks << 10), __ATOMIC_ACQ_REL);
	__atomic_add_fetch(&u->pace_blocks_total, blocks, __ATOMIC_RELAXED);
	if (now_coarse >= __atomic_load_n(&u->pace_next_control_ns, __ATOMIC_RELAXED))
		control(u, nvml);
	if (tokens >= 0)
		return;
	uint64_t start = hook_now_ns(), now = start;
	for (;;) {
		refill(u, now);
		tokens = __atomic_load_n(&u->pace_tokens_q10, __ATOMIC_ACQUIRE);
		uint64_t rate = __atomic_load_n(&u->pace_rate_q10_per_ms, __ATOMIC_ACQUIRE);
		if (tokens >= 0 || rate == 0 || now - start >= PACE_MAX_WAIT_NS)
			break;
		uint64_t need = (uint64_t)((double)-tokens * 1e6 / (double)rate);
		uint64_t left = PACE_MAX_WAIT_NS - (now - start);
		uint64_t nap = need < PACE_SLEEP_NS ? need : PACE_SLEEP_NS;
		if (nap > left)
			nap = left;
		if (nap == 0)
			nap = 1000;
		struct timespec ts = {0, (long)nap};
		nanosleep(&ts, NULL);
		now = hook_now_ns();
		if (now >= __atomic_load_n(&u->pace_next_control_ns, __ATOMIC_RELAXED))
			control(u, nvml);
	}
	__atomic_add_fetch(&u->pace_wait_ns_total, now - start, __ATOMIC_RELAXED);
}
