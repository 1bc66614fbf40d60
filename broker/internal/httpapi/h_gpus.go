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
	out := gpuStatuses(gpus, allocs)
	if a.deps.Guarantees != nil {
		gs, err := a.deps.Guarantees.GPUGuarantees(ctx)
		if err != nil {
			// The figures are an addition: the fleet is still answered.
			a.deps.Log.WarnContext(ctx, "guarantee figures not read", "err", err)
		}
		for i := range out {
			if g, ok := gs[out[i].UUID]; ok {
				out[i].Guarantee = &g
			}
		}
	}
	return c.JSON(http.StatusOK, out)
}

// putGPUMode sets the sharing mode of the GPU {uuid} (admins): sliced,
// exclusive, mps, or "" to follow the node's label.
func (a *api) putGPUMode(c echo.Context) error {
	uuid, err := pathName(c, "uuid", "gpu")
	if err != nil {
		return err
	}
	var body struct {
		Mode *string `json:"mode"`
	}
	if err := decodeJSON(c, &body); err != nil {
		return err
	}
	if body.Mode == nil {
		return fmt.Errorf("%w: mode is required: sliced, exclusive, mps, or \"\" to follow the node's label", fleet.ErrInvalid)
	}
	g, err := a.deps.Fleet.SetGPUMode(c.Request().Context(), uuid, fleet.SharingMode(*body.Mode))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toGPU(g))
}

// putGPU registers or updates the GPU {uuid}; the body's uuid, if set,
// must match the path. Allocations on the GPU are kept.
func (a *api) putGPU(c echo.Context) error {
	uuid, err := pathName(c, "uuid", "gpu")
	if err != nil {
		return err
	}
	// v1.GPU with healthy optional (omitted: true).
	var body struct {
		UUID      string `json:"uuid"`
		Node      string `json:"node"`
		Model     string `json:"model"`
		MemoryMiB int64  `json:"memoryMiB"`
		SMCount   int    `json:"smCount"`
		Healthy   *bool  `json:"healthy"`
		// The mode asked for, and a MIG instance's fields (v1.GPU).
		Mode           v1.SharingMode `json:"mode"`
		PendingMode    v1.SharingMode `json:"pendingMode"` // read-only; ignored
		MIGProfile     string         `json:"migProfile"`
		ParentUUID     string         `json:"parentUuid"`
		ComputePercent int            `json:"computePercent"`
	}
	if err := decodeJSON(c, &body); err != nil {
		return err
	}
	g := v1.GPU{UUID: body.UUID, Node: body.Node, Model: body.Model, MemoryMiB: body.MemoryMiB,
		SMCount: body.SMCount, Healthy: body.Healthy == nil || *body.Healthy,
		Mode: body.Mode, MIGProfile: body.MIGProfile, ParentUUID: body.ParentUUID, ComputePercent: body.ComputePercent}
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
	ctx := c.Request().Context()
	allocs, err := a.deps.Fleet.Allocations(ctx)
	if err != nil {
		return err
	}
	var heldMiB int64
	var slices int
	for _, al := range allocs {
		if al.GPUUUID == fg.UUID {
			heldMiB += al.Slice.MemoryMiB
			slices++
		}
	}
	if fg.MemoryMiB < heldMiB {
		return fmt.Errorf("%w: GPU %s holds %d slices with %d MiB; its memory cannot be set to %d MiB",
			fleet.ErrConflict, fg.UUID, slices, heldMiB, fg.MemoryMiB)
	}
	if err := a.deps.Fleet.RegisterGPU(ctx, fg); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toGPU(fg))
}
