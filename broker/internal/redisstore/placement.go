package redisstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// allocRecord is the stored form of a fleet.Allocation, written by
// alloc_json in scripts/lib.lua: its head (recordHead) and the GPU's ref
// (allocRef).
type allocRecord struct {
	allocHead
	GPU   string `json:"gpu"`
	Node  string `json:"node"`
	Model string `json:"model"`
}

// allocHead is the part of an allocRecord that the allocation itself
// gives.
type allocHead struct {
	SliceID             string   `json:"sliceId"`
	User                string   `json:"user"`
	Groups              []string `json:"groups"`
	MemoryMiB           int64    `json:"memoryMiB"`
	ComputePercent      int      `json:"computePercent"`
	ComputeLimitPercent int      `json:"computeLimitPercent"`
}

func decodeAlloc(raw string) (fleet.Allocation, error) {
	var r allocRecord
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return fleet.Allocation{}, fmt.Errorf("decode allocation: %w", err)
	}
	a := fleet.Allocation{
		SliceID: r.SliceID,
		User:    r.User,
		Slice: fleet.Slice{
			MemoryMiB:           r.MemoryMiB,
			ComputePercent:      r.ComputePercent,
			ComputeLimitPercent: r.ComputeLimitPercent,
		},
		GPUUUID: r.GPU,
		Node:    r.Node,
		Model:   r.Model,
	}
	if len(r.Groups) > 0 {
		a.Groups = r.Groups
	}
	return a, nil
}

// The scripts store an allocation as recordHead(...) + ref + "}", where
// ref names the GPU and node; together they are the JSON of allocRecord.
// Splitting it keeps JSON encoding out of Lua: the GPU's ref is built here
// when it registers and stored in its hash.

// recordHead returns the JSON of a's fields other than the GPU and node,
// without the closing brace and with a trailing comma.
func recordHead(a fleet.Allocation) (string, error) {
	groups := a.Groups
	if groups == nil {
		groups = []string{}
	}
	b, err := json.Marshal(allocHead{a.SliceID, a.User, groups, a.Slice.MemoryMiB, a.Slice.ComputePercent, a.Slice.ComputeLimitPercent})
	if err != nil {
		return "", fmt.Errorf("encode allocation: %w", err)
	}
	return string(b[:len(b)-1]) + ",", nil
}

// allocRef returns the JSON members "gpu":…,"node":…,"model":… that end a
// record.
func allocRef(gpu, node, model string) (string, error) {
	b, err := json.Marshal(struct {
		GPU   string `json:"gpu"`
		Node  string `json:"node"`
		Model string `json:"model"`
	}{gpu, node, model})
	if err != nil {
		return "", fmt.Errorf("encode gpu ref: %w", err)
	}
	return string(b[1 : len(b)-1]), nil
}

func validatePlace(req fleet.PlaceRequest) error {
	var errs []error
	if req.SliceID == "" {
		errs = append(errs, errors.New("slice id is empty"))
	}
	if req.User == "" {
		errs = append(errs, errors.New("user is empty"))
	}
	if err := fleet.ValidateSlice(req.Slice); err != nil {
		errs = append(errs, err)
	}
	if req.Policy != "" && !req.Policy.Valid() {
		errs = append(errs, fmt.Errorf("unknown placement policy %q", req.Policy))
	}
	checkQuota := func(scope string, q fleet.Quota) {
		if q.Servers < 0 || q.MemoryMiB < 0 || q.ComputePercent < 0 {
			errs = append(errs, fmt.Errorf("%s quota has a negative cap: %+v", scope, q))
		}
	}
	checkQuota("user "+req.User, req.UserQuota)
	for g, q := range req.GroupQuotas {
		if g == "" {
			errs = append(errs, errors.New("group name is empty"))
		}
		checkQuota("group "+g, q)
	}
	return errors.Join(errs...)
}

