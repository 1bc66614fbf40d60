package servers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/spawner"
)

// Defaults of ResizeConfig.
const (
	// DefaultResizeWait is how long Resize waits for the node agent to
	// apply a new quota before it answers "pending".
	DefaultResizeWait = time.Second
	// DefaultResizePoll is the interval between reads of the applied
	// quota while Resize waits.
	DefaultResizePoll = 10 * time.Millisecond
	// DefaultResizeDeadline is the deadline a pending answer gives, counted
	// from the answer: the agent applies desired quotas on notification and
	// on every full pass (its --quota-resync, 30 s by default).
	DefaultResizeDeadline = 35 * time.Second
)

// SliceStore is the store's atomic resize (implemented by
// broker/internal/redisstore.Store; see its Resize for the contract).
type SliceStore interface {
	Resize(ctx context.Context, k fleet.ServerKey, req fleet.PlaceRequest, message string) (fleet.Server, bool, error)
	UndoResize(ctx context.Context, k fleet.ServerKey, req fleet.PlaceRequest, from fleet.Slice, message string) (fleet.Server, bool, error)
}

// LiveQuotas is the broker's side of the node agents' live quotas and
// samples (implemented by limiter/agent/agentstore.Store).
type LiveQuotas interface {
	SetDesiredQuota(ctx context.Context, slice string, q v1.Slice) (int64, error)
	AppliedQuota(ctx context.Context, slice string) (agentstore.AppliedQuota, error)
	LatestSample(ctx context.Context, slice string) (agentstore.Sample, error)
}

// SliceAnnotator records a slice in its pod's annotations, the durable
// record of allocations (implemented by spawner.Client): SliceVersion reads
// the pod's resourceVersion and the slice it records, AnnotateSliceAt
// writes on the condition that the version is unchanged (else an error
// wrapping spawner.ErrPodChanged).
type SliceAnnotator interface {
	SliceVersion(ctx context.Context, user, server, spawnID string) (string, v1.Slice, error)
	AnnotateSliceAt(ctx context.Context, user, server, spawnID, resourceVersion string, slice v1.Slice) error
}

// resizeFenceRetries bounds how often Resize starts over when its pod
// changed between reading its version and recording the slice.
const resizeFenceRetries = 5

// ResizeConfig is what Resize needs besides the lifecycle's parts.
type ResizeConfig struct {
	Store  SliceStore
	Quotas LiveQuotas
	Pods   SliceAnnotator
	// Wait bounds how long Resize waits for the agent's acknowledgement;
	// default DefaultResizeWait. Poll is the interval of its reads of the
	// applied quota; default DefaultResizePoll.
	Wait, Poll time.Duration
	// Deadline is added to the answer's time to give a pending answer's
	// deadline; default DefaultResizeDeadline.
	Deadline time.Duration
}

// WithResize enables Resize with c. Without it Resize fails with an
// internal error.
func WithResize(c ResizeConfig) Option {
	if c.Wait <= 0 {
		c.Wait = DefaultResizeWait
	}
	if c.Poll <= 0 {
		c.Poll = DefaultResizePoll
	}
	if c.Deadline <= 0 {
		c.Deadline = DefaultResizeDeadline
	}
	return func(s *Service) { s.resize = &c }
}

