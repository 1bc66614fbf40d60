package app

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/frontend"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// TestAgentUsageFeedsCharts: the pages' charts read the agent's samples of
// the spawn, oldest first, leaving out readings with missing fields.
func TestAgentUsageFeedsCharts(t *testing.T) {
	srv := redistest.Start(t)
	agents := agentstore.New(srv.Client(t), srv.Prefix(t))
	t0 := time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
	sm := func(v int) *int { return &v }
	mem := func(v int64) *int64 { return &v }
	if err := agents.AddSamples(t.Context(), []agentstore.Sample{
		{Slice: "spawn-1", At: t0, Interval: time.Second, SMPercent: sm(10), MemoryUsedMiB: mem(100), MemoryLimitMiB: 8192},
		{Slice: "spawn-1", At: t0.Add(time.Second), Interval: time.Second, Missing: "gpu lost"},
		{Slice: "spawn-1", At: t0.Add(2 * time.Second), Interval: time.Second, SMPercent: sm(30), MemoryUsedMiB: mem(300), MemoryLimitMiB: 8192},
		{Slice: "spawn-2", At: t0, Interval: time.Second, SMPercent: sm(99), MemoryUsedMiB: mem(999), MemoryLimitMiB: 8192},
	}); err != nil {
		t.Fatal(err)
	}
	u := agentUsage{agents: agents, clock: func() time.Time { return t0.Add(3 * time.Second) }}
	got, err := u.Samples(t.Context(), "alice", "nb", "spawn-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []frontend.Sample{{Time: t0, SMPercent: 10, MemoryMiB: 100}, {Time: t0.Add(2 * time.Second), SMPercent: 30, MemoryMiB: 300}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	if none, err := u.Samples(t.Context(), "alice", "nb", "spawn-3"); err != nil || len(none) != 0 {
		t.Errorf("samples of a spawn without any: %v, %v", none, err)
	}
	tests := []struct {
		name   string
		spawn  string
		at     time.Duration // reader's clock after t0
		wantOK bool
	}{
		{"fresh and complete", "spawn-2", 2 * time.Second, true},
		{"stale", "spawn-2", time.Hour, false},
		{"none", "spawn-3", 0, false},
	}
	for _, tc := range tests {
		u := agentUsage{agents: agents, clock: func() time.Time { return t0.Add(tc.at) }}
		s, ok, err := u.Current(t.Context(), "alice", "nb", tc.spawn)
		if err != nil || ok != tc.wantOK || (ok && s.SMPercent != 99) {
			t.Errorf("%s: Current = %+v, %v, %v; want ok %v", tc.name, s, ok, err, tc.wantOK)
		}
	}
}
