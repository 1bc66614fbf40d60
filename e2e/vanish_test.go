package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestPodDeletedBehindTheBrokersBack deletes a running server's pod through
// the Kubernetes API, not the broker. The server must stop being reported as
// running, its slice must be freed, and deleting the server afterwards must
// still be accepted (stop is idempotent on a vanished pod).
func TestPodDeletedBehindTheBrokersBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := t.Context()
	erin := e.client("erin")
	if _, _, err := erin.CreateServer(ctx, "erin", "nb", "k-1", v1.CreateServerRequest{Profile: "small"}); err != nil {
		t.Fatalf("create: %v", err)
	}
	s, err := erin.WaitServer(ctx, "erin", "nb", v1.StateRunning, 60*time.Second)
	if err != nil {
		t.Fatalf("%v", err)
	}
	zero := int64(0)
	if err := e.cluster.Client.CoreV1().Pods(e.ns).Delete(ctx, s.Pod, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("delete pod %s: %v", s.Pod, err)
	}

	err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		got, err := erin.GetServer(ctx, "erin", "nb")
		if err != nil {
			return false, err.Error(), nil
		}
		use := e.allocated(t)
		done := got.State != v1.StateRunning && cmp.Equal(map[string]gpuUse{}, use, cmp.AllowUnexported(gpuUse{}))
		return done, fmt.Sprintf("server %s (%s), allocated %+v", got.State, got.Message, use), nil
	})
	if err != nil {
		t.Fatalf("broker did not notice the vanished pod: %v", err)
	}
	if got, err := erin.GetServer(ctx, "erin", "nb"); err == nil {
		t.Logf("after the pod vanished: %s: %s", got.State, got.Message)
	}
	if status, err := erin.DeleteServer(ctx, "erin", "nb"); err != nil || status != http.StatusAccepted {
		t.Fatalf("delete after the pod vanished: status %d, %v; want 202", status, err)
	}
	if _, err := erin.WaitServer(ctx, "erin", "nb", v1.StateStopped, 30*time.Second); err != nil {
		t.Errorf("%v", err)
	}
}