// Resize changes the GPU slice of the running server key to want, on the
// GPU it already holds, while the notebook keeps running. by is who asks
// (the user, the hub, an admin, the reclaimer); it is named in the event
// when it is not the server's user, and the resize is audited.
//
// The store checks and charges the change atomically (room on the GPU, the
// user's and groups' quotas for the growth); the pod's annotations are
// updated; the desired quota goes to the node agent (the store's slice
// after that, when another resize of the server overtook this one: the
// answer's Slice); then Resize waits up to ResizeConfig.Wait for the agent
// to apply it and answers applied or pending with a deadline (pending also
// when the acknowledgement cannot be read). Shrinking memory is refused
// unless a fresh sample from the node agent shows the notebook's processes
// use no more than want.MemoryMiB now: "the notebook uses 6144 MiB now; memory cannot
// shrink below that"; with no fresh figure the shrink is refused as well,
// never guessed. Asking for the slice the server has re-sends it to the
// agent and changes nothing else.
//
// Errors: fleet.ErrInvalid (bad names or slice), fleet.ErrNotFound,
// fleet.ErrConflict (not running; memory in use or unknown), fleet.ErrNoCapacity
// (the GPU lacks room), *fleet.QuotaError, fleet.ErrNotReady (a growth while
// the allocations are being rebuilt after Redis lost its data),
// fleet.ErrUnavailable (the pod could not record the slice, so nothing
// changed; or the slice is recorded but the agent could not be told, after
// retries for up to the service's step timeout); others are internal.
func (s *Service) Resize(ctx context.Context, key fleet.ServerKey, want fleet.Slice, by audit.Actor) (fleet.ResizeResult, error) {
	return s.resizeAudited(ctx, key, by, want, func(fleet.Server) (fleet.Slice, error) { return want, nil })
}

// ResizeCompute is Resize of the guaranteed compute and its limit only, of
// spawn spawnID of server key: the memory is the one the server holds when
// the resize reads it, so a memory change made since the caller looked is
// kept (the reclaimer's shrink and restore use it). A server started again
// since (another spawn) is fleet.ErrConflict, untouched.
func (s *Service) ResizeCompute(ctx context.Context, key fleet.ServerKey, spawnID string, computePercent, computeLimitPercent int, by audit.Actor) (fleet.ResizeResult, error) {
	want := fleet.Slice{ComputePercent: computePercent, ComputeLimitPercent: computeLimitPercent}
	return s.resizeAudited(ctx, key, by, want, func(rec fleet.Server) (fleet.Slice, error) {
		if rec.SpawnID != spawnID {
			return fleet.Slice{}, fmt.Errorf("%w: %s was started again (spawn %s, not %s)", fleet.ErrConflict, key.Name, rec.SpawnID, spawnID)
		}
		return fleet.Slice{MemoryMiB: rec.Slice.MemoryMiB, ComputePercent: computePercent, ComputeLimitPercent: computeLimitPercent}, nil
	})
}

// resizeAudited runs resizeSlice and audits it with the slice pick gave
// from the record (asked, as far as it is known, when pick did not run).
func (s *Service) resizeAudited(ctx context.Context, key fleet.ServerKey, by audit.Actor, asked fleet.Slice, pick func(fleet.Server) (fleet.Slice, error)) (fleet.ResizeResult, error) {
	res, want, err := s.resizeSlice(ctx, key, pick, by)
	if want == (fleet.Slice{}) {
		want = asked
	}
	if !errors.Is(err, fleet.ErrInvalid) && !errors.Is(err, fleet.ErrNotFound) {
		in := map[string]string{"memoryMiB": strconv.FormatInt(want.MemoryMiB, 10), "computePercent": strconv.Itoa(want.ComputePercent),
			"computeLimitPercent": strconv.Itoa(want.ComputeLimitPercent)}
		if res.Server.SpawnID != "" {
			in["spawnId"] = res.Server.SpawnID
		}
		s.record(ctx, by, auditResize, key, in, err)
	}
	return res, err
}

