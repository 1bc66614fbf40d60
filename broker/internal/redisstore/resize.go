package redisstore

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

//go:embed scripts/resize.lua
var resizeLua string

var resizeScript = redis.NewScript(libConsts + libLua + serversLua + resizeLua)

// Resize changes the slice of server k's current spawn to req.Slice on the
// GPU it already holds, in one atomic script: the growth (memory and
// guaranteed compute separately) must fit on the GPU next to the other
// slices (Σ memory ≤ the GPU's memory, Σ compute ≤ 100) and within the caps
// of req.UserQuota and req.GroupQuotas for every subject the allocation is
// charged to (a charged group without a cap there is not limited; the
// servers cap is not checked, the count does not change); then the
// allocation, the GPU's counters and indexes, the user and group counters,
// the server record's slice and allocation and its message are updated and
// message is appended to the server's events. A shrink always fits, also
// on an unhealthy GPU; a growth on an unhealthy GPU is refused.
//
// req.SliceID is the spawn id the caller acts for; req.User, req.Model and
// req.Policy are ignored. changed is false when the server already had
// req.Slice (nothing is written). Errors: fleet.ErrInvalid for a bad slice;
// fleet.ErrNotFound for an unknown server; fleet.ErrConflict when the spawn
// is not the current one, the server is not running or holds no
// allocation; *fleet.QuotaError (Want is the growth); fleet.ErrNoCapacity
// when the GPU lacks room, with the room there is in the message;
// fleet.ErrNotReady for a growth while the allocations are being rebuilt
// (the reconcile marker is missing: the GPU's counters may not hold every
// pod's slice yet, so a growth could take room a running pod holds).
func (s *Store) Resize(ctx context.Context, k fleet.ServerKey, req fleet.PlaceRequest, message string) (srv fleet.Server, changed bool, err error) {
	return s.resize(ctx, k, req, message, nil)
}

// UndoResize puts the slice of server k's current spawn back to req.Slice
// after a Resize to from that its pod did not record: the pod still says
// req.Slice, and the GPU's and subjects' counters must charge what the pod
// (and so the node agent) holds. It is Resize without the checks of room,
// quotas and the reconcile marker (undoing a shrink is a growth, and
// refusing it would leave the store charging less than the notebook may
// use), on the condition that the allocation still holds from: when a
// later resize changed it, nothing is written and changed is false with a
// nil error (the later resize owns the slice now). req.UserQuota and
// req.GroupQuotas are ignored. Errors: as Resize's, less the refusals of
// room, quotas and readiness.
func (s *Store) UndoResize(ctx context.Context, k fleet.ServerKey, req fleet.PlaceRequest, from fleet.Slice, message string) (srv fleet.Server, changed bool, err error) {
	return s.resize(ctx, k, req, message, &from)
}

// resize runs resize.lua; undo, when set, is the slice an undo expects.
func (s *Store) resize(ctx context.Context, k fleet.ServerKey, req fleet.PlaceRequest, message string, undo *fleet.Slice) (srv fleet.Server, changed bool, err error) {
	if err := fleet.ValidateSlice(req.Slice); err != nil {
		return fleet.Server{}, false, fmt.Errorf("%w: resize server %s/%s: %w", fleet.ErrInvalid, k.User, k.Name, err)
	}
	cur, err := s.GetServer(ctx, k)
	if err != nil {
		return fleet.Server{}, false, err
	}
	if cur.SpawnID != req.SliceID {
		return fleet.Server{}, false, fmt.Errorf("%w: server %q of %s: spawn %s is no longer current (current spawn %s)", fleet.ErrConflict, k.Name, k.User, req.SliceID, cur.SpawnID)
	}
	if cur.Allocation == nil {
		return fleet.Server{}, false, fmt.Errorf("%w: server %q of %s holds no GPU slice yet", fleet.ErrConflict, k.Name, k.User)
	}
	// Every field of an allocation but the slice is fixed for its spawn,
	// so the record's new allocation is the current one with the new slice.
	alloc := *cur.Allocation
	alloc.Slice = req.Slice
	allocJSON, err := json.Marshal(alloc)
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("resize server %s/%s: encode allocation: %w", k.User, k.Name, err)
	}
	sliceJSON, err := json.Marshal(req.Slice)
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("resize server %s/%s: encode slice: %w", k.User, k.Name, err)
	}
	args := []any{s.k.GPUPrefix(), req.SliceID,
		req.Slice.MemoryMiB, req.Slice.ComputePercent, req.Slice.ComputeLimitPercent,
		string(sliceJSON), string(allocJSON),
		message, unixNano(s.now()), eventMaxLen, s.retention.Milliseconds(),
		1 + len(req.GroupQuotas),
		"user", k.User, req.UserQuota.MemoryMiB, req.UserQuota.ComputePercent}
	for _, g := range fleet.SortedGroups(req.GroupQuotas) {
		q := req.GroupQuotas[g]
		args = append(args, "group", g, q.MemoryMiB, q.ComputePercent)
	}
	if undo != nil {
		args = append(args, "undo", undo.MemoryMiB, undo.ComputePercent, undo.ComputeLimitPercent)
	}
	keys := []string{s.k.Allocs(), s.k.Usage(), s.k.Server(k.User, k.Name), s.k.Events(k.User, k.Name), s.k.Marker()}

	ctx, cancel := s.op(ctx)
	defer cancel()
	res, err := resizeScript.Run(ctx, s.rdb, keys, args...).Result()
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("resize server %s/%s: %w", k.User, k.Name, err)
	}
	srv, changed, refusal, err := resizeResult(k, req, res)
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("resize server %s/%s: %w", k.User, k.Name, err)
	}
	return srv, changed, refusal
}

