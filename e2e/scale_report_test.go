package e2e

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/gpubroker/gpubroker/e2e/harness"
)

// sayer is where the rig writes: the test's log, or for a benchmark (whose
// log comes out at its end, cut to ten lines without -v) stderr at once.
func sayer(tb testing.TB) func(format string, a ...any) {
	if _, ok := tb.(*testing.B); ok {
		return func(format string, a ...any) { fmt.Fprintf(os.Stderr, "scale: "+format+"\n", a...) }
	}
	return tb.Logf
}

// logScale prints the rig's figures, with the targets of issue 16.
func logScale(tb testing.TB, cfg scaleConfig, r *scaleReport) {
	tb.Helper()
	say := sayer(tb)
	rate := "as fast as the workers go"
	if cfg.rate > 0 {
		rate = fmt.Sprintf("at most %g creates/s (%g/s of each kind, alone or interleaved; the ratio below then shows whether the brokers keep up with that cap, RATE=0 measures capacity)", cfg.rate, cfg.rate/2)
	}
	limit := "the brokers' defaults (50/100 each)"
	if cfg.kubeQPS > 0 {
		limit = fmt.Sprintf("QPS %g burst %d each", cfg.kubeQPS, int(2*cfg.kubeQPS))
	}
	say("scale rig: %d nodes × %d GPUs, %d replicas, %d servers of %d users, %d in flight, %s; Kubernetes client limit: raw pods QPS 200 burst 400, brokers %s",
		cfg.nodes, cfg.gpus, cfg.replicas, cfg.servers, cfg.users, cfg.workers, rate, limit)
	if r.template {
		say("raw pods: copies of a notebook pod a broker made (same spec and annotations), created by a plain client-go client speaking protobuf without gzip, as the brokers do")
	}
	if len(r.raw.Latencies) == 0 {
		return
	}
	line := func(what string, l harness.LoadResult) {
		say("%-52s %7.1f/s  create→running p50 %6.0f ms  p99 %6.0f ms", what, l.PerSecond(), ms(l.Quantile(0.5)), ms(l.Quantile(0.99)))
	}
	line("raw pod creates alone (client-go):", r.raw)
	if len(r.alone.Latencies) == 0 {
		return
	}
	line("server creates (brokers) alone:", r.alone)
	order := "raw pods first, then the servers"
	if r.rounds > 1 {
		order = fmt.Sprintf("in %d rounds that alternate: raw pods, then as many servers", r.rounds)
	}
	say("ratio %.2f (target ≥ 0.5): server creates/s alone vs raw pod creates/s alone (%d of each, same offered rate, %s)",
		r.alone.PerSecond()/r.raw.PerSecond(), len(r.raw.Latencies), order)
	cpuLine := func(what string, cpu map[string]float64, l harness.LoadResult) {
		var b strings.Builder
		for _, p := range cpuParts {
			fmt.Fprintf(&b, " %s %.2f", p, 1000*cpu[p]/float64(len(l.Latencies)))
		}
		say("  CPU ms per create, %s:%s; machine busy %.2f of %d cores", what, b.String(), cpu["machine"]/l.Wall.Seconds(), runtime.NumCPU())
	}
	cpuLine("raw pods alone", r.rawCPU, r.raw)
	cpuLine("servers alone", r.aloneCPU, r.alone)
	if len(r.broker.Latencies) == 0 {
		return
	}
	line("server creates (brokers), each next to a raw pod:", r.broker)
	line("raw pod creates interleaved with them:", r.sideRaw)
	say("added by the broker, side by side (servers vs the raw pods interleaved with them, same window and offered rate): p50 %+.0f ms, p99 %+.0f ms (target p99 ≤ +100 ms)",
		ms(r.broker.Quantile(0.5)-r.sideRaw.Quantile(0.5)), ms(r.broker.Quantile(0.99)-r.sideRaw.Quantile(0.99)))
	say("  against the raw pods alone (not the same load): p50 %+.0f ms, p99 %+.0f ms",
		ms(r.broker.Quantile(0.5)-r.raw.Quantile(0.5)), ms(r.broker.Quantile(0.99)-r.raw.Quantile(0.99)))
	byStep := func(st *spawnSteps) {
		n, tail := st.slowest(0.01)
		say("  by step (each step's own p50 and p99; then its mean over the slowest 1%% of the creates, %d, whose mean total is %.0f ms):", n, ms(tail["total"]))
		for _, name := range spawnStepNames {
			d := st.steps[name]
			say("  step %-62s p50 %6.0f ms  p99 %6.0f ms  slowest 1%% %6.0f ms", name, ms(harness.Quantile(d, 0.5)), ms(harness.Quantile(d, 0.99)), ms(tail[name]))
		}
	}
	if *scaleBinaryB == "" {
		byStep(&r.steps)
	}
	for b, what := range []string{"this build (even replicas)", "binary B " + *scaleBinaryB + " (odd replicas)"} {
		st := &r.stepsBy[b]
		if len(st.each) == 0 {
			continue
		}
		l := harness.LoadResult{Wall: r.broker.Wall}
		for _, c := range st.each {
			l.Latencies = append(l.Latencies, c.total)
		}
		say("servers created through %s: %d, create→running p50 %.0f ms p99 %.0f ms; added, side by side with the same raw pods: p50 %+.0f ms, p99 %+.0f ms",
			what, len(l.Latencies), ms(l.Quantile(0.5)), ms(l.Quantile(0.99)), ms(l.Quantile(0.5)-r.sideRaw.Quantile(0.5)), ms(l.Quantile(0.99)-r.sideRaw.Quantile(0.99)))
		byStep(st)
	}
	say("at %d servers (%d listed running):", cfg.servers, r.listed)
	for i, p := range r.passes {
		u := r.replicas[i]
		if p.leads {
			say("  replica %d (Lease holder): reconcile pass %6.0f ms (target ≤ 1000; %g of it failed); in its %.1f s interval %g Redis commands (%s), %g API requests",
				i, ms(p.took), p.failed, p.window.Seconds(), p.redis, strings.Join(p.topRedis, " "), p.kube)
		} else {
			say("  replica %d (follower): %g reconcile passes (want 0) while the holder's was measured; in those %.1f s %g Redis commands (%s), %g API requests",
				i, p.passes, p.window.Seconds(), p.redis, strings.Join(p.topRedis, " "), p.kube)
		}
		say("  replica %d: RSS %.0f MiB (target ≤ 512), %.3f cores at rest, %.2f CPU-ms per create while filling", i, u.rssMiB, u.cores, u.fillCPUms)
	}
	if r.reclaim.took == 0 {
		return
	}
	say("  reclaim cycle (leader) %.0f ms judging %g servers; in its %.1f s interval %g Redis commands (%s), %g API requests",
		ms(r.reclaim.took), r.reclaim.decisions, r.reclaim.window.Seconds(), r.reclaim.redis, strings.Join(r.reclaim.topRedis, " "), r.reclaim.kube)
	if len(r.watch.all) == 0 {
		return
	}
	say("  %d watchers of one server opened in %.1f s: %.1f KiB broker RSS and %.2f Redis connections per watcher",
		cfg.watchers, r.watch.open.Seconds(), r.watch.perWatcherKiB, float64(r.watch.redisConns)/float64(cfg.watchers))
	say("  fan-out of %d events: event→watcher p50 %.0f ms p99 %.0f ms; event→all watchers p50 %.0f ms p99 %.0f ms",
		len(r.watch.all), ms(harness.Quantile(r.watch.each, 0.5)), ms(harness.Quantile(r.watch.each, 0.99)),
		ms(harness.Quantile(r.watch.all, 0.5)), ms(harness.Quantile(r.watch.all, 0.99)))
	say("deletes: %d answered, %.1f/s (p50 %.0f ms, p99 %.0f ms, with %d sent again after a 503); every pod gone %.1f s after the last",
		len(r.deletes.Latencies), r.deletes.PerSecond(), ms(r.deletes.Quantile(0.5)), ms(r.deletes.Quantile(0.99)), r.deleteRetries.Load(), r.podsGone.Seconds())
	for i, d := range r.deletePools {
		say("  replica %d over the deletes: main Redis pool %g waits for a connection (%.2f s waiting, %g timeouts); %g Redis commands, %g API requests",
			i, d[`gpubroker_redis_pool_waits_total{pool="main"}`], d[`gpubroker_redis_pool_wait_seconds_total{pool="main"}`],
			d[`gpubroker_redis_pool_timeouts_total{pool="main"}`], d.Sum("gpubroker_redis_commands_total"), d.Sum("gpubroker_kubernetes_requests_total"))
	}
}
