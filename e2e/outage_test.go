package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestRedisOutageMidCreatesAndDeletes stops the test's redis-server while
// creates and deletes are in flight, and starts it again empty (as a
// Redis without persistence comes back). Every answer while Redis is down
// is a 503 with Retry-After that names Redis, never a 500; a create whose
// outcome is unknown is not reported as failed, and its same-key retry
// after Redis is back (the first ones answered 503 while the broker
// rebuilds its allocations from the pods) finds out: every created server
// runs, none is a 200 of a server that will never start. After that,
// pods and allocations agree and no GPU is overcommitted. Then the
// issue's own case: a create answered 503 during a rebuild, retried with
// the same key, starts the server (201), not a replay of the error.
func TestRedisOutageMidCreatesAndDeletes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{nodes: 1, gpusPerNode: 2})
	ctx := t.Context()
	small := v1.CreateServerRequest{Profile: "small"}
	stoppers := []string{"ada", "bea"}
	for _, u := range stoppers {
		if _, _, err := e.client(u).CreateServer(ctx, u, "old", "k-old", small); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range stoppers {
		if _, err := e.client(u).WaitServer(ctx, u, "old", v1.StateRunning, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	// Creates and deletes in flight while Redis goes away.
	creators := []string{"carl", "dina", "eve", "fred"}
	type answer struct {
		what   string
		status int
		err    error
	}
	var wg sync.WaitGroup
	answers := make(chan answer, len(creators)+len(stoppers))
	start := make(chan struct{})
	for _, u := range creators {
		wg.Go(func() {
			<-start
			_, st, err := e.client(u).CreateServer(ctx, u, "nb", "k-"+u, small)
			answers <- answer{"create " + u + "/nb", st, err}
		})
	}
	for _, u := range stoppers {
		wg.Go(func() {
			<-start
			st, err := e.client(u).DeleteServer(ctx, u, "old")
			answers <- answer{"stop " + u + "/old", st, err}
		})
	}
	close(start)
	e.redis.Stop()
	wg.Wait()
	close(answers)
	for a := range answers {
		t.Logf("while Redis went away: %s → %d %v", a.what, a.status, a.err)
		checkOutageAnswer(t, a.what, a.status, a.err)
	}
	// With Redis fully gone, every kind of call says so.
	_, st, err := e.client("gina").CreateServer(ctx, "gina", "down", "k-down", small)
	checkOutageAnswer(t, "create while Redis is down", st, err)
	wantRedisDown(t, "create while Redis is down", st, err)
	st, err = e.client("ada").DeleteServer(ctx, "ada", "old")
	wantRedisDown(t, "stop while Redis is down", st, err)
	_, err = e.client("ada").GetServer(ctx, "ada", "old")
	wantRedisDown(t, "read while Redis is down", http.StatusServiceUnavailable, err)

	if err := e.redis.Rerun(ctx); err != nil {
		t.Fatal(err)
	}
	e.registerGPUsAgain(t) // the agents' heartbeats would

	// The same-key retries find out what happened.
	for _, u := range creators {
		status := retryUntilAnswered(t, fmt.Sprintf("create %s/nb again", u), func() (int, error) {
			_, st, err := e.client(u).CreateServer(ctx, u, "nb", "k-"+u, small)
			return st, err
		})
		t.Logf("the same-key retry of %s/nb → %d", u, status)
		if status != http.StatusCreated && status != http.StatusOK {
			t.Errorf("same-key retry of %s/nb: %d, want 201 or 200", u, status)
			continue
		}
		if _, err := e.client(u).WaitServer(ctx, u, "nb", v1.StateRunning, 60*time.Second); err != nil {
			t.Errorf("%s/nb after its same-key retry (%d): %v", u, status, err)
		}
	}
	for _, u := range stoppers {
		status := retryUntilAnswered(t, fmt.Sprintf("stop %s/old again", u), func() (int, error) {
			return e.client(u).DeleteServer(ctx, u, "old")
		})
		if status != http.StatusAccepted && status != http.StatusNotFound {
			t.Errorf("stop of %s/old after the outage: %d, want 202 (or 404: Redis lost it and its pod is gone)", u, status)
		}
	}
	e.waitPodsSettle(t, map[string]bool{"carl/nb": true, "dina/nb": true, "eve/nb": true, "fred/nb": true})

	// The case: a create answered 503 while the broker rebuilds.
	var first int
	for attempt := 0; attempt < 5 && first != http.StatusServiceUnavailable; attempt++ {
		if err := e.redis.Client(t).FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		e.registerGPUsAgain(t)
		var err error
		_, first, err = e.client("hana").CreateServer(ctx, "hana", "nb", fmt.Sprintf("k-rebuild-%d", attempt), small)
		if first == http.StatusServiceUnavailable {
			var ae *harness.APIError
			if !errors.As(err, &ae) || ae.Header.Get("Retry-After") == "" || !strings.Contains(ae.Body.Message, "rebuilding") {
				t.Errorf("create during the rebuild: %v, want a 503 with Retry-After saying the broker is rebuilding", err)
			}
			status := retryUntilAnswered(t, "create hana/nb again", func() (int, error) {
				_, st, err := e.client("hana").CreateServer(ctx, "hana", "nb", fmt.Sprintf("k-rebuild-%d", attempt), small)
				return st, err
			})
			if status != http.StatusCreated {
				t.Errorf("same-key retry after a 503 during the rebuild: %d, want 201 (the error was never the key's outcome)", status)
			}
			if _, err := e.client("hana").WaitServer(ctx, "hana", "nb", v1.StateRunning, 60*time.Second); err != nil {
				t.Error(err)
			}
		} else if err == nil {
			// The rebuild was already done: start over.
			if _, err := e.client("hana").DeleteServer(ctx, "hana", "nb"); err != nil {
				t.Fatal(err)
			}
			if _, err := e.client("hana").WaitServer(ctx, "hana", "nb", v1.StateStopped, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	if first != http.StatusServiceUnavailable {
		t.Errorf("five creates right after a flush never met the rebuild (last answer %d)", first)
	}
}

// registerGPUsAgain registers the env's GPUs as the agents' heartbeats
// do after an outage: again and again until the broker, whose connections
// to Redis come back within a second or so, takes them.
func (e *env) registerGPUsAgain(t *testing.T) {
	t.Helper()
	for _, g := range e.gpus {
		retryUntilAnswered(t, "register "+g.UUID, func() (int, error) {
			if err := e.admin.PutGPU(t.Context(), g); err != nil {
				var ae *harness.APIError
				if errors.As(err, &ae) {
					return ae.Status, err
				}
				return 0, err
			}
			return http.StatusOK, nil
		})
	}
}

// checkOutageAnswer: an answer given while Redis goes away is a success
// or a 503 with Retry-After whose words name Redis; never a 500.
func checkOutageAnswer(t *testing.T, what string, status int, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var ae *harness.APIError
	switch {
	case !errors.As(err, &ae):
		t.Errorf("%s: %v", what, err)
	case ae.Status != http.StatusServiceUnavailable || ae.Body.Code != v1.CodeUnavailable || ae.Header.Get("Retry-After") == "":
		t.Errorf("%s: %d %s %q (Retry-After %q), want 503 unavailable with Retry-After", what, ae.Status, ae.Body.Code, ae.Body.Message, ae.Header.Get("Retry-After"))
	case !strings.Contains(ae.Body.Message, "Redis") || strings.Contains(ae.Body.Message, "internal") || !readable(ae.Body.Message):
		t.Errorf("%s: %q, want words that name Redis", what, ae.Body.Message)
	}
}

// wantRedisDown: the answer is a 503 naming Redis.
func wantRedisDown(t *testing.T, what string, status int, err error) {
	t.Helper()
	var ae *harness.APIError
	if !errors.As(err, &ae) || status != http.StatusServiceUnavailable || !strings.Contains(ae.Body.Message, "Redis") {
		t.Errorf("%s: %d %v, want a 503 naming Redis", what, status, err)
	}
}

// retryUntilAnswered repeats call while it answers 503 (as Retry-After
// invites), for up to a minute, and returns the first other status.
func retryUntilAnswered(t *testing.T, what string, call func() (int, error)) int {
	t.Helper()
	var status int
	var last error
	err := harness.Poll(t.Context(), 250*time.Millisecond, 60*time.Second, func(context.Context) (bool, string, error) {
		status, last = call()
		if status == 0 {
			return false, fmt.Sprint(last), nil // the broker did not answer at all
		}
		return status != http.StatusServiceUnavailable, fmt.Sprint(last), nil
	})
	if err != nil {
		t.Errorf("%s: still unavailable: %v", what, err)
	}
	return status
}

// waitPodsSettle waits until the namespace's pods are exactly those of
// the servers in want ("user/name"), each of them running in the API,
// and the allocations equal the pods' annotations without overcommitting
// a GPU.
func (e *env) waitPodsSettle(t *testing.T, want map[string]bool) {
	t.Helper()
	ctx := t.Context()
	err := harness.Poll(ctx, 250*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		pods, err := e.pods(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		got := map[string]bool{}
		for _, p := range pods {
			if p.DeletionTimestamp == nil {
				got[p.Annotations[v1.AnnotationUser]+"/"+p.Annotations[v1.AnnotationServer]] = true
			}
		}
		if !cmp.Equal(want, got) {
			return false, fmt.Sprintf("pods of %v, want %v", got, want), nil
		}
		use := e.useFromPods(t, pods)
		if a := e.allocated(t); !cmp.Equal(use, a, cmp.AllowUnexported(gpuUse{})) {
			return false, fmt.Sprintf("allocated %+v, pods hold %+v", a, use), nil
		}
		return true, "", nil
	})
	if err != nil {
		t.Errorf("after the outage: %v", err)
	}
	pods, err := e.pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.checkNotOvercommitted(t, e.useFromPods(t, pods))
}
