// Package reconcile keeps Redis and the cluster in agreement: pods are the
// durable record of allocations (ARCHITECTURE.md invariant 2).
//
// One pass reads, in this order, the allocations, the server records and the
// pods (from the spawner's synced cache), then:
//   - restores the record and the allocation of every pod whose server is
//     missing from Redis (Redis lost its data), and the allocation of every
//     pod whose record is there but whose slice is not, also of a pod whose
//     record has moved on to another spawn or ended, while that pod is not
//     being deleted (it still runs on its GPU);
//   - resumes records that fell behind their pod (pending or placing while
//     the pod exists: writes lost in a Redis failover after the placement
//     was confirmed), then replays each current pod's phase into its record
//     (events missed while no broker ran), except a running pod whose record
//     the pass read as running (nothing to replay: a steady fleet costs the
//     pass its three reads, not one Redis round trip per server);
//   - settles records whose pod is gone (released, stopped or failed) once
//     the record has been quiet for the grace period (a spawn that recorded
//     creating: at least fleet.RebuildFence, since it may create its pod
//     until fleet.PodCreateWindow after that), so a pod that the cache has
//     not seen yet is never taken for a vanished one;
//   - releases allocations that no record refers to;
//   - before it acts on a pod's absence from the cache (the two steps
//     above), confirms it with a list from the API server itself, read
//     once per pass and only when needed: the cache lags the API server
//     while a watch that broke with an API server restart backs off;
//   - deletes pods that belong to no current spawn, or whose annotations
//     cannot be read, after the grace period, and deletes again the pod of a
//     stopping server that is not being deleted (the stop's deletion did not
//     reach the API server), so every stop finishes;
//   - records the end of every pod that has ended (spawner.Ended: deleted
//     but for v1.FinalizerServerRecord) and then removes that finalizer,
//     so the API server lets the pod go: a pod of the current spawn goes
//     through the lifecycle like its pod event (stopped or failed); a pod
//     whose record Redis lost gets its record rebuilt as stopped or failed
//     (never its slice: it holds none any more); a pod of another spawn,
//     or whose annotations cannot be read, has no end to record. A pod
//     deleted between a loss of Redis's data and the pass that would have
//     rebuilt its record therefore still leaves its server. On the pod
//     event path only the call that recorded the end releases the pod
//     (broker/internal/servers, ended.go); an ended pod whose record is
//     stopped, failed or moved on is this pass's to release, since the
//     call that recorded that end may have died before its release;
//   - deletes Secrets that belong to no pod and no unfinished record once
//     passes have found them so, unchanged, for the grace period (a stop or
//     a failed spawn whose Secret deletion failed, a record Redis lost);
//   - marks the allocations as rebuilt only when every pod's slice is
//     recorded, which is what lets placement resume after Redis lost its data,
//     only if Redis has not lost its data again since the pass began (the
//     reconcile epoch, read first, is unchanged), only once
//     fleet.RebuildFence has passed since the epoch began, so that the pod
//     of a spawn that placed on the lost data and was still creating it is
//     in the pass's read (on a replica that saw the data before, and on a
//     replica's first pass where the cluster holds gpubroker's pods or
//     Secrets: only a fresh install opens at once), and only when the API
//     server's own list holds no pod, not being deleted, without its slice.
//
// Reading allocations before records matters: a create writes its record
// before it places, so an allocation seen first always has its record in the
// later read unless the record really moved on.
//
// A pass reads each record's state, not the whole record
// (Store.ListServerStates): key, spawn id, state and times are all it
// decides on; and of the allocations only their slice ids
// (Store.AllocationIDs), not the allocations.
//
// Every action is idempotent and checked by spawn id in the store, so it is
// safe for several broker replicas to reconcile at once. They do not all
// make the periodic passes, though: each would read the whole fleet every
// interval. Only the replica that leads (SetLeading; the composition root
// follows the Lease the reclaimer runs under) makes them; every replica
// makes its first pass at start and any pass asked for with Trigger, and a
// replica that takes the lead over makes one at once, so when the leader
// dies the next holder of the Lease goes on within the lease duration.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// Store is what a reconcile pass needs from storage.
type Store interface {
	// AllocationIDs returns the slice id of every allocation: which
	// slices are held is all a pass decides on, so it never reads or
	// decodes the allocations themselves.
	AllocationIDs(ctx context.Context) ([]string, error)
	// ListServerStates returns user's records (every user's for "") with
	// at least ServerKey, SpawnID, State, CreatedAt and UpdatedAt set.
	ListServerStates(ctx context.Context, user string) ([]fleet.Server, error)
	Restore(ctx context.Context, a fleet.Allocation) (bool, error)
	RestoreServer(ctx context.Context, s fleet.Server) (bool, error)
	Release(ctx context.Context, sliceID string) (bool, error)
	ReconcileEpoch(ctx context.Context) (epoch string, marked bool, err error)
	MarkReconciledAt(ctx context.Context, epoch string) (bool, error)
}

