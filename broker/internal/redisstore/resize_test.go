package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// runningServer creates server user/name with spawn id spawn, places its
// slice with req (SliceID and User are filled in) and drives it to running.
func runningServer(t *testing.T, s *Store, user, name, spawn string, req fleet.PlaceRequest) fleet.Allocation {
	t.Helper()
	ctx := t.Context()
	k := fleet.ServerKey{User: user, Name: name}
	rec := pendingServer(user, name, spawn, "idem-"+spawn)
	rec.Slice = req.Slice
	if _, _, err := s.CreateServer(ctx, rec); err != nil {
		t.Fatalf("CreateServer: %v", err)
	}
	req.SliceID, req.User = spawn, user
	a, err := s.Place(ctx, req)
	if err != nil {
		t.Fatalf("Place(%s): %v", spawn, err)
	}
	steps := []struct {
		to    fleet.State
		patch Patch
	}{{v1.StatePlacing, Patch{}}, {v1.StateCreating, Patch{Allocation: &a}}, {v1.StateStarting, Patch{}}, {v1.StateRunning, Patch{}}}
	for _, st := range steps {
		if _, err := s.Transition(ctx, k, spawn, st.to, "to "+string(st.to), st.patch); err != nil {
			t.Fatalf("Transition(%s): %v", st.to, err)
		}
	}
	return a
}

