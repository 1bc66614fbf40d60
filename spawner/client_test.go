package spawner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// fakeClock is a settable clock for deadlines.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type harness struct {
	cs     *fake.Clientset
	client *Client
	clock  *fakeClock
	events chan PodEvent
}

// startClient runs a Client on a fake clientset until the test ends. Created
// objects get a UID and the fake clock's creation time, as an API server
// would give them.
func startClient(t *testing.T, objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{cs: fake.NewClientset(objs...), clock: &fakeClock{now: t0}, events: make(chan PodEvent, 1000)}
	var uids int
	h.cs.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if obj, ok := a.(k8stesting.CreateAction).GetObject().(metav1.Object); ok && obj.GetUID() == "" {
			uids++
			obj.SetUID(types.UID("uid-" + strings.Repeat("x", uids)))
			obj.SetCreationTimestamp(metav1.NewTime(h.clock.Now()))
		}
		return false, nil, nil
	})
	h.client = New(h.cs, testConfig(), slog.New(slog.NewTextHandler(io.Discard, nil)),
		WithClock(h.clock.Now), WithResync(10*time.Millisecond))
	ctx, cancel := context.WithCancel(t.Context())
	h.client.Subscribe(ctx, func(ev PodEvent) { h.events <- ev })
	done := make(chan error, 1)
	go func() { done <- h.client.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if _, err := h.client.Pods(); !errors.Is(err, ErrNotSynced) {
			t.Errorf("Pods after Run returned: err = %v, want ErrNotSynced", err)
		}
		if err := h.client.Run(t.Context()); err == nil {
			t.Error("a second Run succeeded")
		}
	})
	wctx, wcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer wcancel()
	if err := h.client.WaitSynced(wctx); err != nil {
		t.Fatalf("WaitSynced: %v", err)
	}
	return h
}

// waitEvent returns the first event for which match is true, failing the
// test after 10 s.
func (h *harness) waitEvent(t *testing.T, what string, match func(PodEvent) bool) PodEvent {
	t.Helper()
	deadline := time.After(10 * time.Second)
	var seen []PodEvent
	for {
		select {
		case ev := <-h.events:
			if match(ev) {
				return ev
			}
			seen = append(seen, ev)
		case <-deadline:
			t.Fatalf("no %s event within 10s; saw %+v", what, seen)
		}
	}
}

func phaseIs(p Phase) func(PodEvent) bool { return func(ev PodEvent) bool { return ev.Phase == p } }

func (h *harness) setStatus(t *testing.T, name string, st corev1.PodStatus) {
	t.Helper()
	pod, err := h.cs.CoreV1().Pods("notebooks").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = st
	if _, err := h.cs.CoreV1().Pods("notebooks").UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func readyStatus(ip string) corev1.PodStatus {
	return corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
		},
		ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}},
	}
}

