package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestAPodThatEndsWhileRedisLostItsServerLeavesTheServer: Redis loses its
// data while no broker runs, then a running server's pod ends behind the
// broker's back (deleted through the API, or its node deleted with its
// pods, as Kubernetes' pod garbage collector does), and only then does a
// broker start and make its rebuild pass. Before the pods carried
// gpubroker's finalizer nothing was left to rebuild the server from: it
// was lost. Now the finalizer keeps the ended pod until the pass has
// rebuilt the record as stopped, with a message that says why; then the
// pod goes, and no slice is left allocated.
func TestAPodThatEndsWhileRedisLostItsServerLeavesTheServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(ctx context.Context, e *env, pod *corev1.Pod) error
	}{
		{"pod deleted", func(ctx context.Context, e *env, pod *corev1.Pod) error {
			// As kubectl delete does: the pod's own grace period; kwok
			// (the kubelet) then makes the final delete.
			return e.cluster.Client.CoreV1().Pods(e.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{})
		}},
		{"node deleted", func(ctx context.Context, e *env, pod *corev1.Pod) error {
			if err := e.cluster.DeleteNodes(ctx, pod.Spec.NodeName); err != nil {
				return err
			}
			zero := int64(0) // the pod garbage collector's deletion
			return e.cluster.Client.CoreV1().Pods(e.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
			pods := e.cluster.Client.CoreV1().Pods(e.ns)
			pod, err := pods.Get(ctx, s.Pod, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("get pod: %v", err)
			}
			if !slices.Contains(pod.Finalizers, v1.FinalizerServerRecord) {
				t.Fatalf("pod %s has finalizers %v, want %s", pod.Name, pod.Finalizers, v1.FinalizerServerRecord)
			}

			if err := e.broker.Stop(); err != nil {
				t.Fatalf("stop broker: %v", err)
			}
			if err := e.redis.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatalf("FLUSHALL: %v", err)
			}
			if err := tc.end(ctx, e, pod); err != nil {
				t.Fatalf("end the pod: %v", err)
			}
			// The pod has ended (the final delete, grace 0, is in) and
			// stays only for the finalizer: no broker runs to release it.
			err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
				p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					return false, "", fmt.Errorf("the ended pod went without the broker: %w", err)
				}
				g := p.DeletionGracePeriodSeconds
				ended := p.DeletionTimestamp != nil && g != nil && *g == 0
				return ended, fmt.Sprintf("deletion at %v, grace %v, finalizers %v", p.DeletionTimestamp, g, p.Finalizers), nil
			})
			if err != nil {
				t.Fatalf("pod %s did not end held by its finalizer: %v", pod.Name, err)
			}

			if err := e.broker.Start(ctx); err != nil {
				t.Fatalf("start broker: %v", err)
			}
			e.registerGPUs() // as the agents' heartbeats would
			var got v1.Server
			err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
				got, err = erin.GetServer(ctx, "erin", "nb")
				if err != nil {
					return false, err.Error(), nil
				}
				_, perr := pods.Get(ctx, pod.Name, metav1.GetOptions{})
				use := e.allocated(t)
				done := got.State == v1.StateStopped && apierrors.IsNotFound(perr) && cmp.Equal(map[string]gpuUse{}, use, cmp.AllowUnexported(gpuUse{}))
				return done, fmt.Sprintf("server %s (%q), pod get: %v, allocated %+v", got.State, got.Message, perr, use), nil
			})
			if err != nil {
				t.Fatalf("the server was not rebuilt from its ended pod, or the pod stayed: %v", err)
			}
			if got.SpawnID != s.SpawnID || !strings.Contains(got.Message, "lost") || !readable(got.Message) {
				t.Errorf("rebuilt server: spawn %s (want %s), message %q: want the spawn that ran and a message that says its record was lost", got.SpawnID, s.SpawnID, got.Message)
			}
			t.Logf("after the rebuild: %s: %s", got.State, got.Message)
		})
	}
}
