package servers_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// resizeFixture is a running server "alice/lab" (profile small: 10240 MiB,
// 20 %, limit 50 %) on the lifecycle fixture, a Service that can resize it,
// and the agent store it talks to.
type resizeFixture struct {
	*serverstest.Fixture
	svc    *servers.Service
	agents *agentstore.Store
	key    fleet.ServerKey
	spawn  string
}

func newResizeFixture(t *testing.T, wait time.Duration) *resizeFixture {
	t.Helper()
	f := serverstest.New(t)
	key := fleet.ServerKey{User: "alice", Name: "lab"}
	s, _, err := f.Service.Create(t.Context(), serverstest.By, "alice", nil, "lab", v1.CreateServerRequest{Profile: "small"}, "k1")
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	f.SetPodRunning(t, "alice", "lab", "10.0.0.7")
	f.WaitState(t, key, v1.StateRunning)
	agents := agentstore.New(f.Redis.Client(t), f.Redis.Prefix(t))
	svc := servers.New(f.Store, f.Pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now),
		servers.WithResize(servers.ResizeConfig{Store: f.Store, Quotas: agents, Pods: f.Pods, Wait: wait, Deadline: 30 * time.Second}))
	return &resizeFixture{Fixture: f, svc: svc, agents: agents, key: key, spawn: s.SpawnID}
}

// runAgent acknowledges every desired quota through agentstore, as the node
// agent does after writing the quota file, until the test ends.
func (f *resizeFixture) runAgent(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	subscribed := make(chan struct{})
	go func() {
		defer wg.Done()
		close(subscribed)
		err := f.agents.WatchQuotaChanges(ctx, func(slice string) {
			d, err := f.agents.DesiredQuota(ctx, slice)
			if err != nil {
				return
			}
			_ = f.agents.SetAppliedQuota(ctx, slice, agentstore.AppliedQuota{Generation: d.Generation, FileGeneration: uint64(d.Generation), Node: "n1", At: time.Now()})
		})
		if err != nil && ctx.Err() == nil {
			t.Errorf("WatchQuotaChanges: %v", err)
		}
	}()
	<-subscribed
	t.Cleanup(func() { cancel(); wg.Wait() })
	// The subscription is live once a publish reaches a subscriber.
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	poll := time.NewTicker(5 * time.Millisecond)
	defer poll.Stop()
	for {
		n, err := f.Redis.Client(t).PubSubNumSub(t.Context(), f.agents.Keys().QuotaChanged()).Result()
		if err == nil && n[f.agents.Keys().QuotaChanged()] > 0 {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("agent did not subscribe within 5s")
		case <-poll.C:
		}
	}
}

// sample records the notebook's memory use as the node agent would, taken
// age ago on the fixture's clock; nil used means "not measured".
func (f *resizeFixture) sample(t *testing.T, used *int64, age time.Duration) {
	t.Helper()
	if err := f.agents.AddSamples(t.Context(), []agentstore.Sample{{
		Slice: f.spawn, At: f.Clock.Now().Add(-age), Interval: time.Second, MemoryUsedMiB: used, MemoryLimitMiB: 10240,
		Missing: map[bool]string{true: "memory: Not Supported"}[used == nil],
	}}); err != nil {
		t.Fatal(err)
	}
}

func mib(n int64) *int64 { return &n }

