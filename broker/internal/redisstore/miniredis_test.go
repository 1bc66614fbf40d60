package redisstore

import (
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// TestMiniredisCompatibility runs the store's scripts on miniredis, the
// embedded Redis of dev mode (gpubroker dev). It is a smoke test of every
// script; the behaviour itself is tested against a real redis-server.
func TestMiniredisCompatibility(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	clk := newFakeClock()
	s := New(rdb, "dev:", WithClock(clk.Now))
	ctx := t.Context()

	if err := s.MarkReconciled(ctx); err != nil {
		t.Fatal(err)
	}
	register(t, s, h200("GPU-a", "n1"), h200("GPU-b", "n1"))
	if err := s.SetGPUHealth(ctx, "GPU-b", false); err != nil {
		t.Fatalf("SetGPUHealth: %v", err)
	}
	a := mustPlace(t, s, fleet.PlaceRequest{SliceID: "x", User: "dev", Slice: slice(8192, 20),
		GroupQuotas: map[string]fleet.Quota{"devs": {Servers: 5}}})
	if a.GPUUUID != "GPU-a" || a.Node != "n1" {
		t.Errorf("placed %+v, want GPU-a on n1", a)
	}
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "y", User: "dev", Slice: slice(8192, 20), Policy: fleet.PolicySpread})
	_, err := s.Place(ctx, fleet.PlaceRequest{SliceID: "z", User: "dev", Slice: slice(200000, 20)})
	var ce *fleet.CapacityError
	if !errors.As(err, &ce) || ce.LargestFreeMiB != 143771-16384 {
		t.Errorf("capacity error = %v, want one naming %d MiB free", err, 143771-16384)
	}
	_, err = s.Place(ctx, fleet.PlaceRequest{SliceID: "q", User: "dev", Slice: slice(1024, 1), UserQuota: fleet.Quota{Servers: 2}})
	if !errors.Is(err, fleet.ErrQuotaExceeded) {
		t.Errorf("quota: err = %v, want ErrQuotaExceeded", err)
	}
	if ok, err := s.Restore(ctx, fleet.Allocation{SliceID: "r", User: "dev", Slice: slice(1024, 10), GPUUUID: "GPU-b"}); err != nil || !ok {
		t.Errorf("Restore = %v, %v", ok, err)
	}
	if ok, err := s.Release(ctx, "x"); err != nil || !ok {
		t.Errorf("Release = %v, %v", ok, err)
	}
	verify(t, s)

	k := fleet.ServerKey{User: "dev", Name: ""}
	if _, _, err := s.CreateServer(ctx, pendingServer("dev", "", "sp1", "i1")); err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	if _, err := s.Transition(ctx, k, "sp1", v1.StatePlacing, "placing", Patch{Allocation: &a}); err != nil {
		t.Fatalf("Transition: %v", err)
	}
	if _, err := s.Transition(ctx, k, "sp1", v1.StateFailed, "failed", Patch{}); err != nil {
		t.Fatalf("Transition: %v", err)
	}
	evs, err := s.Events(ctx, k, "", 0)
	if err != nil || len(evs) != 3 {
		t.Fatalf("Events = %v, %v; want 3", evs, err)
	}
	if more, err := s.Events(ctx, k, evs[2].ID, 10*time.Millisecond); err != nil || len(more) != 0 {
		t.Errorf("blocking Events = %v, %v; want none", more, err)
	}
	if list, err := s.ListServers(ctx, ""); err != nil || len(list) != 1 {
		t.Errorf("ListServers = %v, %v", list, err)
	}
	if err := s.DeleteServer(ctx, k, "sp1"); err != nil {
		t.Errorf("DeleteServer: %v", err)
	}
	if ok, err := s.RestoreServer(ctx, pendingServer("dev", "b", "sp2", "")); err != nil || !ok {
		t.Errorf("RestoreServer = %v, %v", ok, err)
	}
}
