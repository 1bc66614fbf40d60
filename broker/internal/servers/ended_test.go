package servers_test

import (
	"testing"

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
	key, rec := runningLab(t, f)
	f.RecordStopped(t, rec)
	f.EndPod(t, key.User, key.Name)
	pod := spawner.PodName(key.User, key.Name)
	f.WaitHandled(t, "the ended pod's event", func(e spawner.PodEvent) bool {
		return e.Pod == pod && e.Phase == spawner.PhaseGone && e.Held
	})
	if fin := f.Pod(t, key.User, key.Name).Finalizers; len(fin) != 1 {
		t.Fatalf("finalizers %v after the event of a pod whose end was recorded already, want gpubroker's kept for the pass", fin)
	}
	if err := f.Service.Remove(t.Context(), serverstest.By, key); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if fin := f.Pod(t, key.User, key.Name).Finalizers; len(fin) != 0 {
		t.Errorf("finalizers %v after the removal, want none", fin)
	}
}
