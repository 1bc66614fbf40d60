package reclaim_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// TestBatchSamplesMatchAgentstore keeps the reclaimer's pipelined sample
// decoder in step with agentstore's: the fields it uses decode the same.
func TestBatchSamplesMatchAgentstore(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	st := agentstore.New(rdb, rs.Prefix(t))
	sm, mem, np := 37, int64(2048), 2
	kernel := t0.Add(-time.Second)
	zero := time.Time{}
	in := []agentstore.Sample{
		{Slice: "s1", At: t0, Interval: 10 * time.Second, SMPercent: &sm, MemoryUsedMiB: &mem, Processes: &np, LastKernel: &kernel},
		{Slice: "s1", At: t0.Add(10 * time.Second), Interval: 10 * time.Second, LastKernel: &zero, Missing: "process utilization: Not Supported"},
		{Slice: "s1", At: t0.Add(20 * time.Second), Interval: 10 * time.Second, Missing: "gpu lost"},
	}
	if err := st.AddSamples(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	want, err := st.RecentSamples(t.Context(), "s1", 10)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := rdb.XRevRangeN(t.Context(), st.Keys().Samples("s1"), "+", "-", 10).Result()
	if err != nil {
		t.Fatal(err)
	}
	var got []agentstore.Sample
	for _, m := range msgs {
		s, err := reclaim.DecodeBatchSample("s1", m)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	// The reclaimer does not use memory, limit and process counts.
	for i := range want {
		want[i].MemoryUsedMiB, want[i].MemoryLimitMiB, want[i].Processes = nil, 0, nil
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("batch decode vs agentstore (-want +got):\n%s", diff)
	}
}
