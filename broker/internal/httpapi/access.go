package httpapi

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// maxGroups bounds the groups accepted from v1.HeaderGroups.
const maxGroups = 256

// principal returns the authenticated caller. A route that calls it without
// the authenticate middleware is a programming error, answered with 500.
func principal(c echo.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(c.Request().Context())
	if !ok {
		return auth.Principal{}, errors.New("httpapi: no principal in a route that needs one")
	}
	return p, nil
}

// actor is the user a request acts for and the groups that apply.
type actor struct {
	User   string
	Groups []string
}

// actFor decides whether the caller may act for user, and with which
// groups:
//   - a user acting for themself uses the groups of their token;
//   - the hub service token acts for any user, with the groups from
//     v1.HeaderGroups only (the hub's own token has none that matter);
//   - an admin acts for any user; acting for another user, the groups come
//     from v1.HeaderGroups only;
//   - anyone else may not: ok is false, and the caller answers 404 exactly
//     as if the resource did not exist, so existence does not leak.
func actFor(c echo.Context, user string) (a actor, ok bool, err error) {
	p, err := principal(c)
	if err != nil {
		return actor{}, false, err
	}
	switch {
	case p.Hub || (p.Admin && p.User != user):
		groups, err := headerGroups(c)
		if err != nil {
			return actor{}, false, err
		}
		return actor{User: user, Groups: groups}, true, nil
	case p.User == user:
		return actor{User: user, Groups: p.Groups}, true, nil
	default:
		return actor{}, false, nil
	}
}

// headerGroups parses v1.HeaderGroups: comma-separated, trimmed, empty entries
// dropped, duplicates removed, sorted.
func headerGroups(c echo.Context) ([]string, error) {
	raw := c.Request().Header.Values(v1.HeaderGroups)
	var out []string
	for _, v := range raw {
		for _, g := range strings.Split(v, ",") {
			g = strings.TrimSpace(g)
			if g == "" {
				continue
			}
			if err := validName("group", g); err != nil {
				return nil, fmt.Errorf("header %s: %w", v1.HeaderGroups, err)
			}
			out = append(out, g)
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > maxGroups {
		return nil, fmt.Errorf("header %s has %d groups, at most %d are allowed: %w", v1.HeaderGroups, len(out), maxGroups, fleet.ErrInvalid)
	}
	return out, nil
}

// actorOf is who acts on owner's server, for the audit log: the hub, an
// admin acting on another user's server (actFor let them), or the user.
func actorOf(p auth.Principal, owner string) audit.Actor {
	switch {
	case p.Hub:
		return audit.Actor{Name: "jupyterhub", Kind: v1.ActorHub}
	case p.User != owner:
		return audit.Actor{Name: p.User, Kind: v1.ActorAdmin}
	}
	return audit.Actor{Name: p.User, Kind: v1.ActorUser}
}