func TestResizeAppliedWhenTheAgentAcknowledges(t *testing.T) {
	f := newResizeFixture(t, 5*time.Second)
	f.runAgent(t)
	want := fleet.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 60}
	res, err := f.svc.Resize(t.Context(), f.key, want, serverstest.By)
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if !res.Applied || res.Generation != 1 || !res.Deadline.IsZero() || res.Slice != want {
		t.Errorf("result = %+v, want applied generation 1 with the new slice", res)
	}
	if diff := cmp.Diff(want, res.Server.Slice); diff != "" {
		t.Errorf("record slice (-want +got):\n%s", diff)
	}
	alloc, err := f.Store.Allocation(t.Context(), f.spawn)
	if err != nil || alloc.Slice != want {
		t.Errorf("stored allocation = %+v, %v; want slice %+v", alloc, err, want)
	}
	if err := f.Store.Verify(t.Context()); err != nil {
		t.Errorf("invariants: %v", err)
	}
	pod := f.Pod(t, "alice", "lab")
	if got := pod.Annotations[v1.AnnotationMemoryMiB] + "/" + pod.Annotations[v1.AnnotationComputePercent] + "/" + pod.Annotations[v1.AnnotationComputeLimitPercent]; got != "16384/30/60" {
		t.Errorf("pod slice annotations = %s, want 16384/30/60", got)
	}
	d, err := f.agents.DesiredQuota(t.Context(), f.spawn)
	if err != nil || d != (agentstore.DesiredQuota{Generation: 1, Slice: want}) {
		t.Errorf("desired quota = %+v, %v", d, err)
	}
	evs, err := f.svc.Events(t.Context(), f.key, "", 0)
	if err != nil || len(evs) == 0 {
		t.Fatalf("events: %v, %v", evs, err)
	}
	if last := evs[len(evs)-1]; last.Message != "resized to 16384 MiB and 30% compute (up to 60%)" || last.State != v1.StateRunning {
		t.Errorf("last event = %+v, want the resize while running", last)
	}

	t.Run("an admin's resize names the admin", func(t *testing.T) {
		res, err := f.svc.Resize(t.Context(), f.key, fleet.Slice{MemoryMiB: 16384, ComputePercent: 10, ComputeLimitPercent: 10}, audit.Actor{Name: "root", Kind: v1.ActorAdmin})
		if err != nil || !res.Applied || res.Generation != 2 {
			t.Fatalf("Resize = %+v, %v; want applied generation 2", res, err)
		}
		evs, _ := f.svc.Events(t.Context(), f.key, "", 0)
		if got := evs[len(evs)-1].Message; got != "resized to 16384 MiB and 10% compute by root (an administrator)" {
			t.Errorf("event = %q", got)
		}
	})
}

func TestResizePendingWithoutAnAgent(t *testing.T) {
	f := newResizeFixture(t, 50*time.Millisecond)
	res, err := f.svc.Resize(t.Context(), f.key, fleet.Slice{MemoryMiB: 20480, ComputePercent: 20, ComputeLimitPercent: 50}, serverstest.By)
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if res.Applied || res.Generation != 1 || !res.Deadline.Equal(f.Clock.Now().Add(30*time.Second)) {
		t.Errorf("result = applied %v gen %d deadline %v; want pending gen 1 deadline %v", res.Applied, res.Generation, res.Deadline, f.Clock.Now().Add(30*time.Second))
	}
	t.Run("asking again re-sends the same slice", func(t *testing.T) {
		res, err := f.svc.Resize(t.Context(), f.key, fleet.Slice{MemoryMiB: 20480, ComputePercent: 20, ComputeLimitPercent: 50}, serverstest.By)
		if err != nil || res.Generation != 2 || res.Applied {
			t.Errorf("Resize = %+v, %v; want pending generation 2", res, err)
		}
	})
}

