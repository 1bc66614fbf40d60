package servers_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/spawner"
)

// spawnCounter is a servers.Metrics that counts spawns by outcome.
type spawnCounter struct {
	mu    sync.Mutex
	spawn map[string]int
}

func (c *spawnCounter) ObservePlacement(time.Duration, string) {}

func (c *spawnCounter) ObserveSpawn(_, outcome string, _ time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.spawn == nil {
		c.spawn = map[string]int{}
	}
	c.spawn[outcome]++
}

func (c *spawnCounter) count(outcome string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spawn[outcome]
}

// staleReads is the store of a replica that read a server's record before
// another replica moved it on: its next GetServer of that server answers
// the record as it was.
type staleReads struct {
	servers.Store
	mu    sync.Mutex
	stale map[fleet.ServerKey]fleet.Server
}

func (s *staleReads) GetServer(ctx context.Context, k fleet.ServerKey) (fleet.Server, error) {
	s.mu.Lock()
	rec, ok := s.stale[k]
	delete(s.stale, k)
	s.mu.Unlock()
	if ok {
		return rec, nil
	}
	return s.Store.GetServer(ctx, k)
}

// TestTwoReplicasHandlingOnePodEventCountTheSpawnOnce: both replicas watch
// the pods, so both handle the event that ends a spawn. The second read the
// record before the first moved it (still starting), so it asks for the
// same transition, which the store answers as done already. The spawn is
// counted by the replica that moved it, not by both.
func TestTwoReplicasHandlingOnePodEventCountTheSpawnOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ev      func(spawner.PodEvent) spawner.PodEvent
		outcome string
		want    fleet.State
	}{
		{"running", func(ev spawner.PodEvent) spawner.PodEvent {
			ev.Phase, ev.Message, ev.URL = spawner.PhaseRunning, "running", "http://10.0.0.9:8888"
			return ev
		}, servers.OutcomeRunning, v1.StateRunning},
		{"failed", func(ev spawner.PodEvent) spawner.PodEvent {
			ev.Phase, ev.Message = spawner.PhaseFailed, "the notebook keeps crashing"
			return ev
		}, servers.OutcomeFailed, v1.StateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := &spawnCounter{}
			f := serverstest.New(t, servers.WithMetrics(first))
			ctx := t.Context()
			key := fleet.ServerKey{User: "alice", Name: "lab"}
			if _, _, err := f.Service.Create(ctx, serverstest.By, key.User, nil, key.Name, v1.CreateServerRequest{Profile: "small"}, "k1"); err != nil {
				t.Fatalf("create: %v", err)
			}
			rec := f.WaitState(t, key, v1.StateStarting)
			second := &spawnCounter{}
			store := &staleReads{Store: f.Store, stale: map[fleet.ServerKey]fleet.Server{key: rec}}
			replica := servers.New(store, f.Pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now), servers.WithMetrics(second))

			ev := tc.ev(spawner.PodEvent{User: key.User, Server: key.Name, SpawnID: rec.SpawnID, Pod: spawner.PodName(key.User, key.Name), Held: true})
			if err := f.Service.HandlePodEvent(ctx, ev); err != nil {
				t.Fatalf("first replica: %v", err)
			}
			if err := replica.HandlePodEvent(ctx, ev); err != nil {
				t.Fatalf("second replica: %v", err)
			}
			if got, err := f.Store.GetServer(ctx, key); err != nil || got.State != tc.want {
				t.Fatalf("server %s (%v), want %s", got.State, err, tc.want)
			}
			if n, m := first.count(tc.outcome), second.count(tc.outcome); n+m != 1 || n != 1 {
				t.Errorf("spawn counted %s by the replica that moved it %d times and by the other %d times, want once in all", tc.outcome, n, m)
			}
		})
	}
}

// releases returns the ReleasePod calls of logs for pod, in all.
func releases(pod string, logs ...*serverstest.ReleaseLog) []serverstest.Release {
	var out []serverstest.Release
	for _, l := range logs {
		for _, r := range l.Calls() {
			if r.Pod == pod {
				out = append(out, r)
			}
		}
	}
	return out
}

