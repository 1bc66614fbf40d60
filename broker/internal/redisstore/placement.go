package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

func validatePlace(req fleet.PlaceRequest) error {
	var errs []error
	if req.SliceID == "" {
		errs = append(errs, errors.New("slice id is empty"))
	}
	if req.User == "" {
		errs = append(errs, errors.New("user is empty"))
	}
	mode := fleet.ModeOf(req.Sharing)
	switch {
	case !mode.Valid():
		errs = append(errs, fmt.Errorf("unknown sharing mode %q", req.Sharing))
	case mode == fleet.SharingMIG:
		if err := fleet.ValidateMIGProfile(req.MIGProfile); err != nil {
			errs = append(errs, err)
		}
	case fleet.Whole(mode):
	default:
		if err := fleet.ValidateSlice(req.Slice); err != nil {
			errs = append(errs, err)
		}
		if mode == fleet.SharingMPS && req.Slice.ComputeLimitPercent != req.Slice.ComputePercent {
			errs = append(errs, fmt.Errorf("an MPS slice cannot burst: compute limit %d%% must equal its compute %d%%", req.Slice.ComputeLimitPercent, req.Slice.ComputePercent))
		}
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
	op, err := s.placeOp(req)
	if err != nil {
		return fleet.Allocation{}, err
	}
	octx, cancel := context.WithTimeout(ctx, s.opTimeout+s.waitTimeout) // queued and sent, as one call was
	r, err := s.places.do(octx, op)
	cancel()
	if err == nil {
		err = r.err
	}
	if err != nil {
		return fleet.Allocation{}, fmt.Errorf("place slice %s: %w", req.SliceID, err)
	}
	a, refusal, err := placeResult(req, r.reply)
	if err != nil {
		return fleet.Allocation{}, fmt.Errorf("place slice %s: %w", req.SliceID, err)
	}
	if refusal == nil && r.acked < r.want {
		// Fewer replicas than were online acknowledged it. If fewer are
		// online now (one left, or a failover left the new master alone),
		// the placement is on every replica a failover could promote.
		octx, cancel := context.WithTimeout(ctx, s.opTimeout)
		defer cancel()
		if now, err := s.replicas.want(octx, s.rdb, s.waitReplicas, true); err != nil || r.acked < now {
			// Not durable: a failover could lose it while its pod runs.
			_, rerr := s.Release(context.WithoutCancel(ctx), req.SliceID)
			return fleet.Allocation{}, errors.Join(fmt.Errorf("%w: the placement was not confirmed by %d Redis replica(s) within %s (%d did), so no GPU was reserved; try again",
				fleet.ErrUnavailable, r.want, s.waitTimeout, r.acked), err, rerr)
		}
	}
	return a, refusal
}

// placeShared is the KEYS and ARGV of place.lua that are the same for
// every request (runBatch sends them once per batch).
func (s *Store) placeShared() scriptOp {
	return scriptOp{keys: []string{s.k.Marker(), s.k.Allocs(), s.k.Usage()}, args: []any{s.k.GPUPrefix(), s.k.ModePrefix()}}
}

// placeOp validates req and builds its own KEYS and ARGV of place.lua
// (placeShared has the rest).
func (s *Store) placeOp(req fleet.PlaceRequest) (scriptOp, error) {
	if err := validatePlace(req); err != nil {
		return scriptOp{}, fmt.Errorf("%w: place slice %q: %w", fleet.ErrInvalid, req.SliceID, err)
	}
	groups := fleet.SortedGroups(req.GroupQuotas)
	if len(groups) == 0 {
		groups = nil
	}
	head, err := recordHead(fleet.Allocation{SliceID: req.SliceID, User: req.User, Groups: groups})
	if err != nil {
		return scriptOp{}, err
	}
	policy := req.Policy
	if policy == "" {
		policy = fleet.PolicyBinpack
	}
	mode := fleet.ModeOf(req.Sharing)
	kind, shape := "share", ""
	switch {
	case fleet.Whole(mode):
		kind = "whole"
	case mode == fleet.SharingMPS:
		shape = mpsShape(req.Slice)
	}
	scopeA, scopeF := scopeIndexes(s.k, redisschema.Pool(string(mode), req.MIGProfile), req.Model)
	scope := "all"
	if req.Model != "" {
		scope = "model"
	}
	keys := []string{scopeA, scopeF}
	args := make([]any, 0, 15+4*len(groups))
	args = append(args, req.SliceID, head,
		req.Slice.MemoryMiB, req.Slice.ComputePercent, req.Slice.ComputeLimitPercent, string(policy),
		kind, shape, scope, string(mode), 1+len(groups),
		req.User, req.UserQuota.Servers, req.UserQuota.MemoryMiB, req.UserQuota.ComputePercent)
	for _, g := range groups {
		q := req.GroupQuotas[g]
		args = append(args, g, q.Servers, q.MemoryMiB, q.ComputePercent)
	}
	return scriptOp{keys, args}, nil
}

// runPlaces runs one batch of places (placeBatchScript) and, when
// WithWaitReplicas asks for it, WAIT after it.
func (s *Store) runPlaces(ctx context.Context, ops []scriptOp) ([]batchReply, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout+s.waitTimeout)
	defer cancel()
	want, err := s.replicas.want(ctx, s.rdb, s.waitReplicas, false)
	if err != nil {
		return nil, err
	}
	return s.runBatch(ctx, placeScript, placeBatchScript, want, s.placeShared(), ops)
}

