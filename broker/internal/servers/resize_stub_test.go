package servers_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
)

// This file runs resize end to end on the stub driver: the broker's
// Service.Resize over the real store, the real node agent (real go-nvml
// bindings on the stub libnvidia-ml.so.1) and the real hook
// (libgpulimit.so) in a running process on the stub libcuda.so.1, with a
// real redis-server. It lives here rather than in limiter/agent because
// limiter/agent may not import broker/internal.

const mibBytes = 1 << 20

// hookLimitMiB is the memory total the hook shows the process: its cap.
func hookLimitMiB(tb testing.TB, p *stubtest.Prog) int64 {
	tb.Helper()
	res, v := p.Do("meminfo")
	if res != 0 || len(v) != 2 {
		tb.Fatalf("meminfo: CUresult %d %v", res, v)
	}
	return int64(v[1] / mibBytes)
}

// stubRig is a running server alice/lab whose notebook process runs under
// the hook on the stub device, the real agent serving its slice, and a
// Service that resizes it.
type stubRig struct {
	f     *serverstest.Fixture
	svc   *servers.Service
	store *agentstore.Store
	key   fleet.ServerKey
	spawn string
	prog  *stubtest.Prog
}

func newStubRig(tb testing.TB, t *testing.T, log *slog.Logger) *stubRig {
	tb.Helper()
	stubtest.Need(tb)
	f := serverstest.New(t)
	key, rec := runningLab(t, f)
	initial := rec.Slice

	dir := tb.TempDir()
	state := filepath.Join(dir, "stub.state")
	t.Setenv("GPUBROKER_STUB_STATE", state) // the stub NVML the agent loads in this process
	root := filepath.Join(dir, "host")
	sliceDir := filepath.Join(root, v1.HostSlicesSubdir, rec.SpawnID)
	env := append(stubtest.Environ(), "GPUBROKER_STUB_STATE="+state, "LD_LIBRARY_PATH="+stubtest.StubDir())

	rdb := f.Redis.Client(t)
	store := agentstore.New(rdb, f.Redis.Prefix(t))
	a, err := agent.New(agent.Config{Node: "n1", HostRoot: root, TrustUsagePIDs: true, Enforcement: agent.Policy{Mode: agent.ModeReport}},
		agent.Deps{NVML: nvml.New(nvml.WithLibraryPath(filepath.Join(stubtest.StubDir(), "libnvidia-ml.so.1"))),
			Samples: store, Quotas: store, Audit: store, Log: log,
			Pods: agent.StaticPods{{ID: rec.SpawnID, PodUID: "uid-1", Pod: rec.Pod, Namespace: serverstest.Namespace,
				User: "alice", Server: "lab", GPU: stubtest.DeviceUUID, Initial: initial}}})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent Run: %v", err)
		}
	})
	// The agent prepares the slice as soon as it sees it: the notebook's
	// process then finds its first quota (the pod's slice) at start.
	stubtest.Eventually(tb, "the slice's first quota file", func() (bool, string) {
		_, err := os.Stat(filepath.Join(sliceDir, "quota", v1.QuotaFileName))
		return err == nil, fmt.Sprint(err)
	})
	p := stubtest.StartInSlice(tb, env, filepath.Join(sliceDir, "quota"), filepath.Join(sliceDir, "usage"))
	// The agent is listening for quota changes once it has subscribed.
	stubtest.Eventually(tb, "the agent's quota subscription", func() (bool, string) {
		m, err := rdb.PubSubNumSub(t.Context(), store.Keys().QuotaChanged()).Result()
		return err == nil && m[store.Keys().QuotaChanged()] > 0, fmt.Sprint(m, err)
	})
	svc := servers.New(f.Store, f.Pods, f.Catalog, f.Log, servers.WithClock(time.Now),
		servers.WithResize(servers.ResizeConfig{Store: f.Store, Quotas: store, Pods: f.Pods, Wait: 5 * time.Second, Poll: time.Millisecond}))
	return &stubRig{f: f, svc: svc, store: store, key: key, spawn: rec.SpawnID, prog: p}
}