func TestResizeMemoryShrink(t *testing.T) {
	shrink := fleet.Slice{MemoryMiB: 4096, ComputePercent: 20, ComputeLimitPercent: 50}
	tests := []struct {
		name  string
		setup func(t *testing.T, f *resizeFixture)
		errIs error
		text  string
	}{
		{
			name:  "below what the notebook uses now is refused with the figure",
			setup: func(t *testing.T, f *resizeFixture) { f.sample(t, mib(6144), 0) },
			errIs: fleet.ErrConflict,
			text:  "the notebook uses 6144 MiB now; memory cannot shrink below that",
		},
		{
			name:  "without a sample it is refused, not guessed",
			setup: func(t *testing.T, f *resizeFixture) {},
			errIs: fleet.ErrConflict,
			text:  "current GPU memory use is unknown (the node agent has reported no sample yet)",
		},
		{
			name:  "with a stale sample it is refused",
			setup: func(t *testing.T, f *resizeFixture) { f.sample(t, mib(10), time.Minute) },
			errIs: fleet.ErrConflict,
			text:  "the node agent's last sample is from",
		},
		{
			name:  "with memory not measured it is refused with the reason",
			setup: func(t *testing.T, f *resizeFixture) { f.sample(t, nil, 0) },
			errIs: fleet.ErrConflict,
			text:  "unknown (memory: Not Supported)",
		},
		{
			name:  "down to what the notebook uses is accepted",
			setup: func(t *testing.T, f *resizeFixture) { f.sample(t, mib(4096), 0) },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newResizeFixture(t, 20*time.Millisecond)
			tc.setup(t, f)
			_, err := f.svc.Resize(t.Context(), f.key, shrink, serverstest.By)
			if tc.errIs == nil {
				if err != nil {
					t.Fatalf("Resize: %v", err)
				}
			} else if !errors.Is(err, tc.errIs) || !strings.Contains(fleet.Message(err), tc.text) {
				t.Fatalf("Resize err = %v, want %v with %q", err, tc.errIs, tc.text)
			}
			rec, err := f.svc.Get(t.Context(), f.key)
			if err != nil {
				t.Fatal(err)
			}
			wantMiB := int64(10240)
			if tc.errIs == nil {
				wantMiB = 4096
			}
			if rec.Slice.MemoryMiB != wantMiB {
				t.Errorf("record memory = %d MiB, want %d", rec.Slice.MemoryMiB, wantMiB)
			}
		})
	}
}

func TestResizeRefusals(t *testing.T) {
	f := newResizeFixture(t, 20*time.Millisecond)
	tests := []struct {
		name  string
		key   fleet.ServerKey
		slice fleet.Slice
		errIs error
		text  string
	}{
		{"a bad slice", f.key, fleet.Slice{MemoryMiB: 1024, ComputePercent: 0, ComputeLimitPercent: 10}, fleet.ErrInvalid, "computePercent must be 1..100"},
		{"an unknown server", fleet.ServerKey{User: "alice", Name: "nope"}, fleet.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10}, fleet.ErrNotFound, "no server"},
		{"more memory than the GPU has", f.key, fleet.Slice{MemoryMiB: 40961, ComputePercent: 20, ComputeLimitPercent: 50}, fleet.ErrNoCapacity, "room for at most 40 GiB"},
		{"the whole GPU, all of the user's memory quota", f.key, fleet.Slice{MemoryMiB: 40960, ComputePercent: 20, ComputeLimitPercent: 50}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.svc.Resize(t.Context(), tc.key, tc.slice, serverstest.By)
			if tc.errIs == nil {
				if err != nil {
					t.Errorf("Resize: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.errIs) || !strings.Contains(err.Error(), tc.text) {
				t.Errorf("err = %v, want %v with %q", err, tc.errIs, tc.text)
			}
		})
	}
	t.Run("a second server cannot grow past the user's quota", func(t *testing.T) {
		if _, _, err := f.Service.Create(t.Context(), serverstest.By, "alice", nil, "two", v1.CreateServerRequest{Profile: "small"}, "k2"); !errors.Is(err, fleet.ErrQuotaExceeded) {
			t.Fatalf("Create with the quota used up = %v, want ErrQuotaExceeded", err)
		}
	})
	t.Run("a server that is not running", func(t *testing.T) {
		if _, err := f.Service.Delete(t.Context(), serverstest.By, f.key); err != nil {
			t.Fatal(err)
		}
		_, err := f.svc.Resize(t.Context(), f.key, fleet.Slice{MemoryMiB: 2048, ComputePercent: 10, ComputeLimitPercent: 10}, serverstest.By)
		if !errors.Is(err, fleet.ErrConflict) || !strings.Contains(err.Error(), "only a running server can be resized") {
			t.Errorf("err = %v, want a conflict", err)
		}
	})
	if err := f.Store.Verify(t.Context()); err != nil {
		t.Errorf("invariants: %v", err)
	}
}

func TestResizeNotConfigured(t *testing.T) {
	f := serverstest.New(t)
	if _, err := f.Service.Resize(t.Context(), fleet.ServerKey{User: "a", Name: "b"}, fleet.Slice{MemoryMiB: 1, ComputePercent: 1, ComputeLimitPercent: 1}, serverstest.By); err == nil || errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("err = %v, want an internal error", err)
	}
}

