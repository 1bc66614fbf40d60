package servers

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// Store is what the lifecycle needs from storage (implemented by
// broker/internal/redisstore). Every method is atomic on its own.
type Store interface {
	Place(ctx context.Context, req fleet.PlaceRequest) (fleet.Allocation, error)
	Release(ctx context.Context, sliceID string) (bool, error)
	CreateServer(ctx context.Context, s fleet.Server) (fleet.Server, bool, error)
	DiscardServer(ctx context.Context, k fleet.ServerKey, spawnID string) (bool, error)
	DeleteServer(ctx context.Context, k fleet.ServerKey, spawnID string) error
	GetServer(ctx context.Context, k fleet.ServerKey) (fleet.Server, error)
	ListServers(ctx context.Context, user string) ([]fleet.Server, error)
	ServersPage(ctx context.Context, user, after string, limit int) ([]fleet.Server, string, error)
	QuotaUsed(ctx context.Context, user string, groups []string) (fleet.Quota, map[string]fleet.Quota, error)
	Transition(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, error)
	// Advance is Transition that also reports whether this call moved the
	// state (false: the record was in the target state already, say moved
	// there by another replica), so a step that must happen once per
	// transition (counting a spawn) happens on one replica only.
	Advance(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, bool, error)
	// MoveFrom is Transition from state from only (a record in any other
	// state, to included, is left as it is: *fleet.StateError); SetMessage
	// sets the message of a record in state, writing nothing when it is the
	// same. With them a pod event of a spawn going as planned is applied in
	// one call, without reading the record first.
	MoveFrom(ctx context.Context, k fleet.ServerKey, spawnID string, from, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, error)
	SetMessage(ctx context.Context, k fleet.ServerKey, spawnID string, state fleet.State, message string) (fleet.Server, error)
	Events(ctx context.Context, k fleet.ServerKey, afterID string, block time.Duration) ([]fleet.Event, error)
}

// AuditLog receives the audit entry of every lifecycle action (implemented
// by redisstore.AuditLog).
type AuditLog interface {
	AppendAudit(ctx context.Context, e audit.Entry) error
}

// Pods creates and deletes notebook pods and their Secrets (implemented by
// spawner.Client).
type Pods interface {
	// PutSecret writes the Secret of spawn (s.User, s.Server, s.SpawnID)
	// holding secretEnv; a Secret of the same spawn is left as it is.
	PutSecret(ctx context.Context, s spawner.Spec, secretEnv map[string]string) error
	// CreatePod creates the pod of spawn s, which reads the Secret
	// PutSecret wrote when s.SecretEnv is set.
	CreatePod(ctx context.Context, s spawner.Spec) error
	Delete(ctx context.Context, user, server, spawnID string) error
	// HasPod reports whether the pod of spawn spawnID of (user, server) is
	// there, not ended: the pod cache answers, and the API server when the
	// cache holds no pod of that name (it may lag); before the cache has
	// synced it fails.
	HasPod(ctx context.Context, user, server, spawnID string) (bool, error)
	// ReleasePod removes v1.FinalizerServerRecord from the deleted pod
	// name of spawnID once the server's end is recorded; idempotent.
	ReleasePod(ctx context.Context, name, spawnID string) error
}

// Catalog is the admin-defined offer (implemented by catalog.Catalog).
type Catalog interface {
	Profile(name string) (fleet.Profile, bool)
	Quotas() fleet.Quotas
}

// Service runs server lifecycles. It is safe for concurrent use.
type Service struct {
	store   Store
	pods    Pods
	catalog Catalog
	log     *slog.Logger
	policy  fleet.Policy
	timeout time.Duration // bounds the steps a create or delete runs after the caller's context is detached
	now     func() time.Time
	newID   func() string
	kick    func()
	resize  *ResizeConfig // nil: Resize is not configured (WithResize)
	metrics Metrics
	audit   AuditLog // nil: actions are not audited (WithAudit)
}