func TestPodsBeforeSync(t *testing.T) {
	c := New(fake.NewClientset(), testConfig(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := c.Pods(); !errors.Is(err, ErrNotSynced) {
		t.Errorf("Pods before Run: err = %v, want ErrNotSynced", err)
	}
	if _, err := c.HasPod(t.Context(), "alice", "nb", "s1"); !errors.Is(err, ErrNotSynced) {
		t.Errorf("HasPod before Run: err = %v, want ErrNotSynced", err)
	}
	if c.Synced() {
		t.Error("Synced before Run")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.WaitSynced(ctx); !errors.Is(err, ErrNotSynced) || !errors.Is(err, context.Canceled) {
		t.Errorf("WaitSynced on a done context: err = %v", err)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	c := New(fake.NewClientset(), Config{Namespace: "Bad NS"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := c.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("Run with a bad namespace: err = %v", err)
	}
}

func TestLifecycle(t *testing.T) {
	h := startClient(t)
	spec := testSpec()
	name := PodName(spec.User, spec.Server)

	if err := h.client.Create(t.Context(), spec, nil); err != nil {
		t.Fatalf("Create: %v", err)
	}
	ev := h.waitEvent(t, "pending", phaseIs(PhasePending))
	want := PodEvent{User: "alice", Server: "", SpawnID: spec.SpawnID, Pod: name, Phase: PhasePending, Message: "waiting for node gpu-1", Held: true}
	if diff := cmp.Diff(want, ev); diff != "" {
		t.Errorf("pending event (-want +got):\n%s", diff)
	}

	h.setStatus(t, name, readyStatus("10.88.0.7"))
	ev = h.waitEvent(t, "running", phaseIs(PhaseRunning))
	want = PodEvent{User: "alice", SpawnID: spec.SpawnID, Pod: name, Phase: PhaseRunning, Message: "running on node gpu-1", URL: "http://10.88.0.7:8888", Held: true}
	if diff := cmp.Diff(want, ev); diff != "" {
		t.Errorf("running event (-want +got):\n%s", diff)
	}
	pods, err := h.client.Pods()
	if err != nil {
		t.Fatalf("Pods: %v", err)
	}
	wantPods := []ManagedPod{{
		Name: name, User: "alice", Profile: "small", SpawnID: spec.SpawnID, Node: "gpu-1", GPUUUID: spec.GPU.UUID,
		Slice: spec.Slice, Sharing: v1.SharingSliced, QuotaGroups: spec.QuotaGroups, Phase: PhaseRunning, Message: "running on node gpu-1",
		URL: "http://10.88.0.7:8888", CreatedAt: t0, Held: true, Ran: true,
	}}
	if diff := cmp.Diff(wantPods, pods); diff != "" {
		t.Errorf("Pods (-want +got):\n%s", diff)
	}

	crash := readyStatus("10.88.0.7")
	crash.Conditions[1].Status = corev1.ConditionFalse
	crash.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, RestartCount: 4,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}
	h.setStatus(t, name, crash)
	ev = h.waitEvent(t, "failed", phaseIs(PhaseFailed))
	if diff := cmp.Diff("the notebook keeps crashing: it exited with code 1 (4 restarts)", ev.Message); diff != "" {
		t.Errorf("failed message (-want +got):\n%s", diff)
	}

	if err := h.client.Delete(t.Context(), spec.User, spec.Server, spec.SpawnID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	ev = h.waitEvent(t, "gone", phaseIs(PhaseGone))
	if ev.SpawnID != spec.SpawnID || ev.Pod != name {
		t.Errorf("gone event %+v does not name the spawn", ev)
	}
	if _, err := h.cs.CoreV1().Pods("notebooks").Get(t.Context(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod still there after Delete: %v", err)
	}
}

// TestDeadlineWithoutUpdates checks that the periodic re-evaluation fails a
// pod that no kubelet ever touches, with no further pod update.
func TestDeadlineWithoutUpdates(t *testing.T) {
	h := startClient(t)
	spec := testSpec()
	if err := h.client.Create(t.Context(), spec, nil); err != nil {
		t.Fatal(err)
	}
	h.waitEvent(t, "pending", phaseIs(PhasePending))
	h.clock.Advance(DefaultStartTimeout)
	ev := h.waitEvent(t, "failed", phaseIs(PhaseFailed))
	if diff := cmp.Diff("node gpu-1 did not start the notebook within 5m0s", ev.Message); diff != "" {
		t.Errorf("message (-want +got):\n%s", diff)
	}
}

func TestCreateIdempotent(t *testing.T) {
	h := startClient(t)
	spec := testSpec()
	name := PodName(spec.User, spec.Server)
	ctx := t.Context()
	if err := h.client.Create(ctx, spec, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.client.Create(ctx, spec, nil); err != nil {
		t.Errorf("Create of the same spawn again: %v", err)
	}

	other := spec
	other.SpawnID = "second-spawn"
	err := h.client.Create(ctx, other, nil)
	if !errors.Is(err, ErrPodExists) || !strings.Contains(err.Error(), "spawn "+spec.SpawnID+") still exists") {
		t.Errorf("Create of another spawn: err = %v, want ErrPodExists naming the old spawn", err)
	}

	pod, err := h.cs.CoreV1().Pods("notebooks").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.DeletionTimestamp = ptr(metav1.NewTime(t0))
	if _, err := h.cs.CoreV1().Pods("notebooks").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = h.client.Create(ctx, other, nil)
	if !errors.Is(err, ErrPodExists) || !strings.Contains(err.Error(), "still shutting down") {
		t.Errorf("Create while the old pod terminates: err = %v", err)
	}
	got, err := h.cs.CoreV1().Pods("notebooks").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[v1.AnnotationSpawnID] != spec.SpawnID {
		t.Errorf("the old pod was replaced: spawn %q", got.Annotations[v1.AnnotationSpawnID])
	}
}

func TestCreateNotOwned(t *testing.T) {
	spec := testSpec()
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: PodName(spec.User, spec.Server), Namespace: "notebooks"}}
	h := startClient(t, foreign)
	if err := h.client.Create(t.Context(), spec, nil); !errors.Is(err, ErrNotOwned) {
		t.Errorf("Create over a foreign pod: err = %v, want ErrNotOwned", err)
	}
	if err := h.client.Delete(t.Context(), spec.User, spec.Server, ""); !errors.Is(err, ErrNotOwned) {
		t.Errorf("Delete of a foreign pod: err = %v, want ErrNotOwned", err)
	}
	if _, err := h.cs.CoreV1().Pods("notebooks").Get(t.Context(), foreign.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("foreign pod: %v", err)
	}
}

func TestCreateRejected(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		wantErr error
	}{
		{name: "forbidden by quota", err: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "nb-alice",
			errors.New("exceeded quota: compute, requested: memory=4Gi, used: memory=8Gi, limited: memory=10Gi")), wantErr: ErrRejected},
		{name: "invalid", err: apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "nb-alice",
			field.ErrorList{field.Invalid(field.NewPath("spec"), "x", "bad")}), wantErr: ErrRejected},
		{name: "server error is retried, then unavailable", err: apierrors.NewInternalError(errors.New("etcd timeout")), wantErr: ErrUnavailable},
		{name: "the authorizer's 403 is retried, then unavailable", err: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "nb-alice",
			errors.New(`User "gpubroker" cannot create resource "pods" in API group "" in the namespace "nb"`)), wantErr: ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := startClient(t)
			h.client.retryFor = 300 * time.Millisecond
			h.cs.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
			err := h.client.Create(t.Context(), testSpec(), nil)
			if err == nil {
				t.Fatal("Create succeeded")
			}
			for _, sentinel := range []error{ErrRejected, ErrUnavailable} {
				if got := errors.Is(err, sentinel); got != (tc.wantErr == sentinel) {
					t.Errorf("errors.Is(%v, %v) = %v", err, sentinel, got)
				}
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("error %v does not wrap the API error", err)
			}
		})
	}
}

