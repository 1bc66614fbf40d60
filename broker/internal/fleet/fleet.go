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

// GPU is one physical device registered for placement.
type GPU struct {
	UUID      string // NVML UUID, "GPU-…"
	Node      string // Kubernetes node name
	Model     string // NVML product name, e.g. "NVIDIA H200"
	MemoryMiB int64  // allocatable device memory, MiB
	SMCount   int    // streaming multiprocessors
	Healthy   bool   // false: never placed on
}

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
	Slice   Slice
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
}

// SortedGroups returns the names of m sorted, for deterministic charging.
func SortedGroups(m map[string]Quota) []string {
	return slices.Sorted(maps.Keys(m))
}
