package redisstore

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

var benchPhase = flag.Duration("bench.phase", 2*time.Second, "length of each measured phase of BenchmarkPlaceRelease")

// benchClients is the number of concurrent clients in each phase.
const benchClients = 64

// benchRounds is how many alternating raw and place+release rounds share
// each -bench.phase.
const benchRounds = 4

// trivialScript is the baseline: the cheapest EVALSHA a server can answer.
var trivialScript = redis.NewScript("return 1")

// phaseResult is what one measured phase did.
type phaseResult struct {
	ops       int
	elapsed   time.Duration
	latencies []time.Duration // one per op
}

// add returns r and o merged; latencies are left unsorted.
func (r phaseResult) add(o phaseResult) phaseResult {
	return phaseResult{ops: r.ops + o.ops, elapsed: r.elapsed + o.elapsed, latencies: append(r.latencies, o.latencies...)}
}

func (r phaseResult) perSecond() float64 { return float64(r.ops) / r.elapsed.Seconds() }

// quantile returns the q-quantile of the latencies, which must be sorted.
func (r phaseResult) quantile(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	return r.latencies[int(q*float64(len(r.latencies)-1))]
}

// runPhase runs op from benchClients goroutines for d and collects latencies.
func runPhase(ctx context.Context, d time.Duration, op func(ctx context.Context, client, i int, rnd *rand.Rand) error) (phaseResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		all  []time.Duration
		errs []error
	)
	start := time.Now()
	end := start.Add(d)
	for c := range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(c), 7))
			lat := make([]time.Duration, 0, 4096)
			var err error
			for i := 0; time.Now().Before(end); i++ {
				t0 := time.Now()
				if err = op(ctx, c, i, rnd); err != nil {
					cancel()
					break
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(errs) > 0 {
		return phaseResult{}, errs[0]
	}
	return phaseResult{ops: len(all), elapsed: elapsed, latencies: all}, nil
}

// benchBatch is how many slices each client holds in the place-only phase
// of BenchmarkPlaceRelease before the release-only phase frees them.
const benchBatch = 16

// BenchmarkPlaceRelease measures placement on a fleet of 1,000 and 10,000
// H200s (8 per node, a quarter of them partly filled) with 64 concurrent
// clients, next to a trivial EVALSHA on the same redis-server in the same
// run. Each b.N iteration runs benchRounds rounds of four phases: the
// trivial script and place+release pairs for -bench.phase/benchRounds each
// (default 2 s in all), then place only (benchBatch slices per client) and
// release only (those slices). Run it with -benchtime=1x.
//
// It reports pairs/s and raw/s (a pair is two round trips, so their ratio
// cannot exceed about 0.5), their ratio, p50/p99 of a pair in ms, and the
// Redis cost of one place and one release next to one trivial script: CPU
// µs of the redis-server process (INFO cpu, user + sys, so network I/O
// included) and µs inside the script (INFO commandstats, evalsha usec per
// call: wall time, so a descheduled server inflates it), and their
// multiples of the trivial script's (the -x metrics).
func BenchmarkPlaceRelease(b *testing.B) {
	srv := redistest.Start(b)
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			rdb := srv.Client(b)
			s := New(rdb, srv.Prefix(b))
			ctx := b.Context()
			if err := s.MarkReconciled(ctx); err != nil {
				b.Fatal(err)
			}
			if err := fillFleet(ctx, s, n); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			request := func(c int, id string, rnd *rand.Rand) fleet.PlaceRequest {
				cp := []int{5, 10, 20}[rnd.IntN(3)]
				req := fleet.PlaceRequest{
					SliceID:     id,
					User:        fmt.Sprintf("user%d", c),
					Slice:       fleet.Slice{MemoryMiB: []int64{4096, 8192, 16384}[rnd.IntN(3)], ComputePercent: cp, ComputeLimitPercent: cp},
					UserQuota:   fleet.Quota{Servers: 2 * benchBatch, MemoryMiB: 1 << 20, ComputePercent: 1000},
					GroupQuotas: map[string]fleet.Quota{"everyone": {Servers: 100000}},
				}
				if c%4 == 0 {
					req.Policy = fleet.PolicySpread
				}
				return req
			}
			release := func(ctx context.Context, id string) error {
				ok, err := s.Release(ctx, id)
				if err == nil && !ok {
					err = fmt.Errorf("release %s freed nothing", id)
				}
				return err
			}
			rawOp := func(ctx context.Context, _, _ int, _ *rand.Rand) error {
				return trivialScript.Run(ctx, rdb, nil).Err()
			}
			pairOp := func(ctx context.Context, c, i int, rnd *rand.Rand) error {
				req := request(c, fmt.Sprintf("bench-%d-%d", c, i), rnd)
				if _, err := s.Place(ctx, req); err != nil {
					return err
				}
				return release(ctx, req.SliceID)
			}
			held := func(round, c, i int) string { return fmt.Sprintf("held-%d-%d-%d", round, c, i) }
			var (
				raw, pairs, places, releases phaseResult
				cost                         = map[string]*redisCost{"raw": {}, "pair": {}, "place": {}, "release": {}}
				phase                        = *benchPhase / benchRounds
			)
			for round := range b.N * benchRounds {
				measure := func(name string, run func() (phaseResult, error)) phaseResult {
					before := serverStats(ctx, b, rdb)
					r, err := run()
					if err != nil {
						b.Fatalf("%s phase: %v", name, err)
					}
					cost[name].add(before, serverStats(ctx, b, rdb))
					return r
				}
				raw = raw.add(measure("raw", func() (phaseResult, error) { return runPhase(ctx, phase, rawOp) }))
				pairs = pairs.add(measure("pair", func() (phaseResult, error) { return runPhase(ctx, phase, pairOp) }))
				places = places.add(measure("place", func() (phaseResult, error) {
					return runCounted(ctx, benchBatch, func(ctx context.Context, c, i int, rnd *rand.Rand) error {
						_, err := s.Place(ctx, request(c, held(round, c, i), rnd))
						return err
					})
				}))
				releases = releases.add(measure("release", func() (phaseResult, error) {
					return runCounted(ctx, benchBatch, func(ctx context.Context, c, i int, _ *rand.Rand) error {
						return release(ctx, held(round, c, i))
					})
				}))
			}
			slices.Sort(raw.latencies)
			slices.Sort(pairs.latencies)
			b.StopTimer()
			if err := s.Verify(ctx); err != nil {
				b.Fatalf("invariants after the run: %v", err)
			}
			ratio := pairs.perSecond() / raw.perSecond()
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(pairs.perSecond(), "pairs/s")
			b.ReportMetric(raw.perSecond(), "raw/s")
			b.ReportMetric(ratio, "ratio")
			b.ReportMetric(ms(pairs.quantile(0.50)), "p50-ms")
			b.ReportMetric(ms(pairs.quantile(0.99)), "p99-ms")
			rawCPU, rawScript := cost["raw"].perCall()
			placeCPU, placeScript := cost["place"].perCall()
			releaseCPU, releaseScript := cost["release"].perCall()
			b.ReportMetric(placeCPU, "redis-cpu-us/place")
			b.ReportMetric(releaseCPU, "redis-cpu-us/release")
			b.ReportMetric(rawCPU, "redis-cpu-us/raw")
			b.ReportMetric(placeCPU/rawCPU, "place-cpu-x")
			b.ReportMetric(releaseCPU/rawCPU, "release-cpu-x")
			b.Logf("gpus=%d clients=%d: place+release %.0f pairs/s (p50 %.2f ms, p99 %.2f ms), raw EVALSHA %.0f/s (p99 %.2f ms), ratio %.3f",
				n, benchClients, pairs.perSecond(), ms(pairs.quantile(0.50)), ms(pairs.quantile(0.99)),
				raw.perSecond(), ms(raw.quantile(0.99)), ratio)
			b.Logf("gpus=%d redis-server CPU per call (INFO cpu): place %.1f µs (%.1f× trivial), release %.1f µs (%.1f×), trivial script %.1f µs; busy %.0f%% in the pair phase",
				n, placeCPU, placeCPU/rawCPU, releaseCPU, releaseCPU/rawCPU, rawCPU, 100*cost["pair"].cpu/pairs.elapsed.Seconds())
			b.Logf("gpus=%d inside the script (INFO commandstats evalsha): place %.1f µs (%.1f×), release %.1f µs (%.1f×), trivial %.1f µs; %d places, %d releases",
				n, placeScript, placeScript/rawScript, releaseScript, releaseScript/rawScript, rawScript, places.ops, releases.ops)
		})
	}
}

