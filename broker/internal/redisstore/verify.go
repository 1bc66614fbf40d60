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

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// verifyTimeout bounds Verify: one script that reads the whole fleet (about
// a second at 10,000 GPUs on a loaded machine), longer than a request's
// DefaultOpTimeout.
const verifyTimeout = 30 * time.Second

// usage is what a GPU, user or group holds.
type usage struct {
	servers, memMiB, computePercent int64
}

// Verify checks, on one atomic snapshot, the invariants that placement
// keeps, and returns every violation joined (nil when all hold):
//   - no GPU is overcommitted: Σ slice memory ≤ memory, Σ compute ≤ 100;
//   - each GPU's counters equal the sums over its allocations;
//   - each device is in the indexes its pool, health and usage call for
//     (see scripts/lib.lua), with its free memory as score, and in no
//     other, and its index keys are those redisschema builds for its pool
//     and model;
//   - every allocation is on a registered device, in the device's mode:
//     no GPU mixes modes; a GPU in MIG mode holds nothing itself; a whole
//     device (exclusive GPU, MIG instance) holds at most one allocation,
//     of all its memory; the MPS clients of a GPU all have one size, the
//     one its record holds;
//   - each physical GPU is in the mode set of its mode and no other; MIG
//     instances are in none, and their GPU is registered in MIG mode;
//   - user and group counters equal the sums over their allocations, and no
//     counter exists for someone who holds nothing.
//
// Overcommit after Restore of pods that overcommit is reported too. Verify
// reads every GPU and allocation in one script: meant for tests and admin
// checks, not request paths.
func (s *Store) Verify(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(s.opTimeout, verifyTimeout))
	defer cancel()
	keys := append([]string{s.k.GPUs(), s.k.Allocs(), s.k.Usage()}, modeSets(s.k)...)
	res, err := verifyScript.Run(ctx, s.rdb, keys, s.k.GPUPrefix()).Result()
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
	onGPU := map[string][]fleet.Allocation{}
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
		onGPU[a.GPUUUID] = append(onGPU[a.GPUUUID], a)
		add(perUser, a.User, a)
		for _, g := range a.Groups {
			add(perGroup, g, a)
		}
	}

	gpus, err := asList(snap[1])
	if err != nil {
		return fmt.Errorf("verify: gpus: %w", err)
	}
	inMode, err := modeMembers(snap[3])
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	seen := map[string]bool{}
	decoded := map[string]GPUUsage{}
	hashes := map[string]map[string]string{}
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
		decoded[uuid], hashes[uuid] = g, h
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
		pool := ""
		if g.GPU.Mode != fleet.SharingMIG || g.GPU.Instance() {
			pool = redisschema.Pool(string(g.GPU.Mode), g.GPU.MIGProfile)
		}
		wantKeys := [4]string{}
		if pool != "" {
			wantKeys = [4]string{s.k.AllAvail(pool), s.k.AllFull(pool), s.k.AvailIndex(pool, g.GPU.Model), s.k.FullIndex(pool, g.GPU.Model)}
		}
		names := []string{"all-avail", "all-full", "model-avail", "model-full"}
		for i, f := range []string{"alla", "allf", "aidx", "fidx"} {
			if h[f] != wantKeys[i] {
				violation("gpu %s (pool %q): %s index key %q, want %q", uuid, pool, names[i], h[f], wantKeys[i])
			}
		}
		if h["pool"] != pool {
			violation("gpu %s: pool %q, want %q for mode %s", uuid, h["pool"], pool, g.GPU.Mode)
		}
		whole := fleet.Whole(g.GPU.Mode) && pool != ""
		if (h["whole"] == "1") != whole {
			violation("gpu %s: whole %q in mode %s", uuid, h["whole"], g.GPU.Mode)
		}
		free := strconv.FormatInt(g.GPU.MemoryMiB-g.AllocatedMiB, 10)
		wantA, wantF := "", ""
		switch {
		case !g.GPU.Healthy || pool == "":
		case whole && g.Slices == 0, !whole && g.AllocatedComputePercent < 100:
			wantA = free
		default:
			wantF = free
		}
		for i, w := range []string{wantA, wantF, wantA, wantF} {
			if scores[i] != w {
				violation("gpu %s: %s index score %q, want %q (\"\" = absent)", uuid, names[i], scores[i], w)
			}
		}
	}
	bad = append(bad, verifyModes(decoded, hashes, onGPU, inMode)...)
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
		u, ok := parseUsage(val)
		if !ok {
			violation("usage field %q is %q, want %s", field, val, usageWant)
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

// modeMembers decodes the snapshot's mode sets, in v1.SharingModes order:
// mode → member uuids.
func modeMembers(v any) (map[fleet.SharingMode]map[string]bool, error) {
	l, err := asList(v)
	if err != nil || len(l) != len(v1.SharingModes) {
		return nil, fmt.Errorf("mode sets: %d of %d: %w", len(l), len(v1.SharingModes), err)
	}
	out := map[fleet.SharingMode]map[string]bool{}
	for i, m := range v1.SharingModes {
		members, err := asList(l[i])
		if err != nil {
			return nil, fmt.Errorf("mode set %s: %w", m, err)
		}
		out[m] = map[string]bool{}
		for _, x := range members {
			uuid, err := asString(x)
			if err != nil {
				return nil, fmt.Errorf("mode set %s: %w", m, err)
			}
			out[m][uuid] = true
		}
	}
	return out, nil
}

// verifyModes checks the sharing-mode invariants of Verify over the
// decoded devices, their hashes, the allocations on each and the mode sets.
func verifyModes(gpus map[string]GPUUsage, hashes map[string]map[string]string, onGPU map[string][]fleet.Allocation,
	inMode map[fleet.SharingMode]map[string]bool) []error {
	var bad []error
	violation := func(format string, args ...any) { bad = append(bad, fmt.Errorf(format, args...)) }
	for _, uuid := range slices.Sorted(maps.Keys(gpus)) {
		g, h, allocs := gpus[uuid].GPU, hashes[uuid], onGPU[uuid]
		for _, m := range v1.SharingModes {
			want := !g.Instance() && m == g.Mode
			if inMode[m][uuid] != want {
				violation("gpu %s (mode %s, MIG instance %v): in mode set %s %v, want %v", uuid, g.Mode, g.Instance(), m, inMode[m][uuid], want)
			}
		}
		if g.Instance() {
			p, ok := gpus[g.Parent]
			if !ok || p.GPU.Mode != fleet.SharingMIG {
				violation("MIG instance %s: its gpu %s is not registered in MIG mode", uuid, g.Parent)
			}
		}
		for _, a := range allocs {
			if a.Sharing != g.Mode {
				violation("gpu %s in mode %s holds %s allocation %s: modes mixed", uuid, g.Mode, a.Sharing, a.SliceID)
			}
		}
		switch {
		case g.Mode == fleet.SharingMIG && !g.Instance() && len(allocs) > 0:
			violation("gpu %s is in MIG mode but holds %d allocations itself (only its instances may)", uuid, len(allocs))
		case fleet.Whole(g.Mode) && len(allocs) > 1:
			violation("whole device %s holds %d allocations", uuid, len(allocs))
		case fleet.Whole(g.Mode) && len(allocs) == 1 && allocs[0].Slice.MemoryMiB != g.MemoryMiB:
			violation("whole device %s: allocation %s holds %d MiB of its %d", uuid, allocs[0].SliceID, allocs[0].Slice.MemoryMiB, g.MemoryMiB)
		case g.Mode == fleet.SharingMPS:
			want := ""
			for _, a := range allocs {
				shape := mpsShape(a.Slice)
				if want != "" && shape != want {
					violation("MPS gpu %s holds clients of sizes %s and %s", uuid, want, shape)
				}
				want = shape
			}
			if h["shape"] != want {
				violation("MPS gpu %s: client size %q recorded, its clients are %q", uuid, h["shape"], want)
			}
		}
	}
	for _, m := range v1.SharingModes {
		for _, uuid := range slices.Sorted(maps.Keys(inMode[m])) {
			if _, ok := gpus[uuid]; !ok {
				violation("mode set %s holds unregistered gpu %s", m, uuid)
			}
		}
	}
	return bad
}
