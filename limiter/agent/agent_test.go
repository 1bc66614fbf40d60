package agent

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"))
}

var t0 = time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)

// fakeClock is a Clock whose tickers fire when the test calls Tick.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	tickers []*fakeTicker
}

type fakeTicker struct {
	c chan time.Time
	d time.Duration
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }
func (t *fakeTicker) Stop()               {}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTicker(d time.Duration) Ticker {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTicker{c: make(chan time.Time), d: d}
	c.tickers = append(c.tickers, t)
	return t
}

// Advance moves the clock by d.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fire delivers one tick to every ticker of period d, waiting until each
// loop has taken it (or ctx ends). The loops start in their own goroutines,
// so it first waits (up to 10 s) until at least one ticker of period d
// exists; a tick sent before the loop made its ticker would be lost.
func (c *fakeClock) fire(ctx context.Context, d time.Duration) {
	var ts []*fakeTicker
	var now time.Time
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		ts = ts[:0]
		for _, t := range c.tickers {
			if t.d == d {
				ts = append(ts, t)
			}
		}
		now = c.now
		c.mu.Unlock()
		if len(ts) > 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		runtime.Gosched()
	}
	for _, t := range ts {
		select {
		case t.c <- now:
		case <-ctx.Done():
		}
	}
}

// fakeKiller records kills.
type fakeKiller struct {
	mu     sync.Mutex
	killed []uint32
	err    error
}

func (k *fakeKiller) Kill(pid uint32, _ uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killed = append(k.killed, pid)
	return k.err
}

// fakeAudit records audit records.
type fakeAudit struct {
	mu      sync.Mutex
	records []agentstore.AuditRecord
}

func (f *fakeAudit) AddAudit(_ context.Context, r agentstore.AuditRecord) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records = append(f.records, r)
	return nil
}

func (f *fakeAudit) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.records)
}

func (f *fakeAudit) all() []agentstore.AuditRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]agentstore.AuditRecord(nil), f.records...)
}

// nullStore is a SampleSink and QuotaStore that keeps nothing, for tests
// that inspect rounds directly.
type nullStore struct{}

func (nullStore) AddSamples(context.Context, []agentstore.Sample) error  { return nil }
func (nullStore) Heartbeat(context.Context, agentstore.NodeReport) error { return nil }
func (nullStore) SetAppliedQuota(context.Context, string, agentstore.AppliedQuota) error {
	return nil
}
func (nullStore) DesiredQuota(context.Context, string) (agentstore.DesiredQuota, error) {
	return agentstore.DesiredQuota{}, agentstore.ErrNotFound
}
func (nullStore) WatchQuotaChanges(ctx context.Context, _ func(string)) error {
	<-ctx.Done()
	return nil
}

const (
	uidA = "aaaaaaaa-0000-4000-8000-000000000001"
	uidB = "bbbbbbbb-0000-4000-8000-000000000002"
	uidC = "cccccccc-0000-4000-8000-000000000003"
	uidX = "dddddddd-0000-4000-8000-000000000004" // a pod that is not gpubroker's
)

type testEnv struct {
	lib    *server.Server
	proc   *fakeProc
	pods   StaticPods
	killer *fakeKiller
	audit  *fakeAudit
	clock  *fakeClock
	root   string
}

