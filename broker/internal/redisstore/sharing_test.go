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

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// migGPU returns an H200 in MIG mode and its instances: per profile, how
// many instances (sizes as go-nvml's H200 mock has them: 1g.18gb 18432
// MiB and 16 SMs, 3g.71gb 72704 MiB and 48 SMs).
func migGPU(uuid, node string, profiles map[string]int) []fleet.GPU {
	gpu := h200(uuid, node)
	gpu.Mode = fleet.SharingMIG
	out := []fleet.GPU{gpu}
	sizes := map[string]struct {
		mib int64
		sms int
	}{"1g.18gb": {18432, 16}, "3g.71gb": {72704, 48}}
	for _, p := range []string{"1g.18gb", "3g.71gb"} {
		for i := range profiles[p] {
			out = append(out, fleet.GPU{UUID: fmt.Sprintf("MIG-%s-%s-%d", uuid[4:], p[:2], i), Node: node, Model: gpu.Model,
				MemoryMiB: sizes[p].mib, SMCount: sizes[p].sms, Healthy: true, Mode: fleet.SharingMIG,
				MIGProfile: p, Parent: uuid, ComputePercent: (100*sizes[p].sms + 66) / 132})
		}
	}
	return out
}

// withMode returns g asking for mode.
func withMode(g fleet.GPU, m fleet.SharingMode) fleet.GPU {
	g.Mode = m
	return g
}

// mixedFleet registers 7 GPUs: 2 in MIG mode (each with two 3g.71gb and one
// 1g.18gb instance), 2 sliced, 1 exclusive, 2 mps.
func mixedFleet(t *testing.T, s *Store) {
	t.Helper()
	register(t, s, migGPU("GPU-m1", "n1", map[string]int{"3g.71gb": 2, "1g.18gb": 1})...)
	register(t, s, migGPU("GPU-m2", "n1", map[string]int{"3g.71gb": 2, "1g.18gb": 1})...)
	register(t, s, h200("GPU-s1", "n2"), h200("GPU-s2", "n2"),
		withMode(h200("GPU-x1", "n3"), fleet.SharingExclusive),
		withMode(h200("GPU-p1", "n4"), fleet.SharingMPS), withMode(h200("GPU-p2", "n4"), fleet.SharingMPS))
}

