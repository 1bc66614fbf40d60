package servers

// Recording a server's end and letting its pod go: a failed spawn, and who
// removes gpubroker's finalizer (v1.FinalizerServerRecord) from an ended
// pod.
//
// The replica holding the Lease applies the pod events (broker/internal/app),
// but the end of one pod may still be recorded by more than one call: a
// reconcile pass replaying the pod's phase, an old and a new holder for a
// moment, a stop asked for meanwhile. The store moves the record once
// (Store.Advance reports the call that moved it: the mover), and only the
// mover removes the finalizer. The others neither release nor read the
// record back, so an ended pod costs one release request in all, not one
// per call (the release is a JSON patch that the others' patches would
// fail, each failure costing a read). Where the mover never releases (it crashed between recording
// and releasing, its release request failed, the end was recorded by a
// call that knew of no pod held), a reconcile pass does (one asked for at
// once when a release fails, else the leader's periodic pass): it
// releases every ended pod whose record is stopped or failed, has moved on
// to another spawn or is gone (broker/internal/reconcile, ended.go), and
// replays the end of a pod whose record is still live (the pass is then
// the mover, or a later pass finds the record ended). So no pod is held
// longer than about two reconcile intervals after its end is recorded,
// and none is released before.

import (
	"context"
	"fmt"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// podFate is what a failing spawn knows of its pod (Service.fail).
type podFate int

const (
	// noPod: the pod was never made, or it is gone without being held;
	// there is nothing to delete or release.
	noPod podFate = iota
	// podMayRun: the pod may exist and run; it is deleted, and released
	// once the failure is recorded (a pod being deleted can be released at
	// once: its end is recorded by then).
	podMayRun
	// podHeld: the pod ended and may be held for gpubroker's finalizer; it
	// is released once the failure is recorded.
	podHeld
)

// endedPod is the podFate of a pod that a pod event saw end: held for
// gpubroker's finalizer or gone.
func endedPod(held bool) podFate {
	if held {
		return podHeld
	}
	return noPod
}

// fail records a failed spawn and releases what it held. It returns the
// record as last seen; errors are logged, since the caller already has the
// failure to report. A spawn that fails before its pod was made (its
// create never answered success) forgets its idempotency key, so that a
// retry of that create runs again.
//
// pod says what may be left of the spawn's pod. A pod that may run
// (podMayRun) is deleted, and its slice is freed only once it is gone: at
// once when no pod is left, else when its end comes (freeFailed, on the
// pod's gone event; the reconciler frees it should that be missed). The
// failed record keeps its allocation until then. The call that moved the
// record to failed (the winner among replicas and the spawn racing to fail
// it) releases an ended pod at once (releaseEnded), unless its deletion
// failed (it still runs: the reconciler deletes it, then releases it); a
// terminating one is released too, and its gone event, held or not, frees
// the slice. A failed spawn's pod therefore does not stay held until the
// next reconcile pass, where a new start of the server would be refused as
// "still shutting down".
func (s *Service) fail(ctx context.Context, rec fleet.Server, cause error, pod podFate) fleet.Server {
	log := s.log.With("user", rec.User, "server", rec.Name, "spawn_id", rec.SpawnID)
	podLeft, terminating := false, false
	if pod == podMayRun {
		if err := s.pods.Delete(ctx, rec.User, rec.Name, rec.SpawnID); err != nil {
			// The pod may still run on its GPU: its slice stays held, and
			// the reconciler deletes the pod and then frees the slice.
			log.WarnContext(ctx, "delete pod of failed spawn; its slice stays held until the reconciler removes it", "err", err)
			podLeft = true
		} else if s.podPresent(ctx, rec) {
			// Its deletion is asked for, but it may run through its grace
			// period: the slice is freed once it is gone (freeFailed).
			podLeft, terminating = true, true
		}
	}
	if !podLeft {
		if _, err := s.store.Release(ctx, rec.SpawnID); err != nil {
			log.WarnContext(ctx, "release slice of failed spawn", "err", err)
		}
	}
	patch := fleet.ServerPatch{DropAllocation: !podLeft, ForgetIdempotencyKey: starting(rec.State)}
	out, moved, err := s.store.Advance(ctx, rec.ServerKey, rec.SpawnID, v1.StateFailed, fleet.Message(cause), patch)
	if err != nil {
		log.WarnContext(ctx, "record failed spawn", "err", err)
		return rec
	}
	if !moved {
		return out // a replica that found it failed already did not fail it
	}
	s.metrics.ObserveSpawn(out.Profile, outcome(cause), out.UpdatedAt.Sub(out.CreatedAt))
	if pod != noPod && (!podLeft || terminating) {
		// The failure is recorded: a terminating pod need not wait for the
		// finalizer either; its slice stays held until it is gone.
		s.releaseEnded(ctx, rec)
	}
	return out
}

// releaseEnded removes gpubroker's finalizer from the pod of rec's spawn,
// whose end is recorded (rec is stopped or failed, or removed), so the API
// server lets it go once it is deleted; a pod that is gone, not being
// deleted, of another spawn or already released is left alone
// (spawner.Client.ReleasePod). A failure is logged, not returned: the end
// is recorded, and a reconcile pass releases the pod. It asks for one at
// once (WithReconcileTrigger; a triggered pass runs on this replica whether
// or not it holds the Lease), since no other replica retries this release
// and the leader's periodic pass may be far off, or absent while no
// replica holds the Lease.
func (s *Service) releaseEnded(ctx context.Context, rec fleet.Server) {
	pod := spawner.PodName(rec.User, rec.Name)
	if err := s.pods.ReleasePod(ctx, pod, rec.SpawnID); err != nil {
		s.log.WarnContext(ctx, "release the ended pod; a reconcile pass will", "user", rec.User, "server", rec.Name, "spawn_id", rec.SpawnID, "pod", pod, "err", err)
		s.kick()
	}
}

// freeFailed frees the slice of a failed spawn whose pod, still there when
// the spawn failed (fail), is now gone: ev is the pod's gone event for
// record rec, failed and still holding its allocation. More than one call
// may handle the event (ended.go's header); the one whose release freed the
// slice (Store.Release reports it) drops the record's allocation and releases the pod if it is
// held, so an ended pod costs one release request in all. A crash in
// between leaves the record showing an allocation that is free and the pod
// held: the reconciler releases the pod. The error is storage's, for the
// caller to retry.
func (s *Service) freeFailed(ctx context.Context, rec fleet.Server, held bool) error {
	freed, err := s.store.Release(ctx, rec.SpawnID)
	if err != nil {
		return fmt.Errorf("server %s/%s: release slice of failed spawn: %w", rec.User, rec.Name, err)
	}
	if !freed {
		return nil // another replica freed it, or the reconciler did
	}
	if _, err := s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateFailed, rec.Message, fleet.ServerPatch{DropAllocation: true}); err != nil {
		s.log.WarnContext(ctx, "drop the allocation of a failed spawn whose slice was freed", "user", rec.User, "server", rec.Name, "spawn_id", rec.SpawnID, "err", err)
	}
	if held {
		s.releaseEnded(ctx, rec)
	}
	return nil
}
