package reclaim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// This file is the reclaim policy document: its type, validation, and a
// versioned store in Redis whose every change is audited. The reclaimer
// (idle detection and actions) builds on it.
//
// Redis keys: redisschema.Keys.ReclaimPolicy, ReclaimPolicyVersion,
// ReclaimPolicyHistory and Audit (see the table there). None of them can be
// orphaned: they are singletons, bounded in size.

// Action is what happens to an idle server.
type Action string

// The actions.
const (
	ActionWarn   Action = "warn"
	ActionShrink Action = "shrink"
	ActionStop   Action = "stop"
)

// Bounds of the policy's fields.
const (
	MinIdleAfter = time.Minute
	MaxIdleAfter = 7 * 24 * time.Hour
	MaxWarn      = 24 * time.Hour
	// maxExemptGroups bounds ExemptGroups.
	maxExemptGroups = 64
	// maxReasonBytes bounds Reason.
	maxReasonBytes = 500
)

// Store bounds.
const (
	historyKeep = 100   // policy versions kept for conflict explanations
	auditMaxLen = 10000 // audit entries kept (approximately)
	opTimeout   = 5 * time.Second
)

// Policy is the reclaim policy. The zero value is not valid; start from
// DefaultPolicy.
type Policy struct {
	// Version counts saved versions; 0 is the built-in default.
	Version int64
	// Enabled: act on idle servers; when false they are only reported.
	Enabled bool
	// IdleComputePercent: SM utilization at or below this share of the GPU
	// is idle; 0..100.
	IdleComputePercent int
	// IdleAfter: how long a server stays idle before the action; 1 min..7 days.
	IdleAfter time.Duration
	// Action: warn, shrink or stop.
	Action Action
	// Warn: notice before shrink or stop; 0..24 h and less than IdleAfter.
	Warn time.Duration
	// ShrinkComputePercent: guaranteed compute after a shrink, 1..100 for
	// shrink, else 0.
	ShrinkComputePercent int
	// ExemptGroups: members' servers are never reclaimed; sorted, unique.
	ExemptGroups []string
	// ExemptUsers: these users' servers are never reclaimed; sorted, unique.
	ExemptUsers []string
	// StopAfter: with the shrink action, how long a server stays idle
	// before a shrunken server is stopped too; 0 = never (shrink is the
	// last rung). When set it must exceed IdleAfter+Warn; at most MaxIdleAfter.
	StopAfter time.Duration
	// MinRunning: a server running for less than this is never idle (its
	// idle clock starts at running+MinRunning); 0..MaxIdleAfter, 0 = none.
	MinRunning time.Duration
	// MaxAge: a server running longer than this is stopped whatever its
	// activity (after Warn notice); 0 = no limit; else 1 h..90 days.
	MaxAge time.Duration
	// MaxExtend: the total time a user may extend one spawn's idle clock
	// by; 0 means DefaultMaxExtend; at most MaxIdleAfter.
	MaxExtend time.Duration
	// DryRun: decide and audit every action, but do not warn, shrink or
	// stop (no events, no quota changes).
	DryRun bool
	// Overrides replace fields for servers of one profile or of members of
	// one group; the first matching override wins, profile ones before
	// group ones (see Effective). At most maxOverrides.
	Overrides []Override
	// Reason is the note of the change that saved this version.
	Reason string
	// UpdatedBy and UpdatedAt: who saved this version and when (zero for
	// the default).
	UpdatedBy string
	UpdatedAt time.Time
}

// Override replaces fields of the policy for the servers of Profile or for
// the members of Group (exactly one of them is set). Zero fields keep the
// policy's value.
type Override struct {
	Profile string `json:"profile,omitempty"`
	Group   string `json:"group,omitempty"`
	// Exempt: matching servers are never reclaimed.
	Exempt bool `json:"exempt,omitempty"`
	// IdleAfterSeconds, WarnSeconds, StopAfterSeconds, MinRunningSeconds,
	// MaxAgeSeconds: as the policy's fields, in seconds; 0 = inherit.
	IdleAfterSeconds  int64 `json:"idleAfterSeconds,omitempty"`
	WarnSeconds       int64 `json:"warnSeconds,omitempty"`
	StopAfterSeconds  int64 `json:"stopAfterSeconds,omitempty"`
	MinRunningSeconds int64 `json:"minRunningSeconds,omitempty"`
	MaxAgeSeconds     int64 `json:"maxAgeSeconds,omitempty"`
	// Action: "" = inherit.
	Action Action `json:"action,omitempty"`
	// ShrinkComputePercent: 0 = inherit.
	ShrinkComputePercent int `json:"shrinkComputePercent,omitempty"`
}