func TestPlaceByMode(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	mixedFleet(t, s)
	verify(t, s)

	t.Run("sliced lands only on sliced GPUs", func(t *testing.T) {
		for i := range 4 {
			a := mustPlace(t, s, fleet.PlaceRequest{SliceID: fmt.Sprintf("sl-%d", i), User: "alice", Slice: slice(8192, 10)})
			if !strings.HasPrefix(a.GPUUUID, "GPU-s") || a.Sharing != fleet.SharingSliced {
				t.Errorf("sliced slice on %s (%s), want a sliced GPU", a.GPUUUID, a.Sharing)
			}
		}
	})
	t.Run("exclusive holds a whole GPU, once", func(t *testing.T) {
		a := mustPlace(t, s, fleet.PlaceRequest{SliceID: "x-1", User: "bob", Sharing: fleet.SharingExclusive})
		want := fleet.Allocation{SliceID: "x-1", User: "bob", Slice: fleet.Slice{MemoryMiB: 143771, ComputePercent: 100, ComputeLimitPercent: 100},
			GPUUUID: "GPU-x1", Node: "n3", Model: "NVIDIA H200", Sharing: fleet.SharingExclusive}
		if diff := cmp.Diff(want, a); diff != "" {
			t.Errorf("exclusive allocation (-want +got):\n%s", diff)
		}
		_, err := s.Place(t.Context(), fleet.PlaceRequest{SliceID: "x-2", User: "bob", Sharing: fleet.SharingExclusive})
		wantMsg := "no whole GPU is free: all 1 healthy GPUs in exclusive mode hold a server; 1 of 7 GPUs are in exclusive mode"
		if !errors.Is(err, fleet.ErrNoCapacity) || fleet.Message(err) != wantMsg {
			t.Errorf("second exclusive: %v\nwant %q", err, wantMsg)
		}
	})
	t.Run("mig takes a free instance of the asked profile and gets its uuid", func(t *testing.T) {
		var got []string
		for i := range 4 {
			a := mustPlace(t, s, fleet.PlaceRequest{SliceID: fmt.Sprintf("mig-%d", i), User: "carol", Sharing: fleet.SharingMIG, MIGProfile: "3g.71gb"})
			got = append(got, a.GPUUUID)
			if a.MIGProfile != "3g.71gb" || !strings.HasPrefix(a.GPUUUID, "MIG-") || a.Slice.MemoryMiB != 72704 || a.Slice.ComputePercent != 36 || a.Sharing != fleet.SharingMIG {
				t.Errorf("mig allocation %+v, want a 3g.71gb instance of 72704 MiB charged 36%% compute", a)
			}
			if !strings.HasPrefix(a.Parent, "GPU-m") {
				t.Errorf("mig allocation's parent %q, want a MIG-mode GPU", a.Parent)
			}
		}
		if n := len(unique(got)); n != 4 {
			t.Errorf("4 MIG servers on %d distinct instances (%v), want 4", n, got)
		}
		_, err := s.Place(t.Context(), fleet.PlaceRequest{SliceID: "mig-5", User: "carol", Sharing: fleet.SharingMIG, MIGProfile: "3g.71gb"})
		if want := "no MIG instance of profile 3g.71gb is free; 2 of 7 GPUs are in MIG mode"; fleet.Message(err) != want {
			t.Errorf("fifth 3g.71gb: %q, want %q", fleet.Message(err), want)
		}
		_, err = s.Place(t.Context(), fleet.PlaceRequest{SliceID: "mig-7", User: "carol", Sharing: fleet.SharingMIG, MIGProfile: "7g.141gb"})
		if want := "no healthy GPU has a MIG instance of profile 7g.141gb; 2 of 7 GPUs are in MIG mode"; fleet.Message(err) != want {
			t.Errorf("7g.141gb: %q, want %q", fleet.Message(err), want)
		}
	})
	t.Run("mps clients of one GPU all have one size", func(t *testing.T) {
		a := mustPlace(t, s, fleet.PlaceRequest{SliceID: "mps-a", User: "dave", Sharing: fleet.SharingMPS, Slice: slice(16384, 30)})
		b := mustPlace(t, s, fleet.PlaceRequest{SliceID: "mps-b", User: "dave", Sharing: fleet.SharingMPS, Slice: slice(8192, 20)})
		c := mustPlace(t, s, fleet.PlaceRequest{SliceID: "mps-c", User: "erin", Sharing: fleet.SharingMPS, Slice: slice(16384, 30)})
		if a.GPUUUID == b.GPUUUID || c.GPUUUID != a.GPUUUID {
			t.Errorf("mps 30%% on %s, 20%% on %s, another 30%% on %s: want the two 30%% clients together and the 20%% one apart", a.GPUUUID, b.GPUUUID, c.GPUUUID)
		}
		_, err := s.Place(t.Context(), fleet.PlaceRequest{SliceID: "mps-d", User: "erin", Sharing: fleet.SharingMPS, Slice: slice(4096, 10)})
		if !errors.Is(err, fleet.ErrNoCapacity) || !strings.Contains(fleet.Message(err), "2 of 7 GPUs are in MPS mode") {
			t.Errorf("a third size: %v, want a capacity refusal naming the MPS GPUs", err)
		}
		for _, id := range []string{"mps-a", "mps-c"} {
			if _, err := s.Release(t.Context(), id); err != nil {
				t.Fatal(err)
			}
		}
		// Empty again, the GPU takes clients of another size.
		mustPlace(t, s, fleet.PlaceRequest{SliceID: "mps-d", User: "erin", Sharing: fleet.SharingMPS, Slice: slice(4096, 10)})
	})
	t.Run("a sliced request says how many GPUs are in sliced mode", func(t *testing.T) {
		_, err := s.Place(t.Context(), fleet.PlaceRequest{SliceID: "sl-big", User: "alice", Slice: slice(150000, 10)})
		if want := "(2 of 7 GPUs are in sliced mode)"; !strings.HasSuffix(fleet.Message(err), want) {
			t.Errorf("too big: %q, want it to end %q", fleet.Message(err), want)
		}
	})
	verify(t, s)
}

