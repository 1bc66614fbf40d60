package httpapi

import (
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// listGPUs lists every registered GPU with what is allocated on it.
func (a *api) listGPUs(c echo.Context) error {
	ctx := c.Request().Context()
	gpus, err := a.deps.Fleet.GPUs(ctx)
	if err != nil {
		return err
	}
	allocs, err := a.deps.Fleet.Allocations(ctx)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, gpuStatuses(gpus, allocs))
}

// putGPU registers or updates the GPU {uuid}; the body's uuid, if set,
// must match the path. Allocations on the GPU are kept.
func (a *api) putGPU(c echo.Context) error {
	uuid, err := pathName(c, "uuid", "gpu")
	if err != nil {
		return err
	}
	var g v1.GPU
	if err := decodeJSON(c, &g); err != nil {
		return err
	}
	switch g.UUID {
	case "":
		g.UUID = uuid
	case uuid:
	default:
		return fmt.Errorf("body uuid %q differs from the path's %q: %w", g.UUID, uuid, fleet.ErrInvalid)
	}
	fg := fromGPU(g)
	if err := fg.Validate(); err != nil {
		return fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	if err := a.deps.Fleet.RegisterGPU(c.Request().Context(), fg); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toGPU(fg))
}
