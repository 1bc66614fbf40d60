package v1

import "time"

// IdleVerdict is what the idle reclaimer makes of a running server.
type IdleVerdict string

// The verdicts. Only idle can lead to an action; unknown never does.
const (
	IdleActive    IdleVerdict = "active"
	IdleIdle      IdleVerdict = "idle"
	IdleUnknown   IdleVerdict = "unknown"
	IdleUnchecked IdleVerdict = "unchecked" // not looked at since this start
)

// IdleState is the answer of GET /api/v1/users/{user}/servers/{name}/idle
// and POST …/extend: the reclaimer's view of the server's current start.
type IdleState struct {
	// Verdict is active, idle, unknown, or unchecked before the
	// reclaimer's first look at this start of the server.
	Verdict IdleVerdict `json:"verdict"`
	// Reason says why active or unknown, e.g. "the GPU is busy".
	Reason string `json:"reason,omitempty"`
	// Since is when the verdict began (for idle: the idle clock).
	Since *time.Time `json:"since,omitempty"`
	// Exempt: the policy never reclaims this server.
	Exempt bool `json:"exempt"`
	// NextAction (warn, shrink, stop) happens at NextAt if the server
	// stays idle; empty when nothing is scheduled.
	NextAction ReclaimAction `json:"nextAction,omitempty"`
	NextAt     *time.Time    `json:"nextAt,omitempty"`
	// ExtendedUntil: no idle action before it (absent once passed).
	ExtendedUntil *time.Time `json:"extendedUntil,omitempty"`
	// ExtendedSeconds is the total extension of this start.
	ExtendedSeconds int64 `json:"extendedSeconds"`
}

// ExtendRequest is the body of POST
// /api/v1/users/{user}/servers/{name}/extend.
type ExtendRequest struct {
	// Seconds to postpone idle actions by; 60..604800 (1 minute to 7
	// days), and within the policy's maxExtendSeconds per start.
	Seconds int64 `json:"seconds"`
}