// Pods lists and deletes notebook pods (spawner.Client). Pods reads the
// informer cache, ListPods the API server itself (see apiView).
// FenceSlice marks a pod and returns it as the API server has it now (see
// Once).
type Pods interface {
	Pods() ([]spawner.ManagedPod, error)
	ListPods(ctx context.Context) ([]spawner.ManagedPod, error)
	FenceSlice(ctx context.Context, name, spawnID string) (spawner.ManagedPod, error)
	// ReleasePod removes v1.FinalizerServerRecord from a deleted pod
	// (spawnID "" skips the spawn check); idempotent.
	ReleasePod(ctx context.Context, name, spawnID string) error
	Delete(ctx context.Context, user, server, spawnID string) error
	DeletePod(ctx context.Context, name, spawnID string) error
	Secrets(ctx context.Context) ([]spawner.ManagedSecret, error)
	DeleteSecret(ctx context.Context, s spawner.ManagedSecret) error
}

// Lifecycle settles one server from what was observed (servers.Service).
// The records Resume and Abandon get are as the pass read them
// (Store.ListServerStates): what they act on is the key, spawn id and
// state; each step they take reads or writes the whole record in the store.
type Lifecycle interface {
	HandlePodEvent(ctx context.Context, ev spawner.PodEvent) error
	Abandon(ctx context.Context, rec fleet.Server, reason string)
	Resume(ctx context.Context, rec fleet.Server, alloc fleet.Allocation) (bool, error)
}

// Metrics receives one measurement per pass (implemented by
// broker/internal/metrics): its duration, the repairs it made by kind
// (Report.Repairs) and whether it failed. It must not block.
type Metrics interface {
	ObserveReconcile(d time.Duration, repairs map[string]int, failed bool)
}

// Report counts what one pass did.
type Report struct {
	Pods, Allocations, Servers      int
	RestoredServers, RestoredSlices int
	ReleasedSlices, DeletedPods     int
	DeletedSecrets, Settled         int
	ResumedServers                  int
	// ReleasedPods counts the ended pods whose finalizer the pass removed.
	ReleasedPods int
	// Complete is true when every pod's slice is recorded.
	Complete bool
}

// Repairs returns the report's repairs by kind, as Metrics receives them:
// restored_server, restored_slice, released_slice, deleted_pod,
// deleted_secret, settled_server, resumed_server and released_pod.
func (r Report) Repairs() map[string]int {
	return map[string]int{"restored_server": r.RestoredServers, "restored_slice": r.RestoredSlices,
		"released_slice": r.ReleasedSlices, "deleted_pod": r.DeletedPods, "deleted_secret": r.DeletedSecrets,
		"settled_server": r.Settled, "resumed_server": r.ResumedServers, "released_pod": r.ReleasedPods}
}

// repaired reports whether the pass changed anything.
func (r Report) repaired() bool {
	for _, n := range r.Repairs() {
		if n > 0 {
			return true
		}
	}
	return false
}

// Reconciler runs reconcile passes. Create it with New; it is safe for
// concurrent use.
type Reconciler struct {
	store     Store
	pods      Pods
	lifecycle Lifecycle
	log       *slog.Logger
	grace     time.Duration
	interval  time.Duration
	now       func() time.Time
	trigger   chan struct{}
	metrics   Metrics     // nil: none
	leading   atomic.Bool // Run makes the periodic passes (SetLeading)
	mu        sync.Mutex  // serialises passes; guards unheldSecrets
	// unheldSecrets maps "uid/resourceVersion" of each Secret that the
	// last pass found held by no pod and no unfinished record to when a
	// pass first found it so.
	unheldSecrets map[string]time.Time
	// lastEpoch is the reconcile epoch the last pass read; fenceFrom is an
	// epoch to which fleet.RebuildFence applies: one this process saw
	// replace another (Redis lost its data under it), or the one its first
	// pass read while the cluster held gpubroker's pods or Secrets.
	// Guarded by mu.
	lastEpoch, fenceFrom string
}

