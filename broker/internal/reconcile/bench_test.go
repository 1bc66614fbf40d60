package reconcile_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reconcile"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
)

// steadyFleet starts a fixture with n running servers of profile small,
// ten for each of the users u000, u001, … (the default quota), on n/4+1
// GPUs of 40960 MiB, and waits until every record is running.
func steadyFleet(b *testing.B, n int) *serverstest.Fixture {
	b.Helper()
	f := serverstest.New(b)
	ctx := b.Context()
	for g := range n/4 + 1 {
		gpu := fleet.GPU{UUID: fmt.Sprintf("gpu-%04d", g), Node: fmt.Sprintf("node-%03d", g/8), Model: "NVIDIA H200", MemoryMiB: 40960, SMCount: 132, Healthy: true}
		if err := f.Store.RegisterGPU(ctx, gpu); err != nil {
			b.Fatal(err)
		}
	}
	for i := range n {
		user, name := fmt.Sprintf("u%03d", i/10), fmt.Sprintf("s%d", i%10)
		if _, _, err := f.Service.Create(ctx, serverstest.By, user, nil, name, v1.CreateServerRequest{Profile: "small"}, "k"); err != nil {
			b.Fatalf("create %s/%s: %v", user, name, err)
		}
		f.SetPodRunning(b, user, name, fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255))
	}
	for i := range n {
		f.WaitState(b, fleet.ServerKey{User: fmt.Sprintf("u%03d", i/10), Name: fmt.Sprintf("s%d", i%10)}, v1.StateRunning)
	}
	return f
}

// wholeAllocations is the store as the pass read it before it took only
// the slice ids: every allocation read (HGETALL) and decoded.
type wholeAllocations struct{ *redisstore.Store }

func (w wholeAllocations) AllocationIDs(ctx context.Context) ([]string, error) {
	allocs, err := w.Allocations(ctx)
	ids := make([]string, len(allocs))
	for i, a := range allocs {
		ids[i] = a.SliceID
	}
	return ids, err
}

// BenchmarkSteadyPass times one reconcile pass over a steady fleet of
// running servers (real Redis, the real spawner on client-go's fake
// clientset), passes that read the allocations' slice ids (HKEYS, ids-ms)
// alternating with passes that read and decode every allocation as the
// pass did before (whole-ms), and reports the fastest pass of each and
// their ratio (the fastest, so that a busy machine does not hide a change).
func BenchmarkSteadyPass(b *testing.B) {
	for _, n := range []int{1000, 4000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			f := steadyFleet(b, n)
			ids := newReconciler(f)
			whole := reconcile.New(wholeAllocations{f.Store}, f.Pods, f.Service, f.Log, grace, time.Hour, f.Clock.Now)
			ctx := context.Background()
			tIDs, tWhole := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
			once := func(r *reconcile.Reconciler) time.Duration {
				start := time.Now()
				rep, err := r.Once(ctx)
				if err != nil || rep.Servers != n || rep.Allocations != n || !rep.Complete || repairs(rep) > 0 {
					b.Fatalf("steady pass: %+v %v", rep, err)
				}
				return time.Since(start)
			}
			for b.Loop() {
				tWhole = min(tWhole, once(whole))
				tIDs = min(tIDs, once(ids))
			}
			b.ReportMetric(float64(tIDs)/float64(time.Millisecond), "ids-ms")
			b.ReportMetric(float64(tWhole)/float64(time.Millisecond), "whole-ms")
			b.ReportMetric(float64(tIDs)/float64(tWhole), "ids/whole")
		})
	}
}

// repairs is the number of repairs rep counts, of every kind.
func repairs(rep reconcile.Report) int {
	n := 0
	for _, k := range rep.Repairs() {
		n += k
	}
	return n
}