// Metrics receives the lifecycle's measurements (implemented by
// broker/internal/metrics). Its methods must be safe for concurrent use
// and must not block.
type Metrics interface {
	// ObservePlacement records one placement's duration and, for a
	// refusal, its reason (Refusal's values); "" for a placement.
	ObservePlacement(d time.Duration, refusal string)
	// ObserveSpawn records a spawn that ended: its profile, its outcome
	// (OutcomeRunning, OutcomeFailed, OutcomeRefused) and the time since
	// the server's create.
	ObserveSpawn(profile, outcome string, d time.Duration)
}

// The outcomes of a spawn, as Metrics receives them.
const (
	OutcomeRunning = "running"
	OutcomeFailed  = "failed"
	OutcomeRefused = "refused"
)

// Refusal names a placement refusal for Metrics: capacity, quota,
// not_ready (allocations being rebuilt), not_durable (the store could not
// confirm it) or error.
func Refusal(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, fleet.ErrNoCapacity):
		return "capacity"
	case errors.Is(err, fleet.ErrQuotaExceeded):
		return "quota"
	case errors.Is(err, fleet.ErrNotReady):
		return "not_ready"
	case errors.Is(err, fleet.ErrUnavailable):
		return "not_durable"
	default:
		return "error"
	}
}

// outcome names how a spawn that did not reach running ended: refused for
// the caller's own limits and the broker's refusals, failed otherwise.
func outcome(cause error) string {
	for _, refused := range []error{fleet.ErrNoCapacity, fleet.ErrQuotaExceeded, fleet.ErrInvalid, fleet.ErrForbidden, fleet.ErrNotReady, fleet.ErrUnavailable} {
		if errors.Is(cause, refused) {
			return OutcomeRefused
		}
	}
	return OutcomeFailed
}

// noMetrics discards measurements.
type noMetrics struct{}

func (noMetrics) ObservePlacement(time.Duration, string)     {}
func (noMetrics) ObserveSpawn(string, string, time.Duration) {}

// Option configures a Service.
type Option func(*Service)

// WithPolicy sets the placement policy; default fleet.PolicyBinpack.
func WithPolicy(p fleet.Policy) Option { return func(s *Service) { s.policy = p } }

// WithClock sets the time source for record timestamps; default time.Now.
func WithClock(now func() time.Time) Option { return func(s *Service) { s.now = now } }

// WithSpawnIDs sets the spawn id generator; default 16 random hex digits.
func WithSpawnIDs(f func() string) Option { return func(s *Service) { s.newID = f } }

// WithMetrics sets where measurements go; default nowhere.
func WithMetrics(m Metrics) Option {
	return func(s *Service) {
		if m != nil {
			s.metrics = m
		}
	}
}

// WithReconcileTrigger sets a function called when a create or placement
// is refused because allocations are being rebuilt, so the reconciler runs
// at once.
func WithReconcileTrigger(f func()) Option { return func(s *Service) { s.kick = f } }

// WithAudit records every lifecycle action (create, stop, remove, resize)
// in log, with who did it and the inputs (ARCHITECTURE.md invariant 6).
// Without it nothing is audited (tests).
func WithAudit(log AuditLog) Option { return func(s *Service) { s.audit = log } }

