package spawner

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// ReleasePod removes v1.FinalizerServerRecord from the pod name of spawn
// spawnID ("" skips the spawn check) once its deletion has been asked
// for, so the API server can remove it; the caller has recorded how the
// server ended (or the pod belongs to no server). It is idempotent and
// safe when several replicas release the same pod: a pod that is gone,
// not gpubroker's, of another spawn, not being deleted (its finalizer
// stays until it is) or without the finalizer is left alone, and that is
// success.
//
// The write is a JSON patch that tests the pod's UID and the finalizer's
// index before it removes that index, so it never touches a newer pod that
// took the name, nor another controller's finalizer. A failed test (the
// API server answers 422, or 409) means the pod changed since it was read:
// it is read again from the API server and the patch retried, at most
// maxConflictRetries times. The first read is the informer cache's, so a
// release costs one request when nothing raced it (and a read when the
// cache says there is nothing to release: it may lag). Transient errors are
// retried (see Transient); other errors are the API server's.
func (c *Client) ReleasePod(ctx context.Context, name, spawnID string) error {
	pod := c.cachedPod(name)
	if pod != nil && releasable(pod, spawnID) < 0 {
		pod = nil // the cache may lag: what it says is not the last word
	}
	return c.retry(ctx, "release pod "+name, func(ctx context.Context) error {
		for range maxConflictRetries {
			if pod == nil {
				fresh, err := c.cs.CoreV1().Pods(c.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
				switch {
				case apierrors.IsNotFound(err):
					return nil
				case err != nil:
					return apiError("release pod: get", name, err)
				}
				pod = fresh
			}
			i := releasable(pod, spawnID)
			if i < 0 {
				return nil
			}
			err := c.removeFinalizer(ctx, pod, i)
			switch {
			case err == nil:
				c.log.InfoContext(ctx, "pod released", "pod", name, "slice_id", spawnOf(pod))
				return nil
			case apierrors.IsNotFound(err):
				return nil
			case apierrors.IsInvalid(err), apierrors.IsConflict(err):
				pod = nil // it changed since it was read: read it again
			default:
				return apiError("release pod", name, err)
			}
		}
		return fmt.Errorf("release pod %s: too many concurrent changes", name)
	})
}

// releasable returns the index of v1.FinalizerServerRecord in pod's
// finalizers if ReleasePod(pod.Name, spawnID) is to remove it, else -1.
func releasable(pod *corev1.Pod, spawnID string) int {
	if pod.DeletionTimestamp == nil || pod.Labels[v1.LabelManagedBy] != v1.ManagedByValue || spawnID != "" && spawnOf(pod) != spawnID {
		return -1
	}
	return slices.Index(pod.Finalizers, v1.FinalizerServerRecord)
}

// removeFinalizer sends the JSON patch that removes finalizer i of pod,
// on the condition that the pod still has pod's UID and finalizer i is
// still v1.FinalizerServerRecord.
func (c *Client) removeFinalizer(ctx context.Context, pod *corev1.Pod, i int) error {
	at := "/metadata/finalizers/" + strconv.Itoa(i)
	body, err := json.Marshal([]map[string]string{
		{"op": "test", "path": "/metadata/uid", "value": string(pod.UID)},
		{"op": "test", "path": at, "value": v1.FinalizerServerRecord},
		{"op": "remove", "path": at},
	})
	if err != nil {
		return fmt.Errorf("release pod %s: encode: %w", pod.Name, err)
	}
	_, err = c.cs.CoreV1().Pods(c.cfg.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
	return err
}

// cachedPod returns the informer cache's pod name (not a copy: read it
// only), or nil when the cache has none or has not synced.
func (c *Client) cachedPod(name string) *corev1.Pod {
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
	if lister == nil {
		return nil
	}
	pod, err := lister.Pods(c.cfg.Namespace).Get(name)
	if err != nil {
		return nil
	}
	return pod
}
