package servers

import (
	"context"
	"errors"
	"fmt"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// HandlePodEvent moves the server that owns a pod along its lifecycle. An
// event for a spawn that is no longer the server's current one is ignored,
// as is an event that the server's state has already passed. It returns an
// error only when storage failed, so the caller can retry.
//
// The gone event of the pod a failed spawn left terminating (fail) frees
// the slice the failed record still holds (freeFailed).
//
// A pod that has ended but is still there, held by
// v1.FinalizerServerRecord (ev.Held with spawner.PhaseGone), is released
// by the call that records its end: the one whose transition moved the
// record of its spawn to stopped or failed (Store.Advance), see
// releaseEnded. Other calls for the same end (a reconcile pass's replay, a
// Lease handover: broker/internal/app applies the events on the holder
// only), which find the end recorded already or record it a second time,
// do not release it, and do not read the record back: one release request
// per ended pod in all, not one per call. A pod whose
// record is terminal or has moved on to another spawn when the event
// arrives (its end recorded by another call that did not release it: it
// crashed, its release failed) is released by a reconcile pass
// (broker/internal/reconcile): one that failed release asked for at once,
// else the leader's, within one pass interval. A pod without a
// record (Redis lost it) is left to the reconciler, which rebuilds the
// record from the pod and then releases it; the event asks for a pass now.
//
// The events of a spawn going as planned (the pod's progress while the
// record is starting, and its start) are applied in one store call
// (applyDirect); any other case reads the record first.
func (s *Service) HandlePodEvent(ctx context.Context, ev spawner.PodEvent) error {
	if done, err := s.applyDirect(ctx, ev); done {
		return err
	}
	key := fleet.ServerKey{User: ev.User, Name: ev.Server}
	rec, err := s.store.GetServer(ctx, key)
	if errors.Is(err, fleet.ErrNotFound) {
		if ev.Phase == spawner.PhaseGone && ev.Held {
			s.kick() // the reconciler records the pod's end, then releases it
		}
		return nil // the reconciler restores records of pods it finds
	}
	if err != nil {
		return fmt.Errorf("pod event %s: %w", ev.Pod, err)
	}
	if rec.SpawnID == ev.SpawnID && rec.State == v1.StateFailed && rec.Allocation != nil && ev.Phase == spawner.PhaseGone {
		return s.freeFailed(ctx, rec, ev.Held) // the pod a failed spawn left is gone
	}
	if rec.SpawnID != ev.SpawnID || fleet.Terminal(rec.State) {
		return nil // nothing left to record; a held pod is the pass's to release
	}
	return s.apply(ctx, rec, ev)
}

// applyDirect applies a pod event without reading the record first when
// the record is where a spawn going as planned has it: a pending or
// starting pod's message on a starting record (written only when it
// differs), or a running pod moving a starting record to running (which
// counts the spawn). Those are most events, and each takes one call to the
// store instead of a read and a write. It reports false, having written
// nothing, when the record is elsewhere (creating, running already,
// another spawn's, none): HandlePodEvent then reads it and decides as
// for any event. A storage failure is reported as done, with its error.
func (s *Service) applyDirect(ctx context.Context, ev spawner.PodEvent) (bool, error) {
	key := fleet.ServerKey{User: ev.User, Name: ev.Server}
	var err error
	switch ev.Phase {
	case spawner.PhasePending, spawner.PhaseStarting:
		_, err = s.store.SetMessage(ctx, key, ev.SpawnID, v1.StateStarting, ev.Message)
	case spawner.PhaseRunning:
		url, pod := ev.URL, ev.Pod
		var out fleet.Server
		out, err = s.store.MoveFrom(ctx, key, ev.SpawnID, v1.StateStarting, v1.StateRunning,
			fmt.Sprintf("running at %s", ev.URL), fleet.ServerPatch{URL: &url, Pod: &pod})
		if err == nil {
			// Only the call that moved the state counts the spawn.
			s.metrics.ObserveSpawn(out.Profile, OutcomeRunning, out.UpdatedAt.Sub(out.CreatedAt))
		}
	default:
		return false, nil
	}
	if errors.Is(err, fleet.ErrConflict) || errors.Is(err, fleet.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return true, fmt.Errorf("pod event %s: %w", ev.Pod, err)
	}
	return true, nil
}

// apply acts on one pod observation for the record of the same spawn. The
// call that records the server's end releases the pod (releaseEnded).
func (s *Service) apply(ctx context.Context, rec fleet.Server, ev spawner.PodEvent) error {
	var err error
	podUp := ev.Phase == spawner.PhasePending || ev.Phase == spawner.PhaseStarting || ev.Phase == spawner.PhaseRunning
	if rec.State == v1.StateCreating && podUp {
		// The pod exists although the create step that made it did not
		// record so (a crash between the two): catch up.
		pod := ev.Pod
		rec, err = s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateStarting, "pod created; waiting for it to start", fleet.ServerPatch{Pod: &pod})
		if err != nil {
			return ignoreConflict(err)
		}
	}
	switch ev.Phase {
	case spawner.PhasePending, spawner.PhaseStarting:
		// A record that says this already (another replica handled the
		// same event first) needs no write: the store would answer it
		// as done without a new event.
		if rec.State == v1.StateStarting && rec.Message != ev.Message {
			_, err = s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateStarting, ev.Message, fleet.ServerPatch{})
		}
	case spawner.PhaseRunning:
		if rec.State == v1.StateStarting {
			url, pod := ev.URL, ev.Pod
			var out fleet.Server
			var moved bool
			out, moved, err = s.store.Advance(ctx, rec.ServerKey, rec.SpawnID, v1.StateRunning,
				fmt.Sprintf("running at %s", ev.URL), fleet.ServerPatch{URL: &url, Pod: &pod})
			if err == nil && moved {
				// Only the replica whose transition moved the state
				// counts the spawn (another one that handled the same
				// pod event finds it running already).
				s.metrics.ObserveSpawn(out.Profile, OutcomeRunning, out.UpdatedAt.Sub(out.CreatedAt))
			}
		}
	case spawner.PhaseFailed:
		switch rec.State {
		case v1.StateRunning:
			err = s.stopAfterPodEnd(ctx, rec, "the notebook stopped: "+ev.Message, true)
		case v1.StateStarting, v1.StateCreating:
			s.fail(ctx, rec, errors.New(ev.Message), podMayRun)
		}
	case spawner.PhaseGone:
		switch rec.State {
		case v1.StateStopping:
			_, err = s.finishStop(ctx, rec, stoppedMessage(rec), ev.Held)
		case v1.StateRunning:
			err = s.stopAfterPodEnd(ctx, rec, "the pod was deleted outside gpubroker", ev.Held)
		default:
			// Starting, or a record behind its pod (creating, or pending
			// and placing after writes were lost): the pod ended before
			// it ran the notebook.
			s.fail(ctx, rec, errors.New("the pod was deleted before it started"), endedPod(ev.Held))
		}
	}
	return ignoreConflict(err)
}

