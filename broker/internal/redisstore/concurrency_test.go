package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// TestConcurrentPlaceReleaseNeverOvercommits races many placers and
// releasers, through two stores on separate clients (two broker replicas),
// on 4 small GPUs, while a checker verifies every invariant and every quota
// on atomic snapshots. It then releases everything and expects an empty,
// consistent fleet.
func TestConcurrentPlaceReleaseNeverOvercommits(t *testing.T) {
	replicas := twoReplicas(t)
	s := replicas[0]
	for i := range 4 {
		register(t, s, fleet.GPU{UUID: fmt.Sprintf("GPU-%d", i), Node: fmt.Sprintf("n%d", i/2), Model: "L4",
			MemoryMiB: 16384, SMCount: 58, Healthy: true})
	}
	userQuota := fleet.Quota{Servers: 3, MemoryMiB: 20000}
	groupQuota := fleet.Quota{ComputePercent: 150}
	const workers, rounds, users = 16, 60, 6

	var placed, capacity, quota atomic.Int64
	ctx, stop := context.WithCancel(t.Context())
	checkerDone := make(chan error, 1)
	var checks atomic.Int64
	go func() { checkerDone <- checkContinuously(ctx, s, userQuota, groupQuota, &checks) }()

	errs := raceWorkers(t, replicas, workers, rounds, 42, func(w, r int, rnd *rand.Rand) fleet.PlaceRequest {
		user := fmt.Sprintf("user%d", rnd.IntN(users))
		cp := 5 + rnd.IntN(36)
		req := fleet.PlaceRequest{
			SliceID:     fmt.Sprintf("w%d-r%d", w, r),
			User:        user,
			Slice:       fleet.Slice{MemoryMiB: int64(1024 * (1 + rnd.IntN(8))), ComputePercent: cp, ComputeLimitPercent: cp},
			Policy:      []fleet.Policy{fleet.PolicyBinpack, fleet.PolicySpread}[rnd.IntN(2)],
			UserQuota:   userQuota,
			GroupQuotas: map[string]fleet.Quota{"team" + user[len(user)-1:]: groupQuota, "all": {}},
		}
		if rnd.IntN(4) == 0 {
			req.GroupQuotas = map[string]fleet.Quota{"all": groupQuota}
		}
		return req
	}, func(req fleet.PlaceRequest, _ fleet.Allocation, err error) (bool, error) {
		switch {
		case err == nil:
			placed.Add(1)
			return true, nil
		case errors.Is(err, fleet.ErrNoCapacity):
			capacity.Add(1)
		case errors.Is(err, fleet.ErrQuotaExceeded):
			quota.Add(1)
		default:
			return false, fmt.Errorf("place %s: %w", req.SliceID, err)
		}
		return false, nil
	})
	stop()
	if err := <-checkerDone; err != nil {
		t.Errorf("invariant violated during the race:\n%v", err)
	}
	for _, err := range errs {
		t.Error(err)
	}
	t.Logf("placed %d, refused for capacity %d, for quota %d; %d consistent snapshots checked",
		placed.Load(), capacity.Load(), quota.Load(), checks.Load())
	if placed.Load() == 0 || capacity.Load() == 0 || quota.Load() == 0 {
		t.Errorf("the race did not exercise every outcome: placed %d, capacity %d, quota %d",
			placed.Load(), capacity.Load(), quota.Load())
	}
	if checks.Load() == 0 {
		t.Error("the checker never completed a check during the race")
	}
	verify(t, s)
	usage, err := s.GPUUsage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range usage {
		if u.AllocatedMiB != 0 || u.AllocatedComputePercent != 0 || u.Slices != 0 {
			t.Errorf("after releasing everything, %s still has %+v", u.GPU.UUID, u)
		}
	}
}

// checkQuotas reports any user or group above its caps in one snapshot of
// allocations. Only groups named "team*" and "all" carry groupQuota here.
func checkQuotas(all []fleet.Allocation, userQuota, groupQuota fleet.Quota) error {
	type sum struct {
		n, mem, cp int64
	}
	users, groups := map[string]sum{}, map[string]sum{}
	for _, a := range all {
		u := users[a.User]
		users[a.User] = sum{u.n + 1, u.mem + a.Slice.MemoryMiB, u.cp + int64(a.Slice.ComputePercent)}
		for _, g := range a.Groups {
			s := groups[g]
			groups[g] = sum{s.n + 1, s.mem + a.Slice.MemoryMiB, s.cp + int64(a.Slice.ComputePercent)}
		}
	}
	var errs []error
	for name, u := range users {
		if u.n > int64(userQuota.Servers) || u.mem > userQuota.MemoryMiB {
			errs = append(errs, fmt.Errorf("user %s holds %+v, over %+v", name, u, userQuota))
		}
	}
	for name, g := range groups {
		if name != "all" && g.cp > int64(groupQuota.ComputePercent) {
			errs = append(errs, fmt.Errorf("group %s holds %+v, over %+v", name, g, groupQuota))
		}
	}
	return errors.Join(errs...)
}

// checkContinuously checks the store's invariants (Verify) and the quotas
// (checkQuotas) on fresh snapshots until ctx ends, counting passes in
// checks. It returns the first violation, or nil once ctx has ended.
func checkContinuously(ctx context.Context, s *Store, userQuota, groupQuota fleet.Quota, checks *atomic.Int64) error {
	for ctx.Err() == nil {
		if err := s.Verify(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		all, err := s.Allocations(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := checkQuotas(all, userQuota, groupQuota); err != nil {
			return err
		}
		checks.Add(1)
	}
	return nil
}