// TestResizeOnStubChangesTheHooksLimit grows and shrinks a running
// notebook's slice through Service.Resize and watches the hook's memory
// cap in the still-running process follow; a shrink below what the process
// holds (as the agent sampled it from the stub's NVML) is refused with the
// figure.
func TestResizeOnStubChangesTheHooksLimit(t *testing.T) {
	r := newStubRig(t, t, slog.New(slog.DiscardHandler))
	ctx := t.Context()
	if got := hookLimitMiB(t, r.prog); got != 10240 {
		t.Fatalf("hook's cap before any resize = %d MiB, want the profile's 10240", got)
	}
	if res, _ := r.prog.Do("alloc linear 12884901888"); res != 2 {
		t.Fatalf("12 GiB under a 10 GiB cap: CUresult %d, want 2 (out of memory)", res)
	}

	// Grow: 16 GiB, applied; the same process may now hold 12 GiB.
	res, err := r.svc.Resize(ctx, r.key, fleet.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 60}, serverstest.By)
	if err != nil || !res.Applied {
		t.Fatalf("grow: %+v, %v; want applied", res, err)
	}
	stubtest.Eventually(t, "the hook's cap at 16384 MiB", func() (bool, string) {
		got := hookLimitMiB(t, r.prog)
		return got == 16384, fmt.Sprint(got)
	})
	if res, _ := r.prog.Do("alloc linear 12884901888"); res != 0 {
		t.Fatalf("12 GiB under the grown 16 GiB cap: CUresult %d, want 0", res)
	}

	// Shrink below use: the agent's sample of the stub shows ≥ 12 GiB held.
	var used int64
	stubtest.Eventually(t, "a fresh sample with the 12 GiB", func() (bool, string) {
		s, err := r.store.LatestSample(ctx, r.spawn)
		if err != nil || s.MemoryUsedMiB == nil || s.Stale(time.Now()) || *s.MemoryUsedMiB < 12288 {
			return false, fmt.Sprintf("%+v %v", s, err)
		}
		used = *s.MemoryUsedMiB
		return true, ""
	})
	_, err = r.svc.Resize(ctx, r.key, fleet.Slice{MemoryMiB: 4096, ComputePercent: 30, ComputeLimitPercent: 60}, serverstest.By)
	want := fmt.Sprintf("the notebook uses %d MiB now; memory cannot shrink below that", used)
	if err == nil || fleet.Message(err) != want {
		t.Fatalf("shrink below use: err = %v, want %q", err, want)
	}
	if got := hookLimitMiB(t, r.prog); got != 16384 {
		t.Errorf("hook's cap after the refused shrink = %d MiB, want 16384", got)
	}

	// Free, then shrink: applied, and the process is held to 2 GiB.
	if res, _ := r.prog.Do("free"); res != 0 {
		t.Fatalf("free: CUresult %d", res)
	}
	stubtest.Eventually(t, "a fresh sample after the free", func() (bool, string) {
		s, err := r.store.LatestSample(ctx, r.spawn)
		return err == nil && s.MemoryUsedMiB != nil && !s.Stale(time.Now()) && *s.MemoryUsedMiB < 2048, fmt.Sprintf("%+v %v", s, err)
	})
	res, err = r.svc.Resize(ctx, r.key, fleet.Slice{MemoryMiB: 2048, ComputePercent: 10, ComputeLimitPercent: 10}, serverstest.By)
	if err != nil || !res.Applied || res.Generation != 2 {
		t.Fatalf("shrink: %+v, %v; want applied generation 2", res, err)
	}
	stubtest.Eventually(t, "the hook's cap at 2048 MiB", func() (bool, string) {
		got := hookLimitMiB(t, r.prog)
		return got == 2048, fmt.Sprint(got)
	})
	if res, _ := r.prog.Do("alloc linear 3221225472"); res != 2 {
		t.Errorf("3 GiB under the shrunk 2 GiB cap: CUresult %d, want 2 (out of memory)", res)
	}
	select {
	case <-r.prog.Exited():
		t.Fatalf("the notebook process exited during the resizes; stderr: %s", r.prog.Stderr())
	default:
	}
	if err := r.f.Store.Verify(ctx); err != nil {
		t.Errorf("invariants: %v", err)
	}
}

// resizeLatency turns on TestResizeLatencyToHook (the bench task sets it).
var resizeLatency = flag.Bool("resize-latency", false, "measure resize latency to the hook (bench task)")

// TestResizeLatencyToHook is the measurement behind the bench task
// (go test -run TestResizeLatencyToHook -v ./broker/internal/servers/ -args
// -resize-latency): rounds resizes alternating between 4096 and 8192 MiB
// over real Redis, the real agent and the real hook on the stub, each timed
// from the Service.Resize call (what the PATCH handler calls) until the hook
// in the running process reports the new cap. It prints p50/p99 and fails
// if p99 exceeds 500 ms. It is a test rather than a Benchmark because the
// lifecycle fixture it builds on takes a *testing.T.
func TestResizeLatencyToHook(t *testing.T) {
	if !*resizeLatency {
		t.Skip("latency measurement; run with -args -resize-latency (go tool task bench)")
	}
	r := newStubRig(t, t, slog.New(slog.DiscardHandler))
	// Shrinks need a fresh sample of the notebook's memory use; the agent
	// takes one every second.
	stubtest.Eventually(t, "a first sample", func() (bool, string) {
		s, err := r.store.LatestSample(t.Context(), r.spawn)
		return err == nil && !s.Stale(time.Now()), fmt.Sprint(err)
	})
	const rounds = 200
	var d []time.Duration
	for i := range rounds {
		mem := int64(4096 + 4096*(i%2))
		start := time.Now()
		res, err := r.svc.Resize(t.Context(), r.key, fleet.Slice{MemoryMiB: mem, ComputePercent: 20, ComputeLimitPercent: 50}, serverstest.By)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		stubtest.Eventually(t, "the hook's new cap", func() (bool, string) {
			got := hookLimitMiB(t, r.prog)
			return got == mem, fmt.Sprint(got)
		})
		d = append(d, time.Since(start))
		if !res.Applied {
			t.Errorf("round %d: pending, want applied", i)
		}
	}
	slices.Sort(d)
	p50, p99 := d[len(d)/2], d[(len(d)*99+99)/100-1]
	t.Logf("resize API call → hook applied over %d resizes: p50 %v, p99 %v, max %v (target p99 ≤ 500ms)", rounds, p50, p99, d[len(d)-1])
	if p99 > 500*time.Millisecond {
		t.Errorf("p99 %v exceeds 500 ms", p99)
	}
}