func unique(xs []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// TestGPUModes: a node label's mode applies to an empty GPU at once and
// waits on a busy one; an admin's mode wins over the label and is refused
// while the GPU holds a server; MIG is the GPU's own.
func TestGPUModes(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	ctx := t.Context()
	register(t, s, h200("GPU-1", "n1"))
	mode := func(uuid string) (fleet.SharingMode, fleet.SharingMode) {
		t.Helper()
		us, err := s.GPUUsage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range us {
			if u.GPU.UUID == uuid {
				return u.GPU.Mode, u.GPU.PendingMode
			}
		}
		t.Fatalf("gpu %s not registered", uuid)
		return "", ""
	}
	if m, p := mode("GPU-1"); m != fleet.SharingSliced || p != "" {
		t.Fatalf("new GPU in %q (pending %q), want sliced", m, p)
	}
	register(t, s, withMode(h200("GPU-1", "n1"), fleet.SharingMPS))
	if m, _ := mode("GPU-1"); m != fleet.SharingMPS {
		t.Fatalf("empty GPU labelled mps is in %q", m)
	}
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "p", User: "u", Sharing: fleet.SharingMPS, Slice: slice(1024, 10)})

	// The label changes while a client runs: pending until it is gone.
	register(t, s, withMode(h200("GPU-1", "n1"), fleet.SharingSliced))
	if m, p := mode("GPU-1"); m != fleet.SharingMPS || p != fleet.SharingSliced {
		t.Errorf("busy GPU relabelled sliced: mode %q pending %q, want mps pending sliced", m, p)
	}
	_, err := s.SetGPUMode(ctx, "GPU-1", fleet.SharingExclusive)
	want := "gpu GPU-1 holds 1 server(s) in mps mode; its sharing mode changes only when it holds none (stop them, or wait until they stop)"
	if !errors.Is(err, fleet.ErrConflict) || fleet.Message(err) != want {
		t.Errorf("SetGPUMode on a busy GPU: %v\nwant %q", err, want)
	}
	if _, err := s.Release(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	register(t, s, withMode(h200("GPU-1", "n1"), fleet.SharingSliced))
	if m, p := mode("GPU-1"); m != fleet.SharingSliced || p != "" {
		t.Errorf("emptied GPU: mode %q pending %q, want sliced", m, p)
	}

	// The admin's mode wins over the label until cleared.
	g, err := s.SetGPUMode(ctx, "GPU-1", fleet.SharingExclusive)
	if err != nil || g.Mode != fleet.SharingExclusive {
		t.Fatalf("SetGPUMode exclusive = %+v, %v", g, err)
	}
	register(t, s, withMode(h200("GPU-1", "n1"), fleet.SharingMPS))
	if m, _ := mode("GPU-1"); m != fleet.SharingExclusive {
		t.Errorf("label mps after admin exclusive: %q, want exclusive", m)
	}
	if g, err := s.SetGPUMode(ctx, "GPU-1", ""); err != nil || g.Mode != fleet.SharingMPS {
		t.Errorf("SetGPUMode \"\" (follow the label) = %+v, %v; want mps", g, err)
	}

	// MIG is the hardware's.
	register(t, s, migGPU("GPU-2", "n1", map[string]int{"1g.18gb": 1})...)
	for _, tc := range []struct {
		uuid string
		mode fleet.SharingMode
		want error
	}{
		{"GPU-2", fleet.SharingSliced, fleet.ErrConflict},
		{"MIG-2-1g-0", fleet.SharingSliced, fleet.ErrConflict},
		{"GPU-1", fleet.SharingMIG, fleet.ErrInvalid},
		{"GPU-1", "timeshare", fleet.ErrInvalid},
		{"GPU-404", fleet.SharingSliced, fleet.ErrNotFound},
	} {
		if _, err := s.SetGPUMode(ctx, tc.uuid, tc.mode); !errors.Is(err, tc.want) {
			t.Errorf("SetGPUMode(%s, %q) = %v, want %v", tc.uuid, tc.mode, err, tc.want)
		}
	}
	verify(t, s)
}

