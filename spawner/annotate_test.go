package spawner

import (
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// TestFenceSliceStopsAnOlderAnnotate is the resize fence: a resize reads the
// pod's version, the reconciler fences the pod (as before restoring its
// slice after Redis lost its data), and the resize's conditional write is
// then refused with ErrPodChanged, leaving the slice the fence returned.
func TestFenceSliceStopsAnOlderAnnotate(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	if err := h.client.Create(ctx, spec, nil); err != nil {
		t.Fatal(err)
	}
	// The fake clientset keeps no resourceVersions; these reactors give the
	// pods the API server's: a version that every patch moves on, checked
	// when a patch names one.
	var mu sync.Mutex
	version := 1
	h.cs.PrependReactor("get", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := h.cs.Tracker().Get(a.GetResource(), a.GetNamespace(), a.(k8stesting.GetAction).GetName())
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		mu.Lock()
		pod.ResourceVersion = strconv.Itoa(version)
		mu.Unlock()
		return true, pod, nil
	})
	h.cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var body struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(a.(k8stesting.PatchActionImpl).Patch, &body); err != nil {
			return true, nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if rv := body.Metadata.ResourceVersion; rv != "" && rv != strconv.Itoa(version) {
			return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), "pod", errors.New("the object has been modified"))
		}
		version++
		return false, nil, nil // the tracker applies it
	})
	rv, recorded, err := h.client.SliceVersion(ctx, spec.User, spec.Server, spec.SpawnID)
	if err != nil {
		t.Fatalf("SliceVersion: %v", err)
	}
	if recorded != spec.Slice {
		t.Errorf("SliceVersion's slice = %+v, want the pod's %+v", recorded, spec.Slice)
	}
	fenced, err := h.client.FenceSlice(ctx, PodName(spec.User, spec.Server), spec.SpawnID)
	if err != nil {
		t.Fatalf("FenceSlice: %v", err)
	}
	if fenced.Slice != spec.Slice || fenced.SpawnID != spec.SpawnID {
		t.Errorf("FenceSlice returned slice %+v of spawn %s, want %+v of %s", fenced.Slice, fenced.SpawnID, spec.Slice, spec.SpawnID)
	}
	grown := spec.Slice
	grown.ComputePercent += 10
	grown.ComputeLimitPercent = max(grown.ComputeLimitPercent, grown.ComputePercent)
	err = h.client.AnnotateSliceAt(ctx, spec.User, spec.Server, spec.SpawnID, rv, grown)
	if !errors.Is(err, ErrPodChanged) {
		t.Fatalf("AnnotateSliceAt after a fence = %v, want ErrPodChanged", err)
	}
	pod, err := h.cs.CoreV1().Pods("notebooks").Get(ctx, PodName(spec.User, spec.Server), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Annotations[v1.AnnotationComputePercent]; got != strconv.Itoa(spec.Slice.ComputePercent) {
		t.Errorf("compute annotation after the refused write = %s, want %d", got, spec.Slice.ComputePercent)
	}
	if pod.Annotations[v1.AnnotationSliceRestored] == "" {
		t.Errorf("fenced pod has no %s annotation", v1.AnnotationSliceRestored)
	}
	// With the current version the write goes through.
	rv, _, err = h.client.SliceVersion(ctx, spec.User, spec.Server, spec.SpawnID)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.client.AnnotateSliceAt(ctx, spec.User, spec.Server, spec.SpawnID, rv, grown); err != nil {
		t.Fatalf("AnnotateSliceAt at the current version: %v", err)
	}
	if _, recorded, err = h.client.SliceVersion(ctx, spec.User, spec.Server, spec.SpawnID); err != nil || recorded != grown {
		t.Errorf("SliceVersion after the write = %+v, %v; want %+v", recorded, err, grown)
	}
}
