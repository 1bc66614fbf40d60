package redisstore

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

func TestPlacePicksGPUByPolicyAndModel(t *testing.T) {
	srv := redistest.Start(t)
	a100 := func(uuid, node string) fleet.GPU {
		return fleet.GPU{UUID: uuid, Node: node, Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, SMCount: 108, Healthy: true}
	}
	tests := []struct {
		name string
		// used is memory MiB already placed per GPU (20% compute each).
		used    map[string]int64
		req     fleet.PlaceRequest
		wantGPU string
	}{
		{
			name:    "binpack picks the GPU with the least free memory that fits",
			used:    map[string]int64{"GPU-a": 100000, "GPU-b": 130000, "GPU-c": 50000},
			req:     fleet.PlaceRequest{Slice: slice(8192, 10), Model: "NVIDIA H200"},
			wantGPU: "GPU-b", // 13771 MiB free: the least that fits
		},
		{
			name:    "binpack skips a GPU too full for the slice",
			used:    map[string]int64{"GPU-a": 100000, "GPU-b": 140000, "GPU-c": 50000},
			req:     fleet.PlaceRequest{Slice: slice(8192, 10), Model: "NVIDIA H200"},
			wantGPU: "GPU-a", // GPU-b has only 3771 MiB free
		},
		{
			name:    "binpack without a model compares all models",
			used:    map[string]int64{"GPU-a": 100000, "GPU-b": 140000, "GPU-c": 50000},
			req:     fleet.PlaceRequest{Slice: slice(8192, 10)},
			wantGPU: "GPU-x", // 40960 MiB free < GPU-a's 43771
		},
		{
			name:    "binpack breaks ties by uuid",
			used:    map[string]int64{},
			req:     fleet.PlaceRequest{Slice: slice(8192, 10), Model: "NVIDIA H200"},
			wantGPU: "GPU-a",
		},
		{
			name:    "spread picks the GPU with the most free memory",
			used:    map[string]int64{"GPU-a": 100000, "GPU-b": 130000, "GPU-c": 50000},
			req:     fleet.PlaceRequest{Slice: slice(8192, 10), Policy: fleet.PolicySpread},
			wantGPU: "GPU-d", // empty
		},
		{
			name:    "spread breaks ties by uuid",
			used:    map[string]int64{"GPU-a": 1000, "GPU-d": 1000},
			req:     fleet.PlaceRequest{Slice: slice(8192, 10), Policy: fleet.PolicySpread},
			wantGPU: "GPU-b",
		},
		{
			name:    "model constraint restricts to that model",
			used:    map[string]int64{},
			req:     fleet.PlaceRequest{Slice: slice(8192, 10), Model: "NVIDIA A100-SXM4-40GB"},
			wantGPU: "GPU-x",
		},
		{
			name:    "model constraint with spread",
			used:    map[string]int64{"GPU-x": 1000},
			req:     fleet.PlaceRequest{Slice: slice(8192, 10), Model: "NVIDIA A100-SXM4-40GB", Policy: fleet.PolicySpread},
			wantGPU: "GPU-y",
		},
		{
			name:    "binpack skips a GPU without free compute",
			used:    map[string]int64{"GPU-b": 1000, "GPU-b#2": 1000, "GPU-b#3": 1000, "GPU-b#4": 1000, "GPU-b#5": 1000},
			req:     fleet.PlaceRequest{Slice: slice(8192, 10), Model: "NVIDIA H200"},
			wantGPU: "GPU-a",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t, srv)
			register(t, s, h200("GPU-a", "n1"), h200("GPU-b", "n1"), h200("GPU-c", "n2"), h200("GPU-d", "n2"),
				a100("GPU-x", "n3"), a100("GPU-y", "n3"))
			for uuid, mem := range tc.used {
				// "GPU-b#2" means another 20% slice on GPU-b.
				if i := len(uuid) - 2; uuid[i] == '#' {
					uuid = uuid[:i]
				}
				if _, err := s.Restore(t.Context(), fleet.Allocation{
					SliceID: nextSlice(), User: "filler", Slice: slice(mem, 20), GPUUUID: uuid,
				}); err != nil {
					t.Fatalf("Restore on %s: %v", uuid, err)
				}
			}
			req := tc.req
			req.SliceID, req.User = nextSlice(), "alice"
			got := mustPlace(t, s, req)
			if got.GPUUUID != tc.wantGPU {
				t.Errorf("placed on %s, want %s", got.GPUUUID, tc.wantGPU)
			}
			verify(t, s)
		})
	}
}

