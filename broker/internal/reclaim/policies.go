package reclaim

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
)

// PolicyStore keeps the versions of the policy and writes the audit entry
// of each save in the same atomic step (implemented by
// broker/internal/redisstore.Reclaim). Implementations are safe for
// concurrent use, also across replicas.
type PolicyStore interface {
	// Policy returns the current policy; ok is false when none was saved.
	Policy(ctx context.Context) (p Policy, ok bool, err error)
	// SavePolicy saves p as version p.Version if the current version is
	// p.Version-1, keeps it in the history and appends entry to the audit
	// log, all in one step; saved is false (and nothing is written) when
	// another version was saved since.
	SavePolicy(ctx context.Context, p Policy, entry audit.Entry) (saved bool, err error)
	// PolicyHistory returns the versions still kept (at least the last 100)
	// by version number.
	PolicyHistory(ctx context.Context) (map[int64]Policy, error)
}

// Policies is the reclaim policy with its rules for saving: validation,
// optimistic concurrency on the version, the audit entry of every save and
// the explanation of a conflict. Safe for concurrent use.
type Policies struct {
	store PolicyStore
	now   func() time.Time
	log   *slog.Logger
	// seen is the version last read from the store (0: none), reset when
	// the store has none any more, which is logged then.
	seen atomic.Int64
}

// NewPolicies returns the policies kept in store; now is the clock for
// UpdatedAt and audit times (nil means time.Now); log (nil: discarded)
// gets the warning when a stored policy disappears.
func NewPolicies(store PolicyStore, now func() time.Time, log *slog.Logger) *Policies {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Policies{store: store, now: now, log: log}
}

// Get returns the current policy, or DefaultPolicy (version 0) when none
// is stored. When this process had read a stored version and the store
// has none any more (its data was lost: a Redis FLUSHALL, a failover to an
// empty replica), it logs a warning once, naming the version lost; the
// answer's Source (API) says "default" meanwhile.
func (ps *Policies) Get(ctx context.Context) (Policy, error) {
	p, ok, err := ps.store.Policy(ctx)
	if err != nil {
		return Policy{}, err
	}
	if !ok {
		if lost := ps.seen.Swap(0); lost > 0 {
			ps.log.WarnContext(ctx, "the stored reclaim policy is gone (the store lost its data?): the reclaimer uses the built-in defaults until an admin saves a policy again",
				"lost_version", lost)
		}
		return DefaultPolicy(), nil
	}
	ps.seen.Store(p.Version)
	return p, nil
}

// Put saves p as the next version if p.Version is the current version
// (optimistic concurrency), recording actor (an admin), the time and an audit entry
// with the changed fields in the same atomic step. It returns the saved
// policy. Errors: *ValidationError (fleet.ErrInvalid) for an invalid p,
// *ConflictError (fleet.ErrConflict) when another version was saved since
// p.Version, or a storage error.
func (ps *Policies) Put(ctx context.Context, p Policy, actor string) (Policy, error) {
	p = p.Normalize()
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	base, err := ps.Get(ctx)
	if err != nil {
		return Policy{}, err
	}
	if base.Version != p.Version {
		return Policy{}, ps.conflict(ctx, p.Version)
	}
	now := ps.now().UTC().Truncate(time.Second)
	p.Version, p.UpdatedBy, p.UpdatedAt = base.Version+1, actor, now
	entry := audit.Entry{
		Time: now, Source: v1.AuditSourceReclaim, Actor: actor, ActorKind: v1.ActorAdmin, Action: AuditPolicyUpdate, Target: AuditTargetPolicy,
		Reason: p.Reason, PolicyVersion: p.Version, Inputs: p.changes(base),
	}
	saved, err := ps.store.SavePolicy(ctx, p, entry)
	if err != nil {
		return Policy{}, err
	}
	if !saved {
		// Someone saved between our read and the store's step.
		return Policy{}, ps.conflict(ctx, p.Version-1)
	}
	return p, nil
}

// conflict builds the ConflictError for an edit based on version base.
func (ps *Policies) conflict(ctx context.Context, base int64) error {
	cur, err := ps.Get(ctx)
	if err != nil {
		return err
	}
	ce := &ConflictError{Base: base, Current: cur}
	if base > cur.Version || base < 0 {
		return ce
	}
	hist, err := ps.store.PolicyHistory(ctx)
	if err != nil {
		return err
	}
	from := DefaultPolicy()
	if base > 0 {
		p, ok := hist[base]
		if !ok {
			ce.Changes = map[string]string{}
			return ce // too old to tell what changed
		}
		from = p
	}
	for v := base + 1; v <= cur.Version; v++ {
		if p, ok := hist[v]; ok {
			ce.Since = append(ce.Since, p)
		}
	}
	ce.Changes = cur.changes(from)
	return ce
}
