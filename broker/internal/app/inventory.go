package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// inventoryInterval is how often the broker folds the node agents' reports
// into the placement inventory: well under the agents' 10 s heartbeat, so a
// lost node's GPUs stop taking slices within one heartbeat of going stale.
const inventoryInterval = 5 * time.Second

// registry adapts the placement store to the agents' contract
// (agentstore.Registry), translating v1.GPU ↔ fleet.GPU.
type registry struct{ store *redisstore.Store }

var _ agentstore.Registry = registry{}

func (r registry) RegisterGPU(ctx context.Context, g v1.GPU) error {
	return r.store.RegisterGPU(ctx, fleet.GPUFromWire(g))
}

func (r registry) SetGPUHealth(ctx context.Context, uuid string, healthy bool) error {
	return r.store.SetGPUHealth(ctx, uuid, healthy)
}

func (r registry) GPUs(ctx context.Context) ([]v1.GPU, error) {
	gpus, err := r.store.GPUs(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]v1.GPU, len(gpus))
	for i, g := range gpus {
		out[i] = g.Wire()
	}
	return out, nil
}

// syncInventory registers the GPUs the node agents report and marks those of
// silent nodes unhealthy, now and every interval until ctx ends. A failed
// pass is logged and retried at the next tick.
func syncInventory(ctx context.Context, agents *agentstore.Store, store *redisstore.Store, log *slog.Logger, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := agents.SyncInventory(ctx, time.Now(), registry{store}); err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, "gpu inventory sync failed; retrying", "err", fmt.Errorf("sync inventory: %w", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
