package agent

import (
	"context"
	"encoding/json"

	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// The stub device's defaults (limiter/hook/stub/device.c).
const (
	stubModel  = "NVIDIA H100 80GB HBM3"
	stubMemMiB = 81559
)

// stubState is stubctl's JSON.
type stubState struct {
	UUID       string `json:"uuid"`
	TotalBytes uint64 `json:"total_bytes"`
	SMCount    uint64 `json:"sm_count"`
	NowNs      uint64 `json:"now_ns"`
	Procs      []struct {
		PID      uint32 `json:"pid"`
		MemBytes uint64 `json:"mem_bytes"`
		SMNs     uint64 `json:"sm_ns"`
		Launches uint64 `json:"launches"`
		StallNs  uint64 `json:"stall_ns"` // gaps between its launches beyond 10 ms, summed
	} `json:"procs"`
}

// askingShare is pid's share of the device's SM time from a to b, in
// percent, over the time it was asking: the span less the stalls the stub
// counted (a launcher descheduled on a loaded machine asks for nothing
// meanwhile; the hook's bucket makes up shorter gaps).
func askingShare(a, b stubState, pid uint32) float64 {
	var stall uint64
	for _, p := range b.Procs {
		if p.PID == pid {
			stall = p.StallNs
		}
	}
	for _, p := range a.Procs {
		if p.PID == pid {
			stall -= p.StallNs
		}
	}
	span := float64(b.NowNs-a.NowNs) - float64(stall)
	if span <= 0 {
		return 0
	}
	return float64(b.smNs(pid)-a.smNs(pid)) / (span * float64(b.SMCount)) * 100
}

// wallShare is pid's share of the device's SM time from a to b, in
// percent, over the whole span: the SM time the stub charged to it over
// the span times the SM count, as NVML's per-process smUtil (and so the
// node agent's pace feed) measures it.
func wallShare(a, b stubState, pid uint32) float64 {
	span := float64(b.NowNs - a.NowNs)
	if span <= 0 {
		return 0
	}
	return float64(b.smNs(pid)-a.smNs(pid)) / (span * float64(b.SMCount)) * 100
}

// smNs returns the SM-nanoseconds charged to pid so far.
func (s stubState) smNs(pid uint32) uint64 {
	for _, p := range s.Procs {
		if p.PID == pid {
			return p.SMNs
		}
	}
	return 0
}

func readStub(t *testing.T, env []string) stubState {
	t.Helper()
	cmd := exec.Command(filepath.Join(stubtest.BuildDir(), "stubctl"))
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("stubctl: %v", err)
	}
	var s stubState
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("stubctl: %v: %s", err, out)
	}
	return s
}

