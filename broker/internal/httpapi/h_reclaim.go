package httpapi

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// getReclaimPolicy answers the current reclaim policy.
func (a *api) getReclaimPolicy(c echo.Context) error {
	p, err := a.deps.Policy.Get(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p.API())
}

// putReclaimPolicy saves a new version of the policy. The body's version
// is the one the edit started from (409 if another was saved since);
// updatedBy and updatedAt are ignored. With ?validate=true it only checks
// the body and answers it as it would be saved (normalized); nothing is
// saved or audited.
func (a *api) putReclaimPolicy(c echo.Context) error {
	p, err := principal(c)
	if err != nil {
		return err
	}
	validate := false
	switch c.QueryParam("validate") {
	case "":
	case "true":
		validate = true
	default:
		return fmt.Errorf("%w: validate must be true or absent", fleet.ErrInvalid)
	}
	var body v1.ReclaimPolicy
	if err := decodeJSON(c, &body); err != nil {
		return err
	}
	if validate {
		pol := reclaim.PolicyFromAPI(body).Normalize()
		if err := pol.Validate(); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, pol.API())
	}
	saved, err := a.deps.Policy.Put(c.Request().Context(), reclaim.PolicyFromAPI(body), p.User)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, saved.API())
}

// previewReclaimPolicy answers what the next cycle would do to every
// running server under the posted (unsaved) policy.
func (a *api) previewReclaimPolicy(c echo.Context) error {
	var body v1.ReclaimPolicy
	if err := decodeJSON(c, &body); err != nil {
		return err
	}
	pol := reclaim.PolicyFromAPI(body).Normalize()
	servers, err := a.deps.Reclaim.Preview(c.Request().Context(), pol)
	if err != nil {
		return err
	}
	now := a.deps.Now()
	out := v1.ReclaimPreview{Policy: pol.API(), At: now.UTC(), Servers: []v1.ReclaimPreviewServer{}}
	for _, ps := range servers {
		s := v1.ReclaimPreviewServer{User: ps.Server.User, Name: ps.Server.Name, Profile: ps.Server.Profile,
			Idle: toIdleState(ps.State, now), Actions: []v1.ReclaimPreviewAction{}}
		for _, act := range ps.Actions {
			s.Actions = append(s.Actions, v1.ReclaimPreviewAction{Action: act.Action, Message: act.Message})
		}
		out.Servers = append(out.Servers, s)
	}
	return c.JSON(http.StatusOK, out)
}

// maxAuditFilterBytes bounds the audit filters.
const maxAuditFilterBytes = 255

// listAudit answers a page of the audit log, newest first, filtered by
// ?source= (servers, reclaim or agent), ?actor=, ?action=, ?target=,
// ?user= (entries about that user's servers) and ?server= (with ?user=:
// about that server), after the
// cursor ?before=, at most ?limit= (1..200, default 50) entries.
func (a *api) listAudit(c echo.Context) error {
	q := audit.Query{
		Source: c.QueryParam("source"), Actor: c.QueryParam("actor"), Action: c.QueryParam("action"),
		Target: c.QueryParam("target"), User: c.QueryParam("user"), Server: c.QueryParam("server"), Before: c.QueryParam("before"),
	}
	for name, v := range map[string]string{"actor": q.Actor, "action": q.Action, "target": q.Target} {
		if len(v) > maxAuditFilterBytes {
			return fmt.Errorf("%w: the %s filter is longer than %d bytes", fleet.ErrInvalid, name, maxAuditFilterBytes)
		}
	}
	if q.User != "" {
		if err := validName("user", q.User); err != nil {
			return err
		}
	}
	if q.Server != "" {
		if q.User == "" {
			return fmt.Errorf("%w: the server filter needs the user filter too (servers are named per user)", fleet.ErrInvalid)
		}
		if err := validName("server", q.Server); err != nil {
			return err
		}
	}
	if q.Source != "" && !slices.Contains(audit.Sources, q.Source) {
		return fmt.Errorf("%w: source must be one of %s", fleet.ErrInvalid, strings.Join(audit.Sources, ", "))
	}
	if _, ok := audit.ParseCursor(q.Before); q.Before != "" && !ok {
		return fmt.Errorf("%w: before must be the next cursor of a previous page, like 1764428400000-0,+", fleet.ErrInvalid)
	}
	if s := c.QueryParam("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 200 {
			return fmt.Errorf("%w: limit must be a whole number from 1 to 200", fleet.ErrInvalid)
		}
		q.Limit = n
	}
	entries, next, err := a.deps.Audit.Audit(c.Request().Context(), q)
	if err != nil {
		return err
	}
	if entries == nil {
		entries = []v1.AuditEntry{}
	}
	return c.JSON(http.StatusOK, v1.AuditPage{Entries: entries, Next: next})
}