// SetMetrics sets where each pass's measurements go; call it before Run.
func (r *Reconciler) SetMetrics(m Metrics) { r.metrics = m }

// New returns a Reconciler. grace is how long a record or pod must have been
// quiet before it is taken as abandoned (default 2m when ≤ 0); interval is
// the period of Run (default 30s when ≤ 0). now defaults to time.Now.
func New(store Store, pods Pods, lifecycle Lifecycle, log *slog.Logger, grace, interval time.Duration, now func() time.Time) *Reconciler {
	if grace <= 0 {
		grace = 2 * time.Minute
	}
	if interval <= 0 {
		interval = 30 * time.Second
	}
	if now == nil {
		now = time.Now
	}
	r := &Reconciler{store: store, pods: pods, lifecycle: lifecycle, log: log,
		grace: grace, interval: interval, now: now, trigger: make(chan struct{}, 1)}
	r.leading.Store(true)
	return r
}

// SetLeading says whether this replica makes Run's periodic passes:
// true (the default, for a single replica) while it leads, false while
// another replica does. A replica that starts leading makes a pass at
// once (Trigger). Passes asked for with Trigger run either way. Safe to
// call at any time, from any goroutine.
func (r *Reconciler) SetLeading(leading bool) {
	if r.leading.Swap(leading) != leading && leading {
		r.Trigger()
	}
}

// Trigger asks Run for a pass now; it never blocks.
func (r *Reconciler) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run makes a pass at once and then every interval while this replica
// leads (SetLeading), and one on every Trigger, until ctx ends. A failed
// pass is logged and retried at the next tick while this replica leads.
// While no replica leads (none can renew the Lease), only the passes asked
// for run. It returns ctx's error.
func (r *Reconciler) Run(ctx context.Context) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	pass := r.leading.Load()
	for {
		if pass {
			r.runOnce(ctx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			pass = r.leading.Load()
		case <-r.trigger:
			pass = true
		}
	}
}

// runOnce makes one pass of Run and logs what it did.
func (r *Reconciler) runOnce(ctx context.Context) {
	rep, err := r.Once(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		r.log.WarnContext(ctx, "reconcile pass failed", "err", err)
	case err == nil && rep.repaired():
		r.log.InfoContext(ctx, "reconciled", "pods", rep.Pods, "restored_servers", rep.RestoredServers,
			"restored_slices", rep.RestoredSlices, "released_slices", rep.ReleasedSlices,
			"deleted_pods", rep.DeletedPods, "deleted_secrets", rep.DeletedSecrets, "settled", rep.Settled, "resumed_servers", rep.ResumedServers, "released_pods", rep.ReleasedPods, "complete", rep.Complete)
	}
}

// Once makes one pass. It fails without acting when the pod cache is not
// synced (spawner.ErrNotSynced).
func (r *Reconciler) Once(ctx context.Context) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	start := time.Now()
	rep, err := r.pass(ctx)
	if r.metrics != nil {
		r.metrics.ObserveReconcile(time.Since(start), rep.Repairs(), err != nil)
	}
	return rep, err
}

