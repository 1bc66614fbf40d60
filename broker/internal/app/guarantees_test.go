package app

import (
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// TestAgentGuaranteesAnswerOnlyFreshFigures: the API's promised-vs-delivered
// figures come from fresh node reports and samples; stale ones are unknown.
func TestAgentGuaranteesAnswerOnlyFreshFigures(t *testing.T) {
	srv := redistest.Start(t)
	agents := agentstore.New(srv.Client(t), srv.Prefix(t))
	t0 := time.Now().UTC().Truncate(time.Second)
	worst := v1.Guarantee{Percent: 70, WindowSeconds: 3600, WantedSeconds: 100, MetSeconds: 40, Slice: "spawn-1", Tenants: 2}
	met := v1.Guarantee{Percent: 30, WindowSeconds: 3600, WantedSeconds: 100, MetSeconds: 99}
	gpu := func(uuid string, g *v1.Guarantee) agentstore.GPUReport {
		return agentstore.GPUReport{GPU: v1.GPU{UUID: uuid, Node: "gpu-1", MemoryMiB: 143771, SMCount: 132, Healthy: true}, Guarantee: g}
	}
	if err := agents.Heartbeat(t.Context(), agentstore.NodeReport{Node: "gpu-1", At: t0, HeartbeatMs: 10000, SampleMs: 1000,
		GPUs: []agentstore.GPUReport{gpu("GPU-1", &worst), gpu("GPU-2", nil)}}); err != nil {
		t.Fatal(err)
	}
	if err := agents.AddSamples(t.Context(), []agentstore.Sample{
		{Slice: "spawn-2", At: t0, Interval: time.Second, Guarantee: &met},
		{Slice: "spawn-3", At: t0, Interval: time.Second},
	}); err != nil {
		t.Fatal(err)
	}

	fresh := agentGuarantees{agents: agents, clock: func() time.Time { return t0.Add(time.Second) }}
	gs, err := fresh.GPUGuarantees(t.Context())
	if err != nil || len(gs) != 1 || gs["GPU-1"] != worst {
		t.Errorf("GPUGuarantees = %+v, %v; want only GPU-1's %+v", gs, err, worst)
	}
	for spawn, want := range map[string]*v1.Guarantee{"spawn-2": &met, "spawn-3": nil, "spawn-none": nil} {
		g, err := fresh.ServerGuarantee(t.Context(), spawn)
		if err != nil || (g == nil) != (want == nil) || (g != nil && *g != *want) {
			t.Errorf("ServerGuarantee(%s) = %+v, %v; want %+v", spawn, g, err, want)
		}
	}

	stale := agentGuarantees{agents: agents, clock: func() time.Time { return t0.Add(time.Hour) }}
	if gs, err := stale.GPUGuarantees(t.Context()); err != nil || len(gs) != 0 {
		t.Errorf("GPUGuarantees of a stale node = %+v, %v; want none", gs, err)
	}
	if g, err := stale.ServerGuarantee(t.Context(), "spawn-2"); err != nil || g != nil {
		t.Errorf("ServerGuarantee of a stale sample = %+v, %v; want nil", g, err)
	}
}
