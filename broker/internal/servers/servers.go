package servers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// Store is what the lifecycle needs from storage (implemented by
// broker/internal/redisstore). Every method is atomic on its own.
type Store interface {
	Place(ctx context.Context, req fleet.PlaceRequest) (fleet.Allocation, error)
	Release(ctx context.Context, sliceID string) (bool, error)
	CreateServer(ctx context.Context, s fleet.Server) (fleet.Server, bool, error)
	GetServer(ctx context.Context, k fleet.ServerKey) (fleet.Server, error)
	ListServers(ctx context.Context, user string) ([]fleet.Server, error)
	Transition(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, error)
	Events(ctx context.Context, k fleet.ServerKey, afterID string, block time.Duration) ([]fleet.Event, error)
}

// Pods creates and deletes notebook pods (implemented by spawner.Client).
type Pods interface {
	Create(ctx context.Context, s spawner.Spec, secretEnv map[string]string) error
	Delete(ctx context.Context, user, server, spawnID string) error
	Pods() ([]spawner.ManagedPod, error)
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
}

// Option configures a Service.
type Option func(*Service)

// WithPolicy sets the placement policy; default fleet.PolicyBinpack.
func WithPolicy(p fleet.Policy) Option { return func(s *Service) { s.policy = p } }

// WithClock sets the time source for record timestamps; default time.Now.
func WithClock(now func() time.Time) Option { return func(s *Service) { s.now = now } }

// WithSpawnIDs sets the spawn id generator; default 16 random hex digits.
func WithSpawnIDs(f func() string) Option { return func(s *Service) { s.newID = f } }

// WithReconcileTrigger sets a function called when placement is refused
// because allocations are being rebuilt, so the reconciler runs at once.
func WithReconcileTrigger(f func()) Option { return func(s *Service) { s.kick = f } }