// TestRacingCreatesOfEveryModeNeverOvercommitOrMix races placers of every
// mode and releasers through two stores (two broker replicas) on the mixed
// fleet, while a checker verifies every invariant, modes included, on
// atomic snapshots, and the admin flips an MPS GPU's mode whenever it is
// empty. Every refusal is a readable capacity or quota sentence.
func TestRacingCreatesOfEveryModeNeverOvercommitOrMix(t *testing.T) {
	replicas := twoReplicas(t)
	s := replicas[0]
	mixedFleet(t, s)
	userQuota := fleet.Quota{Servers: 4, MemoryMiB: 400000}
	const workers, rounds = 12, 50

	ctx, stop := context.WithCancel(t.Context())
	checkerDone := make(chan error, 1)
	var checks atomic.Int64
	go func() { checkerDone <- checkContinuously(ctx, s, userQuota, fleet.Quota{}, &checks) }()
	flipDone := make(chan error, 1)
	var flips atomic.Int64
	go func() {
		modes := []fleet.SharingMode{fleet.SharingSliced, fleet.SharingMPS}
		for i := 0; ctx.Err() == nil; i++ {
			_, err := replicas[1].SetGPUMode(ctx, "GPU-p2", modes[i%2])
			switch {
			case err == nil:
				flips.Add(1)
			case errors.Is(err, fleet.ErrConflict) && strings.Contains(err.Error(), "changes only when it holds none"):
			case ctx.Err() != nil:
			default:
				flipDone <- err
				return
			}
		}
		flipDone <- nil
	}()

	var mu sync.Mutex
	placed := map[fleet.SharingMode]int{}
	refusals := map[string]bool{}
	errs := raceWorkers(t, replicas, workers, rounds, 7, func(w, r int, rnd *rand.Rand) fleet.PlaceRequest {
		req := fleet.PlaceRequest{SliceID: fmt.Sprintf("w%d-r%d", w, r), User: fmt.Sprintf("user%d", rnd.IntN(5)),
			UserQuota: userQuota, Policy: []fleet.Policy{fleet.PolicyBinpack, fleet.PolicySpread}[rnd.IntN(2)]}
		switch rnd.IntN(4) {
		case 0:
			cp := 5 + rnd.IntN(30)
			req.Slice = fleet.Slice{MemoryMiB: int64(8192 * (1 + rnd.IntN(4))), ComputePercent: cp, ComputeLimitPercent: 50}
		case 1:
			req.Sharing = fleet.SharingExclusive
		case 2:
			req.Sharing, req.MIGProfile = fleet.SharingMIG, []string{"1g.18gb", "3g.71gb"}[rnd.IntN(2)]
		case 3:
			cp := []int{20, 25}[rnd.IntN(2)]
			req.Sharing, req.Slice = fleet.SharingMPS, slice(int64(cp)*1024, cp)
		}
		return req
	}, func(req fleet.PlaceRequest, a fleet.Allocation, err error) (bool, error) {
		switch {
		case err == nil:
			if a.Sharing != fleet.ModeOf(req.Sharing) {
				return false, fmt.Errorf("%s asked %q, placed as %q on %s", req.SliceID, req.Sharing, a.Sharing, a.GPUUUID)
			}
			mu.Lock()
			placed[a.Sharing]++
			mu.Unlock()
			return true, nil
		case errors.Is(err, fleet.ErrNoCapacity), errors.Is(err, fleet.ErrQuotaExceeded):
			msg := fleet.Message(err)
			if strings.Contains(msg, "fleet:") || !strings.Contains(msg, " ") {
				return false, fmt.Errorf("refusal not readable: %q", msg)
			}
			mu.Lock()
			refusals[msg[:min(len(msg), 40)]] = true
			mu.Unlock()
			return false, nil
		default:
			return false, fmt.Errorf("place %s: %w", req.SliceID, err)
		}
	})
	stop()
	for _, err := range errs {
		t.Error(err)
	}
	if err := <-checkerDone; err != nil {
		t.Errorf("invariant broken during the race: %v", err)
	}
	if err := <-flipDone; err != nil {
		t.Errorf("mode flipper: %v", err)
	}
	t.Logf("placed %v, %d snapshots verified, %d mode flips, refusals %v", placed, checks.Load(), flips.Load(), refusals)
	for _, m := range []fleet.SharingMode{fleet.SharingSliced, fleet.SharingExclusive, fleet.SharingMIG, fleet.SharingMPS} {
		if placed[m] == 0 {
			t.Errorf("no %s server was placed: the race did not exercise that mode", m)
		}
	}
	if checks.Load() == 0 {
		t.Error("the checker verified no snapshot")
	}
	verify(t, s)
	us, err := s.GPUUsage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if u.Slices != 0 || u.AllocatedMiB != 0 || u.AllocatedComputePercent != 0 {
			t.Errorf("after releasing everything %s holds %+v", u.GPU.UUID, u)
		}
	}
}

