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
// is gone, releases the slice.
func (s *Service) stop(ctx context.Context, by audit.Actor, rec fleet.Server) (fleet.Server, error) {
	key := rec.ServerKey
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
	if s.podPresent(rec) {
		return rec, nil // released when the pod is gone (pod event or reconciler)
	}
	out, err := s.finishStop(ctx, rec, "stopped")
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
// by; nothing else is touched (a stopped server holds no pod or slice, and
// user data is never in the record). A live server is a *fleet.StateError
// (stop it first); fleet.ErrNotFound if there is no such server. Audited.
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
	return err
}

// podPresent reports whether the spawner's cache still holds rec's pod (a
// lookup by name: every stop asks, so a listing of the fleet's pods here
// made each stop cost as much as the fleet is large). An unsynced cache
// counts as present, so nothing is released early.
func (s *Service) podPresent(rec fleet.Server) bool {
	present, err := s.pods.HasPod(rec.User, rec.Name, rec.SpawnID)
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
// holding no GPU.
func (s *Service) finishStop(ctx context.Context, rec fleet.Server, message string) (fleet.Server, error) {
	if _, err := s.store.Release(ctx, rec.SpawnID); err != nil {
		return rec, fmt.Errorf("server %s/%s: release slice: %w", rec.User, rec.Name, err)
	}
	return s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateStopped, message, fleet.ServerPatch{URL: new(string), DropAllocation: true})
}

// Abandon fails a spawn that was interrupted before its pod existed (a
// broker crash between steps): any pod is deleted and the slice released.
// It is a no-op for a record that moved on meanwhile.
func (s *Service) Abandon(ctx context.Context, rec fleet.Server, reason string) {
	s.fail(ctx, rec, errors.New(reason), true)
}