// TestCreateRetriesPastCap: an API server that stays unavailable after the
// backoff reached its cap is tried on, until the retries' time is up, not
// given up on at the cap.
func TestCreateRetriesPastCap(t *testing.T) {
	h := startClient(t)
	h.client.retryFor = time.Minute // the test's own deadline ends it first if it never succeeds
	h.client.backoff = wait.Backoff{Duration: time.Millisecond, Factor: 2, Cap: 4 * time.Millisecond, Steps: 1 << 20}
	const failures = 12 // the cap is reached after 3
	var tries atomic.Int32
	h.cs.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if tries.Add(1) <= failures {
			return true, nil, apierrors.NewServiceUnavailable("starting")
		}
		return false, nil, nil
	})
	if err := h.client.Create(t.Context(), testSpec(), nil); err != nil {
		t.Fatalf("Create after %d unavailable answers: %v (%d tries)", failures, err, tries.Load())
	}
	if got := tries.Load(); got != failures+1 {
		t.Errorf("%d tries, want %d", got, failures+1)
	}
}

func TestCreateWithSecret(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	if err := h.client.Create(ctx, spec, map[string]string{"JUPYTERHUB_API_TOKEN": "tok-1"}); err != nil {
		t.Fatal(err)
	}
	secretName := SecretName(spec.User, spec.Server)
	sec, err := h.cs.CoreV1().Secrets("notebooks").Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string][]byte{"JUPYTERHUB_API_TOKEN": []byte("tok-1")}, sec.Data); diff != "" {
		t.Errorf("secret data (-want +got):\n%s", diff)
	}
	pod, err := h.cs.CoreV1().Pods("notebooks").Get(ctx, PodName(spec.User, spec.Server), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if refs := pod.Spec.Containers[0].EnvFrom; len(refs) != 1 || refs[0].SecretRef.Name != secretName {
		t.Errorf("pod envFrom = %+v, want the secret %s", refs, secretName)
	}
	// A retry for the same spawn leaves the Secret its pod started with.
	if err := h.client.Create(ctx, spec, map[string]string{"JUPYTERHUB_API_TOKEN": "tok-retry"}); err != nil {
		t.Fatal(err)
	}
	if sec, err := h.cs.CoreV1().Secrets("notebooks").Get(ctx, secretName, metav1.GetOptions{}); err != nil || string(sec.Data["JUPYTERHUB_API_TOKEN"]) != "tok-1" {
		t.Errorf("secret after a retry of the spawn: %v (%v), want its first tok-1", sec.Data, err)
	}

	// A later spawn after the pod is gone takes over the old Secret.
	if err := h.client.Delete(ctx, spec.User, spec.Server, spec.SpawnID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cs.CoreV1().Secrets("notebooks").Get(ctx, secretName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("secret after Delete: %v", err)
	}
	left := Secret(testConfig(), spec, map[string]string{"OLD": "x"}) // a leftover of the first spawn
	if _, err := h.cs.CoreV1().Secrets("notebooks").Create(ctx, left, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	next := spec
	next.SpawnID = "second-spawn"
	if err := h.client.Create(ctx, next, map[string]string{"JUPYTERHUB_API_TOKEN": "tok-2"}); err != nil {
		t.Fatal(err)
	}
	sec, err = h.cs.CoreV1().Secrets("notebooks").Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{"data": sec.Data, "spawn": sec.Labels[v1.LabelSpawnID]}
	want := map[string]any{"data": map[string][]byte{"JUPYTERHUB_API_TOKEN": []byte("tok-2")}, "spawn": "second-spawn"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("secret after the second spawn (-want +got):\n%s", diff)
	}

	if err := h.client.Create(ctx, next, map[string]string{"LD_PRELOAD": "/evil.so"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Create with a reserved secret env name: err = %v, want ErrInvalid", err)
	}
}

func TestDeleteOtherSpawnIgnored(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	if err := h.client.Create(ctx, spec, map[string]string{"T": "1"}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.Delete(ctx, spec.User, spec.Server, "an-old-spawn"); err != nil {
		t.Fatalf("Delete of an old spawn: %v", err)
	}
	if _, err := h.cs.CoreV1().Pods("notebooks").Get(ctx, PodName(spec.User, spec.Server), metav1.GetOptions{}); err != nil {
		t.Errorf("the current spawn's pod was deleted: %v", err)
	}
	if _, err := h.cs.CoreV1().Secrets("notebooks").Get(ctx, SecretName(spec.User, spec.Server), metav1.GetOptions{}); err != nil {
		t.Errorf("the current spawn's secret was deleted: %v", err)
	}
	if err := h.client.Delete(ctx, "nobody", "", ""); err != nil {
		t.Errorf("Delete of nothing: %v", err)
	}
}

// TestDeleteChecksUID makes the first delete fail its UID precondition, as
// when a newer pod took the name between get and delete; Delete must look
// again and leave the newer spawn's pod alone.
func TestDeleteChecksUID(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	if err := h.client.Create(ctx, spec, nil); err != nil {
		t.Fatal(err)
	}
	name := PodName(spec.User, spec.Server)
	var preconditions []string
	h.cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		opts := a.(k8stesting.DeleteActionImpl).DeleteOptions
		if opts.Preconditions == nil || opts.Preconditions.UID == nil {
			preconditions = append(preconditions, "none")
			return false, nil, nil
		}
		preconditions = append(preconditions, string(*opts.Preconditions.UID))
		// Replace the pod by a newer spawn's pod, then fail like the API server.
		newer, err := Pod(testConfig(), func() Spec { s := spec; s.SpawnID = "newer"; return s }())
		if err != nil {
			return true, nil, err
		}
		newer.UID = "uid-newer"
		if err := h.cs.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, newer, "notebooks"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, name, errors.New("Precondition failed: UID in precondition"))
	})
	if err := h.client.Delete(ctx, spec.User, spec.Server, spec.SpawnID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if diff := cmp.Diff([]string{"uid-x"}, preconditions); diff != "" {
		t.Errorf("delete preconditions (-want +got):\n%s", diff)
	}
	got, err := h.cs.CoreV1().Pods("notebooks").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the newer pod is gone: %v", err)
	}
	if got.Annotations[v1.AnnotationSpawnID] != "newer" {
		t.Errorf("pod spawn = %q, want newer", got.Annotations[v1.AnnotationSpawnID])
	}
}

// TestDispatchDropsLateEvents feeds the dispatcher a stale event after a
// pod was reported gone, and duplicates, and checks what subscribers see.
func TestDispatchDropsLateEvents(t *testing.T) {
	c := New(fake.NewClientset(), testConfig(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	got := make(chan PodEvent, 10)
	ctx, cancel := context.WithCancel(t.Context())
	c.Subscribe(ctx, func(ev PodEvent) { got <- ev })
	running := PodEvent{Pod: "nb-a", SpawnID: "s1", Phase: PhaseRunning}
	gone := PodEvent{Pod: "nb-a", SpawnID: "s1", Phase: PhaseGone}
	next := PodEvent{Pod: "nb-a", SpawnID: "s2", Phase: PhasePending}
	c.queue.push("nb-a/s1", running)
	c.queue.push("nb-b/s1", PodEvent{Pod: "nb-b"}) // keeps nb-a's first pop separate from its second push
	var wg sync.WaitGroup
	wg.Go(func() { c.dispatch(ctx) })
	var seen []PodEvent
	seen = append(seen, <-got, <-got)
	c.queue.push("nb-a/s1", running) // duplicate: dropped
	c.queue.push("nb-a/s1", gone)    // coalesces with the duplicate
	seen = append(seen, <-got)
	c.queue.push("nb-a/s1", running) // late resync read: dropped
	c.queue.push("nb-a/s2", next)
	seen = append(seen, <-got)
	cancel()
	wg.Wait()
	close(got)
	for ev := range got {
		seen = append(seen, ev)
	}
	want := []PodEvent{running, {Pod: "nb-b"}, gone, next}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("delivered events (-want +got):\n%s", diff)
	}
}

func TestDeletePodGarbled(t *testing.T) {
	garbled, err := Pod(testConfig(), testSpec())
	if err != nil {
		t.Fatal(err)
	}
	garbled.Name = "nb-garbled"
	delete(garbled.Annotations, v1.AnnotationUser)
	h := startClient(t, garbled)
	pods, err := h.client.Pods()
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[0].Name != "nb-garbled" || pods[0].Err == nil || pods[0].SpawnID != testSpec().SpawnID {
		t.Fatalf("Pods = %+v, want the garbled pod with Err and its spawn id", pods)
	}
	if err := h.client.DeletePod(t.Context(), "nb-garbled", "another-spawn"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cs.CoreV1().Pods("notebooks").Get(t.Context(), "nb-garbled", metav1.GetOptions{}); err != nil {
		t.Errorf("DeletePod of another spawn deleted the pod: %v", err)
	}
	if err := h.client.DeletePod(t.Context(), "nb-garbled", pods[0].SpawnID); err != nil {
		t.Fatal(err)
	}
	ev := h.waitEvent(t, "gone", phaseIs(PhaseGone))
	if ev.Pod != "nb-garbled" {
		t.Errorf("gone event for %q", ev.Pod)
	}
}

func TestTransientAnswersAreRetriedUntilTheyPass(t *testing.T) {
	h := startClient(t)
	refusals := []error{
		apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "nb-alice",
			errors.New(`User "gpubroker" cannot create resource "pods" in API group "" in the namespace "nb"`)),
		apierrors.NewTooManyRequests("slow down", 0),
		apierrors.NewServiceUnavailable("starting"),
	}
	var mu sync.Mutex
	tries := 0
	h.cs.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		tries++
		if tries <= len(refusals) {
			return true, nil, refusals[tries-1]
		}
		return false, nil, nil
	})
	if err := h.client.Create(t.Context(), testSpec(), nil); err != nil {
		t.Fatalf("Create after transient refusals: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if tries != len(refusals)+1 {
		t.Errorf("tries = %d, want %d", tries, len(refusals)+1)
	}
}

// TestListPodsReadsTheAPIServer: ListPods needs no synced cache (it asks
// the API server) and reads each managed pod as Pods does; a pod that is
// not gpubroker's is left out.
func TestListPodsReadsTheAPIServer(t *testing.T) {
	spec := testSpec()
	pod, err := Pod(testConfig(), spec)
	if err != nil {
		t.Fatal(err)
	}
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "notebooks"}}
	cs := fake.NewClientset(pod, foreign)
	c := New(cs, testConfig(), slog.New(slog.NewTextHandler(io.Discard, nil))) // never Run: no cache
	got, err := c.ListPods(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != PodName(spec.User, spec.Server) || got[0].SpawnID != spec.SpawnID ||
		got[0].Err != nil || got[0].Slice != spec.Slice {
		t.Errorf("ListPods = %+v, want the one managed pod of spawn %s with slice %+v", got, spec.SpawnID, spec.Slice)
	}
}

