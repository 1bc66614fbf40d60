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

// listServers lists the caller's servers; admins may pass ?user= or
// ?all=true, the hub ?user=.
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
	list, err := a.deps.Servers.List(c.Request().Context(), user)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, a.toServers(list))
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
	s, created, err := a.deps.Servers.Create(c.Request().Context(), who.User, who.Groups, k.Name, req, key)
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
	return c.JSON(http.StatusOK, a.toServer(s))
}

// deleteServer stops the server: 202 with its state after the call
// (stopping or stopped), also when it was already stopped; 404 only if it
// never existed.
func (a *api) deleteServer(c echo.Context) error {
	k, err := a.visibleKey(c)
	if err != nil {
		return err
	}
	s, err := a.deps.Servers.Delete(c.Request().Context(), k)
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
