package harness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Load shapes a closed-loop load: Workers goroutines each run the next
// operation as soon as their last one ended, all of them together starting
// at most Rate operations per second, until Count operations have started.
type Load struct {
	// Count is the number of operations; > 0.
	Count int
	// Workers is the number of operations in flight at most; default 1.
	Workers int
	// Rate caps the operations started per second across the workers
	// (burst 1); 0 means no cap.
	Rate float64
	// Progress, when set, is called about every 5 s with the operations
	// done so far, from one goroutine.
	Progress func(done, failed int)
}

// LoadResult is what a Run measured: the wall time from the first start to
// the last end, and each successful operation's latency in completion
// order.
type LoadResult struct {
	Wall      time.Duration
	Latencies []time.Duration
}

// PerSecond is the successful operations per second of wall time.
func (r LoadResult) PerSecond() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(len(r.Latencies)) / r.Wall.Seconds()
}

// Quantile is the q-quantile (0..1) of the latencies by the nearest-rank
// method; 0 without latencies.
func (r LoadResult) Quantile(q float64) time.Duration { return Quantile(r.Latencies, q) }

// Quantile is the q-quantile (0..1) of ds by the nearest-rank method; 0
// when ds is empty. ds is not changed.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Run runs op for i = 0..Count-1 under l's shape and returns the wall time
// and latencies. op returns the latency it measured (its own start to its
// own end: what "create → running" means is op's business). The first
// error stops new operations; Run then waits for those in flight and
// returns every error joined, with the result so far.
func (l Load) Run(ctx context.Context, op func(ctx context.Context, i int) (time.Duration, error)) (LoadResult, error) {
	if l.Count <= 0 {
		return LoadResult{}, fmt.Errorf("load: count %d, want > 0", l.Count)
	}
	workers := max(l.Workers, 1)
	var lim *rate.Limiter
	if l.Rate > 0 {
		lim = rate.NewLimiter(rate.Limit(l.Rate), 1)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next         atomic.Int64
		done, failed atomic.Int64
		mu           sync.Mutex
		res          LoadResult
		errs         []error
		wg           sync.WaitGroup
	)
	stopProgress := make(chan struct{})
	var pwg sync.WaitGroup
	if l.Progress != nil {
		pwg.Go(func() {
			t := time.NewTicker(5 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-stopProgress:
					return
				case <-t.C:
					l.Progress(int(done.Load()), int(failed.Load()))
				}
			}
		})
	}
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= l.Count || ctx.Err() != nil {
					return
				}
				if lim != nil {
					if err := lim.Wait(ctx); err != nil {
						return
					}
				}
				d, err := op(ctx, i)
				mu.Lock()
				if err != nil {
					failed.Add(1)
					if ctx.Err() == nil || !errors.Is(err, context.Canceled) {
						errs = append(errs, err)
					}
					cancel()
				} else {
					done.Add(1)
					res.Latencies = append(res.Latencies, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Wall = time.Since(start)
	close(stopProgress)
	pwg.Wait()
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Errorf("and %d more errors", len(errs)-5))
	}
	return res, errors.Join(errs...)
}
