package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestConcurrentCreatesNeverOvercommit fires 50 creates at once from 10
// users on 4 GPUs at one broker; raceCreates says what must hold.
func TestConcurrentCreatesNeverOvercommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{nodes: 2, gpusPerNode: 2})
	raceCreates(t, e, func(string, int) string { return e.broker.URL })
}

// raceCreates fires 50 creates at once from 10 users on the env's 4 GPUs,
// create i of user u sent to the broker at baseURL(u, i). The medium
// profile fits 3 times per GPU (12 in all) and each user may hold 2
// servers (20 in all), so exactly 12 creates must win; every refusal must
// be a readable no_capacity or quota_exceeded answer; no GPU may be
// overcommitted, judged from the pods' annotations and from the admin GPU
// view; and every winner must reach running.
func raceCreates(t *testing.T, e *env, baseURL func(user string, i int) string) {
	t.Helper()
	ctx := t.Context()
	const (
		users       = 10
		perUser     = 5
		quotaPerUse = 2  // testProfiles' defaultUser servers
		capacity    = 12 // 4 GPUs × 3 medium slices
	)
	type result struct {
		user, name string
		status     int
		err        error
	}
	results := make([]result, 0, users*perUser)
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for u := range users {
		user := fmt.Sprintf("user%d", u)
		cl := e.client(user, "ml")
		for s := range perUser {
			name := fmt.Sprintf("nb%d", s)
			c := *cl
			c.BaseURL = baseURL(user, s)
			wg.Go(func() {
				<-start
				_, status, err := c.CreateServer(ctx, user, name, "k-"+user+"-"+name, v1.CreateServerRequest{Profile: "medium"})
				mu.Lock()
				results = append(results, result{user: user, name: name, status: status, err: err})
				mu.Unlock()
			})
		}
	}
	close(start)
	wg.Wait()

	won := map[string][]string{} // user → servers
	var nWon, nCapacity, nQuota int
	quotaRefused := map[string]bool{}
	for _, r := range results {
		if r.err == nil {
			if r.status != http.StatusCreated {
				t.Errorf("%s/%s: status %d, want 201", r.user, r.name, r.status)
			}
			won[r.user] = append(won[r.user], r.name)
			nWon++
			continue
		}
		var ae *harness.APIError
		switch {
		case !errors.As(r.err, &ae):
			t.Errorf("%s/%s: %v, want an API answer", r.user, r.name, r.err)
		case ae.Status == http.StatusConflict && ae.Body.Code == v1.CodeNoCapacity:
			nCapacity++
		case ae.Status == http.StatusForbidden && ae.Body.Code == v1.CodeQuotaExceeded:
			nQuota++
			quotaRefused[r.user] = true
		default:
			t.Errorf("%s/%s: %v, want 409 no_capacity or 403 quota_exceeded", r.user, r.name, ae)
		}
		if ae != nil && !readable(ae.Body.Message) {
			t.Errorf("%s/%s: message %q is not a readable sentence", r.user, r.name, ae.Body.Message)
		}
	}
	t.Logf("%d created, %d refused for capacity, %d refused for quota", nWon, nCapacity, nQuota)
	if nWon != capacity {
		t.Errorf("%d creates won, want exactly %d (min of capacity %d and quota %d×%d)", nWon, capacity, capacity, users, quotaPerUse)
	}
	for u, names := range won {
		if len(names) > quotaPerUse {
			t.Errorf("user %s holds %d servers %v, quota is %d", u, len(names), names, quotaPerUse)
		}
	}
	for u := range quotaRefused {
		if len(won[u]) != quotaPerUse {
			t.Errorf("user %s was refused for quota while holding %d of %d servers", u, len(won[u]), quotaPerUse)
		}
	}

	for u, names := range won {
		cl := e.client(u, "ml")
		for _, n := range names {
			if _, err := cl.WaitServer(ctx, u, n, v1.StateRunning, 90*time.Second); err != nil {
				t.Errorf("%v", err)
			}
		}
	}

	pods, err := e.pods(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if len(pods) != nWon {
		t.Errorf("%d broker pods, want one per created server (%d)", len(pods), nWon)
	}
	fromPods := e.useFromPods(t, pods)
	e.checkNotOvercommitted(t, fromPods)
	if diff := cmp.Diff(fromPods, e.allocated(t), cmp.AllowUnexported(gpuUse{})); diff != "" {
		t.Errorf("admin GPU view differs from the pods' annotations (-pods +admin):\n%s", diff)
	}
}

// readable reports whether msg looks like a sentence for a person rather
// than an internal error: non-trivial, without sentinel prefixes, Redis
// errors or formatting debris. (Names in messages may contain any word, so
// only error-shaped fragments count.)
func readable(msg string) bool {
	if len(strings.TrimSpace(msg)) < 10 {
		return false
	}
	for _, bad := range []string{"fleet: ", "redis: ", "ERR ", "NOSCRIPT", "%!", "<nil>", "panic", "goroutine "} {
		if strings.Contains(msg, bad) {
			return false
		}
	}
	return true
}

// useFromPods sums the slices in the pods' annotations per GPU, checking
// that each pod runs on its GPU's node.
func (e *env) useFromPods(t *testing.T, pods []corev1.Pod) map[string]gpuUse {
	t.Helper()
	out := map[string]gpuUse{}
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		a := p.Annotations
		uuid := a[v1.AnnotationGPUUUID]
		g, ok := e.gpuByUUID(uuid)
		if !ok {
			t.Errorf("pod %s is on unknown GPU %q", p.Name, uuid)
			continue
		}
		if p.Spec.NodeName != g.Node || a[v1.AnnotationNode] != g.Node {
			t.Errorf("pod %s: spec.nodeName %q, annotation node %q, GPU %s is on %q", p.Name, p.Spec.NodeName, a[v1.AnnotationNode], uuid, g.Node)
		}
		mem, err1 := strconv.ParseInt(a[v1.AnnotationMemoryMiB], 10, 64)
		comp, err2 := strconv.Atoi(a[v1.AnnotationComputePercent])
		if err := errors.Join(err1, err2); err != nil {
			t.Errorf("pod %s slice annotations: %v", p.Name, err)
			continue
		}
		u := out[uuid]
		u.memoryMiB += mem
		u.computePercent += comp
		u.slices++
		out[uuid] = u
	}
	return out
}

