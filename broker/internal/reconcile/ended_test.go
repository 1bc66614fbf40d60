package reconcile_test

import (
	"errors"
	"strings"
	"testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/spawner"
)

// TestAPassRecordsTheEndOfPodsThatEndedWhileRedisHadLostThem: Redis lost
// its data, then two pods ended (one had run its notebook, one had not
// started) before any pass rebuilt their servers. The finalizer kept both;
// the pass rebuilds their records as stopped and failed, restores no slice
// for them, and releases the pods.
func TestAPassRecordsTheEndOfPodsThatEndedWhileRedisHadLostThem(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	a := runningServer(t, f, "alice", "one", "10.0.0.1")
	if _, _, err := f.Service.Create(ctx, serverstest.By, "bob", nil, "two", v1.CreateServerRequest{Profile: "small"}, "k"); err != nil {
		t.Fatal(err)
	}
	b := f.WaitState(t, fleet.ServerKey{User: "bob", Name: "two"}, v1.StateStarting)
	r := newReconciler(f)
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Redis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.RegisterGPUs(t)
	f.EndPod(t, "alice", "one")
	f.EndPod(t, "bob", "two")

	rep, err := r.Once(ctx)
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	if rep.RestoredServers != 2 || rep.RestoredSlices != 0 || rep.ReleasedPods != 2 {
		t.Errorf("report %+v, want 2 servers restored, no slice, 2 pods released", rep)
	}
	for _, tc := range []struct {
		rec  fleet.Server
		want fleet.State
	}{{a, v1.StateStopped}, {b, v1.StateFailed}} {
		got, err := f.Store.GetServer(ctx, tc.rec.ServerKey)
		if err != nil {
			t.Errorf("%s/%s: %v, want it rebuilt", tc.rec.User, tc.rec.Name, err)
			continue
		}
		if got.State != tc.want || got.SpawnID != tc.rec.SpawnID || got.Allocation != nil || !strings.Contains(got.Message, "lost") {
			t.Errorf("%s/%s rebuilt as %s (spawn %s, allocation %v): %q; want %s of spawn %s, no slice, saying its record was lost",
				tc.rec.User, tc.rec.Name, got.State, got.SpawnID, got.Allocation, got.Message, tc.want, tc.rec.SpawnID)
		}
		if fin := f.Pod(t, tc.rec.User, tc.rec.Name).Finalizers; len(fin) != 0 {
			t.Errorf("pod of %s/%s keeps finalizers %v", tc.rec.User, tc.rec.Name, fin)
		}
	}
	if ids, err := f.Store.AllocationIDs(ctx); err != nil || len(ids) != 0 {
		t.Errorf("allocations %v (%v), want none", ids, err)
	}
	// Once more: nothing is left to do.
	if rep, err := r.Once(ctx); err != nil || rep.RestoredServers+rep.ReleasedPods != 0 {
		t.Errorf("second pass: report %+v err %v, want nothing restored or released", rep, err)
	}
}

// TestAnEndedPodOfAnEarlierSpawnIsReleased: the pod of a spawn whose
// record has ended already ended too; there is no end to record, and the
// pod is released by the pass.
func TestAnEndedPodOfAnEarlierSpawnIsReleased(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	a := runningServer(t, f, "alice", "one", "10.0.0.1")
	if _, err := f.Store.Transition(ctx, a.ServerKey, a.SpawnID, v1.StateStopping, "stopping", fleet.ServerPatch{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Transition(ctx, a.ServerKey, a.SpawnID, v1.StateStopped, "stopped", fleet.ServerPatch{DropAllocation: true}); err != nil {
		t.Fatal(err)
	}
	f.EndPod(t, "alice", "one")
	if _, err := newReconciler(f).Once(ctx); err != nil {
		t.Fatalf("pass: %v", err)
	}
	if fin := f.Pod(t, "alice", "one").Finalizers; len(fin) != 0 {
		t.Errorf("finalizers %v, want none", fin)
	}
}

// TestAnEndedPodOfARemovedServerIsNotRestored: a server stopped, and its
// owner removed it while its pod was still shutting down; when the pod
// ends there is no record, but Redis lost nothing since the pod was
// created (the epoch began well before it). The server stays removed and
// the pod is released.
func TestAnEndedPodOfARemovedServerIsNotRestored(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	r := newReconciler(f)
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	f.Clock.Advance(2 * fleet.PodCreateWindow) // the pod comes well after the epoch began
	a := runningServer(t, f, "alice", "one", "10.0.0.1")
	if _, err := f.Store.Transition(ctx, a.ServerKey, a.SpawnID, v1.StateStopping, "stopping", fleet.ServerPatch{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Transition(ctx, a.ServerKey, a.SpawnID, v1.StateStopped, "stopped", fleet.ServerPatch{DropAllocation: true}); err != nil {
		t.Fatal(err)
	}
	if err := f.Service.Remove(ctx, serverstest.By, a.ServerKey); err != nil {
		t.Fatal(err)
	}
	f.EndPod(t, "alice", "one")
	rep, err := r.Once(ctx)
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	if got, err := f.Store.GetServer(ctx, a.ServerKey); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("the removed server is back: %+v (%v); want it to stay removed", got, err)
	}
	if rep.RestoredServers != 0 {
		t.Errorf("report %+v, want no server restored", rep)
	}
	if fin := f.Pod(t, "alice", "one").Finalizers; len(fin) != 0 {
		t.Errorf("finalizers %v, want none", fin)
	}
}

// TestAnEndedPodWhoseEndWasRecordedByAReplicaThatDiedIsReleasedByThePass:
// the replica that recorded a server stopped died before it removed the
// pod's finalizer. The other replica's pod event finds the end recorded
// already and leaves the pod held (only the call that records an end
// releases); the pass releases it.
func TestAnEndedPodWhoseEndWasRecordedByAReplicaThatDiedIsReleasedByThePass(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	a := runningServer(t, f, "alice", "one", "10.0.0.1")
	f.RecordStopped(t, a)
	f.EndPod(t, "alice", "one")
	f.WaitHandled(t, "the ended pod's event", func(e spawner.PodEvent) bool {
		return e.Pod == a.Pod && e.Phase == spawner.PhaseGone && e.Held
	})
	if got := f.Releases.Calls(); len(got) != 0 {
		t.Errorf("ReleasePod calls %+v on the event of a pod whose end was recorded already, want none", got)
	}
	if fin := f.Pod(t, "alice", "one").Finalizers; len(fin) != 1 {
		t.Fatalf("finalizers %v before the pass, want gpubroker's", fin)
	}
	rep, err := newReconciler(f).Once(ctx)
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	if rep.ReleasedPods != 1 {
		t.Errorf("report %+v, want 1 pod released", rep)
	}
	if fin := f.Pod(t, "alice", "one").Finalizers; len(fin) != 0 {
		t.Errorf("finalizers %v after the pass, want none", fin)
	}
}
