package v1

import "time"

// ReclaimAction is what the reclaimer does with a server that counts as idle.
type ReclaimAction string

// The reclaim actions.
const (
	// ReclaimWarn only tells the user (and the audit log).
	ReclaimWarn ReclaimAction = "warn"
	// ReclaimShrink lowers the slice's guaranteed compute to
	// ShrinkComputePercent while the notebook keeps running.
	ReclaimShrink ReclaimAction = "shrink"
	// ReclaimStop stops the server (its data stays).
	ReclaimStop ReclaimAction = "stop"
)

// ReclaimPolicy is the idle-reclaim policy document, the body of GET and
// PUT /api/v1/admin/reclaim-policy.
type ReclaimPolicy struct {
	// Version counts saved versions; 0 means never saved (the defaults). A
	// PUT sends the version its edit started from; if another version was
	// saved since, the answer is 409 and says who changed what.
	Version int64 `json:"version"`
	// Enabled turns acting on idle servers on; when false they are only
	// reported.
	Enabled bool `json:"enabled"`
	// IdleComputePercent: a server whose SM utilization stays at or below
	// this share of its GPU is idle; 0..100.
	IdleComputePercent int `json:"idleComputePercent"`
	// IdleAfterSeconds is how long a server must stay idle before the
	// action applies; 60..604800 (1 minute to 7 days).
	IdleAfterSeconds int64 `json:"idleAfterSeconds"`
	// Action is warn, shrink or stop.
	Action ReclaimAction `json:"action"`
	// WarnSeconds is the notice given before shrink or stop; 0..86400, and
	// less than IdleAfterSeconds.
	WarnSeconds int64 `json:"warnSeconds"`
	// ShrinkComputePercent is the guaranteed compute after a shrink, 1..100;
	// required when Action is shrink, else 0.
	ShrinkComputePercent int `json:"shrinkComputePercent,omitempty"`
	// ExemptGroups: servers of members of these groups are never reclaimed.
	ExemptGroups []string `json:"exemptGroups,omitempty"`
	// ExemptUsers: these users' servers are never reclaimed.
	ExemptUsers []string `json:"exemptUsers,omitempty"`
	// StopAfterSeconds: with the shrink action, the idle time after which
	// the server is also stopped; 0 = never.
	StopAfterSeconds int64 `json:"stopAfterSeconds,omitempty"`
	// MinRunningSeconds: a server running for less than this is never
	// idle; 0 = none.
	MinRunningSeconds int64 `json:"minRunningSeconds,omitempty"`
	// MaxAgeSeconds: a server running longer than this is stopped whatever
	// its use; 0 = no limit, else 3600..7776000.
	MaxAgeSeconds int64 `json:"maxAgeSeconds,omitempty"`
	// MaxExtendSeconds: the total time a user may extend one spawn's idle
	// clock by; 0 = the default (4 hours).
	MaxExtendSeconds int64 `json:"maxExtendSeconds,omitempty"`
	// DryRun: decide and audit every action, but do not warn, shrink or stop.
	DryRun bool `json:"dryRun,omitempty"`
	// Overrides replace fields for servers of one profile or of members of
	// one group; a profile override wins over a group one.
	Overrides []ReclaimOverride `json:"overrides,omitempty"`
	// Reason is the admin's note on the change; it goes to the audit log.
	Reason string `json:"reason,omitempty"`
	// UpdatedBy and UpdatedAt name who saved this version and when;
	// read-only (ignored in a PUT).
	UpdatedBy string     `json:"updatedBy,omitempty"`
	UpdatedAt *time.Time `json:"updatedAt,omitempty"`
}

// ReclaimOverride replaces policy fields for the servers it matches: those
// of Profile, or of members of Group (set one). Zero fields inherit.
type ReclaimOverride struct {
	Profile              string        `json:"profile,omitempty"`
	Group                string        `json:"group,omitempty"`
	Exempt               bool          `json:"exempt,omitempty"`
	IdleAfterSeconds     int64         `json:"idleAfterSeconds,omitempty"`
	WarnSeconds          int64         `json:"warnSeconds,omitempty"`
	StopAfterSeconds     int64         `json:"stopAfterSeconds,omitempty"`
	MinRunningSeconds    int64         `json:"minRunningSeconds,omitempty"`
	MaxAgeSeconds        int64         `json:"maxAgeSeconds,omitempty"`
	Action               ReclaimAction `json:"action,omitempty"`
	ShrinkComputePercent int           `json:"shrinkComputePercent,omitempty"`
}

