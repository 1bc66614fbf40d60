package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// getReclaimPolicy answers the current reclaim policy.
func (a *api) getReclaimPolicy(c echo.Context) error {
	p, err := a.deps.Policy.Get(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toReclaimPolicy(p))
}

// putReclaimPolicy saves a new version of the policy. The body's version
// is the one the edit started from (409 if another was saved since);
// updatedBy and updatedAt are ignored.
func (a *api) putReclaimPolicy(c echo.Context) error {
	p, err := principal(c)
	if err != nil {
		return err
	}
	var body v1.ReclaimPolicy
	if err := decodeJSON(c, &body); err != nil {
		return err
	}
	saved, err := a.deps.Policy.Put(c.Request().Context(), fromReclaimPolicy(body), p.User)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toReclaimPolicy(saved))
}

// maxAuditFilterBytes bounds the audit filters.
const maxAuditFilterBytes = 255

// listAudit answers a page of the audit log, newest first, filtered by
// ?actor=, ?action= and ?target=, after the cursor ?before=, at most
// ?limit= (1..200, default 50) entries.
func (a *api) listAudit(c echo.Context) error {
	q := reclaim.AuditQuery{
		Actor: c.QueryParam("actor"), Action: c.QueryParam("action"), Target: c.QueryParam("target"),
		Before: c.QueryParam("before"),
	}
	for name, v := range map[string]string{"actor": q.Actor, "action": q.Action, "target": q.Target} {
		if len(v) > maxAuditFilterBytes {
			return fmt.Errorf("%w: the %s filter is longer than %d bytes", fleet.ErrInvalid, name, maxAuditFilterBytes)
		}
	}
	if q.Before != "" && !reclaim.ValidBefore(q.Before) {
		return fmt.Errorf("%w: before must be an entry id from a previous page, like 1764428400000-0", fleet.ErrInvalid)
	}
	if s := c.QueryParam("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 200 {
			return fmt.Errorf("%w: limit must be a whole number from 1 to 200", fleet.ErrInvalid)
		}
		q.Limit = n
	}
	entries, next, err := a.deps.Policy.Audit(c.Request().Context(), q)
	if err != nil {
		return err
	}
	page := v1.AuditPage{Entries: []v1.AuditEntry{}, Next: next}
	for _, e := range entries {
		page.Entries = append(page.Entries, v1.AuditEntry{ID: e.ID, Time: e.Time, Actor: e.Actor, Action: e.Action,
			Target: e.Target, Reason: e.Reason, PolicyVersion: e.PolicyVersion, Inputs: e.Inputs})
	}
	return c.JSON(http.StatusOK, page)
}

func toReclaimPolicy(p reclaim.Policy) v1.ReclaimPolicy {
	out := v1.ReclaimPolicy{
		Version: p.Version, Enabled: p.Enabled, IdleComputePercent: p.IdleComputePercent,
		IdleAfterSeconds: int64(p.IdleAfter / time.Second), Action: v1.ReclaimAction(p.Action),
		WarnSeconds: int64(p.Warn / time.Second), ShrinkComputePercent: p.ShrinkComputePercent,
		ExemptGroups: p.ExemptGroups, Reason: p.Reason, UpdatedBy: p.UpdatedBy,
		ExemptUsers: p.ExemptUsers, StopAfterSeconds: int64(p.StopAfter / time.Second),
		MinRunningSeconds: int64(p.MinRunning / time.Second), MaxAgeSeconds: int64(p.MaxAge / time.Second),
		MaxExtendSeconds: int64(p.MaxExtend / time.Second), DryRun: p.DryRun,
	}
	for _, o := range p.Overrides {
		out.Overrides = append(out.Overrides, v1.ReclaimOverride{Profile: o.Profile, Group: o.Group, Exempt: o.Exempt,
			IdleAfterSeconds: o.IdleAfterSeconds, WarnSeconds: o.WarnSeconds, StopAfterSeconds: o.StopAfterSeconds,
			MinRunningSeconds: o.MinRunningSeconds, MaxAgeSeconds: o.MaxAgeSeconds,
			Action: v1.ReclaimAction(o.Action), ShrinkComputePercent: o.ShrinkComputePercent})
	}
	if !p.UpdatedAt.IsZero() {
		t := p.UpdatedAt.UTC()
		out.UpdatedAt = &t
	}
	return out
}

// fromReclaimPolicy converts a PUT body; durations beyond what fits are
// clamped so that Validate reports them as out of range.
func fromReclaimPolicy(p v1.ReclaimPolicy) reclaim.Policy {
	secs := func(s int64) time.Duration {
		const maxSecs = int64(1<<63-1) / int64(time.Second)
		return time.Duration(max(min(s, maxSecs), -maxSecs)) * time.Second
	}
	out := reclaim.Policy{
		Version: p.Version, Enabled: p.Enabled, IdleComputePercent: p.IdleComputePercent,
		IdleAfter: secs(p.IdleAfterSeconds), Action: reclaim.Action(p.Action), Warn: secs(p.WarnSeconds),
		ShrinkComputePercent: p.ShrinkComputePercent, ExemptGroups: p.ExemptGroups, Reason: p.Reason,
		ExemptUsers: p.ExemptUsers, StopAfter: secs(p.StopAfterSeconds), MinRunning: secs(p.MinRunningSeconds),
		MaxAge: secs(p.MaxAgeSeconds), MaxExtend: secs(p.MaxExtendSeconds), DryRun: p.DryRun,
	}
	for _, o := range p.Overrides {
		out.Overrides = append(out.Overrides, reclaim.Override{Profile: o.Profile, Group: o.Group, Exempt: o.Exempt,
			IdleAfterSeconds: o.IdleAfterSeconds, WarnSeconds: o.WarnSeconds, StopAfterSeconds: o.StopAfterSeconds,
			MinRunningSeconds: o.MinRunningSeconds, MaxAgeSeconds: o.MaxAgeSeconds,
			Action: reclaim.Action(o.Action), ShrinkComputePercent: o.ShrinkComputePercent})
	}
	return out
}