// newEnv builds a DGX H200 with slices A and B on GPU 0 and C on GPU 1,
// and pod processes: 100, 101 (A), 200 (B), 300 (host, no slice), 500
// (C), 600 (a pod that is not gpubroker's); 400 has exited.
func newEnv(t *testing.T) *testEnv {
	t.Helper()
	e := &testEnv{lib: dgxh200.New(), proc: newFakeProc(t), killer: &fakeKiller{}, audit: &fakeAudit{},
		clock: &fakeClock{now: t0}, root: t.TempDir()}
	uuid := func(i int) string { u, _ := e.lib.Devices[i].GetUUID(); return u }
	e.pods = StaticPods{
		{ID: "slice-a", PodUID: uidA, Pod: "nb-a", Namespace: "ns", GPU: uuid(0), Initial: v1.Slice{MemoryMiB: 2048, ComputePercent: 20, ComputeLimitPercent: 50}},
		{ID: "slice-b", PodUID: uidB, Pod: "nb-b", Namespace: "ns", GPU: uuid(0), Initial: v1.Slice{MemoryMiB: 4096, ComputePercent: 30, ComputeLimitPercent: 30}},
		{ID: "slice-c", PodUID: uidC, Pod: "nb-c", Namespace: "ns", GPU: uuid(1), Initial: v1.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10}},
	}
	e.proc.add(100, 12, 1000, uidA, testCID)
	e.proc.add(101, 13, 1001, uidA, testCID)
	e.proc.add(200, 7, 2000, uidB, testCID)
	e.proc.add(300, 300, 3000, "", "")
	e.proc.add(500, 9, 5000, uidC, testCID)
	e.proc.add(600, 9, 6000, uidX, testCID)
	e.setProcs(0, []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 1 << 30}, {Pid: 101, UsedGpuMemory: 512 << 20},
		{Pid: 200, UsedGpuMemory: 2 << 30}, {Pid: 300, UsedGpuMemory: 100 << 20}, {Pid: 400, UsedGpuMemory: 1 << 30}},
		[]nvml.ProcessUtilizationSample{{Pid: 100, TimeStamp: 10, SmUtil: 20}, {Pid: 100, TimeStamp: 20, SmUtil: 40},
			{Pid: 101, TimeStamp: 20, SmUtil: 10}, {Pid: 300, TimeStamp: 20, SmUtil: 5}})
	e.setProcs(1, []nvml.ProcessInfo{{Pid: 500, UsedGpuMemory: 256 << 20}, {Pid: 600, UsedGpuMemory: 64 << 20}}, nil)
	for i := 2; i < len(e.lib.Devices); i++ {
		e.setProcs(i, nil, nil)
	}
	return e
}

func (e *testEnv) dev(i int) *server.Device { return e.lib.Devices[i].(*server.Device) }

// setProcs makes device i report procs and utilization samples (all of
// them newer than any lastSeen the agent passes).
func (e *testEnv) setProcs(i int, procs []nvml.ProcessInfo, util []nvml.ProcessUtilizationSample) {
	e.dev(i).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
	e.dev(i).GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		if len(util) == 0 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return util, nvml.SUCCESS
	}
}

