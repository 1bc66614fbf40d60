package app

import (
	"context"
	"errors"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/httpapi"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// agentGuarantees serves promised vs delivered (httpapi.Guarantees) from
// the node agents' reports and samples. Only fresh figures are answered:
// a stale report or sample is unknown, never "met".
type agentGuarantees struct {
	agents *agentstore.Store
	clock  func() time.Time // nil: time.Now
}

var _ httpapi.Guarantees = agentGuarantees{}

func (a agentGuarantees) now() time.Time {
	if a.clock == nil {
		return time.Now()
	}
	return a.clock()
}

// GPUGuarantees returns, per GPU uuid, its worst tenant's figures from the
// fresh node reports; GPUs without figures (no tenant asked, MIG, stale
// node) are absent. A corrupt report is in the error, the rest answered.
func (a agentGuarantees) GPUGuarantees(ctx context.Context) (map[string]v1.Guarantee, error) {
	nodes, err := a.agents.Nodes(ctx, a.now())
	out := map[string]v1.Guarantee{}
	for _, n := range nodes {
		if n.Stale || n.Report == nil {
			continue
		}
		for _, g := range n.Report.GPUs {
			if g.Guarantee != nil {
				out[g.UUID] = *g.Guarantee
			}
		}
	}
	return out, err
}

// ServerGuarantee returns the figures of the slice spawnID's newest sample
// when that sample is fresh; nil when there is none, it is stale, or it
// carries no figures.
func (a agentGuarantees) ServerGuarantee(ctx context.Context, spawnID string) (*v1.Guarantee, error) {
	s, err := a.agents.LatestSample(ctx, spawnID)
	if errors.Is(err, agentstore.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if s.Stale(a.now()) {
		return nil, nil
	}
	return s.Guarantee, nil
}
