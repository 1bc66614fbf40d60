package reclaim_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
)

// recordingMetrics records the reclaimer's measurements.
type recordingMetrics struct {
	mu        sync.Mutex
	cycles    int
	failed    int
	decisions map[string]int // verdict/reason
	actions   []string       // action/reason/dryRun
	stopGPUs  []float64      // per cycle
	shrunk    []float64
}

func (m *recordingMetrics) ObserveCycle(_ time.Duration, failed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cycles++
	if failed {
		m.failed++
	}
}

func (m *recordingMetrics) ObserveDecision(verdict, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.decisions == nil {
		m.decisions = map[string]int{}
	}
	m.decisions[verdict+"/"+reason]++
}

func (m *recordingMetrics) ObserveAction(action, reason string, dryRun bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mode := "enforce"
	if dryRun {
		mode = "dry_run"
	}
	m.actions = append(m.actions, action+"/"+reason+"/"+mode)
}

func (m *recordingMetrics) ObserveFreed(stop, shrink float64, over time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if over != interval {
		panic("freed over " + over.String())
	}
	m.stopGPUs = append(m.stopGPUs, stop)
	m.shrunk = append(m.shrunk, shrink)
}

// TestCycleReportsDecisionsActionsAndFreedGPUs: an idle server under the
// stop policy is warned and stopped, each action reported once; every
// cycle reports its verdict; from the cycle after the stop the slice's
// 40 % counts as 0.4 GPUs freed by a stop, until the server starts again.
func TestCycleReportsDecisionsActionsAndFreedGPUs(t *testing.T) {
	f := newFixture(t)
	m := &recordingMetrics{}
	rec, err := reclaim.New(reclaim.Config{
		Policies: f.policies, Audit: f.log, States: f.states, Samples: redisstore.AgentSamples{Agents: f.agents},
		Servers: f.store, Stopper: f.stopper, Shrinker: quotaShrinker(f.agents),
		Prober: reclaim.NewProber(nil, 0, nil), Interval: interval, Now: f.clock.Now, Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.rec = rec
	f.policy(stopPolicy())
	nb := newNotebook(t, t0.Add(-time.Hour))
	f.server("nb", "spawn-1", nb)
	f.run(12*time.Minute, "spawn-1", constSM(0))
	if s := f.get("nb"); s.State != v1.StateStopped {
		t.Fatalf("server is %s after 12 idle minutes, want stopped", s.State)
	}
	f.run(2*interval, "spawn-1", constSM(-1))

	m.mu.Lock()
	defer m.mu.Unlock()
	cycles := int(12*time.Minute/interval) + 2
	if m.cycles != cycles || m.failed != 0 {
		t.Errorf("%d cycles (%d failed) measured, want %d (0)", m.cycles, m.failed, cycles)
	}
	if diff := cmp.Diff([]string{"warn/idle/enforce", "stop/idle/enforce"}, m.actions); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
	if m.decisions["idle/idle"] == 0 {
		t.Errorf("decisions %v, want idle verdicts", m.decisions)
	}
	if n := len(m.stopGPUs); n != cycles {
		t.Fatalf("%d freed measurements, want one per cycle (%d)", n, cycles)
	}
	if last := m.stopGPUs[len(m.stopGPUs)-1]; last != 0.4 {
		t.Errorf("freed by stops after the stop = %v GPUs, want 0.4 (a 40 %% slice)", last)
	}
	if first := m.stopGPUs[0]; first != 0 {
		t.Errorf("freed by stops before any stop = %v, want 0", first)
	}
}
