package agent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// smCounts maps a model name fragment to the number of streaming
// multiprocessors of the full device. NVML reports no SM count for a whole
// (non-MIG) GPU, so the figures come from NVIDIA's product datasheets:
// H100 SXM5 and H200 132, H100 PCIe 114, A100 108, L40S 142, B200 148.
// The first matching fragment wins, so more specific names come first.
var smCounts = []struct {
	fragment string
	sms      int
}{
	{"H100 PCIe", 114},
	{"H100", 132},
	{"H200", 132},
	{"A100", 108},
	{"L40S", 142},
	{"B200", 148},
}

// ErrUnknownModel is returned (wrapped) for a GPU whose SM count is not known.
var ErrUnknownModel = errors.New("agent: unknown gpu model")

// SMCount returns the SM count of a GPU model by its NVML name, or
// ErrUnknownModel.
func SMCount(model string) (int, error) {
	for _, m := range smCounts {
		if strings.Contains(model, m.fragment) {
			return m.sms, nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrUnknownModel, model)
}

// Discover lists the GPUs NVML sees, for placement on node. lib must be
// initialised (nvml.Init) by the caller. A device that fails a query is
// reported unhealthy with the others still listed; the error joins every
// device's problem. Memory is the device's total memory in MiB (2^20 bytes).
func Discover(lib nvml.Interface, node string) ([]v1.GPU, error) {
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("device count: %w", ret)
	}
	var errs []error
	gpus := make([]v1.GPU, 0, n)
	for i := 0; i < n; i++ {
		g, err := describe(lib, i, node)
		if err != nil {
			errs = append(errs, fmt.Errorf("device %d: %w", i, err))
			if g.UUID == "" {
				continue
			}
		}
		gpus = append(gpus, g)
	}
	return gpus, errors.Join(errs...)
}

func describe(lib nvml.Interface, index int, node string) (v1.GPU, error) {
	dev, ret := lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return v1.GPU{}, fmt.Errorf("handle: %w", ret)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return v1.GPU{}, fmt.Errorf("uuid: %w", ret)
	}
	g := v1.GPU{UUID: uuid, Node: node}
	name, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("gpu %s: name: %w", uuid, ret)
	}
	g.Model = name
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("gpu %s: memory info: %w", uuid, ret)
	}
	g.MemoryMiB = int64(mem.Total >> 20)
	sms, err := SMCount(name)
	if err != nil {
		return g, fmt.Errorf("gpu %s: %w", uuid, err)
	}
	g.SMCount = sms
	g.Healthy = true
	return g, nil
}