// Limits of the added fields.
const (
	// DefaultMaxExtend is the total extension per spawn when MaxExtend is 0.
	DefaultMaxExtend = 4 * time.Hour
	// MinMaxAge and MaxMaxAge bound MaxAge when it is set.
	MinMaxAge    = time.Hour
	MaxMaxAge    = 90 * 24 * time.Hour
	maxOverrides = 64
)

// Effective returns the policy that applies to a server of profile whose
// user is in groups: the first override naming profile, else the first
// (in Overrides order) naming one of groups, applied over p; exempt
// reports whether the server must never be reclaimed (an exempt user or
// group, or an exempt override).
func (p Policy) Effective(user, profile string, groups []string) (eff Policy, exempt bool) {
	if slices.Contains(p.ExemptUsers, user) {
		exempt = true
	}
	for _, g := range groups {
		if slices.Contains(p.ExemptGroups, g) {
			exempt = true
		}
	}
	eff = p
	match := -1
	for i, o := range p.Overrides {
		if o.Profile != "" && o.Profile == profile {
			match = i
			break
		}
	}
	if match < 0 {
		for i, o := range p.Overrides {
			if o.Group != "" && slices.Contains(groups, o.Group) {
				match = i
				break
			}
		}
	}
	if match >= 0 {
		exempt = exempt || p.Overrides[match].Exempt
		eff = p.applyOverride(p.Overrides[match])
	}
	if eff.MaxExtend <= 0 {
		eff.MaxExtend = DefaultMaxExtend
	}
	eff.Overrides = nil
	return eff, exempt
}

// applyOverride returns p with o's non-zero fields in place and no
// overrides.
func (p Policy) applyOverride(o Override) Policy {
	set := func(dst *time.Duration, secs int64) {
		if secs > 0 {
			*dst = time.Duration(secs) * time.Second
		}
	}
	set(&p.IdleAfter, o.IdleAfterSeconds)
	set(&p.Warn, o.WarnSeconds)
	set(&p.StopAfter, o.StopAfterSeconds)
	set(&p.MinRunning, o.MinRunningSeconds)
	set(&p.MaxAge, o.MaxAgeSeconds)
	if o.Action != "" {
		p.Action = o.Action
	}
	if o.ShrinkComputePercent > 0 {
		p.ShrinkComputePercent = o.ShrinkComputePercent
	}
	if p.Action != ActionShrink {
		p.ShrinkComputePercent, p.StopAfter = 0, 0
	}
	p.Overrides = nil
	return p
}

// DefaultPolicy is the policy before any admin saved one: reclaiming off,
// idle at ≤ 5 % SM for 1 h, action warn with 15 min notice.
func DefaultPolicy() Policy {
	return Policy{IdleComputePercent: 5, IdleAfter: time.Hour, Action: ActionWarn, Warn: 15 * time.Minute}
}

// FieldProblem is one invalid field; Field is the wire (JSON) name.
type FieldProblem struct {
	Field   string
	Message string
}

// ValidationError lists every invalid field of a policy. It matches
// fleet.ErrInvalid.
type ValidationError struct {
	Problems []FieldProblem
}

// Error joins the problems as "field: message; field: message".
func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.Field + ": " + p.Message
	}
	return "the policy is not valid: " + strings.Join(parts, "; ")
}

// Unwrap makes errors.Is(err, fleet.ErrInvalid) true.
func (e *ValidationError) Unwrap() error { return fleet.ErrInvalid }