func TestPlaceReturnsAllocationAndIsIdempotent(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-1", "gpu-1"))
	req := fleet.PlaceRequest{
		SliceID: "spawn-1", User: "alice", Slice: fleet.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50},
		GroupQuotas: map[string]fleet.Quota{"ml": {}, "ai": {}},
	}
	want := fleet.Allocation{
		SliceID: "spawn-1", User: "alice", Groups: []string{"ai", "ml"},
		Slice: req.Slice, GPUUUID: "GPU-1", Node: "gpu-1", Model: "NVIDIA H200", Sharing: fleet.SharingSliced,
	}
	got := mustPlace(t, s, req)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Place (-want +got):\n%s", diff)
	}
	// A retry, even with another size, returns the same allocation.
	req.Slice.MemoryMiB = 1
	again := mustPlace(t, s, req)
	if diff := cmp.Diff(want, again); diff != "" {
		t.Errorf("second Place (-want +got):\n%s", diff)
	}
	stored, err := s.Allocation(t.Context(), "spawn-1")
	if err != nil {
		t.Fatalf("Allocation: %v", err)
	}
	if diff := cmp.Diff(want, stored); diff != "" {
		t.Errorf("Allocation (-want +got):\n%s", diff)
	}
	usage, err := s.GPUUsage(t.Context())
	if err != nil {
		t.Fatalf("GPUUsage: %v", err)
	}
	wantUsage := []GPUUsage{{GPU: h200("GPU-1", "gpu-1"), AllocatedMiB: 8192, AllocatedComputePercent: 20, Slices: 1}}
	if diff := cmp.Diff(wantUsage, usage); diff != "" {
		t.Errorf("GPUUsage (-want +got):\n%s", diff)
	}
	if _, err := s.Allocation(t.Context(), "nope"); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("Allocation(nope) err = %v, want ErrNotFound", err)
	}
	verify(t, s)
}

func TestPlaceRefusesInvalidRequests(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-1", "n"))
	ok := fleet.PlaceRequest{SliceID: "x", User: "u", Slice: slice(1024, 10)}
	tests := []struct {
		name   string
		modify func(*fleet.PlaceRequest)
	}{
		{"empty slice id", func(r *fleet.PlaceRequest) { r.SliceID = "" }},
		{"empty user", func(r *fleet.PlaceRequest) { r.User = "" }},
		{"zero memory", func(r *fleet.PlaceRequest) { r.Slice.MemoryMiB = 0 }},
		{"compute over 100", func(r *fleet.PlaceRequest) { r.Slice.ComputePercent = 101 }},
		{"limit below guarantee", func(r *fleet.PlaceRequest) { r.Slice.ComputeLimitPercent = 5 }},
		{"unknown policy", func(r *fleet.PlaceRequest) { r.Policy = "random" }},
		{"negative quota", func(r *fleet.PlaceRequest) { r.UserQuota.Servers = -1 }},
		{"empty group name", func(r *fleet.PlaceRequest) { r.GroupQuotas = map[string]fleet.Quota{"": {}} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := ok
			tc.modify(&req)
			if _, err := s.Place(t.Context(), req); !errors.Is(err, fleet.ErrInvalid) {
				t.Errorf("Place err = %v, want ErrInvalid", err)
			}
		})
	}
	if all, err := s.Allocations(t.Context()); err != nil || len(all) != 0 {
		t.Errorf("Allocations = %v, %v; want none", all, err)
	}
}

