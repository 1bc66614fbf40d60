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
	srv := redistest.Start(t)
	prefix := srv.Prefix(t)
	rdb := srv.Client(t)
	store := redisstore.New(rdb, prefix)
	agents := agentstore.New(rdb, prefix)
	ctx := t.Context()
	if err := store.MarkReconciled(ctx); err != nil {
		t.Fatal(err)
	}
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
		{UUID: "GPU-a", Node: "gpu-7", Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: true},
		{UUID: "GPU-b", Node: "gpu-7", Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: true},
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
