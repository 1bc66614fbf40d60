package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/spawner"
)

// The scale rig's flags (go test ... -args -scale-nodes=50), with the
// defaults of `go tool task bench:scale`: a 200-node fleet of 8 GPUs each,
// three replicas, 4,000 servers.
var (
	scaleNodes     = flag.Int("scale-nodes", 200, "BenchmarkScale: kwok nodes")
	scaleGPUs      = flag.Int("scale-gpus", 8, "BenchmarkScale: GPUs per node")
	scaleReplicas  = flag.Int("scale-replicas", 3, "BenchmarkScale: broker replicas on the one Redis")
	scaleServers   = flag.Int("scale-servers", 4000, "BenchmarkScale: servers created (half alone, half interleaved with as many raw pods; raw pods alone: half)")
	scaleUsers     = flag.Int("scale-users", 400, "BenchmarkScale: users the servers belong to")
	scaleWorkers   = flag.Int("scale-workers", 32, "BenchmarkScale: creates in flight at most (each waits until running)")
	scaleRate      = flag.Float64("scale-rate", 0, "BenchmarkScale: creates started per second at most, 0 = as fast as the workers go")
	scaleWatchers  = flag.Int("scale-watchers", 1000, "BenchmarkScale: event-stream watchers of one server")
	scaleEvents    = flag.Int("scale-events", 20, "BenchmarkScale: events fanned out to the watchers")
	scalePprof     = flag.String("scale-pprof", "", "BenchmarkScale: a folder to write CPU profiles to: the Lease holder's over the measured reconcile passes (leader-cpu.pprof, its --debug-pprof-listen), kube-apiserver's in each alone phase (apiserver-raw-alone.pprof, apiserver-servers-alone.pprof) and replica 0's in the servers' (broker-servers-alone.pprof); empty: none")
	scaleBinaryB   = flag.String("scale-broker-b", "", "BenchmarkScale: a second gpubroker binary (another build that reads the same Redis formats: from 2026-12-02 on, when the device counters became binary) for the odd replicas; the creates each binary's replicas served are then reported apart, side by side in the one load")
	scaleKubeQPS   = flag.Float64("scale-kube-qps", 200, "BenchmarkScale: each broker's --kube-api-qps (its --kube-api-burst twice that); the default is the raw pods' client's limit (harness.Cluster.Client, QPS 200, burst 400), so both sides have the same client-side limit; 0: the brokers' own defaults (50/100), at which 3 replicas sustain 75 creates/s (two requests a create)")
	scaleReconcile = flag.Duration("scale-reconcile-interval", 10*time.Second, "BenchmarkScale: the brokers' --reconcile-interval")
	scaleRounds    = flag.Int("scale-rounds", 4, "BenchmarkScale: rounds the two alone phases alternate in (raw pods, then as many servers, and again), so a shared machine that slows down or speeds up during the run weighs on both kinds alike; 1 with -scale-pprof (each profile covers its phase's only round)")
)

// scaleConfig sizes one run of the scale rig.
type scaleConfig struct {
	nodes, gpus, replicas int
	servers, users        int
	workers               int
	rate                  float64 // creates/s at most; 0: no cap
	kubeQPS               float64 // each broker's --kube-api-qps (burst twice); 0: the brokers' defaults
	watchers, events      int
	reconcileInterval     time.Duration
	reclaimInterval       time.Duration
}