// New returns a Service over its dependencies.
func New(store Store, pods Pods, catalog Catalog, log *slog.Logger, opts ...Option) *Service {
	s := &Service{
		store: store, pods: pods, catalog: catalog, log: log,
		policy:  fleet.PolicyBinpack,
		timeout: 30 * time.Second,
		now:     time.Now,
		newID:   randomID,
		kick:    func() {},
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
// (created is then false). Refusals come back as errors matching
// fleet.ErrInvalid, fleet.ErrForbidden, fleet.ErrConflict, fleet.ErrNoCapacity,
// fleet.ErrQuotaExceeded or fleet.ErrNotReady; the server is then recorded
// as failed with the same readable message.
func (s *Service) Create(ctx context.Context, user string, groups []string, name string, req v1.CreateServerRequest, idempotencyKey string) (fleet.Server, bool, error) {
	if err := errors.Join(fleet.ValidateName("user", user), fleet.ValidateName("server", name)); err != nil {
		return fleet.Server{}, false, fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	plain, secret, err := splitEnv(req.Env, req.SecretEnv)
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
	now := s.now()
	rec, created, err := s.store.CreateServer(ctx, fleet.Server{
		ServerKey:      fleet.ServerKey{User: user, Name: name},
		Profile:        prof.Name,
		SpawnID:        s.newID(),
		IdempotencyKey: idempotencyKey,
		State:          v1.StatePending,
		Message:        fmt.Sprintf("server requested with profile %s", prof.DisplayName),
		Slice:          prof.Slice,
		CreatedAt:      now,
		UpdatedAt:      now,
	})
	if err != nil {
		return rec, false, err
	}
	if !created {
		if rec.Profile != prof.Name {
			return rec, false, fmt.Errorf("%w: Idempotency-Key %q was already used for a create with profile %q; use a new key for another request",
				fleet.ErrConflict, idempotencyKey, rec.Profile)
		}
		return rec, false, nil
	}
	// From here on the server exists: finish on a context the caller cannot
	// cancel, so a hung-up client leaves no half-created server.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	// Every spawn gets its own notebook token, in its Secret only; the
	// proxy adds it to the requests it forwards (ARCHITECTURE.md invariant 7).
	secret[v1.EnvNotebookToken] = newNotebookToken()
	command, args := req.Command, req.Args
	if command == nil && args == nil {
		command, args = prof.Command, prof.Args
	}
	rec, err = s.spawn(ctx, rec, prof, groups, plain, secret, command, args)
	return rec, true, err
}

// spawn places the slice and creates the pod for a pending record.
func (s *Service) spawn(ctx context.Context, rec fleet.Server, prof fleet.Profile, groups []string, plain, secret map[string]string, command, args []string) (fleet.Server, error) {
	log := s.log.With("user", rec.User, "server", rec.Name, "spawn_id", rec.SpawnID)
	rec, err := s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StatePlacing, "looking for a GPU with room for the slice", fleet.ServerPatch{})
	if err != nil {
		return rec, fmt.Errorf("server %s/%s: %w", rec.User, rec.Name, err)
	}
	userQuota, groupQuotas := s.catalog.Quotas().ForUser(rec.User, groups)
	alloc, err := s.store.Place(ctx, fleet.PlaceRequest{
		SliceID: rec.SpawnID, User: rec.User, Slice: prof.Slice, Model: prof.Model,
		Policy: s.policy, UserQuota: userQuota, GroupQuotas: groupQuotas,
	})
	if err != nil {
		if errors.Is(err, fleet.ErrNotReady) {
			s.kick()
		}
		return s.fail(ctx, rec, err, false), err
	}
	log.InfoContext(ctx, "slice placed", "gpu_uuid", alloc.GPUUUID, "node", alloc.Node, "mem_mib", alloc.Slice.MemoryMiB, "sm_percent", alloc.Slice.ComputePercent)
	msg := fmt.Sprintf("placed %d MiB and %d%% compute on GPU %s (node %s); creating the pod", alloc.Slice.MemoryMiB, alloc.Slice.ComputePercent, alloc.GPUUUID, alloc.Node)
	rec, err = s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateCreating, msg, fleet.ServerPatch{Allocation: &alloc})
	if err != nil {
		// Another actor (a delete, the reconciler) moved the server on; it
		// now owns the slice's release.
		return rec, fmt.Errorf("server %s/%s: %w", rec.User, rec.Name, err)
	}
	spec := spawner.Spec{
		User: rec.User, Server: rec.Name, SpawnID: rec.SpawnID, Profile: prof.Name,
		Image: prof.Image, CPU: prof.CPU, Memory: prof.Memory, Slice: alloc.Slice,
		GPU:         v1.GPURef{UUID: alloc.GPUUUID, Node: alloc.Node},
		QuotaGroups: alloc.Groups, Env: plain, SecretEnv: len(secret) > 0,
		Command: slices.Clone(command), Args: slices.Clone(args),
	}
	if err := s.pods.Create(ctx, spec, secret); err != nil {
		switch {
		case errors.Is(err, spawner.ErrRejected):
			// A refusal for good (ResourceQuota, admission, validation) is
			// the caller's to read, not an internal failure.
			err = fmt.Errorf("%w: the cluster refused the notebook pod: %s", fleet.ErrConflict, innermost(err))
		case errors.Is(err, spawner.ErrUnavailable):
			// The API server gave only transient answers (restarting,
			// overloaded) for as long as the spawner retried: nothing was
			// refused, so say so; the user can start the server again.
			log.WarnContext(ctx, "create pod", "err", err)
			err = fmt.Errorf("%w: the Kubernetes API did not take the notebook pod (it may be restarting); start the server again", fleet.ErrUnavailable)
		}
		return s.fail(ctx, rec, err, true), err
	}
	pod := spawner.PodName(rec.User, rec.Name)
	out, err := s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateStarting, "pod created; waiting for it to start", fleet.ServerPatch{Pod: &pod})
	if errors.Is(err, fleet.ErrConflict) {
		// The pod's own events (starting, running) got there first: the
		// spawn went on, so the create succeeded; answer with where it is.
		if cur, gerr := s.store.GetServer(ctx, rec.ServerKey); gerr == nil && cur.SpawnID == rec.SpawnID {
			return cur, nil
		}
	}
	return out, err
}

// fail records a failed spawn and releases what it held. It returns the
// record as last seen; errors are logged, since the caller already has the
// failure to report.
func (s *Service) fail(ctx context.Context, rec fleet.Server, cause error, podMayExist bool) fleet.Server {
	log := s.log.With("user", rec.User, "server", rec.Name, "spawn_id", rec.SpawnID)
	if podMayExist {
		if err := s.pods.Delete(ctx, rec.User, rec.Name, rec.SpawnID); err != nil {
			log.WarnContext(ctx, "delete pod of failed spawn", "err", err)
		}
	}
	if _, err := s.store.Release(ctx, rec.SpawnID); err != nil {
		log.WarnContext(ctx, "release slice of failed spawn", "err", err)
	}
	out, err := s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateFailed, fleet.Message(cause), fleet.ServerPatch{})
	if err != nil {
		log.WarnContext(ctx, "record failed spawn", "err", err)
		return rec
	}
	return out
}

