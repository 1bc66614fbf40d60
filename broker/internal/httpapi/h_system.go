package httpapi

import (
	"context"
	_ "embed"
	"net/http"
	"sync"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// openapiYAML is the OpenAPI 3.0 document of this API; the tests validate
// every answer they receive against it.
//
//go:embed openapi.yaml
var openapiYAML []byte

// healthz answers 200 while the process serves HTTP at all.
func (a *api) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, v1.Health{Status: "ok"})
}

// readyz runs every checker concurrently, each bounded by the ready
// timeout, and answers 200 when all pass, 503 otherwise, listing each
// check with its error text.
func (a *api) readyz(c echo.Context) error {
	ctx := c.Request().Context()
	checks := make([]v1.Check, len(a.deps.Checkers))
	var wg sync.WaitGroup
	for i, ch := range a.deps.Checkers {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, a.opts.readyTimeout)
			defer cancel()
			start := a.deps.Now()
			err := ch.Check(cctx)
			checks[i] = v1.Check{Name: ch.Name(), OK: err == nil, DurationMS: a.deps.Now().Sub(start).Milliseconds()}
			if err != nil {
				checks[i].Error = err.Error()
			}
		})
	}
	wg.Wait()
	r := v1.Readiness{Status: "ready", Checks: checks}
	status := http.StatusOK
	for _, ch := range checks {
		if !ch.OK {
			r.Status, status = "not ready", http.StatusServiceUnavailable
		}
	}
	return c.JSON(status, r)
}

// openapi serves the embedded OpenAPI document.
func (a *api) openapi(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/yaml", openapiYAML)
}

// info describes the service, and in dev mode says that it is simulated.
func (a *api) info(c echo.Context) error {
	return c.JSON(http.StatusOK, v1.Info{
		Service:    "gpubroker",
		Version:    a.deps.Version,
		APIVersion: "v1",
		Mode:       a.mode(),
		Notice:     a.deps.Mode.Notice,
		OpenAPI:    "/api/v1/openapi.yaml",
	})
}

// mode is "dev-simulated" in dev mode, else "production".
func (a *api) mode() string {
	if a.deps.Mode.Simulated {
		return v1.ModeDevSimulated
	}
	return v1.ModeProduction
}
