package agent

import (
	"bufio"
	"context"
	"encoding/json"

	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// The stub device's defaults (limiter/hook/stub/device.c).
const (
	stubUUID   = "GPU-5bd3a1e2-7c4f-4e8a-9b1d-2f6e8c0a4d17"
	stubModel  = "NVIDIA H100 80GB HBM3"
	stubMemMiB = 81559
)

var (
	stubBuildOnce sync.Once
	stubBuildErr  error
)

// hookBuildDir is limiter/hook/build, where `make -C limiter/hook` puts the
// stub driver, the hook and cudaprog.
func hookBuildDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "hook", "build")
}

// needStub builds the C artifacts once (make is a no-op when they are up to
// date). Without gcc or make it skips, or fails when CI=true.
func needStub(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"gcc", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is required in CI: %v", tool, err)
			}
			t.Skipf("%s not found: %v", tool, err)
		}
	}
	stubBuildOnce.Do(func() {
		out, err := exec.Command("make", "-C", filepath.Join(hookBuildDir(), ".."), "-j2").CombinedOutput()
		if err != nil {
			stubBuildErr = fmt.Errorf("make: %w\n%s", err, out)
		}
	})
	if stubBuildErr != nil {
		t.Fatal(stubBuildErr)
	}
}

// cudaprog is an interactive cudaprog (-i) in one slice, with the hook.
type cudaprog struct {
	t       *testing.T
	cmd     *exec.Cmd
	in      io.WriteCloser
	out     *bufio.Scanner
	stder   strings.Builder
	exited  chan struct{} // closed when the process has been waited for
	waitErr error         // valid after exited is closed
}

func startCudaprog(t *testing.T, env []string) *cudaprog {
	t.Helper()
	cmd := exec.Command(filepath.Join(hookBuildDir(), "cudaprog"), "-i")
	cmd.Env = env
	p := &cudaprog{t: t, cmd: cmd}
	cmd.Stderr = &p.stder
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.in, p.out = in, bufio.NewScanner(out)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.exited = make(chan struct{})
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.in.Close()
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// do sends one command and returns its reply's CUresult and values.
func (p *cudaprog) do(command string) (int, []uint64) {
	p.t.Helper()
	if _, err := io.WriteString(p.in, command+"\n"); err != nil {
		p.t.Fatalf("cudaprog %q: %v; stderr: %s", command, err, p.stder.String())
	}
	if !p.out.Scan() {
		p.t.Fatalf("cudaprog %q: no reply (%v); stderr: %s", command, p.out.Err(), p.stder.String())
	}
	f := strings.Fields(p.out.Text())
	if len(f) < 2 {
		p.t.Fatalf("cudaprog %q: reply %q", command, p.out.Text())
	}
	res, err := strconv.Atoi(f[1])
	if err != nil {
		p.t.Fatal(err)
	}
	var vals []uint64
	for _, v := range f[2:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			p.t.Fatal(err)
		}
		vals = append(vals, n)
	}
	return res, vals
}

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
	} `json:"procs"`
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
	cmd := exec.Command(filepath.Join(hookBuildDir(), "stubctl"))
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

// eventually polls cond every 5 ms until it holds or 20 s pass.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		tick := time.NewTimer(5 * time.Millisecond)
		<-tick.C
	}
	t.Fatalf("%s: not within 20 s; last: %s", what, last)
}