// Resume catches up a server record that fell behind its pod: a record
// still pending or placing although the pod of its spawn exists. That
// happens only when writes that came after a confirmed placement were lost
// (a Redis failover that promoted a replica missing them), since a live
// spawn creates its pod only after recording creating. The record moves to
// creating with alloc (the pod's slice, which the caller restored), from
// where the pod's events carry it on. It reports whether it moved the
// record; a record in any other state, or that moved on meanwhile, is left
// alone.
func (s *Service) Resume(ctx context.Context, rec fleet.Server, alloc fleet.Allocation) (bool, error) {
	var err error
	switch rec.State {
	case v1.StatePending:
		rec, err = s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StatePlacing, "resumed from its pod after the store lost its progress", fleet.ServerPatch{})
		if err != nil {
			return false, ignoreConflict(err)
		}
	case v1.StatePlacing:
	default:
		return false, nil
	}
	msg := fmt.Sprintf("placed %d MiB and %d%% compute on GPU %s (node %s); the pod exists (resumed after the store lost its progress)",
		alloc.Slice.MemoryMiB, alloc.Slice.ComputePercent, alloc.GPUUUID, alloc.Node)
	if _, err := s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateCreating, msg, fleet.ServerPatch{Allocation: &alloc}); err != nil {
		return false, ignoreConflict(err)
	}
	s.log.WarnContext(ctx, "server record resumed from its pod", "user", rec.User, "server", rec.Name, "spawn_id", rec.SpawnID)
	return true, nil
}

// ignoreConflict drops a refused transition: another replica or request
// moved the server on first, and its view wins.
func ignoreConflict(err error) error {
	if errors.Is(err, fleet.ErrConflict) {
		return nil
	}
	return err
}

// stopAfterPodEnd records that a running server's pod ended by itself: the
// pod (if any is left) is deleted and the slice released. held says that
// a pod may be left for gpubroker's finalizer once its deletion is asked
// for (the event's pod was held, or it was still there): the call that
// records the stop then releases it (finishStop).
func (s *Service) stopAfterPodEnd(ctx context.Context, rec fleet.Server, message string, held bool) error {
	rec, err := s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateStopping, message, fleet.ServerPatch{})
	if err != nil {
		return err
	}
	if err := s.pods.Delete(ctx, rec.User, rec.Name, rec.SpawnID); err != nil {
		return fmt.Errorf("server %s/%s: delete ended pod: %w", rec.User, rec.Name, err)
	}
	if s.podPresent(ctx, rec) {
		return nil
	}
	_, err = s.finishStop(ctx, rec, message, held)
	return err
}
