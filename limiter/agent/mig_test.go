package agent

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// migDevice is a MIG device handle (one compute instance) of a GPU in the
// go-nvml mock. The mock's server.Device models MIG mode, GPU instances
// and compute instances (with the H200's MIG profiles: memory, SM and slice
// counts) but no MIG device handles, which are what NVML gives a MIG
// instance's UUID, memory and processes through; this fixture adds them,
// built from the mock's own instances and profiles.
type migDevice struct {
	mock.Device
	procs []nvml.ProcessInfo
	ret   nvml.Return // of GetComputeRunningProcesses
}

// enableMIG switches mock GPU d to MIG mode and creates one GPU instance
// of each profile id in giProfiles (nvml.GPU_INSTANCE_PROFILE_*) with one
// compute instance spanning it, through the mock's own MIG API. named
// says whether the MIG devices carry NVML's name ("… MIG 3g.71gb"); without
// it the agent names the profile from the attributes. It returns the MIG
// devices in creation order.
func enableMIG(t *testing.T, d *server.Device, named bool, giProfiles ...int) []*migDevice {
	t.Helper()
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v", ret)
	}
	ciFull := map[int]int{nvml.GPU_INSTANCE_PROFILE_1_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
		nvml.GPU_INSTANCE_PROFILE_7_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}
	var out []*migDevice
	for n, p := range giProfiles {
		info, ret := d.GetGpuInstanceProfileInfo(p)
		if ret != nvml.SUCCESS {
			t.Fatalf("GPU instance profile %d: %v", p, ret)
		}
		gi, ret := d.CreateGpuInstance(&info)
		if ret != nvml.SUCCESS {
			t.Fatalf("CreateGpuInstance: %v", ret)
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciFull[p], nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			t.Fatalf("compute instance profile: %v", ret)
		}
		ci, ret := gi.CreateComputeInstance(&ciInfo)
		if ret != nvml.SUCCESS {
			t.Fatalf("CreateComputeInstance: %v", ret)
		}
		giInfo, _ := gi.GetInfo()
		cInfo, _ := ci.GetInfo()
		m := &migDevice{ret: nvml.SUCCESS}
		uuid := fmt.Sprintf("MIG-%s-%04x-4000-8000-%012x", d.UUID[4:12], d.Index, n)
		name := ""
		if named {
			name = fmt.Sprintf("%s MIG %dg.%dgb", d.Config.Name, info.SliceCount, info.MemorySizeMB/1024)
		}
		m.GetUUIDFunc = func() (string, nvml.Return) { return uuid, nvml.SUCCESS }
		m.GetNameFunc = func() (string, nvml.Return) { return name, nvml.SUCCESS }
		m.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: info.MemorySizeMB << 20}, nvml.SUCCESS
		}
		m.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{MultiprocessorCount: ciInfo.MultiprocessorCount, GpuInstanceSliceCount: info.SliceCount,
				ComputeInstanceSliceCount: ciInfo.SliceCount, MemorySizeMB: info.MemorySizeMB}, nvml.SUCCESS
		}
		m.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return int(giInfo.Id), nvml.SUCCESS }
		m.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return int(cInfo.Id), nvml.SUCCESS }
		m.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return m.procs, m.ret }
		out = append(out, m)
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= len(out) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return out[i], nvml.SUCCESS
	}
	// In MIG mode the GPU's own process list would repeat its instances';
	// the agent must not ask for it.
	d.GetComputeRunningProcessesFunc = nil
	d.GetProcessUtilizationFunc = nil
	return out
}

