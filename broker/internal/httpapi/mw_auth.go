package httpapi

import (
	"fmt"

	"github.com/labstack/echo/v4"

	"github.com/gpubroker/gpubroker/broker/internal/auth"
)

// authenticate lets a request through only with valid credentials. It puts
// the principal into the request context (auth.FromContext) and its user
// into the per-request logger. Failures go to the error table (401).
func (a *api) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		p, err := a.deps.Auth.Authenticate(req.Context(), req)
		if err != nil {
			return fmt.Errorf("authenticate: %w", err)
		}
		c.SetRequest(req.WithContext(auth.WithPrincipal(req.Context(), p)))
		withLogger(c, loggerFrom(c, a.deps.Log).With("user", p.User))
		return next(c)
	}
}
