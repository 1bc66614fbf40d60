package app

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// TestAgentReportsBecomePlacementInventory runs the broker's sync against a
// real redis-server: a node agent's heartbeat makes its GPUs placeable, a
// lost GPU in the report is marked unhealthy, and placement follows.
func TestAgentReportsBecomePlacementInventory(t *testing.T) {
	store, agents := inventoryStores(t)
	ctx := t.Context()
	gpu := func(uuid string, healthy bool) agentstore.GPUReport {
		return agentstore.GPUReport{GPU: v1.GPU{UUID: uuid, Node: "gpu-7", Model: "NVIDIA H200",
			MemoryMiB: 143771, SMCount: 132, Healthy: healthy}}
	}
	report := agentstore.NodeReport{Node: "gpu-7", At: time.Now(), HeartbeatMs: 10000, SampleMs: 1000,
		GPUs: []agentstore.GPUReport{gpu("GPU-a", true), gpu("GPU-b", true)}}
	if err := agents.Heartbeat(ctx, report); err != nil {
		t.Fatal(err)
	}
	sync := func() {
		t.Helper()
		if err := agents.SyncInventory(ctx, time.Now(), registry{store}); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	sync()
	got, err := store.GPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []fleet.GPU{
		{UUID: "GPU-a", Node: "gpu-7", Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: true, Mode: fleet.SharingSliced},
		{UUID: "GPU-b", Node: "gpu-7", Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: true, Mode: fleet.SharingSliced},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("inventory after the first report (-want +got):\n%s", diff)
	}

	// GPU-a is lost: only it becomes unhealthy, and placement avoids it.
	lost := gpu("GPU-a", false)
	lost.Reason = "xid 79"
	report.GPUs = []agentstore.GPUReport{lost, gpu("GPU-b", true)}
	report.At = time.Now()
	if err := agents.Heartbeat(ctx, report); err != nil {
		t.Fatal(err)
	}
	sync()
	for i := range 2 {
		a, err := store.Place(ctx, fleet.PlaceRequest{SliceID: "s" + string(rune('0'+i)), User: "u",
			Slice: fleet.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10}})
		if err != nil {
			t.Fatalf("place %d: %v", i, err)
		}
		if a.GPUUUID != "GPU-b" {
			t.Errorf("slice %d placed on %s, want the healthy GPU-b", i, a.GPUUUID)
		}
	}
}

// TestReportedModesBecomeInventory: a node label's mode and a GPU's MIG
// mode with its instances, as the agent reports them, become the modes in
// force; the agent is told them; a label change waits for the GPU to
// empty; placement follows the modes.
func TestReportedModesBecomeInventory(t *testing.T) {
	store, agents := inventoryStores(t)
	ctx := t.Context()
	h200 := func(uuid string, mode v1.SharingMode) agentstore.GPUReport {
		return agentstore.GPUReport{GPU: v1.GPU{UUID: uuid, Node: "gpu-8", Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: true, Mode: mode}}
	}
	mig := h200("GPU-m", v1.SharingMIG)
	mig.MIGEnabled = true
	inst := agentstore.GPUReport{GPU: v1.GPU{UUID: "MIG-1", Node: "gpu-8", Model: "NVIDIA H200", MemoryMiB: 72704, SMCount: 48, Healthy: true,
		Mode: v1.SharingMIG, MIGProfile: "3g.71gb", ParentUUID: "GPU-m", ComputePercent: 36}, GPUInstanceID: 1}
	beat := func(gpus ...agentstore.GPUReport) {
		t.Helper()
		if err := agents.Heartbeat(ctx, agentstore.NodeReport{Node: "gpu-8", At: time.Now(), HeartbeatMs: 10000, SampleMs: 1000, GPUs: gpus}); err != nil {
			t.Fatal(err)
		}
		for range 2 { // the second pass tells the agent what the first registered
			if err := agents.SyncInventory(ctx, time.Now(), registry{store}); err != nil {
				t.Fatalf("sync: %v", err)
			}
		}
	}
	modes := func() map[string]v1.SharingMode {
		t.Helper()
		m, err := agents.Modes(ctx, "gpu-8")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	beat(h200("GPU-p", v1.SharingMPS), mig, inst)
	want := map[string]v1.SharingMode{"GPU-p": v1.SharingMPS, "GPU-m": v1.SharingMIG, "MIG-1": v1.SharingMIG}
	if diff := cmp.Diff(want, modes()); diff != "" {
		t.Fatalf("modes told to the agent (-want +got):\n%s", diff)
	}
	a, err := store.Place(ctx, fleet.PlaceRequest{SliceID: "m", User: "u", Sharing: fleet.SharingMIG, MIGProfile: "3g.71gb"})
	if err != nil || a.GPUUUID != "MIG-1" || a.Parent != "GPU-m" {
		t.Fatalf("mig placement = %+v, %v; want MIG-1 of GPU-m", a, err)
	}
	if _, err := store.Place(ctx, fleet.PlaceRequest{SliceID: "p", User: "u", Sharing: fleet.SharingMPS,
		Slice: fleet.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10}}); err != nil {
		t.Fatal(err)
	}

	// The label goes back to sliced while the MPS client runs: pending.
	beat(h200("GPU-p", v1.SharingSliced), mig, inst)
	if m := modes()["GPU-p"]; m != v1.SharingMPS {
		t.Errorf("busy GPU-p told as %q, want mps until it empties", m)
	}
	if _, err := store.Release(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	beat(h200("GPU-p", v1.SharingSliced), mig, inst)
	if m := modes()["GPU-p"]; m != v1.SharingSliced {
		t.Errorf("emptied GPU-p told as %q, want sliced", m)
	}
	if err := store.Verify(ctx); err != nil {
		t.Error(err)
	}
}

func TestSyncInventoryLoopStopsWithItsContext(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	prefix := srv.Prefix(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- syncInventory(ctx, agentstore.New(rdb, prefix), redisstore.New(rdb, prefix), slog.New(slog.DiscardHandler), time.Hour)
	}()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("syncInventory = %v, want nil after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("syncInventory did not return after its context ended")
	}
}

// inventoryStores returns the placement store, marked reconciled, and the
// agents' store over one fresh Redis.
func inventoryStores(t *testing.T) (*redisstore.Store, *agentstore.Store) {
	t.Helper()
	srv := redistest.Start(t)
	prefix := srv.Prefix(t)
	rdb := srv.Client(t)
	store := redisstore.New(rdb, prefix)
	if err := store.MarkReconciled(t.Context()); err != nil {
		t.Fatal(err)
	}
	return store, agentstore.New(rdb, prefix)
}
