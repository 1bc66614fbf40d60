package redisstore

import (
	"context"
	"flag"
	"fmt"
	"math"
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
// run, once with every operation in a script of its own (batch=1) and once
// with the Store's group commit (batch=DefaultBatch, batch.go). Each b.N iteration runs benchRounds rounds of four phases: the
// trivial script and place+release pairs for -bench.phase/benchRounds each
// (default 2 s in all), then place only (benchBatch slices per client) and
// release only (those slices). Run it with -benchtime=1x.
//
// It reports pairs/s and raw/s (a pair is two round trips, so their ratio
// cannot exceed about 0.5), their ratio, p50/p99 of a pair in ms, and the
// Redis cost of one place and one release (per operation, not per
// script; places/script and releases/script say how many a script carried
// on average) next to one trivial script: CPU
// µs of the redis-server process (INFO cpu, user + sys, so network I/O
// included) and µs inside the script (INFO commandstats, evalsha usec per
// call: wall time, so a descheduled server inflates it), and their
// multiples of the trivial script's (the -x metrics).
func BenchmarkPlaceRelease(b *testing.B) {
	srv := redistest.Start(b)
	for _, n := range []int{1000, 10000} {
		for _, batch := range []int{1, DefaultBatch} {
			b.Run(fmt.Sprintf("gpus=%d/batch=%d", n, batch), func(b *testing.B) {
				rdb := srv.Client(b)
				s := New(rdb, srv.Prefix(b), WithBatch(batch))
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
				rawCPU, rawScript, _ := cost["raw"].perOp(raw.ops)
				placeCPU, placeScript, placeBatch := cost["place"].perOp(places.ops)
				releaseCPU, releaseScript, releaseBatch := cost["release"].perOp(releases.ops)
				b.ReportMetric(placeCPU, "redis-cpu-us/place")
				b.ReportMetric(releaseCPU, "redis-cpu-us/release")
				b.ReportMetric(rawCPU, "redis-cpu-us/raw")
				b.ReportMetric(placeCPU/rawCPU, "place-cpu-x")
				b.ReportMetric(releaseCPU/rawCPU, "release-cpu-x")
				b.ReportMetric(placeBatch, "places/script")
				b.ReportMetric(releaseBatch, "releases/script")
				b.Logf("gpus=%d batch=%d clients=%d: place+release %.0f pairs/s (p50 %.2f ms, p99 %.2f ms), raw EVALSHA %.0f/s (p99 %.2f ms), ratio %.3f",
					n, batch, benchClients, pairs.perSecond(), ms(pairs.quantile(0.50)), ms(pairs.quantile(0.99)),
					raw.perSecond(), ms(raw.quantile(0.99)), ratio)
				b.Logf("gpus=%d redis-server CPU per operation (INFO cpu): place %.1f µs (%.1f× trivial), release %.1f µs (%.1f×), trivial script %.1f µs; busy %.0f%% in the pair phase; %.1f places and %.1f releases per script",
					n, placeCPU, placeCPU/rawCPU, releaseCPU, releaseCPU/rawCPU, rawCPU, 100*cost["pair"].cpu/pairs.elapsed.Seconds(), placeBatch, releaseBatch)
				b.Logf("gpus=%d inside the script per operation (INFO commandstats evalsha): place %.1f µs (%.1f×), release %.1f µs (%.1f×), trivial %.1f µs; %d places, %d releases",
					n, placeScript, placeScript/rawScript, releaseScript, releaseScript/rawScript, rawScript, places.ops, releases.ops)
			})
		}
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

// perOp returns redis-server CPU µs and µs inside EVALSHA per operation
// of ops (a batch script carries several) and the operations per EVALSHA.
func (c *redisCost) perOp(ops int) (cpu, script, batch float64) {
	if c.calls == 0 || ops == 0 {
		return 0, 0, 0
	}
	return c.cpu / float64(ops) * 1e6, float64(c.usec) / float64(ops), float64(ops) / float64(c.calls)
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

// scriptBodyLoops and scriptBodyN: BenchmarkPlaceReleaseScript runs
// scriptBodyLoops scripts of scriptBodyN places, releases and HGETs each.
const (
	scriptBodyLoops = 15
	scriptBodyN     = 200
)

// BenchmarkPlaceReleaseScript measures what BenchmarkPlaceRelease cannot
// separate on a busy machine: the Redis time of the place.lua and
// release.lua bodies alone (no network, no argument parsing), next to one
// redis.call (an HGET of a missing field) in the same script. One script
// holds lib.lua, place.lua and release.lua (their functions), and a loop that places
// scriptBodyN slices on a fleet of 1,000 H200s (8 GiB, 10 %, binpack, a
// user and one group; the KEYS and ARGV Store.Place and Store.Release
// give each operation of a batch, shared and own), releases them and runs scriptBodyN HGETs, timed
// with TIME; the minimum over scriptBodyLoops scripts keeps out the time
// other processes took. It reports ns per place, per release and per call
// and their ratios (-x). Run it with -benchtime=1x.
func BenchmarkPlaceReleaseScript(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	s := New(rdb, srv.Prefix(b))
	ctx := b.Context()
	if err := s.MarkReconciled(ctx); err != nil {
		b.Fatal(err)
	}
	if err := fillFleet(ctx, s, 1000); err != nil {
		b.Fatal(err)
	}
	req := fleet.PlaceRequest{SliceID: "body-0", User: "user1",
		Slice:       fleet.Slice{MemoryMiB: 8192, ComputePercent: 10, ComputeLimitPercent: 10},
		UserQuota:   fleet.Quota{Servers: 100000, MemoryMiB: 1 << 40, ComputePercent: 1 << 30},
		GroupQuotas: map[string]fleet.Quota{"everyone": {Servers: 100000}}}
	place, err := s.placeOp(req)
	if err != nil {
		b.Fatal(err)
	}
	release := s.releaseOp(req.SliceID)
	ps, rs := s.placeShared(), s.releaseShared()
	pk, pa := append(ps.keys, place.keys...), append(ps.args, place.args...)
	rk, ra := append(rs.keys, release.keys...), append(rs.args, release.args...)
	// The slice id is ARGV[3] of place.lua and ARGV[2] of release.lua.
	script := libConsts + libLua + placeLua + "\n" + releaseLua + `
local np, nr, N = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local pk, rk, pa, ra = {}, {}, {}, {}
for i = 1, ` + strconv.Itoa(len(pk)) + ` do pk[i] = KEYS[i] end
for i = 1, ` + strconv.Itoa(len(rk)) + ` do rk[i] = KEYS[` + strconv.Itoa(len(pk)) + ` + i] end
for i = 1, np do pa[i] = ARGV[3 + i] end
for i = 1, nr do ra[i] = ARGV[3 + np + i] end
local ids = {}
for i = 1, N do ids[i] = 'body-' .. i end
local function now() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end
local t0 = now()
for i = 1, N do
  pa[3] = ids[i]
  local r = place(pk, pa)
  if r[1] ~= 'placed' then return redis.error_reply('place ' .. ids[i] .. ': ' .. tostring(r[1])) end
end
local t1 = now()
for i = 1, N do
  ra[2] = ids[i]
  if release(rk, ra) ~= 1 then return redis.error_reply('release ' .. ids[i] .. ' freed nothing') end
end
local t2 = now()
for i = 1, N do redis.call('HGET', pk[2], 'no such slice') end
local t3 = now()
return {tostring((t1 - t0) * 1000 / N), tostring((t2 - t1) * 1000 / N), tostring((t3 - t2) * 1000 / N)}
`
	argv := append([]any{len(pa), len(ra), scriptBodyN}, pa...)
	argv = append(argv, ra...)
	b.ResetTimer()
	best := [3]float64{math.Inf(1), math.Inf(1), math.Inf(1)}
	for range b.N * scriptBodyLoops {
		res, err := rdb.Eval(ctx, script, append(slices.Clone(pk), rk...), argv...).StringSlice()
		if err != nil {
			b.Fatal(err)
		}
		for i := range best {
			f, err := strconv.ParseFloat(res[i], 64)
			if err != nil {
				b.Fatalf("script reply %v: %v", res, err)
			}
			best[i] = min(best[i], f)
		}
	}
	b.StopTimer()
	if err := s.Verify(ctx); err != nil {
		b.Fatalf("invariants after the run: %v", err)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(best[0], "place-ns")
	b.ReportMetric(best[1], "release-ns")
	b.ReportMetric(best[2], "call-ns")
	b.ReportMetric(best[0]/best[2], "place-x")
	b.ReportMetric(best[1]/best[2], "release-x")
	b.Logf("script bodies on 1,000 GPUs (min of %d loops of %d): place %.0f ns (%.1f× one redis.call), release %.0f ns (%.1f×), one HGET call %.0f ns",
		scriptBodyLoops, scriptBodyN, best[0], best[0]/best[2], best[1], best[1]/best[2], best[2])
}