func (e *testEnv) agent(t *testing.T, cfg Config, quotas QuotaStore) *Agent {
	t.Helper()
	cfg.Node = "gpu-1"
	cfg.HostRoot = e.root
	if quotas == nil {
		quotas = nullStore{}
	}
	a, err := New(cfg, Deps{NVML: e.lib, Samples: nullStore{}, Quotas: quotas, Audit: e.audit, Pods: e.pods,
		Proc: ProcFS{Root: e.proc.root}, Killer: e.killer, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := discoverDevices(e.lib, cfg.Node, a.has, t0)
	if err != nil {
		t.Fatal(err)
	}
	a.devs = devs
	return a
}

func ptr[T any](v T) *T { return &v }

// enforceRounds runs n sampling rounds of a, a second apart on the
// clock, and enforces each.
func (e *testEnv) enforceRounds(t *testing.T, a *Agent, n int) {
	t.Helper()
	for range n {
		e.clock.Advance(time.Second)
		if err := a.enforce(t.Context(), a.sampleRound(t.Context())); err != nil {
			t.Fatal(err)
		}
	}
}

// runAgent runs a until the returned stop is called; stop waits for Run
// and fails t if it returned an error.
func runAgent(t *testing.T, a *Agent) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// samples returns a round's samples by slice id.
func samples(r round) map[string]agentstore.Sample {
	out := map[string]agentstore.Sample{}
	for _, s := range r.Slices {
		out[s.Info.ID] = s.Sample
	}
	return out
}

func TestSampleRoundMapsProcessesToSlices(t *testing.T) {
	e := newEnv(t)
	a := e.agent(t, Config{}, nil)
	r := a.sampleRound(t.Context())
	zero := time.Time{}
	want := map[string]agentstore.Sample{
		// 100: mean(20, 40) = 30 %, 101: 10 % → 40 %; 1 GiB + 512 MiB.
		"slice-a": {Slice: "slice-a", At: t0, Interval: time.Second, SMPercent: ptr(40), MemoryUsedMiB: ptr(int64(1536)),
			MemoryLimitMiB: 2048, Processes: ptr(2), LastKernel: &zero, Guarantee: &v1.Guarantee{Percent: 20, WindowSeconds: 3600}},
		// 200 ran no kernels: a measured 0 %.
		"slice-b": {Slice: "slice-b", At: t0, Interval: time.Second, SMPercent: ptr(0), MemoryUsedMiB: ptr(int64(2048)),
			MemoryLimitMiB: 4096, Processes: ptr(1), LastKernel: &zero, Guarantee: &v1.Guarantee{Percent: 30, WindowSeconds: 3600}},
		"slice-c": {Slice: "slice-c", At: t0, Interval: time.Second, SMPercent: ptr(0), MemoryUsedMiB: ptr(int64(256)),
			MemoryLimitMiB: 1024, Processes: ptr(1), LastKernel: &zero, Guarantee: &v1.Guarantee{Percent: 10, WindowSeconds: 3600}},
	}
	if diff := cmp.Diff(want, samples(r)); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	var orphans []uint32
	for _, p := range r.Orphans {
		orphans = append(orphans, p.PID)
	}
	// 300 is a host process, 600 a pod that is not gpubroker's; 400 exited.
	if diff := cmp.Diff([]uint32{300, 600}, orphans); diff != "" {
		t.Errorf("orphans (-want +got):\n%s", diff)
	}
}

func TestSampleRoundRecordsMissingNeverZero(t *testing.T) {
	tests := []struct {
		name        string
		procRet     nvml.Return
		utilRet     nvml.Return
		wantSM      bool
		wantMem     bool
		wantMissing string
	}{
		{name: "utilization not supported keeps memory", procRet: nvml.SUCCESS, utilRet: nvml.ERROR_NOT_SUPPORTED,
			wantMem: true, wantMissing: "process utilization: "},
		{name: "process list not supported keeps utilization", procRet: nvml.ERROR_NOT_SUPPORTED, utilRet: nvml.SUCCESS,
			wantSM: true, wantMissing: "running processes: "},
		{name: "both not supported", procRet: nvml.ERROR_NOT_SUPPORTED, utilRet: nvml.ERROR_NOT_SUPPORTED,
			wantMissing: "running processes: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			d := e.dev(0)
			procs, util := d.GetComputeRunningProcessesFunc, d.GetProcessUtilizationFunc
			d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
				if tc.procRet != nvml.SUCCESS {
					return nil, tc.procRet
				}
				return procs()
			}
			d.GetProcessUtilizationFunc = func(v uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
				if tc.utilRet != nvml.SUCCESS {
					return nil, tc.utilRet
				}
				return util(v)
			}
			a := e.agent(t, Config{}, nil)
			s := samples(a.sampleRound(t.Context()))["slice-a"]
			if (s.SMPercent != nil) != tc.wantSM || (s.MemoryUsedMiB != nil) != tc.wantMem || (s.Processes != nil) != tc.wantMem {
				t.Errorf("sample %+v: want SM known %v, memory and processes known %v", s, tc.wantSM, tc.wantMem)
			}
			if !strings.Contains(s.Missing, tc.wantMissing) {
				t.Errorf("missing %q, want it to contain %q", s.Missing, tc.wantMissing)
			}
			if tc.wantSM && *s.SMPercent != 40 {
				t.Errorf("SM %d %%, want 40 from the utilization samples alone", *s.SMPercent)
			}
		})
	}
}

