package agent

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetricsAfterARound(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	a, err := New(Config{Node: "gpu-1", HostRoot: e.root, Enforcement: Policy{Mode: ModeReport, Samples: 1, OrphanGrace: -1}},
		Deps{NVML: e.lib, Samples: nullStore{}, Quotas: nullStore{}, Audit: e.audit, Pods: e.pods,
			Proc: ProcFS{Root: e.proc.root}, Killer: e.killer, Clock: e.clock, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	if a.devs, err = discoverDevices(e.lib, "gpu-1", a.has, t0); err != nil {
		t.Fatal(err)
	}
	a.SampleOnce(t.Context())
	u0, _ := e.lib.Devices[0].GetUUID()
	want := `
# HELP gpubroker_agent_enforcement_actions_total Enforcement actions by action (report, kill, kill-failed) and reason (over-memory, over-compute, hidden, no-slice, usage-tampered).
# TYPE gpubroker_agent_enforcement_actions_total counter
gpubroker_agent_enforcement_actions_total{action="report",reason="no-slice"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpubroker_agent_enforcement_actions_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.ToFloat64(a.metrics.sliceMem.WithLabelValues("slice-a", u0)); n != 1536<<20 {
		t.Errorf("slice-a memory %v bytes, want %d", n, 1536<<20)
	}
	if n := testutil.ToFloat64(a.metrics.sliceLimit.WithLabelValues("slice-a", u0)); n != 2048<<20 {
		t.Errorf("slice-a limit %v bytes, want %d", n, 2048<<20)
	}
	if n := testutil.ToFloat64(a.metrics.sliceSM.WithLabelValues("slice-a", u0)); n != 40 {
		t.Errorf("slice-a SM %v %%, want 40", n)
	}
	// A slice that leaves the node loses its series.
	a.pods = e.pods[1:]
	a.SampleOnce(t.Context())
	if n := testutil.CollectAndCount(a.metrics.sliceMem); n != 2 {
		t.Errorf("%d slice memory series after slice-a left, want 2", n)
	}
}
