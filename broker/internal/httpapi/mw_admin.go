package httpapi

import (
	"fmt"

	"github.com/labstack/echo/v4"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// adminOnly lets only admins through (403 otherwise). The hub service token
// is not an admin. It must run after authenticate.
func (a *api) adminOnly(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		p, err := principal(c)
		if err != nil {
			return err
		}
		if !p.Admin {
			return fmt.Errorf("this route is for administrators (members of the admin group): %w", fleet.ErrForbidden)
		}
		return next(c)
	}
}