// resizeResult turns resize.lua's reply into the record, a refusal (a
// domain error whose text is complete) or an error about the reply itself.
func resizeResult(k fleet.ServerKey, req fleet.PlaceRequest, res any) (fleet.Server, bool, error, error) {
	tag, rest, err := tagged(res)
	if err != nil {
		return fleet.Server{}, false, nil, err
	}
	switch tag {
	case "resized", "same":
		if len(rest) < 1 {
			return fleet.Server{}, false, nil, fmt.Errorf("short script reply")
		}
		h, err := flatMap(rest[0])
		if err != nil {
			return fleet.Server{}, false, nil, err
		}
		srv, err := decodeServer(h)
		return srv, tag == "resized", nil, err
	case "notfound":
		return fleet.Server{}, false, fmt.Errorf("%w: user %s has no server %q", fleet.ErrNotFound, k.User, k.Name), nil
	case "moved":
		return fleet.Server{}, false, nil, nil
	case "spawn":
		f, err := stringsN(rest, 1)
		if err != nil {
			return fleet.Server{}, false, nil, err
		}
		return fleet.Server{}, false, fmt.Errorf("%w: server %q of %s: spawn %s is no longer current (current spawn %s)", fleet.ErrConflict, k.Name, k.User, req.SliceID, f[0]), nil
	case "state":
		f, err := stringsN(rest, 1)
		if err != nil {
			return fleet.Server{}, false, nil, err
		}
		return fleet.Server{}, false, fmt.Errorf("%w: server %q of %s is %s; only a running server can be resized", fleet.ErrConflict, k.Name, k.User, f[0]), nil
	case "mode":
		f, err := stringsN(rest, 1)
		if err != nil {
			return fleet.Server{}, false, nil, err
		}
		mode := fleet.SharingMode(f[0])
		return fleet.Server{}, false, fmt.Errorf("%w: server %q of %s is a %s: %s", fleet.ErrConflict, k.Name, k.User, mode.Words(), fleet.ResizeRefusal(mode, "")), nil
	case "noalloc":
		return fleet.Server{}, false, fmt.Errorf("%w: server %q of %s holds no GPU slice", fleet.ErrConflict, k.Name, k.User), nil
	case "notready":
		return fleet.Server{}, false, fmt.Errorf("%w: GPU allocations are being rebuilt from the cluster after Redis lost its data, so a slice cannot grow now; try again in a moment", fleet.ErrNotReady), nil
	case "corrupt":
		f, err := stringsN(rest, 1)
		if err != nil {
			return fleet.Server{}, false, nil, err
		}
		return fleet.Server{}, false, nil, fmt.Errorf("stored allocation %s: %s", req.SliceID, f[0])
	case "gpu":
		f, err := stringsN(rest, 5)
		if err != nil {
			return fleet.Server{}, false, nil, err
		}
		if f[4] != "1" {
			return fleet.Server{}, false, fmt.Errorf("%w: GPU %s on node %s is unhealthy; the slice can shrink but not grow", fleet.ErrNoCapacity, f[0], f[1]), nil
		}
		free, err1 := atoi64("free memory", f[2])
		cpFree, err2 := atoi64("free compute", f[3])
		if err1 != nil || err2 != nil {
			return fleet.Server{}, false, nil, fmt.Errorf("gpu reply: %w", errors.Join(err1, err2))
		}
		return fleet.Server{}, false, &fleet.RoomError{GPU: f[0], Node: f[1], MaxMiB: free, MaxComputePercent: int(cpFree), Want: req.Slice}, nil
	case "quota":
		qe, err := quotaReply(rest)
		if err != nil {
			return fleet.Server{}, false, nil, err
		}
		return fleet.Server{}, false, qe, nil
	default:
		return fleet.Server{}, false, nil, fmt.Errorf("unexpected script reply %q", tag)
	}
}
