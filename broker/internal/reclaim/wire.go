package reclaim

import (
	"slices"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// The policy has one schema end to end: v1.ReclaimPolicy is the body of the
// API's GET and PUT, the document the store keeps, and (in the frontend)
// what the settings form edits. Policy is the same document with
// durations as time.Duration; these two functions are its only converter.

// PolicyFromAPI returns the policy of the document d. Seconds beyond what a
// time.Duration holds are clamped, so that Validate reports them out of
// range instead of wrapping around.
func PolicyFromAPI(d v1.ReclaimPolicy) Policy {
	secs := func(s int64) time.Duration {
		const maxSecs = int64(1<<63-1) / int64(time.Second)
		return time.Duration(max(min(s, maxSecs), -maxSecs)) * time.Second
	}
	p := Policy{
		Version: d.Version, Enabled: d.Enabled, IdleComputePercent: d.IdleComputePercent,
		IdleAfter: secs(d.IdleAfterSeconds), Action: d.Action, Warn: secs(d.WarnSeconds),
		ShrinkComputePercent: d.ShrinkComputePercent, ExemptGroups: slices.Clone(d.ExemptGroups),
		ExemptUsers: slices.Clone(d.ExemptUsers), StopAfter: secs(d.StopAfterSeconds),
		MinRunning: secs(d.MinRunningSeconds), MaxAge: secs(d.MaxAgeSeconds), MaxExtend: secs(d.MaxExtendSeconds),
		DryRun: d.DryRun, Overrides: slices.Clone(d.Overrides), Reason: d.Reason, UpdatedBy: d.UpdatedBy,
	}
	if d.UpdatedAt != nil {
		p.UpdatedAt = d.UpdatedAt.UTC()
	}
	return p
}

// API returns p as its document (whole seconds; UpdatedAt nil when zero).
func (p Policy) API() v1.ReclaimPolicy {
	secs := func(d time.Duration) int64 { return int64(d / time.Second) }
	d := v1.ReclaimPolicy{
		Version: p.Version, Enabled: p.Enabled, IdleComputePercent: p.IdleComputePercent,
		IdleAfterSeconds: secs(p.IdleAfter), Action: p.Action, WarnSeconds: secs(p.Warn),
		ShrinkComputePercent: p.ShrinkComputePercent, ExemptGroups: slices.Clone(p.ExemptGroups),
		ExemptUsers: slices.Clone(p.ExemptUsers), StopAfterSeconds: secs(p.StopAfter),
		MinRunningSeconds: secs(p.MinRunning), MaxAgeSeconds: secs(p.MaxAge), MaxExtendSeconds: secs(p.MaxExtend),
		DryRun: p.DryRun, Overrides: slices.Clone(p.Overrides), Reason: p.Reason, UpdatedBy: p.UpdatedBy,
	}
	if !p.UpdatedAt.IsZero() {
		t := p.UpdatedAt.UTC()
		d.UpdatedAt = &t
	}
	// Saved versions count from 1; version 0 is DefaultPolicy, answered
	// when none is stored.
	d.Source = v1.ReclaimPolicyDefault
	if p.Version > 0 {
		d.Source = v1.ReclaimPolicyStored
	}
	return d
}
