package agent

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

func TestDiscoverDGXH200(t *testing.T) {
	lib := dgxh200.New()
	gpus, err := Discover(lib, "gpu-1")
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(gpus) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(gpus))
	}
	seen := map[string]bool{}
	for _, g := range gpus {
		if g.Node != "gpu-1" || !g.Healthy || g.SMCount != 132 {
			t.Errorf("gpu %+v: want node gpu-1, healthy, 132 SMs", g)
		}
		// 141 GB of HBM3e: between 140,000 and 145,000 MiB.
		if g.MemoryMiB < 140000 || g.MemoryMiB > 145000 {
			t.Errorf("gpu %s: memory %d MiB, want about 141 GB", g.UUID, g.MemoryMiB)
		}
		if seen[g.UUID] {
			t.Errorf("duplicate uuid %s", g.UUID)
		}
		seen[g.UUID] = true
	}
}

func TestDiscoverReportsBrokenDeviceAndKeepsOthers(t *testing.T) {
	lib := dgxh200.New()
	lib.Devices[3].(*server.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
	}
	gpus, err := Discover(lib, "gpu-1")
	if !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Fatalf("err = %v, want it to wrap ERROR_GPU_IS_LOST", err)
	}
	healthy := 0
	for _, g := range gpus {
		if g.Healthy {
			healthy++
		}
	}
	if len(gpus) != 8 || healthy != 7 {
		t.Fatalf("got %d GPUs with %d healthy, want 8 with 7 healthy", len(gpus), healthy)
	}
}

func TestSMCountUnknownModel(t *testing.T) {
	if _, err := SMCount("NVIDIA Imaginary X1"); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("err = %v, want ErrUnknownModel", err)
	}
}