// TestPutSecretThenCreatePod: the two halves of Create on their own. The
// Secret needs only the spawn's identity (no GPU yet), a reserved name
// writes nothing, and the pod created after it reads it.
func TestPutSecretThenCreatePod(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	secretName := SecretName(spec.User, spec.Server)
	if err := h.client.PutSecret(ctx, Spec{User: spec.User, Server: spec.Server, SpawnID: spec.SpawnID}, map[string]string{"LD_PRELOAD": "/evil.so"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutSecret with a reserved name: %v, want ErrInvalid", err)
	}
	if _, err := h.cs.CoreV1().Secrets("notebooks").Get(ctx, secretName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Secret after a refused PutSecret: %v, want none", err)
	}
	if err := h.client.PutSecret(ctx, Spec{User: spec.User, Server: spec.Server, SpawnID: spec.SpawnID}, map[string]string{"T": "1"}); err != nil {
		t.Fatalf("PutSecret with only the spawn's identity: %v", err)
	}
	sec, err := h.cs.CoreV1().Secrets("notebooks").Get(ctx, secretName, metav1.GetOptions{})
	if err != nil || sec.Annotations[v1.AnnotationSpawnID] != spec.SpawnID || string(sec.Data["T"]) != "1" {
		t.Fatalf("Secret %v %v (err %v), want spawn %s's with T=1", sec.GetAnnotations(), sec.Data, err, spec.SpawnID)
	}
	spec.SecretEnv = true
	if err := h.client.CreatePod(ctx, spec); err != nil {
		t.Fatal(err)
	}
	pod, err := h.cs.CoreV1().Pods("notebooks").Get(ctx, PodName(spec.User, spec.Server), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if refs := pod.Spec.Containers[0].EnvFrom; len(refs) != 1 || refs[0].SecretRef.Name != secretName {
		t.Errorf("pod envFrom = %+v, want the secret %s", refs, secretName)
	}
	if err := h.client.CreatePod(ctx, spec); err != nil {
		t.Errorf("CreatePod again for the same spawn: %v, want success", err)
	}

	// Create checks the pod's spec before it writes the Secret.
	bad := testSpec()
	bad.Server, bad.SpawnID, bad.GPU.Node = "other", "spawn-bad", ""
	if err := h.client.Create(ctx, bad, map[string]string{"T": "1"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Create without a node: %v, want ErrInvalid", err)
	}
	if _, err := h.cs.CoreV1().Secrets("notebooks").Get(ctx, SecretName(bad.User, bad.Server), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Secret after a Create with a bad spec: %v, want none", err)
	}
}
