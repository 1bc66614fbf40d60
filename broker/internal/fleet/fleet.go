package fleet

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// gpuUUID is the shape of an NVML GPU or MIG UUID ("GPU-8f3c…"), loose
// enough for test and simulated devices ("GPU-a") but never free text.
var gpuUUID = regexp.MustCompile(`^(?i:GPU|MIG)-[A-Za-z0-9._-]{1,128}$`)

// GPU is one device registered for placement: a physical GPU, or a MIG
// instance (UUID "MIG-…", Parent and MIGProfile set) of a GPU in MIG mode.
type GPU struct {
	UUID      string // NVML UUID, "GPU-…" or "MIG-…"
	Node      string // Kubernetes node name
	Model     string // NVML product name, e.g. "NVIDIA H200"
	MemoryMiB int64  // allocatable device memory, MiB
	SMCount   int    // streaming multiprocessors
	Healthy   bool   // false: never placed on
	// Mode is, when registering, the mode the reporter asks for ("" = no
	// opinion: keep the current one, sliced for a new GPU; SharingMIG for a
	// MIG-enabled GPU and its instances); as read back, the mode in force.
	Mode SharingMode
	// PendingMode is a mode asked for that waits until the GPU holds no
	// server; read back only.
	PendingMode SharingMode
	// MIGProfile and Parent describe a MIG instance; "" for a GPU.
	MIGProfile string
	Parent     string
	// ComputePercent is a MIG instance's SMs as a percent of its GPU's,
	// 1..100, charged to the quotas of the server holding it; 0 otherwise.
	ComputePercent int
}

// Instance reports whether g is a MIG instance.
func (g GPU) Instance() bool { return g.Parent != "" }

// Validate reports every problem with g at once.
func (g GPU) Validate() error {
	var errs []error
	if strings.TrimSpace(g.UUID) == "" {
		errs = append(errs, errors.New("gpu uuid is empty"))
	} else if !gpuUUID.MatchString(g.UUID) {
		errs = append(errs, fmt.Errorf("gpu uuid %q is not GPU- or MIG- followed by letters, digits, '.', '_' or '-' (at most 128)", g.UUID))
	}
	if strings.TrimSpace(g.Node) == "" {
		errs = append(errs, errors.New("gpu node is empty"))
	}
	if g.MemoryMiB <= 0 {
		errs = append(errs, fmt.Errorf("gpu memoryMiB must be > 0, got %d", g.MemoryMiB))
	}
	if g.SMCount <= 0 {
		errs = append(errs, fmt.Errorf("gpu smCount must be > 0, got %d", g.SMCount))
	}
	if g.Mode != "" && !g.Mode.Valid() {
		errs = append(errs, fmt.Errorf("gpu mode must be one of %s, got %q", modeList(), g.Mode))
	}
	switch {
	case g.Parent == "" && g.MIGProfile != "":
		errs = append(errs, fmt.Errorf("gpu %s has MIG profile %q but no parent GPU; only a MIG instance has a profile", g.UUID, g.MIGProfile))
	case g.Parent != "":
		if err := ValidateMIGProfile(g.MIGProfile); err != nil {
			errs = append(errs, fmt.Errorf("MIG instance %s: %w", g.UUID, err))
		}
		if g.Mode != SharingMIG {
			errs = append(errs, fmt.Errorf("MIG instance %s must be in mode mig, got %q", g.UUID, g.Mode))
		}
		if !gpuUUID.MatchString(g.Parent) || g.Parent == g.UUID {
			errs = append(errs, fmt.Errorf("MIG instance %s: parent gpu uuid %q is not another GPU's uuid", g.UUID, g.Parent))
		}
		if g.ComputePercent < 1 || g.ComputePercent > 100 {
			errs = append(errs, fmt.Errorf("MIG instance %s: computePercent (its share of the GPU's SMs) must be 1..100, got %d", g.UUID, g.ComputePercent))
		}
	case g.ComputePercent != 0:
		errs = append(errs, fmt.Errorf("gpu %s: computePercent is for MIG instances only, got %d", g.UUID, g.ComputePercent))
	}
	return errors.Join(errs...)
}

// Slice is a share of one GPU: a memory cap in MiB and compute percents.
// It is the wire type; see v1.Slice for field ranges.
type Slice = v1.Slice

// ValidateSlice reports every problem with s at once, one per field (see
// SliceProblems), each as "slice <field> <problem>".
func ValidateSlice(s Slice) error {
	var errs []error
	for _, p := range SliceProblems(s) {
		errs = append(errs, fmt.Errorf("slice %s %s", p.Field, p.Message))
	}
	return errors.Join(errs...)
}

// FieldProblem is one invalid field: its JSON name and what is wrong.
type FieldProblem struct {
	Field   string // e.g. "computePercent"
	Message string // e.g. "must be 1..100, got 101"
}