// Validate returns nil or a *ValidationError naming every invalid field.
// It does not normalize; Put calls Normalize first.
func (p Policy) Validate() error {
	var ps []FieldProblem
	add := func(f, m string) { ps = append(ps, FieldProblem{f, m}) }
	if p.IdleComputePercent < 0 || p.IdleComputePercent > 100 {
		add("idleComputePercent", "must be between 0 and 100 (percent of the GPU's SMs)")
	}
	if p.IdleAfter < MinIdleAfter || p.IdleAfter > MaxIdleAfter {
		add("idleAfterSeconds", fmt.Sprintf("must be between %d and %d seconds (1 minute to 7 days)", int64(MinIdleAfter/time.Second), int64(MaxIdleAfter/time.Second)))
	}
	switch p.Action {
	case ActionWarn, ActionStop:
		if p.ShrinkComputePercent != 0 {
			add("shrinkComputePercent", "applies only to the shrink action; leave it empty")
		}
	case ActionShrink:
		if p.ShrinkComputePercent < 1 || p.ShrinkComputePercent > 100 {
			add("shrinkComputePercent", "must be between 1 and 100 for the shrink action")
		}
	default:
		add("action", "must be warn, shrink or stop")
	}
	switch {
	case p.Warn < 0 || p.Warn > MaxWarn:
		add("warnSeconds", fmt.Sprintf("must be between 0 and %d seconds (24 hours)", int64(MaxWarn/time.Second)))
	case p.Warn >= p.IdleAfter && p.IdleAfter >= MinIdleAfter:
		add("warnSeconds", "must be shorter than the idle time, so that the warning comes before the action")
	}
	if len(p.ExemptGroups) > maxExemptGroups {
		add("exemptGroups", fmt.Sprintf("at most %d groups", maxExemptGroups))
	}
	for _, g := range p.ExemptGroups {
		if strings.TrimSpace(g) == "" || len(g) > 256 {
			add("exemptGroups", "group names must be 1 to 256 characters")
			break
		}
	}
	if len(p.ExemptUsers) > maxExemptGroups {
		add("exemptUsers", fmt.Sprintf("at most %d users", maxExemptGroups))
	}
	if p.StopAfter != 0 {
		switch {
		case p.Action != ActionShrink:
			add("stopAfterSeconds", "applies only to the shrink action (stop after shrinking); leave it empty")
		case p.StopAfter <= p.IdleAfter+p.Warn || p.StopAfter > MaxIdleAfter:
			add("stopAfterSeconds", "must be longer than the idle time plus the warning, and at most 7 days")
		}
	}
	if p.MinRunning < 0 || p.MinRunning > MaxIdleAfter {
		add("minRunningSeconds", "must be between 0 and 7 days")
	}
	if p.MaxAge != 0 && (p.MaxAge < MinMaxAge || p.MaxAge > MaxMaxAge || p.MaxAge <= p.Warn) {
		add("maxAgeSeconds", "must be 0 (no limit) or between 1 hour and 90 days, and longer than the warning")
	}
	if p.MaxExtend < 0 || p.MaxExtend > MaxIdleAfter {
		add("maxExtendSeconds", "must be between 0 (the default of 4 hours) and 7 days")
	}
	if len(p.Overrides) > maxOverrides {
		add("overrides", fmt.Sprintf("at most %d overrides", maxOverrides))
	}
	for i, o := range p.Overrides {
		f := fmt.Sprintf("overrides[%d]", i)
		if (o.Profile == "") == (o.Group == "") {
			add(f, "name exactly one of profile and group")
		}
		if o.Action != "" && o.Action != ActionWarn && o.Action != ActionShrink && o.Action != ActionStop {
			add(f+".action", "must be warn, shrink or stop")
		}
		if o.IdleAfterSeconds < 0 || o.WarnSeconds < 0 || o.StopAfterSeconds < 0 || o.MinRunningSeconds < 0 || o.MaxAgeSeconds < 0 || o.ShrinkComputePercent < 0 || o.ShrinkComputePercent > 100 {
			add(f, "times must not be negative and shrinkComputePercent must be 0..100")
			continue
		}
		if err := p.applyOverride(o).Validate(); err != nil {
			add(f, "the policy with this override is not valid: "+err.Error())
		}
	}
	if len(p.Reason) > maxReasonBytes {
		add("reason", fmt.Sprintf("at most %d bytes", maxReasonBytes))
	}
	if len(ps) == 0 {
		return nil
	}
	return &ValidationError{Problems: ps}
}