// migEnv is newEnv with GPU 0 in MIG mode (two 3g.71gb instances and one
// 1g.18gb, named by NVML) and GPU 1 in MIG mode with two 1g.18gb
// instances whose names carry no profile; slices A and B on GPU 0's first
// two instances, C on GPU 1's first.
func migEnv(t *testing.T) (*testEnv, [][]*migDevice) {
	t.Helper()
	e := newEnv(t)
	migs := [][]*migDevice{
		enableMIG(t, e.dev(0), true, nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE),
		enableMIG(t, e.dev(1), false, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE),
	}
	uuid := func(m *migDevice) string { u, _ := m.GetUUID(); return u }
	for i, m := range []*migDevice{migs[0][0], migs[0][1], migs[1][0]} {
		e.pods[i].GPU, e.pods[i].Sharing, e.pods[i].Parent = uuid(m), v1.SharingMIG, e.dev(i/2).UUID
	}
	// The processes of newEnv, now on the instances: 100 and 101 (A) on
	// GPU 0's first, 200 (B) on its second, 300 (host) on its third;
	// 500 (C) and 600 (a pod not gpubroker's) on GPU 1's first.
	migs[0][0].procs = []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 1 << 30}, {Pid: 101, UsedGpuMemory: 512 << 20}}
	migs[0][1].procs = []nvml.ProcessInfo{{Pid: 200, UsedGpuMemory: 2 << 30}}
	migs[0][2].procs = []nvml.ProcessInfo{{Pid: 300, UsedGpuMemory: 100 << 20}}
	migs[1][0].procs = []nvml.ProcessInfo{{Pid: 500, UsedGpuMemory: 256 << 20}, {Pid: 600, UsedGpuMemory: 64 << 20}}
	return e, migs
}

// TestMIGInstancesDiscoveredAndReported: a MIG-mode GPU is healthy and
// reported in MIG mode, and each of its instances is reported as a device
// of its own with its MIG UUID, profile, memory, SMs, share of the GPU's
// SMs and instance ids; GPUs not in MIG mode carry the node label's mode.
func TestMIGInstancesDiscoveredAndReported(t *testing.T) {
	e, migs := migEnv(t)
	a := e.agent(t, Config{}, nil)
	a.setRequestedMode(v1.SharingMPS)
	reports := a.nodeReport().GPUs
	u0, u1, u2 := e.dev(0).UUID, e.dev(1).UUID, e.dev(2).UUID
	inst := func(m *migDevice, parent, profile string, mib int64, sms, share, gi int) agentstore.GPUReport {
		uuid, _ := m.GetUUID()
		return agentstore.GPUReport{GPU: v1.GPU{UUID: uuid, Node: "gpu-1", Model: "NVIDIA H200 141GB HBM3e", MemoryMiB: mib, SMCount: sms,
			Healthy: true, Mode: v1.SharingMIG, MIGProfile: profile, ParentUUID: parent, ComputePercent: share}, GPUInstanceID: gi, Since: t0}
	}
	gpu := func(uuid string, mode v1.SharingMode, mig bool) agentstore.GPUReport {
		return agentstore.GPUReport{GPU: v1.GPU{UUID: uuid, Node: "gpu-1", Model: "NVIDIA H200 141GB HBM3e", MemoryMiB: 144384, SMCount: 132,
			Healthy: true, Mode: mode}, MIGEnabled: mig, Since: t0}
	}
	want := []agentstore.GPUReport{
		gpu(u0, v1.SharingMIG, true),
		inst(migs[0][0], u0, "3g.71gb", 72704, 48, 36, 0),
		inst(migs[0][1], u0, "3g.71gb", 72704, 48, 36, 1),
		inst(migs[0][2], u0, "1g.18gb", 18432, 16, 12, 2),
		gpu(u1, v1.SharingMIG, true),
		inst(migs[1][0], u1, "1g.18gb", 18432, 16, 12, 0),
		inst(migs[1][1], u1, "1g.18gb", 18432, 16, 12, 1),
		gpu(u2, v1.SharingMPS, false),
	}
	if diff := cmp.Diff(want, reports[:len(want)]); diff != "" {
		t.Errorf("node report (-want +got):\n%s", diff)
	}
	if len(reports) != len(want)+5 {
		t.Errorf("%d devices reported, want %d (8 GPUs and 5 MIG instances)", len(reports), len(want)+5)
	}
}