// runCounted runs n ops from each of benchClients goroutines (op's i is
// 0..n-1) and returns what they did; the first error stops it.
func runCounted(ctx context.Context, n int, op func(ctx context.Context, client, i int, rnd *rand.Rand) error) (phaseResult, error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := time.Now()
	for c := range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(c), 11))
			for i := range n {
				if err := op(ctx, c, i, rnd); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return phaseResult{}, errs[0]
	}
	return phaseResult{ops: n * benchClients, elapsed: time.Since(start)}, nil
}

// redisStats is a reading of redis-server's counters.
type redisStats struct {
	cpu         float64 // used_cpu_user + used_cpu_sys, seconds
	scriptUsec  int64   // cmdstat_evalsha usec
	scriptCalls int64   // cmdstat_evalsha calls
}

// redisCost sums the differences of readings taken around the phases of
// one kind.
type redisCost struct {
	cpu         float64
	usec, calls int64
}

func (c *redisCost) add(before, after redisStats) {
	c.cpu += after.cpu - before.cpu
	c.usec += after.scriptUsec - before.scriptUsec
	c.calls += after.scriptCalls - before.scriptCalls
}

// perCall returns redis-server CPU µs and µs inside EVALSHA per EVALSHA.
func (c *redisCost) perCall() (cpu, script float64) {
	if c.calls == 0 {
		return 0, 0
	}
	return c.cpu / float64(c.calls) * 1e6, float64(c.usec) / float64(c.calls)
}

