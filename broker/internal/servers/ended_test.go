package servers_test

import (
	"testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/spawner"
)

// TestRemovingAServerReleasesItsEndedPod: a server's end was recorded by a
// call that never released its pod (the replica died right after), so the
// pod's event, which finds the end recorded already, leaves the pod held
// for the reconcile pass. The owner removes the server before that pass:
// the removal releases the pod, so a new start of the name need not wait
// for the pass.
func TestRemovingAServerReleasesItsEndedPod(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "alice", Name: "lab"}
	if _, _, err := f.Service.Create(ctx, serverstest.By, key.User, nil, key.Name, v1.CreateServerRequest{Profile: "small"}, "k1"); err != nil {
		t.Fatalf("create: %v", err)
	}
	f.SetPodRunning(t, key.User, key.Name, "10.0.0.1")
	rec := f.WaitState(t, key, v1.StateRunning)
	for _, to := range []fleet.State{v1.StateStopping, v1.StateStopped} {
		if _, err := f.Store.Transition(ctx, key, rec.SpawnID, to, string(to), fleet.ServerPatch{DropAllocation: to == v1.StateStopped}); err != nil {
			t.Fatal(err)
		}
	}
	f.EndPod(t, key.User, key.Name)
	f.WaitHandled(t, "the ended pod's event", func(e spawner.PodEvent) bool {
		return e.Pod == rec.Pod && e.Phase == spawner.PhaseGone && e.Held
	})
	if fin := f.Pod(t, key.User, key.Name).Finalizers; len(fin) != 1 {
		t.Fatalf("finalizers %v after the event of a pod whose end was recorded already, want gpubroker's kept for the pass", fin)
	}
	if err := f.Service.Remove(ctx, serverstest.By, key); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if fin := f.Pod(t, key.User, key.Name).Finalizers; len(fin) != 0 {
		t.Errorf("finalizers %v after the removal, want none", fin)
	}
}