// Normalize trims and sorts ExemptGroups (dropping empty and duplicate
// names) and trims Reason.
func (p Policy) Normalize() Policy {
	var gs []string
	for _, g := range p.ExemptGroups {
		if g = strings.TrimSpace(g); g != "" {
			gs = append(gs, g)
		}
	}
	slices.Sort(gs)
	p.ExemptGroups = slices.Compact(gs)
	var us []string
	for _, u := range p.ExemptUsers {
		if u = strings.TrimSpace(u); u != "" {
			us = append(us, u)
		}
	}
	slices.Sort(us)
	p.ExemptUsers = slices.Compact(us)
	p.Reason = strings.TrimSpace(p.Reason)
	return p
}

// changes lists the fields that differ from old to p as "old → new", keyed
// by wire name, for the audit log and conflict messages.
func (p Policy) changes(old Policy) map[string]string {
	out := map[string]string{}
	cmp := func(field, a, b string) {
		if a != b {
			out[field] = a + " → " + b
		}
	}
	cmp("enabled", strconv.FormatBool(old.Enabled), strconv.FormatBool(p.Enabled))
	cmp("idleComputePercent", strconv.Itoa(old.IdleComputePercent), strconv.Itoa(p.IdleComputePercent))
	cmp("idleAfterSeconds", strconv.FormatInt(int64(old.IdleAfter/time.Second), 10), strconv.FormatInt(int64(p.IdleAfter/time.Second), 10))
	cmp("action", string(old.Action), string(p.Action))
	cmp("warnSeconds", strconv.FormatInt(int64(old.Warn/time.Second), 10), strconv.FormatInt(int64(p.Warn/time.Second), 10))
	cmp("shrinkComputePercent", strconv.Itoa(old.ShrinkComputePercent), strconv.Itoa(p.ShrinkComputePercent))
	cmp("exemptGroups", "["+strings.Join(old.ExemptGroups, ", ")+"]", "["+strings.Join(p.ExemptGroups, ", ")+"]")
	cmp("exemptUsers", "["+strings.Join(old.ExemptUsers, ", ")+"]", "["+strings.Join(p.ExemptUsers, ", ")+"]")
	secs := func(d time.Duration) string { return strconv.FormatInt(int64(d/time.Second), 10) }
	cmp("stopAfterSeconds", secs(old.StopAfter), secs(p.StopAfter))
	cmp("minRunningSeconds", secs(old.MinRunning), secs(p.MinRunning))
	cmp("maxAgeSeconds", secs(old.MaxAge), secs(p.MaxAge))
	cmp("maxExtendSeconds", secs(old.MaxExtend), secs(p.MaxExtend))
	cmp("dryRun", strconv.FormatBool(old.DryRun), strconv.FormatBool(p.DryRun))
	ob, _ := json.Marshal(old.Overrides)
	nb, _ := json.Marshal(p.Overrides)
	cmp("overrides", string(ob), string(nb))
	return out
}

// ConflictError is a Put whose base version is not the current one. It
// matches fleet.ErrConflict, and its message says who changed what since.
type ConflictError struct {
	// Base is the version the edit started from; Current is the saved one.
	Base    int64
	Current Policy
	// Since lists the versions saved after Base, oldest first (those still
	// in the history).
	Since []Policy
	// Changes are the fields that differ between Base and Current.
	Changes map[string]string
}

// Error is a sentence for the admin.
func (e *ConflictError) Error() string {
	if e.Base > e.Current.Version {
		return fmt.Sprintf("version %d of the policy does not exist; the current version is %d; reload the policy and edit it again", e.Base, e.Current.Version)
	}
	var who []string
	for _, p := range e.Since {
		who = append(who, fmt.Sprintf("version %d by %s at %s", p.Version, p.UpdatedBy, p.UpdatedAt.UTC().Format("2006-01-02 15:04 UTC")))
	}
	var what []string
	for _, k := range slices.Sorted(mapsKeys(e.Changes)) {
		what = append(what, k+" "+e.Changes[k])
	}
	msg := fmt.Sprintf("the policy changed while you edited it (you started from version %d; the current version is %d", e.Base, e.Current.Version)
	if len(who) > 0 {
		msg += ": " + strings.Join(who, ", ")
	}
	msg += ")"
	if len(what) > 0 {
		msg += "; changed: " + strings.Join(what, ", ")
	} else {
		msg += "; no field differs from your starting point"
	}
	return msg + ". Review the current policy and apply your change again"
}

