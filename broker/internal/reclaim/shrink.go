package reclaim

import (
	"context"
	"fmt"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// DesiredQuotas stores a slice's desired quota for its node agent
// (agentstore.Store).
type DesiredQuotas interface {
	SetDesiredQuota(ctx context.Context, slice string, q v1.Slice) (int64, error)
}

// QuotaShrinker shrinks and restores compute through the node agent's
// desired quota only. The placement accounting in Redis keeps the slice's
// original guarantee (nothing is lent to new placements) until the resize
// service (servers.Service.Resize) exists and replaces it.
type QuotaShrinker struct {
	Quotas DesiredQuotas
}

var _ Shrinker = QuotaShrinker{}

// SetCompute sets srv's slice to computePercent guaranteed and
// computeLimitPercent burst (percent of the GPU), keeping its memory.
func (q QuotaShrinker) SetCompute(ctx context.Context, srv fleet.Server, computePercent, computeLimitPercent int) error {
	sl := srv.Slice
	sl.ComputePercent, sl.ComputeLimitPercent = computePercent, max(computeLimitPercent, computePercent)
	if _, err := q.Quotas.SetDesiredQuota(ctx, srv.SpawnID, sl); err != nil {
		return fmt.Errorf("set compute of %s/%s: %w", srv.User, srv.Name, err)
	}
	return nil
}

// ShrinkFunc adapts a function to Shrinker; the composition root uses it
// to shrink through the resize service (servers.Service.Resize), which
// also frees the compute in the placement accounting.
type ShrinkFunc func(ctx context.Context, srv fleet.Server, computePercent, computeLimitPercent int) error

var _ Shrinker = ShrinkFunc(nil)

// SetCompute calls f.
func (f ShrinkFunc) SetCompute(ctx context.Context, srv fleet.Server, computePercent, computeLimitPercent int) error {
	return f(ctx, srv, computePercent, computeLimitPercent)
}
