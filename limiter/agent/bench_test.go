package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// cpuTime is this process's user + system CPU time.
func cpuTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchAgent is an agent on 8 GPUs × 50 slices (one process each) of the
// dgxh200 mock over a fake /proc, with a usage region per slice, writing
// into a real redis-server.
func benchAgent(b *testing.B) (a *Agent, store *agentstore.Store, rdb *redis.Client, clock *fakeClock) {
	b.Helper()
	lib := dgxh200.New()
	proc := newFakeProc(b)
	root := b.TempDir()
	var pods StaticPods
	for g := range benchGPUs {
		uuid, _ := lib.Devices[g].GetUUID()
		var procs []nvml.ProcessInfo
		var util []nvml.ProcessUtilizationSample
		for s := range benchPerGPU {
			pid := uint32(10000 + g*benchPerGPU + s)
			uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", g, s)
			proc.add(pid, 1, uint64(pid), uid, testCID)
			id := fmt.Sprintf("slice-%d-%d", g, s)
			if err := os.MkdirAll(filepath.Join(root, v1.HostSlicesSubdir, id, "usage"), 0o755); err != nil {
				b.Fatal(err)
			}
			// A usage region as the pod's first hook leaves it.
			initUsage(b, filepath.Join(root, v1.HostSlicesSubdir, id, "usage", v1.UsageFileName))
			pods = append(pods, SliceInfo{ID: id, PodUID: uid, Pod: "nb", Namespace: "ns", GPU: uuid,
				Initial: v1.Slice{MemoryMiB: 2048, ComputePercent: 2, ComputeLimitPercent: 2}})
			procs = append(procs, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: uint64(s+1) << 24})
			util = append(util, nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: 1, SmUtil: uint32(s % 3)})
		}
		d := lib.Devices[g].(*server.Device)
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
		d.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return util, nvml.SUCCESS }
	}
	srv := redistest.Start(b)
	rdb = srv.Client(b)
	store = agentstore.New(rdb, srv.Prefix(b))
	clock = &fakeClock{now: time.Now()}
	a, err := New(Config{Node: "gpu-1", HostRoot: root}, Deps{NVML: lib, Samples: store, Quotas: store, Audit: store,
		Pods: pods, Proc: ProcFS{Root: proc.root}, Killer: &fakeKiller{}, Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	if a.devs, err = discoverDevices(lib, "gpu-1", a.has, clock.Now()); err != nil {
		b.Fatal(err)
	}
	return a, store, rdb, clock
}

const benchGPUs, benchPerGPU = 8, 50

// BenchmarkSampleWrites8x50 measures whole sampling rounds of an agent on
// 8 GPUs × 50 slices (one process each, on go-nvml's dgxh200 mock over a
// fake /proc, with a usage region per slice) writing into a real
// redis-server, against a raw pipeline of the same XADD commands on the
// same server, and Store.AddSamples alone (the Redis contract's own cost).
// It reports samples per second for each, the ratios to raw, and the
// agent's CPU time per sample (this process: NVML calls, /proc and region
// reads, encoding, the Redis client; not redis-server).
func BenchmarkSampleWrites8x50(b *testing.B) {
	const gpus, perGPU, rounds = benchGPUs, benchPerGPU, 20
	a, store, rdb, clock := benchAgent(b)
	ctx := b.Context()
	a.SampleOnce(ctx) // warm the caches and the connection pool

	var agentDur, storeDur, rawDur, cpu time.Duration
	samples := 0
	for b.Loop() {
		c0, t0 := cpuTime(b), time.Now()
		for range rounds {
			clock.Advance(time.Second)
			a.SampleOnce(ctx)
		}
		agentDur += time.Since(t0)
		cpu += cpuTime(b) - c0
		samples += rounds * gpus * perGPU

		r := a.sampleRound(ctx)
		batch := make([]agentstore.Sample, 0, len(r.Slices))
		args := make([]*redis.XAddArgs, 0, len(r.Slices))
		for _, s := range r.Slices {
			batch = append(batch, s.Sample)
			args = append(args, store.XAddArgs(s.Sample))
		}
		t2 := time.Now()
		for range rounds {
			if err := store.AddSamples(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		storeDur += time.Since(t2)
		t1 := time.Now()
		for range rounds {
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, x := range args {
					p.XAdd(ctx, x)
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
		rawDur += time.Since(t1)
	}
	n, err := rdb.XLen(context.WithoutCancel(ctx), store.Keys().Samples("slice-7-49")).Result()
	if err != nil || n < int64(rounds) {
		b.Fatalf("slice-7-49 has %d samples (%v); the agent's writes failed", n, err)
	}
	agentRate := float64(samples) / agentDur.Seconds()
	rawRate := float64(samples) / rawDur.Seconds()
	storeRate := float64(samples) / storeDur.Seconds()
	b.ReportMetric(agentRate, "agent-samples/s")
	b.ReportMetric(rawRate, "raw-samples/s")
	b.ReportMetric(agentRate/rawRate, "agent/raw")
	b.ReportMetric(storeRate/rawRate, "store/raw")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(samples)/1000, "cpu-µs/sample")
	b.Logf("8 GPUs × 50 slices: whole agent rounds %.0f samples/s, AddSamples alone %.0f samples/s, raw XADD pipeline %.0f samples/s; "+
		"ratios agent/raw %.3f, store/raw %.2f; agent CPU %.1f µs per sample",
		agentRate, storeRate, rawRate, agentRate/rawRate, storeRate/rawRate, float64(cpu.Nanoseconds())/float64(samples)/1000)
}

// BenchmarkPaceRound8x50 measures one pace round (utilization from NVML and
// a sample into each of the 400 usage regions) and reports its wall and CPU
// time and the share of one core the feed takes at the default 100 ms.
func BenchmarkPaceRound8x50(b *testing.B) {
	a, _, _, _ := benchAgent(b)
	ctx := b.Context()
	a.SampleOnce(ctx)
	c0, t0 := cpuTime(b), time.Now()
	n := 0
	for b.Loop() {
		a.paceRound(ctx)
		n++
	}
	wall, cpu := time.Since(t0)/time.Duration(n), (cpuTime(b)-c0)/time.Duration(n)
	b.ReportMetric(float64(cpu.Microseconds()), "cpu-µs/round")
	b.ReportMetric(float64(cpu)/float64(DefaultPaceInterval)*100, "%core@100ms")
	b.Logf("pace round over 400 slices: %s wall, %s CPU; %.1f %% of a core at one round per %s",
		wall, cpu, float64(cpu)/float64(DefaultPaceInterval)*100, DefaultPaceInterval)
}
