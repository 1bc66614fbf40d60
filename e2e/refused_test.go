package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestPodRefusedByAPIServerFailsFast puts a ResourceQuota of zero pods on
// the namespace, so the real API server refuses the notebook pod. The spawn
// must fail fast (well before the start timeout) with a readable message,
// either as a failed server or as a 4xx answer to the create, and leave no
// pod behind and no slice allocated (ARCHITECTURE.md, server lifecycle).
func TestPodRefusedByAPIServerFailsFast(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := t.Context()
	rq := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-pods", Namespace: e.ns},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
	}
	created, err := e.cluster.Client.CoreV1().ResourceQuotas(e.ns).Create(ctx, rq, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create resource quota: %v", err)
	}
	// No controller manager runs: fill in the status its quota controller
	// would, then wait until the API server's admission enforces it (a dry
	// run pod create is refused).
	created.Status = corev1.ResourceQuotaStatus{Hard: rq.Spec.Hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
	if _, err := e.cluster.Client.CoreV1().ResourceQuotas(e.ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("resource quota status: %v", err)
	}
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: e.ns},
		Spec:       corev1.PodSpec{NodeName: e.nodes[0], Containers: []corev1.Container{{Name: "c", Image: "example.invalid/x:1"}}},
	}
	err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		_, err := e.cluster.Client.CoreV1().Pods(e.ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err), fmt.Sprintf("dry-run pod create: %v", err), nil
	})
	if err != nil {
		t.Fatalf("resource quota not enforced: %v", err)
	}
	frank := e.client("frank")
	_, _, err = frank.CreateServer(ctx, "frank", "nb", "k-1", v1.CreateServerRequest{Profile: "small"})
	var ae *harness.APIError
	switch {
	case err == nil:
		// Accepted: the spawn must then fail fast with a readable message.
		s, err := frank.WaitServer(ctx, "frank", "nb", v1.StateFailed, 30*time.Second)
		if err != nil {
			t.Fatalf("spawn refused by the API server did not fail fast: %v", err)
		}
		t.Logf("spawn failed: %s", s.Message)
		if !readable(s.Message) {
			t.Errorf("failure message %q is not readable", s.Message)
		}
	case errors.As(err, &ae) && ae.Status >= 400 && ae.Status < 500:
		// Refused at once: a client error with a readable reason is fine too.
		t.Logf("create refused: %v", ae)
		if !readable(ae.Body.Message) {
			t.Errorf("refusal message %q is not readable", ae.Body.Message)
		}
	default:
		t.Errorf("create while the cluster refuses pods: %v; want 201 and then failed, or a 4xx with a readable reason", err)
	}
	err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		pods, err := e.pods(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		use := e.allocated(t)
		return len(pods) == 0 && cmp.Equal(map[string]gpuUse{}, use, cmp.AllowUnexported(gpuUse{})),
			fmt.Sprintf("%d pods, allocated %+v", len(pods), use), nil
	})
	if err != nil {
		t.Errorf("failed spawn left state behind: %v", err)
	}
	if got, err := frank.GetServer(ctx, "frank", "nb"); err == nil {
		t.Logf("server afterwards: %s: %s", got.State, got.Message)
	}
}
