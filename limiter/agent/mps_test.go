package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
)

// buildStandIn builds the test-only nvidia-cuda-mps-control stand-in
// (internal/mpsstandin) and returns its path.
func buildStandIn(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", out, "./internal/mpsstandin")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the MPS stand-in: %v\n%s", err, b)
	}
	return out
}

// fakeModes is a ModeSource the test changes.
type fakeModes struct {
	mu sync.Mutex
	m  map[string]v1.SharingMode
}

func (f *fakeModes) Modes(context.Context, string) (map[string]v1.SharingMode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]v1.SharingMode{}
	for k, v := range f.m {
		out[k] = v
	}
	return out, nil
}

func (f *fakeModes) set(gpu string, m v1.SharingMode) {
	f.mu.Lock()
	f.m[gpu] = m
	f.mu.Unlock()
}

// mutablePods is a PodIndex whose slices the test replaces.
type mutablePods struct {
	mu sync.Mutex
	s  StaticPods
}

func (p *mutablePods) Slices() []SliceInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s.Slices()
}

func (p *mutablePods) ByPodUID(uid string) (SliceInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s.ByPodUID(uid)
}
func (p *mutablePods) Synced() bool             { return true }
func (p *mutablePods) Changed() <-chan struct{} { return nil }

func (p *mutablePods) set(s StaticPods) {
	p.mu.Lock()
	p.s = s
	p.mu.Unlock()
}