func TestProcessMemoryNotAvailableIsMissing(t *testing.T) {
	e := newEnv(t)
	e.setProcs(1, []nvml.ProcessInfo{{Pid: 500, UsedGpuMemory: ^uint64(0)}}, nil)
	a := e.agent(t, Config{}, nil)
	s := samples(a.sampleRound(t.Context()))["slice-c"]
	if s.MemoryUsedMiB != nil || !strings.Contains(s.Missing, "process memory not available") {
		t.Errorf("sample %+v: want memory missing", s)
	}
	if s.Processes == nil || *s.Processes != 1 {
		t.Errorf("processes %v, want 1", s.Processes)
	}
}

func TestLostDeviceIsMarkedAloneAndItsSlicesReportWhy(t *testing.T) {
	e := newEnv(t)
	e.dev(0).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
	a := e.agent(t, Config{}, nil)
	got := samples(a.sampleRound(t.Context()))
	for _, id := range []string{"slice-a", "slice-b"} {
		s := got[id]
		if s.SMPercent != nil || s.MemoryUsedMiB != nil || s.Processes != nil || !strings.Contains(s.Missing, "gpu lost") {
			t.Errorf("%s: %+v, want every figure missing because the gpu is lost", id, s)
		}
	}
	if c := got["slice-c"]; c.MemoryUsedMiB == nil || c.Missing != "" {
		t.Errorf("slice-c on a healthy gpu: %+v, want complete", c)
	}
	var unhealthy []string
	for _, g := range a.devs.reports() {
		if !g.Healthy {
			unhealthy = append(unhealthy, g.UUID+" "+g.Reason)
		}
	}
	u0, _ := e.lib.Devices[0].GetUUID()
	if diff := cmp.Diff([]string{u0 + " gpu lost: running processes: ERROR_GPU_IS_LOST"}, unhealthy); diff != "" {
		t.Errorf("unhealthy gpus (-want +got):\n%s", diff)
	}
	select {
	case <-a.devs.changed:
	default:
		t.Error("health change not signalled to the heartbeat loop")
	}
	// The next round does not query the lost device again.
	e.dev(0).GetComputeRunningProcessesFunc = nil // a call would panic
	if s := samples(a.sampleRound(t.Context()))["slice-a"]; !strings.Contains(s.Missing, "gpu unhealthy: gpu lost") {
		t.Errorf("second round: missing %q, want the unhealthy reason", s.Missing)
	}
}

func TestXidMarksOnlyItsDevice(t *testing.T) {
	tests := []struct {
		name string
		xid  uint64
		want bool // device 2 unhealthy
	}{
		{name: "xid 79 fallen off the bus", xid: 79, want: true},
		{name: "xid 48 double-bit ecc", xid: 48, want: true},
		{name: "xid 13 is the application's", xid: 13, want: false},
		{name: "xid 31 page fault is the application's", xid: 31, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			a := e.agent(t, Config{}, nil)
			a.onXid(t.Context(), nvml.EventData{Device: e.lib.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: tc.xid})
			for i, g := range a.devs.reports() {
				wantHealthy := !(i == 2 && tc.want)
				if g.Healthy != wantHealthy {
					t.Errorf("gpu %d healthy=%v reason %q, want healthy=%v", i, g.Healthy, g.Reason, wantHealthy)
				}
			}
		})
	}
}