func TestPlaceCapacityError(t *testing.T) {
	srv := redistest.Start(t)
	tests := []struct {
		name    string
		gpus    []fleet.GPU
		used    map[string]fleet.Slice // per GPU, placed first
		req     fleet.PlaceRequest
		want    *fleet.CapacityError
		wantMsg string
	}{
		{
			name: "memory: names the largest free block and its node",
			gpus: []fleet.GPU{
				{UUID: "GPU-1", Node: "gpu-1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true},
				{UUID: "GPU-3", Node: "gpu-3", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true},
				{UUID: "GPU-9", Node: "gpu-9", Model: "L4", MemoryMiB: 65536, SMCount: 58, Healthy: false},
			},
			used: map[string]fleet.Slice{"GPU-1": slice(12288, 10), "GPU-3": slice(10240, 10)},
			req:  fleet.PlaceRequest{Slice: slice(8192, 10)},
			want: &fleet.CapacityError{Want: slice(8192, 10), Candidates: 2,
				LargestFreeMiB: 6144, LargestFreeComputePercent: 90, LargestNode: "gpu-3"},
			wantMsg: "no GPU has 8 GiB free; the largest free block is 6 GiB on node gpu-3",
		},
		{
			name: "compute: memory fits but compute is taken",
			gpus: []fleet.GPU{{UUID: "GPU-1", Node: "gpu-1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true}},
			used: map[string]fleet.Slice{"GPU-1": slice(1024, 80)},
			req:  fleet.PlaceRequest{Slice: slice(8192, 30)},
			want: &fleet.CapacityError{Want: slice(8192, 30), Candidates: 1,
				LargestFreeMiB: 15360, LargestFreeComputePercent: 20, LargestNode: "gpu-1"},
			wantMsg: "no GPU has both 8 GiB and 30% compute free; the GPU with the most free memory (15 GiB on node gpu-1) has 20% compute free",
		},
		{
			name: "compute: a GPU with all compute taken still counts as a candidate",
			gpus: []fleet.GPU{{UUID: "GPU-1", Node: "gpu-1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true}},
			used: map[string]fleet.Slice{"GPU-1": slice(1024, 100)},
			req:  fleet.PlaceRequest{Slice: slice(1024, 1)},
			want: &fleet.CapacityError{Want: slice(1024, 1), Candidates: 1,
				LargestFreeMiB: 15360, LargestFreeComputePercent: 0, LargestNode: "gpu-1"},
		},
		{
			name:    "model: none registered",
			gpus:    []fleet.GPU{{UUID: "GPU-1", Node: "gpu-1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true}},
			req:     fleet.PlaceRequest{Slice: slice(1024, 10), Model: "NVIDIA H200"},
			want:    &fleet.CapacityError{Want: slice(1024, 10), Model: "NVIDIA H200"},
			wantMsg: `no healthy GPU of model "NVIDIA H200" is registered`,
		},
		{
			name:    "no healthy GPU at all",
			gpus:    []fleet.GPU{{UUID: "GPU-1", Node: "gpu-1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: false}},
			req:     fleet.PlaceRequest{Slice: slice(1024, 10)},
			want:    &fleet.CapacityError{Want: slice(1024, 10)},
			wantMsg: "no healthy GPU is registered",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t, srv)
			register(t, s, tc.gpus...)
			for uuid, sl := range tc.used {
				if _, err := s.Restore(t.Context(), fleet.Allocation{SliceID: nextSlice(), User: "filler", Slice: sl, GPUUUID: uuid}); err != nil {
					t.Fatalf("Restore: %v", err)
				}
			}
			req := tc.req
			req.SliceID, req.User = nextSlice(), "alice"
			_, err := s.Place(t.Context(), req)
			var ce *fleet.CapacityError
			if !errors.As(err, &ce) || !errors.Is(err, fleet.ErrNoCapacity) {
				t.Fatalf("Place err = %v, want a *fleet.CapacityError", err)
			}
			// Every GPU here is in sliced mode.
			tc.want.Sharing, tc.want.ModeGPUs, tc.want.AllGPUs = fleet.SharingSliced, len(tc.gpus), len(tc.gpus)
			if diff := cmp.Diff(tc.want, ce); diff != "" {
				t.Errorf("CapacityError (-want +got):\n%s", diff)
			}
			if tc.wantMsg != "" && ce.Error() != tc.wantMsg {
				t.Errorf("message:\n got %q\nwant %q", ce.Error(), tc.wantMsg)
			}
			verify(t, s)
		})
	}
}

func TestPlaceQuotaErrors(t *testing.T) {
	srv := redistest.Start(t)
	// Each case first holds one 8192 MiB / 20 % slice for alice in group ml,
	// then asks for one more of 8192 MiB / 20 %.
	tests := []struct {
		name   string
		user   fleet.Quota
		groups map[string]fleet.Quota
		want   *fleet.QuotaError
	}{
		{"user servers", fleet.Quota{Servers: 1}, nil,
			&fleet.QuotaError{Scope: "user", Name: "alice", Resource: "servers", Limit: 1, Used: 1, Want: 1}},
		{"user memory", fleet.Quota{MemoryMiB: 16000}, nil,
			&fleet.QuotaError{Scope: "user", Name: "alice", Resource: "memoryMiB", Limit: 16000, Used: 8192, Want: 8192}},
		{"user compute", fleet.Quota{ComputePercent: 30}, nil,
			&fleet.QuotaError{Scope: "user", Name: "alice", Resource: "computePercent", Limit: 30, Used: 20, Want: 20}},
		{"group servers", fleet.Quota{}, map[string]fleet.Quota{"ml": {Servers: 1}},
			&fleet.QuotaError{Scope: "group", Name: "ml", Resource: "servers", Limit: 1, Used: 1, Want: 1}},
		{"group memory", fleet.Quota{}, map[string]fleet.Quota{"ml": {MemoryMiB: 10000}},
			&fleet.QuotaError{Scope: "group", Name: "ml", Resource: "memoryMiB", Limit: 10000, Used: 8192, Want: 8192}},
		{"group compute", fleet.Quota{}, map[string]fleet.Quota{"ml": {ComputePercent: 39}},
			&fleet.QuotaError{Scope: "group", Name: "ml", Resource: "computePercent", Limit: 39, Used: 20, Want: 20}},
		{"user is checked before groups", fleet.Quota{Servers: 1}, map[string]fleet.Quota{"ml": {Servers: 1}},
			&fleet.QuotaError{Scope: "user", Name: "alice", Resource: "servers", Limit: 1, Used: 1, Want: 1}},
		{"a group the first slice did not charge starts empty", fleet.Quota{}, map[string]fleet.Quota{"ml": {}, "zz": {MemoryMiB: 8000}},
			&fleet.QuotaError{Scope: "group", Name: "zz", Resource: "memoryMiB", Limit: 8000, Used: 0, Want: 8192}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t, srv)
			register(t, s, h200("GPU-1", "n1"))
			mustPlace(t, s, fleet.PlaceRequest{SliceID: "first", User: "alice", Slice: slice(8192, 20),
				GroupQuotas: map[string]fleet.Quota{"ml": {}}})
			_, err := s.Place(t.Context(), fleet.PlaceRequest{SliceID: "second", User: "alice", Slice: slice(8192, 20),
				UserQuota: tc.user, GroupQuotas: tc.groups})
			var qe *fleet.QuotaError
			if !errors.As(err, &qe) || !errors.Is(err, fleet.ErrQuotaExceeded) {
				t.Fatalf("Place err = %v, want a *fleet.QuotaError", err)
			}
			if diff := cmp.Diff(tc.want, qe); diff != "" {
				t.Errorf("QuotaError (-want +got):\n%s", diff)
			}
			// Nothing was charged for the refused slice.
			if _, err := s.Allocation(t.Context(), "second"); !errors.Is(err, fleet.ErrNotFound) {
				t.Errorf("refused slice stored: err = %v", err)
			}
			verify(t, s)
		})
	}

	t.Run("exactly at the limit is allowed", func(t *testing.T) {
		s, _ := newStore(t, srv)
		register(t, s, h200("GPU-1", "n1"))
		q := fleet.Quota{Servers: 2, MemoryMiB: 16384, ComputePercent: 40}
		for _, id := range []string{"a", "b"} {
			mustPlace(t, s, fleet.PlaceRequest{SliceID: id, User: "bob", Slice: slice(8192, 20), UserQuota: q,
				GroupQuotas: map[string]fleet.Quota{"ml": q}})
		}
		verify(t, s)
	})
}

func TestAllocationIDsAreTheAllocationsSliceIDs(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-1", "n1"))
	ids := func() []string {
		t.Helper()
		got, err := s.AllocationIDs(t.Context())
		if err != nil {
			t.Fatalf("AllocationIDs: %v", err)
		}
		return got
	}
	if got := ids(); len(got) != 0 {
		t.Fatalf("AllocationIDs with nothing placed = %q, want none", got)
	}
	for _, id := range []string{"spawn-c", "spawn-a", "spawn-b"} {
		mustPlace(t, s, fleet.PlaceRequest{SliceID: id, User: "alice", Slice: slice(8192, 10)})
	}
	if _, err := s.Release(t.Context(), "spawn-b"); err != nil {
		t.Fatal(err)
	}
	all, err := s.Allocations(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, a := range all {
		want = append(want, a.SliceID)
	}
	if diff := cmp.Diff([]string{"spawn-a", "spawn-c"}, want); diff != "" {
		t.Fatalf("Allocations' slice ids (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, ids()); diff != "" {
		t.Errorf("AllocationIDs (-Allocations' slice ids +got):\n%s", diff)
	}
}

func TestReleaseIsIdempotentAndFreesEverything(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-1", "n1"))
	q := fleet.Quota{Servers: 1}
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "a", User: "alice", Slice: slice(143771, 100), UserQuota: q,
		GroupQuotas: map[string]fleet.Quota{"ml": q}})
	for i, want := range []bool{true, false} {
		freed, err := s.Release(t.Context(), "a")
		if err != nil || freed != want {
			t.Fatalf("Release #%d = %v, %v; want %v, nil", i+1, freed, err, want)
		}
	}
	verify(t, s)
	// The whole GPU and both quotas are free again.
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "b", User: "alice", Slice: slice(143771, 100), UserQuota: q,
		GroupQuotas: map[string]fleet.Quota{"ml": q}})
	verify(t, s)
}

func TestRestore(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, fleet.GPU{UUID: "GPU-1", Node: "n1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true})
	a := fleet.Allocation{SliceID: "a", User: "alice", Groups: []string{"ml"}, Slice: slice(12288, 50), GPUUUID: "GPU-1", Node: "n1", Sharing: fleet.SharingSliced}

	ok, err := s.Restore(t.Context(), a)
	if err != nil || !ok {
		t.Fatalf("Restore = %v, %v; want true, nil", ok, err)
	}
	ok, err = s.Restore(t.Context(), a)
	if err != nil || ok {
		t.Errorf("second Restore = %v, %v; want false, nil", ok, err)
	}
	other := a
	other.Slice.MemoryMiB = 1024
	if _, err := s.Restore(t.Context(), other); !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("Restore of a different allocation under the same id: err = %v, want ErrConflict", err)
	}
	got, err := s.Allocation(t.Context(), "a")
	if err != nil {
		t.Fatalf("Allocation: %v", err)
	}
	if diff := cmp.Diff(a, got); diff != "" {
		t.Errorf("restored allocation (-want +got):\n%s", diff)
	}

	// A pod that overcommits the GPU is recorded anyway; the error says so.
	over := fleet.Allocation{SliceID: "b", User: "bob", Slice: slice(8192, 60), GPUUUID: "GPU-1"}
	ok, err = s.Restore(t.Context(), over)
	if !ok || !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("overcommitting Restore = %v, %v; want true and ErrConflict", ok, err)
	}
	if got, err := s.Allocation(t.Context(), "b"); err != nil || got.Node != "n1" {
		t.Errorf("overcommitting allocation = %+v, %v; want stored with the GPU's node n1", got, err)
	}
	// Verify reports exactly the overcommit: counters are consistent.
	err = s.Verify(t.Context())
	if err == nil {
		t.Fatal("Verify after an overcommitting Restore found nothing")
	}
	for _, want := range []string{"gpu GPU-1 overcommitted: 20480 MiB allocated of 16384", "gpu GPU-1 overcommitted: 110% compute"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Verify = %v; want it to mention %q", err, want)
		}
	}
	// Placement sees no room on it.
	if _, err := s.Place(t.Context(), fleet.PlaceRequest{SliceID: "c", User: "carol", Slice: slice(1, 1)}); !errors.Is(err, fleet.ErrNoCapacity) {
		t.Errorf("Place on an overcommitted GPU: err = %v, want ErrNoCapacity", err)
	}
	// Releasing brings it back within bounds.
	if _, err := s.Release(t.Context(), "b"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	verify(t, s)

	unknown := fleet.Allocation{SliceID: "d", User: "dave", Slice: slice(1024, 10), GPUUUID: "GPU-unknown"}
	if _, err := s.Restore(t.Context(), unknown); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("Restore on an unregistered GPU: err = %v, want ErrNotFound", err)
	}
	if _, err := s.Restore(t.Context(), fleet.Allocation{SliceID: "e", User: "u", GPUUUID: "GPU-1"}); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("Restore with an empty slice: err = %v, want ErrInvalid", err)
	}
	verify(t, s)
}