// Unwrap makes errors.Is(err, fleet.ErrConflict) true.
func (e *ConflictError) Unwrap() error { return fleet.ErrConflict }

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// AuditEntry is one audited action.
type AuditEntry struct {
	// ID is the Redis stream id (set when read).
	ID            string            `json:"-"`
	Time          time.Time         `json:"time"`
	Actor         string            `json:"actor"`
	Action        string            `json:"action"`
	Target        string            `json:"target"`
	Reason        string            `json:"reason,omitempty"`
	PolicyVersion int64             `json:"policyVersion,omitempty"`
	Inputs        map[string]string `json:"inputs,omitempty"`
}

// Audit actions and targets written by this file.
const (
	AuditPolicyUpdate = "reclaim-policy.update"
	AuditTargetPolicy = "reclaim-policy"
)

// AuditQuery filters the audit log; empty fields match everything.
type AuditQuery struct {
	// Actor, Action and Target match exactly (Actor ignoring case).
	Actor, Action, Target string
	// Before is a cursor: only entries older than this id.
	Before string
	// Limit is the page size, 1..200; 0 means 50.
	Limit int
}

// PolicyStore keeps the policy, its history and the audit log in Redis.
// Safe for concurrent use, also across replicas.
type PolicyStore struct {
	rdb    redis.UniversalClient
	prefix string
	now    func() time.Time
}

// NewPolicyStore returns a store under prefix; now is the clock for
// UpdatedAt and audit times (nil means time.Now).
func NewPolicyStore(rdb redis.UniversalClient, prefix string, now func() time.Time) *PolicyStore {
	if now == nil {
		now = time.Now
	}
	return &PolicyStore{rdb: rdb, prefix: prefix, now: now}
}

func (s *PolicyStore) policyKey() string  { return redisschema.New(s.prefix).ReclaimPolicy() }
func (s *PolicyStore) versionKey() string { return redisschema.New(s.prefix).ReclaimPolicyVersion() }
func (s *PolicyStore) historyKey() string { return redisschema.New(s.prefix).ReclaimPolicyHistory() }
func (s *PolicyStore) auditKey() string   { return redisschema.New(s.prefix).Audit() }

// storedPolicy is Policy's JSON form in Redis.
type storedPolicy struct {
	Version              int64      `json:"version"`
	Enabled              bool       `json:"enabled"`
	IdleComputePercent   int        `json:"idleComputePercent"`
	IdleAfterSeconds     int64      `json:"idleAfterSeconds"`
	Action               Action     `json:"action"`
	WarnSeconds          int64      `json:"warnSeconds"`
	ShrinkComputePercent int        `json:"shrinkComputePercent,omitempty"`
	ExemptGroups         []string   `json:"exemptGroups,omitempty"`
	ExemptUsers          []string   `json:"exemptUsers,omitempty"`
	StopAfterSeconds     int64      `json:"stopAfterSeconds,omitempty"`
	MinRunningSeconds    int64      `json:"minRunningSeconds,omitempty"`
	MaxAgeSeconds        int64      `json:"maxAgeSeconds,omitempty"`
	MaxExtendSeconds     int64      `json:"maxExtendSeconds,omitempty"`
	DryRun               bool       `json:"dryRun,omitempty"`
	Overrides            []Override `json:"overrides,omitempty"`
	Reason               string     `json:"reason,omitempty"`
	UpdatedBy            string     `json:"updatedBy,omitempty"`
	UpdatedAt            time.Time  `json:"updatedAt"`
}

