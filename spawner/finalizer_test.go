package spawner

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// endPod marks pod name deleted with grace period 0 and still there, as the
// API server keeps a pod whose final delete came while it had finalizers,
// and waits until the cache reports it ended.
func (h *harness) endPod(t *testing.T, name string) {
	t.Helper()
	pod, err := h.cs.CoreV1().Pods("notebooks").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now, zero := metav1.NewTime(h.clock.Now()), int64(0)
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = &now, &zero
	if _, err := h.cs.CoreV1().Pods("notebooks").Update(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitEvent(t, "gone", func(ev PodEvent) bool { return ev.Pod == name && ev.Phase == PhaseGone && ev.Held })
}

// createEnded creates the pod of spec and ends it (endPod); it returns the
// pod's name.
func (h *harness) createEnded(t *testing.T, spec Spec) string {
	t.Helper()
	if err := h.client.Create(t.Context(), spec, nil); err != nil {
		t.Fatal(err)
	}
	name := PodName(spec.User, spec.Server)
	h.endPod(t, name)
	return name
}

func (h *harness) finalizers(t *testing.T, name string) []string {
	t.Helper()
	pod, err := h.cs.CoreV1().Pods("notebooks").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod.Finalizers
}

// countPatches counts the pod patches sent from now on. A patch the fake
// clientset cannot apply (a failed JSON patch test) is answered as the API
// server answers it, 422, rather than with the fake's bare error.
func (h *harness) countPatches() *int {
	n := new(int)
	apply := k8stesting.ObjectReaction(h.cs.Tracker())
	h.cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		*n++
		handled, obj, err := apply(a)
		var st apierrors.APIStatus
		if err != nil && !errors.As(err, &st) {
			err = apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", err.Error(), 0, false)
		}
		return handled, obj, err
	})
	return n
}

// TestAnEndedPodIsClassifiedGoneAndNotPresent: a pod whose final delete
// came in while it held the finalizer has ended: Classify says gone, and
// HasPod no longer finds it, although Pods still lists it (held).
func TestAnEndedPodIsClassifiedGoneAndNotPresent(t *testing.T) {
	h := startClient(t)
	spec := testSpec()
	name := PodName(spec.User, spec.Server)
	if err := h.client.Create(t.Context(), spec, nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{v1.FinalizerServerRecord}, h.finalizers(t, name)); diff != "" {
		t.Fatalf("finalizers of a new pod (-want +got):\n%s", diff)
	}
	h.endPod(t, name)
	if ok, err := h.client.HasPod(t.Context(), spec.User, spec.Server, spec.SpawnID); ok || err != nil {
		t.Errorf("HasPod of an ended pod = %t, %v; want false", ok, err)
	}
	pods, err := h.client.Pods()
	if err != nil || len(pods) != 1 || pods[0].Phase != PhaseGone || !pods[0].Held || !pods[0].Deleting {
		t.Errorf("Pods = %+v, %v; want the ended pod, gone and held", pods, err)
	}
}

// TestReleasePodRemovesOnlyItsFinalizerOnce: the release removes
// gpubroker's finalizer from an ended pod, and only that; releasing again
// (another replica) sends no write; a pod that is not being deleted, or of
// another spawn, keeps it.
func TestReleasePodRemovesOnlyItsFinalizerOnce(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	name := PodName(spec.User, spec.Server)
	if err := h.client.Create(ctx, spec, nil); err != nil {
		t.Fatal(err)
	}
	patches := h.countPatches()
	if err := h.client.ReleasePod(ctx, name, spec.SpawnID); err != nil {
		t.Fatalf("release a live pod: %v", err)
	}
	if *patches != 0 || len(h.finalizers(t, name)) != 1 {
		t.Fatalf("a live pod lost its finalizer (%d patches, finalizers %v)", *patches, h.finalizers(t, name))
	}
	h.endPod(t, name)
	if err := h.client.ReleasePod(ctx, name, "another-spawn"); err != nil || len(h.finalizers(t, name)) != 1 {
		t.Fatalf("release for another spawn: %v, finalizers %v; want it left alone", err, h.finalizers(t, name))
	}
	if err := h.client.ReleasePod(ctx, name, spec.SpawnID); err != nil {
		t.Fatalf("release: %v", err)
	}
	if *patches != 1 || len(h.finalizers(t, name)) != 0 {
		t.Fatalf("after the release: %d patches, finalizers %v; want 1 and none", *patches, h.finalizers(t, name))
	}
	// The cache may still show the finalizer: then the patch's test fails
	// and the pod is read again, which shows it gone. Either way, no
	// second removal is written.
	if err := h.client.ReleasePod(ctx, name, spec.SpawnID); err != nil || *patches > 2 || len(h.finalizers(t, name)) != 0 {
		t.Fatalf("second release: %v, %d patches in all; want success and no new removal", err, *patches)
	}
}

