package reclaim

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// This file is the reclaim policy: its type, its overrides (Effective),
// validation and the changes between two versions. Where it is kept is the
// PolicyStore's business (policies.go); its wire and stored form is
// v1.ReclaimPolicy (wire.go).

// Action is what happens to an idle server; the wire type itself, so that
// the API, the store and the domain share one set of names.
type Action = v1.ReclaimAction

// The actions.
const (
	ActionWarn   = v1.ReclaimWarn
	ActionShrink = v1.ReclaimShrink
	ActionStop   = v1.ReclaimStop
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
// the members of Group (exactly one of them is set); zero fields keep the
// policy's value. It is the wire type itself (v1.ReclaimOverride, times in
// seconds): overrides pass between the API, the store and the domain
// unconverted.
type Override = v1.ReclaimOverride

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
		add("idleAfterSeconds", "must be between 1 minute and 7 days")
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
		add("warnSeconds", "must be between 0 and 24 hours")
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
		ps = append(ps, p.validateOverride(i, o, ps)...)
	}
	if len(p.Reason) > maxReasonBytes {
		add("reason", fmt.Sprintf("at most %d bytes", maxReasonBytes))
	}
	if len(ps) == 0 {
		return nil
	}
	return &ValidationError{Problems: ps}
}

// overrideFields are the JSON names of Override's fields, for naming an
// override's own field in a problem.
var overrideFields = func() map[string]bool {
	out := map[string]bool{}
	t := reflect.TypeFor[Override]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out[name] = true
	}
	return out
}()

// validateOverride returns the problems of override i: its own fields
// first; when those are valid, the problems of the policy with o applied
// that the policy alone (top, its problems so far) does not have, each
// named after the override's field when o has one of that name
// ("overrides[2].warnSeconds"), else after the override.
func (p Policy) validateOverride(i int, o Override, top []FieldProblem) []FieldProblem {
	var ps []FieldProblem
	f := fmt.Sprintf("overrides[%d]", i)
	add := func(field, m string) { ps = append(ps, FieldProblem{field, m}) }
	if (o.Profile == "") == (o.Group == "") {
		add(f, "name exactly one of profile and group")
	}
	if o.Action != "" && o.Action != ActionWarn && o.Action != ActionShrink && o.Action != ActionStop {
		add(f+".action", "must be warn, shrink or stop, or empty to keep the policy's action")
	}
	for name, v := range map[string]int64{"idleAfterSeconds": o.IdleAfterSeconds, "warnSeconds": o.WarnSeconds,
		"stopAfterSeconds": o.StopAfterSeconds, "minRunningSeconds": o.MinRunningSeconds, "maxAgeSeconds": o.MaxAgeSeconds} {
		if v < 0 {
			add(f+"."+name, "must not be negative (empty keeps the policy's value)")
		}
	}
	if o.ShrinkComputePercent < 0 || o.ShrinkComputePercent > 100 {
		add(f+".shrinkComputePercent", "must be between 1 and 100, or empty to keep the policy's value")
	}
	if len(ps) > 0 {
		slices.SortStableFunc(ps, func(a, b FieldProblem) int { return strings.Compare(a.Field, b.Field) })
		return ps
	}
	var ve *ValidationError
	if err := p.applyOverride(o).Validate(); err == nil || !errors.As(err, &ve) {
		return nil
	}
	for _, pr := range ve.Problems {
		if slices.Contains(top, pr) {
			continue // the policy's own problem, reported once
		}
		if overrideFields[pr.Field] {
			add(f+"."+pr.Field, pr.Message)
		} else {
			add(f, "with this override, "+pr.Field+" "+pr.Message)
		}
	}
	return ps
}

// Normalize trims and sorts ExemptGroups and ExemptUsers (dropping empty and duplicate
// names) and trims Reason.
func (p Policy) Normalize() Policy {
	p.ExemptGroups = cleanNames(p.ExemptGroups)
	p.ExemptUsers = cleanNames(p.ExemptUsers)
	p.Reason = strings.TrimSpace(p.Reason)
	return p
}

// cleanNames returns names trimmed, without empty ones, sorted and without
// duplicates; nil when none is left.
func cleanNames(names []string) []string {
	var out []string
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
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
	for _, k := range slices.Sorted(maps.Keys(e.Changes)) {
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