// SliceProblems lists what is wrong with s, at most one problem per field:
// memoryMiB > 0, computePercent 1..100, computeLimitPercent
// computePercent..100. The limit is held against the guarantee only when
// the guarantee itself is valid, so one bad value is one problem.
func SliceProblems(s Slice) []FieldProblem {
	var out []FieldProblem
	if s.MemoryMiB <= 0 {
		out = append(out, FieldProblem{"memoryMiB", fmt.Sprintf("must be > 0, got %d", s.MemoryMiB)})
	}
	okCompute := s.ComputePercent >= 1 && s.ComputePercent <= 100
	if !okCompute {
		out = append(out, FieldProblem{"computePercent", fmt.Sprintf("must be 1..100, got %d", s.ComputePercent)})
	}
	switch {
	case s.ComputeLimitPercent < 1 || s.ComputeLimitPercent > 100:
		out = append(out, FieldProblem{"computeLimitPercent", fmt.Sprintf("must be 1..100, got %d", s.ComputeLimitPercent)})
	case okCompute && s.ComputeLimitPercent < s.ComputePercent:
		out = append(out, FieldProblem{"computeLimitPercent", fmt.Sprintf("must be at least computePercent (%d), got %d", s.ComputePercent, s.ComputeLimitPercent)})
	}
	return out
}

// Policy chooses among the GPUs that fit a slice.
type Policy string

const (
	// PolicyBinpack puts a slice on the fitting GPU with the least free
	// memory, keeping whole GPUs free for large slices. The default.
	PolicyBinpack Policy = "binpack"
	// PolicySpread puts a slice on the fitting GPU with the most free memory.
	PolicySpread Policy = "spread"
)

// Valid reports whether p is a known policy.
func (p Policy) Valid() bool { return p == PolicyBinpack || p == PolicySpread }

// Quota caps what a user or a group may hold at once. A zero field means
// unlimited.
type Quota struct {
	Servers        int   // running or starting servers
	MemoryMiB      int64 // total slice memory, MiB
	ComputePercent int   // total guaranteed compute, percent of one GPU
}

// Quotas are the configured caps. A user's own entry replaces DefaultUser;
// group caps are shared by all members of the group.
type Quotas struct {
	DefaultUser Quota
	Users       map[string]Quota
	Groups      map[string]Quota
}

// ForUser returns the caps that apply to a user in the given groups: the
// user's cap and the caps of those groups that have one, sorted by group name.
func (q Quotas) ForUser(user string, groups []string) (Quota, map[string]Quota) {
	uq, ok := q.Users[user]
	if !ok {
		uq = q.DefaultUser
	}
	gq := map[string]Quota{}
	for _, g := range groups {
		if c, ok := q.Groups[g]; ok {
			gq[g] = c
		}
	}
	return uq, gq
}

// PlaceRequest asks for a slice on one GPU.
type PlaceRequest struct {
	SliceID string // the server's spawn id; unique
	User    string
	// Sharing is the sharing mode asked for; "" means SharingSliced. Only
	// GPUs (or MIG instances) in this mode are considered.
	Sharing SharingMode
	// MIGProfile is the MIG profile asked for when Sharing is SharingMIG.
	MIGProfile string
	// Slice is the share asked for (sliced and mps). For exclusive and mig
	// the device is held whole and the allocation's slice is its size;
	// Slice is ignored.
	Slice Slice
	// Model, when set, restricts placement to GPUs of exactly this model.
	Model  string
	Policy Policy // "" means PolicyBinpack
	// UserQuota and GroupQuotas are checked and charged in the same atomic
	// step as placement.
	UserQuota   Quota
	GroupQuotas map[string]Quota
}

// Allocation is a placed slice.
type Allocation struct {
	SliceID string
	User    string
	Groups  []string // groups charged, sorted
	Slice   Slice
	GPUUUID string
	Node    string
	// Model is the GPU's model as registered; set by the store, ignored by
	// Restore.
	Model string
	// Sharing is the mode of the GPU when the slice was placed; "" reads
	// as SharingSliced (allocations made before sharing modes).
	Sharing SharingMode
	// MIGProfile and Parent describe the MIG instance of a mig allocation.
	MIGProfile string
	Parent     string
}

// SortedGroups returns the names of m sorted, for deterministic charging.
func SortedGroups(m map[string]Quota) []string {
	return slices.Sorted(maps.Keys(m))
}

// GPUFromWire converts the wire form of a GPU (v1.GPU: the API's, and the
// node agents' reports) to the domain's. It is the one converter in this
// direction; Wire is its inverse.
func GPUFromWire(g v1.GPU) GPU {
	return GPU{UUID: g.UUID, Node: g.Node, Model: g.Model, MemoryMiB: g.MemoryMiB, SMCount: g.SMCount, Healthy: g.Healthy,
		Mode: g.Mode, PendingMode: g.PendingMode, MIGProfile: g.MIGProfile, Parent: g.ParentUUID, ComputePercent: g.ComputePercent}
}

// Wire returns g's wire form (see GPUFromWire).
func (g GPU) Wire() v1.GPU {
	return v1.GPU{UUID: g.UUID, Node: g.Node, Model: g.Model, MemoryMiB: g.MemoryMiB, SMCount: g.SMCount, Healthy: g.Healthy,
		Mode: g.Mode, PendingMode: g.PendingMode, MIGProfile: g.MIGProfile, ParentUUID: g.Parent, ComputePercent: g.ComputePercent}
}
