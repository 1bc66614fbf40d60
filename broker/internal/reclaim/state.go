package reclaim

import (
	"context"
	"time"
)

// IdleStates keeps the reclaimer's idle state of each spawn (implemented by
// broker/internal/redisstore.Reclaim). A spawn's state is keyed by its
// spawn id, so every start begins with a fresh clock; the store collects
// the states of spawns that ended. Safe for concurrent use.
type IdleStates interface {
	// IdleStates returns the stored state of each spawn, in order; a spawn
	// without one has only SpawnID set.
	IdleStates(ctx context.Context, spawnIDs []string) ([]IdleState, error)
	// SaveIdleStates writes the cycle's fields of each state; it never
	// writes ExtendedUntil and Extended, which only ExtendIdle changes, so a
	// cycle cannot undo an extension granted while it ran.
	SaveIdleStates(ctx context.Context, states []IdleState) error
	// ExtendIdle atomically grants an extension of d to spawnID's idle
	// clock at now, unless the spawn's total extension would pass limit.
	ExtendIdle(ctx context.Context, spawnID string, now time.Time, d, limit time.Duration) (Extension, error)
}

// Extension is the outcome of IdleStates.ExtendIdle.
type Extension struct {
	// Granted: the extension was added. When false nothing changed and
	// Total is the extension granted so far.
	Granted bool
	// Until: no idle action before this time (when Granted).
	Until time.Time
	// Total is the spawn's total extension.
	Total time.Duration
}

// IdleState is what the reclaimer knows about one spawn of a server.
type IdleState struct {
	// SpawnID is the spawn the state belongs to.
	SpawnID string
	// Verdict is the last verdict; "" when the reclaimer has not seen the
	// spawn yet.
	Verdict Verdict
	// Reason says why the verdict is active or unknown.
	Reason string
	// Since is when the current verdict began (for idle: the idle clock).
	Since time.Time
	// FirstSeen is the first cycle that saw the spawn running.
	FirstSeen time.Time
	// CheckedAt is when the state was last written.
	CheckedAt time.Time
	// Exempt: the server is exempt from reclaim by policy.
	Exempt bool
	// Rung counts the idle ladder's rungs done; WarnedAt is the time of the
	// last warning of the ladder (zero when none is pending).
	Rung     int
	WarnedAt time.Time
	// AgeWarnedAt is when the maximum-age warning was given (zero: not yet).
	AgeWarnedAt time.Time
	// ExtendedUntil: no idle action before this time; Extended is the
	// total extension granted to this spawn.
	ExtendedUntil time.Time
	Extended      time.Duration
	// ShrunkFrom is the guaranteed and burst compute before a shrink (0
	// when not shrunk).
	ShrunkFrom, ShrunkLimitFrom int
	// StoppedAt is when the reclaimer stopped the spawn (zero: it did not,
	// or only in a dry run); it counts the slice as freed while the server
	// stays stopped (gpubroker_reclaim_freed_gpus).
	StoppedAt time.Time
	// NextAction and NextAt are the next step of the ladder when the
	// server stays idle (empty when none); set by State, not stored.
	NextAction Action
	NextAt     time.Time
}