// TestTwoReplicasSeeingOneEndedPodReleaseItOnce: a running server's pod is
// deleted behind the broker's back and ends, held by gpubroker's
// finalizer. Both replicas watch the pods, so both handle its event. The
// one whose transition recorded the server stopped (slice released)
// removes the finalizer, after recording; the other neither releases it
// nor reads the record back: one ReleasePod in all.
func TestTwoReplicasSeeingOneEndedPodReleaseItOnce(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key, _ := runningLab(t, f)
	rec, err := f.Store.GetServer(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// The fixture's replica handles the pod's events; this one is handed
	// the ended pod's event too.
	other := &serverstest.ReleaseLog{Pods: f.Pods, Store: f.Store}
	replica := servers.New(f.Store, other, f.Catalog, f.Log, servers.WithClock(f.Clock.Now))
	f.EndPod(t, key.User, key.Name)
	ev := spawner.PodEvent{User: key.User, Server: key.Name, SpawnID: rec.SpawnID, Pod: rec.Pod, Phase: spawner.PhaseGone, Held: true}
	if err := replica.HandlePodEvent(ctx, ev); err != nil {
		t.Fatalf("handle the ended pod's event: %v", err)
	}
	f.WaitHandled(t, "the ended pod's event", func(e spawner.PodEvent) bool {
		return e.Pod == rec.Pod && e.Phase == spawner.PhaseGone && e.Held
	})
	if got := releases(rec.Pod, f.Releases, other); len(got) != 1 || got[0].State != v1.StateStopped {
		t.Errorf("ReleasePod calls %+v, want one in all, with the server stopped", got)
	}
	if fin := f.Pod(t, key.User, key.Name).Finalizers; len(fin) != 0 {
		t.Errorf("finalizers %v after the release, want none", fin)
	}
	got, err := f.Store.GetServer(ctx, key)
	if err != nil || got.State != v1.StateStopped || got.Allocation != nil {
		t.Fatalf("server %s (allocation %v, %v), want stopped without a slice", got.State, got.Allocation, err)
	}
	if ids, err := f.Store.AllocationIDs(ctx); err != nil || len(ids) != 0 {
		t.Errorf("allocations %v (%v), want none", ids, err)
	}
}

// TestAFailedSpawnsPodIsReleasedByTheCallThatFailedIt: a spawn's notebook
// keeps crashing; both replicas handle the pod's event, fail the spawn and
// delete its pod, which the API server keeps terminating (it holds
// gpubroker's finalizer). The replica whose transition recorded the
// failure releases the pod right after, with no reconcile pass and before
// the pod ends, so a new start of the server need not wait for a pass to
// let the old pod go: one ReleasePod in all.
func TestAFailedSpawnsPodIsReleasedByTheCallThatFailedIt(t *testing.T) {
	f := serverstest.New(t)
	f.KeepDeletedPods(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "alice", Name: "lab"}
	if _, _, err := f.Service.Create(ctx, serverstest.By, key.User, nil, key.Name, v1.CreateServerRequest{Profile: "small"}, "k1"); err != nil {
		t.Fatalf("create: %v", err)
	}
	rec := f.WaitState(t, key, v1.StateStarting)
	other := &serverstest.ReleaseLog{Pods: f.Pods, Store: f.Store}
	replica := servers.New(f.Store, other, f.Catalog, f.Log, servers.WithClock(f.Clock.Now))
	f.SetPodWaiting(t, key.User, key.Name, "CrashLoopBackOff", "back-off restarting failed container")
	ev := spawner.PodEvent{User: key.User, Server: key.Name, SpawnID: rec.SpawnID, Pod: rec.Pod, Phase: spawner.PhaseFailed, Message: "the notebook keeps crashing"}
	if err := replica.HandlePodEvent(ctx, ev); err != nil {
		t.Fatalf("handle the failed pod's event: %v", err)
	}
	f.WaitHandled(t, "the failed pod's event", func(e spawner.PodEvent) bool {
		return e.Pod == rec.Pod && e.Phase == spawner.PhaseFailed
	})
	f.WaitState(t, key, v1.StateFailed)
	if got := releases(rec.Pod, f.Releases, other); len(got) != 1 || got[0].State != v1.StateFailed {
		t.Errorf("ReleasePod calls %+v, want one in all, with the server failed", got)
	}
	pod := f.Pod(t, key.User, key.Name)
	if pod.DeletionTimestamp == nil || len(pod.Finalizers) != 0 {
		t.Errorf("pod deleting %v with finalizers %v, want it deleting and released", pod.DeletionTimestamp != nil, pod.Finalizers)
	}
}

// callCounter is the store of a replica that counts its calls that read
// or write a server record.
type callCounter struct {
	servers.Store
	mu sync.Mutex
	n  int
}

func (s *callCounter) add() {
	s.mu.Lock()
	s.n++
	s.mu.Unlock()
}

func (s *callCounter) GetServer(ctx context.Context, k fleet.ServerKey) (fleet.Server, error) {
	s.add()
	return s.Store.GetServer(ctx, k)
}

func (s *callCounter) Transition(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, error) {
	s.add()
	return s.Store.Transition(ctx, k, spawnID, to, message, patch)
}

func (s *callCounter) Advance(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, bool, error) {
	s.add()
	return s.Store.Advance(ctx, k, spawnID, to, message, patch)
}

func (s *callCounter) MoveFrom(ctx context.Context, k fleet.ServerKey, spawnID string, from, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, error) {
	s.add()
	return s.Store.MoveFrom(ctx, k, spawnID, from, to, message, patch)
}

func (s *callCounter) SetMessage(ctx context.Context, k fleet.ServerKey, spawnID string, state fleet.State, message string) (fleet.Server, error) {
	s.add()
	return s.Store.SetMessage(ctx, k, spawnID, state, message)
}

func (s *callCounter) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// startingWithCounter creates alice's server lab on f's own replica, waits
// until it is starting and that replica has handled its pod's event (from
// then on nothing else writes the record), and returns the record and a
// second replica whose store calls are counted.
func startingWithCounter(t *testing.T, f *serverstest.Fixture) (fleet.Server, *callCounter, *servers.Service) {
	t.Helper()
	key := fleet.ServerKey{User: "alice", Name: "lab"}
	if _, _, err := f.Service.Create(t.Context(), serverstest.By, key.User, nil, key.Name, v1.CreateServerRequest{Profile: "small"}, "k1"); err != nil {
		t.Fatalf("create: %v", err)
	}
	rec := f.WaitState(t, key, v1.StateStarting)
	f.WaitHandled(t, "the new pod's event", func(ev spawner.PodEvent) bool { return ev.SpawnID == rec.SpawnID })
	store := &callCounter{Store: f.Store}
	return rec, store, servers.New(store, f.Pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now))
}