func TestNotReadyUntilReconciledAfterFlush(t *testing.T) {
	srv := redistest.Start(t) // dedicated: this test flushes it
	rdb := srv.Client(t)
	s := New(rdb, "")
	gpu := fleet.GPU{UUID: "GPU-1", Node: "n1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true}
	register(t, s, gpu)
	req := fleet.PlaceRequest{SliceID: "a", User: "alice", Slice: slice(12288, 50)}

	_, err := s.Place(t.Context(), req)
	if !errors.Is(err, fleet.ErrNotReady) {
		t.Fatalf("Place before MarkReconciled: err = %v, want ErrNotReady", err)
	}
	if got, want := fleet.Message(err), "GPU allocations are being rebuilt from the cluster after Redis lost its data; try again in a moment"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	if err := s.MarkReconciled(t.Context()); err != nil {
		t.Fatal(err)
	}
	a := mustPlace(t, s, req)

	if err := rdb.FlushDB(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Reconciled(t.Context()); err != nil || ok {
		t.Fatalf("Reconciled after FLUSHDB = %v, %v; want false", ok, err)
	}
	register(t, s, gpu) // the agent re-registers
	if _, err := s.Place(t.Context(), fleet.PlaceRequest{SliceID: "b", User: "bob", Slice: slice(8192, 10)}); !errors.Is(err, fleet.ErrNotReady) {
		t.Fatalf("Place after FLUSHDB: err = %v, want ErrNotReady", err)
	}
	// The reconciler restores from the pod, then opens placement.
	if _, err := s.Restore(t.Context(), a); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if err := s.MarkReconciled(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, err = s.Place(t.Context(), fleet.PlaceRequest{SliceID: "b", User: "bob", Slice: slice(8192, 10)})
	if !errors.Is(err, fleet.ErrNoCapacity) {
		t.Errorf("Place that would overcommit the restored GPU: err = %v, want ErrNoCapacity", err)
	}
	verify(t, s)
}

func TestGPUInventory(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-b", "node-2"), h200("GPU-c", "node-1"), h200("GPU-a", "node-2"))
	gpus, err := s.GPUs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []fleet.GPU{h200("GPU-c", "node-1"), h200("GPU-a", "node-2"), h200("GPU-b", "node-2")}
	if diff := cmp.Diff(want, gpus); diff != "" {
		t.Errorf("GPUs sorted by node, uuid (-want +got):\n%s", diff)
	}

	if err := s.RegisterGPU(t.Context(), fleet.GPU{UUID: "x"}); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("RegisterGPU(invalid) err = %v, want ErrInvalid", err)
	}
	if err := s.SetGPUHealth(t.Context(), "GPU-unknown", false); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("SetGPUHealth(unknown) err = %v, want ErrNotFound", err)
	}

	t.Run("unhealthy GPUs are never picked and keep their slices", func(t *testing.T) {
		a := mustPlace(t, s, fleet.PlaceRequest{SliceID: "h1", User: "u", Slice: slice(1024, 10)})
		if a.GPUUUID != "GPU-a" {
			t.Fatalf("placed on %s, want GPU-a", a.GPUUUID)
		}
		if err := s.SetGPUHealth(t.Context(), "GPU-a", false); err != nil {
			t.Fatal(err)
		}
		b := mustPlace(t, s, fleet.PlaceRequest{SliceID: "h2", User: "u", Slice: slice(1024, 10)})
		if b.GPUUUID != "GPU-b" {
			t.Errorf("placed on %s, want GPU-b (GPU-a is unhealthy)", b.GPUUUID)
		}
		verify(t, s)
		if err := s.SetGPUHealth(t.Context(), "GPU-a", true); err != nil {
			t.Fatal(err)
		}
		c := mustPlace(t, s, fleet.PlaceRequest{SliceID: "h3", User: "u", Slice: slice(1024, 10)})
		if c.GPUUUID != "GPU-a" {
			t.Errorf("placed on %s, want GPU-a again once healthy", c.GPUUUID)
		}
		verify(t, s)
	})

	t.Run("re-registering keeps allocations; shrinking below them leaves no room", func(t *testing.T) {
		small := h200("GPU-c", "node-1")
		mustPlace(t, s, fleet.PlaceRequest{SliceID: "r1", User: "u", Slice: slice(100000, 10), Model: "NVIDIA H200", Policy: fleet.PolicySpread})
		small.MemoryMiB = 65536
		register(t, s, small)
		usage, err := s.GPUUsage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := usage[0]
		want := GPUUsage{GPU: small, AllocatedMiB: 100000, AllocatedComputePercent: 10, Slices: 1}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("GPU-c usage (-want +got):\n%s", diff)
		}
		if err := s.Verify(t.Context()); err == nil {
			t.Error("Verify of a GPU shrunk below its allocations found nothing")
		}
		if _, err := s.Release(t.Context(), "r1"); err != nil {
			t.Fatal(err)
		}
		verify(t, s)
	})

	t.Run("a model change moves the GPU between model indexes", func(t *testing.T) {
		g := h200("GPU-m", "node-9")
		register(t, s, g)
		g.Model = "NVIDIA H100"
		register(t, s, g)
		a := mustPlace(t, s, fleet.PlaceRequest{SliceID: "m1", User: "u", Slice: slice(1024, 10), Model: "NVIDIA H100"})
		if a.GPUUUID != "GPU-m" {
			t.Errorf("placed on %s, want GPU-m", a.GPUUUID)
		}
		verify(t, s)
	})
}

