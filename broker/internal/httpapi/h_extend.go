package httpapi

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// toIdleState is the wire form of the reclaimer's state of a spawn at now
// (an extension that has passed is left out).
func toIdleState(st reclaim.IdleState, now time.Time) v1.IdleState {
	opt := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	out := v1.IdleState{Verdict: st.Verdict, Reason: st.Reason, Since: opt(st.Since), Exempt: st.Exempt,
		NextAction: st.NextAction, NextAt: opt(st.NextAt), ExtendedSeconds: int64(st.Extended / time.Second)}
	if out.Verdict == "" {
		out.Verdict, out.Since = v1.IdleUnchecked, nil
	}
	if st.ExtendedUntil.After(now) {
		out.ExtendedUntil = opt(st.ExtendedUntil)
	}
	return out
}

// serverFor returns the visible server of the request.
func (a *api) serverFor(c echo.Context) (fleet.Server, error) {
	k, err := a.visibleKey(c)
	if err != nil {
		return fleet.Server{}, err
	}
	srv, err := a.deps.Servers.Get(c.Request().Context(), k)
	if errors.Is(err, fleet.ErrNotFound) {
		return fleet.Server{}, serverNotFound(k)
	}
	return srv, err
}

// getIdleState answers what the reclaimer makes of a server.
func (a *api) getIdleState(c echo.Context) error {
	srv, err := a.serverFor(c)
	if err != nil {
		return err
	}
	st, err := a.deps.Reclaim.State(c.Request().Context(), srv)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toIdleState(st, a.deps.Now()))
}

// extendServer postpones idle actions on a running server within the
// policy's limit.
func (a *api) extendServer(c echo.Context) error {
	srv, err := a.serverFor(c)
	if err != nil {
		return err
	}
	p, err := principal(c)
	if err != nil {
		return err
	}
	var req v1.ExtendRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if req.Seconds < 60 || req.Seconds > 7*24*3600 {
		return &fieldsError{problems: []v1.FieldProblem{{Field: "seconds", Message: "must be between 60 and 604800 (1 minute to 7 days)"}}}
	}
	st, err := a.deps.Reclaim.Extend(c.Request().Context(), srv, time.Duration(req.Seconds)*time.Second, actorOf(p, srv.User))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toIdleState(st, a.deps.Now()))
}