// TestMPSDaemonSupervision runs the agent's MPS supervision against the
// stand-in for nvidia-cuda-mps-control: a GPU in MPS mode gets a daemon
// with its pipe and log directories under the host root, in EXCLUSIVE_PROCESS
// compute mode, with its MPS slice's size as every client's limits; a
// tenant that asks for more in its environment gets the slice's; a daemon
// that dies is started again; a new client size restarts a daemon that
// has servers; a GPU that leaves MPS mode has its daemon told to quit and
// its compute mode put back.
func TestMPSDaemonSupervision(t *testing.T) {
	standIn := buildStandIn(t)
	e := newEnv(t)
	gpu := e.dev(2).UUID
	var cmMu sync.Mutex
	var computeModes []nvml.ComputeMode
	e.dev(2).SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return {
		cmMu.Lock()
		computeModes = append(computeModes, m)
		cmMu.Unlock()
		return nvml.SUCCESS
	}
	lastComputeMode := func() (nvml.ComputeMode, int) {
		cmMu.Lock()
		defer cmMu.Unlock()
		if len(computeModes) == 0 {
			return -1, 0
		}
		return computeModes[len(computeModes)-1], len(computeModes)
	}
	mpsSlice := SliceInfo{ID: "slice-m", PodUID: uidC, Pod: "nb-m", Namespace: "ns", GPU: gpu, Sharing: v1.SharingMPS,
		Initial: v1.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 30}}
	pods := &mutablePods{s: StaticPods{mpsSlice}}
	modes := &fakeModes{m: map[string]v1.SharingMode{gpu: v1.SharingMPS, e.dev(0).UUID: v1.SharingSliced}}
	a, err := New(Config{Node: "gpu-1", HostRoot: e.root, PaceInterval: -1}, Deps{NVML: e.lib, Samples: nullStore{}, Quotas: nullStore{},
		Audit: e.audit, Pods: pods, Proc: ProcFS{Root: e.proc.root}, Killer: e.killer, Clock: e.clock,
		Modes: modes, MPS: ExecMPS{Path: standIn}, HasSymbol: func(name string) bool { return !slices.Contains(xidSymbols, name) }})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	dirs := MPSDirs{Pipe: filepath.Join(e.root, "mps", gpu, "pipe"), Log: filepath.Join(e.root, "mps", gpu, "log")}
	control := func(cmds ...string) (string, error) {
		return ExecMPS{Path: standIn}.Control(t.Context(), gpu, dirs, cmds...)
	}
	running := func(what string, cond func(MPSStatus) bool) MPSStatus {
		t.Helper()
		var st MPSStatus
		stubtest.Eventually(t, what, func() (bool, string) {
			st = a.MPS()[gpu]
			return cond(st), fmt.Sprintf("%+v", st)
		})
		return st
	}
	st := running("the MPS daemon runs with the slice's size", func(s MPSStatus) bool { return s.Running && s.Percent == 30 && s.MemoryMiB == 16384 })
	if out, err := control("get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0"); err != nil || out != "30.0\n16384M\n" {
		t.Errorf("daemon defaults %q, %v; want 30.0 and 16384M", out, err)
	}
	if m, _ := lastComputeMode(); m != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode %d, want EXCLUSIVE_PROCESS (%d)", m, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
	}
	if _, err := os.Stat(filepath.Join(dirs.Log, "control.log")); err != nil {
		t.Errorf("no control log under the host root: %v", err)
	}
	if a.MPS()[e.dev(0).UUID].Running {
		t.Error("a daemon runs on a sliced GPU")
	}

	// The tenant cannot widen: whatever its environment asks, an MPS client
	// gets the daemon's limits, which are its slice's.
	client := func(env ...string) string {
		t.Helper()
		cmd := exec.Command(standIn, "-client", "1000")
		cmd.Env = append([]string{"CUDA_MPS_PIPE_DIRECTORY=" + dirs.Pipe}, env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("MPS client: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	for _, env := range [][]string{nil, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=143000M"}} {
		if got, want := client(env...), "active_thread_percentage=30 pinned_mem_limit_mib=16384"; got != want {
			t.Errorf("client with env %q got %q, want %q", env, got, want)
		}
	}
	if got := client("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10"); !strings.HasPrefix(got, "active_thread_percentage=10 ") {
		t.Errorf("a client may lower its share: %q", got)
	}

	// The daemon dies: it is started again, with the limits set again.
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = running("the MPS daemon is restarted after it died", func(s MPSStatus) bool { return s.Running && s.Restarts == 1 && s.PID != st.PID })
	if out, err := control("get_default_active_thread_percentage"); err != nil || out != "30.0\n" {
		t.Errorf("after the restart: defaults %q, %v; want 30.0", out, err)
	}

	// A new size while the dead daemon's successor has a server (the
	// client above started one): the daemon starts over with it.
	client()
	pods.set(StaticPods{{ID: "slice-n", PodUID: uidC, Pod: "nb-n", Namespace: "ns", GPU: gpu, Sharing: v1.SharingMPS,
		Initial: v1.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 20}}})
	e.clock.fire(t.Context(), DefaultHeartbeatInterval)
	st = running("the daemon restarted for the new size", func(s MPSStatus) bool { return s.Running && s.Percent == 20 && s.PID != st.PID })
	if st.Restarts != 1 {
		t.Errorf("a size change counted as a crash: %+v", st)
	}
	if got, want := client("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"), "active_thread_percentage=20 pinned_mem_limit_mib=8192"; got != want {
		t.Errorf("client after the size change got %q, want %q", got, want)
	}

	// The GPU leaves MPS mode: the daemon quits, the compute mode goes back.
	pid := st.PID
	pods.set(nil)
	modes.set(gpu, v1.SharingSliced)
	e.clock.fire(t.Context(), DefaultHeartbeatInterval)
	running("the daemon stopped", func(s MPSStatus) bool { return !s.Running && s.PID == 0 })
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("daemon %d still runs after the GPU left MPS mode", pid)
	}
	if m, _ := lastComputeMode(); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("compute mode %d after leaving MPS mode, want DEFAULT", m)
	}
	log, err := os.ReadFile(filepath.Join(dirs.Log, "control.log"))
	if err != nil || !strings.Contains(string(log), "User: quit") {
		t.Errorf("control log does not show the quit: %v\n%s", err, log)
	}
	stop()
	stopped = true
}
