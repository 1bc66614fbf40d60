package httpapi

import (
	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// modeHeader marks every answer of a simulated broker with
// X-Gpubroker-Mode: dev-simulated, so no client mistakes it for a real one.
func modeHeader(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Response().Header().Set(v1.HeaderMode, v1.ModeDevSimulated)
		return next(c)
	}
}