// checkNotOvercommitted checks Σ memory ≤ the GPU's memory and Σ compute ≤
// 100 on every GPU.
func (e *env) checkNotOvercommitted(t *testing.T, use map[string]gpuUse) {
	t.Helper()
	for uuid, u := range use {
		g, _ := e.gpuByUUID(uuid)
		if u.memoryMiB > g.MemoryMiB || u.computePercent > 100 {
			t.Errorf("GPU %s overcommitted: %d of %d MiB, %d%% compute, %d slices", uuid, u.memoryMiB, g.MemoryMiB, u.computePercent, u.slices)
		}
	}
}

// allocationsMatchPods is a harness.Poll condition: the admin GPU view
// equals the slices in the pods' annotations on every GPU (and no GPU is
// overcommitted, which fails t at once).
func (e *env) allocationsMatchPods(t *testing.T, ctx context.Context) (bool, string, error) {
	t.Helper()
	pods, err := e.pods(ctx)
	if err != nil {
		return false, err.Error(), nil
	}
	fromPods := e.useFromPods(t, pods)
	e.checkNotOvercommitted(t, fromPods)
	if diff := cmp.Diff(fromPods, e.allocated(t), cmp.AllowUnexported(gpuUse{})); diff != "" {
		return false, "allocations differ from pods (-pods +redis): " + diff, nil
	}
	return true, "", nil
}
