package httpapi

import (
	"cmp"
	"slices"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// toServer converts a server record to its wire form, with its browser
// address when the broker serves notebooks (Deps.OpenURL).
func (a *api) toServer(s fleet.Server) v1.Server {
	out := toServerRecord(s)
	if a.deps.OpenURL != nil {
		out.OpenURL = a.deps.OpenURL(s.User, s.Name)
	}
	return out
}

// toServers converts a list, keeping its order; never nil.
func (a *api) toServers(in []fleet.Server) []v1.Server {
	out := make([]v1.Server, 0, len(in))
	for _, s := range in {
		out = append(out, a.toServer(s))
	}
	return out
}

// toServerRecord converts a server record to its wire form. The GPU
// reference comes from the allocation.
func toServerRecord(s fleet.Server) v1.Server {
	out := v1.Server{
		User:      s.User,
		Name:      s.Name,
		Profile:   s.Profile,
		SpawnID:   s.SpawnID,
		State:     s.State,
		Message:   s.Message,
		Slice:     s.Slice,
		URL:       s.URL,
		Pod:       s.Pod,
		CreatedAt: s.CreatedAt,
		UpdatedAt: s.UpdatedAt,
	}
	if s.Allocation != nil && s.Allocation.GPUUUID != "" {
		out.GPU = &v1.GPURef{UUID: s.Allocation.GPUUUID, Node: s.Allocation.Node, Model: s.Allocation.Model}
	}
	return out
}

// toProfile converts a profile to its wire form.
func toProfile(p fleet.Profile) v1.Profile {
	return v1.Profile{
		Name:        p.Name,
		DisplayName: p.DisplayName,
		Description: p.Description,
		Image:       p.Image,
		CPU:         p.CPU,
		Memory:      p.Memory,
		Slice:       p.Slice,
		Groups:      slices.Clone(p.Groups),
	}
}

// toGPU and fromGPU convert between the wire and domain GPU.
func toGPU(g fleet.GPU) v1.GPU {
	return v1.GPU{UUID: g.UUID, Node: g.Node, Model: g.Model, MemoryMiB: g.MemoryMiB, SMCount: g.SMCount, Healthy: g.Healthy}
}

func fromGPU(g v1.GPU) fleet.GPU {
	return fleet.GPU{UUID: g.UUID, Node: g.Node, Model: g.Model, MemoryMiB: g.MemoryMiB, SMCount: g.SMCount, Healthy: g.Healthy}
}

// gpuStatuses joins GPUs with the allocations placed on them, sorted by
// node then UUID. Allocations on unregistered GPUs are left out.
func gpuStatuses(gpus []fleet.GPU, allocs []fleet.Allocation) []v1.GPUStatus {
	byUUID := make(map[string]int, len(gpus))
	out := make([]v1.GPUStatus, 0, len(gpus))
	for _, g := range gpus {
		byUUID[g.UUID] = len(out)
		out = append(out, v1.GPUStatus{GPU: toGPU(g)})
	}
	for _, a := range allocs {
		i, ok := byUUID[a.GPUUUID]
		if !ok {
			continue
		}
		out[i].AllocatedMemoryMiB += a.Slice.MemoryMiB
		out[i].AllocatedComputePercent += a.Slice.ComputePercent
		out[i].Slices++
	}
	slices.SortFunc(out, func(a, b v1.GPUStatus) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.UUID, b.UUID))
	})
	return out
}
