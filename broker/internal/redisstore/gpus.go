package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// GPUUsage is a GPU with what is allocated on it.
type GPUUsage struct {
	GPU fleet.GPU
	// AllocatedMiB is Σ slice memory on the GPU, MiB. It may exceed
	// GPU.MemoryMiB only after Restore recorded pods that overcommit it or
	// after the GPU was re-registered smaller.
	AllocatedMiB int64
	// AllocatedComputePercent is Σ guaranteed compute, percent (≤ 100 under
	// the same conditions).
	AllocatedComputePercent int
	// Slices is the number of allocations on the GPU.
	Slices int
}

// RegisterGPU adds g to the fleet or updates its inventory (node, model,
// memory, SM count, health). Existing allocations are kept: if the memory
// shrinks below what is allocated, the GPU simply has no room until slices
// are released. An invalid g is refused with an error wrapping
// fleet.ErrInvalid.
func (s *Store) RegisterGPU(ctx context.Context, g fleet.GPU) error {
	if err := g.Validate(); err != nil {
		return fmt.Errorf("%w: register gpu %q: %w", fleet.ErrInvalid, g.UUID, err)
	}
	ctx, cancel := s.op(ctx)
	defer cancel()
	keys := []string{
		s.k.GPU(g.UUID), s.k.GPUs(),
		s.k.AllAvail(), s.k.AllFull(),
		s.k.AvailIndex(g.Model), s.k.FullIndex(g.Model),
	}
	ref, err := allocRef(g.UUID, g.Node, g.Model)
	if err != nil {
		return fmt.Errorf("register gpu %s: %w", g.UUID, err)
	}
	res, err := registerScript.Run(ctx, s.rdb, keys,
		g.UUID, g.Node, g.Model, g.MemoryMiB, g.SMCount, boolArg(g.Healthy), ref).Result()
	if err != nil {
		return fmt.Errorf("register gpu %s: %w", g.UUID, err)
	}
	if _, err := asInt(res); err != nil {
		return fmt.Errorf("register gpu %s: %w", g.UUID, err)
	}
	return nil
}

// SetGPUHealth marks a registered GPU healthy or not; placement never picks
// an unhealthy GPU, and its allocations stay. An unknown uuid is an error
// wrapping fleet.ErrNotFound.
func (s *Store) SetGPUHealth(ctx context.Context, uuid string, healthy bool) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	keys := []string{s.k.GPU(uuid), s.k.AllAvail(), s.k.AllFull()}
	res, err := healthScript.Run(ctx, s.rdb, keys, uuid, boolArg(healthy)).Result()
	if err != nil {
		return fmt.Errorf("set gpu %s health: %w", uuid, err)
	}
	n, err := asInt(res)
	if err != nil {
		return fmt.Errorf("set gpu %s health: %w", uuid, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: gpu %s is not registered", fleet.ErrNotFound, uuid)
	}
	return nil
}

// GPUs returns every registered GPU, sorted by node then uuid.
func (s *Store) GPUs(ctx context.Context) ([]fleet.GPU, error) {
	us, err := s.GPUUsage(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]fleet.GPU, len(us))
	for i, u := range us {
		out[i] = u.GPU
	}
	return out, nil
}

// GPUUsage returns every registered GPU with its allocated totals, sorted by
// node then uuid. It reads GPUs one by one in a pipeline, so totals of
// different GPUs may come from slightly different moments.
func (s *Store) GPUUsage(ctx context.Context) ([]GPUUsage, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	uuids, err := s.rdb.SMembers(ctx, s.k.GPUs()).Result()
	if err != nil {
		return nil, fmt.Errorf("list gpus: %w", err)
	}
	cmds := make([]*redis.MapStringStringCmd, len(uuids))
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, u := range uuids {
			cmds[i] = p.HGetAll(ctx, s.k.GPU(u))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read gpus: %w", err)
	}
	out := make([]GPUUsage, 0, len(uuids))
	for i, c := range cmds {
		h := c.Val()
		if len(h) == 0 {
			continue // removed by hand between SMEMBERS and HGETALL
		}
		u, err := decodeGPU(h)
		if err != nil {
			return nil, fmt.Errorf("gpu %s: %w", uuids[i], err)
		}
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b GPUUsage) int {
		return cmp.Or(cmp.Compare(a.GPU.Node, b.GPU.Node), cmp.Compare(a.GPU.UUID, b.GPU.UUID))
	})
	return out, nil
}

// decodeGPU reads a gpu:<uuid> hash (fields in scripts/lib.lua).
func decodeGPU(h map[string]string) (GPUUsage, error) {
	var errs []error
	num := func(f string) int64 {
		n, err := atoi64(f, h[f])
		if err != nil {
			errs = append(errs, err)
		}
		return n
	}
	u := GPUUsage{
		GPU: fleet.GPU{
			UUID:      h["uuid"],
			Node:      h["node"],
			Model:     h["model"],
			MemoryMiB: num("mem"),
			SMCount:   int(num("sm")),
			Healthy:   h["healthy"] == "1",
		},
		AllocatedMiB:            num("amem"),
		AllocatedComputePercent: int(num("acp")),
		Slices:                  int(num("n")),
	}
	return u, errors.Join(errs...)
}

// boolArg is the script argument for b: "1" or "0".
func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
