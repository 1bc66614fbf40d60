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
	"syscall"
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

// BenchmarkPlaceRelease measures place+release pairs with 64 concurrent
// clients on a fleet of 1,000 and 10,000 H200s (8 per node, a quarter of
// them partly filled), next to a trivial EVALSHA on the same server in the
// same run. Each b.N iteration measures -bench.phase (default 2 s) of each,
// in alternating rounds; run it with -benchtime=1x. It reports pairs/s and
// raw/s (one place and one release vs one trivial EVALSHA: a pair is two
// round trips, so the ratio cannot exceed about 0.5), their ratio, p50/p99
// of a pair in ms, and redis-server's and this process's CPU per operation.
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
			rawOp := func(ctx context.Context, _, _ int, _ *rand.Rand) error {
				return trivialScript.Run(ctx, rdb, nil).Err()
			}
			pairOp := func(ctx context.Context, c, i int, rnd *rand.Rand) error {
				cp := []int{5, 10, 20}[rnd.IntN(3)]
				req := fleet.PlaceRequest{
					SliceID:     fmt.Sprintf("bench-%d-%d", c, i),
					User:        fmt.Sprintf("user%d", c),
					Slice:       fleet.Slice{MemoryMiB: []int64{4096, 8192, 16384}[rnd.IntN(3)], ComputePercent: cp, ComputeLimitPercent: cp},
					UserQuota:   fleet.Quota{Servers: 10, MemoryMiB: 1 << 20, ComputePercent: 1000},
					GroupQuotas: map[string]fleet.Quota{"everyone": {Servers: 100000}},
				}
				if c%4 == 0 {
					req.Policy = fleet.PolicySpread
				}
				if _, err := s.Place(ctx, req); err != nil {
					return err
				}
				ok, err := s.Release(ctx, req.SliceID)
				if err == nil && !ok {
					err = fmt.Errorf("release %s freed nothing", req.SliceID)
				}
				return err
			}
			// The phases alternate in benchRounds short rounds, so that a
			// change in the machine's load between them (other processes on
			// a shared machine) biases the ratio as little as possible.
			var rawCPU, pairCPU, rawSelf, pairSelf float64
			var raw, pairs phaseResult
			round := *benchPhase / benchRounds
			for range b.N * benchRounds {
				cpu0, self0 := serverCPU(ctx, b, rdb), selfCPU(b)
				r, err := runPhase(ctx, round, rawOp)
				if err != nil {
					b.Fatalf("raw phase: %v", err)
				}
				cpu1, self1 := serverCPU(ctx, b, rdb), selfCPU(b)
				p, err := runPhase(ctx, round, pairOp)
				if err != nil {
					b.Fatalf("place+release phase: %v", err)
				}
				cpu2, self2 := serverCPU(ctx, b, rdb), selfCPU(b)
				raw, pairs = raw.add(r), pairs.add(p)
				rawCPU, rawSelf = rawCPU+cpu1-cpu0, rawSelf+self1-self0
				pairCPU, pairSelf = pairCPU+cpu2-cpu1, pairSelf+self2-self1
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
			b.ReportMetric(ms(raw.quantile(0.99)), "raw-p99-ms")
			us := func(cpu float64, r phaseResult) float64 { return cpu / float64(r.ops) * 1e6 }
			b.ReportMetric(us(pairCPU, pairs), "redis-cpu-us/pair")
			b.ReportMetric(us(pairSelf, pairs), "client-cpu-us/pair")
			b.Logf("gpus=%d clients=%d: place+release %.0f pairs/s (p50 %.2f ms, p99 %.2f ms), raw EVALSHA %.0f/s (p99 %.2f ms), ratio %.3f",
				n, benchClients, pairs.perSecond(), ms(pairs.quantile(0.50)), ms(pairs.quantile(0.99)),
				raw.perSecond(), ms(raw.quantile(0.99)), ratio)
			b.Logf("gpus=%d CPU per op: redis-server %.1f µs/pair vs %.1f µs/raw, client %.1f µs/pair vs %.1f µs/raw; redis-server busy %.0f%% (raw phase %.0f%%)",
				n, us(pairCPU, pairs), us(rawCPU, raw), us(pairSelf, pairs), us(rawSelf, raw),
				100*pairCPU/pairs.elapsed.Seconds(), 100*rawCPU/raw.elapsed.Seconds())
		})
	}
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

// serverCPU returns redis-server's used CPU seconds (user + sys, main
// thread and children) from INFO cpu.
func serverCPU(ctx context.Context, b *testing.B, rdb *redis.Client) float64 {
	b.Helper()
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		b.Fatalf("INFO cpu: %v", err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_user" && k != "used_cpu_sys") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", k, err)
		}
		total += f
	}
	return total
}

// selfCPU returns the CPU seconds (user + sys) this process has used.
func selfCPU(b *testing.B) float64 {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}
