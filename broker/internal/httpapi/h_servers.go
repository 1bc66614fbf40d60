package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// serverKey reads and validates {user} and {name} from the path.
func serverKey(c echo.Context) (fleet.ServerKey, error) {
	user, err := pathName(c, "user", "user")
	if err != nil {
		return fleet.ServerKey{}, err
	}
	name, err := pathName(c, "name", "server")
	if err != nil {
		return fleet.ServerKey{}, err
	}
	return fleet.ServerKey{User: user, Name: name}, nil
}

// serverNotFound is the one answer for a server that does not exist and
// for a server the caller may not see, so the two cannot be told apart.
func serverNotFound(k fleet.ServerKey) error {
	return fmt.Errorf("%w: user %q has no server named %q", fleet.ErrNotFound, k.User, k.Name)
}

// serverPath is the API path of a server, for the Location header.
func serverPath(k fleet.ServerKey) string {
	return "/api/v1/users/" + url.PathEscape(k.User) + "/servers/" + url.PathEscape(k.Name)
}

// Paging of the server lists.
const (
	defaultServersLimit = 100
	maxServersLimit     = 1000
)

// listServers lists the caller's servers; admins may pass ?user= or
// ?all=true, the hub ?user=. One page of ?limit= (1..1000, default 100)
// after ?cursor=.
func (a *api) listServers(c echo.Context) error {
	p, err := principal(c)
	if err != nil {
		return err
	}
	all := false
	if s := c.QueryParam("all"); s != "" {
		if all, err = strconv.ParseBool(s); err != nil {
			return fmt.Errorf("query parameter all must be true or false, not %q: %w", s, fleet.ErrInvalid)
		}
	}
	user := c.QueryParam("user")
	switch {
	case all && user != "":
		return fmt.Errorf("query parameters all and user exclude each other: %w", fleet.ErrInvalid)
	case all && !p.Admin:
		return fmt.Errorf("only administrators may list every server: %w", fleet.ErrForbidden)
	case all:
		return a.writeServers(c, "")
	case user == "":
		user = p.User
	}
	if err := validName("user", user); err != nil {
		return err
	}
	return a.listFor(c, user)
}

// listUserServers lists the servers of {user}.
func (a *api) listUserServers(c echo.Context) error {
	user, err := pathName(c, "user", "user")
	if err != nil {
		return err
	}
	return a.listFor(c, user)
}

// listFor lists user's servers if the caller may act for user; otherwise
// it answers 404 whether or not user has servers.
func (a *api) listFor(c echo.Context, user string) error {
	_, ok, err := actFor(c, user)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("user %q has no servers you can see: %w", user, fleet.ErrNotFound)
	}
	return a.writeServers(c, user)
}

func (a *api) writeServers(c echo.Context, user string) error {
	limit := defaultServersLimit
	if s := c.QueryParam("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxServersLimit {
			return fmt.Errorf("%w: limit must be a whole number from 1 to %d", fleet.ErrInvalid, maxServersLimit)
		}
		limit = n
	}
	cursor := c.QueryParam("cursor")
	if len(cursor) > 1024 {
		return fmt.Errorf("%w: the cursor is longer than 1024 bytes; pass the next value of a previous page", fleet.ErrInvalid)
	}
	list, next, err := a.deps.Servers.ListPage(c.Request().Context(), user, cursor, limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v1.ServerPage{Servers: a.toServers(list), Next: next})
}

// userQuota answers the caps that apply to {user} and what is in use
// under each. The groups are the caller's own when it is the user, else
// (the hub, an admin) those of v1.HeaderGroups, as for a create.
func (a *api) userQuota(c echo.Context) error {
	user, err := pathName(c, "user", "user")
	if err != nil {
		return err
	}
	who, ok, err := actFor(c, user)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("user %q has no quota you can see: %w", user, fleet.ErrNotFound)
	}
	uses, err := a.deps.Servers.Quota(c.Request().Context(), who.User, who.Groups)
	if err != nil {
		return err
	}
	out := v1.Quota{User: who.User, Quotas: make([]v1.QuotaUse, 0, len(uses))}
	for _, u := range uses {
		out.Quotas = append(out.Quotas, v1.QuotaUse{Scope: u.Scope, Name: u.Name, Limit: toAmounts(u.Limit), Used: toAmounts(u.Used)})
	}
	return c.JSON(http.StatusOK, out)
}

