package servers

// Stopping a server: the pod deleted (never the user's volumes), the slice
// released once the pod is gone, the record settled.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// Delete stops a server for by: it deletes the pod (never the user's
// volumes) and releases the slice once the pod is gone. It is idempotent
// and works on half-created servers and on pods that vanished; a stopped
// or failed server is returned as it is (a failed one keeps its reason
// until the next start). fleet.ErrNotFound only if the server never
// existed. A stop that does something is audited.
func (s *Service) Delete(ctx context.Context, by audit.Actor, key fleet.ServerKey) (fleet.Server, error) {
	rec, err := s.store.GetServer(ctx, key)
	if err != nil || fleet.Terminal(rec.State) {
		return rec, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	from := rec.State
	out, err := s.stop(ctx, by, rec)
	s.record(ctx, by, auditStop, key, map[string]string{"spawnId": rec.SpawnID, "state": string(from)}, err)
	return out, err
}

// stop takes a live record to stopping, deletes its pod and, once the pod
// is gone, releases the slice. A record stopped while creating keeps its
// slice although no pod is found, while its spawn may still create one.
func (s *Service) stop(ctx context.Context, by audit.Actor, rec fleet.Server) (fleet.Server, error) {
	key := rec.ServerKey
	// A spawn in creating may still make its pod (up to
	// fleet.PodCreateWindow after creating was recorded, RebuildFence with
	// the clocks' slack): finding no pod then does not free the slice. So
	// may one stopped while creating, which an earlier stop left stopping
	// with its allocation and no pod name (UpdatedAt is then that stop's,
	// later than creating's: the window only grows).
	mayCreate := (rec.State == v1.StateCreating || rec.State == v1.StateStopping && rec.Pod == "" && rec.Allocation != nil) &&
		s.now().Sub(rec.UpdatedAt) <= fleet.RebuildFence
	var err error
	if rec.State != v1.StateStopping {
		rec, err = s.store.Transition(ctx, key, rec.SpawnID, v1.StateStopping, msgStopping+byText(by, key.User), fleet.ServerPatch{})
		if err != nil {
			return rec, unknown(err, key.Name+" may or may not be stopping")
		}
	}
	if err := s.pods.Delete(ctx, key.User, key.Name, rec.SpawnID); err != nil {
		if errors.Is(err, spawner.ErrUnavailable) {
			// Stopping is recorded: the reconciler deletes the pod of a
			// stopping server once the API server answers again.
			err = &fleet.UnavailableError{Part: fleet.PartKubernetes, Unknown: key.Name + " is stopping, but its pod may not be deleted yet", Err: err}
		}
		return rec, err
	}
	if s.podPresent(ctx, rec) {
		return rec, nil // released when the pod is gone (pod event or reconciler)
	}
	if mayCreate {
		// The spawn deletes the pod it makes after this stop (spawn), and
		// the pod's end finishes the stop; a spawn that makes none leaves
		// the record to the reconciler, which finishes it once it has been
		// quiet for its grace period.
		return rec, nil
	}
	// No live pod is left: none, or one that ended and is held for
	// gpubroker's finalizer, which this call releases if it records the stop.
	out, err := s.finishStop(ctx, rec, "stopped", true)
	if errors.Is(err, fleet.ErrNotFound) {
		// Redis lost its data while the stop ran: the pod is gone and the
		// slice with the data, so the stop is done and nothing of the
		// server is left to record. The caller is told it stopped (a
		// 404 would say the server never was).
		stopped := rec
		stopped.State, stopped.Message, stopped.URL, stopped.Allocation = v1.StateStopped, "stopped", "", nil
		s.log.InfoContext(ctx, "stopped a server whose record Redis lost during the stop", "user", key.User, "server", key.Name, "spawn_id", rec.SpawnID)
		return stopped, nil
	}
	if err != nil {
		// The pod is gone; what is left, the reconciler finishes.
		return rec, unknown(err, key.Name+" is stopping, but may not be recorded as stopped yet")
	}
	return out, nil
}

// Remove deletes a stopped or failed server's record and its events, for
// by; nothing else is touched (a stopped server holds no slice, and user
// data is never in the record), except that a pod of the removed spawn
// still held for gpubroker's finalizer is released: its end was recorded
// (the record was terminal), and the call that recorded it may not have
// released it (releaseEnded), so a new start of the name does not wait for
// the reconcile pass to let the old pod go. A live server is a
// *fleet.StateError (stop it first); fleet.ErrNotFound if there is no such
// server. Audited.
func (s *Service) Remove(ctx context.Context, by audit.Actor, key fleet.ServerKey) error {
	rec, err := s.store.GetServer(ctx, key)
	if err != nil {
		return err
	}
	if !fleet.Terminal(rec.State) {
		return &fleet.StateError{Key: key, State: rec.State, SpawnID: rec.SpawnID}
	}
	err = s.store.DeleteServer(ctx, key, rec.SpawnID)
	s.record(ctx, by, auditRemove, key, map[string]string{"spawnId": rec.SpawnID, "state": string(rec.State), "profile": rec.Profile}, err)
	if err == nil {
		// The record is gone: the release must not end with the request
		// (a client that hangs up), or a pass could find the pod without a
		// record and, within PodCreateWindow of a reconcile epoch, restore
		// the server its owner just removed.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		defer cancel()
		s.releaseEnded(rctx, rec)
	}
	return err
}

// podPresent reports whether rec's pod is still there, not ended: a
// lookup by name in the spawner's cache (every stop asks, so a listing of
// the fleet's pods here made each stop cost as much as the fleet is large),
// confirmed with the API server when the cache holds no such pod (it may
// lag: a pod created moments ago, or a watch re-establishing after an API
// server restart; freeing the slice then would let another spawn onto the
// GPU while the pod runs out its grace period). An unsynced cache or a
// failed lookup counts as present, so nothing is released early.
func (s *Service) podPresent(ctx context.Context, rec fleet.Server) bool {
	present, err := s.pods.HasPod(ctx, rec.User, rec.Name, rec.SpawnID)
	return present || err != nil
}

// msgStopping starts the message of a stop that was asked for (who asked
// follows: byText).
const msgStopping = "stopping: deleting the pod"

// stoppedMessage is the final message of a stopping server: "stopped" for
// a stop that was asked for, else the reason it is stopping (the notebook
// ended by itself), so the stopped server still says why.
func stoppedMessage(rec fleet.Server) string {
	if rec.Message == "" || strings.HasPrefix(rec.Message, msgStopping) {
		return "stopped"
	}
	return rec.Message
}

// finishStop releases a stopping server's slice and records it stopped,
// holding no GPU. held says that the server's pod may be left for
// gpubroker's finalizer (ended, its deletion asked for): when this call is
// the one that moved the record to stopped (Store.Advance), it releases
// that pod (releaseEnded); a call that finds it stopped already leaves the
// release to the one that moved it.
func (s *Service) finishStop(ctx context.Context, rec fleet.Server, message string, held bool) (fleet.Server, error) {
	if _, err := s.store.Release(ctx, rec.SpawnID); err != nil {
		return rec, fmt.Errorf("server %s/%s: release slice: %w", rec.User, rec.Name, err)
	}
	out, moved, err := s.store.Advance(ctx, rec.ServerKey, rec.SpawnID, v1.StateStopped, message, fleet.ServerPatch{URL: new(string), DropAllocation: true})
	if err == nil && moved && held {
		s.releaseEnded(ctx, out)
	}
	return out, err
}

// Abandon fails a spawn that was interrupted before its pod existed (a
// broker crash between steps): any pod is deleted and the slice released.
// It is a no-op for a record that moved on meanwhile.
func (s *Service) Abandon(ctx context.Context, rec fleet.Server, reason string) {
	s.fail(ctx, rec, errors.New(reason), podMayRun)
}