// Place allocates req.Slice on one GPU, checking and charging the user's
// and every group's quota, in one atomic script; with any number of
// concurrent callers no GPU is overcommitted and no quota exceeded.
//
// It returns the existing allocation if req.SliceID is already allocated
// (whatever the rest of req says). Errors: fleet.ErrInvalid for a bad
// request; fleet.ErrNotReady while the reconcile marker is missing;
// *fleet.QuotaError (user caps first, then groups in name order; servers,
// then memoryMiB, then computePercent); *fleet.CapacityError when no healthy
// GPU (of req.Model, if set) has both the memory and the compute free.
//
// Policy binpack (the default) picks the fitting GPU with the least free
// memory, spread the one with the most; ties go to the smaller uuid.
func (s *Store) Place(ctx context.Context, req fleet.PlaceRequest) (fleet.Allocation, error) {
	if err := validatePlace(req); err != nil {
		return fleet.Allocation{}, fmt.Errorf("%w: place slice %q: %w", fleet.ErrInvalid, req.SliceID, err)
	}
	groups := fleet.SortedGroups(req.GroupQuotas)
	if len(groups) == 0 {
		groups = nil
	}
	head, err := recordHead(fleet.Allocation{SliceID: req.SliceID, User: req.User, Groups: groups, Slice: req.Slice})
	if err != nil {
		return fleet.Allocation{}, err
	}
	policy := req.Policy
	if policy == "" {
		policy = fleet.PolicyBinpack
	}
	scopeA, scopeF := scopeIndexes(s.k, req.Model)
	keys := []string{s.k.Marker(), s.k.Allocs(), scopeA, scopeF, s.k.AllAvail(), s.k.AllFull(), s.k.Usage()}
	args := make([]any, 0, 13+6*len(groups))
	args = append(args, s.k.GPUPrefix(), req.SliceID, head,
		req.Slice.MemoryMiB, req.Slice.ComputePercent, string(policy), 1+len(groups),
		"user", req.User, userUsage(req.User),
		req.UserQuota.Servers, req.UserQuota.MemoryMiB, req.UserQuota.ComputePercent)
	for _, g := range groups {
		q := req.GroupQuotas[g]
		args = append(args, "group", g, groupUsage(g), q.Servers, q.MemoryMiB, q.ComputePercent)
	}

	ctx, cancel := s.op(ctx)
	defer cancel()
	res, err := placeScript.Run(ctx, s.rdb, keys, args...).Result()
	if err != nil {
		return fleet.Allocation{}, fmt.Errorf("place slice %s: %w", req.SliceID, err)
	}
	a, refusal, err := placeResult(req, res)
	if err != nil {
		return fleet.Allocation{}, fmt.Errorf("place slice %s: %w", req.SliceID, err)
	}
	return a, refusal
}

// placeResult turns place.lua's reply into an allocation, a refusal (a
// domain error whose text is complete, returned as is) or an error about
// the reply itself.
func placeResult(req fleet.PlaceRequest, res any) (fleet.Allocation, error, error) {
	tag, rest, err := tagged(res)
	if err != nil {
		return fleet.Allocation{}, nil, err
	}
	switch tag {
	case "placed", "exists":
		f, err := stringsN(rest, 1)
		if err != nil {
			return fleet.Allocation{}, nil, err
		}
		a, err := decodeAlloc(f[0])
		return a, nil, err
	case "notready":
		return fleet.Allocation{}, fmt.Errorf("%w: GPU allocations are being rebuilt from the cluster after Redis lost its data; try again in a moment", fleet.ErrNotReady), nil
	case "quota":
		qe, err := quotaReply(rest)
		if err != nil {
			return fleet.Allocation{}, nil, err
		}
		return fleet.Allocation{}, qe, nil
	case "capacity":
		f, err := stringsN(rest, 4)
		if err != nil {
			return fleet.Allocation{}, nil, err
		}
		ce := &fleet.CapacityError{Want: req.Slice, Model: req.Model}
		n, err := atoi64("candidates", f[0])
		if err != nil {
			return fleet.Allocation{}, nil, err
		}
		ce.Candidates = int(n)
		if n > 0 {
			free, err1 := strconv.ParseFloat(f[1], 64) // a Lua number
			cpFree, err2 := atoi64("free compute", f[2])
			if err := errors.Join(err1, err2); err != nil {
				return fleet.Allocation{}, nil, fmt.Errorf("capacity reply: %w", err)
			}
			ce.LargestFreeMiB = max(int64(free), 0)
			ce.LargestFreeComputePercent = int(max(cpFree, 0))
			ce.LargestNode = f[3]
		}
		return fleet.Allocation{}, ce, nil
	default:
		return fleet.Allocation{}, nil, fmt.Errorf("unexpected script reply %q", tag)
	}
}

// Release frees the slice sliceID and un-charges its GPU, user and groups.
// It is idempotent and reports whether an allocation was freed.
func (s *Store) Release(ctx context.Context, sliceID string) (bool, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	res, err := releaseScript.Run(ctx, s.rdb,
		[]string{s.k.Allocs(), s.k.AllAvail(), s.k.AllFull(), s.k.Usage()},
		s.k.GPUPrefix(), userFieldPrefix, groupFieldPrefix, sliceID).Result()
	if err != nil {
		return false, fmt.Errorf("release slice %s: %w", sliceID, err)
	}
	n, err := asInt(res)
	if err != nil {
		return false, fmt.Errorf("release slice %s: %w", sliceID, err)
	}
	return n == 1, nil
}

