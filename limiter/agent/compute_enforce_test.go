package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// overCompute makes slice B (ceiling 30 %, one process, 200) use sm percent
// of GPU 0 in every round, with slice A within its slice.
func (e *testEnv) overCompute(sm uint32) {
	e.setProcs(0, []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 1 << 30}, {Pid: 200, UsedGpuMemory: 1 << 30}},
		[]nvml.ProcessUtilizationSample{{Pid: 100, TimeStamp: 10, SmUtil: 10}, {Pid: 200, TimeStamp: 10, SmUtil: sm - 5}, {Pid: 200, TimeStamp: 20, SmUtil: sm + 5}})
}

// TestComputeOverTheCeilingIsStopped: the hook's pacing is steered by the
// usage region, which the tenant can write, so the agent's NVML view is
// what holds a slice to its compute ceiling. A slice over its ceiling plus
// the tolerance for 10 rounds (computeSamples, above Samples' 3) is
// reported, by default, or has its busiest process stopped under
// ComputeMode kill, with the figures in the audit record; fewer rounds,
// use within the tolerance, an unknown SM share, or the pace feed turned
// off (the hooks then have nothing to pace by) do nothing.
func TestComputeOverTheCeilingIsStopped(t *testing.T) {
	tests := []struct {
		name       string
		mode       Mode   // Policy.ComputeMode; "" the default (report)
		sm         uint32 // slice B's SM use, percent; 0: NVML has no utilization
		paceOff    bool   // Config.PaceInterval negative
		rounds     int
		wantKilled []uint32
		wantAudit  []string
	}{
		{name: "ten rounds over: stopped", mode: ModeKill, sm: 75, rounds: 10, wantKilled: []uint32{200}, wantAudit: []string{"kill over-compute 200 75/30"}},
		{name: "reported by default", sm: 75, rounds: 10, wantAudit: []string{"report over-compute 200 75/30"}},
		{name: "a report is not repeated every round", mode: ModeReport, sm: 75, rounds: 15, wantAudit: []string{"report over-compute 200 75/30"}},
		{name: "nine rounds are not enough", mode: ModeKill, sm: 75, rounds: 9},
		{name: "within the tolerance of 10 points", mode: ModeKill, sm: 40, rounds: 10},
		{name: "just past it", mode: ModeKill, sm: 41, rounds: 10, wantKilled: []uint32{200}, wantAudit: []string{"kill over-compute 200 41/30"}},
		{name: "unknown is never a violation", mode: ModeKill, rounds: 10},
		{name: "off", mode: ModeOff, sm: 75, rounds: 10},
		{name: "not judged with the pace feed off", mode: ModeKill, sm: 75, paceOff: true, rounds: 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.sm > 0 {
				e.overCompute(tc.sm)
			} else {
				e.setProcs(0, []nvml.ProcessInfo{{Pid: 200, UsedGpuMemory: 1 << 30}}, nil)
				e.dev(0).GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
					return nil, nvml.ERROR_UNKNOWN
				}
			}
			// The memory mode reports: pid 600, in a pod that is not
			// gpubroker's, is reported past the orphan grace, never stopped.
			cfg := Config{Enforcement: Policy{Mode: ModeReport, ComputeMode: tc.mode}}
			if tc.paceOff {
				cfg.PaceInterval = -1
			}
			a := e.agent(t, cfg, nil)
			e.enforceRounds(t, a, tc.rounds)
			if diff := cmp.Diff(tc.wantKilled, e.killer.killed); diff != "" {
				t.Errorf("killed (-want +got):\n%s", diff)
			}
			var got []string
			for _, r := range e.audit.all() {
				if r.Reason == agentstore.ReasonNoSlice {
					continue // pid 300, the host's, has no slice
				}
				got = append(got, r.Action+" "+r.Reason+" "+itoa(r.PID)+" "+itoa(uint32(r.SMPercent))+"/"+itoa(uint32(r.ComputeLimitPercent)))
				if r.Slice != "slice-b" || r.Pod != "nb-b" || r.Samples != 10 || !strings.Contains(r.Policy, " compute-tolerance=10 ") {
					t.Errorf("over-compute record %+v lacks its inputs", r)
				}
			}
			if diff := cmp.Diff(tc.wantAudit, got); diff != "" {
				t.Errorf("audit (-want +got):\n%s", diff)
			}
		})
	}
}

// TestComputeCeilingIsTheQuotaFiles: a resize that raised the slice's
// ceiling is in its quota file, and that is the ceiling the agent holds it
// to, not the pod's initial one.
func TestComputeCeilingIsTheQuotaFiles(t *testing.T) {
	e := newEnv(t)
	e.overCompute(75)
	a := e.agent(t, Config{Enforcement: Policy{Mode: ModeReport, ComputeMode: ModeKill}}, nil)
	s := e.pods[1] // slice B, ceiling 30 % at start
	raised := s.Initial
	raised.ComputePercent, raised.ComputeLimitPercent = 60, 80
	path := a.slicePath(s.ID, "quota", v1.QuotaFileName)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := region.WriteQuota(path, s.quota(raised)); err != nil {
		t.Fatal(err)
	}
	e.enforceRounds(t, a, computeSamples)
	for _, r := range e.audit.all() {
		if r.Reason == agentstore.ReasonOverCompute {
			t.Errorf("75 %% against the quota file's ceiling of 80 %%: %+v, want no verdict", r)
		}
	}
	if len(e.killer.killed) != 0 {
		t.Errorf("killed %v, want none", e.killer.killed)
	}
}

// TestCapsOfASliceThatLeftAreForgotten: a quota pass forgets the caps of
// a slice no longer on the node, including caps an earlier apply wrote
// back after the sampling round forgot the slice.
func TestCapsOfASliceThatLeftAreForgotten(t *testing.T) {
	e := newEnv(t)
	a := e.agent(t, Config{}, nil)
	a.limits["slice-gone"] = sliceLimits{memoryBytes: 1 << 30, computeLimitPercent: 50}
	a.computes["slice-gone"] = 20
	_ = a.applyQuotas(t.Context()) // the local slices have no desired quota: nothing to apply
	a.quotaMu.Lock()
	_, lim := a.limits["slice-gone"]
	_, comp := a.computes["slice-gone"]
	a.quotaMu.Unlock()
	if lim || comp {
		t.Errorf("caps of a slice that left kept (limits %v, computes %v), want forgotten", lim, comp)
	}
}