// Get returns one server; fleet.ErrNotFound if it never existed.
func (s *Service) Get(ctx context.Context, key fleet.ServerKey) (fleet.Server, error) {
	return s.store.GetServer(ctx, key)
}

// List returns a user's servers, or every server when user is "".
func (s *Service) List(ctx context.Context, user string) ([]fleet.Server, error) {
	return s.store.ListServers(ctx, user)
}

// Events returns the server's events after afterID, waiting up to block
// for one when there are none yet.
func (s *Service) Events(ctx context.Context, key fleet.ServerKey, afterID string, block time.Duration) ([]fleet.Event, error) {
	if _, err := s.store.GetServer(ctx, key); err != nil {
		return nil, err
	}
	return s.store.Events(ctx, key, afterID, block)
}

// Delete stops a server: it deletes the pod (never the user's volumes) and
// releases the slice once the pod is gone. It is idempotent and works on
// half-created servers and on pods that vanished; fleet.ErrNotFound only if
// the server never existed. When the Kubernetes API does not take the pod's
// deletion (spawner.ErrUnavailable) the server stays stopping and the
// reconciler deletes the pod later (reconcile.Reconciler.Once).
func (s *Service) Delete(ctx context.Context, key fleet.ServerKey) (fleet.Server, error) {
	rec, err := s.store.GetServer(ctx, key)
	if err != nil || rec.State == v1.StateStopped {
		return rec, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	if rec.State != v1.StateStopping {
		rec, err = s.store.Transition(ctx, key, rec.SpawnID, v1.StateStopping, msgStopping, fleet.ServerPatch{})
		if err != nil {
			return rec, fmt.Errorf("server %s/%s: %w", key.User, key.Name, err)
		}
	}
	if err := s.pods.Delete(ctx, key.User, key.Name, rec.SpawnID); err != nil {
		if errors.Is(err, spawner.ErrUnavailable) {
			// The stop is recorded (stopping): the reconciler deletes the
			// pod once the API server answers, so the stop is accepted.
			s.log.WarnContext(ctx, "delete pod of a stopping server; the reconciler retries", "user", key.User, "server", key.Name, "spawn_id", rec.SpawnID, "err", err)
			return rec, nil
		}
		return rec, fmt.Errorf("server %s/%s: delete pod: %w", key.User, key.Name, err)
	}
	if s.podPresent(rec) {
		return rec, nil // released when the pod is gone (pod event or reconciler)
	}
	return s.finishStop(ctx, rec, "stopped")
}

// podPresent reports whether the spawner's cache still holds rec's pod. An
// unsynced cache counts as present, so nothing is released early.
func (s *Service) podPresent(rec fleet.Server) bool {
	pods, err := s.pods.Pods()
	if err != nil {
		return true
	}
	for _, p := range pods {
		if p.User == rec.User && p.Server == rec.Name && p.SpawnID == rec.SpawnID {
			return true
		}
	}
	return false
}

// msgStopping is the message of a stop that was asked for.
const msgStopping = "stopping: deleting the pod"

// stoppedMessage is the final message of a stopping server: "stopped" for
// a stop that was asked for, else the reason it is stopping (the notebook
// ended by itself), so the stopped server still says why.
func stoppedMessage(rec fleet.Server) string {
	if rec.Message == "" || rec.Message == msgStopping {
		return "stopped"
	}
	return rec.Message
}

// finishStop releases a stopping server's slice and records it stopped.
func (s *Service) finishStop(ctx context.Context, rec fleet.Server, message string) (fleet.Server, error) {
	if _, err := s.store.Release(ctx, rec.SpawnID); err != nil {
		return rec, fmt.Errorf("server %s/%s: release slice: %w", rec.User, rec.Name, err)
	}
	return s.store.Transition(ctx, rec.ServerKey, rec.SpawnID, v1.StateStopped, message, fleet.ServerPatch{URL: new(string)})
}

// Abandon fails a spawn that was interrupted before its pod existed (a
// broker crash between steps): any pod is deleted and the slice released.
// It is a no-op for a record that moved on meanwhile.
func (s *Service) Abandon(ctx context.Context, rec fleet.Server, reason string) {
	s.fail(ctx, rec, errors.New(reason), true)
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