// pass is one reconcile pass (Once without the measurement).
func (r *Reconciler) pass(ctx context.Context) (Report, error) {
	var rep Report
	// The epoch first: if Redis loses its data during the pass, the pass
	// read allocations that are gone and must not mark the rebuild done.
	epoch, marked, err := r.store.ReconcileEpoch(ctx)
	if err != nil {
		return rep, fmt.Errorf("reconcile: epoch: %w", err)
	}
	allocs, err := r.store.AllocationIDs(ctx)
	if err != nil {
		return rep, fmt.Errorf("reconcile: allocations: %w", err)
	}
	recs, err := r.store.ListServerStates(ctx, "")
	if err != nil {
		return rep, fmt.Errorf("reconcile: servers: %w", err)
	}
	pods, err := r.pods.Pods()
	if err != nil {
		return rep, fmt.Errorf("reconcile: pods: %w", err)
	}
	rep.Pods, rep.Allocations, rep.Servers = len(pods), len(allocs), len(recs)
	now := r.now()

	allocated := make(map[string]bool, len(allocs))
	for _, id := range allocs {
		allocated[id] = true
	}
	recByKey := make(map[fleet.ServerKey]fleet.Server, len(recs))
	recBySpawn := make(map[string]fleet.Server, len(recs))
	for _, s := range recs {
		recByKey[s.ServerKey] = s
		recBySpawn[s.SpawnID] = s
	}
	podBySpawn := make(map[string]spawner.ManagedPod, len(pods))
	complete := true
	var errs []error
	// holds are the slices recorded once the pass is done: those read,
	// plus those it restores, minus those it releases.
	holds := maps.Clone(allocated)
	api := &apiView{pods: r.pods}

	for _, p := range pods {
		if p.Err != nil {
			// Its annotations cannot be read, so it proves no allocation and
			// belongs to no server: remove it once it is old enough.
			if p.Phase == spawner.PhaseGone {
				r.release(ctx, p, "", &rep, &errs)
			} else if !p.Deleting && now.Sub(p.CreatedAt) > r.grace {
				r.log.WarnContext(ctx, "deleting a managed pod with unreadable annotations", "pod", p.Name, "err", p.Err)
				if err := r.pods.DeletePod(ctx, p.Name, p.SpawnID); err != nil {
					errs = append(errs, fmt.Errorf("delete unreadable pod %s: %w", p.Name, err))
				} else {
					rep.DeletedPods++
				}
			}
			continue
		}
		podBySpawn[p.SpawnID] = p
		key := fleet.ServerKey{User: p.User, Name: p.Server}
		rec, ok := recByKey[key]
		if !ok && p.Phase == spawner.PhaseGone {
			if recordMayBeLost(p, epoch) {
				// Redis lost the record, and the pod ended before a pass
				// rebuilt it: its finalizer kept it for this.
				r.restoreEnded(ctx, p, now, &rep, &errs)
			} else {
				// The record was written in this epoch and is gone: its
				// owner removed the ended server. Nothing to record.
				r.release(ctx, p, p.SpawnID, &rep, &errs)
			}
			continue
		}
		current := ok && rec.SpawnID == p.SpawnID && !fleet.Terminal(rec.State)
		if !ok {
			current = true
		}
		if !current {
			if p.Phase == spawner.PhaseGone {
				// Its record moved on or ended: nothing to record.
				r.release(ctx, p, p.SpawnID, &rep, &errs)
				continue
			}
			if !allocated[p.SpawnID] && !p.Deleting {
				// A pod of an earlier spawn still runs on its GPU (its
				// record moved on or was replaced after Redis lost its
				// data): its slice counts until the pod is gone, or a
				// rebuild would reopen placement over it. The release below
				// frees it once the pod is gone.
				if _, err := r.restoreSlice(ctx, p, &rep); err != nil {
					complete = false
					errs = append(errs, err)
				} else {
					holds[p.SpawnID] = true
				}
			}
			if !p.Deleting && now.Sub(p.CreatedAt) > r.grace {
				if err := r.pods.Delete(ctx, p.User, p.Server, p.SpawnID); err != nil {
					errs = append(errs, fmt.Errorf("delete orphan pod %s: %w", p.Name, err))
				} else {
					rep.DeletedPods++
				}
			}
			continue
		}
		alloc := allocationOf(p)
		if !allocated[p.SpawnID] && p.Phase != spawner.PhaseGone {
			// (An ended pod holds its GPU no more: its event below
			// releases its slice, if any.)
			a, err := r.restoreSlice(ctx, p, &rep)
			if err != nil {
				complete = false
				errs = append(errs, err)
				continue
			}
			alloc = a
			holds[p.SpawnID] = true
		}
		if !ok {
			restored, err := r.store.RestoreServer(ctx, recordOf(p, alloc, now))
			if err != nil {
				// Not rebuilt: reopened, a create of its name would record a
				// new spawn and make this pod look replaced.
				complete = false
				errs = append(errs, fmt.Errorf("restore server of pod %s: %w", p.Name, err))
				continue
			}
			if restored {
				rep.RestoredServers++
			}
		} else if !p.Deleting && (rec.State == v1.StatePending || rec.State == v1.StatePlacing) {
			resumed, err := r.lifecycle.Resume(ctx, rec, alloc)
			if err != nil {
				errs = append(errs, fmt.Errorf("resume server of pod %s: %w", p.Name, err))
				continue
			}
			if resumed {
				rep.ResumedServers++
			}
		}
		if ok && settled(rec, p) {
			continue
		}
		if ok && rec.State == v1.StateStopping && !p.Deleting {
			// A stop whose pod deletion never reached the API server (it
			// was restarting, or the broker died between recording the
			// stop and deleting): delete it now; the pod's end then
			// finishes the stop.
			if err := r.pods.Delete(ctx, p.User, p.Server, p.SpawnID); err != nil {
				errs = append(errs, fmt.Errorf("delete pod %s of stopping server: %w", p.Name, err))
			} else {
				rep.DeletedPods++
			}
			continue
		}
		if err := r.lifecycle.HandlePodEvent(ctx, eventOf(p)); err != nil {
			errs = append(errs, err)
		}
	}

	// Records whose pod is gone or never came.
	for _, rec := range recs {
		if fleet.Terminal(rec.State) {
			continue
		}
		quiet := r.grace
		if rec.State == v1.StateCreating {
			// Its spawn may still be creating the pod: that is allowed
			// until fleet.PodCreateWindow after creating was recorded
			// (RebuildFence adds the clocks' slack). Abandoning it earlier
			// would release a slice whose pod is about to run.
			quiet = max(quiet, fleet.RebuildFence)
		}
		if _, ok := podBySpawn[rec.SpawnID]; ok || now.Sub(rec.UpdatedAt) <= quiet {
			continue
		}
		if absent, err := api.absent(ctx, rec.SpawnID); !absent {
			// The cache lags: the pod is there. Settled once it sees it.
			complete = false
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		var err error
		switch rec.State {
		case v1.StateStarting, v1.StateRunning, v1.StateStopping:
			err = r.lifecycle.HandlePodEvent(ctx, spawner.PodEvent{User: rec.User, Server: rec.Name, SpawnID: rec.SpawnID, Phase: spawner.PhaseGone})
		default:
			r.lifecycle.Abandon(ctx, rec, "the spawn was interrupted (the broker stopped during it); start the server again")
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Settled++
	}

	// Allocations that no current spawn holds.
	for _, id := range allocs {
		if _, ok := podBySpawn[id]; ok {
			continue
		}
		if rec, ok := recBySpawn[id]; ok && !fleet.Terminal(rec.State) {
			continue // settled above once quiet for the grace period
		}
		if absent, err := api.absent(ctx, id); !absent {
			// The pod runs, the cache has not seen it yet: its slice stays.
			complete = false
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		released, err := r.store.Release(ctx, id)
		if err != nil {
			errs = append(errs, fmt.Errorf("release slice %s: %w", id, err))
			continue
		}
		if released {
			rep.ReleasedSlices++
		}
		delete(holds, id)
	}

	secrets, serr := r.pods.Secrets(ctx)
	if serr != nil {
		errs = append(errs, fmt.Errorf("list secrets: %w", serr))
	} else if err := r.collectSecrets(ctx, now, secrets, podBySpawn, recBySpawn, &rep); err != nil {
		errs = append(errs, err)
	}

	// The fence applies to an epoch that replaced data some spawn may have
	// placed on: one this process saw replace another, or, on the first
	// pass of a process (a replica that just started cannot know what it
	// missed), one the cluster shows gpubroker at work under: a managed pod
	// or Secret exists, or the Secrets could not be listed. Only a fresh
	// install (a first broker on an empty Redis and an empty namespace)
	// opens placement at once.
	switch {
	case r.lastEpoch == epoch:
	case r.lastEpoch != "":
		r.fenceFrom = epoch
	case len(pods) > 0 || len(secrets) > 0 || serr != nil:
		r.fenceFrom = epoch
	default:
		r.fenceFrom = ""
	}
	r.lastEpoch = epoch
	if began, ok := fleet.EpochBegan(epoch); complete && !marked && ok && r.fenceFrom == epoch && now.Sub(began) < fleet.RebuildFence {
		// A spawn that placed on the lost data may still create its pod
		// (within fleet.PodCreateWindow of its placement); placement stays
		// shut until a pass after the fence has seen such pods.
		complete = false
	}
	if complete && !marked {
		// Placement reopens on what this pass holds: every pod the API
		// server has (not only the cache, which may lag) must hold its
		// slice by now.
		missing, err := api.unheld(ctx, holds)
		switch {
		case err != nil:
			complete = false
			errs = append(errs, err)
		case len(missing) > 0:
			complete = false
			r.log.InfoContext(ctx, "the pod cache lags the API server; placement reopens once it holds every pod's slice", "pods", missing)
		}
	}
	switch {
	case !complete:
	case marked:
		rep.Complete = true
	default:
		ok, err := r.store.MarkReconciledAt(ctx, epoch)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("mark reconciled: %w", err))
		case !ok:
			r.log.WarnContext(ctx, "Redis lost its data during the reconcile pass; the next pass rebuilds")
		default:
			rep.Complete = true
			r.log.InfoContext(ctx, "allocations rebuilt from the cluster; placement reopens", "epoch", epoch, "pods", len(pods), "slices", len(holds))
		}
	}
	return rep, errors.Join(errs...)
}

// settled says that replaying pod p into its record rec (of the same
// spawn, as listed at the start of the pass) would change nothing: a
// running pod of a running server. A running pod moves only a creating or
// starting record, and a record of the spawn never goes back to those, so
// the record read by the pass is enough to know. Skipping these keeps a
// pass at a fleet's steady state to the reads it starts with instead of one
// Redis round trip per server.
func settled(rec fleet.Server, p spawner.ManagedPod) bool {
	return rec.SpawnID == p.SpawnID && rec.State == v1.StateRunning && p.Phase == spawner.PhaseRunning && !p.Deleting
}

// restoreSlice records pod p's slice in Redis as the API server has it, not
// the cache, and fences off a resize in flight: the write changes the pod's
// resourceVersion, so a resize that changed Redis before this restore cannot
// record its slice on the pod after it; it starts over on the restored data
// (servers.Service.Resize). It returns the allocation restored.
func (r *Reconciler) restoreSlice(ctx context.Context, p spawner.ManagedPod, rep *Report) (fleet.Allocation, error) {
	fresh, err := r.pods.FenceSlice(ctx, p.Name, p.SpawnID)
	if err != nil {
		return fleet.Allocation{}, fmt.Errorf("fence pod %s before restoring its slice: %w", p.Name, err)
	}
	alloc := allocationOf(fresh)
	restored, err := r.store.Restore(ctx, alloc)
	switch {
	case errors.Is(err, fleet.ErrConflict) && restored:
		// Recorded, but the GPU is now overcommitted: the pod is the truth.
		r.log.ErrorContext(ctx, "restored slice overcommits its GPU", "pod", p.Name, "gpu_uuid", alloc.GPUUUID, "err", err)
		rep.RestoredSlices++
	case err != nil:
		return fleet.Allocation{}, fmt.Errorf("restore slice of pod %s: %w", p.Name, err)
	case restored:
		rep.RestoredSlices++
	}
	return alloc, nil
}

func allocationOf(p spawner.ManagedPod) fleet.Allocation {
	return fleet.Allocation{SliceID: p.SpawnID, User: p.User, Groups: p.QuotaGroups,
		Slice: p.Slice, GPUUUID: p.GPUUUID, Node: p.Node,
		Sharing: p.Sharing, MIGProfile: p.MIGProfile, Parent: p.ParentUUID}
}

// recordOf rebuilds a server record from its pod: running (with its URL)
// when the pod runs, else starting, so that the rebuilt event stream starts
// at the phase the server is in and never steps back from running to
// starting; the pod's phase is then replayed into it like any pod event.
func recordOf(p spawner.ManagedPod, a fleet.Allocation, now time.Time) fleet.Server {
	rec := fleet.Server{
		ServerKey: fleet.ServerKey{User: p.User, Name: p.Server},
		Profile:   p.Profile, SpawnID: p.SpawnID, IdempotencyKey: p.IdempotencyKey, State: v1.StateStarting,
		Message: "restored from its pod after the broker's store lost it",
		Slice:   p.Slice, Allocation: &a, Pod: p.Name,
		Sharing: p.Sharing, MIGProfile: p.MIGProfile,
		CreatedAt: p.CreatedAt, UpdatedAt: now,
	}
	if p.Phase == spawner.PhaseRunning && p.URL != "" {
		rec.State, rec.URL = v1.StateRunning, p.URL
	}
	return rec
}

func eventOf(p spawner.ManagedPod) spawner.PodEvent {
	return spawner.PodEvent{User: p.User, Server: p.Server, SpawnID: p.SpawnID, Pod: p.Name,
		Phase: p.Phase, Message: p.Message, URL: p.URL, Held: p.Held}
}