// scaleReport is what one run measured.
type scaleReport struct {
	// template: the raw pods' template was made (serverPodTemplate).
	template bool
	// raw and alone: the first half of the creates, raw pods alone and
	// servers through the brokers alone, in rounds that alternate (rounds
	// of each), each kind at the same offered rate (the throughput
	// comparison); broker and sideRaw: the second half
	// of the servers and as many raw pod creates interleaved with them in
	// one load (the side-by-side latency comparison).
	raw, alone, broker, sideRaw, deletes harness.LoadResult
	rounds                               int // alone rounds run, each of both kinds
	// rawCPU and aloneCPU: the CPU seconds each part of the rig used
	// during the two alone phases (partCPU).
	rawCPU, aloneCPU map[string]float64
	listed           int // servers running at S, as the admin's list reads them
	passes           []passReport
	reclaim          passReport
	replicas         []replicaUsage
	watch            watchReport
	podsGone         time.Duration     // from the last delete answered to no managed pod left
	deletePools      []harness.Metrics // each replica's Redis pool series over the deletes
	steps            spawnSteps        // where the creates' time went
	stepsBy          [2]spawnSteps     // with -scale-broker-b: the creates of the even replicas (this build) and the odd ones (binary B)
	deleteRetries    atomic.Int64      // deletes answered 503 and sent again
}

// passReport is one reconcile pass (or reclaim cycle) on one replica: its
// duration, and the Redis commands and Kubernetes requests the replica
// sent during the interval that held it (the pass and the replica's other
// loops: readiness, Lease, fleet series).
type passReport struct {
	// leads: the replica holds the Lease, so it makes the periodic
	// passes; a follower's report has no pass (took 0), only what it sent
	// while the leader's was measured.
	leads        bool
	passes       float64 // a follower's reconcile passes in the window (0: none was asked for)
	took, window time.Duration
	redis, kube  float64
	topRedis     []string
	decisions    float64 // reclaim only: servers judged
	failed       float64 // passes that ended in an error (result="error")
}

// replicaUsage is one replica at S servers.
type replicaUsage struct {
	rssMiB      float64
	cores       float64 // CPU cores over the steady window
	fillCPUms   float64 // CPU ms per create while filling
	watchRSSMiB float64 // RSS with the watchers open
}

// BenchmarkScale is the scale rig: kwok with -scale-nodes × -scale-gpus
// GPUs (registered through the admin API, as the node agents do),
// -scale-replicas brokers on one Redis, and -scale-servers servers from
// -scale-users users. Throughput: half of them are created through the
// brokers alone, and as many raw pods by a plain client-go client alone,
// at the same offered rate, in -scale-rounds rounds that alternate between
// the two (create-ratio). Latency: the other half
// are created interleaved one for one with as many raw pod creates in one
// load (the side-by-side comparison of create → running, added-p99-ms).
// Then the reconciler, reclaimer and -scale-watchers event-stream watchers
// are measured at that size, and every server is deleted.
//
//	go test -run='^$' -bench=Scale -benchtime=1x -timeout=90m ./e2e/
func BenchmarkScale(b *testing.B) {
	cfg := scaleConfig{nodes: *scaleNodes, gpus: *scaleGPUs, replicas: *scaleReplicas, servers: *scaleServers,
		users: *scaleUsers, workers: *scaleWorkers, rate: *scaleRate, kubeQPS: *scaleKubeQPS, watchers: *scaleWatchers, events: *scaleEvents,
		reconcileInterval: *scaleReconcile, reclaimInterval: 10 * time.Second}
	for range b.N {
		r := runScale(b, cfg)
		b.ReportMetric(r.alone.PerSecond()/r.raw.PerSecond(), "create-ratio")
		b.ReportMetric(ms(r.broker.Quantile(0.99)-r.sideRaw.Quantile(0.99)), "added-p99-ms")
		b.ReportMetric(ms(r.broker.Quantile(0.99)-r.raw.Quantile(0.99)), "added-p99-vs-alone-ms")
		var worst float64
		for _, p := range r.passes {
			worst = max(worst, ms(p.took))
		}
		b.ReportMetric(worst, "reconcile-pass-ms")
		var rss float64
		for _, u := range r.replicas {
			rss = max(rss, u.rssMiB)
		}
		b.ReportMetric(rss, "max-replica-rss-MiB")
		b.ReportMetric(ms(r.reclaim.took), "reclaim-cycle-ms")
		b.ReportMetric(r.watch.perWatcherKiB, "KiB/watcher")
		b.ReportMetric(ms(harness.Quantile(r.watch.all, 0.99)), "fanout-all-p99-ms")
	}
}

