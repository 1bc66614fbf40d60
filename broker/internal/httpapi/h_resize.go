package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// Resizer changes a running server's slice in place (implemented by
// *servers.Service; see its Resize for the contract and errors).
type Resizer interface {
	Resize(ctx context.Context, key fleet.ServerKey, want fleet.Slice, by audit.Actor) (fleet.ResizeResult, error)
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
	if req.MemoryMiB == nil && req.ComputePercent == nil && req.ComputeLimitPercent == nil {
		return fmt.Errorf("%w: the body changes nothing; set memoryMiB, computePercent or computeLimitPercent", fleet.ErrInvalid)
	}
	ctx := c.Request().Context()
	cur, err := a.deps.Servers.Get(ctx, k)
	if errors.Is(err, fleet.ErrNotFound) {
		return serverNotFound(k)
	}
	if err != nil {
		return err
	}
	if why := fleet.ResizeRefusal(cur.Sharing, cur.MIGProfile); why != "" {
		offered, err := a.offeredTo(c, k.User)
		if err != nil {
			return err
		}
		return resizeRefused(cur, why, restartProfiles(cur, offered))
	}
	want := mergeSlice(cur.Slice, req)
	if err := sliceFields(want); err != nil {
		return err
	}
	if want == cur.Slice && cur.State == v1.StateRunning {
		return fmt.Errorf("%w: %s already has %d MiB and %d %% compute (up to %d %%); the body changes nothing",
			fleet.ErrInvalid, k.Name, cur.Slice.MemoryMiB, cur.Slice.ComputePercent, cur.Slice.ComputeLimitPercent)
	}
	res, err := a.deps.Resize.Resize(ctx, k, want, actorOf(p, k.User))
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

// resizeRefused is the 409 of a resize that the server's sharing mode
// rules out: why, and the profiles a restart could use instead.
func resizeRefused(s fleet.Server, why string, restart []fleet.Profile) error {
	what := fleet.SharingWords(s.Sharing, s.MIGProfile)
	msg := fmt.Sprintf("server %q is a %s and cannot be resized while it runs: %s", s.Name, what, why)
	if len(restart) == 0 {
		return fmt.Errorf("%w: %s; no other profile of this kind is offered to you", fleet.ErrConflict, msg)
	}
	names := make([]string, len(restart))
	for i, p := range restart {
		names[i] = fmt.Sprintf("%s (%s)", p.Name, p.Words())
	}
	return fmt.Errorf("%w: %s; restart with profile %s instead (stop the server, then start it with that profile)",
		fleet.ErrConflict, msg, strings.Join(names, " or "))
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
		// Raised with the guarantee, but never past 100: a guarantee out
		// of range is one problem, not also a limit the caller never sent.
		out.ComputeLimitPercent = min(out.ComputePercent, 100)
	}
	return out
}
