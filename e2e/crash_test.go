package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestBrokerCrashMidSpawnRecovers kills the broker (SIGKILL) while sixteen
// spawns are in flight (right after the second create answered), starts it again on the same Redis and cluster, and
// checks that after reconciliation pods and Redis agree: every pod's slice is
// allocated, every allocation has a pod, every server settles in a final
// state consistent with its pod, and no GPU is overcommitted.
func TestBrokerCrashMidSpawnRecovers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{nodes: 2, gpusPerNode: 2})
	ctx := t.Context()

	type attempt struct{ user, name string }
	var attempts []attempt
	for u := range 8 {
		for s := range 2 {
			attempts = append(attempts, attempt{fmt.Sprintf("user%d", u), fmt.Sprintf("nb%d", s)})
		}
	}
	const killAfter = 2 // answered creates before the kill
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		answered int
		killed   = make(chan struct{})
		killOnce sync.Once
		start    = make(chan struct{})
		outcomes = map[attempt]string{}
	)
	kill := func() {
		killOnce.Do(func() {
			if err := e.broker.Kill(); err != nil {
				t.Errorf("kill broker: %v", err)
			}
			close(killed)
		})
	}
	for _, a := range attempts {
		cl := e.client(a.user, "ml")
		wg.Go(func() {
			<-start
			_, status, err := cl.CreateServer(ctx, a.user, a.name, "k-"+a.user+"-"+a.name, v1.CreateServerRequest{Profile: "small"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				outcomes[a] = err.Error()
			} else {
				outcomes[a] = fmt.Sprint(status)
			}
			if err == nil {
				answered++
				if answered == killAfter {
					go kill() // Kill waits for the process; do not hold mu meanwhile
				}
			}
		})
	}
	close(start)
	wg.Wait()
	kill() // in case fewer than killAfter creates answered
	<-killed
	t.Logf("create outcomes at the kill: %v", outcomes)
	if pods, err := e.pods(ctx); err == nil {
		t.Logf("%d broker pods at the kill", len(pods))
	}

	restart := time.Now()
	if err := e.broker.Start(ctx); err != nil {
		t.Fatalf("restart broker: %v", err)
	}
	t.Logf("broker ready again in %s", time.Since(restart).Round(time.Millisecond))
	seen := map[v1.ServerState]int{}
	for _, a := range attempts {
		if s, err := e.client(a.user, "ml").GetServer(ctx, a.user, a.name); err == nil {
			seen[s.State]++
		}
	}
	t.Logf("server states right after the restart: %v", seen)

	var final map[attempt]v1.Server
	err := harness.Poll(ctx, 250*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		final = map[attempt]v1.Server{}
		var problems []string
		for _, a := range attempts {
			s, err := e.client(a.user, "ml").GetServer(ctx, a.user, a.name)
			var ae *harness.APIError
			switch {
			case errors.As(err, &ae) && ae.Status == http.StatusNotFound:
				continue // never stored: it must have no pod (checked below)
			case err != nil:
				return false, err.Error(), nil
			}
			final[a] = s
			if s.State != v1.StateRunning && s.State != v1.StateFailed && s.State != v1.StateStopped {
				problems = append(problems, fmt.Sprintf("%s/%s still %s", a.user, a.name, s.State))
			}
		}
		pods, err := e.pods(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		podBySpawn := map[string]string{}
		for _, p := range pods {
			if p.DeletionTimestamp != nil {
				problems = append(problems, "pod "+p.Name+" terminating")
				continue
			}
			podBySpawn[p.Annotations[v1.AnnotationSpawnID]] = p.Name
		}
		for a, s := range final {
			_, hasPod := podBySpawn[s.SpawnID]
			if (s.State == v1.StateRunning) != hasPod {
				problems = append(problems, fmt.Sprintf("%s/%s is %s, pod for spawn %s exists: %t", a.user, a.name, s.State, s.SpawnID, hasPod))
			}
			delete(podBySpawn, s.SpawnID)
		}
		for spawn, pod := range podBySpawn {
			problems = append(problems, fmt.Sprintf("pod %s (spawn %s) belongs to no current server", pod, spawn))
		}
		if len(problems) > 0 {
			sort.Strings(problems)
			return false, strings.Join(problems, "; "), nil
		}
		fromPods := e.useFromPods(t, pods)
		admin := e.allocated(t)
		if diff := cmp.Diff(fromPods, admin, cmp.AllowUnexported(gpuUse{})); diff != "" {
			return false, "allocations differ from pods (-pods +redis): " + diff, nil
		}
		e.checkNotOvercommitted(t, fromPods)
		return true, "", nil
	})
	if err != nil {
		t.Fatalf("pods and Redis do not agree after the restart: %v", err)
	}
	states := map[v1.ServerState]int{}
	for _, s := range final {
		states[s.State]++
	}
	t.Logf("after reconcile: %d servers stored, states %v", len(final), states)
	if states[v1.StateRunning] == 0 {
		t.Errorf("no server is running after the restart; want the answered spawns to complete or be re-driven")
	}
	for a, s := range final {
		if s.State == v1.StateFailed && !readable(s.Message) {
			t.Errorf("%s/%s failed without a readable message: %q", a.user, a.name, s.Message)
		}
	}
}
