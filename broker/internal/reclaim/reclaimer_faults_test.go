package reclaim_test

// The cycle under faults and races: a shrink whose event write fails, an
// extension granted while the cycle probes the notebooks.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
)

// eventFailingServers is the store with the compute the shrinker set, and
// the first write of a shrink's event failing (a Redis blip).
type eventFailingServers struct {
	f       *fixture
	mu      sync.Mutex
	compute map[string]int
	failed  bool
}

func (p *eventFailingServers) ListServers(ctx context.Context, user string) ([]fleet.Server, error) {
	all, err := p.f.store.ListServers(ctx, user)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range all {
		if c, ok := p.compute[all[i].SpawnID]; ok {
			all[i].Slice.ComputePercent, all[i].Slice.ComputeLimitPercent = c, c
			if c == slice.ComputePercent {
				all[i].Slice.ComputeLimitPercent = slice.ComputeLimitPercent
			}
		}
	}
	return all, err
}

func (p *eventFailingServers) Transition(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, error) {
	p.mu.Lock()
	if strings.Contains(message, "compute shrunk") && !p.failed {
		p.failed = true
		p.mu.Unlock()
		return fleet.Server{}, errors.New("redis: connection reset")
	}
	p.mu.Unlock()
	return p.f.store.Transition(ctx, k, spawnID, to, message, patch)
}

// TestAShrinkWhoseEventFailedIsStillRestored: the shrink took effect but
// its event could not be written; once the notebook is busy again its
// compute must come back (the ladder must remember the shrink).
func TestAShrinkWhoseEventFailedIsStillRestored(t *testing.T) {
	f := newFixture(t)
	p := stopPolicy()
	p.Action, p.ShrinkComputePercent, p.Warn = reclaim.ActionShrink, 5, 0
	f.policy(p)
	f.server("a", "spawn-1", newNotebook(t, t0.Add(-time.Hour)))
	ps := &eventFailingServers{f: f, compute: map[string]int{}}
	rec, err := reclaim.New(reclaim.Config{
		Policies: f.policies, Audit: f.log, States: f.states, Samples: redisstore.AgentSamples{Agents: f.agents},
		Servers: ps, Stopper: f.stopper,
		Shrinker: reclaim.ShrinkFunc(func(ctx context.Context, srv fleet.Server, cp, cl int) error {
			ps.mu.Lock()
			defer ps.mu.Unlock()
			ps.compute[srv.SpawnID] = cp
			return nil
		}),
		Prober: reclaim.NewProber(nil, 0, nil), Interval: interval, Now: f.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	cycle := func(sm int) {
		f.clock.Add(interval)
		f.sample("spawn-1", sm)
		_, _ = rec.Cycle(t.Context()) // the failed event is this cycle's error
	}
	for range 24 { // 12 idle minutes
		cycle(0)
	}
	ps.mu.Lock()
	shrunk, failed := ps.compute["spawn-1"], ps.failed
	ps.mu.Unlock()
	if shrunk != 5 || !failed {
		t.Fatalf("after 12 idle minutes: compute %d%%, event failed %v; want shrunk to 5%% with its event failed", shrunk, failed)
	}
	for range 4 { // busy again
		cycle(90)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if got := ps.compute["spawn-1"]; got != slice.ComputePercent {
		t.Errorf("busy again, compute is %d%%; want it restored to %d%%", got, slice.ComputePercent)
	}
}

// extendingProber extends the server's idle clock, as its user clicking
// "extend", while the cycle probes the notebook, once armed.
type extendingProber struct {
	rec     *reclaim.Reclaimer
	srv     fleet.Server
	armed   atomic.Bool
	granted atomic.Bool
	err     error
}

func (p *extendingProber) Probe(ctx context.Context, s fleet.Server) (reclaim.Activity, error) {
	if p.armed.Swap(false) {
		_, p.err = p.rec.Extend(ctx, p.srv, 30*time.Minute, ada)
		p.granted.Store(p.err == nil)
	}
	return reclaim.Activity{}, nil
}

// TestAnExtensionGrantedDuringTheCycleStopsItsStop: the user extends while
// the cycle that is about to stop the server probes the notebook; the
// extension was answered granted, so that cycle must not stop it.
func TestAnExtensionGrantedDuringTheCycleStopsItsStop(t *testing.T) {
	f := newFixture(t)
	f.policy(stopPolicy())
	srv := f.server("a", "spawn-1", newNotebook(t, t0.Add(-time.Hour)))
	pr := &extendingProber{srv: srv}
	rec, err := reclaim.New(reclaim.Config{
		Policies: f.policies, Audit: f.log, States: f.states, Samples: redisstore.AgentSamples{Agents: f.agents},
		Servers: f.store, Stopper: f.stopper, Shrinker: quotaShrinker(f.agents),
		Prober: pr, Interval: interval, Now: f.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	pr.rec = rec
	for i := 0; i < 40 && !pr.granted.Load(); i++ {
		f.clock.Add(interval)
		f.sample("spawn-1", 0)
		st, err := rec.State(t.Context(), f.get("a"))
		if err != nil {
			t.Fatal(err)
		}
		if st.NextAction == reclaim.ActionStop && !f.clock.Now().Before(st.NextAt) {
			pr.armed.Store(true) // the stop is due in this cycle
		}
		if _, err := rec.Cycle(t.Context()); err != nil {
			t.Fatalf("Cycle: %v", err)
		}
		if pr.err != nil {
			t.Fatalf("Extend: %v", pr.err)
		}
	}
	if !pr.granted.Load() {
		t.Fatal("the stop never came due")
	}
	if f.stopper.calls > 0 || f.get("a").State != v1.StateRunning {
		t.Errorf("the cycle during which the user's extension was granted stopped the server (%d stops, state %s)", f.stopper.calls, f.get("a").State)
	}
}
