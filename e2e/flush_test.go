package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestRedisFlushRebuildsFromPods flushes the test's redis-server while three
// servers run, re-registers the GPUs (as the agents' heartbeats would) and
// checks that after the next reconcile the allocations equal the pods'
// annotations, no running pod was deleted, and new placements fill exactly
// the remaining room without overcommitting.
func TestRedisFlushRebuildsFromPods(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{nodes: 1, gpusPerNode: 2}) // room for 6 medium slices
	ctx := t.Context()

	before := []struct{ user, name string }{{"alice", "nb0"}, {"alice", "nb1"}, {"bob", "nb0"}}
	for _, s := range before {
		if _, _, err := e.client(s.user).CreateServer(ctx, s.user, s.name, "k-"+s.name, v1.CreateServerRequest{Profile: "medium"}); err != nil {
			t.Fatalf("create %s/%s: %v", s.user, s.name, err)
		}
	}
	for _, s := range before {
		if _, err := e.client(s.user).WaitServer(ctx, s.user, s.name, v1.StateRunning, 60*time.Second); err != nil {
			t.Fatalf("%v", err)
		}
	}
	podsBefore, err := e.pods(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	usedBefore := e.useFromPods(t, podsBefore)

	if err := e.redis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	e.registerGPUs()

	err = harness.Poll(ctx, 250*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		got := e.allocated(t)
		return cmp.Equal(usedBefore, got, cmp.AllowUnexported(gpuUse{})), fmt.Sprintf("allocated %+v, pods hold %+v", got, usedBefore), nil
	})
	if err != nil {
		t.Fatalf("allocations not rebuilt from pods: %v", err)
	}
	podsAfter, err := e.pods(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if diff := cmp.Diff(podNames(podsBefore), podNames(podsAfter)); diff != "" {
		t.Errorf("pods changed across the flush (-before +after):\n%s", diff)
	}

	// Three more medium slices fit; the fourth must be refused.
	after := []struct{ user, name string }{{"carol", "nb0"}, {"carol", "nb1"}, {"dave", "nb0"}, {"dave", "nb1"}}
	var won []int
	for i, s := range after {
		// Placement reopens once the rebuild fence has passed
		// (fleet.RebuildFence): until then a create is a 503 to retry.
		var err error
		retryUntilAnswered(t, "create "+s.user+"/"+s.name, func() (int, error) {
			var status int
			_, status, err = e.client(s.user).CreateServer(ctx, s.user, s.name, "k-"+s.name, v1.CreateServerRequest{Profile: "medium"})
			return status, err
		})
		var ae *harness.APIError
		switch {
		case err == nil:
			won = append(won, i)
		case errors.As(err, &ae) && ae.Status == http.StatusConflict && ae.Body.Code == v1.CodeNoCapacity:
			if !readable(ae.Body.Message) {
				t.Errorf("no-capacity message %q is not readable", ae.Body.Message)
			}
		default:
			t.Errorf("create %s/%s: %v", s.user, s.name, err)
		}
	}
	if len(won) != 3 {
		t.Errorf("%d of 4 new medium servers placed, want 3 (6 fit, 3 were running)", len(won))
	}
	for _, i := range won {
		s := after[i]
		if _, err := e.client(s.user).WaitServer(ctx, s.user, s.name, v1.StateRunning, 60*time.Second); err != nil {
			t.Errorf("%v", err)
		}
	}
	pods, err := e.pods(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	use := e.useFromPods(t, pods)
	e.checkNotOvercommitted(t, use)
	if diff := cmp.Diff(use, e.allocated(t), cmp.AllowUnexported(gpuUse{})); diff != "" {
		t.Errorf("admin GPU view differs from the pods (-pods +admin):\n%s", diff)
	}
	for _, p := range podNames(podsBefore) {
		if !slices.Contains(podNames(pods), p) {
			t.Errorf("pod %s, running before the flush, is gone", p)
		}
	}
}

func podNames(pods []corev1.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}