func TestVerifyDetectsCorruption(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-1", "n1"))
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "a", User: "alice", Slice: slice(1024, 10), GroupQuotas: map[string]fleet.Quota{"ml": {}}})
	verify(t, s)
	setUsage := func(field, val string) func() error {
		return func() error { return rdb.HSet(t.Context(), s.k.Usage(), field, val).Err() }
	}
	tests := []struct {
		name    string
		corrupt func() error
		undo    func() error
		want    string
	}{
		{"gpu counter", func() error { return rdb.HSet(t.Context(), s.k.GPU("GPU-1"), "use", usageValue(1, 1025, 10)).Err() },
			func() error { return rdb.HSet(t.Context(), s.k.GPU("GPU-1"), "use", usageValue(1, 1024, 10)).Err() }, "gpu GPU-1 counters"},
		{"malformed gpu counter", func() error { return rdb.HSet(t.Context(), s.k.GPU("GPU-1"), "use", "1 1024 10").Err() },
			func() error { return rdb.HSet(t.Context(), s.k.GPU("GPU-1"), "use", usageValue(1, 1024, 10)).Err() }, "gpu GPU-1: field use is 9 bytes"},
		{"index score", func() error { return rdb.ZAdd(t.Context(), s.k.AllAvail("sliced"), redisZ(1, "GPU-1")).Err() },
			func() error { return rdb.ZAdd(t.Context(), s.k.AllAvail("sliced"), redisZ(143771-1024, "GPU-1")).Err() }, "all-avail index score"},
		{"user counter", setUsage(userUsage("alice"), usageValue(1, 1024, 15)), setUsage(userUsage("alice"), usageValue(1, 1024, 10)), "user alice counters"},
		{"group counter", setUsage(groupUsage("ml"), usageValue(2, 1024, 10)), setUsage(groupUsage("ml"), usageValue(1, 1024, 10)), "group ml counters"},
		{"malformed counter", setUsage(userUsage("alice"), "1 1024"), setUsage(userUsage("alice"), usageValue(1, 1024, 10)), `usage field "u:alice" is "1 1024", want 16 bytes`},
		{"stale group counter", setUsage(groupUsage("gone"), usageValue(1, 0, 0)),
			func() error { return rdb.HDel(t.Context(), s.k.Usage(), groupUsage("gone")).Err() }, "group gone has counters"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.corrupt(); err != nil {
				t.Fatal(err)
			}
			err := s.Verify(t.Context())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Verify = %v, want a violation mentioning %q", err, tc.want)
			}
			if err := tc.undo(); err != nil {
				t.Fatal(err)
			}
			verify(t, s)
		})
	}
}

