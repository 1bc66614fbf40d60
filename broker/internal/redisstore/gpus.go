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
	// GPU.MemoryMiB only after Restore recorded pods that overcommit it,
	// after UndoResize put back a slice whose room was taken meanwhile, or
	// after the GPU was re-registered smaller.
	AllocatedMiB int64
	// AllocatedComputePercent is Σ guaranteed compute, percent (≤ 100 under
	// the same conditions).
	AllocatedComputePercent int
	// Slices is the number of allocations on the GPU.
	Slices int
}

// RegisterGPU adds g to the fleet or updates its inventory (node, model,
// memory, SM count, health, MIG instance fields) and the mode it asks for
// (g.Mode; "" keeps the current mode, sliced for a new GPU). Existing
// allocations are kept: if the memory shrinks below what is allocated, the
// GPU simply has no room until slices are released. The mode in force
// follows, in this order: MIG (g.Mode mig, the hardware's word), the
// admin's mode (SetGPUMode), g.Mode, the current mode; it changes only
// while the GPU holds nothing, and until then the wanted mode is pending
// (GPU.PendingMode). An invalid g is refused with an error wrapping
// fleet.ErrInvalid.
func (s *Store) RegisterGPU(ctx context.Context, g fleet.GPU) error {
	if err := g.Validate(); err != nil {
		return fmt.Errorf("%w: register gpu %q: %w", fleet.ErrInvalid, g.UUID, err)
	}
	if g.Mode == fleet.SharingMIG && !g.Instance() && g.MIGProfile != "" {
		return fmt.Errorf("%w: register gpu %q: a GPU in MIG mode has no MIG profile; its instances do", fleet.ErrInvalid, g.UUID)
	}
	ctx, cancel := s.op(ctx)
	defer cancel()
	ref, err := allocRef(g.UUID, g.Node, g.Model, g.MIGProfile, g.Parent)
	if err != nil {
		return fmt.Errorf("register gpu %s: %w", g.UUID, err)
	}
	res, err := registerScript.Run(ctx, s.rdb, []string{s.k.GPU(g.UUID), s.k.GPUs()},
		g.UUID, g.Node, g.Model, g.MemoryMiB, g.SMCount, boolArg(g.Healthy), ref,
		s.k.IndexPrefix(), s.k.ModePrefix(), string(g.Mode), g.MIGProfile, g.Parent, g.ComputePercent).Result()
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
	res, err := healthScript.Run(ctx, s.rdb, []string{s.k.GPU(uuid)}, uuid, boolArg(healthy)).Result()
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

// SetGPUMode sets the sharing mode of the physical GPU uuid as an admin
// asks: sliced, exclusive or mps, or "" to follow its node's label again
// (gpubroker.io/sharing, as the node agent reports it). It takes effect at
// once and returns the GPU as it is now. Errors: fleet.ErrInvalid for
// another mode (MIG is switched on the GPU itself); fleet.ErrNotFound for
// an unknown GPU; fleet.ErrConflict for a GPU in MIG mode or a MIG
// instance, and for a GPU that holds servers (the message says how many):
// a mode changes only on a GPU that holds none.
func (s *Store) SetGPUMode(ctx context.Context, uuid string, mode fleet.SharingMode) (fleet.GPU, error) {
	switch mode {
	case "", fleet.SharingSliced, fleet.SharingExclusive, fleet.SharingMPS:
	case fleet.SharingMIG:
		return fleet.GPU{}, fmt.Errorf("%w: MIG mode is switched on the GPU itself (nvidia-smi -i <gpu> -mig 1, then a GPU reset and MIG instances made with nvidia-smi mig -cgi ... -C); gpubroker follows what the node agent reports", fleet.ErrInvalid)
	default:
		return fleet.GPU{}, fmt.Errorf("%w: sharing mode must be sliced, exclusive or mps (or empty to follow the node label), got %q", fleet.ErrInvalid, mode)
	}
	opCtx, cancel := s.op(ctx)
	defer cancel()
	res, err := setModeScript.Run(opCtx, s.rdb, []string{s.k.GPU(uuid)},
		uuid, s.k.IndexPrefix(), s.k.ModePrefix(), string(mode)).Result()
	if err != nil {
		return fleet.GPU{}, fmt.Errorf("set gpu %s mode: %w", uuid, err)
	}
	tag, rest, err := tagged(res)
	if err != nil {
		return fleet.GPU{}, fmt.Errorf("set gpu %s mode: %w", uuid, err)
	}
	switch tag {
	case "set":
	case "nogpu":
		return fleet.GPU{}, fmt.Errorf("%w: gpu %s is not registered", fleet.ErrNotFound, uuid)
	case "mig":
		return fleet.GPU{}, fmt.Errorf("%w: gpu %s is in MIG mode (or is a MIG instance): its sharing is its MIG instances until MIG mode is switched off on the GPU", fleet.ErrConflict, uuid)
	case "busy":
		f, err := stringsN(rest, 2)
		if err != nil {
			return fleet.GPU{}, fmt.Errorf("set gpu %s mode: %w", uuid, err)
		}
		return fleet.GPU{}, fmt.Errorf("%w: gpu %s holds %s server(s) in %s mode; its sharing mode changes only when it holds none (stop them, or wait until they stop)", fleet.ErrConflict, uuid, f[0], f[1])
	default:
		return fleet.GPU{}, fmt.Errorf("set gpu %s mode: unexpected script reply %q", uuid, tag)
	}
	opCtx2, cancel2 := s.op(ctx)
	defer cancel2()
	h, err := s.rdb.HGetAll(opCtx2, s.k.GPU(uuid)).Result()
	if err != nil {
		return fleet.GPU{}, fmt.Errorf("read gpu %s: %w", uuid, err)
	}
	u, err := decodeGPU(h)
	return u.GPU, err
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

// deviceCounters reads a device's counters from its gpu:<uuid> hash:
// servers is the number of allocations. They are the use field,
// usageFormat (lib.lua's gpu_counters reads it alike); a device that an
// earlier build wrote has the decimal fields amem, acp and n instead,
// which the scripts replace at its next charge or registration (setting
// them to "use", which this ignores while use is there). An error
// names a use field of another length or a field that is no decimal
// integer.
func deviceCounters(h map[string]string) (usage, error) {
	if v, ok := h["use"]; ok {
		if len(v) != usageSize {
			return usage{}, fmt.Errorf("field use is %d bytes, want %s", len(v), usageWant)
		}
		return unpackUsage(v), nil
	}
	var errs []error
	num := func(f string) int64 {
		n, err := atoi64(f, cmp.Or(h[f], "0"))
		errs = append(errs, err)
		return n
	}
	return usage{servers: num("n"), memMiB: num("amem"), computePercent: num("acp")}, errors.Join(errs...)
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
			UUID:        h["uuid"],
			Node:        h["node"],
			Model:       h["model"],
			MemoryMiB:   num("mem"),
			SMCount:     int(num("sm")),
			Healthy:     h["healthy"] == "1",
			Mode:        fleet.ModeOf(fleet.SharingMode(h["mode"])),
			PendingMode: fleet.SharingMode(h["pmode"]),
			MIGProfile:  h["migp"],
			Parent:      h["parent"],
		},
	}
	c, err := deviceCounters(h)
	errs = append(errs, err)
	u.Slices, u.AllocatedMiB, u.AllocatedComputePercent = int(c.servers), c.memMiB, int(c.computePercent)
	if u.GPU.Parent != "" {
		u.GPU.ComputePercent = int(num("cpw"))
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
