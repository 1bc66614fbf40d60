package spawner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// AnnotateSlice records slice in the annotations of the notebook pod of
// user/server (ARCHITECTURE.md invariant 2: pods are the durable record of
// allocations), after a resize. It writes only a pod labelled
// managed-by=gpubroker (else ErrNotOwned) whose spawn id is spawnID (else
// an error wrapping ErrPodExists), with a merge patch that carries the UID it
// checked as a precondition, so a newer pod that took the name is never changed; a conflict
// is retried. A pod that is gone wraps ErrPodGone. The write uses
// FieldManager. It is safe for concurrent use.
func (c *Client) AnnotateSlice(ctx context.Context, user, server, spawnID string, slice v1.Slice) error {
	for range maxConflictRetries {
		// Unconditional, so a try that the API server applied but did not
		// answer is harmless to repeat.
		err := c.retry(ctx, "annotate pod "+PodName(user, server), func(ctx context.Context) error {
			return c.AnnotateSliceAt(ctx, user, server, spawnID, "", slice)
		})
		if !errors.Is(err, ErrPodChanged) {
			return err
		}
	}
	return fmt.Errorf("annotate pod %s: too many concurrent changes", PodName(user, server))
}

// SliceVersion returns the resourceVersion of the notebook pod of
// user/server, checked as AnnotateSlice checks it (managed, of spawnID),
// for a later AnnotateSliceAt, and the slice its annotations record at that
// version. A pod whose annotations cannot be read (ParsePod's error) is an
// error: its slice is unknown.
func (c *Client) SliceVersion(ctx context.Context, user, server, spawnID string) (string, v1.Slice, error) {
	var pod *corev1.Pod
	err := c.retry(ctx, "get pod "+PodName(user, server), func(ctx context.Context) error {
		var err error
		pod, err = c.ownPod(ctx, PodName(user, server), spawnID)
		return err
	})
	if err != nil {
		return "", v1.Slice{}, err
	}
	m, err := ParsePod(pod)
	if err != nil {
		return "", v1.Slice{}, err
	}
	return pod.ResourceVersion, m.Slice, nil
}

// AnnotateSliceAt is AnnotateSlice once, on the condition that the pod is
// still at resourceVersion ("" = any): the merge patch carries the version
// (and the UID) as preconditions, and a pod that changed in between gives
// an error wrapping ErrPodChanged, nothing written.
func (c *Client) AnnotateSliceAt(ctx context.Context, user, server, spawnID, resourceVersion string, slice v1.Slice) error {
	name := PodName(user, server)
	pod, err := c.ownPod(ctx, name, spawnID)
	if err != nil {
		return err
	}
	if resourceVersion != "" && pod.ResourceVersion != resourceVersion {
		return fmt.Errorf("annotate pod %s: %w", name, ErrPodChanged)
	}
	meta := map[string]any{
		"uid": string(pod.UID),
		"annotations": map[string]string{
			v1.AnnotationMemoryMiB:           strconv.FormatInt(slice.MemoryMiB, 10),
			v1.AnnotationComputePercent:      strconv.Itoa(slice.ComputePercent),
			v1.AnnotationComputeLimitPercent: strconv.Itoa(slice.ComputeLimitPercent),
		},
	}
	if resourceVersion != "" {
		meta["resourceVersion"] = resourceVersion
	}
	if _, err := c.patchPod(ctx, name, meta); err != nil {
		return err
	}
	c.log.InfoContext(ctx, "slice annotated", "pod", name, "slice_id", spawnID, "mem_mib", slice.MemoryMiB, "sm_percent", slice.ComputePercent)
	return nil
}

// FenceSlice marks the pod name of spawnID with AnnotationSliceRestored
// (UID precondition) and returns the pod as the API server answered that
// write: its slice is then the one any resize recorded before, and any
// resize that read the pod earlier fails its AnnotateSliceAt. The
// reconciler calls it before it restores a pod's slice into Redis.
func (c *Client) FenceSlice(ctx context.Context, name, spawnID string) (ManagedPod, error) {
	pod, err := c.ownPod(ctx, name, spawnID)
	if err != nil {
		return ManagedPod{}, err
	}
	out, err := c.patchPod(ctx, name, map[string]any{
		"uid":         string(pod.UID),
		"annotations": map[string]string{v1.AnnotationSliceRestored: time.Now().UTC().Format(time.RFC3339Nano)},
	})
	if err != nil {
		return ManagedPod{}, err
	}
	mp, err := ParsePod(out)
	if err != nil {
		return ManagedPod{}, fmt.Errorf("fence pod %s: %w", name, err)
	}
	return mp, nil
}

// ownPod gets pod name and checks it is gpubroker's and of spawnID.
func (c *Client) ownPod(ctx context.Context, name, spawnID string) (*corev1.Pod, error) {
	pod, err := c.cs.CoreV1().Pods(c.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("pod %s: %w", name, ErrPodGone)
	case err != nil:
		return nil, fmt.Errorf("pod %s: get: %w", name, err)
	case pod.Labels[v1.LabelManagedBy] != v1.ManagedByValue:
		return nil, fmt.Errorf("pod %s: %w", name, ErrNotOwned)
	case spawnOf(pod) != spawnID:
		return nil, fmt.Errorf("pod %s: %w (spawn %s, not %s)", name, ErrPodExists, spawnOf(pod), spawnID)
	}
	return pod, nil
}

// patchPod merge-patches the metadata of pod name; a failed precondition
// (UID or resourceVersion) wraps ErrPodChanged.
func (c *Client) patchPod(ctx context.Context, name string, meta map[string]any) (*corev1.Pod, error) {
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return nil, fmt.Errorf("patch pod %s: encode: %w", name, err)
	}
	out, err := c.cs.CoreV1().Pods(c.cfg.Namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
	switch {
	case err == nil:
		return out, nil
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("patch pod %s: %w", name, ErrPodGone)
	case apierrors.IsConflict(err):
		return nil, fmt.Errorf("patch pod %s: %w: %w", name, ErrPodChanged, err)
	default:
		return nil, fmt.Errorf("patch pod %s: %w", name, err)
	}
}

// ErrPodChanged is returned by AnnotateSliceAt when the pod is no longer at
// the version asked for (or was replaced).
var ErrPodChanged = errors.New("spawner: pod changed")

// ErrPodGone is returned by AnnotateSlice when the server has no pod.
var ErrPodGone = errors.New("spawner: pod is gone")