// TestMarkReconciledAtRefusesAfterAFlush is the reconcile epoch: a pass
// that read the epoch before Redis lost its data cannot open placement on
// the emptied data; a pass that reads the new epoch can.
func TestMarkReconciledAtRefusesAfterAFlush(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s := New(rdb, "")
	ctx := t.Context()
	before, marked, err := s.ReconcileEpoch(ctx)
	if err != nil || marked {
		t.Fatalf("ReconcileEpoch on empty data = %q, marked %v, %v; want not marked", before, marked, err)
	}
	if again, _, err := s.ReconcileEpoch(ctx); err != nil || again != before {
		t.Fatalf("second ReconcileEpoch = %q, %v; want the stored %q", again, err, before)
	}
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if marked, err := s.MarkReconciledAt(ctx, before); err != nil || marked {
		t.Fatalf("MarkReconciledAt with the epoch from before the flush = %v, %v; want false", marked, err)
	}
	if ok, err := s.Reconciled(ctx); err != nil || ok {
		t.Fatalf("Reconciled = %v, %v; want false after a refused mark", ok, err)
	}
	after, _, err := s.ReconcileEpoch(ctx)
	if err != nil || after == before || after == "" {
		t.Fatalf("ReconcileEpoch after the flush = %q, %v; want a new token", after, err)
	}
	if marked, err := s.MarkReconciledAt(ctx, after); err != nil || !marked {
		t.Fatalf("MarkReconciledAt with the current epoch = %v, %v; want true", marked, err)
	}
	if ok, err := s.Reconciled(ctx); err != nil || !ok {
		t.Fatalf("Reconciled = %v, %v; want true", ok, err)
	}
	if again, marked, err := s.ReconcileEpoch(ctx); err != nil || again != after || !marked {
		t.Fatalf("ReconcileEpoch after marking = %q, marked %v, %v; want %q, marked", again, marked, err, after)
	}
}
