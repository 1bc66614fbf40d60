//go:build gpu

// This file is built only with -tags gpu: limiter/hook/gpu-check.sh runs it
// on a machine with an NVIDIA GPU and driver (CI has none, and go-nvml's
// mocks cover the same code there: mig_test.go).

package agent

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestRealGPUDiscovery runs the agent's device discovery on the real
// driver and prints every device it reports. GPUCHECK_MIG_UUIDS lists, space
// separated, the MIG instance UUIDs nvidia-smi -L shows: each must be
// reported as a MIG instance (parent, MIG profile, memory, SM count,
// computePercent), healthy, and a MIG-mode GPU's instances may not hold more
// memory or SMs than it has.
func TestRealGPUDiscovery(t *testing.T) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("nvml init: %v", ret)
	}
	defer lib.Shutdown()
	has := func(name string) bool { return lib.Extensions().LookupSymbol(name) == nil }
	ds, err := discoverDevices(lib, "gpu-check", has, time.Now())
	if err != nil {
		t.Errorf("discovery: %v", err)
	}
	reported := map[string]bool{}
	memOf, smOf := map[string]int64{}, map[string]int{}
	for _, r := range ds.reports() {
		t.Logf("device uuid=%s mode=%q migEnabled=%v migProfile=%q parent=%q memoryMiB=%d smCount=%d computePercent=%d gi=%d ci=%d healthy=%v reason=%q",
			r.UUID, r.Mode, r.MIGEnabled, r.MIGProfile, r.ParentUUID, r.MemoryMiB, r.SMCount, r.ComputePercent,
			r.GPUInstanceID, r.ComputeInstanceID, r.Healthy, r.Reason)
		reported[r.UUID] = true
		if r.ParentUUID == "" {
			continue
		}
		if !strings.HasPrefix(r.UUID, "MIG-") || r.MIGProfile == "" || r.MemoryMiB <= 0 || r.SMCount <= 0 ||
			r.ComputePercent < 1 || r.ComputePercent > 100 || !r.Healthy {
			t.Errorf("MIG instance %s reported incompletely: %+v", r.UUID, r)
		}
		memOf[r.ParentUUID] += r.MemoryMiB
		smOf[r.ParentUUID] += r.SMCount
	}
	for _, r := range ds.reports() {
		if r.MIGEnabled && (memOf[r.UUID] > r.MemoryMiB || smOf[r.UUID] > r.SMCount) {
			t.Errorf("the instances of %s hold %d MiB and %d SMs, more than its %d MiB and %d SMs",
				r.UUID, memOf[r.UUID], smOf[r.UUID], r.MemoryMiB, r.SMCount)
		}
	}
	for _, uuid := range strings.Fields(os.Getenv("GPUCHECK_MIG_UUIDS")) {
		if !reported[uuid] {
			t.Errorf("nvidia-smi lists MIG instance %s; the agent did not report it", uuid)
		}
	}
}
