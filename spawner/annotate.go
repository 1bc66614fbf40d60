package spawner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

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
	api := c.cs.CoreV1().Pods(c.cfg.Namespace)
	name := PodName(user, server)
	for range maxConflictRetries {
		pod, err := api.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("annotate pod %s: %w", name, ErrPodGone)
		case err != nil:
			return fmt.Errorf("annotate pod %s: get: %w", name, err)
		case pod.Labels[v1.LabelManagedBy] != v1.ManagedByValue:
			return fmt.Errorf("annotate pod %s: %w", name, ErrNotOwned)
		case spawnOf(pod) != spawnID:
			return fmt.Errorf("annotate pod %s: %w (spawn %s, not %s)", name, ErrPodExists, spawnOf(pod), spawnID)
		}
		// The UID in a merge patch is a precondition: the API server refuses
		// (409) a patch whose UID is not the object's.
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid": string(pod.UID),
			"annotations": map[string]string{
				v1.AnnotationMemoryMiB:           strconv.FormatInt(slice.MemoryMiB, 10),
				v1.AnnotationComputePercent:      strconv.Itoa(slice.ComputePercent),
				v1.AnnotationComputeLimitPercent: strconv.Itoa(slice.ComputeLimitPercent),
			},
		}})
		if err != nil {
			return fmt.Errorf("annotate pod %s: encode patch: %w", name, err)
		}
		_, err = api.Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
		switch {
		case err == nil:
			c.log.InfoContext(ctx, "slice annotated", "pod", name, "slice_id", spawnID, "mem_mib", slice.MemoryMiB, "sm_percent", slice.ComputePercent)
			return nil
		case apierrors.IsNotFound(err):
			return fmt.Errorf("annotate pod %s: %w", name, ErrPodGone)
		case apierrors.IsConflict(err):
			continue // the UID changed under us: look again
		default:
			return fmt.Errorf("annotate pod %s: %w", name, err)
		}
	}
	return fmt.Errorf("annotate pod %s: too many concurrent changes", name)
}

// ErrPodGone is returned by AnnotateSlice when the server has no pod.
var ErrPodGone = errors.New("spawner: pod is gone")