// TestAgentOnStubDriver runs the agent with the real go-nvml bindings on
// the stub libnvidia-ml.so.1 while a hooked program allocates and launches
// on the stub libcuda.so.1, with a real redis-server. The agent prepares the
// slice (directories, usage region, first quota from the pod) before the
// program starts, as it does when it sees a new pod; a process in no pod
// (the host's) is reported, never stopped; a process of the slice that
// allocates past the hook is stopped by the default policy.
func TestAgentOnStubDriver(t *testing.T) {
	stubtest.Need(t)
	dir := t.TempDir()
	stubEnv := "GPUBROKER_STUB_STATE=" + filepath.Join(dir, "stub.state")
	// The stub NVML loaded into this test process finds the device here.
	t.Setenv("GPUBROKER_STUB_STATE", filepath.Join(dir, "stub.state"))

	root := filepath.Join(dir, "host")
	const id = "spawn-7f3a"
	sliceDir := filepath.Join(root, v1.HostSlicesSubdir, id)
	quotaFile := filepath.Join(sliceDir, "quota", v1.QuotaFileName)
	env := append(stubtest.Environ(), stubEnv, "LD_LIBRARY_PATH="+stubtest.StubDir())

	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := agentstore.New(rdb, srv.Prefix(t))
	clock := &fakeClock{now: time.Now()}
	pods := StaticPods{{ID: id, PodUID: uidA, Pod: "nb", Namespace: "ns", User: "alice", Server: "lab", GPU: stubtest.DeviceUUID,
		Initial: v1.Slice{MemoryMiB: 1024, ComputePercent: 50, ComputeLimitPercent: 50}}}
	// The default policy (stop) with the real pidfd killer.
	a, err := New(Config{Node: "gpu-1", HostRoot: root, TrustUsagePIDs: true, Enforcement: Policy{Samples: 2, OrphanGrace: time.Second}},
		Deps{NVML: nvml.New(nvml.WithLibraryPath(filepath.Join(stubtest.StubDir(), "libnvidia-ml.so.1"))),
			Samples: store, Quotas: store, Audit: store, Pods: pods, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	t.Cleanup(stop)

	// The agent prepares the slice at once: its first quota is the pod's.
	stubtest.Eventually(t, "the slice's first quota file", func() (bool, string) {
		q, err := region.ReadQuota(quotaFile)
		return err == nil && q.MemoryLimitBytes == 1024*mib && q.Generation == 1 && q.GPUUUID == stubtest.DeviceUUID, fmt.Sprintf("%+v %v", q, err)
	})
	quotaDir, usageDir := filepath.Join(sliceDir, "quota"), filepath.Join(sliceDir, "usage")
	prog := stubtest.StartInSlice(t, env, quotaDir, usageDir)
	if res, _ := prog.Do("alloc linear 268435456"); res != 0 {
		t.Fatalf("alloc 256 MiB: CUresult %d", res)
	}
	if res, _ := prog.Do("saturate busy_100us 264 300"); res != 0 {
		t.Fatalf("saturate: CUresult %d", res)
	}

	// Inventory: the heartbeat registers the stub GPU as NVML describes it.
	stubtest.Eventually(t, "node report", func() (bool, string) {
		inv, err := store.Inventory(t.Context(), clock.Now())
		if err != nil || len(inv.GPUs) != 1 {
			return false, fmt.Sprintf("%+v %v", inv, err)
		}
		g := inv.GPUs[0].GPU
		want := v1.GPU{UUID: stubtest.DeviceUUID, Node: "gpu-1", Model: stubModel, MemoryMiB: stubMemMiB, SMCount: 132, Healthy: true}
		return g == want, fmt.Sprintf("%+v", g)
	})

	// Samples: what the stub simulated for the process.
	st := readStub(t, env)
	if len(st.Procs) != 1 || st.Procs[0].PID != uint32(prog.Pid()) {
		t.Fatalf("stub processes %+v, want cudaprog's pid %d only", st.Procs, prog.Pid())
	}
	wantMiB := int64((st.Procs[0].MemBytes + mib - 1) / mib)
	// NVML's utilization sample covers the time since the previous query
	// (the hook's own pace controller queries too): on a loaded machine the
	// agent's round may find a window after the launches ended. Saturate
	// again before each of up to five rounds until one measures the work.
	var s agentstore.Sample
	for try := 0; ; try++ {
		if try > 0 {
			if res, _ := prog.Do("saturate busy_100us 264 300"); res != 0 {
				t.Fatalf("saturate: CUresult %d", res)
			}
		}
		clock.Advance(time.Second)
		clock.fire(t.Context(), time.Second)
		want := clock.Now().Truncate(time.Millisecond)
		stubtest.Eventually(t, "the round's sample", func() (bool, string) {
			s, err = store.LatestSample(t.Context(), id)
			return err == nil && s.At.Equal(want), fmt.Sprint(s.At, err)
		})
		if (s.SMPercent != nil && *s.SMPercent > 0) || try == 4 {
			break
		}
	}
	t.Logf("stub: %+v; sample: sm %v mem %v np %v lk %v", st.Procs, deref(s.SMPercent), deref(s.MemoryUsedMiB), deref(s.Processes), s.LastKernel)
	if s.MemoryUsedMiB == nil || *s.MemoryUsedMiB != wantMiB || wantMiB < 256 {
		t.Errorf("sample memory %v MiB, want the stub's %d MiB (>= 256)", s.MemoryUsedMiB, wantMiB)
	}
	if s.Processes == nil || *s.Processes != 1 {
		t.Errorf("sample processes %v, want 1", s.Processes)
	}
	if s.SMPercent == nil || *s.SMPercent <= 0 {
		t.Errorf("sample SM %v %%, want > 0 after saturating launches", s.SMPercent)
	}
	if s.LastKernel == nil || s.LastKernel.IsZero() || time.Since(*s.LastKernel) > time.Minute {
		t.Errorf("sample last kernel %v, want the recent launches", s.LastKernel)
	}
	if s.MemoryLimitMiB != 1024 || s.Missing != "" {
		t.Errorf("sample limit %d MiB missing %q, want 1024 and nothing missing", s.MemoryLimitMiB, s.Missing)
	}

	// Live quota: a desired 512 MiB reaches the quota file, the applied
	// generation is recorded, and the hook refuses what no longer fits.
	if res, _ := prog.Do("alloc linear 314572800"); res != 0 {
		t.Fatalf("alloc 300 MiB more under 1024 MiB: CUresult %d", res)
	}
	prog.Do("free")
	waitSubscribed(t, rdb, store.Keys().QuotaChanged())
	gen, err := store.SetDesiredQuota(t.Context(), id, v1.Slice{MemoryMiB: 512, ComputePercent: 50, ComputeLimitPercent: 50})
	if err != nil {
		t.Fatal(err)
	}
	stubtest.Eventually(t, "applied quota", func() (bool, string) {
		ap, err := store.AppliedQuota(t.Context(), id)
		return err == nil && ap.Generation == gen, fmt.Sprintf("%+v %v", ap, err)
	})
	q, err := region.ReadQuota(quotaFile)
	if err != nil {
		t.Fatal(err)
	}
	if q.MemoryLimitBytes != 512*mib || q.SliceID != id || q.Generation != 2 {
		t.Errorf("quota file %+v, want 512 MiB for %s at generation 2 (after the initial 1)", q, id)
	}
	if res, vals := prog.Do("waitoom 314572800 5000"); res != 2 {
		t.Errorf("300 MiB more under the new 512 MiB cap: CUresult %d (%v), want 2 (out of memory)", res, vals)
	}
	clock.fire(t.Context(), time.Second)
	stubtest.Eventually(t, "sample with the new limit", func() (bool, string) {
		s, err := store.LatestSample(t.Context(), id)
		return err == nil && s.MemoryLimitMiB == 512, fmt.Sprintf("%+v %v", s, err)
	})

	// A program of the host (no pod, no hook) using the GPU is reported
	// after two samples a second apart (the orphan grace), and left alone.
	// A second process of the slice allocates 2 GiB from the driver's own
	// symbol table, past the hook: the slice is over its cap, and its
	// largest process, that one, is stopped.
	host := stubtest.Start(t, env)
	if res, _ := host.Do("alloc linear 67108864"); res != 0 {
		t.Fatalf("unhooked host alloc of 64 MiB: CUresult %d", res)
	}
	bypass := stubtest.StartInSlice(t, env, quotaDir, usageDir)
	if res, _ := bypass.Do("rawalloc 2147483648"); res != 0 {
		t.Fatalf("2 GiB past the hook: CUresult %d", res)
	}
	for range 2 {
		clock.Advance(time.Second)
		clock.fire(t.Context(), time.Second)
		// The round reads the clock after taking the tick: wait for its
		// sample before moving the clock again.
		want := clock.Now()
		stubtest.Eventually(t, "round sample", func() (bool, string) {
			s, err := store.LatestSample(t.Context(), id)
			return err == nil && s.At.Equal(want.Truncate(time.Millisecond)), fmt.Sprintf("%v %v, want %v", s.At, err, want)
		})
	}
	select {
	case <-bypass.Exited():
		if err := bypass.WaitErr(); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("the process past the hook ended with %v, want killed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the process past the hook was not stopped within 20 s")
	}
	stubtest.Eventually(t, "audit records", func() (bool, string) {
		recs, err := store.RecentAudit(t.Context(), 10)
		if err != nil || len(recs) != 2 {
			return false, fmt.Sprintf("%+v %v", recs, err)
		}
		byReason := map[string]agentstore.AuditRecord{}
		for _, r := range recs {
			byReason[r.Reason] = r
		}
		o, h := byReason[agentstore.ReasonOverMemory], byReason[agentstore.ReasonNoSlice]
		return o.Action == agentstore.ActionKill && o.PID == uint32(bypass.Pid()) && o.Slice == id && o.User == "alice" && o.Server == "lab" &&
				o.MemoryLimitMiB == 512 && o.MemoryUsedMiB >= 2048 && o.ProcessMemoryMiB >= 2048 &&
				h.Action == agentstore.ActionReport && h.PID == uint32(host.Pid()) && h.MemoryUsedMiB == 64,
			fmt.Sprintf("%+v", recs)
	})
	for name, p := range map[string]*stubtest.Prog{"the hooked program": prog, "the host's program": host} {
		if res, _ := p.Do("meminfo"); res != 0 {
			t.Errorf("%s after the kill: CUresult %d, want it alive and well", name, res)
		}
	}

	// The agent stops: its last sample is stale within three intervals.
	stop()
	last, err := store.LatestSample(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if last.Stale(clock.Now()) {
		t.Error("last sample stale right after it was taken")
	}
	if !last.Stale(clock.Now().Add(3*time.Second + time.Millisecond)) {
		t.Error("last sample not stale after three intervals without samples")
	}
}

// TestAgentStopsAnUnhookedProcessOfASlice: a process of a slice's pod (its
// cgroup names the pod) that runs without the hook and holds 2 GiB of a
// 1 GiB slice is, by default, stopped within the configured samples and
// audited; in report mode it is only reported.
func TestAgentStopsAnUnhookedProcessOfASlice(t *testing.T) {
	stubtest.Need(t)
	for _, mode := range []Mode{"", ModeReport} {
		t.Run("mode "+string(or(mode, "default")), func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("GPUBROKER_STUB_STATE", filepath.Join(dir, "stub.state"))
			env := append(stubtest.Environ(), "GPUBROKER_STUB_STATE="+filepath.Join(dir, "stub.state"), "LD_LIBRARY_PATH="+stubtest.StubDir())
			rogue := stubtest.Start(t, env)
			if res, _ := rogue.Do("alloc linear 2147483648"); res != 0 {
				t.Fatalf("unhooked alloc of 2 GiB: CUresult %d", res)
			}
			pid := uint32(rogue.Pid())
			start, err := ProcFS{Root: "/proc"}.StartTime(pid)
			if err != nil {
				t.Fatal(err)
			}
			proc := newFakeProc(t)
			proc.add(pid, pid, start, uidA, testCID) // in the slice's pod

			audit := &fakeAudit{}
			clock := &fakeClock{now: time.Now()}
			const samples = 3
			pods := StaticPods{{ID: "spawn-u", PodUID: uidA, Pod: "nb", Namespace: "ns", User: "alice", Server: "lab", GPU: stubtest.DeviceUUID,
				Initial: v1.Slice{MemoryMiB: 1024, ComputePercent: 50, ComputeLimitPercent: 50}}}
			a, err := New(Config{Node: "gpu-1", HostRoot: filepath.Join(dir, "host"), Enforcement: Policy{Mode: mode, Samples: samples}},
				Deps{NVML: nvml.New(nvml.WithLibraryPath(filepath.Join(stubtest.StubDir(), "libnvidia-ml.so.1"))),
					Samples: nullStore{}, Quotas: nullStore{}, Audit: audit, Pods: pods, Proc: ProcFS{Root: proc.root}, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			defer runAgent(t, a)()
			usage := filepath.Join(dir, "host", v1.HostSlicesSubdir, "spawn-u", "usage", v1.UsageFileName)
			stubtest.Eventually(t, "the slice's usage region", func() (bool, string) {
				_, err := region.ReadUsage(usage)
				return err == nil, fmt.Sprint(err)
			})
			for i := range samples {
				clock.fire(t.Context(), time.Second)
				stubtest.Eventually(t, "the round's enforcement", func() (bool, string) {
					n := audit.count()
					return i < samples-1 || n > 0, fmt.Sprint(n)
				})
			}
			recs := audit.all()
			if len(recs) != 1 {
				t.Fatalf("audit %+v, want one record", recs)
			}
			r := recs[0]
			wantAction := agentstore.ActionKill
			if mode == ModeReport {
				wantAction = agentstore.ActionReport
			}
			if r.Action != wantAction || r.Reason != agentstore.ReasonOverMemory || r.PID != pid || r.User != "alice" || r.Server != "lab" ||
				r.MemoryUsedMiB != 2048 || r.MemoryLimitMiB != 1024 || r.Samples != samples {
				t.Errorf("audit record %+v, want %s over-memory of pid %d: 2048 of 1024 MiB after %d samples", r, wantAction, pid, samples)
			}
			if mode == ModeReport {
				if res, _ := rogue.Do("meminfo"); res != 0 {
					t.Errorf("reported process: CUresult %d, want it alive", res)
				}
				return
			}
			select {
			case <-rogue.Exited():
			case <-time.After(20 * time.Second):
				t.Fatal("the unhooked process was not stopped within 20 s")
			}
		})
	}
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// waitSubscribed polls PUBSUB NUMSUB until channel has a subscriber.
func waitSubscribed(t *testing.T, c *redis.Client, channel string) {
	t.Helper()
	stubtest.Eventually(t, "subscriber on "+channel, func() (bool, string) {
		m, err := c.PubSubNumSub(t.Context(), channel).Result()
		if err != nil {
			return false, err.Error()
		}
		return m[channel] > 0, fmt.Sprint(m)
	})
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestPaceFeedSteersASliceWhosePidsTheHookCannotSee runs the agent in real
// time on the stub whose NVML reports every pid shifted by 1,000,000, as
// NVML reports host pids inside a pod's pid namespace: the hook cannot
// measure its slice, the agent (mapping the shifted pids through a /proc
// tree that puts them in the pod, with the real pids as NSpid) feeds the
// slice's SM use into the usage region, and the hook's controller holds the
// slice at its 25 % share.
func TestPaceFeedSteersASliceWhosePidsTheHookCannotSee(t *testing.T) {
	stubtest.Need(t)
	if testing.Short() {
		t.Skip("3 s measurement; skipped with -short")
	}
	const offset = 1000000
	dir := t.TempDir()
	t.Setenv("GPUBROKER_STUB_STATE", filepath.Join(dir, "stub.state"))
	t.Setenv("GPUBROKER_STUB_NVML_PID_OFFSET", strconv.Itoa(offset))
	root := filepath.Join(dir, "host")
	const id = "spawn-pace"
	sliceDir := filepath.Join(root, v1.HostSlicesSubdir, id)
	env := append(stubtest.Environ(), "GPUBROKER_STUB_STATE="+filepath.Join(dir, "stub.state"),
		"GPUBROKER_STUB_NVML_PID_OFFSET="+strconv.Itoa(offset),
		"LD_LIBRARY_PATH="+stubtest.StubDir())
	usageFile := filepath.Join(sliceDir, "usage", v1.UsageFileName)
	pods := StaticPods{{ID: id, PodUID: uidA, Pod: "nb", Namespace: "ns", GPU: stubtest.DeviceUUID,
		Initial: v1.Slice{MemoryMiB: 4096, ComputePercent: 25, ComputeLimitPercent: 25}}}
	srv := redistest.Start(t)
	store := agentstore.New(srv.Client(t), srv.Prefix(t))
	proc := newFakeProc(t)
	lib := nvml.New(nvml.WithLibraryPath(filepath.Join(stubtest.StubDir(), "libnvidia-ml.so.1")))
	a, err := New(Config{Node: "gpu-1", HostRoot: root, SampleInterval: 200 * time.Millisecond, PaceInterval: 50 * time.Millisecond,
		Enforcement: Policy{Mode: ModeOff}},
		Deps{NVML: lib, Samples: store, Quotas: store, Audit: store, Pods: pods, Proc: ProcFS{Root: proc.root}, Killer: &fakeKiller{}})
	if err != nil {
		t.Fatal(err)
	}
	// As when the agent sees the pod: the slice is ready before its first process.
	if err := a.prepareSlice(pods[0]); err != nil {
		t.Fatal(err)
	}
	prog := stubtest.StartInSlice(t, env, filepath.Join(sliceDir, "quota"), filepath.Join(sliceDir, "usage"))
	if res, _ := prog.Do("alloc linear 1048576"); res != 0 { // creates the context: NVML lists the process
		t.Fatalf("alloc: CUresult %d", res)
	}
	pid := uint32(prog.Pid())
	start, err := ProcFS{Root: "/proc"}.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	proc.add(pid+offset, pid, start, uidA, testCID)

	defer runAgent(t, a)()

	// Kernels of 300 µs blocks: the hook's start rate assumes 100 µs, so
	// without measurements the slice would run at about 75 %. The program
	// saturates until the test kills it, so the window below never sees it
	// idle however late this goroutine runs on a loaded machine (two
	// back-to-back saturate commands left the gaps between them, and the
	// readings, in the window). Warm up 1.5 s from its first launch while
	// the controller converges from its start rate, then measure 2 s, both
	// timed by the stub's clock.
	prog.Send("saturate busy_300us 264 600000")
	var first stubState
	stubtest.Eventually(t, "the program launching", func() (bool, string) {
		first = readStub(t, env)
		return first.smNs(pid) > 0, fmt.Sprintf("%+v", first.Procs)
	})
	before := readStub(t, env)
	for before.NowNs-first.NowNs < uint64(1500*time.Millisecond) {
		<-time.After(50 * time.Millisecond)
		before = readStub(t, env)
	}
	after := readStub(t, env)
	for after.NowNs-before.NowNs < uint64(2*time.Second) {
		<-time.After(50 * time.Millisecond)
		after = readStub(t, env)
	}
	// What the hook's pacing guarantees (limiter/hook/src/pace.c), in
	// the SM time the stub charged to the program:
	//   - at most its share over the whole span: the controller measures
	//     the slice's share as NVML does, SM time over wall time (here the
	//     agent's feed), and lowers the rate whenever that is above the
	//     target. A loaded machine only lowers it (the launcher asks for
	//     less); while the launcher is descheduled but still launches most
	//     of what the rate allows, the controller raises the rate to hold
	//     this share, so the share over the time it was asking can read
	//     well above 25 % then (30-36 % on a saturated machine);
	//   - at least its share over the time it was asking: a launch in
	//     debt waits only until the rate repays it, the bucket makes up
	//     gaps up to its 10 ms and the stub leaves longer ones out of that
	//     span, and the controller lowers the rate only while the measured
	//     share is above the target.
	// Without the pace feed the rate stays at its start (about 75 % for
	// these blocks); without pacing the program takes the whole device.
	wall, asking := wallShare(before, after, pid), askingShare(before, after, pid)
	t.Logf("SM share over the %.1f s window: %.1f %%, over the time it was asking: %.1f %% (target 25 %%)",
		float64(after.NowNs-before.NowNs)/1e9, wall, asking)
	if wall > 30 {
		t.Errorf("SM share over the window %.1f %%, want at most 25 + 5 %%", wall)
	}
	if asking < 20 {
		t.Errorf("SM share over the time it was asking %.1f %%, want at least 25 - 5 %%", asking)
	}
	u, err := region.ReadUsage(usageFile)
	if err != nil {
		t.Fatal(err)
	}
	if u.Agent.Time.IsZero() || u.Agent.SliceUtilPermille == 0 {
		t.Errorf("usage region agent sample %+v, want the agent's measurements", u.Agent)
	}
	s, err := store.LatestSample(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if s.Processes == nil || *s.Processes != 1 || s.SMPercent == nil {
		t.Errorf("redis sample %+v, want the hidden-pid process mapped to the slice", s)
	}
}