// TestAgentOnStubDriver runs the agent with the real go-nvml bindings on
// the stub libnvidia-ml.so.1 while a hooked program allocates and launches
// on the stub libcuda.so.1, with a real redis-server.
func TestAgentOnStubDriver(t *testing.T) {
	needStub(t)
	dir := t.TempDir()
	stubEnv := "GPUBROKER_STUB_STATE=" + filepath.Join(dir, "stub.state")
	// The stub NVML loaded into this test process finds the device here.
	t.Setenv("GPUBROKER_STUB_STATE", filepath.Join(dir, "stub.state"))

	root := filepath.Join(dir, "host")
	const id = "spawn-7f3a"
	sliceDir := filepath.Join(root, v1.HostSlicesSubdir, id)
	for _, sub := range []string{"quota", "usage"} {
		if err := os.MkdirAll(filepath.Join(sliceDir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	quotaFile := filepath.Join(sliceDir, "quota", v1.QuotaFileName)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUBROKER_") && !strings.HasPrefix(kv, "LD_") {
			env = append(env, kv)
		}
	}
	env = append(env, stubEnv, "LD_LIBRARY_PATH="+filepath.Join(hookBuildDir(), "stub"))
	progEnv := append(append([]string{}, env...),
		"LD_PRELOAD="+filepath.Join(hookBuildDir(), "libgpulimit.so"),
		v1.EnvSliceID+"="+id, v1.EnvGPUUUID+"="+stubUUID,
		v1.EnvQuotaFile+"="+quotaFile, v1.EnvUsageFile+"="+filepath.Join(sliceDir, "usage", v1.UsageFileName),
		v1.EnvMemoryLimitMiB+"=1024", v1.EnvComputePercent+"=50", v1.EnvComputeLimitPercent+"=50")

	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := agentstore.New(rdb, srv.Prefix(t))
	clock := &fakeClock{now: time.Now()}
	pods := StaticPods{{ID: id, PodUID: uidA, Pod: "nb", Namespace: "ns", GPU: stubUUID,
		Initial: v1.Slice{MemoryMiB: 1024, ComputePercent: 50, ComputeLimitPercent: 50}}}
	// Kill mode with the real pidfd killer: the hooked program stays within
	// its slice; an unhooked one started later belongs to no slice.
	a, err := New(Config{Node: "gpu-1", HostRoot: root, TrustUsagePIDs: true, Enforcement: Policy{Mode: ModeKill, Samples: 2, OrphanGrace: time.Second}},
		Deps{NVML: nvml.New(nvml.WithLibraryPath(filepath.Join(hookBuildDir(), "stub", "libnvidia-ml.so.1"))),
			Samples: store, Quotas: store, Audit: store, Pods: pods, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}

	prog := startCudaprog(t, progEnv)
	if res, _ := prog.do("alloc linear 268435456"); res != 0 {
		t.Fatalf("alloc 256 MiB: CUresult %d", res)
	}
	if res, _ := prog.do("saturate busy_100us 264 300"); res != 0 {
		t.Fatalf("saturate: CUresult %d", res)
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

	// Inventory: the heartbeat registers the stub GPU as NVML describes it.
	eventually(t, "node report", func() (bool, string) {
		inv, err := store.Inventory(t.Context(), clock.Now())
		if err != nil || len(inv.GPUs) != 1 {
			return false, fmt.Sprintf("%+v %v", inv, err)
		}
		g := inv.GPUs[0].GPU
		want := v1.GPU{UUID: stubUUID, Node: "gpu-1", Model: stubModel, MemoryMiB: stubMemMiB, SMCount: 132, Healthy: true}
		return g == want, fmt.Sprintf("%+v", g)
	})

	// Samples: what the stub simulated for the process.
	st := readStub(t, env)
	if len(st.Procs) != 1 || st.Procs[0].PID != uint32(prog.cmd.Process.Pid) {
		t.Fatalf("stub processes %+v, want cudaprog's pid %d only", st.Procs, prog.cmd.Process.Pid)
	}
	wantMiB := int64((st.Procs[0].MemBytes + mib - 1) / mib)
	clock.fire(t.Context(), time.Second)
	var s agentstore.Sample
	eventually(t, "first sample", func() (bool, string) {
		s, err = store.LatestSample(t.Context(), id)
		return err == nil, fmt.Sprint(err)
	})
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
	if res, _ := prog.do("alloc linear 314572800"); res != 0 {
		t.Fatalf("alloc 300 MiB more under 1024 MiB: CUresult %d", res)
	}
	prog.do("free")
	waitSubscribed(t, rdb, store.Keys().QuotaChanged())
	gen, err := store.SetDesiredQuota(t.Context(), id, v1.Slice{MemoryMiB: 512, ComputePercent: 50, ComputeLimitPercent: 50})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "applied quota", func() (bool, string) {
		ap, err := store.AppliedQuota(t.Context(), id)
		return err == nil && ap.Generation == gen, fmt.Sprintf("%+v %v", ap, err)
	})
	q, err := region.ReadQuota(quotaFile)
	if err != nil {
		t.Fatal(err)
	}
	if q.MemoryLimitBytes != 512*mib || q.SliceID != id || q.Generation != 1 {
		t.Errorf("quota file %+v, want 512 MiB for %s at generation 1", q, id)
	}
	if res, vals := prog.do("waitoom 314572800 5000"); res != 2 {
		t.Errorf("300 MiB more under the new 512 MiB cap: CUresult %d (%v), want 2 (out of memory)", res, vals)
	}
	clock.fire(t.Context(), time.Second)
	eventually(t, "sample with the new limit", func() (bool, string) {
		s, err := store.LatestSample(t.Context(), id)
		return err == nil && s.MemoryLimitMiB == 512, fmt.Sprintf("%+v %v", s, err)
	})

	// Bypass: a program without the hook, in no slice, is killed after two
	// samples a second apart (the orphan grace), with an audit record; the
	// hooked program is untouched.
	rogue := startCudaprog(t, env)
	if res, _ := rogue.do("alloc linear 2147483648"); res != 0 {
		t.Fatalf("unhooked alloc of 2 GiB: CUresult %d", res)
	}
	for range 2 {
		clock.Advance(time.Second)
		clock.fire(t.Context(), time.Second)
		// The round reads the clock after taking the tick: wait for its
		// sample before moving the clock again.
		want := clock.Now()
		eventually(t, "round sample", func() (bool, string) {
			s, err := store.LatestSample(t.Context(), id)
			return err == nil && s.At.Equal(want.Truncate(time.Millisecond)), fmt.Sprintf("%v %v, want %v", s.At, err, want)
		})
	}
	select {
	case <-rogue.exited:
		if err := rogue.waitErr; err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("unhooked program ended with %v, want killed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("unhooked program not killed within 20 s")
	}
	eventually(t, "audit record", func() (bool, string) {
		recs, err := store.RecentAudit(t.Context(), 10)
		if err != nil || len(recs) != 1 {
			return false, fmt.Sprintf("%+v %v", recs, err)
		}
		r := recs[0]
		return r.Action == "kill" && r.Reason == "no-slice" && r.PID == uint32(rogue.cmd.Process.Pid) &&
			r.GPU == stubUUID && r.MemoryUsedMiB == 2048, fmt.Sprintf("%+v", r)
	})
	if res, _ := prog.do("meminfo"); res != 0 {
		t.Errorf("hooked program after the kill: CUresult %d, want it alive and well", res)
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

// waitSubscribed polls PUBSUB NUMSUB until channel has a subscriber.
func waitSubscribed(t *testing.T, c *redis.Client, channel string) {
	t.Helper()
	eventually(t, "subscriber on "+channel, func() (bool, string) {
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
	needStub(t)
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
	for _, sub := range []string{"quota", "usage"} {
		if err := os.MkdirAll(filepath.Join(sliceDir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUBROKER_") && !strings.HasPrefix(kv, "LD_") {
			env = append(env, kv)
		}
	}
	env = append(env, "GPUBROKER_STUB_STATE="+filepath.Join(dir, "stub.state"),
		"GPUBROKER_STUB_NVML_PID_OFFSET="+strconv.Itoa(offset),
		"LD_LIBRARY_PATH="+filepath.Join(hookBuildDir(), "stub"))
	usageFile := filepath.Join(sliceDir, "usage", v1.UsageFileName)
	progEnv := append(append([]string{}, env...),
		"LD_PRELOAD="+filepath.Join(hookBuildDir(), "libgpulimit.so"),
		v1.EnvSliceID+"="+id, v1.EnvGPUUUID+"="+stubUUID,
		v1.EnvQuotaFile+"="+filepath.Join(sliceDir, "quota", v1.QuotaFileName), v1.EnvUsageFile+"="+usageFile,
		v1.EnvMemoryLimitMiB+"=4096", v1.EnvComputePercent+"=25", v1.EnvComputeLimitPercent+"=25")

	lib := nvml.New(nvml.WithLibraryPath(filepath.Join(hookBuildDir(), "stub", "libnvidia-ml.so.1")))
	prog := startCudaprog(t, progEnv)
	if res, _ := prog.do("alloc linear 1048576"); res != 0 { // creates the context: NVML lists the process
		t.Fatalf("alloc: CUresult %d", res)
	}
	pid := uint32(prog.cmd.Process.Pid)
	start, err := ProcFS{Root: "/proc"}.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	proc := newFakeProc(t)
	proc.add(pid+offset, pid, start, uidA, testCID)

	srv := redistest.Start(t)
	store := agentstore.New(srv.Client(t), srv.Prefix(t))
	pods := StaticPods{{ID: id, PodUID: uidA, Pod: "nb", Namespace: "ns", GPU: stubUUID,
		Initial: v1.Slice{MemoryMiB: 4096, ComputePercent: 25, ComputeLimitPercent: 25}}}
	a, err := New(Config{Node: "gpu-1", HostRoot: root, SampleInterval: 200 * time.Millisecond, PaceInterval: 50 * time.Millisecond,
		Enforcement: Policy{Mode: ModeOff}},
		Deps{NVML: lib, Samples: store, Quotas: store, Audit: store, Pods: pods, Proc: ProcFS{Root: proc.root}, Killer: &fakeKiller{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Kernels of 300 µs blocks: the hook's start rate assumes 100 µs, so
	// without measurements the slice would run at about 75 %. Warm up while
	// the controller converges from its start rate.
	if res, _ := prog.do("saturate busy_300us 264 1500"); res != 0 {
		t.Fatalf("saturate: CUresult %d", res)
	}
	before := readStub(t, env)
	if res, _ := prog.do("saturate busy_300us 264 2000"); res != 0 {
		t.Fatalf("saturate: CUresult %d", res)
	}
	after := readStub(t, env)
	share := float64(after.smNs(pid)-before.smNs(pid)) / (float64(after.NowNs-before.NowNs) * float64(after.SMCount)) * 100
	t.Logf("SM share over 2 s: %.1f %% (target 25 %%)", share)
	if share < 20 || share > 30 {
		t.Errorf("SM share %.1f %%, want 25 ± 5 %%", share)
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