func TestDiscoverMIGModes(t *testing.T) {
	tests := []struct {
		name        string
		ret         nvml.Return
		mode        int
		has         bool
		wantHealthy bool
		wantMIG     bool
	}{
		{name: "mig disabled", ret: nvml.SUCCESS, mode: nvml.DEVICE_MIG_DISABLE, has: true, wantHealthy: true},
		{name: "mig enabled is healthy, placed through its instances", ret: nvml.SUCCESS, mode: nvml.DEVICE_MIG_ENABLE, has: true, wantHealthy: true, wantMIG: true},
		{name: "mig not supported", ret: nvml.ERROR_NOT_SUPPORTED, has: true, wantHealthy: true},
		{name: "library without the symbol is never called", ret: nvml.ERROR_UNKNOWN, has: false, wantHealthy: true},
		{name: "mig query failing otherwise", ret: nvml.ERROR_UNKNOWN, has: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := dgxh200.New()
			lib.Devices[0].(*server.Device).GetMigModeFunc = func() (int, int, nvml.Return) {
				if !tc.has {
					t.Error("GetMigMode called although the library lacks it")
				}
				return tc.mode, tc.mode, tc.ret
			}
			lib.Devices[0].(*server.Device).GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
			ds, _ := discoverDevices(lib, "n", func(string) bool { return tc.has }, t0)
			g := ds.reports()[0]
			if g.Healthy != tc.wantHealthy || g.MIGEnabled != tc.wantMIG {
				t.Errorf("gpu 0: healthy %v mig %v reason %q, want healthy %v mig %v", g.Healthy, g.MIGEnabled, g.Reason, tc.wantHealthy, tc.wantMIG)
			}
			if h := ds.reports()[1]; !h.Healthy {
				t.Errorf("gpu 1 unhealthy: %q", h.Reason)
			}
		})
	}
}

func TestEnforcement(t *testing.T) {
	tests := []struct {
		name       string
		mode       Mode
		grace      time.Duration // Policy.OrphanGrace; 0 = default 30 s
		rounds     int
		wantKilled []uint32
		wantAudit  []string // action reason pid
	}{
		{name: "two rounds over is not enough", mode: ModeKill, grace: time.Second, rounds: 2},
		{name: "orphans wait for the grace period", mode: ModeKill, rounds: 3,
			wantKilled: []uint32{100}, wantAudit: []string{"kill over-memory 100"}},
		{name: "kill after three rounds: largest process of the slice and the pod's orphan; the host's is reported", mode: ModeKill,
			grace: 2 * time.Second, rounds: 3, wantKilled: []uint32{100, 600},
			wantAudit: []string{"kill over-memory 100", "report no-slice 300", "kill no-slice 600"}},
		{name: "the default mode protects", grace: 2 * time.Second, rounds: 3, wantKilled: []uint32{100, 600},
			wantAudit: []string{"kill over-memory 100", "report no-slice 300", "kill no-slice 600"}},
		{name: "report does not kill", mode: ModeReport, grace: 2 * time.Second, rounds: 3,
			wantAudit: []string{"report over-memory 100", "report no-slice 300", "report no-slice 600"}},
		{name: "a report is not repeated every round", mode: ModeReport, grace: 2 * time.Second, rounds: 5,
			wantAudit: []string{"report over-memory 100", "report no-slice 300", "report no-slice 600"}},
		{name: "off does nothing", mode: ModeOff, rounds: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			// Slice A: 1 GiB + 1.2 GiB against a 2 GiB cap + 5 %.
			e.setProcs(0, []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 1300 << 20}, {Pid: 101, UsedGpuMemory: 900 << 20},
				{Pid: 300, UsedGpuMemory: 1 << 20}}, nil)
			a := e.agent(t, Config{Enforcement: Policy{Mode: tc.mode, OrphanGrace: tc.grace}}, nil)
			e.enforceRounds(t, a, tc.rounds)
			if diff := cmp.Diff(tc.wantKilled, e.killer.killed); diff != "" {
				t.Errorf("killed (-want +got):\n%s", diff)
			}
			var got []string
			for _, r := range e.audit.records {
				got = append(got, r.Action+" "+r.Reason+" "+itoa(r.PID))
				if r.Reason == "over-memory" && (r.Slice != "slice-a" || r.MemoryUsedMiB != 2200 || r.MemoryLimitMiB != 2048 || r.Samples != 3 || r.Pod != "nb-a") {
					t.Errorf("over-memory record %+v lacks its inputs", r)
				}
			}
			if diff := cmp.Diff(tc.wantAudit, got); diff != "" {
				t.Errorf("audit (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEnforcementWithinToleranceOrUnknownDoesNothing(t *testing.T) {
	e := newEnv(t)
	// Slice A at 2 GiB + 4 % (tolerance 5 %); slice C's memory unknown.
	e.setProcs(0, []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 2048<<20 + 80<<20}}, nil)
	e.setProcs(1, []nvml.ProcessInfo{{Pid: 500, UsedGpuMemory: ^uint64(0)}}, nil)
	a := e.agent(t, Config{Enforcement: Policy{Mode: ModeKill, Samples: 1}}, nil)
	if err := a.enforce(t.Context(), a.sampleRound(t.Context())); err != nil {
		t.Fatal(err)
	}
	if len(e.killer.killed) != 0 || len(e.audit.records) != 0 {
		t.Errorf("killed %v, audit %v; want nothing", e.killer.killed, e.audit.records)
	}
}