func TestResize(t *testing.T) {
	small := func(uuid string) fleet.GPU {
		return fleet.GPU{UUID: uuid, Node: "n1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true}
	}
	type want struct {
		errIs   error
		errText string // a substring of the error
		changed bool
		// GPU-0's usage and the user's memory after the call
		gpuMem, gpuCP, userMem int64
	}
	tests := []struct {
		name      string
		userQuota fleet.Quota
		groups    map[string]fleet.Quota
		resize    fleet.Slice
		other     fleet.Slice // another user's slice on the same GPU
		want      want
	}{
		{
			name:   "grow within the GPU",
			resize: fleet.Slice{MemoryMiB: 8192, ComputePercent: 40, ComputeLimitPercent: 100},
			other:  slice(4096, 30),
			want:   want{changed: true, gpuMem: 8192 + 4096, gpuCP: 70, userMem: 8192},
		},
		{
			name:   "shrink",
			resize: fleet.Slice{MemoryMiB: 1024, ComputePercent: 5, ComputeLimitPercent: 5},
			other:  slice(4096, 30),
			want:   want{changed: true, gpuMem: 1024 + 4096, gpuCP: 35, userMem: 1024},
		},
		{
			name:   "the same slice changes nothing",
			resize: slice(4096, 20),
			other:  slice(4096, 30),
			want:   want{gpuMem: 8192, gpuCP: 50, userMem: 4096},
		},
		{
			name:   "memory beyond the GPU is refused with the room there is",
			resize: slice(12289, 20),
			other:  slice(4096, 30),
			want: want{errIs: fleet.ErrNoCapacity, errText: "room for at most 12 GiB and 70% compute for this slice",
				gpuMem: 8192, gpuCP: 50, userMem: 4096},
		},
		{
			name:   "compute beyond 100 percent is refused",
			resize: slice(4096, 71),
			other:  slice(4096, 30),
			want:   want{errIs: fleet.ErrNoCapacity, gpuMem: 8192, gpuCP: 50, userMem: 4096},
		},
		{
			name:   "the whole GPU fits exactly",
			resize: slice(12288, 70),
			other:  slice(4096, 30),
			want:   want{changed: true, gpuMem: 16384, gpuCP: 100, userMem: 12288},
		},
		{
			name:      "the user's memory quota counts the growth only",
			userQuota: fleet.Quota{MemoryMiB: 6000},
			resize:    slice(6001, 20),
			other:     slice(4096, 30),
			want: want{errIs: fleet.ErrQuotaExceeded, errText: "user alice quota exceeded: you have 1904 MiB of 5.9 GiB of GPU memory left; this needs 1905 MiB",
				gpuMem: 8192, gpuCP: 50, userMem: 4096},
		},
		{
			name:      "a shrink passes a quota the user is already over",
			userQuota: fleet.Quota{MemoryMiB: 6000},
			resize:    slice(6000, 10),
			other:     slice(4096, 30),
			want:      want{changed: true, gpuMem: 6000 + 4096, gpuCP: 40, userMem: 6000},
		},
		{
			name:   "a group's compute quota counts the growth",
			groups: map[string]fleet.Quota{"ml": {ComputePercent: 30}},
			resize: slice(4096, 31),
			other:  slice(4096, 30),
			want: want{errIs: fleet.ErrQuotaExceeded, errText: "group ml quota exceeded: the group has 10% of 30% compute left; this needs 11%",
				gpuMem: 8192, gpuCP: 50, userMem: 4096},
		},
		{
			name:   "a group's quota allows growth up to its cap",
			groups: map[string]fleet.Quota{"ml": {ComputePercent: 30}},
			resize: slice(4096, 30),
			other:  slice(4096, 30),
			want:   want{changed: true, gpuMem: 8192, gpuCP: 60, userMem: 4096},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			s, clk := newStore(t, srv)
			register(t, s, small("GPU-0"))
			groups := tc.groups
			if groups == nil {
				groups = map[string]fleet.Quota{}
			}
			// Place with no caps; the caps under test apply to the resize.
			noCaps := map[string]fleet.Quota{}
			for g := range groups {
				noCaps[g] = fleet.Quota{}
			}
			a := runningServer(t, s, "alice", "nb", "spawn-a", fleet.PlaceRequest{Slice: slice(4096, 20), GroupQuotas: noCaps})
			runningServer(t, s, "bob", "nb", "spawn-b", fleet.PlaceRequest{Slice: tc.other})
			k := fleet.ServerKey{User: "alice", Name: "nb"}
			_, before := events(t, s, k, "")

			rec, changed, err := s.Resize(t.Context(), k, fleet.PlaceRequest{SliceID: "spawn-a", Slice: tc.resize,
				UserQuota: tc.userQuota, GroupQuotas: groups}, "resized")
			if tc.want.errIs != nil {
				if !errors.Is(err, tc.want.errIs) || !strings.Contains(err.Error(), tc.want.errText) {
					t.Fatalf("Resize err = %v, want %v containing %q", err, tc.want.errIs, tc.want.errText)
				}
			} else if err != nil {
				t.Fatalf("Resize: %v", err)
			}
			if changed != tc.want.changed {
				t.Errorf("changed = %v, want %v", changed, tc.want.changed)
			}
			verify(t, s)
			gpus, err := s.GPUUsage(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			type usageView struct{ GPUMem, GPUCP, UserMem int64 }
			got := usageView{GPUMem: gpus[0].AllocatedMiB, GPUCP: int64(gpus[0].AllocatedComputePercent)}
			all, err := s.Allocations(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range all {
				if x.User == "alice" {
					got.UserMem += x.Slice.MemoryMiB
				}
			}
			if diff := cmp.Diff(usageView{tc.want.gpuMem, tc.want.gpuCP, tc.want.userMem}, got); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}

			stored, err := s.GetServer(t.Context(), k)
			if err != nil {
				t.Fatal(err)
			}
			evs, _ := events(t, s, k, before[len(before)-1].ID)
			if changed {
				wantAlloc := a
				wantAlloc.Slice = tc.resize
				if diff := cmp.Diff(&wantAlloc, stored.Allocation); diff != "" {
					t.Errorf("record allocation (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tc.resize, rec.Slice); diff != "" {
					t.Errorf("returned slice (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]eventView{{"spawn-a", v1.StateRunning, "resized"}}, evs); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
				if !stored.UpdatedAt.Equal(clk.Now()) {
					t.Errorf("updated = %v, want %v", stored.UpdatedAt, clk.Now())
				}
			} else {
				if diff := cmp.Diff(slice(4096, 20), stored.Slice); diff != "" {
					t.Errorf("record slice changed (-want +got):\n%s", diff)
				}
				if len(evs) != 0 {
					t.Errorf("events appended: %v", evs)
				}
			}
		})
	}
}

func TestResizeRefusesWhatIsNotARunningSlice(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-0", "n1"))
	runningServer(t, s, "alice", "nb", "spawn-a", fleet.PlaceRequest{Slice: slice(4096, 20)})
	if _, _, err := s.CreateServer(t.Context(), pendingServer("carol", "nb", "spawn-c", "idem-c")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		key   fleet.ServerKey
		spawn string
		slice fleet.Slice
		errIs error
		text  string
	}{
		{"unknown server", fleet.ServerKey{User: "alice", Name: "other"}, "spawn-a", slice(1024, 10), fleet.ErrNotFound, "no server"},
		{"an old spawn", fleet.ServerKey{User: "alice", Name: "nb"}, "spawn-old", slice(1024, 10), fleet.ErrConflict, "no longer current"},
		{"a server that is not placed", fleet.ServerKey{User: "carol", Name: "nb"}, "spawn-c", slice(1024, 10), fleet.ErrConflict, "holds no GPU slice"},
		{"an invalid slice", fleet.ServerKey{User: "alice", Name: "nb"}, "spawn-a", fleet.Slice{MemoryMiB: 1024, ComputePercent: 50, ComputeLimitPercent: 40}, fleet.ErrInvalid, "computeLimitPercent"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := s.Resize(t.Context(), tc.key, fleet.PlaceRequest{SliceID: tc.spawn, Slice: tc.slice}, "resized")
			if !errors.Is(err, tc.errIs) || !strings.Contains(err.Error(), tc.text) {
				t.Errorf("err = %v, want %v containing %q", err, tc.errIs, tc.text)
			}
		})
	}
	t.Run("a server that is stopping", func(t *testing.T) {
		k := fleet.ServerKey{User: "alice", Name: "nb"}
		if _, err := s.Transition(t.Context(), k, "spawn-a", v1.StateStopping, "stopping", Patch{}); err != nil {
			t.Fatal(err)
		}
		_, _, err := s.Resize(t.Context(), k, fleet.PlaceRequest{SliceID: "spawn-a", Slice: slice(1024, 10)}, "resized")
		if !errors.Is(err, fleet.ErrConflict) || !strings.Contains(err.Error(), "is stopping; only a running server can be resized") {
			t.Errorf("err = %v, want a conflict naming the state", err)
		}
	})
	verify(t, s)
}

func TestResizeOnUnhealthyGPUShrinksOnly(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-0", "n1"))
	runningServer(t, s, "alice", "nb", "spawn-a", fleet.PlaceRequest{Slice: slice(4096, 20)})
	if err := s.SetGPUHealth(t.Context(), "GPU-0", false); err != nil {
		t.Fatal(err)
	}
	k := fleet.ServerKey{User: "alice", Name: "nb"}
	if _, _, err := s.Resize(t.Context(), k, fleet.PlaceRequest{SliceID: "spawn-a", Slice: slice(8192, 20)}, "grow"); !errors.Is(err, fleet.ErrNoCapacity) || !strings.Contains(err.Error(), "unhealthy") {
		t.Errorf("grow err = %v, want ErrNoCapacity saying unhealthy", err)
	}
	if _, changed, err := s.Resize(t.Context(), k, fleet.PlaceRequest{SliceID: "spawn-a", Slice: slice(2048, 10)}, "shrink"); err != nil || !changed {
		t.Errorf("shrink = %v, %v; want changed", changed, err)
	}
	verify(t, s)
}

// TestConcurrentResizeAndPlaceNeverOvercommit races resizes of running
// servers against placements and releases of other slices, through two
// stores on separate clients, on 2 small GPUs, while a checker verifies the
// invariants and the quotas on atomic snapshots.
func TestConcurrentResizeAndPlaceNeverOvercommit(t *testing.T) {
	replicas := twoReplicas(t)
	s := replicas[0]
	for i := range 2 {
		register(t, s, fleet.GPU{UUID: fmt.Sprintf("GPU-%d", i), Node: "n1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true})
	}
	userQuota := fleet.Quota{Servers: 10, MemoryMiB: 20000}
	groupQuota := fleet.Quota{ComputePercent: 150}
	quotas := map[string]fleet.Quota{"g": groupQuota, "all": {}}
	const resizers = 4
	for i := range resizers {
		runningServer(t, s, fmt.Sprintf("r%d", i), "nb", fmt.Sprintf("rs%d", i),
			fleet.PlaceRequest{Slice: slice(2048, 10), UserQuota: userQuota, GroupQuotas: quotas})
	}

	ctx, stop := context.WithCancel(t.Context())
	checkerDone := make(chan error, 1)
	var checks atomic.Int64
	go func() { checkerDone <- checkContinuously(ctx, s, userQuota, groupQuota, &checks) }()

	var resized, refused, placed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range resizers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			st := replicas[i%2]
			k := fleet.ServerKey{User: fmt.Sprintf("r%d", i), Name: "nb"}
			for range 60 {
				cp := 1 + rng.IntN(60)
				want := fleet.Slice{MemoryMiB: 512 * int64(1+rng.IntN(24)), ComputePercent: cp, ComputeLimitPercent: cp + rng.IntN(101-cp)}
				_, changed, err := st.Resize(t.Context(), k, fleet.PlaceRequest{SliceID: fmt.Sprintf("rs%d", i), Slice: want,
					UserQuota: userQuota, GroupQuotas: quotas}, "resized")
				switch {
				case err == nil:
					if changed {
						resized.Add(1)
					}
				case errors.Is(err, fleet.ErrNoCapacity), errors.Is(err, fleet.ErrQuotaExceeded):
					refused.Add(1)
				default:
					errs <- fmt.Errorf("resize %s: %w", k.User, err)
					return
				}
			}
		}()
	}
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(100+i), 2))
			st := replicas[i%2]
			var held []string
			for j := range 60 {
				if len(held) > 0 && rng.IntN(2) == 0 {
					if _, err := st.Release(t.Context(), held[0]); err != nil {
						errs <- err
						return
					}
					held = held[1:]
					continue
				}
				id := fmt.Sprintf("p%d-%d", i, j)
				_, err := st.Place(t.Context(), fleet.PlaceRequest{SliceID: id, User: fmt.Sprintf("p%d", i),
					Slice: slice(512*int64(1+rng.IntN(8)), 1+rng.IntN(30)), UserQuota: userQuota, GroupQuotas: quotas})
				switch {
				case err == nil:
					placed.Add(1)
					held = append(held, id)
				case errors.Is(err, fleet.ErrNoCapacity), errors.Is(err, fleet.ErrQuotaExceeded):
				default:
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	stop()
	if err := <-checkerDone; err != nil {
		t.Fatalf("invariant violated during the race:\n%v", err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	verify(t, s)
	if resized.Load() == 0 || refused.Load() == 0 || placed.Load() == 0 {
		t.Errorf("the race did not exercise both outcomes: %d resized, %d refused, %d placed", resized.Load(), refused.Load(), placed.Load())
	}
	t.Logf("%d resized, %d refused, %d placed", resized.Load(), refused.Load(), placed.Load())
}

// TestResizeGrowthWaitsForTheRebuild replays what the chaos soak saw after
// Redis lost its data: the reconciler restored one pod's server and slice,
// the user grew that slice, and only then was the other pod on the GPU
// restored, which overcommitted the GPU. While the allocations are being
// rebuilt (no reconcile marker) a growth is refused; a shrink is not.
func TestResizeGrowthWaitsForTheRebuild(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	ctx := t.Context()
	gpu := fleet.GPU{UUID: "GPU-0", Node: "n1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true}
	register(t, s, gpu)
	a := runningServer(t, s, "alice", "nb", "spawn-a", fleet.PlaceRequest{Slice: slice(4096, 50)})
	b := runningServer(t, s, "bob", "nb", "spawn-b", fleet.PlaceRequest{Slice: slice(4096, 50)})
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	register(t, s, gpu) // the node agent's next heartbeat
	k := fleet.ServerKey{User: "alice", Name: "nb"}
	a.Node = ""
	if _, err := s.RestoreServer(ctx, fleet.Server{ServerKey: k, Profile: "small", SpawnID: "spawn-a", State: v1.StateRunning,
		Slice: a.Slice, Allocation: &a}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Restore(ctx, a); err != nil {
		t.Fatal(err)
	}

	_, _, err := s.Resize(ctx, k, fleet.PlaceRequest{SliceID: "spawn-a", Slice: slice(4096, 60)}, "grow")
	if !errors.Is(err, fleet.ErrNotReady) {
		t.Errorf("growth during the rebuild: err = %v, want ErrNotReady", err)
	}
	if _, changed, err := s.Resize(ctx, k, fleet.PlaceRequest{SliceID: "spawn-a", Slice: slice(4096, 40)}, "shrink"); err != nil || !changed {
		t.Errorf("shrink during the rebuild = %v, %v; want changed", changed, err)
	}
	b.Node = ""
	if _, err := s.Restore(ctx, b); err != nil {
		t.Errorf("restore bob's pod after alice's resize: %v (the GPU must not be overcommitted)", err)
	}
	verify(t, s)
}

// An undo puts back the slice the pod still records even when the shrink
// it undoes freed room another slice took since (and past the user's
// quota): the counters then charge what the node agent enforces. An undo
// that finds the slice moved on by a later resize writes nothing.
func TestUndoResizeRestoresTheRecordedSliceWhateverItTakes(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	ctx := t.Context()
	register(t, s, fleet.GPU{UUID: "GPU-0", Node: "n1", Model: "L4", MemoryMiB: 16384, SMCount: 58, Healthy: true})
	quota := fleet.Quota{MemoryMiB: 3000}
	runningServer(t, s, "alice", "nb", "spawn-a", fleet.PlaceRequest{Slice: slice(4096, 50)})
	k := fleet.ServerKey{User: "alice", Name: "nb"}
	shrunk := slice(2048, 20)
	if _, changed, err := s.Resize(ctx, k, fleet.PlaceRequest{SliceID: "spawn-a", Slice: shrunk, UserQuota: quota}, "shrink"); err != nil || !changed {
		t.Fatalf("shrink = %v, %v", changed, err)
	}
	runningServer(t, s, "bob", "nb", "spawn-b", fleet.PlaceRequest{Slice: slice(14336, 80)})
	back := fleet.PlaceRequest{SliceID: "spawn-a", Slice: slice(4096, 50), UserQuota: quota}
	if _, _, err := s.Resize(ctx, k, back, "grow"); !errors.Is(err, fleet.ErrNoCapacity) {
		t.Fatalf("growing back with Resize: err = %v, want ErrNoCapacity (the room is taken)", err)
	}

	if _, changed, err := s.UndoResize(ctx, k, back, slice(3072, 20), "undo"); err != nil || changed {
		t.Errorf("undo from a slice the server does not hold = %v, %v; want nothing written", changed, err)
	}
	rec, changed, err := s.UndoResize(ctx, k, back, shrunk, "undo")
	if err != nil || !changed {
		t.Fatalf("undo = %v, %v; want changed", changed, err)
	}
	if rec.Slice != back.Slice || rec.Allocation.Slice != back.Slice {
		t.Errorf("undone record slice %+v, allocation %+v; want %+v", rec.Slice, rec.Allocation.Slice, back.Slice)
	}
	gpus, err := s.GPUUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if gpus[0].AllocatedMiB != 4096+14336 || gpus[0].AllocatedComputePercent != 130 {
		t.Errorf("GPU charges %d MiB, %d%%; want %d MiB, 130%% (what the pods hold)", gpus[0].AllocatedMiB, gpus[0].AllocatedComputePercent, 4096+14336)
	}
	used, _, err := s.QuotaUsed(ctx, "alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	if used.MemoryMiB != 4096 || used.ComputePercent != 50 {
		t.Errorf("alice is charged %d MiB, %d%%; want 4096 MiB, 50%%", used.MemoryMiB, used.ComputePercent)
	}
}
