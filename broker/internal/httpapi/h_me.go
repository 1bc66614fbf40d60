package httpapi

import (
	"net/http"
	"slices"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// me describes the caller as the broker sees it.
func (a *api) me(c echo.Context) error {
	p, err := principal(c)
	if err != nil {
		return err
	}
	groups := slices.Clone(p.Groups)
	if groups == nil {
		groups = []string{}
	}
	return c.JSON(http.StatusOK, v1.Me{User: p.User, Groups: groups, Admin: p.Admin, Hub: p.Hub, Notice: a.deps.Mode.Notice})
}

// profiles lists the profiles the caller's groups allow. The hub (and an
// admin sending v1.HeaderGroups) sees those of the groups in v1.HeaderGroups.
func (a *api) profiles(c echo.Context) error {
	p, err := principal(c)
	if err != nil {
		return err
	}
	groups := p.Groups
	if p.Hub || (p.Admin && c.Request().Header.Get(v1.HeaderGroups) != "") {
		if groups, err = headerGroups(c); err != nil {
			return err
		}
	}
	out := []v1.Profile{}
	for _, pr := range a.deps.Profiles.For(groups) {
		out = append(out, toProfile(pr))
	}
	return c.JSON(http.StatusOK, out)
}
