package servers_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
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
	key, _ := endRecordedThenPodEnded(t, f)
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

// A release that fails asks for a reconcile pass at once: no other replica
// retries it, and the leader's periodic pass may be far off.
func TestAFailedReleaseAsksForAPass(t *testing.T) {
	kicks := 0
	f := serverstest.New(t, servers.WithReconcileTrigger(func() { kicks++ }))
	key, pod := endRecordedThenPodEnded(t, f)
	before := kicks
	f.Kube.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, pod, errors.New("no patch for you"))
	})
	if err := f.Service.Remove(t.Context(), serverstest.By, key); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if fin := f.Pod(t, key.User, key.Name).Finalizers; len(fin) != 1 {
		t.Errorf("finalizers %v after a release the API server refused, want gpubroker's kept", fin)
	}
	if kicks != before+1 {
		t.Errorf("the failed release asked for %d passes, want 1", kicks-before)
	}
}

// A start refused because the pod of an earlier spawn is still there asks
// for a pass, which releases that pod if it has ended, so a retry a few
// seconds later need not wait for the leader's interval.
func TestAStartRefusedByAnEarlierPodAsksForAPass(t *testing.T) {
	kicks := 0
	f := serverstest.New(t, servers.WithReconcileTrigger(func() { kicks++ }))
	key, rec := runningLab(t, f)
	f.RecordStopped(t, rec) // the earlier spawn's pod stays
	before := kicks
	_, _, err := f.Service.Create(t.Context(), serverstest.By, key.User, nil, key.Name, v1.CreateServerRequest{Profile: "small"}, "k2")
	if !errors.Is(err, fleet.ErrConflict) || !strings.Contains(err.Error(), "still shutting down") {
		t.Fatalf("a start while the earlier pod is there: %v, want the conflict \"still shutting down\"", err)
	}
	if kicks != before+1 {
		t.Errorf("the refused start asked for %d passes, want 1", kicks-before)
	}
}

// endRecordedThenPodEnded runs alice's server lab, records its stop in the
// store alone (as a replica that died before its release would), then ends
// its pod and waits until the fixture's replica has handled that event,
// which leaves the pod held: its end was recorded by another call.
func endRecordedThenPodEnded(t *testing.T, f *serverstest.Fixture) (fleet.ServerKey, string) {
	t.Helper()
	key, rec := runningLab(t, f)
	f.RecordStopped(t, rec)
	f.EndPod(t, key.User, key.Name)
	pod := spawner.PodName(key.User, key.Name)
	f.WaitHandled(t, "the ended pod's event", func(e spawner.PodEvent) bool {
		return e.Pod == pod && e.Phase == spawner.PhaseGone && e.Held
	})
	return key, pod
}

// TestAFailedSpawnKeepsItsSliceUntilItsPodIsGone: a spawn that fails while
// its pod exists asks for the pod's deletion, but the pod runs through its
// grace period: the slice stays held, and the failed record shows it,
// until the pod is gone, when it is freed. The pod itself is released
// once, when the failure is recorded.
func TestAFailedSpawnKeepsItsSliceUntilItsPodIsGone(t *testing.T) {
	f := serverstest.New(t)
	f.KeepDeletedPods(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "mia", Name: "nb"}
	s, _, err := f.Service.Create(ctx, serverstest.By, key.User, nil, key.Name, v1.CreateServerRequest{Profile: "small"}, "k")
	if err != nil {
		t.Fatal(err)
	}
	f.SetPodWaiting(t, key.User, key.Name, "InvalidImageName", "no such image")
	pod := spawner.PodName(key.User, key.Name)
	f.WaitHandled(t, "the failed pod's event", func(e spawner.PodEvent) bool { return e.Pod == pod && e.Phase == spawner.PhaseFailed })
	failed := f.WaitState(t, key, v1.StateFailed)
	if p := f.Pod(t, key.User, key.Name); p.DeletionTimestamp == nil {
		t.Fatal("the failed spawn's pod was not deleted")
	}
	if _, err := f.Store.Allocation(ctx, s.SpawnID); err != nil {
		t.Errorf("the slice while the failed spawn's pod terminates: %v, want held", err)
	}
	if failed.Allocation == nil {
		t.Error("the failed record shows no allocation while its slice is held")
	}

	if calls := f.Releases.Calls(); len(calls) != 1 || calls[0].Pod != pod || calls[0].State != v1.StateFailed {
		t.Errorf("releases %+v, want one of %s once the failure is recorded", calls, pod)
	}

	// Its containers end, and the API server removes it (released, it
	// holds no finalizer).
	if err := f.Kube.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), serverstest.Namespace, pod); err != nil {
		t.Fatal(err)
	}
	f.WaitHandled(t, "the pod's end", func(e spawner.PodEvent) bool { return e.Pod == pod && e.Phase == spawner.PhaseGone })
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 0 {
		t.Errorf("allocations after the pod is gone = %v, want none", allocs)
	}
	if got, err := f.Service.Get(ctx, key); err != nil || got.State != v1.StateFailed || got.Allocation != nil {
		t.Errorf("record after the pod is gone: %s, allocation %v (%v); want failed without one", got.State, got.Allocation, err)
	}
	if calls := f.Releases.Calls(); len(calls) != 1 {
		t.Errorf("releases %+v, want still one", calls)
	}
	f.Verify(t)
}