func toStoredPolicy(p Policy) storedPolicy {
	sec := func(d time.Duration) int64 { return int64(d / time.Second) }
	return storedPolicy{
		Version: p.Version, Enabled: p.Enabled, IdleComputePercent: p.IdleComputePercent,
		IdleAfterSeconds: sec(p.IdleAfter), Action: p.Action, WarnSeconds: sec(p.Warn),
		ShrinkComputePercent: p.ShrinkComputePercent, ExemptGroups: p.ExemptGroups,
		ExemptUsers: p.ExemptUsers, StopAfterSeconds: sec(p.StopAfter), MinRunningSeconds: sec(p.MinRunning),
		MaxAgeSeconds: sec(p.MaxAge), MaxExtendSeconds: sec(p.MaxExtend), DryRun: p.DryRun, Overrides: p.Overrides,
		Reason: p.Reason, UpdatedBy: p.UpdatedBy, UpdatedAt: p.UpdatedAt,
	}
}

func (sp storedPolicy) policy() Policy {
	dur := func(s int64) time.Duration { return time.Duration(s) * time.Second }
	return Policy{
		Version: sp.Version, Enabled: sp.Enabled, IdleComputePercent: sp.IdleComputePercent,
		IdleAfter: dur(sp.IdleAfterSeconds), Action: sp.Action, Warn: dur(sp.WarnSeconds),
		ShrinkComputePercent: sp.ShrinkComputePercent, ExemptGroups: sp.ExemptGroups,
		ExemptUsers: sp.ExemptUsers, StopAfter: dur(sp.StopAfterSeconds), MinRunning: dur(sp.MinRunningSeconds),
		MaxAge: dur(sp.MaxAgeSeconds), MaxExtend: dur(sp.MaxExtendSeconds), DryRun: sp.DryRun, Overrides: sp.Overrides,
		Reason: sp.Reason, UpdatedBy: sp.UpdatedBy, UpdatedAt: sp.UpdatedAt,
	}
}

func decodePolicy(b []byte) (Policy, error) {
	var sp storedPolicy
	if err := json.Unmarshal(b, &sp); err != nil {
		return Policy{}, fmt.Errorf("reclaim: decode stored policy: %w", err)
	}
	return sp.policy(), nil
}

// Get returns the current policy, or DefaultPolicy (version 0) when none
// was saved.
func (s *PolicyStore) Get(ctx context.Context) (Policy, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	b, err := s.rdb.Get(ctx, s.policyKey()).Bytes()
	if errors.Is(err, redis.Nil) {
		return DefaultPolicy(), nil
	}
	if err != nil {
		return Policy{}, fmt.Errorf("reclaim: get policy: %w", err)
	}
	return decodePolicy(b)
}

// putPolicy saves a new version if the current one is the base.
//
// KEYS[1] policy, KEYS[2] version, KEYS[3] history, KEYS[4] audit.
// ARGV[1] base version, ARGV[2] the new policy's JSON (its version is
// base+1), ARGV[3] the audit entry's JSON, ARGV[4] history versions kept,
// ARGV[5] audit MAXLEN (approximate).
// Returns {1, new version} when saved, {0, current version} when the base
// is not current.
var putPolicy = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur ~= tonumber(ARGV[1]) then
  return {0, cur}