// createServer starts a server (PUT is idempotent per Idempotency-Key):
// 201 when this call created the spawn, 200 when it already existed for the
// same key; both with a Location header.
func (a *api) createServer(c echo.Context) error {
	k, err := serverKey(c)
	if err != nil {
		return err
	}
	who, ok, err := actFor(c, k.User)
	if err != nil {
		return err
	}
	if !ok {
		return serverNotFound(k)
	}
	p, err := principal(c)
	if err != nil {
		return err
	}
	var req v1.CreateServerRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if err := validCreate(req); err != nil {
		return err
	}
	key, err := idempotencyKey(c)
	if err != nil {
		return err
	}
	s, created, err := a.deps.Servers.Create(c.Request().Context(), actorOf(p, k.User), who.User, who.Groups, k.Name, req, key)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderLocation, serverPath(k))
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, a.toServer(s))
}

// getServer answers the server, or 404.
func (a *api) getServer(c echo.Context) error {
	k, err := a.visibleKey(c)
	if err != nil {
		return err
	}
	s, err := a.deps.Servers.Get(c.Request().Context(), k)
	if errors.Is(err, fleet.ErrNotFound) {
		return serverNotFound(k)
	}
	if err != nil {
		return err
	}
	out := a.toServer(s)
	if !out.Resize.Supported {
		offered, err := a.offeredTo(c, k.User)
		if err != nil {
			return err
		}
		out = withRestartProfiles(out, s, offered)
	}
	if a.deps.Guarantees != nil && s.State == v1.StateRunning && !fleet.Whole(s.Sharing) {
		g, err := a.deps.Guarantees.ServerGuarantee(c.Request().Context(), s.SpawnID)
		if err != nil {
			a.deps.Log.WarnContext(c.Request().Context(), "guarantee figures not read", "err", err, "slice_id", s.SpawnID)
		}
		out.Guarantee = g
	}
	return c.JSON(http.StatusOK, out)
}

// offeredTo returns the profiles offered to user as the caller acts for
// them (their groups, see actFor).
func (a *api) offeredTo(c echo.Context, user string) ([]fleet.Profile, error) {
	who, ok, err := actFor(c, user)
	if err != nil || !ok {
		return nil, err
	}
	return a.deps.Profiles.For(who.Groups), nil
}

// deleteServer stops the server: 202 with its state after the call
// (stopping or stopped; a failed server stays failed with its reason),
// also when it was already stopped; 404 only if it never existed. With
// ?remove=true it removes a stopped or failed server instead (204; 409 for
// a live one: stop it first).
func (a *api) deleteServer(c echo.Context) error {
	k, err := a.visibleKey(c)
	if err != nil {
		return err
	}
	p, err := principal(c)
	if err != nil {
		return err
	}
	remove := false
	if s := c.QueryParam("remove"); s != "" {
		if remove, err = strconv.ParseBool(s); err != nil {
			return fmt.Errorf("query parameter remove must be true or false, not %q: %w", s, fleet.ErrInvalid)
		}
	}
	if remove {
		err := a.deps.Servers.Remove(c.Request().Context(), actorOf(p, k.User), k)
		if errors.Is(err, fleet.ErrNotFound) {
			return serverNotFound(k)
		}
		if err != nil {
			return err
		}
		return c.NoContent(http.StatusNoContent)
	}
	s, err := a.deps.Servers.Delete(c.Request().Context(), actorOf(p, k.User), k)
	if errors.Is(err, fleet.ErrNotFound) {
		return serverNotFound(k)
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, a.toServer(s))
}

// visibleKey reads the server key and checks that the caller may act for
// its user; a server the caller may not see is reported as not found.
func (a *api) visibleKey(c echo.Context) (fleet.ServerKey, error) {
	k, err := serverKey(c)
	if err != nil {
		return fleet.ServerKey{}, err
	}
	_, ok, err := actFor(c, k.User)
	if err != nil {
		return fleet.ServerKey{}, err
	}
	if !ok {
		return fleet.ServerKey{}, serverNotFound(k)
	}
	return k, nil
}
