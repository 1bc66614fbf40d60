package leader_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpubroker/gpubroker/broker/internal/leader"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOneLeaderAtATimeAndHandOverOnCancel runs two replicas on one Lease:
// exactly one runs the work; when it shuts down it releases the Lease
// and the other takes over, and the two never run at once.
func TestOneLeaderAtATimeAndHandOverOnCancel(t *testing.T) {
	client := fake.NewClientset()
	var (
		mu      sync.Mutex
		running = map[string]bool{}
		maxBoth int
		changed = make(chan struct{}, 16)
	)
	run := func(id string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			mu.Lock()
			running[id] = true
			maxBoth = max(maxBoth, len(running))
			mu.Unlock()
			changed <- struct{}{}
			<-ctx.Done()
			mu.Lock()
			delete(running, id)
			mu.Unlock()
			return nil
		}
	}
	type replica struct {
		cancel context.CancelFunc
		done   chan error
	}
	start := func(id string) replica {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- leader.Run(ctx, leader.Config{Client: client, Namespace: "gpubroker", Name: "gpubroker-reclaimer",
				Identity: id, LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 50 * time.Millisecond}, run(id))
		}()
		return replica{cancel, done}
	}
	current := func() string {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatal("no replica became leader within 10 s")
		}
		mu.Lock()
		defer mu.Unlock()
		for id := range running {
			return id
		}
		return ""
	}
	reps := map[string]replica{"a": start("a"), "b": start("b")}
	first := current()
	reps[first].cancel()
	if err := <-reps[first].done; err != nil {
		t.Fatalf("leader %s: %v", first, err)
	}
	second := current()
	if second == first || second == "" {
		t.Fatalf("after %s shut down the leader is %q", first, second)
	}
	reps[second].cancel()
	if err := <-reps[second].done; err != nil {
		t.Fatalf("leader %s: %v", second, err)
	}
	if maxBoth != 1 {
		t.Errorf("%d replicas ran at once", maxBoth)
	}
}