func TestKillOfAGoneProcessIsAudited(t *testing.T) {
	e := newEnv(t)
	e.setProcs(0, []nvml.ProcessInfo{{Pid: 600, UsedGpuMemory: 1 << 20}}, nil)
	e.setProcs(1, nil, nil)
	e.killer.err = ErrNoProcess
	a := e.agent(t, Config{Enforcement: Policy{Mode: ModeKill, Samples: 1, OrphanGrace: -1}}, nil)
	if err := a.enforce(t.Context(), a.sampleRound(t.Context())); err != nil {
		t.Fatal(err)
	}
	if len(e.audit.records) != 1 || e.audit.records[0].Action != "kill-failed" || e.audit.records[0].Error != "process already gone" {
		t.Errorf("audit %+v, want one kill-failed record", e.audit.records)
	}
}

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	err := Config{SampleInterval: -1, Enforcement: Policy{Mode: "maim", TolerancePercent: 101, Samples: -1}}.Validate()
	for _, want := range []string{"node name", "sample interval", "enforcement mode", "tolerance", "samples"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
	if err := (Config{Node: "n"}).Validate(); err != nil {
		t.Errorf("minimal config: %v", err)
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

func TestUtilizationGrowingBetweenProbeAndReadIsRetried(t *testing.T) {
	e := newEnv(t)
	calls := 0
	full := []nvml.ProcessUtilizationSample{{Pid: 500, TimeStamp: 30, SmUtil: 70}}
	e.dev(1).GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		calls++
		if calls == 1 {
			return full[:1], nvml.ERROR_INSUFFICIENT_SIZE
		}
		return full, nvml.SUCCESS
	}
	a := e.agent(t, Config{}, nil)
	s := samples(a.sampleRound(t.Context()))["slice-c"]
	if s.SMPercent == nil || *s.SMPercent != 70 || calls != 2 {
		t.Errorf("SM %v after %d calls, want 70 after 2", s.SMPercent, calls)
	}
}

func TestDiscoverUnknownModelTakesSMCountFromAttributes(t *testing.T) {
	tests := []struct {
		name        string
		ret         nvml.Return
		sms         uint32
		wantHealthy bool
		wantSMs     int
	}{
		{name: "attributes give the count", ret: nvml.SUCCESS, sms: 152, wantHealthy: true, wantSMs: 152},
		{name: "attributes not supported leaves it unplaceable", ret: nvml.ERROR_NOT_SUPPORTED},
		{name: "zero count leaves it unplaceable", ret: nvml.SUCCESS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := dgxh200.New()
			d := lib.Devices[0].(*server.Device)
			d.GetNameFunc = func() (string, nvml.Return) { return "NVIDIA Future X1", nvml.SUCCESS }
			d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
				return nvml.DeviceAttributes{MultiprocessorCount: tc.sms}, tc.ret
			}
			ds, _ := discoverDevices(lib, "n", func(string) bool { return true }, t0)
			g := ds.reports()[0]
			if g.Healthy != tc.wantHealthy || g.SMCount != tc.wantSMs {
				t.Errorf("gpu: healthy %v, %d SMs, reason %q; want healthy %v, %d SMs", g.Healthy, g.SMCount, g.Reason, tc.wantHealthy, tc.wantSMs)
			}
			if !tc.wantHealthy && !strings.Contains(g.Reason, "unknown gpu model") {
				t.Errorf("reason %q, want it to name the unknown model", g.Reason)
			}
		})
	}
}
