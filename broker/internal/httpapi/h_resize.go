package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// Resizer changes a running server's slice in place (implemented by
// *servers.Service; see its Resize for the contract and errors).
type Resizer interface {
	Resize(ctx context.Context, key fleet.ServerKey, want fleet.Slice, actor string) (fleet.ResizeResult, error)
}

// resizeServer changes the slice of a running server: 200 when the node
// agent applied it, 202 when it is pending (with a deadline).
func (a *api) resizeServer(c echo.Context) error {
	k, err := a.visibleKey(c)
	if err != nil {
		return err
	}
	p, err := principal(c)
	if err != nil {
		return err
	}
	var req v1.ResizeRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	cur, err := a.deps.Servers.Get(ctx, k)
	if errors.Is(err, fleet.ErrNotFound) {
		return serverNotFound(k)
	}
	if err != nil {
		return err
	}
	want := mergeSlice(cur.Slice, req)
	actor := p.User
	if p.Hub {
		actor = "jupyterhub"
	}
	res, err := a.deps.Resize.Resize(ctx, k, want, actor)
	if errors.Is(err, fleet.ErrNotFound) {
		return serverNotFound(k)
	}
	if err != nil {
		return err
	}
	out := v1.ResizeResult{Server: a.toServer(res.Server), Slice: res.Slice, Generation: res.Generation, Applied: res.Applied}
	status := http.StatusOK
	if !res.Applied {
		d := res.Deadline.UTC()
		out.Deadline = &d
		status = http.StatusAccepted
	}
	return c.JSON(status, out)
}

// mergeSlice applies the fields req sets to cur (see v1.ResizeRequest).
func mergeSlice(cur fleet.Slice, req v1.ResizeRequest) fleet.Slice {
	out := cur
	if req.MemoryMiB != nil {
		out.MemoryMiB = *req.MemoryMiB
	}
	if req.ComputePercent != nil {
		out.ComputePercent = *req.ComputePercent
	}
	if req.ComputeLimitPercent != nil {
		out.ComputeLimitPercent = *req.ComputeLimitPercent
	} else if out.ComputeLimitPercent < out.ComputePercent {
		out.ComputeLimitPercent = out.ComputePercent
	}
	return out
}
