package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestHarnessRunsPinnedPod checks the rig the other tests stand on: a pod
// pinned to a kwok node, with the GPU runtime class and hostPath mounts,
// reaches Running with a pod IP, and deleting it removes it.
func TestHarnessRunsPinnedPod(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	ctx := t.Context()
	ns := newNamespace(t, c)
	node := newNodes(t, c, 1)[0]

	rc := harness.RuntimeClassName
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:         node,
			RuntimeClassName: &rc,
			Containers: []corev1.Container{{
				Name:         "c",
				Image:        "example.invalid/notebook:1",
				VolumeMounts: []corev1.VolumeMount{{Name: "q", MountPath: "/var/run/q", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "q", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/gpubroker/slices/x"},
			}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	err := harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "probe", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", string(p.Status.Phase) + " ip=" + p.Status.PodIP, nil
	})
	if err != nil {
		t.Fatalf("pod not running: %v", err)
	}
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "probe", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, "probe", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, "still there", err
	})
	if err != nil {
		t.Fatalf("pod not deleted: %v", err)
	}
}