// TestScaleRig runs the scale rig at a small size (2 nodes × 8 GPUs, two
// replicas, 20 servers, 20 watchers, the brokers at --kube-api-qps=100) so that it keeps working, and checks
// what it measured adds up: every create and delete done, every server
// listed running at the top, a pass on the Lease holder and none on the
// other replica, cycles observed with their calls,
// every event reaching every watcher, no pod left.
func TestScaleRig(t *testing.T) {
	t.Parallel()
	cfg := scaleConfig{nodes: 2, gpus: 8, replicas: 2, servers: 20, users: 4, workers: 4, watchers: 20, events: 3, kubeQPS: 100,
		reconcileInterval: time.Second, reclaimInterval: 5 * time.Second}
	r := runScale(t, cfg)
	half := cfg.servers / 2
	if n := len(r.raw.Latencies); n != half {
		t.Errorf("%d raw pods ran alone, want %d", n, half)
	}
	if want := aloneRounds(half); r.rounds != want {
		t.Errorf("the alone phases ran in %d rounds, want %d (-scale-rounds)", r.rounds, want)
	}
	if n := len(r.alone.Latencies); n != half {
		t.Errorf("%d servers ran alone, want %d", n, half)
	}
	if n := len(r.broker.Latencies); n != cfg.servers-half {
		t.Errorf("%d servers ran interleaved, want %d", n, cfg.servers-half)
	}
	if n := len(r.sideRaw.Latencies); n != cfg.servers-half {
		t.Errorf("%d raw pods interleaved with the servers ran, want %d", n, cfg.servers-half)
	}
	if r.rawCPU["kube-apiserver"] <= 0 || r.aloneCPU["kube-apiserver"] <= 0 || r.aloneCPU["brokers"] <= 0 || r.aloneCPU["machine"] < r.aloneCPU["brokers"] {
		t.Errorf("CPU by part: raw pods alone %v, servers alone %v; want the API server's > 0 in both, the brokers' > 0 and ≤ the machine's with the servers", r.rawCPU, r.aloneCPU)
	}
	if r.listed != cfg.servers {
		t.Errorf("the admin's list shows %d servers running, want %d", r.listed, cfg.servers)
	}
	if n := len(r.deletes.Latencies); n != cfg.servers {
		t.Errorf("%d deletes answered, want %d", n, cfg.servers)
	}
	if len(r.passes) != cfg.replicas || len(r.replicas) != cfg.replicas {
		t.Errorf("%d passes and %d replica usages, want %d each", len(r.passes), len(r.replicas), cfg.replicas)
	}
	leaders := 0
	for i, p := range r.passes {
		switch {
		case p.leads:
			leaders++
			if p.failed > 0 {
				t.Errorf("replica %d: the measured reconcile pass failed", i)
			}
			if p.took <= 0 || p.redis <= 0 {
				t.Errorf("replica %d: reconcile pass took %s with %g Redis commands; want both > 0", i, p.took, p.redis)
			}
		case p.passes > 0:
			t.Errorf("replica %d does not hold the Lease but made %g reconcile passes", i, p.passes)
		}
	}
	if leaders != 1 {
		t.Errorf("%d replicas made the measured reconcile pass, want 1 (the Lease holder)", leaders)
	}
	if r.reclaim.took <= 0 || r.reclaim.decisions != float64(cfg.servers) {
		t.Errorf("reclaim cycle took %s judging %g servers; want > 0 and %d", r.reclaim.took, r.reclaim.decisions, cfg.servers)
	}
	if len(r.watch.all) != cfg.events || len(r.watch.each) != cfg.events*cfg.watchers {
		t.Errorf("fan-out: %d events, %d receipts; want %d and %d", len(r.watch.all), len(r.watch.each), cfg.events, cfg.events*cfg.watchers)
	}
	for i, u := range r.replicas {
		if u.rssMiB <= 0 {
			t.Errorf("replica %d: RSS %g MiB", i, u.rssMiB)
		}
	}
}