// Restore records an allocation that a pod proves exists (the reconciler
// rebuilding Redis from pod annotations), charging GPU, user and groups
// without quota or capacity refusal. It reports whether it recorded
// something; an identical allocation already stored is (false, nil).
//
// Errors: fleet.ErrInvalid for a bad allocation; fleet.ErrNotFound when the
// GPU is not registered (retry after the agent registers it); fleet.ErrConflict
// when a different allocation with the same slice id is stored, or when the
// allocation was recorded (true) but overcommits its GPU, which the caller
// should report.
func (s *Store) Restore(ctx context.Context, a fleet.Allocation) (bool, error) {
	var errs []error
	if a.SliceID == "" {
		errs = append(errs, errors.New("slice id is empty"))
	}
	if a.User == "" {
		errs = append(errs, errors.New("user is empty"))
	}
	if a.GPUUUID == "" {
		errs = append(errs, errors.New("gpu uuid is empty"))
	}
	errs = append(errs, fleet.ValidateSlice(a.Slice))
	if err := errors.Join(errs...); err != nil {
		return false, fmt.Errorf("%w: restore slice %q: %w", fleet.ErrInvalid, a.SliceID, err)
	}
	rec := a
	rec.Groups = slices.Clone(a.Groups)
	slices.Sort(rec.Groups)
	rec.Groups = slices.Compact(rec.Groups)
	if len(rec.Groups) == 0 {
		rec.Groups = nil
	}
	head, err := recordHead(rec)
	if err != nil {
		return false, err
	}
	ref := "" // the GPU's own node
	if a.Node != "" {
		if ref, err = allocRef(a.GPUUUID, a.Node, a.Model); err != nil {
			return false, err
		}
	}
	args := []any{a.SliceID, a.GPUUUID, a.Slice.MemoryMiB, a.Slice.ComputePercent, head, ref, userUsage(a.User)}
	for _, g := range rec.Groups {
		args = append(args, groupUsage(g))
	}

	ctx, cancel := s.op(ctx)
	defer cancel()
	res, err := restoreScript.Run(ctx, s.rdb,
		[]string{s.k.Allocs(), s.k.GPU(a.GPUUUID), s.k.AllAvail(), s.k.AllFull(), s.k.Usage()}, args...).Result()
	if err != nil {
		return false, fmt.Errorf("restore slice %s: %w", a.SliceID, err)
	}
	tag, rest, err := tagged(res)
	if err != nil {
		return false, fmt.Errorf("restore slice %s: %w", a.SliceID, err)
	}
	switch tag {
	case "nogpu":
		return false, fmt.Errorf("%w: restore slice %s: gpu %s is not registered", fleet.ErrNotFound, a.SliceID, a.GPUUUID)
	case "restored":
		return true, nil
	case "exists":
		f, err := stringsN(rest, 1)
		if err != nil {
			return false, fmt.Errorf("restore slice %s: %w", a.SliceID, err)
		}
		cur, err := decodeAlloc(f[0])
		if err != nil {
			return false, fmt.Errorf("restore slice %s: %w", a.SliceID, err)
		}
		if cur.GPUUUID != a.GPUUUID || cur.Slice != a.Slice || cur.User != a.User {
			return false, fmt.Errorf("%w: restore slice %s: stored on gpu %s with %d MiB/%d%% for %s, the pod says gpu %s with %d MiB/%d%% for %s", fleet.ErrConflict, a.SliceID, cur.GPUUUID, cur.Slice.MemoryMiB, cur.Slice.ComputePercent, cur.User,
				a.GPUUUID, a.Slice.MemoryMiB, a.Slice.ComputePercent, a.User)
		}
		return false, nil
	case "overcommit":
		f, err := stringsN(rest, 4)
		if err != nil {
			return true, fmt.Errorf("restore slice %s: %w", a.SliceID, err)
		}
		return true, fmt.Errorf("%w: restore slice %s: gpu %s is overcommitted: %s of %s MiB and %s%% compute allocated", fleet.ErrConflict, a.SliceID, a.GPUUUID, f[1], f[2], f[3])
	default:
		return false, fmt.Errorf("restore slice %s: unexpected script reply %q", a.SliceID, tag)
	}
}

// Allocations returns every allocation, sorted by slice id.
func (s *Store) Allocations(ctx context.Context) ([]fleet.Allocation, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	m, err := s.rdb.HGetAll(ctx, s.k.Allocs()).Result()
	if err != nil {
		return nil, fmt.Errorf("list allocations: %w", err)
	}
	out := make([]fleet.Allocation, 0, len(m))
	for id, raw := range m {
		a, err := decodeAlloc(raw)
		if err != nil {
			return nil, fmt.Errorf("allocation %s: %w", id, err)
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b fleet.Allocation) int { return cmp.Compare(a.SliceID, b.SliceID) })
	return out, nil
}

// Allocation returns the allocation of sliceID, or an error wrapping
// fleet.ErrNotFound.
func (s *Store) Allocation(ctx context.Context, sliceID string) (fleet.Allocation, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	raw, err := s.rdb.HGet(ctx, s.k.Allocs(), sliceID).Result()
	if err != nil {
		return fleet.Allocation{}, notFound(err, "no allocation for slice "+sliceID)
	}
	return decodeAlloc(raw)
}
