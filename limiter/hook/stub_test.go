package hook_test

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
)

// TestStubThroughGoNVML drives the stub libnvidia-ml.so.1 with the real
// go-nvml bindings, as the node agent will: the figures it reports are the
// simulated device's, including another process's memory and utilization.
// Not parallel: the stub reads GPUBROKER_STUB_STATE from this process's env.
func TestStubThroughGoNVML(t *testing.T) {
	dev := newDevice(t)
	p := dev.startBare()
	if r := p.do(fmt.Sprintf("alloc linear %d", 100*mib)); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	lib := openStubNVML(t, dev)
	st := dev.stub()

	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || n != 1 {
		t.Fatalf("DeviceGetCount = %d, %v; want 1", n, ret)
	}
	d, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex: %v", ret)
	}
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS || uuid != st.UUID {
		t.Errorf("GetUUID = %q, %v; want %q", uuid, ret, st.UUID)
	}
	if byUUID, ret := lib.DeviceGetHandleByUUID(uuid); ret != nvml.SUCCESS || byUUID == nil {
		t.Errorf("DeviceGetHandleByUUID: %v", ret)
	}
	if name, ret := d.GetName(); ret != nvml.SUCCESS || name == "" {
		t.Errorf("GetName = %q, %v", name, ret)
	}
	if v, ret := lib.SystemGetDriverVersion(); ret != nvml.SUCCESS || v == "" {
		t.Errorf("SystemGetDriverVersion = %q, %v", v, ret)
	}
	attrs, ret := d.GetAttributes()
	if ret != nvml.SUCCESS || uint64(attrs.MultiprocessorCount) != st.SMCount || attrs.MemorySizeMB != st.TotalBytes/mib {
		t.Errorf("GetAttributes = %+v, %v; want %d SMs, %d MiB", attrs, ret, st.SMCount, st.TotalBytes/mib)
	}
	if pci, ret := d.GetPciInfo(); ret != nvml.SUCCESS || pci.PciDeviceId == 0 {
		t.Errorf("GetPciInfo = %+v, %v", pci, ret)
	}
	if major, minor, ret := d.GetCudaComputeCapability(); ret != nvml.SUCCESS || major != 9 || minor != 0 {
		t.Errorf("GetCudaComputeCapability = %d.%d, %v; want 9.0", major, minor, ret)
	}
	if _, _, ret := d.GetMigMode(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetMigMode: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	mem, ret := d.GetMemoryInfo()
	if diff := cmp.Diff(nvml.Memory{Total: st.TotalBytes, Used: 100 * mib, Free: st.TotalBytes - 100*mib}, mem); ret != nvml.SUCCESS || diff != "" {
		t.Errorf("GetMemoryInfo (%v) (-want +got):\n%s", ret, diff)
	}
	mem2, ret := d.GetMemoryInfo_v2()
	if ret != nvml.SUCCESS || mem2.Total != st.TotalBytes || mem2.Used != 100*mib || mem2.Free != st.TotalBytes-100*mib {
		t.Errorf("GetMemoryInfo_v2 = %+v, %v", mem2, ret)
	}
	procs, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeRunningProcesses: %v", ret)
	}
	want := nvml.ProcessInfo{Pid: uint32(p.pid()), UsedGpuMemory: 100 * mib, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	if !slices.Contains(procs, want) {
		t.Errorf("GetComputeRunningProcesses = %+v, want it to contain %+v", procs, want)
	}

	// Utilization: saturate the device from the other process, then sample.
	if _, ret := d.GetProcessUtilization(0); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND && ret != nvml.ERROR_INSUFFICIENT_SIZE {
		t.Fatalf("GetProcessUtilization: %v", ret)
	}
	since := uint64(time.Now().UnixMicro())
	if r := p.do("saturate busy_100us 132 300"); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	samples, ret := d.GetProcessUtilization(since)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetProcessUtilization after load: %v", ret)
	}
	i := slices.IndexFunc(samples, func(s nvml.ProcessUtilizationSample) bool { return s.Pid == uint32(p.pid()) })
	if i < 0 || samples[i].SmUtil < 80 || samples[i].TimeStamp <= since {
		t.Errorf("GetProcessUtilization(%d) = %+v; want a newer sample for pid %d with smUtil >= 80", since, samples, p.pid())
	}
	if u, ret := d.GetUtilizationRates(); ret != nvml.SUCCESS || u.Gpu < 50 {
		t.Errorf("GetUtilizationRates = %+v, %v; want gpu >= 50 after saturation", u, ret)
	}
}