// New returns a Service over its dependencies.
func New(store Store, pods Pods, catalog Catalog, log *slog.Logger, opts ...Option) *Service {
	s := &Service{
		store: store, pods: pods, catalog: catalog, log: log,
		policy:  fleet.PolicyBinpack,
		timeout: 30 * time.Second,
		now:     time.Now,
		newID:   randomID,
		kick:    func() {},
		metrics: noMetrics{},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// Create starts server name for user with the given profile, or returns the
// server that a create with the same idempotency key already started
// (created is then false). by is who asks (the user, the hub acting for
// them, an admin); the action is audited.
//
// A start that is refused leaves nothing behind: errors matching
// fleet.ErrInvalid, fleet.ErrForbidden, fleet.ErrConflict, fleet.ErrNoCapacity,
// fleet.ErrQuotaExceeded or fleet.ErrNotReady come back with no server
// recorded (a stopped or failed record that the start replaced is put
// back). An error is never stored as the key's outcome: a retry with the
// same key after an error runs again. When Redis or the Kubernetes API
// server stops answering midway, the error is a *fleet.UnavailableError
// saying that the server may have started, and the record stays as far as
// it got: the same-key retry carries the start on from there (every step is
// idempotent), and without one the pod's own events or the reconciler
// settle it.
func (s *Service) Create(ctx context.Context, by audit.Actor, user string, groups []string, name string, req v1.CreateServerRequest, idempotencyKey string) (fleet.Server, bool, error) {
	if err := errors.Join(fleet.ValidateName("user", user), fleet.ValidateName("server", name)); err != nil {
		return fleet.Server{}, false, fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	plain, secret, err := splitEnv(req.Env, req.SecretEnv, by.Kind == v1.ActorHub)
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	prof, ok := s.catalog.Profile(req.Profile)
	switch {
	case req.Profile == "":
		return fleet.Server{}, false, fmt.Errorf("%w: a profile is required", fleet.ErrInvalid)
	case !ok:
		return fleet.Server{}, false, fmt.Errorf("%w: there is no profile %q", fleet.ErrInvalid, req.Profile)
	case !prof.Allows(groups):
		return fleet.Server{}, false, fmt.Errorf("%w: profile %q is not offered to your groups", fleet.ErrForbidden, req.Profile)
	}

	if idempotencyKey == "" {
		// No key: this call is its own request, never a retry of another,
		// so it must not match a finished spawn's (also empty) key.
		idempotencyKey = "auto-" + s.newID()
	}
	key := fleet.ServerKey{User: user, Name: name}
	now := s.now()
	rec, created, err := s.store.CreateServer(ctx, fleet.Server{
		ServerKey:      key,
		Profile:        prof.Name,
		SpawnID:        s.newID(),
		IdempotencyKey: idempotencyKey,
		RequestDigest:  requestDigest(req, plain, secret),
		State:          v1.StatePending,
		Message:        fmt.Sprintf("server requested with profile %s (%s)", prof.DisplayName, prof.Words()),
		Slice:          prof.Slice,
		Sharing:        fleet.ModeOf(prof.Sharing),
		MIGProfile:     prof.MIGProfile,
		CreatedAt:      now,
		UpdatedAt:      now,
	})
	if err != nil {
		if errors.Is(err, fleet.ErrNotReady) {
			s.kick() // no new spawn while the data is rebuilt: rebuild now
		}
		return fleet.Server{}, false, unknown(err, name+" may or may not have started")
	}
	if !created && rec.Profile != prof.Name {
		return rec, false, fmt.Errorf("%w: Idempotency-Key %q was already used for a create with profile %q; use a new key for another request",
			fleet.ErrConflict, idempotencyKey, rec.Profile)
	}
	if !created && rec.RequestDigest != "" && rec.RequestDigest != requestDigest(req, plain, secret) {
		return rec, false, fmt.Errorf("%w: Idempotency-Key %q was already used for a create with other env, secretEnv, command or args; use a new key for another request",
			fleet.ErrConflict, idempotencyKey)
	}
	// From here on the server exists: finish on a context the caller cannot
	// cancel, so a hung-up client leaves no half-created server.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	if !created && !starting(rec.State) {
		return rec, false, nil // a retry of a create that got past its steps
	}
	// Every spawn gets its own notebook token, in its Secret only; the
	// proxy adds it to the requests it forwards (ARCHITECTURE.md invariant 7).
	// A same-key retry makes a new one, which the spawner does not write:
	// the Secret of a spawn is written once, by its first attempt, and the
	// spawn's pod and the proxy both read that one.
	secret[v1.EnvNotebookToken] = newNotebookToken()
	command, args := req.Command, req.Args
	if command == nil && args == nil {
		command, args = prof.Command, prof.Args
	}
	// A new start, or the same-key retry of one that did not finish its
	// steps (still running, or cut off by an outage): carry it on.
	out, err := s.spawn(ctx, rec, prof, groups, plain, secret, command, args)
	if !created && errors.Is(err, errUndone) {
		// The first attempt was refused and undone while this retry
		// joined it: the retry runs again, as a start of its own.
		return s.Create(ctx, by, user, groups, name, req, idempotencyKey)
	}
	if created {
		s.record(ctx, by, auditCreate, key, createInputs(rec, prof, req, err), err)
	}
	return out, created, err
}

// requestDigest is the hex SHA-256 of what a create request asks for: the
// profile, the plain environment (names and values), the names of the
// secret environment (secretEnv and env entries whose names look like
// credentials, as splitEnv parted them; not their values, so the record
// holds no digest of a secret that could be guessed offline), command and
// args, with an absent list told apart from an empty one (they mean the
// profile's command and the image's). Maps are taken in key order.
func requestDigest(req v1.CreateServerRequest, plain, secret map[string]string) string {
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s", len(s), s) }
	field(req.Profile)
	for _, k := range slices.Sorted(maps.Keys(plain)) {
		field("env")
		field(k)
		field(plain[k])
	}
	for _, k := range slices.Sorted(maps.Keys(secret)) {
		field("secret")
		field(k)
	}
	for _, list := range [][]string{req.Command, req.Args} {
		if list == nil {
			field("absent")
			continue
		}
		field(fmt.Sprintf("list %d", len(list)))
		for _, a := range list {
			field(a)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// errUndone means that the start a step belonged to was undone (refused
// and discarded, or removed) meanwhile.
var errUndone = fmt.Errorf("%w: the start was undone meanwhile", fleet.ErrConflict)

// refusal reports whether a placement error refuses the start for a reason
// the caller can read (and nothing was placed), as opposed to an outage.
func refusal(err error) bool {
	for _, s := range []error{fleet.ErrInvalid, fleet.ErrNotReady, fleet.ErrQuotaExceeded, fleet.ErrNoCapacity, fleet.ErrForbidden} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// starting reports whether s is a step of a start before its pod exists.
func starting(s fleet.State) bool {
	return s == v1.StatePending || s == v1.StatePlacing || s == v1.StateCreating
}

// spawn carries a start on from the state rec is in: it places the slice,
// creates the pod and records each step. Every step is idempotent, so two
// calls for one spawn (a retry while the first still runs) do no harm. A
// refusal undoes the start (refuse); an outage leaves it as far as it got.
//
// The spawn's Secret is written side by side with the steps before the pod
// (placing, placement, creating): it needs only the spawn's identity, and
// the pod is created once both are done, so the pod never waits on a
// Secret write that could have run meanwhile. A start that ends before its
// pod for good (refused, undone, stopped) deletes that Secret again.
func (s *Service) spawn(ctx context.Context, rec fleet.Server, prof fleet.Profile, groups []string, plain, secret map[string]string, command, args []string) (out fleet.Server, err error) {
	log := s.log.With("user", rec.User, "server", rec.Name, "spawn_id", rec.SpawnID)
	var sec *secretWrite
	podMade := false // by this call: from then on the pod's own cleanup (stop, fail, reconciler) takes its Secret too
	if starting(rec.State) && len(secret) > 0 {
		sec = s.writeSecret(ctx, rec, secret)
		defer func() {
			var ue *fleet.UnavailableError
			if err != nil && !podMade && !errors.As(err, &ue) {
				s.dropSecret(ctx, rec, sec)
			}
		}()
	}
	for {
		var err error
		switch rec.State {
		case v1.StatePending:
			rec, err = s.step(ctx, rec, v1.StatePlacing, placingMessage(prof), fleet.ServerPatch{})
		case v1.StatePlacing:
			userQuota, groupQuotas := s.catalog.Quotas().ForUser(rec.User, groups)
			placeStart := time.Now()
			alloc, perr := s.store.Place(ctx, fleet.PlaceRequest{
				SliceID: rec.SpawnID, User: rec.User, Slice: prof.Slice, Model: prof.Model,
				Sharing: fleet.ModeOf(prof.Sharing), MIGProfile: prof.MIGProfile,
				Policy: s.policy, UserQuota: userQuota, GroupQuotas: groupQuotas,
			})
			s.metrics.ObservePlacement(time.Since(placeStart), Refusal(perr))
			if perr != nil {
				if errors.Is(perr, fleet.ErrNotReady) {
					s.kick()
				}
				if refusal(perr) {
					return s.refuse(ctx, rec, perr)
				}
				// An outage, or a reply lost: the slice may be placed. The
				// same-key retry places again (the same slice id finds it),
				// or the reconciler settles the record.
				return rec, unknown(perr, rec.Name+" may or may not have started")
			}
			log.InfoContext(ctx, "slice placed", "gpu_uuid", alloc.GPUUUID, "node", alloc.Node, "mem_mib", alloc.Slice.MemoryMiB, "sm_percent", alloc.Slice.ComputePercent)
			placed := rec
			rec, err = s.step(ctx, rec, v1.StateCreating, placedMessage(alloc), fleet.ServerPatch{Allocation: &alloc})
			if err != nil && unrecorded(placed, rec, err) {
				// Stopped, failed or removed while placing: the stop's
				// release may have run before this placement; nothing will
				// create a pod on the slice.
				if _, rerr := s.store.Release(ctx, placed.SpawnID); rerr != nil {
					log.WarnContext(ctx, "release the slice of a start ended while placing it; the reconciler will", "err", rerr)
				}
			}
		case v1.StateCreating:
			if rec.Allocation == nil {
				return rec, fmt.Errorf("server %s/%s: creating without an allocation", rec.User, rec.Name)
			}
			alloc := *rec.Allocation
			spec := spawner.Spec{
				User: rec.User, Server: rec.Name, SpawnID: rec.SpawnID, Profile: prof.Name,
				Image: prof.Image, CPU: prof.CPU, Memory: prof.Memory, Slice: alloc.Slice,
				Sharing:     alloc.Sharing,
				GPU:         v1.GPURef{UUID: alloc.GPUUUID, Node: alloc.Node, MIGProfile: alloc.MIGProfile, ParentUUID: alloc.Parent},
				QuotaGroups: alloc.Groups, Env: plain, SecretEnv: len(secret) > 0,
				Command: slices.Clone(command), Args: slices.Clone(args), IdempotencyKey: rec.IdempotencyKey,
			}
			// The pod is created within fleet.PodCreateWindow of the
			// placement or not at all: a rebuild after Redis lost its data
			// waits that long for such pods (reconcile.Reconciler.Once).
			left := rec.UpdatedAt.Add(fleet.PodCreateWindow).Sub(s.now())
			if left <= 0 {
				err := fmt.Errorf("%w: %s took too long between its placement and its pod; start it again", fleet.ErrConflict, rec.Name)
				return s.fail(ctx, rec, err, podMayRun), err
			}
			cctx, ccancel := context.WithTimeout(ctx, left)
			perr := sec.wait(cctx)
			if perr == nil {
				perr = s.pods.CreatePod(cctx, spec)
			}
			ccancel()
			if perr != nil {
				switch {
				case errors.Is(perr, spawner.ErrUnavailable):
					return rec, &fleet.UnavailableError{Part: fleet.PartKubernetes, Unknown: rec.Name + " may or may not have started", Err: perr}
				case errors.Is(perr, spawner.ErrRejected):
					// A refusal for good (ResourceQuota, admission, validation)
					// is the caller's to read, not an internal failure.
					return s.refuse(ctx, rec, fmt.Errorf("%w: the cluster refused the notebook pod: %s", fleet.ErrConflict, innermost(perr)))
				case errors.Is(perr, spawner.ErrPodExists):
					// The pod of an earlier spawn: terminating, or ended and
					// held by its finalizer when its release failed. A pass
					// releases an ended one now rather than at the leader's
					// next interval.
					s.kick()
					return s.refuse(ctx, rec, fmt.Errorf("%w: the notebook pod of an earlier start of %s is still shutting down; start it again in a few seconds", fleet.ErrConflict, rec.Name))
				case errors.Is(perr, spawner.ErrInvalid), errors.Is(perr, spawner.ErrNotOwned):
					return s.refuse(ctx, rec, fmt.Errorf("%w: %s", fleet.ErrConflict, innermost(perr)))
				}
				return s.fail(ctx, rec, perr, podMayRun), perr
			}
			podMade = true
			pod := spawner.PodName(rec.User, rec.Name)
			rec, err = s.step(ctx, rec, v1.StateStarting, "pod created; waiting for it to start", fleet.ServerPatch{Pod: &pod})
			if err != nil && (rec.State == v1.StateStopping || rec.State == v1.StateStopped) {
				// Stopped while the pod was being made: the stop found no
				// pod and kept the slice (stop); this pod's end finishes it.
				// (Stopped already: a reconcile pass with an orphan grace
				// shorter than fleet.RebuildFence settled the stop first;
				// the pod must not run on the freed slice either.)
				if derr := s.pods.Delete(ctx, rec.User, rec.Name, rec.SpawnID); derr != nil {
					log.WarnContext(ctx, "delete the pod of a start stopped while creating it; the reconciler will", "err", derr)
				}
			}
		default:
			return rec, nil
		}
		if err != nil {
			return rec, err
		}
	}
}

// secretWrite is a spawn's Secret being written (Service.writeSecret).
type secretWrite struct {
	done chan struct{} // closed when the write ended
	err  error         // its outcome, set before done is closed
}

// writeSecret starts writing the Secret of rec's spawn holding env, on
// ctx (the spawn's: when the spawn gives up, so does the write).
func (s *Service) writeSecret(ctx context.Context, rec fleet.Server, env map[string]string) *secretWrite {
	w := &secretWrite{done: make(chan struct{})}
	spec := spawner.Spec{User: rec.User, Server: rec.Name, SpawnID: rec.SpawnID}
	go func() {
		defer close(w.done)
		w.err = s.pods.PutSecret(ctx, spec, env)
	}()
	return w
}

// wait is the write's outcome, once it ended; a nil write (no Secret) is
// nil at once. When ctx ends first the error wraps spawner.ErrUnavailable:
// the Secret may yet be written.
func (w *secretWrite) wait(ctx context.Context) error {
	if w == nil {
		return nil
	}
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return fmt.Errorf("%w: the notebook's Secret was not written in time: %w", spawner.ErrUnavailable, ctx.Err())
	}
}

// dropSecret deletes the Secret of rec's spawn once its write has ended,
// for a start that ended before its pod for good. It runs in the
// background, so a refusal is answered without waiting on the API server;
// should the delete fail, the reconciler collects the Secret (no pod and
// no unfinished record holds it).
func (s *Service) dropSecret(ctx context.Context, rec fleet.Server, w *secretWrite) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	go func() {
		defer cancel()
		<-w.done
		if err := s.pods.Delete(ctx, rec.User, rec.Name, rec.SpawnID); err != nil {
			s.log.WarnContext(ctx, "delete the Secret of a start that ended before its pod; the reconciler will", "user", rec.User, "server", rec.Name, "spawn_id", rec.SpawnID, "err", err)
		}
	}()
}

// step records one step of rec's start. When something else moved the
// server meanwhile (the pod's own events, a same-key retry, a stop), it
// returns the record as it is now, for spawn to go on from; a stop that
// overtook the start is an error that says so.
func (s *Service) step(ctx context.Context, rec fleet.Server, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, error) {
	out, err := s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, to, message, patch)
	if err == nil {
		return out, nil
	}
	if !errors.Is(err, fleet.ErrConflict) && !errors.Is(err, fleet.ErrNotFound) {
		return rec, unknown(err, rec.Name+" may or may not have started")
	}
	cur, gerr := s.store.GetServer(ctx, rec.ServerKey)
	switch {
	case errors.Is(gerr, fleet.ErrNotFound):
		return rec, fmt.Errorf("%w: the start of %s was refused or removed meanwhile; start it again", errUndone, rec.Name)
	case gerr != nil:
		return rec, unknown(gerr, rec.Name+" may or may not have started")
	case cur.SpawnID != rec.SpawnID:
		return cur, fmt.Errorf("%w: %s was started again meanwhile", fleet.ErrConflict, rec.Name)
	case cur.State == v1.StateStopping || cur.State == v1.StateStopped:
		return cur, fmt.Errorf("%w: %s was stopped while it was starting", fleet.ErrConflict, rec.Name)
	case cur.State == v1.StateFailed:
		return cur, fmt.Errorf("%w: %s failed while it was starting: %s", fleet.ErrConflict, rec.Name, cur.Message)
	}
	// Overtaken by a step of the same start: go on from where it is.
	if cur.State == rec.State {
		return cur, fmt.Errorf("%w: %s", fleet.ErrConflict, err.Error())
	}
	return cur, nil
}

// unrecorded reports whether the step of placing (from placed) to creating
// failed with err, leaving cur, because the start ended meanwhile without
// recording the placement: removed (errUndone), started again (another
// spawn), or stopping, stopped or failed holding no allocation. An outage
// or a step of the same start that overtook this one is not.
func unrecorded(placed, cur fleet.Server, err error) bool {
	switch {
	case errors.Is(err, errUndone), cur.SpawnID != placed.SpawnID:
		return true
	case cur.Allocation != nil:
		return false
	}
	return cur.State == v1.StateStopping || cur.State == v1.StateStopped || cur.State == v1.StateFailed
}

// unknown marks an outage (a *fleet.UnavailableError) in the middle of an
// action as one whose outcome is not known, saying what may have happened;
// other errors pass unchanged.
func unknown(err error, what string) error {
	var ue *fleet.UnavailableError
	if !errors.As(err, &ue) || ue.Unknown != "" {
		return err
	}
	c := *ue
	c.Unknown = what
	return &c
}

// refuse undoes a start that was refused before its pod existed: the slice
// (if placed) is released and the record discarded, so nothing is left and
// the key is not spent; the record the start replaced comes back. It
// returns cause. When undoing fails (Redis went away), the record is
// failed instead when possible; what is left the reconciler settles.
func (s *Service) refuse(ctx context.Context, rec fleet.Server, cause error) (fleet.Server, error) {
	log := s.log.With("user", rec.User, "server", rec.Name, "spawn_id", rec.SpawnID)
	if _, err := s.store.DiscardServer(ctx, rec.ServerKey, rec.SpawnID); err != nil {
		log.WarnContext(ctx, "undo a refused start", "err", err)
		return s.fail(ctx, rec, cause, noPod), cause
	}
	if rec.Allocation != nil || rec.State == v1.StateCreating {
		// Discarded first: an allocation without its record is released by
		// the reconciler, should this fail.
		if _, err := s.store.Release(ctx, rec.SpawnID); err != nil {
			log.WarnContext(ctx, "release the slice of a refused start; the reconciler will", "err", err)
		}
	}
	return fleet.Server{}, cause
}

// placingMessage is the event of the placing step, in the profile's terms.
func placingMessage(p fleet.Profile) string {
	switch fleet.ModeOf(p.Sharing) {
	case fleet.SharingExclusive:
		return "looking for a whole GPU that is free"
	case fleet.SharingMIG:
		return "looking for a free MIG instance of profile " + p.MIGProfile
	case fleet.SharingMPS:
		return "looking for a GPU in MPS mode with room for the client"
	}
	return "looking for a GPU with room for the slice"
}

// placedMessage is the event that follows placement.
func placedMessage(a fleet.Allocation) string {
	switch a.Sharing {
	case fleet.SharingExclusive:
		return fmt.Sprintf("placed on the whole GPU %s (node %s, %d MiB); creating the pod", a.GPUUUID, a.Node, a.Slice.MemoryMiB)
	case fleet.SharingMIG:
		return fmt.Sprintf("placed on MIG instance %s (%s, %d MiB) of GPU %s (node %s); creating the pod", a.GPUUUID, a.MIGProfile, a.Slice.MemoryMiB, a.Parent, a.Node)
	case fleet.SharingMPS:
		return fmt.Sprintf("placed an MPS client of %d MiB and %d%% of the SMs on GPU %s (node %s); creating the pod", a.Slice.MemoryMiB, a.Slice.ComputePercent, a.GPUUUID, a.Node)
	}
	return fmt.Sprintf("placed %d MiB and %d%% compute on GPU %s (node %s); creating the pod", a.Slice.MemoryMiB, a.Slice.ComputePercent, a.GPUUUID, a.Node)
}

// innermost returns the text of the deepest error in err's chain (the last
// one where an error wraps several): the API server's own sentence.
func innermost(err error) string {
	for {
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			errs := u.Unwrap()
			if len(errs) == 0 {
				return err.Error()
			}
			err = errs[len(errs)-1]
		case interface{ Unwrap() error }:
			next := u.Unwrap()
			if next == nil {
				return err.Error()
			}
			err = next
		default:
			return err.Error()
		}
	}
}