// TestReleasePodConflictRereadsAndRetries: between the read and the patch
// another controller put its finalizer first, so the index the patch tests
// no longer holds gpubroker's, and the API server refuses the patch (422,
// as it answers a failed JSON patch test). The release reads the pod again
// and removes the finalizer at its new index; the other one stays. A pod
// that is gone by the time of the patch is a success.
func TestReleasePodConflictRereadsAndRetries(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	name := h.createEnded(t, spec)
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	tries := 0
	h.cs.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		tries++
		if tries > 1 {
			return false, nil, nil
		}
		obj, err := h.cs.Tracker().Get(pods, "notebooks", name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		pod.Finalizers = append([]string{"example.com/other"}, pod.Finalizers...)
		if err := h.cs.Tracker().Update(pods, pod, "notebooks"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "",
			`the server rejected our request due to an error in our request: testing value /metadata/finalizers/0 failed: test failed`, 0, false)
	})
	if err := h.client.ReleasePod(ctx, name, spec.SpawnID); err != nil {
		t.Fatalf("release after a conflict: %v", err)
	}
	if tries != 2 {
		t.Errorf("%d patches, want 2 (the refused one and the retry)", tries)
	}
	if diff := cmp.Diff([]string{"example.com/other"}, h.finalizers(t, name)); diff != "" {
		t.Errorf("finalizers after the release (-want +got):\n%s", diff)
	}

	// Gone between the read and the patch: nothing left to release.
	spec2 := testSpec()
	spec2.Server, spec2.SpawnID = "two", "spawn-two"
	name2 := h.createEnded(t, spec2)
	h.cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetName() != name2 {
			return false, nil, nil
		}
		if err := h.cs.Tracker().Delete(pods, "notebooks", name2); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name2)
	})
	if err := h.client.ReleasePod(ctx, name2, spec2.SpawnID); err != nil {
		t.Errorf("release of a pod that went meanwhile: %v, want success", err)
	}
}

// TestReleasePodGivesUpOnEndlessConflicts: a pod that changes under every
// try is an error after maxConflictRetries, not a success.
func TestReleasePodGivesUpOnEndlessConflicts(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	name := h.createEnded(t, spec)
	h.cs.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, name, errors.New("the object has been modified"))
	})
	start := time.Now()
	err := h.client.ReleasePod(ctx, name, spec.SpawnID)
	if err == nil {
		t.Fatal("release under endless conflicts succeeded")
	}
	if len(h.finalizers(t, name)) != 1 {
		t.Errorf("finalizers %v, want gpubroker's kept", h.finalizers(t, name))
	}
	t.Logf("gave up after %s: %v", time.Since(start).Round(time.Millisecond), err)
}

// TestHasPodAsksTheAPIServerWhenTheCacheLacksThePod: a cache that lags the
// API server (a pod created moments ago, a watch re-establishing) does not
// make HasPod say "no pod" while the pod is there: a caller frees the
// slice on that answer.
func TestHasPodAsksTheAPIServerWhenTheCacheLacksThePod(t *testing.T) {
	h := startClient(t)
	spec := testSpec()
	if err := h.client.Create(t.Context(), spec, nil); err != nil {
		t.Fatal(err)
	}
	h.waitEvent(t, "the pod is cached", func(ev PodEvent) bool { return ev.SpawnID == spec.SpawnID })
	h.client.mu.Lock()
	h.client.lister = corelisters.NewPodLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))
	h.client.mu.Unlock()
	if ok, err := h.client.HasPod(t.Context(), spec.User, spec.Server, spec.SpawnID); err != nil || !ok {
		t.Errorf("HasPod of a pod the cache lacks but the API server has = %t, %v; want true", ok, err)
	}
	if ok, err := h.client.HasPod(t.Context(), spec.User, spec.Server, "another-spawn"); err != nil || ok {
		t.Errorf("HasPod of another spawn = %t, %v; want false", ok, err)
	}
	h.endPod(t, PodName(spec.User, spec.Server))
	if ok, err := h.client.HasPod(t.Context(), spec.User, spec.Server, spec.SpawnID); err != nil || ok {
		t.Errorf("HasPod of an ended pod the cache lacks = %t, %v; want false", ok, err)
	}
	if err := h.cs.CoreV1().Pods("notebooks").Delete(t.Context(), PodName(spec.User, spec.Server), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ok, err := h.client.HasPod(t.Context(), spec.User, spec.Server, spec.SpawnID); err != nil || ok {
		t.Errorf("HasPod of a pod gone from the API server = %t, %v; want false", ok, err)
	}
}
