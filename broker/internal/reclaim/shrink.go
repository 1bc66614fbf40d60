package reclaim

import (
	"context"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// ShrinkFunc adapts a function to Shrinker; the composition root uses it
// to shrink through the resize service (servers.Service.Resize), which
// also frees the compute in the placement accounting.
type ShrinkFunc func(ctx context.Context, srv fleet.Server, computePercent, computeLimitPercent int) error

var _ Shrinker = ShrinkFunc(nil)

// SetCompute calls f.
func (f ShrinkFunc) SetCompute(ctx context.Context, srv fleet.Server, computePercent, computeLimitPercent int) error {
	return f(ctx, srv, computePercent, computeLimitPercent)
}