// runScale runs the rig once at cfg's size and logs every figure.
// aloneRounds is how many rounds the alone phases of half creates each
// alternate in: -scale-rounds (at least 1, at most half), 1 with
// -scale-pprof.
func aloneRounds(half int) int {
	if *scalePprof != "" {
		return 1
	}
	return min(max(*scaleRounds, 1), half)
}

func runScale(tb testing.TB, cfg scaleConfig) *scaleReport {
	tb.Helper()
	ctx := tb.Context()
	args := []string{"--reconcile-interval=" + cfg.reconcileInterval.String(), "--reclaim-interval=" + cfg.reclaimInterval.String(),
		"--orphan-grace=2m"} // the default: the env's 2 s would settle servers whose pods the informer has yet to see
	if cfg.kubeQPS > 0 {
		args = append(args, fmt.Sprintf("--kube-api-qps=%g", cfg.kubeQPS), fmt.Sprintf("--kube-api-burst=%d", int(2*cfg.kubeQPS)))
	}
	progress := sayer(tb)
	start := time.Now()
	var pprofAddrs []string // by replica, with -scale-pprof
	pprofArgs := func() []string {
		if *scalePprof == "" {
			return args
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		pprofAddrs = append(pprofAddrs, addr)
		return append(slices.Clone(args), "--debug-pprof-listen="+addr)
	}
	e := newEnv(tb, envOptions{nodes: cfg.nodes, gpusPerNode: cfg.gpus, profiles: spawnProfiles, leaderElection: true, brokerArgs: pprofArgs()})
	replicas := []*harness.Broker{e.broker}
	for len(replicas) < cfg.replicas {
		bin := e.bin
		if *scaleBinaryB != "" && len(replicas)%2 == 1 {
			bin = *scaleBinaryB
		}
		replicas = append(replicas, e.startBrokerBinary(bin, pprofArgs()...))
	}
	progress("scale rig: %d nodes × %d GPUs (%d), %d replicas, ready in %s", cfg.nodes, cfg.gpus, len(e.gpus), len(replicas),
		time.Since(start).Round(time.Millisecond))

	// One transport for the whole load: keep-alive connections for every
	// worker instead of a fresh one per call.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = cfg.workers * 2
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: tr}
	tb.Cleanup(tr.CloseIdleConnections)
	users := make([]string, cfg.users)
	clients := make([][]*harness.Client, cfg.users) // by user, then replica
	for u := range users {
		users[u] = fmt.Sprintf("u%04d", u)
		tok := e.token(users[u], "ml")
		for _, b := range replicas {
			clients[u] = append(clients[u], &harness.Client{BaseURL: b.URL, Token: tok, HTTP: hc})
		}
	}
	load := func(what string, n int) harness.Load {
		progress("%s: %d at %d in flight", what, n, cfg.workers)
		return harness.Load{Count: n, Workers: cfg.workers, Rate: cfg.rate, Progress: func(done, failed int) {
			progress("  %s: %d of %d done, %d failed", what, done, n, failed)
		}}
	}
	// The first half of the servers measures throughput (alone, like the
	// raw pods before them), the second half latency (interleaved).
	half := cfg.servers / 2
	r := &scaleReport{}
	var err error
	// Whatever was measured is printed, also when a later phase fails.
	defer logScale(tb, cfg, r)

	// The raw pods copy a notebook pod the brokers made, of a server
	// created and deleted before anything is measured.
	template, err := serverPodTemplate(ctx, e, clients[0][0], users[0], "template")
	if err != nil {
		tb.Fatal(err)
	}
	r.template = true
	rig, err := rigClient(e)
	if err != nil {
		tb.Fatal(err)
	}
	raw, err := newRawPods(ctx, e, rig, "scale-raw", template)
	if err != nil {
		tb.Fatal(err)
	}
	// The rig's own watches (the managed pods, for the steps' split and the
	// end's count, and the side's raw pods) start after the servers alone:
	// the raw pods alone met one watch, their own, and the servers alone
	// meet only the brokers' (their event streams tell the rig when each
	// runs), so neither side pays for the other's instruments.
	var managed *harness.PodWatch
	cpu0 := replicaCPU(tb, replicas)
	// createServer creates server i (of all cfg.servers) and waits until it
	// runs; steps: where its time went, or nil.
	createServer := func(ctx context.Context, i int, steps *spawnSteps) (time.Duration, error) {
		u := i % cfg.users
		name := fmt.Sprintf("s%d", i)
		if steps != nil && *scaleBinaryB != "" {
			steps = &r.stepsBy[(i%len(replicas))%2]
		}
		var podRunning <-chan struct{}
		if managed != nil {
			podRunning = managed.Running(spawner.PodName(users[u], name))
		}
		return createRunningSteps(ctx, clients[u][i%len(replicas)], users[u], name, steps, podRunning)
	}
	replica0 := "" // replica 0's pprof listener, with -scale-pprof
	if len(pprofAddrs) > 0 {
		replica0 = pprofAddrs[0]
	}
	// Each kind alone at the rate it gets in the interleaved load (half of
	// RATE), so the two raw figures differ by the load they meet only and
	// the two alone phases offer the same rate; in rounds that alternate
	// (raw pods, then as many servers), each kind's figures the sum of its
	// rounds. The raw pods stay until the last round, as the servers do.
	rounds := aloneRounds(half)
	r.rawCPU, r.aloneCPU = map[string]float64{}, map[string]float64{}
	alone := func(what, phase, broker string, lo, n int, into *harness.LoadResult, cpu map[string]float64, op func(context.Context, int) (time.Duration, error)) {
		l := load(what, n)
		l.Rate = cfg.rate / 2
		profiled := func() error { return nil }
		if *scalePprof != "" {
			profiled = profilePhase(ctx, e, phase, broker)
		}
		c0 := partCPU(tb, e, replicas)
		res, err := l.Run(ctx, func(ctx context.Context, i int) (time.Duration, error) { return op(ctx, lo+i) })
		for part, c := range cpuSince(tb, e, replicas, c0) {
			cpu[part] += c
		}
		into.Wall += res.Wall
		into.Latencies = append(into.Latencies, res.Latencies...)
		if err != nil {
			tb.Fatalf("%s: %v", what, err)
		}
		if err := profiled(); err != nil {
			tb.Errorf("%s: %v", what, err)
		}
	}
	for k := range rounds {
		lo, hi := k*half/rounds, (k+1)*half/rounds
		alone(fmt.Sprintf("raw pods alone (round %d of %d)", k+1, rounds), "raw-alone", "", lo, hi-lo, &r.raw, r.rawCPU, raw.create)
		alone(fmt.Sprintf("servers through the brokers alone (round %d of %d)", k+1, rounds), "servers-alone", replica0, lo, hi-lo, &r.alone, r.aloneCPU,
			func(ctx context.Context, i int) (time.Duration, error) { return createServer(ctx, i, nil) })
		r.rounds++
	}
	if err := raw.removeAll(ctx); err != nil {
		tb.Fatalf("raw pods: %v", err)
	}
	if managed, err = harness.WatchPods(ctx, rig, e.ns, v1.LabelManagedBy+"="+v1.ManagedByValue); err != nil {
		tb.Fatal(err)
	}
	defer managed.Stop()
	side, err := newRawPods(ctx, e, rig, "scale-side", template)
	if err != nil {
		tb.Fatal(err)
	}
	serverLoad := load("servers, each next to a raw pod", cfg.servers-half)
	serverLoad.Progress = func(done, failed int) {
		progress("  servers and raw pods: %d of %d done, %d failed", done, 2*(cfg.servers-half), failed)
	}
	r.broker, r.sideRaw, err = interleaved(ctx, serverLoad, func(ctx context.Context, i int) (time.Duration, error) {
		return createServer(ctx, half+i, &r.steps)
	}, side.create)
	if err != nil {
		tb.Fatalf("servers through the brokers: %v", err)
	}
	cpu1 := replicaCPU(tb, replicas)
	if err := side.removeAll(ctx); err != nil {
		tb.Fatal(err)
	}

	all, err := e.admin.AllServers(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	for _, s := range all {
		if s.State == v1.StateRunning {
			r.listed++
		}
	}

	// At S servers: one reconcile pass on the Lease holder (only it makes
	// the periodic passes), and what the other replicas sent meanwhile.
	progress("at %d servers: a reconcile pass on the Lease holder", cfg.servers)
	leader, err := reclaimLeader(ctx, replicas)
	if err != nil {
		tb.Fatal(err)
	}
	steady0 := replicaCPU(tb, replicas)
	steadyStart := time.Now()
	r.passes = make([]passReport, len(replicas))
	before := make([]harness.Metrics, len(replicas))
	for i, b := range replicas {
		if before[i], err = b.Scrape(ctx); err != nil {
			tb.Fatal(err)
		}
	}
	leaderProfiled := make(chan error, 1)
	if *scalePprof != "" {
		i := slices.Index(replicas, leader)
		go func() { leaderProfiled <- fetchProfile(ctx, pprofAddrs[i], 2*cfg.reconcileInterval, *scalePprof) }()
	} else {
		leaderProfiled <- nil
	}
	pass, err := onePass(ctx, leader, "gpubroker_reconcile_passes_total", "gpubroker_reconcile_pass_duration_seconds_sum",
		3*cfg.reconcileInterval+time.Minute)
	if err != nil {
		tb.Fatalf("reconcile pass: %v", err)
	}
	pass.leads = true
	if err := <-leaderProfiled; err != nil {
		tb.Errorf("profile of the Lease holder: %v", err)
	}
	for i, b := range replicas {
		if b == leader {
			r.passes[i] = pass
			continue
		}
		m, err := b.Scrape(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		d := m.Delta(before[i])
		r.passes[i] = passReport{window: time.Since(steadyStart), redis: d.Sum("gpubroker_redis_commands_total"),
			kube: d.Sum("gpubroker_kubernetes_requests_total"), topRedis: d.Top("gpubroker_redis_commands_total", 4),
			passes: d.Sum("gpubroker_reconcile_passes_total")}
	}
	steady1 := replicaCPU(tb, replicas)
	steadyWall := time.Since(steadyStart)
	for i, b := range replicas {
		rss, err := harness.ProcRSS(b.Pid())
		if err != nil {
			tb.Fatal(err)
		}
		r.replicas = append(r.replicas, replicaUsage{rssMiB: float64(rss) / 1024,
			cores:     (steady1[i] - steady0[i]) / steadyWall.Seconds(),
			fillCPUms: 1000 * (cpu1[i] - cpu0[i]) / float64(cfg.servers)})
	}

	progress("a reclaim cycle")
	r.reclaim, err = onePass(ctx, leader, `gpubroker_reclaim_cycles_total`, "gpubroker_reclaim_cycle_duration_seconds_sum",
		3*cfg.reclaimInterval+time.Minute)
	if err != nil {
		tb.Fatalf("reclaim cycle: %v", err)
	}

	progress("%d watchers, %d events", cfg.watchers, cfg.events)
	r.watch, err = fanOut(ctx, tb, e, replicas, users[0], "s0", cfg)
	if err != nil {
		tb.Fatalf("event fan-out: %v", err)
	}
	for i := range replicas {
		r.replicas[i].watchRSSMiB = r.watch.rssAfter[i]
	}

	pools0 := make([]harness.Metrics, len(replicas))
	for i, b := range replicas {
		if pools0[i], err = b.Scrape(ctx); err != nil {
			tb.Fatal(err)
		}
	}
	r.deletes, err = load("deletes", cfg.servers).Run(ctx, func(ctx context.Context, i int) (time.Duration, error) {
		u := i % cfg.users
		t0 := time.Now()
		// A 503 says to try again in a few seconds, as a page would.
		for try := 0; ; try++ {
			_, err := clients[u][i%len(replicas)].DeleteServer(ctx, users[u], fmt.Sprintf("s%d", i))
			var ae *harness.APIError
			if err == nil || !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || try == 4 {
				return time.Since(t0), err
			}
			r.deleteRetries.Add(1)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
	})
	if err != nil {
		tb.Fatalf("deletes: %v", err)
	}
	deleted := time.Now()
	for i, b := range replicas {
		m, err := b.Scrape(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		r.deletePools = append(r.deletePools, m.Delta(pools0[i]))
	}
	err = harness.Poll(ctx, 200*time.Millisecond, 5*time.Minute, func(context.Context) (bool, string, error) {
		n := managed.Count()
		return n == 0, fmt.Sprintf("%d managed pods left", n), nil
	})
	if err != nil {
		tb.Fatalf("after the deletes: %v", err)
	}
	r.podsGone = time.Since(deleted)
	return r
}

// onePass waits for the counter `passes` of b to move twice (polling its
// metrics every 250 ms) and measures the interval between: the pass that
// ended it (its duration from the histogram sum durSum) and the Redis
// commands and Kubernetes requests b sent meanwhile.
func onePass(ctx context.Context, b *harness.Broker, passes, durSum string, timeout time.Duration) (passReport, error) {
	next := func(after float64) (harness.Metrics, time.Time, error) {
		var m harness.Metrics
		// Every scrape renders the replica's whole exposition (thousands of
		// fleet series at this size): polled every 20 ms, the scrapes took
		// more of the replica's CPU than the pass they waited for.
		err := harness.Poll(ctx, 250*time.Millisecond, timeout, func(ctx context.Context) (bool, string, error) {
			var err error
			if m, err = b.Scrape(ctx); err != nil {
				return false, err.Error(), nil
			}
			return m.Sum(passes) > after, fmt.Sprintf("%s = %g", passes, m.Sum(passes)), nil
		})
		return m, time.Now(), err
	}
	m, err := b.Scrape(ctx)
	if err != nil {
		return passReport{}, err
	}
	m0, t0, err := next(m.Sum(passes))
	if err != nil {
		return passReport{}, fmt.Errorf("%s: %w", b.URL, err)
	}
	m1, t1, err := next(m0.Sum(passes))
	if err != nil {
		return passReport{}, fmt.Errorf("%s: %w", b.URL, err)
	}
	d := m1.Delta(m0)
	n := d.Sum(passes)
	return passReport{
		took:      time.Duration(d.Sum(durSum) / n * float64(time.Second)),
		window:    t1.Sub(t0),
		redis:     d.Sum("gpubroker_redis_commands_total"),
		kube:      d.Sum("gpubroker_kubernetes_requests_total"),
		topRedis:  d.Top("gpubroker_redis_commands_total", 4),
		decisions: d.Sum("gpubroker_reclaim_decisions_total") / n,
		failed:    d[passes+`{result="error"}`],
	}, nil
}

// reclaimLeader is the replica whose metrics say it holds the reclaim
// Lease, waiting up to a minute for exactly one.
func reclaimLeader(ctx context.Context, replicas []*harness.Broker) (*harness.Broker, error) {
	var leader *harness.Broker
	err := harness.Poll(ctx, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
		leaders, err := leadersOf(ctx, replicas)
		if err != nil {
			return false, err.Error(), nil
		}
		if len(leaders) == 1 {
			leader = leaders[0]
		}
		return len(leaders) == 1, fmt.Sprintf("%d replicas lead", len(leaders)), nil
	})
	return leader, err
}
