package agentstore_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// fakeRegistry is an in-memory broker inventory.
type fakeRegistry struct {
	mu     sync.Mutex
	gpus   map[string]v1.GPU
	writes int
}

func (f *fakeRegistry) RegisterGPU(_ context.Context, g v1.GPU) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gpus[g.UUID] = g
	f.writes++
	return nil
}

func (f *fakeRegistry) SetGPUHealth(_ context.Context, uuid string, healthy bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.gpus[uuid]
	g.Healthy = healthy
	f.gpus[uuid] = g
	f.writes++
	return nil
}

func (f *fakeRegistry) GPUs(context.Context) ([]v1.GPU, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]v1.GPU, 0, len(f.gpus))
	for _, g := range f.gpus {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b v1.GPU) int { return strings.Compare(a.UUID, b.UUID) })
	return out, nil
}

func TestSyncInventory(t *testing.T) {
	st, _ := newStore(t)
	ctx := t.Context()
	h200 := func(uuid, node string, healthy bool) v1.GPU {
		return v1.GPU{UUID: uuid, Node: node, Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: healthy}
	}
	reg := &fakeRegistry{gpus: map[string]v1.GPU{
		"GPU-dev":  h200("GPU-dev", "dev-node", true), // never reported: left alone
		"GPU-gone": h200("GPU-gone", "gpu-a", true),   // no longer in gpu-a's report
		"GPU-b1":   h200("GPU-b1", "gpu-b", true),     // gpu-b's agent went quiet
		"GPU-a1":   h200("GPU-a1", "gpu-a", false),    // recovered per the report
	}}
	reports := []agentstore.NodeReport{
		{Node: "gpu-a", At: t0, HeartbeatMs: 10000, GPUs: []agentstore.GPUReport{
			{GPU: h200("GPU-a1", "gpu-a", true)}, {GPU: h200("GPU-a2", "gpu-a", false), Reason: "xid 79"}}},
		{Node: "gpu-b", At: t0.Add(-time.Minute), HeartbeatMs: 10000, GPUs: []agentstore.GPUReport{{GPU: h200("GPU-b1", "gpu-b", true)}}},
	}
	for _, r := range reports {
		if err := st.Heartbeat(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for i, wantWrites := range []int{4, 0} { // a1 and a2 registered, b1 and gone marked; then nothing
		reg.writes = 0
		if err := st.SyncInventory(ctx, t0.Add(time.Second), reg); err != nil {
			t.Fatal(err)
		}
		if reg.writes != wantWrites {
			t.Errorf("sync %d: %d writes, want %d", i+1, reg.writes, wantWrites)
		}
	}
	got, _ := reg.GPUs(ctx)
	want := []v1.GPU{
		h200("GPU-a1", "gpu-a", true),
		h200("GPU-a2", "gpu-a", false),
		h200("GPU-b1", "gpu-b", false),
		h200("GPU-dev", "dev-node", true),
		h200("GPU-gone", "gpu-a", false),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("inventory (-want +got):\n%s", diff)
	}
}