// TestPodsOnMIGUUIDsAttributed: processes on MIG instances count for the
// slices placed on those instances' MIG UUIDs, and only there; SM use is
// missing (NVML has no per-process utilization on MIG), never zero; the
// MIG-mode GPUs themselves are not asked for processes; the host's
// process on an instance is an orphan.
func TestPodsOnMIGUUIDsAttributed(t *testing.T) {
	e, _ := migEnv(t)
	a := e.agent(t, Config{}, nil)
	r := a.sampleRound(t.Context())
	got := map[string]string{}
	for id, s := range samples(r) {
		got[id] = fmt.Sprintf("mem %v np %v sm %v missing %q", deref(s.MemoryUsedMiB), deref(s.Processes), s.SMPercent, s.Missing)
	}
	const noSM = "process utilization: ERROR_NOT_SUPPORTED"
	want := map[string]string{
		"slice-a": `mem 1536 np 2 sm <nil> missing "` + noSM + `"`,
		"slice-b": `mem 2048 np 1 sm <nil> missing "` + noSM + `"`,
		"slice-c": `mem 256 np 1 sm <nil> missing "` + noSM + `"`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	var orphans []string
	for _, p := range r.Orphans {
		orphans = append(orphans, fmt.Sprintf("%d on %s", p.PID, p.GPU[:4]))
	}
	if diff := cmp.Diff([]string{"300 on MIG-", "600 on MIG-"}, orphans); diff != "" {
		t.Errorf("orphans (-want +got):\n%s", diff)
	}
	// The quota files of MIG slices cap memory and leave compute unpaced.
	for _, s := range e.pods {
		q := s.quota(s.Initial)
		if q.ComputePercent != 100 || q.ComputeLimitPercent != 100 || q.MemoryLimitBytes != uint64(s.Initial.MemoryMiB)*mib {
			t.Errorf("%s quota %+v, want %d MiB at 100/100", s.ID, q, s.Initial.MemoryMiB)
		}
	}
}

// TestLostMIGGPUMarkedUnhealthyAlone: an instance reporting the GPU lost
// marks its GPU and every instance of it unhealthy, and nothing else; an
// Xid on the other MIG GPU does the same for it.
func TestLostMIGGPUMarkedUnhealthyAlone(t *testing.T) {
	e, migs := migEnv(t)
	migs[0][1].ret = nvml.ERROR_GPU_IS_LOST
	a := e.agent(t, Config{}, nil)
	got := samples(a.sampleRound(t.Context()))
	if s := got["slice-c"]; s.MemoryUsedMiB == nil {
		t.Errorf("slice-c on the other MIG GPU: %+v, want measured", s)
	}
	unhealthy := func() []string {
		var out []string
		for _, g := range a.devs.reports() {
			if !g.Healthy {
				out = append(out, g.UUID)
			}
		}
		return out
	}
	var want []string
	for _, g := range a.devs.reports()[:4] { // GPU 0 and its three instances
		want = append(want, g.UUID)
	}
	if diff := cmp.Diff(want, unhealthy()); diff != "" {
		t.Errorf("unhealthy after a lost instance (-want +got):\n%s", diff)
	}
	for _, g := range a.devs.reports()[:4] {
		if !strings.Contains(g.Reason, "gpu lost") {
			t.Errorf("%s reason %q, want the loss", g.UUID, g.Reason)
		}
	}
	a.onXid(t.Context(), nvml.EventData{Device: e.lib.Devices[1], EventType: nvml.EventTypeXidCriticalError, EventData: 79})
	for _, g := range a.devs.reports()[4:7] {
		want = append(want, g.UUID)
	}
	if diff := cmp.Diff(want, unhealthy()); diff != "" {
		t.Errorf("unhealthy after an Xid on GPU 1 (-want +got):\n%s", diff)
	}
}
