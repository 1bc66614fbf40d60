package reconcile

import (
	"context"
	"fmt"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// release removes the finalizer of ended pod p (of spawnID; "" skips the
// check), counting it in rep or its failure in errs.
func (r *Reconciler) release(ctx context.Context, p spawner.ManagedPod, spawnID string, rep *Report, errs *[]error) {
	if !p.Held {
		return
	}
	if err := r.pods.ReleasePod(ctx, p.Name, spawnID); err != nil {
		*errs = append(*errs, fmt.Errorf("release ended pod %s: %w", p.Name, err))
		return
	}
	rep.ReleasedPods++
}

// restoreEnded rebuilds the record of ended pod p, whose server Redis
// lost, as stopped (the notebook had run) or failed (it had not), without
// a slice, and then releases the pod. A record that exists by then (a
// create, or another replica's pass) is left as it is: it is the server's,
// and the record-settling steps finish it.
func (r *Reconciler) restoreEnded(ctx context.Context, p spawner.ManagedPod, now time.Time, rep *Report, errs *[]error) {
	restored, err := r.store.RestoreServer(ctx, endedRecordOf(p, now))
	if err != nil {
		*errs = append(*errs, fmt.Errorf("restore server of ended pod %s: %w", p.Name, err))
		return
	}
	if restored {
		rep.RestoredServers++
		r.log.InfoContext(ctx, "restored the record of a server whose pod ended while Redis had lost it",
			"user", p.User, "server", p.Server, "spawn_id", p.SpawnID, "pod", p.Name)
	}
	r.release(ctx, p, p.SpawnID, rep, errs)
}

// recordMayBeLost reports whether the record of pod p's server can have
// been lost with Redis's data: p was created before the reconcile epoch
// began (the epoch is new after every loss; fleet.EpochBegan), or within
// fleet.PodCreateWindow after it (a spawn placed before the loss may create
// its pod that long after its placement), or the epoch's start cannot be
// read. A pod created later had its record written in this epoch, so a
// missing record was removed by its owner, not lost.
func recordMayBeLost(p spawner.ManagedPod, epoch string) bool {
	began, ok := fleet.EpochBegan(epoch)
	return !ok || p.CreatedAt.Before(began.Add(fleet.PodCreateWindow))
}

// endedRecordOf rebuilds the record of ended pod p at now: stopped when
// its notebook had run (spawner.ManagedPod.Ran), else failed; no slice,
// no URL. A failed record forgets the create's idempotency key, as a
// failed spawn does, so a retry starts the server again.
func endedRecordOf(p spawner.ManagedPod, now time.Time) fleet.Server {
	rec := fleet.Server{
		ServerKey: fleet.ServerKey{User: p.User, Name: p.Server},
		Profile:   p.Profile, SpawnID: p.SpawnID, IdempotencyKey: p.IdempotencyKey,
		State:   v1.StateStopped,
		Message: "stopped: the pod ended while the broker's store had lost this server (its record was rebuilt from the pod)",
		Slice:   p.Slice, Pod: p.Name, Sharing: p.Sharing, MIGProfile: p.MIGProfile,
		CreatedAt: p.CreatedAt, UpdatedAt: now,
	}
	if !p.Ran {
		rec.State, rec.IdempotencyKey = v1.StateFailed, ""
		rec.Message = "the pod ended before the notebook started, while the broker's store had lost this server (its record was rebuilt from the pod); start the server again"
	}
	return rec
}
