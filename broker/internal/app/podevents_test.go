package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/spawner"
)

// podFeed is a podSource the test sends events through, as the spawner's
// dispatcher does: one at a time, to every subscriber.
type podFeed struct {
	mu    sync.Mutex
	subs  []func(spawner.PodEvent)
	ready chan struct{} // closed on the first Subscribe
}

func (f *podFeed) Subscribe(_ context.Context, fn func(spawner.PodEvent)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subs = append(f.subs, fn)
	if len(f.subs) == 1 {
		close(f.ready)
	}
}

func (f *podFeed) send(ev spawner.PodEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fn := range f.subs {
		fn(ev)
	}
}

// appliedPods records which pods' events were applied, in order.
type appliedPods struct {
	mu   sync.Mutex
	pods []string
	more chan struct{} // a value after each applied event
}

func (a *appliedPods) apply(_ context.Context, ev spawner.PodEvent) error {
	a.mu.Lock()
	a.pods = append(a.pods, ev.Pod)
	a.mu.Unlock()
	a.more <- struct{}{}
	return nil
}

func (a *appliedPods) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.pods...)
}

func TestOnlyTheLeadingReplicaAppliesPodEvents(t *testing.T) {
	feed := &podFeed{ready: make(chan struct{})}
	applied := &appliedPods{more: make(chan struct{}, 64)}
	var leading atomic.Bool
	var overflows atomic.Int32
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- podEvents{source: feed, apply: applied.apply, leading: leading.Load,
			overflow: func() { overflows.Add(1) }, log: slog.New(slog.DiscardHandler)}.run(ctx)
	}()
	<-feed.ready

	// A follower drops every event: the leader applies them.
	for i := range 5 {
		feed.send(spawner.PodEvent{Pod: fmt.Sprintf("follower-%d", i), Phase: spawner.PhaseRunning})
	}
	// Once it leads, it applies each one, one pod's events in order.
	leading.Store(true)
	want := []string{"leader-a", "leader-b", "leader-a"}
	for _, pod := range want {
		feed.send(spawner.PodEvent{Pod: pod, Phase: spawner.PhaseRunning})
	}
	deadline := time.After(10 * time.Second)
	for range want {
		select {
		case <-applied.more:
		case <-deadline:
			t.Fatalf("applied %v within 10 s, want %v", applied.list(), want)
		}
	}
	// Losing the Lease stops it again.
	leading.Store(false)
	feed.send(spawner.PodEvent{Pod: "follower-again", Phase: spawner.PhaseGone})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run returned %v, want nil", err)
	}
	got := applied.list()
	if len(got) != len(want) {
		t.Fatalf("applied %v, want only the leader's %v", got, want)
	}
	if n := strings.Count(strings.Join(got, " "), "leader-a"); n != 2 {
		t.Errorf("applied %v, want leader-a's two events", got)
	}
	if n := overflows.Load(); n != 0 {
		t.Errorf("%d overflows with %d events queued, want none", n, len(want))
	}
}
