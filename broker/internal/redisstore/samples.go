package redisstore

import (
	"context"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// AgentSamples reads the node agents' usage samples for the reclaimer
// through agentstore, the agent contract's one reader and writer: the
// broker never decodes the agents' streams itself. Safe for concurrent use.
type AgentSamples struct {
	Agents *agentstore.Store
}

var _ reclaim.Samples = AgentSamples{}

// RecentSamples reads every spawn's window in one pipelined call
// (agentstore.Store.RecentSamplesBatch) and keeps what the reclaimer
// judges by; staleness stays the agent contract's rule (FreshUntil).
func (a AgentSamples) RecentSamples(ctx context.Context, spawnIDs []string, n int, since time.Time) ([][]reclaim.Sample, error) {
	batch, err := a.Agents.RecentSamplesBatch(ctx, spawnIDs, int64(n), since)
	if err != nil {
		return nil, err
	}
	out := make([][]reclaim.Sample, len(batch))
	for i, ss := range batch {
		for _, s := range ss {
			out[i] = append(out[i], reclaim.Sample{ID: s.ID, At: s.At, FreshUntil: s.FreshUntil(),
				SMPercent: s.SMPercent, LastKernel: s.LastKernel, Missing: s.Missing})
		}
	}
	return out, nil
}
