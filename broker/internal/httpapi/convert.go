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
// reference comes from the allocation, and only while the server holds
// it: a stopped or failed server holds no GPU.
func toServerRecord(s fleet.Server) v1.Server {
	out := v1.Server{
		User:      s.User,
		Name:      s.Name,
		Profile:   s.Profile,
		SpawnID:   s.SpawnID,
		State:     s.State,
		Message:   s.Message,
		Slice:     s.Slice,
		Sharing:   fleet.ModeOf(s.Sharing),
		URL:       s.URL,
		Pod:       s.Pod,
		CreatedAt: s.CreatedAt,
		UpdatedAt: s.UpdatedAt,
	}
	if s.Allocation != nil && s.Allocation.GPUUUID != "" && !fleet.Terminal(s.State) {
		out.GPU = &v1.GPURef{UUID: s.Allocation.GPUUUID, Node: s.Allocation.Node, Model: s.Allocation.Model,
			MIGProfile: s.Allocation.MIGProfile, ParentUUID: s.Allocation.Parent}
	}
	if why := fleet.ResizeRefusal(s.Sharing, s.MIGProfile); why != "" {
		out.Resize = v1.ResizeInfo{Reason: why}
	} else {
		out.Resize = v1.ResizeInfo{Supported: true}
	}
	return out
}

// restartProfiles returns, for a server that cannot be resized in place,
// the profiles among offered that a restart could use instead: those of
// the same sharing mode other than its own (for a whole GPU, the shared
// modes' profiles), in offered's order; nil for a resizable server.
func restartProfiles(s fleet.Server, offered []fleet.Profile) []fleet.Profile {
	mode := fleet.ModeOf(s.Sharing)
	if mode == fleet.SharingSliced {
		return nil
	}
	var out []fleet.Profile
	for _, p := range offered {
		pm := fleet.ModeOf(p.Sharing)
		same := pm == mode && p.Name != s.Profile && !(mode == fleet.SharingMIG && p.MIGProfile == s.MIGProfile)
		if same || (mode == fleet.SharingExclusive && !fleet.Whole(pm)) {
			out = append(out, p)
		}
	}
	return out
}

// withRestartProfiles sets out.Resize.RestartProfiles from restartProfiles.
func withRestartProfiles(out v1.Server, s fleet.Server, offered []fleet.Profile) v1.Server {
	for _, p := range restartProfiles(s, offered) {
		out.Resize.RestartProfiles = append(out.Resize.RestartProfiles, p.Name)
	}
	return out
}

// toAmounts is a quota's amounts in wire form.
func toAmounts(q fleet.Quota) v1.QuotaAmounts {
	return v1.QuotaAmounts{Servers: q.Servers, MemoryMiB: q.MemoryMiB, ComputePercent: q.ComputePercent}
}

// toProfile converts a profile to its wire form.
func toProfile(p fleet.Profile) v1.Profile {
	return v1.Profile{
		Name:         p.Name,
		DisplayName:  p.DisplayName,
		Description:  p.Description,
		Image:        p.Image,
		CPU:          p.CPU,
		Memory:       p.Memory,
		Slice:        p.Slice,
		Sharing:      fleet.ModeOf(p.Sharing),
		SharingWords: p.Words(),
		MIGProfile:   p.MIGProfile,
		Groups:       slices.Clone(p.Groups),
	}
}

// toGPU and fromGPU convert between the wire and domain GPU.
func toGPU(g fleet.GPU) v1.GPU { return g.Wire() }

func fromGPU(g v1.GPU) fleet.GPU { return fleet.GPUFromWire(g) }

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
