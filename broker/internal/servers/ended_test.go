package servers_test

import (
	"errors"
	"strings"
	"testing"

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
