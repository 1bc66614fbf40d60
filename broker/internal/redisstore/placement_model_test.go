package redisstore

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// modelGPU is the reference model's view of one GPU.
type modelGPU struct {
	uuid, model string
	mem, amem   int64
	acp         int
}

// modelChoice is what placement must do with req on gpus, given the quota
// usage so far (keyed "u:<user>" and "g:<group>"): the chosen GPU, or a
// quota refusal ("quota"), or no room ("capacity"). It restates the rules
// of Place's docstring: quotas first (user, then groups in name order;
// servers, memory, compute), then binpack (least free memory that fits) or
// spread (most), ties to the smaller uuid.
func modelChoice(gpus []*modelGPU, used map[string]fleet.Quota, req fleet.PlaceRequest) (string, *modelGPU) {
	over := func(u, q fleet.Quota) bool {
		return (q.Servers > 0 && u.Servers+1 > q.Servers) ||
			(q.MemoryMiB > 0 && u.MemoryMiB+req.Slice.MemoryMiB > q.MemoryMiB) ||
			(q.ComputePercent > 0 && u.ComputePercent+req.Slice.ComputePercent > q.ComputePercent)
	}
	if over(used["u:"+req.User], req.UserQuota) {
		return "quota", nil
	}
	for _, g := range fleet.SortedGroups(req.GroupQuotas) {
		if over(used["g:"+g], req.GroupQuotas[g]) {
			return "quota", nil
		}
	}
	var best *modelGPU
	for _, g := range gpus {
		free := g.mem - g.amem
		if (req.Model != "" && g.model != req.Model) || free < req.Slice.MemoryMiB || 100-g.acp < req.Slice.ComputePercent {
			continue
		}
		if best == nil {
			best = g
			continue
		}
		c := cmp.Compare(free, best.mem-best.amem)
		if req.Policy == fleet.PolicySpread {
			c = -c
		}
		if c < 0 || (c == 0 && g.uuid < best.uuid) {
			best = g
		}
	}
	if best == nil {
		return "capacity", nil
	}
	return "placed", best
}

// TestPlacementMatchesModel drives Place and Release with random requests
// on a small fleet whose GPUs fill up in compute before memory (so the walk
// has to skip candidates) and checks every answer against modelChoice, and
// the invariants every few steps.
func TestPlacementMatchesModel(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	var gpus []*modelGPU
	for i := range 24 {
		g := h200(fmt.Sprintf("GPU-%02d", i), fmt.Sprintf("n%d", i/8))
		if i%3 == 0 {
			g.Model, g.MemoryMiB = "NVIDIA L4", 23034
		}
		register(t, s, g)
		gpus = append(gpus, &modelGPU{uuid: g.UUID, model: g.Model, mem: g.MemoryMiB})
	}
	byUUID := map[string]*modelGPU{}
	for _, g := range gpus {
		byUUID[g.uuid] = g
	}
	used := map[string]fleet.Quota{}
	charge := func(a fleet.Allocation, sign int) {
		for _, k := range append([]string{"u:" + a.User}, func() []string {
			var out []string
			for _, g := range a.Groups {
				out = append(out, "g:"+g)
			}
			return out
		}()...) {
			u := used[k]
			u.Servers += sign
			u.MemoryMiB += int64(sign) * a.Slice.MemoryMiB
			u.ComputePercent += sign * a.Slice.ComputePercent
			used[k] = u
		}
		g := byUUID[a.GPUUUID]
		g.amem += int64(sign) * a.Slice.MemoryMiB
		g.acp += sign * a.Slice.ComputePercent
	}

	rnd := rand.New(rand.NewPCG(16, 4))
	var held []fleet.Allocation
	counts := map[string]int{}
	for step := range 1500 {
		if len(held) > 0 && rnd.IntN(3) == 0 {
			i := rnd.IntN(len(held))
			a := held[i]
			held = slices.Delete(held, i, i+1)
			if ok, err := s.Release(t.Context(), a.SliceID); err != nil || !ok {
				t.Fatalf("step %d: Release(%s) = %v, %v", step, a.SliceID, ok, err)
			}
			charge(a, -1)
			counts["released"]++
			continue
		}
		user := fmt.Sprintf("user%d", rnd.IntN(5))
		cp := []int{5, 10, 15, 25, 40, 60}[rnd.IntN(6)]
		req := fleet.PlaceRequest{
			SliceID:     fmt.Sprintf("m%d", step),
			User:        user,
			Slice:       slice(int64(512*(1+rnd.IntN(40))), cp),
			Policy:      []fleet.Policy{fleet.PolicyBinpack, fleet.PolicySpread}[rnd.IntN(2)],
			UserQuota:   fleet.Quota{Servers: 8, MemoryMiB: 200000, ComputePercent: 300},
			GroupQuotas: map[string]fleet.Quota{"team" + user[4:]: {ComputePercent: 400}, "all": {Servers: 60}},
		}
		if rnd.IntN(3) == 0 {
			req.Model = []string{"NVIDIA H200", "NVIDIA L4"}[rnd.IntN(2)]
		}
		want, wantGPU := modelChoice(gpus, used, req)
		a, err := s.Place(t.Context(), req)
		var got string
		switch {
		case err == nil:
			got = "placed"
		case errors.Is(err, fleet.ErrQuotaExceeded):
			got = "quota"
		case errors.Is(err, fleet.ErrNoCapacity):
			got = "capacity"
		default:
			t.Fatalf("step %d: Place(%+v): %v", step, req, err)
		}
		if got != want || (wantGPU != nil && a.GPUUUID != wantGPU.uuid) {
			wantOn := ""
			if wantGPU != nil {
				wantOn = wantGPU.uuid
			}
			t.Fatalf("step %d: Place(%s %d MiB %d%% %s model %q) = %s on %q (err %v), the model says %s on %q",
				step, req.User, req.Slice.MemoryMiB, cp, req.Policy, req.Model, got, a.GPUUUID, err, want, wantOn)
		}
		counts[got]++
		if got == "placed" {
			held = append(held, a)
			charge(a, 1)
		}
		if step%100 == 0 {
			verify(t, s)
		}
	}
	verify(t, s)
	t.Logf("outcomes: %v", counts)
	for _, k := range []string{"placed", "quota", "capacity", "released"} {
		if counts[k] == 0 {
			t.Errorf("the random run never saw %s: %v", k, counts)
		}
	}
}