func TestAReplicaFindingThePodsMessageRecordedWritesNothing(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	rec, store, replica := startingWithCounter(t, f)
	key := rec.ServerKey
	ev := spawner.PodEvent{User: key.User, Server: key.Name, SpawnID: rec.SpawnID, Pod: spawner.PodName(key.User, key.Name),
		Phase: spawner.PhaseStarting, Message: "pulling image quay.io/jupyter/base-notebook"}

	if err := replica.HandlePodEvent(ctx, ev); err != nil {
		t.Fatalf("new message: %v", err)
	}
	got, err := f.Store.GetServer(ctx, key)
	if err != nil || got.State != v1.StateStarting || got.Message != ev.Message {
		t.Fatalf("after a new message: %s %q (%v), want starting %q", got.State, got.Message, err, ev.Message)
	}
	if n := store.count(); n != 1 {
		t.Fatalf("a new message took %d store calls, want 1 (the write, no read before it)", n)
	}
	evs, err := f.Store.Events(ctx, key, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Clock.Advance(time.Second)
	if err := replica.HandlePodEvent(ctx, ev); err != nil {
		t.Fatalf("same message again: %v", err)
	}
	if n := store.count(); n != 2 {
		t.Errorf("a message the record holds already took %d more store calls, want 1", n-1)
	}
	again, err := f.Store.GetServer(ctx, key)
	if err != nil || !again.UpdatedAt.Equal(got.UpdatedAt) {
		t.Errorf("the same message again moved the record's time from %v to %v (%v), want no write", got.UpdatedAt, again.UpdatedAt, err)
	}
	if more, err := f.Store.Events(ctx, key, evs[len(evs)-1].ID, 0); err != nil || len(more) != 0 {
		t.Errorf("the same message again appended %v (%v), want no event", more, err)
	}

	// The pod runs: one call moves the record and counts the spawn.
	running := ev
	running.Phase, running.URL, running.Message = spawner.PhaseRunning, "http://10.0.0.9:8888", ""
	if err := replica.HandlePodEvent(ctx, running); err != nil {
		t.Fatalf("running: %v", err)
	}
	if got, err := f.Store.GetServer(ctx, key); err != nil || got.State != v1.StateRunning || got.URL != running.URL {
		t.Fatalf("after the pod ran: %s at %q (%v), want running at %s", got.State, got.URL, err, running.URL)
	}
	if n := store.count(); n != 3 {
		t.Errorf("the running event took %d store calls, want 1", n-2)
	}
	// Once running, the same event reads the record and writes nothing.
	if err := replica.HandlePodEvent(ctx, running); err != nil {
		t.Fatalf("running again: %v", err)
	}
	if n := store.count(); n != 5 {
		t.Errorf("a second running event took %d store calls, want 2 (the refused move, the read)", n-3)
	}
}

// TestAnEventWaitThatBringsEventsReadsNoRecord: an event stream's waits
// read the record only when they bring nothing (is the server still
// there?), not before each wait.
func TestAnEventWaitThatBringsEventsReadsNoRecord(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	rec, store, replica := startingWithCounter(t, f)
	key := rec.ServerKey

	evs, err := replica.Events(ctx, key, "", time.Minute)
	if err != nil || len(evs) == 0 || evs[0].State != v1.StatePending {
		t.Fatalf("events from the start = %v, %v; want the spawn's, pending first", evs, err)
	}
	if n := store.count(); n != 0 {
		t.Errorf("a wait that brought %d events read the record %d times, want none", len(evs), n)
	}
	more, err := replica.Events(ctx, key, evs[len(evs)-1].ID, 10*time.Millisecond)
	if err != nil || len(more) != 0 {
		t.Fatalf("a wait after the last event = %v, %v; want none", more, err)
	}
	if n := store.count(); n != 1 {
		t.Errorf("a wait that brought nothing read the record %d times, want 1 (is it still there?)", n)
	}
	if _, err := replica.Events(ctx, fleet.ServerKey{User: "alice", Name: "none"}, "", 10*time.Millisecond); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("a wait on no server: %v, want ErrNotFound", err)
	}
	if _, err := replica.Events(ctx, fleet.ServerKey{User: "alice", Name: "none"}, "", 0); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("a read of no server: %v, want ErrNotFound", err)
	}
}