func (s *Service) resizeSlice(ctx context.Context, key fleet.ServerKey, pick func(fleet.Server) (fleet.Slice, error), by audit.Actor) (res fleet.ResizeResult, want fleet.Slice, err error) {
	cfg := s.resize
	if cfg == nil {
		return res, want, errors.New("servers: resize is not configured")
	}
	if err := errors.Join(fleet.ValidateName("user", key.User), fleet.ValidateName("server", key.Name)); err != nil {
		return res, want, fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	rec, err := s.store.GetServer(ctx, key)
	if err != nil {
		return res, want, err
	}
	if want, err = pick(rec); err != nil {
		return res, fleet.Slice{}, err
	}
	if err := fleet.ValidateSlice(want); err != nil {
		return res, want, fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	if rec.State != v1.StateRunning || rec.Allocation == nil {
		return res, want, fmt.Errorf("%w: %s %s; only a running server can be resized", fleet.ErrConflict, key.Name, fleet.Doing(rec.State))
	}
	if want.MemoryMiB < rec.Slice.MemoryMiB {
		if err := s.checkMemoryUse(ctx, cfg.Quotas, rec.SpawnID, want.MemoryMiB); err != nil {
			return res, want, err
		}
	}

	msg := fmt.Sprintf("resized to %d MiB and %d%% compute", want.MemoryMiB, want.ComputePercent)
	if want.ComputeLimitPercent > want.ComputePercent {
		msg += fmt.Sprintf(" (up to %d%%)", want.ComputeLimitPercent)
	}
	msg += byText(by, key.User)
	// From the store's change on, a caller that hangs up must not leave it
	// half done: the pod's record, an undo and the agent's quota follow on
	// a detached context (the wait for the agent does not).
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	out, err := s.resizeRecorded(dctx, key, rec, want, msg, by.Name)
	if err != nil {
		return res, want, err
	}
	// The send has a timeout of its own: the pod's write may have taken
	// all of the first (an API server restarting).
	qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer qcancel()
	sent, gen, err := s.sendQuota(qctx, key, rec.SpawnID, want)
	if err != nil {
		s.log.ErrorContext(ctx, "send a recorded resize to the node agent", "user", key.User, "server", key.Name, "slice_id", rec.SpawnID, "err", err)
		return res, want, fmt.Errorf("%w: server %q: the new slice is recorded, but the node agent could not be told (%w); the notebook keeps its old limits until its slice is changed again", fleet.ErrUnavailable, key.Name, err)
	}
	res = fleet.ResizeResult{Server: out, Slice: sent, Generation: gen}
	applied, err := waitApplied(ctx, *cfg, rec.SpawnID, gen)
	if err != nil {
		// Sent, and recorded: only the acknowledgement is unknown.
		s.log.WarnContext(ctx, "read the applied quota after a resize; answering pending", "user", key.User, "server", key.Name, "err", err)
		applied = false
	}
	res.Applied = applied
	if !applied {
		res.Deadline = s.now().Add(cfg.Deadline)
	}
	return res, want, nil
}

// resizeRecorded changes the slice in the store and records it on the pod,
// so that the store never holds a slice the pod does not say (a rebuild
// from pods after Redis lost its data would bring the old one back and
// give the difference away while the notebook runs with the new one).
//
// It reads the pod's resourceVersion first and records the slice on the
// condition that it is unchanged. The reconciler changes it (FenceSlice)
// before it restores a slice from the pod, so a rebuild between the store's
// change and the pod's makes the write fail: Resize then starts over, the
// store check runs again on the rebuilt data, and the pod is written only
// for a slice the store admitted after the rebuild. A turn that starts over
// after an ordinary change of the pod (a status update) finds the store at
// the new slice already and still writes the pod, and so does a retry of a
// resize whose first try died between the store and the pod. Before an
// undo the pod is read again and decides: a write may have been applied
// with its answer lost, or a retry of this resize may have written it.
// When the pod cannot be written, the store is set back to the slice the
// pod says (the larger of both in each resource when it cannot be read)
// and the resize fails (503 class: nothing changed, try again). That undo
// is forced (Store.UndoResize): undoing a shrink is a growth, and the room
// the shrink freed may be taken by then; refusing the undo would leave the
// store charging less than the pod, and so the node agent, grants. It is
// skipped when a later resize changed the store's slice meanwhile.
func (s *Service) resizeRecorded(ctx context.Context, key fleet.ServerKey, rec fleet.Server, want fleet.Slice, msg, actor string) (fleet.Server, error) {
	cfg := s.resize
	log := s.log.With("user", key.User, "server", key.Name, "slice_id", rec.SpawnID)
	userQuota, groupQuotas := s.catalog.Quotas().ForUser(key.User, rec.Allocation.Groups)
	req := fleet.PlaceRequest{SliceID: rec.SpawnID, User: key.User, Slice: want, UserQuota: userQuota, GroupQuotas: groupQuotas}
	var (
		last     error
		out      fleet.Server
		stored   bool        // a turn changed the store: the pod must still be written
		recorded fleet.Slice // the slice the pod says, at its last read
	)
	for range resizeFenceRetries {
		rv, onPod, err := cfg.Pods.SliceVersion(ctx, key.User, key.Name, rec.SpawnID)
		if err != nil {
			log.WarnContext(ctx, "read the pod before a resize", "err", err)
			return fleet.Server{}, fmt.Errorf("%w: server %q: its pod could not be read, so the slice is unchanged; try again", fleet.ErrUnavailable, key.Name)
		}
		recorded = onPod
		var changed bool
		out, changed, err = cfg.Store.Resize(ctx, key, req, msg)
		if err != nil {
			return fleet.Server{}, err
		}
		// The store holds want now. A turn after a refused write, or a
		// resize whose earlier try died between the store and the pod (a
		// replica killed), finds it so already ("same"): unless the pod
		// says want too, it is written.
		stored = stored || changed || onPod != want
		if !stored || onPod == want {
			return out, nil
		}
		last = cfg.Pods.AnnotateSliceAt(ctx, key.User, key.Name, rec.SpawnID, rv, want)
		if last == nil {
			log.InfoContext(ctx, "slice resized", "actor", actor, "mem_mib", want.MemoryMiB, "sm_percent", want.ComputePercent)
			return out, nil
		}
		if !errors.Is(last, spawner.ErrPodChanged) {
			break
		}
	}
	// Read the pod again before any undo: a write whose answer was an
	// error may have been applied (an API server restarting), and after a
	// refused one the pod may say want by now (a retry of this same resize
	// found the store at want and wrote it). The pod decides; unread, the
	// store charges the larger of both slices in each resource.
	_, onPod, err := cfg.Pods.SliceVersion(ctx, key.User, key.Name, rec.SpawnID)
	switch {
	case err == nil && onPod == want:
		log.InfoContext(ctx, "slice resized; its pod says so though this call's write was not answered as done", "actor", actor, "err", last)
		return out, nil
	case err == nil:
		recorded = onPod
	default:
		log.WarnContext(ctx, "read the pod after a failed write of its slice", "err", err)
		recorded = fleet.Slice{MemoryMiB: max(recorded.MemoryMiB, want.MemoryMiB), ComputePercent: max(recorded.ComputePercent, want.ComputePercent),
			ComputeLimitPercent: max(recorded.ComputeLimitPercent, want.ComputeLimitPercent)}
	}
	// The pod says recorded. Put the store back to it, whatever room or
	// quota that takes, unless a later resize moved the store's slice on
	// from want (that one owns it now).
	back := req
	back.Slice = recorded
	_, undone, err := cfg.Store.UndoResize(ctx, key, back, want, "resize undone: its pod could not record it")
	switch {
	case err != nil:
		log.ErrorContext(ctx, "undo a resize the pod did not record", "err", err, "record_err", last)
		return fleet.Server{}, fmt.Errorf("server %s/%s: the pod did not record the new slice (%w) and undoing it failed: %w", key.User, key.Name, last, err)
	case undone:
		log.WarnContext(ctx, "resize undone: the pod did not record it", "err", last)
	default:
		log.WarnContext(ctx, "resize not undone: a later resize changed the slice", "err", last)
	}
	return fleet.Server{}, fmt.Errorf("%w: server %q: the cluster did not record the new slice on its pod, so the slice is unchanged; try again", fleet.ErrUnavailable, key.Name)
}

// sendQuota sends want to the node agent as the desired quota of slice,
// then reads the store's slice back and, while it differs, sends that
// instead (at most resizeFenceRetries times): resizes of one server are
// not serialized, and the one whose send came last may not be the one
// whose store change did. Each resize's last send follows a read that
// comes after its own store change, so the last send of all carries the
// store's final slice. Sends and reads are retried (retried: Redis
// failing over); a read that never succeeds is an error, since the send
// may have been overtaken. It returns the slice and generation sent last.
func (s *Service) sendQuota(ctx context.Context, key fleet.ServerKey, slice string, want fleet.Slice) (fleet.Slice, int64, error) {
	sent := want
	var gen int64
	for range resizeFenceRetries {
		var err error
		if gen, err = retried(ctx, func() (int64, error) { return s.resize.Quotas.SetDesiredQuota(ctx, slice, sent) }); err != nil {
			return sent, 0, err
		}
		cur, err := retried(ctx, func() (fleet.Server, error) {
			cur, err := s.store.GetServer(ctx, key)
			if errors.Is(err, fleet.ErrNotFound) {
				return cur, nil // removed: nothing newer to send for it
			}
			return cur, err
		})
		if err != nil {
			return sent, 0, fmt.Errorf("read the slice back after sending it: %w", err)
		}
		if cur.SpawnID != slice || cur.Allocation == nil || cur.Allocation.Slice == sent {
			break // ended or replaced, or the store's slice was sent
		}
		sent = cur.Allocation.Slice
	}
	return sent, gen, nil
}

// sendBackoff spaces the tries of the agent's quota and its read-back:
// 50 ms doubling, about 25 s over its 10 steps (the call's context, the
// service's step timeout, ends them first). No Cap: wait.Backoff ends its
// steps once the cap is reached.
var sendBackoff = wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 10}

// retried calls f until it succeeds, sendBackoff's steps run out or ctx
// ends; it returns f's last answer (or ctx's error when f never ran).
func retried[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var v T
	err := ctx.Err()
	werr := wait.ExponentialBackoffWithContext(ctx, sendBackoff, func(context.Context) (bool, error) {
		v, err = f()
		return err == nil, nil
	})
	if err == nil && werr != nil {
		err = werr
	}
	return v, err
}

// checkMemoryUse refuses a memory shrink to wantMiB unless a fresh sample
// shows the slice's processes hold at most that much.
func (s *Service) checkMemoryUse(ctx context.Context, q LiveQuotas, slice string, wantMiB int64) error {
	sample, err := q.LatestSample(ctx, slice)
	switch {
	case errors.Is(err, agentstore.ErrNotFound):
		return fmt.Errorf("%w: the notebook's current GPU memory use is unknown (the node agent has reported no sample yet); memory cannot shrink until it is known", fleet.ErrConflict)
	case err != nil:
		return fmt.Errorf("read the notebook's memory use: %w", err)
	case sample.Stale(s.now()):
		return fmt.Errorf("%w: the notebook's current GPU memory use is unknown (the node agent's last sample is from %s); memory cannot shrink until it is known",
			fleet.ErrConflict, sample.At.UTC().Format(time.RFC3339))
	case sample.MemoryUsedMiB == nil:
		why := sample.Missing
		if why == "" {
			why = "not measured"
		}
		return fmt.Errorf("%w: the notebook's current GPU memory use is unknown (%s); memory cannot shrink until it is known", fleet.ErrConflict, why)
	case *sample.MemoryUsedMiB > wantMiB:
		return &fleet.InUseError{UsedMiB: *sample.MemoryUsedMiB, WantMiB: wantMiB}
	}
	return nil
}

// waitApplied polls the applied quota of slice until it reaches gen
// (true), c.Wait passes (false) or ctx ends (its error).
func waitApplied(ctx context.Context, c ResizeConfig, slice string, gen int64) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, c.Wait)
	defer cancel()
	t := time.NewTicker(c.Poll)
	defer t.Stop()
	for {
		a, err := c.Quotas.AppliedQuota(wctx, slice)
		switch {
		case err == nil && a.Generation >= gen:
			return true, nil
		case err != nil && !errors.Is(err, agentstore.ErrNotFound) && wctx.Err() == nil:
			return false, fmt.Errorf("read the applied quota: %w", err)
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			return false, nil
		case <-t.C:
		}
	}
}