// FieldProblem is one invalid field of a request body, in Error.Fields.
type FieldProblem struct {
	// Field is the JSON name of the field, e.g. "idleAfterSeconds".
	Field string `json:"field"`
	// Message says what is wrong in words, e.g. "must be between 60 and 604800".
	Message string `json:"message"`
}

// AuditEntry is one audited action (ARCHITECTURE.md invariant 6), as GET
// /api/v1/admin/audit lists it: the broker's own (the reclaim policy, the
// reclaimer, extensions) and the node agents' enforcement records, in one
// log. It is also the form in which the broker stores its entries, so that
// every part that acts (later: every lifecycle action by a user, the hub,
// an admin, the reclaimer or an agent) records the same shape.
type AuditEntry struct {
	// ID is the entry's id within its source's log (a Redis stream id,
	// "<ms>-<seq>"); Source and ID together identify an entry.
	ID   string    `json:"id"`
	Time time.Time `json:"time"`
	// Source is the log the entry comes from: AuditSourceReclaim (the
	// broker's reclaim policy and reclaimer) or AuditSourceAgent (a node
	// agent's enforcement).
	Source string `json:"source"`
	// Actor is who acted: a user name, "jupyterhub", "reclaimer", or
	// "gpubroker-agent@<node>".
	Actor string `json:"actor"`
	// ActorKind says what kind of actor: user, admin, hub, reclaimer or
	// agent; empty when not recorded.
	ActorKind string `json:"actorKind,omitempty"`
	// Action names what was done, e.g. "reclaim-policy.update",
	// "reclaim.stop", "agent.kill".
	Action string `json:"action"`
	// Target names what it was done to, e.g. "reclaim-policy",
	// "server:<user>/<name>", "pod:<namespace>/<pod>".
	Target string `json:"target"`
	Reason string `json:"reason,omitempty"`
	// PolicyVersion is the reclaim policy version in force (or saved).
	PolicyVersion int64 `json:"policyVersion,omitempty"`
	// Inputs are the inputs to the decision; for a policy change, each
	// changed field as "old → new".
	Inputs map[string]string `json:"inputs,omitempty"`
}

// The audit sources.
const (
	// AuditSourceReclaim: the reclaim policy's changes and the reclaimer's
	// actions (and extensions), in the broker's log.
	AuditSourceReclaim = "reclaim"
	// AuditSourceServers: the server lifecycle's actions (create, stop,
	// remove, resize) by a user, the hub, an admin or the reclaimer, in the
	// broker's log.
	AuditSourceServers = "servers"
	// AuditSourceAgent: the node agents' enforcement records.
	AuditSourceAgent = "agent"
)

// The audit actor kinds.
const (
	ActorUser      = "user"
	ActorAdmin     = "admin"
	ActorHub       = "hub"
	ActorReclaimer = "reclaimer"
	ActorAgent     = "agent"
)

// AuditPage is the body of GET /api/v1/admin/audit.
type AuditPage struct {
	// Entries are the page's entries, newest first.
	Entries []AuditEntry `json:"entries"`
	// Next is the cursor (?before=) of the following page; "" on the last.
	// It is opaque: it holds the position in each source's log.
	Next string `json:"next,omitempty"`
}

// ReclaimPreview is the answer of POST
// /api/v1/admin/reclaim-policy/preview: what the reclaimer's next cycle
// would do to every running server if the posted policy were saved now
// with reclaiming on and no dry run. Nothing is done, audited or stored;
// with Policy.Enabled false or Policy.DryRun true, none of it would reach
// the servers.
type ReclaimPreview struct {
	// Policy is the posted policy as it would be saved (normalized).
	Policy ReclaimPolicy `json:"policy"`
	// At is when the reclaimer looked.
	At time.Time `json:"at"`
	// Servers are the running servers, by user and name.
	Servers []ReclaimPreviewServer `json:"servers"`
}

// ReclaimPreviewServer is what one cycle would do to one running server.
type ReclaimPreviewServer struct {
	User    string `json:"user"`
	Name    string `json:"name"`
	Profile string `json:"profile"`
	// Idle is the server's idle state after that cycle: the verdict and
	// its reason, whether the policy exempts it, and the next action with
	// its time if it stays idle.
	Idle IdleState `json:"idle"`
	// Actions are the actions due now, in order; empty when nothing
	// happens now.
	Actions []ReclaimPreviewAction `json:"actions"`
}

// ReclaimPreviewAction is one action of a preview.
type ReclaimPreviewAction struct {
	// Action is warn, shrink, restore or stop, or notice for a message
	// without an action (the idle countdown is cancelled).
	Action string `json:"action"`
	// Message is the event the server's user would see, e.g. "idle for 50
	// min; will stop at 15:30 UTC unless extended (your files are kept)".
	Message string `json:"message"`
}
