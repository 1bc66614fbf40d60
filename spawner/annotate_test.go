package spawner

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// TestAnnotateSlice resizes the slice a pod records and expects the new
// figures in the pod and in Pods() (the informer cache the reconciler
// rebuilds allocations from), written with the FieldManager.
func TestAnnotateSlice(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	if err := h.client.Create(ctx, spec, nil); err != nil {
		t.Fatal(err)
	}
	var managers []string
	h.cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		managers = append(managers, a.(k8stesting.PatchActionImpl).PatchOptions.FieldManager)
		return false, nil, nil
	})
	want := v1.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 60}
	if err := h.client.AnnotateSlice(ctx, spec.User, spec.Server, spec.SpawnID, want); err != nil {
		t.Fatalf("AnnotateSlice: %v", err)
	}
	pod, err := h.cs.CoreV1().Pods("notebooks").Get(ctx, PodName(spec.User, spec.Server), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, k := range []string{v1.AnnotationMemoryMiB, v1.AnnotationComputePercent, v1.AnnotationComputeLimitPercent, v1.AnnotationGPUUUID} {
		got[k] = pod.Annotations[k]
	}
	wantAnn := map[string]string{v1.AnnotationMemoryMiB: "16384", v1.AnnotationComputePercent: "30",
		v1.AnnotationComputeLimitPercent: "60", v1.AnnotationGPUUUID: spec.GPU.UUID}
	if diff := cmp.Diff(wantAnn, got); diff != "" {
		t.Errorf("annotations (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{FieldManager}, managers); diff != "" {
		t.Errorf("patch field managers (-want +got):\n%s", diff)
	}
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	poll := time.NewTicker(5 * time.Millisecond)
	defer poll.Stop()
	for {
		pods, err := h.client.Pods()
		if err == nil && len(pods) == 1 && pods[0].Slice == want {
			break
		}
		select {
		case <-deadline.C:
			t.Fatalf("Pods() = %+v, %v; want the new slice within 10s", pods, err)
		case <-poll.C:
		}
	}
}

func TestAnnotateSliceRefusals(t *testing.T) {
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: PodName("bob", ""), Namespace: "notebooks"}}
	h := startClient(t, foreign)
	ctx := t.Context()
	spec := testSpec()
	if err := h.client.Create(ctx, spec, nil); err != nil {
		t.Fatal(err)
	}
	s := v1.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10}
	tests := []struct {
		name, user, spawn string
		want              error
	}{
		{"another spawn's pod is left alone", spec.User, "an-old-spawn", ErrPodExists},
		{"a pod that is gone", "carol", "x", ErrPodGone},
		{"a pod gpubroker does not manage", "bob", "x", ErrNotOwned},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.client.AnnotateSlice(ctx, tc.user, "", tc.spawn, s); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
	pod, err := h.cs.CoreV1().Pods("notebooks").Get(ctx, PodName(spec.User, spec.Server), metav1.GetOptions{})
	if err != nil || pod.Annotations[v1.AnnotationMemoryMiB] != "8192" {
		t.Errorf("the current pod's memory annotation = %q (err %v), want 8192 unchanged", pod.Annotations[v1.AnnotationMemoryMiB], err)
	}
}