// runReleases runs one batch of releases (releaseBatchScript).
func (s *Store) runReleases(ctx context.Context, ops []scriptOp) ([]batchReply, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	return s.runBatch(ctx, releaseScript, releaseBatchScript, 0, s.releaseShared(), ops)
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
		f, err := stringsN(rest, 6)
		if err != nil {
			return fleet.Allocation{}, nil, err
		}
		ce := &fleet.CapacityError{Want: req.Slice, Model: req.Model, Sharing: fleet.ModeOf(req.Sharing), MIGProfile: req.MIGProfile}
		n, err := atoi64("candidates", f[0])
		modeGPUs, err2 := atoi64("mode gpus", f[4])
		allGPUs, err3 := atoi64("all gpus", f[5])
		if err := errors.Join(err, err2, err3); err != nil {
			return fleet.Allocation{}, nil, err
		}
		ce.Candidates, ce.ModeGPUs, ce.AllGPUs = int(n), int(modeGPUs), int(allGPUs)
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

// mpsShape is the client size of an MPS slice as the GPU record holds it:
// every MPS client of a GPU has the same pinned memory limit and active
// thread percentage, because MPS applies its limits per server, not per
// client (see limiter/agent, "MPS").
func mpsShape(s fleet.Slice) string {
	return strconv.FormatInt(s.MemoryMiB, 10) + "/" + strconv.Itoa(s.ComputePercent)
}

// Release frees the slice sliceID and un-charges its GPU, user and groups.
// It is idempotent and reports whether an allocation was freed.
func (s *Store) Release(ctx context.Context, sliceID string) (bool, error) {
	ctx, cancel := s.op(ctx) // queued and sent, as one call was
	defer cancel()
	r, err := s.releases.do(ctx, s.releaseOp(sliceID))
	if err == nil {
		err = r.err
	}
	if err != nil {
		return false, fmt.Errorf("release slice %s: %w", sliceID, err)
	}
	n, err := asInt(r.reply)
	if err != nil {
		return false, fmt.Errorf("release slice %s: %w", sliceID, err)
	}
	return n == 1, nil
}

// releaseShared is the KEYS and ARGV of release.lua that are the same for
// every request (runBatch sends them once per batch).
func (s *Store) releaseShared() scriptOp {
	return scriptOp{keys: []string{s.k.Allocs(), s.k.Usage()}, args: []any{s.k.GPUPrefix()}}
}

// releaseOp is release.lua's own ARGV for sliceID (releaseShared has the
// rest).
func (s *Store) releaseOp(sliceID string) scriptOp {
	return scriptOp{args: []any{sliceID}}
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
	if m := fleet.ModeOf(a.Sharing); !m.Valid() {
		errs = append(errs, fmt.Errorf("unknown sharing mode %q", a.Sharing))
	}
	if err := errors.Join(errs...); err != nil {
		return false, fmt.Errorf("%w: restore slice %q: %w", fleet.ErrInvalid, a.SliceID, err)
	}
	mode := fleet.ModeOf(a.Sharing)
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
		if ref, err = allocRef(a.GPUUUID, a.Node, a.Model, a.MIGProfile, a.Parent); err != nil {
			return false, err
		}
	}
	shape := ""
	if mode == fleet.SharingMPS {
		shape = mpsShape(a.Slice)
	}
	args := []any{a.SliceID, a.GPUUUID, a.Slice.MemoryMiB, a.Slice.ComputePercent, a.Slice.ComputeLimitPercent,
		head, ref, string(mode), shape, userUsage(a.User)}
	for _, g := range rec.Groups {
		args = append(args, groupUsage(g))
	}

	ctx, cancel := s.op(ctx)
	defer cancel()
	res, err := restoreScript.Run(ctx, s.rdb,
		[]string{s.k.Allocs(), s.k.GPU(a.GPUUUID), s.k.Usage()}, args...).Result()
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
		if cur.GPUUUID != a.GPUUUID || cur.Slice != a.Slice || cur.User != a.User || cur.Sharing != mode {
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
	case "mixed":
		f, err := stringsN(rest, 2)
		if err != nil {
			return true, fmt.Errorf("restore slice %s: %w", a.SliceID, err)
		}
		return true, fmt.Errorf("%w: restore slice %s: the pod holds a %s slice, but gpu %s is in %s now", fleet.ErrConflict, a.SliceID, mode, a.GPUUUID, f[1])
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

// AllocationIDs returns the slice id of every allocation, sorted: the
// allocations hash's field names (HKEYS), without reading or decoding the
// allocations themselves, for a caller that only asks which slices are
// held (the reconcile pass: 4,000 allocations' JSON cost it more than the
// rest of its Redis reads).
func (s *Store) AllocationIDs(ctx context.Context) ([]string, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	ids, err := s.rdb.HKeys(ctx, s.k.Allocs()).Result()
	if err != nil {
		return nil, fmt.Errorf("list allocation ids: %w", err)
	}
	slices.Sort(ids)
	return ids, nil
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
