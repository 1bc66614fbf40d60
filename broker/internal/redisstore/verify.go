package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// usage is what a GPU, user or group holds.
type usage struct {
	servers, memMiB, computePercent int64
}

// Verify checks, on one atomic snapshot, the invariants that placement
// keeps, and returns every violation joined (nil when all hold):
//   - no GPU is overcommitted: Σ slice memory ≤ memory, Σ compute ≤ 100;
//   - each GPU's counters equal the sums over its allocations;
//   - each GPU is in the indexes its health and usage call for, with the
//     right score, and in no other;
//   - every allocation is on a registered GPU;
//   - user and group counters equal the sums over their allocations, and no
//     counter exists for someone who holds nothing.
//
// Overcommit after Restore of pods that overcommit is reported too. Verify
// reads every GPU and allocation in one script: meant for tests and admin
// checks, not request paths.
func (s *Store) Verify(ctx context.Context) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	res, err := verifyScript.Run(ctx, s.rdb,
		[]string{s.k.gpus(), s.k.allocs(), s.k.allHealthy(), s.k.allAvail()},
		s.k.gpuPrefix(), scanPattern(s.k.userPrefix()), scanPattern(s.k.groupPrefix())).Result()
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	snap, err := asList(res)
	if err != nil || len(snap) != 4 {
		return fmt.Errorf("verify: malformed snapshot (%d parts): %w", len(snap), err)
	}

	var bad []error
	violation := func(format string, args ...any) { bad = append(bad, fmt.Errorf(format, args...)) }

	allocs, err := flatMap(snap[0])
	if err != nil {
		return fmt.Errorf("verify: allocations: %w", err)
	}
	perGPU := map[string]usage{}
	perUser := map[string]usage{}
	perGroup := map[string]usage{}
	add := func(m map[string]usage, k string, a fleet.Allocation) {
		u := m[k]
		u.servers++
		u.memMiB += a.Slice.MemoryMiB
		u.computePercent += int64(a.Slice.ComputePercent)
		m[k] = u
	}
	for id, raw := range allocs {
		a, err := decodeAlloc(raw)
		if err != nil {
			violation("allocation %s: %w", id, err)
			continue
		}
		if a.SliceID != id {
			violation("allocation stored under %s says slice %s", id, a.SliceID)
		}
		add(perGPU, a.GPUUUID, a)
		add(perUser, a.User, a)
		for _, g := range a.Groups {
			add(perGroup, g, a)
		}
	}

	gpus, err := asList(snap[1])
	if err != nil {
		return fmt.Errorf("verify: gpus: %w", err)
	}
	seen := map[string]bool{}
	for _, raw := range gpus {
		entry, err := asList(raw)
		if err != nil || len(entry) != 6 {
			return fmt.Errorf("verify: malformed gpu entry: %w", err)
		}
		uuid, err := asString(entry[0])
		if err != nil {
			return fmt.Errorf("verify: gpu uuid: %w", err)
		}
		seen[uuid] = true
		h, err := flatMap(entry[1])
		if err != nil {
			return fmt.Errorf("verify: gpu %s: %w", uuid, err)
		}
		scores, err := stringsN(entry[2:], 4)
		if err != nil {
			return fmt.Errorf("verify: gpu %s: %w", uuid, err)
		}
		g, err := decodeGPU(h)
		if err != nil {
			violation("gpu %s: %w", uuid, err)
			continue
		}
		want := perGPU[uuid]
		if got := (usage{int64(g.Slices), g.AllocatedMiB, int64(g.AllocatedComputePercent)}); got != want {
			violation("gpu %s counters %+v, allocations sum to %+v", uuid, got, want)
		}
		if want.memMiB > g.GPU.MemoryMiB {
			violation("gpu %s overcommitted: %d MiB allocated of %d", uuid, want.memMiB, g.GPU.MemoryMiB)
		}
		if want.computePercent > 100 {
			violation("gpu %s overcommitted: %d%% compute allocated", uuid, want.computePercent)
		}
		free := strconv.FormatInt(g.GPU.MemoryMiB-g.AllocatedMiB, 10)
		wantH, wantA := "", ""
		if g.GPU.Healthy {
			wantH = free
			if g.AllocatedComputePercent < 100 {
				wantA = free
			}
		}
		names := []string{"all-healthy", "all-available", "model-healthy", "model-available"}
		for i, w := range []string{wantH, wantA, wantH, wantA} {
			if scores[i] != w {
				violation("gpu %s: %s index score %q, want %q (\"\" = absent)", uuid, names[i], scores[i], w)
			}
		}
	}
	for _, uuid := range slices.Sorted(maps.Keys(perGPU)) {
		if !seen[uuid] {
			violation("allocations on unregistered gpu %s", uuid)
		}
	}

	for i, part := range []struct {
		scope  string
		prefix string
		want   map[string]usage
	}{
		{"user", s.k.userPrefix(), perUser},
		{"group", s.k.groupPrefix(), perGroup},
	} {
		entries, err := asList(snap[2+i])
		if err != nil {
			return fmt.Errorf("verify: %s counters: %w", part.scope, err)
		}
		got := map[string]usage{}
		for _, raw := range entries {
			entry, err := asList(raw)
			if err != nil || len(entry) != 2 {
				return fmt.Errorf("verify: malformed %s counter entry: %w", part.scope, err)
			}
			key, err := asString(entry[0])
			if err != nil {
				return fmt.Errorf("verify: %s counter key: %w", part.scope, err)
			}
			h, err := flatMap(entry[1])
			if err != nil {
				return fmt.Errorf("verify: %s: %w", key, err)
			}
			var errs []error
			num := func(f string) int64 {
				n, err := atoi64(f, h[f])
				errs = append(errs, err)
				return n
			}
			got[strings.TrimPrefix(key, part.prefix)] = usage{num("servers"), num("mem"), num("cp")}
			if err := errors.Join(errs...); err != nil {
				violation("%s: %w", key, err)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(part.want)) {
			if got[name] != part.want[name] {
				violation("%s %s counters %+v, allocations sum to %+v", part.scope, name, got[name], part.want[name])
			}
		}
		for _, name := range slices.Sorted(maps.Keys(got)) {
			if _, ok := part.want[name]; !ok {
				violation("%s %s has counters %+v but no allocations", part.scope, name, got[name])
			}
		}
	}
	return errors.Join(bad...)
}
