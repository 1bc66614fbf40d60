package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// usage is what a GPU, user or group holds.
// verifyTimeout bounds Verify: one script that reads the whole fleet (about
// a second at 10,000 GPUs on a loaded machine), longer than a request's
// DefaultOpTimeout.
const verifyTimeout = 30 * time.Second

type usage struct {
	servers, memMiB, computePercent int64
}

// Verify checks, on one atomic snapshot, the invariants that placement
// keeps, and returns every violation joined (nil when all hold):
//   - no GPU is overcommitted: Σ slice memory ≤ memory, Σ compute ≤ 100;
//   - each GPU's counters equal the sums over its allocations;
//   - each GPU is in the indexes its health and usage call for (see
//     scripts/lib.lua), with its free memory as score, and in no other;
//   - every allocation is on a registered GPU;
//   - user and group counters equal the sums over their allocations, and no
//     counter exists for someone who holds nothing.
//
// Overcommit after Restore of pods that overcommit is reported too. Verify
// reads every GPU and allocation in one script: meant for tests and admin
// checks, not request paths.
func (s *Store) Verify(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(s.opTimeout, verifyTimeout))
	defer cancel()
	res, err := verifyScript.Run(ctx, s.rdb,
		[]string{s.k.GPUs(), s.k.Allocs(), s.k.AllAvail(), s.k.AllFull(), s.k.Usage()},
		s.k.GPUPrefix()).Result()
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	snap, err := asList(res)
	if err != nil || len(snap) != 3 {
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
		wantA, wantF := "", ""
		switch {
		case !g.GPU.Healthy:
		case g.AllocatedComputePercent < 100:
			wantA = free
		default:
			wantF = free
		}
		names := []string{"all-avail", "all-full", "model-avail", "model-full"}
		for i, w := range []string{wantA, wantF, wantA, wantF} {
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

	usageHash, err := flatMap(snap[2])
	if err != nil {
		return fmt.Errorf("verify: usage: %w", err)
	}
	gotUser, gotGroup := map[string]usage{}, map[string]usage{}
	for field, val := range usageHash {
		m := gotUser
		rest, ok := strings.CutPrefix(field, userFieldPrefix)
		if !ok {
			m = gotGroup
			if rest, ok = strings.CutPrefix(field, groupFieldPrefix); !ok {
				violation("usage field %q belongs to no user or group", field)
				continue
			}
		}
		var u usage
		if _, err := fmt.Sscanf(val, "%d %d %d", &u.servers, &u.memMiB, &u.computePercent); err != nil ||
			val != fmt.Sprintf("%d %d %d", u.servers, u.memMiB, u.computePercent) {
			violation("usage field %q is %q, want \"<servers> <MiB> <compute percent>\"", field, val)
			continue
		}
		m[rest] = u
	}
	for _, part := range []struct {
		scope     string
		got, want map[string]usage
	}{{"user", gotUser, perUser}, {"group", gotGroup, perGroup}} {
		for _, name := range slices.Sorted(maps.Keys(part.want)) {
			if part.got[name] != part.want[name] {
				violation("%s %s counters %+v, allocations sum to %+v", part.scope, name, part.got[name], part.want[name])
			}
		}
		for _, name := range slices.Sorted(maps.Keys(part.got)) {
			if _, ok := part.want[name]; !ok {
				violation("%s %s has counters %+v but no allocations", part.scope, name, part.got[name])
			}
		}
	}
	return errors.Join(bad...)
}