end
local v = cur + 1
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], v)
redis.call('HSET', KEYS[3], tostring(v), ARGV[2])
local old = v - tonumber(ARGV[4])
if old > 0 then
  redis.call('HDEL', KEYS[3], tostring(old))
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'entry', ARGV[3])
return {1, v}
`)

// Put saves p as the next version if p.Version is the current version
// (optimistic concurrency), recording actor, the time and an audit entry
// with the changed fields in the same atomic step. It returns the saved
// policy. Errors: *ValidationError (fleet.ErrInvalid) for an invalid p,
// *ConflictError (fleet.ErrConflict) when another version was saved since
// p.Version, or a Redis error.
func (s *PolicyStore) Put(ctx context.Context, p Policy, actor string) (Policy, error) {
	p = p.Normalize()
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	base, err := s.Get(ctx)
	if err != nil {
		return Policy{}, err
	}
	if base.Version != p.Version {
		return Policy{}, s.conflict(ctx, p.Version)
	}
	now := s.now().UTC().Truncate(time.Second)
	p.Version, p.UpdatedBy, p.UpdatedAt = base.Version+1, actor, now
	doc, err := json.Marshal(toStoredPolicy(p))
	if err != nil {
		return Policy{}, fmt.Errorf("reclaim: encode policy: %w", err)
	}
	entry, err := json.Marshal(AuditEntry{
		Time: now, Actor: actor, Action: AuditPolicyUpdate, Target: AuditTargetPolicy,
		Reason: p.Reason, PolicyVersion: p.Version, Inputs: p.changes(base),
	})
	if err != nil {
		return Policy{}, fmt.Errorf("reclaim: encode audit entry: %w", err)
	}
	res, err := putPolicy.Run(ctx, s.rdb, []string{s.policyKey(), s.versionKey(), s.historyKey(), s.auditKey()},
		base.Version, doc, entry, historyKeep, auditMaxLen).Int64Slice()
	if err != nil {
		return Policy{}, fmt.Errorf("reclaim: put policy: %w", err)
	}
	if len(res) != 2 {
		return Policy{}, fmt.Errorf("reclaim: put policy: script returned %d values, want 2", len(res))
	}
	if res[0] != 1 {
		// Someone saved between our read and the script.
		return Policy{}, s.conflict(ctx, p.Version-1)
	}
	return p, nil
}

// conflict builds the ConflictError for an edit based on version base.
func (s *PolicyStore) conflict(ctx context.Context, base int64) error {
	cur, err := s.Get(ctx)
	if err != nil {
		return err
	}
	ce := &ConflictError{Base: base, Current: cur}
	if base > cur.Version || base < 0 {
		return ce
	}
	hist, err := s.rdb.HGetAll(ctx, s.historyKey()).Result()
	if err != nil {
		return fmt.Errorf("reclaim: policy history: %w", err)
	}
	from := DefaultPolicy()
	if base > 0 {
		b, ok := hist[strconv.FormatInt(base, 10)]
		if !ok {
			ce.Changes = map[string]string{}
			return ce // too old to tell what changed
		}
		if from, err = decodePolicy([]byte(b)); err != nil {
			return err
		}
	}
	for v := base + 1; v <= cur.Version; v++ {
		if b, ok := hist[strconv.FormatInt(v, 10)]; ok {
			if p, err := decodePolicy([]byte(b)); err == nil {
				ce.Since = append(ce.Since, p)
			}
		}
	}
	ce.Changes = cur.changes(from)
	return ce
}

// Audit returns the newest entries matching q, newest first, and the
// cursor of the next page ("" when there is none).
func (s *PolicyStore) Audit(ctx context.Context, q AuditQuery) ([]AuditEntry, string, error) {
	if q.Limit <= 0 {
		q.Limit = 50
	}
	q.Limit = min(q.Limit, 200)
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	end := "+"
	if q.Before != "" {
		end = "(" + q.Before
	}
	var out []AuditEntry
	const batch = 500
	for scanned := 0; scanned < auditMaxLen*2; scanned += batch {
		msgs, err := s.rdb.XRevRangeN(ctx, s.auditKey(), end, "-", batch).Result()
		if err != nil {
			return nil, "", fmt.Errorf("reclaim: read audit log: %w", err)
		}
		for _, m := range msgs {
			raw, _ := m.Values["entry"].(string)
			var e AuditEntry
			if json.Unmarshal([]byte(raw), &e) != nil {
				continue
			}
			e.ID = m.ID
			if (q.Actor == "" || strings.EqualFold(q.Actor, e.Actor)) && (q.Action == "" || q.Action == e.Action) && (q.Target == "" || q.Target == e.Target) {
				if len(out) == q.Limit {
					return out, out[len(out)-1].ID, nil
				}
				out = append(out, e)
			}
		}
		if len(msgs) < batch {
			break
		}
		end = "(" + msgs[len(msgs)-1].ID
	}
	return out, "", nil
}

// AppendAudit adds e to the audit log (trimmed to about auditMaxLen
// entries). The reclaimer and the extend route use it.
func (s *PolicyStore) AppendAudit(ctx context.Context, e AuditEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("reclaim: encode audit entry: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: s.auditKey(), MaxLen: auditMaxLen, Approx: true, Values: []any{"entry", string(b)}}).Err(); err != nil {
		return fmt.Errorf("reclaim: append audit entry: %w", err)
	}
	return nil
}

// ValidBefore reports whether s is usable as an audit cursor (a stream id).
func ValidBefore(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	if !ok {
		return false
	}
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return err1 == nil && err2 == nil
}