// touchingAnnotator changes the pod (as a kubelet's status update would)
// right before the first conditional write of a slice, so that write is
// refused as a changed pod.
type touchingAnnotator struct {
	servers.SliceAnnotator
	t       *testing.T
	f       *resizeFixture
	touched bool
}

func (a *touchingAnnotator) AnnotateSliceAt(ctx context.Context, user, server, spawnID, rv string, slice v1.Slice) error {
	if !a.touched {
		a.touched = true
		p := a.f.Pod(a.t, user, server)
		p.Annotations["example.com/touched"] = "yes"
		p.ResourceVersion += "1" // the fake API server keeps versions as given
		if _, err := a.f.Kube.CoreV1().Pods(serverstest.Namespace).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return a.SliceAnnotator.AnnotateSliceAt(ctx, user, server, spawnID, rv, slice)
}

// TestAResizeWhosePodChangedMeanwhileIsStillWrittenOnThePod: the pod
// changes between reading its version and writing the slice; the resize
// starts over, finds the store at the new slice already, and must still
// write it on the pod (a rebuild from pods would otherwise bring the old
// slice back while the notebook runs with the new one).
func TestAResizeWhosePodChangedMeanwhileIsStillWrittenOnThePod(t *testing.T) {
	f := newResizeFixture(t, 0)
	// The fake API server keeps no resourceVersions of its own: give the
	// pod one, as a real API server does.
	p := f.Pod(t, "alice", "lab")
	p.ResourceVersion = "100"
	if _, err := f.Kube.CoreV1().Pods(serverstest.Namespace).Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := &touchingAnnotator{SliceAnnotator: f.Pods, t: t, f: f}
	svc := servers.New(f.Store, f.Pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now),
		servers.WithResize(servers.ResizeConfig{Store: f.Store, Quotas: f.agents, Pods: pods, Deadline: 30 * time.Second}))
	want := fleet.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 60}
	if _, err := svc.Resize(t.Context(), f.key, want, serverstest.By); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if !pods.touched {
		t.Fatal("the pod was never written")
	}
	pod := f.Pod(t, "alice", "lab")
	if got := pod.Annotations[v1.AnnotationMemoryMiB] + "/" + pod.Annotations[v1.AnnotationComputePercent] + "/" + pod.Annotations[v1.AnnotationComputeLimitPercent]; got != "16384/30/60" {
		t.Errorf("pod slice annotations = %s, want 16384/30/60 (the store holds it)", got)
	}
}

// TestResizeComputeKeepsTheMemoryAndTheSpawn: the reclaimer's compute
// change keeps a memory growth made since it looked, and never touches a
// spawn other than the one it judged.
func TestResizeComputeKeepsTheMemoryAndTheSpawn(t *testing.T) {
	f := newResizeFixture(t, 0)
	ctx := t.Context()
	grown := fleet.Slice{MemoryMiB: 16384, ComputePercent: 20, ComputeLimitPercent: 50}
	if _, err := f.svc.Resize(ctx, f.key, grown, serverstest.By); err != nil {
		t.Fatalf("grow memory: %v", err)
	}
	reclaimer := audit.Actor{Name: "reclaimer", Kind: v1.ActorReclaimer}
	if _, err := f.svc.ResizeCompute(ctx, f.key, "another-spawn", 5, 50, reclaimer); !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("ResizeCompute of another spawn: err = %v, want ErrConflict", err)
	}
	res, err := f.svc.ResizeCompute(ctx, f.key, f.spawn, 5, 50, reclaimer)
	if err != nil {
		t.Fatalf("ResizeCompute: %v", err)
	}
	want := fleet.Slice{MemoryMiB: 16384, ComputePercent: 5, ComputeLimitPercent: 50}
	if res.Slice != want {
		t.Errorf("ResizeCompute answered %+v, want %+v (the grown memory kept)", res.Slice, want)
	}
	rec, err := f.Store.GetServer(ctx, f.key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Slice != want {
		t.Errorf("stored slice %+v, want %+v", rec.Slice, want)
	}
}
