package httpapi

import "github.com/labstack/echo/v4"

// HeaderMode is the response header that marks dev mode.
const HeaderMode = "X-Gpubroker-Mode"

// ModeSimulated is HeaderMode's value in dev mode, where the cluster and the
// GPUs are simulated.
const ModeSimulated = "dev-simulated"

// modeHeader marks every answer of a simulated broker with
// X-Gpubroker-Mode: dev-simulated, so no client mistakes it for a real one.
func modeHeader(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Response().Header().Set(HeaderMode, ModeSimulated)
		return next(c)
	}
}