// openStubNVML loads the stub libnvidia-ml.so.1 through go-nvml on dev's
// state (setting GPUBROKER_STUB_STATE for the test: not parallel).
func openStubNVML(t *testing.T, dev *device) nvml.Interface {
	t.Helper()
	t.Setenv("GPUBROKER_STUB_STATE", dev.state)
	lib := nvml.New(nvml.WithLibraryPath(filepath.Join(buildDir(), "stub", "libnvidia-ml.so.1")))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	t.Cleanup(func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			t.Errorf("Shutdown: %v", ret)
		}
	})
	return lib
}

// TestStubUtilizationOverEachReadersWindow: two readers of
// nvmlDeviceGetProcessUtilization at different rates (the hook's pacer
// every few ms, the node agent every second) each get a process's use over
// the samples since their own lastSeen, as NVML's header documents, not
// the newest sample only. A process saturates the device for 300 ms and
// then idles while a fast reader polls until it sees the idle; the slow
// reader, asking from before the load, must see the window's mean (what
// the stub charged over it), not the fast reader's last 0.
func TestStubUtilizationOverEachReadersWindow(t *testing.T) {
	dev := newDevice(t)
	p := dev.startBare()
	d, ret := openStubNVML(t, dev).DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex: %v", ret)
	}
	pidUtil := func(since uint64) (nvml.ProcessUtilizationSample, bool) {
		samples, _ := d.GetProcessUtilization(since)
		i := slices.IndexFunc(samples, func(s nvml.ProcessUtilizationSample) bool { return s.Pid == uint32(p.pid()) })
		if i < 0 {
			return nvml.ProcessUtilizationSample{}, false
		}
		return samples[i], true
	}
	if r := p.do("alloc linear 1048576"); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	before := dev.stub()
	since := uint64(time.Now().UnixMicro())
	done := make(chan reply, 1)
	go func() { done <- p.do("saturate busy_100us 132 300") }()
	fastSeen, fastBusy, fastIdle := since, false, false
	deadline := time.Now().Add(30 * time.Second)
	for !fastIdle {
		if time.Now().After(deadline) {
			t.Fatalf("the fast reader saw no busy sample then an idle one in 30 s (busy seen: %v)", fastBusy)
		}
		s, ok := pidUtil(fastSeen)
		if !ok {
			continue
		}
		fastSeen = s.TimeStamp
		switch {
		case s.SmUtil >= 80:
			fastBusy = true
		case fastBusy && s.SmUtil == 0:
			select {
			case r := <-done:
				if r.Res != cudaSuccess {
					t.Fatal(r)
				}
				fastIdle = true
			default:
			}
		}
	}
	slow, ok := pidUtil(since)
	after := dev.stub()
	if !ok {
		t.Fatalf("the slow reader got no entry for pid %d", p.pid())
	}
	want := float64(after.procSMNs(p.pid())-before.procSMNs(p.pid())) / float64((after.NowNs-before.NowNs)*after.SMCount) * 100
	t.Logf("slow reader since the load began: %d %%; charged over its window %.1f %%; the fast reader's last: 0 %%", slow.SmUtil, want)
	if want < 15 {
		t.Fatalf("only %.1f %% of the device charged over the window: the load did not run", want)
	}
	if math.Abs(float64(slow.SmUtil)-want) > 12 {
		t.Errorf("the slow reader got %d %%, want the window's %.1f %% ± 12", slow.SmUtil, want)
	}
}