// fillFleet registers n H200s, 8 per node, and places filler slices on a
// quarter of them so the free-memory index holds many distinct scores.
func fillFleet(ctx context.Context, s *Store, n int) error {
	const workers = 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			for i := w; i < n; i += workers {
				uuid := fmt.Sprintf("GPU-%08d", i)
				g := fleet.GPU{UUID: uuid, Node: fmt.Sprintf("node-%05d", i/8), Model: "NVIDIA H200",
					MemoryMiB: 143771, SMCount: 132, Healthy: true}
				if err := s.RegisterGPU(ctx, g); err != nil {
					errs <- err
					return
				}
				if i%4 != 0 {
					continue
				}
				for j := range 1 + rnd.IntN(3) {
					a := fleet.Allocation{SliceID: fmt.Sprintf("fill-%d-%d", i, j), User: "filler",
						Slice:   fleet.Slice{MemoryMiB: int64(1024 * (1 + rnd.IntN(24))), ComputePercent: 10, ComputeLimitPercent: 10},
						GPUUUID: uuid}
					if _, err := s.Restore(ctx, a); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// serverStats reads redis-server's used CPU seconds (user + sys, main
// thread and children) from INFO cpu and the EVALSHA counters from INFO
// commandstats.
func serverStats(ctx context.Context, b *testing.B, rdb *redis.Client) redisStats {
	b.Helper()
	info, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		b.Fatalf("INFO: %v", err)
	}
	var st redisStats
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_cpu_user", "used_cpu_sys":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", k, err)
			}
			st.cpu += f
		case "cmdstat_evalsha":
			for _, kv := range strings.Split(v, ",") {
				name, val, _ := strings.Cut(kv, "=")
				var dst *int64
				switch name {
				case "calls":
					dst = &st.scriptCalls
				case "usec":
					dst = &st.scriptUsec
				default:
					continue
				}
				if *dst, err = strconv.ParseInt(val, 10, 64); err != nil {
					b.Fatalf("INFO commandstats %s: %v", kv, err)
				}
			}
		}
	}
	return st
}