// TestVerifyDetectsMixedModes: an allocation of another mode, a GPU in the
// wrong mode set and an MPS size that disagrees are each reported.
func TestVerifyDetectsMixedModes(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s, _ := newStore(t, srv)
	mixedFleet(t, s)
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "p", User: "u", Sharing: fleet.SharingMPS, Slice: slice(1024, 10)})
	verify(t, s)
	ctx := t.Context()
	tests := []struct {
		name          string
		corrupt, undo func() error
		want          string
	}{
		{"wrong mode set", func() error { return rdb.SAdd(ctx, s.k.ModeGPUs("mps"), "GPU-s1").Err() },
			func() error { return rdb.SRem(ctx, s.k.ModeGPUs("mps"), "GPU-s1").Err() }, "in mode set mps true, want false"},
		{"mps size", func() error { return rdb.HSet(ctx, s.k.GPU("GPU-p1"), "shape", "1/1").Err() },
			func() error { return rdb.HSet(ctx, s.k.GPU("GPU-p1"), "shape", "1024/10").Err() }, `client size "1/1" recorded`},
		{"mode of the record", func() error { return rdb.HSet(ctx, s.k.GPU("GPU-p1"), "mode", "sliced").Err() },
			func() error { return rdb.HSet(ctx, s.k.GPU("GPU-p1"), "mode", "mps").Err() }, "modes mixed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.corrupt(); err != nil {
				t.Fatal(err)
			}
			err := s.Verify(ctx)
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

// TestResizeRefusedOutsideSliced: the resize script refuses a MIG server
// with the reason, whatever the caller checked before.
func TestResizeRefusedOutsideSliced(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	mixedFleet(t, s)
	k := fleet.ServerKey{User: "carol", Name: "lab"}
	runningServer(t, s, k.User, k.Name, "sp-1", fleet.PlaceRequest{Sharing: fleet.SharingMIG, MIGProfile: "1g.18gb"})
	_, _, err := s.Resize(t.Context(), k, fleet.PlaceRequest{SliceID: "sp-1", Slice: slice(1024, 10)}, "resize")
	if !errors.Is(err, fleet.ErrConflict) || !strings.Contains(err.Error(), "MIG instance's memory and SMs are fixed") {
		t.Errorf("Resize of a MIG server = %v, want a conflict saying why", err)
	}
	verify(t, s)
}