// TestStubKernelTimeGrowsWithGrid: a kernel takes one wave per sm_count
// blocks, and the launcher's synchronize waits for it; the SM time charged
// is blocks x block time.
func TestStubKernelTimeGrowsWithGrid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		grid     int
		launches int
		minWall  time.Duration
	}{
		{name: "one wave", grid: 132, launches: 20, minWall: 20 * time.Millisecond},
		{name: "two waves", grid: 264, launches: 20, minWall: 40 * time.Millisecond},
		{name: "partial wave still takes a wave", grid: 10, launches: 20, minWall: 20 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dev := newDevice(t)
			p := dev.startBare()
			start := time.Now()
			if r := p.do(fmt.Sprintf("launch kernel busy_1000us %d %d", tc.grid, tc.launches)); r.Res != cudaSuccess {
				t.Fatal(r)
			}
			if wall := time.Since(start); wall < tc.minWall {
				t.Errorf("%d launches of %d blocks returned after %v, want >= %v", tc.launches, tc.grid, wall, tc.minWall)
			}
			st := dev.stub()
			if want := uint64(tc.grid*tc.launches) * 1_000_000; st.procSMNs(p.pid()) != want || st.Counters.Launch != uint64(tc.launches) {
				t.Errorf("charged %d SM-ns over %d launches, want %d over %d", st.procSMNs(p.pid()), st.Counters.Launch, want, tc.launches)
			}
		})
	}
}

// TestStubSaturatesAndShares: one launcher alone gets the whole device; two
// get about half each, never more than the device together.
func TestStubSaturatesAndShares(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d launchers", n), func(t *testing.T) {
			t.Parallel()
			dev := newDevice(t)
			var ps []*proc
			for range n {
				ps = append(ps, dev.startBare("saturate", "busy_200us", "132", "2500"))
			}
			time.Sleep(500 * time.Millisecond) // places the window; the launchers run on their own
			a := dev.stub()
			time.Sleep(1500 * time.Millisecond)
			b := dev.stub()
			span := float64(b.NowNs-a.NowNs) * float64(b.SMCount)
			total := 0.0
			for _, p := range ps {
				share := float64(b.procSMNs(p.pid())-a.procSMNs(p.pid())) / span * 100
				t.Logf("launcher %d: %.1f%% of the device", p.pid(), share)
				total += share
				if want := 100.0 / float64(n); math.Abs(share-want) > 10 {
					t.Errorf("launcher %d got %.1f%% of the device, want %.0f ± 10", p.pid(), share, want)
				}
			}
			if total > 103 {
				t.Errorf("launchers together got %.1f%% of the device", total)
			}
		})
	}
}

// TestStubReleasesMemoryOfKilledProcess: like the real driver, the stub
// frees a dead process's memory.
func TestStubReleasesMemoryOfKilledProcess(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	p := dev.startBare()
	if r := p.do(fmt.Sprintf("fill linear %d", 256*mib)); r.Res != cudaSuccess && r.Vals[0] == 0 {
		t.Fatal(r)
	}
	_ = p.do(fmt.Sprintf("alloc async %d", 8*mib))
	if held := dev.stub().UsedBytes; held < 8*mib {
		t.Fatalf("device shows %d bytes used before the kill", held)
	}
	p.kill()
	st := dev.stub()
	if st.UsedBytes != 0 || len(st.Procs) != 0 || st.Counters.Reaped != 1 {
		t.Errorf("after the kill: used %d bytes, %d processes, %d reaped; want 0, 0, 1", st.UsedBytes, len(st.Procs), st.Counters.Reaped)
	}
}

// TestStubPoolsKeepMemoryUntilSynchronize: a pool keeps freed memory
// reserved until a synchronization releases what is above its threshold.
func TestStubPoolsKeepMemoryUntilSynchronize(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	p := dev.startBare()
	if r := p.do(fmt.Sprintf("alloc async %d", 10*mib)); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	if r := p.do("free"); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	if held := dev.stub().procMem(p.pid()); held != 10*mib {
		t.Errorf("after cuMemFreeAsync the pool holds %d bytes, want %d until a synchronize", held, 10*mib)
	}
	if r := p.do("sync"); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	if held := dev.stub().procMem(p.pid()); held != 0 {
		t.Errorf("after cuCtxSynchronize the pool holds %d bytes, want 0", held)
	}
}
