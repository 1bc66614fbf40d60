package servers_test

// Resizes under faults: pod writes refused or with lost answers, replicas
// dying between the store and the pod, clients hanging up, resizes of one
// server overtaking each other.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/spawner"
)

// failingAnnotator cannot write the pod (the API server refuses for good);
// before refusing, it lets other slices take the room a shrink freed.
type failingAnnotator struct {
	servers.SliceAnnotator
	before func(ctx context.Context)
}

func (a *failingAnnotator) AnnotateSliceAt(ctx context.Context, user, server, spawnID, rv string, slice v1.Slice) error {
	a.before(ctx)
	return errors.New("the server is currently unable to handle the request")
}

// TestAShrinkThePodDidNotRecordIsUndoneEvenWhenItsRoomIsTaken: a shrink
// frees room in the store before its pod records it; other slices take the
// room; the pod cannot be written. The store must go back to charging the
// pod's slice (the one the node agent enforces), though undoing the shrink
// is a growth that no longer fits.
func TestAShrinkThePodDidNotRecordIsUndoneEvenWhenItsRoomIsTaken(t *testing.T) {
	f := newResizeFixture(t, 0)
	before, err := f.Store.GetServer(t.Context(), f.key)
	if err != nil {
		t.Fatal(err)
	}
	placed := 0
	pods := &failingAnnotator{SliceAnnotator: f.Pods, before: func(ctx context.Context) {
		for placed < 2 { // one on each GPU: 95 % of alice's is free after the shrink
			placed++
			req := fleet.PlaceRequest{SliceID: fmt.Sprintf("other-%d", placed), User: "bob", Slice: fleet.Slice{MemoryMiB: 1024, ComputePercent: 95, ComputeLimitPercent: 95}}
			if _, err := f.Store.Place(ctx, req); err != nil {
				t.Errorf("place %s: %v", req.SliceID, err)
			}
		}
	}}
	svc := servers.New(f.Store, f.Pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now),
		servers.WithResize(servers.ResizeConfig{Store: f.Store, Quotas: f.agents, Pods: pods, Deadline: 30 * time.Second}))
	shrink := before.Slice
	shrink.ComputePercent = 5
	if _, err := svc.Resize(t.Context(), f.key, shrink, serverstest.By); !errors.Is(err, fleet.ErrUnavailable) {
		t.Fatalf("Resize with a pod that cannot be written: err = %v, want ErrUnavailable (nothing changed)", err)
	}
	after, err := f.Store.GetServer(t.Context(), f.key)
	if err != nil {
		t.Fatal(err)
	}
	if after.Slice != before.Slice || after.Allocation.Slice != before.Slice {
		t.Errorf("store slice %+v, allocation %+v after the failed shrink; want the pod's %+v", after.Slice, after.Allocation.Slice, before.Slice)
	}
	gpus, err := f.Store.GPUUsage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gpus {
		if g.GPU.UUID == before.Allocation.GPUUUID && g.AllocatedComputePercent != before.Slice.ComputePercent+95 {
			t.Errorf("GPU %s charges %d%% compute; want %d%% (alice's pod's slice and the other one)", g.GPU.UUID, g.AllocatedComputePercent, before.Slice.ComputePercent+95)
		}
	}
}

// lostReply applies the slice write and then answers an outage, as an API
// server restarting mid-request may.
type lostReply struct{ servers.SliceAnnotator }

func (l lostReply) AnnotateSliceAt(ctx context.Context, user, server, spawnID, rv string, slice v1.Slice) error {
	if err := l.SliceAnnotator.AnnotateSliceAt(ctx, user, server, spawnID, rv, slice); err != nil {
		return err
	}
	return fmt.Errorf("annotate pod: %w: the answer was lost", spawner.ErrUnavailable)
}

// TestAResizeWhosePodWriteLostItsAnswerIsNotUndone: the pod recorded the
// new slice though its write answered an error; the resize must not put
// the store back (a rebuild from the pod would restore the new slice under
// a store that charges the old one).
func TestAResizeWhosePodWriteLostItsAnswerIsNotUndone(t *testing.T) {
	f := newResizeFixture(t, 0)
	svc := servers.New(f.Store, f.Pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now),
		servers.WithResize(servers.ResizeConfig{Store: f.Store, Quotas: f.agents, Pods: lostReply{f.Pods}, Deadline: 30 * time.Second}))
	want := fleet.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 60}
	if _, err := svc.Resize(t.Context(), f.key, want, serverstest.By); err != nil {
		t.Errorf("Resize whose pod recorded the slice: %v", err)
	}
	f.checkSlice(t, want)
}

// TestAResizeRetriedAfterItsReplicaDiedWritesThePod: a replica died
// between changing the store and writing the pod; the client's retry
// finds the store at the new slice already and must still write the pod.
func TestAResizeRetriedAfterItsReplicaDiedWritesThePod(t *testing.T) {
	f := newResizeFixture(t, 0)
	ctx := t.Context()
	rec, err := f.Store.GetServer(ctx, f.key)
	if err != nil {
		t.Fatal(err)
	}
	want := fleet.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 60}
	if _, changed, err := f.Store.Resize(ctx, f.key, fleet.PlaceRequest{SliceID: rec.SpawnID, User: "alice", Slice: want}, "the dead replica's change"); err != nil || !changed {
		t.Fatalf("store resize = %v, %v", changed, err)
	}
	if _, err := f.svc.Resize(ctx, f.key, want, serverstest.By); err != nil {
		t.Fatalf("retried Resize: %v", err)
	}
	f.checkSlice(t, want)
}

// checkSlice fails unless the store and the pod both hold want.
func (f *resizeFixture) checkSlice(t *testing.T, want fleet.Slice) {
	t.Helper()
	rec, err := f.Store.GetServer(t.Context(), f.key)
	if err != nil {
		t.Fatal(err)
	}
	pod := f.Pod(t, f.key.User, f.key.Name)
	onPod := pod.Annotations[v1.AnnotationMemoryMiB] + "/" + pod.Annotations[v1.AnnotationComputePercent] + "/" + pod.Annotations[v1.AnnotationComputeLimitPercent]
	wantText := fmt.Sprintf("%d/%d/%d", want.MemoryMiB, want.ComputePercent, want.ComputeLimitPercent)
	if rec.Allocation.Slice != want || onPod != wantText {
		t.Errorf("store %+v, pod %s; want both %s", rec.Allocation.Slice, onPod, wantText)
	}
}

// overtakingQuotas runs, before the first desired quota it sends, another
// whole resize: one that overtakes the resize in progress between its
// store and pod writes and its message to the node agent.
type overtakingQuotas struct {
	servers.LiveQuotas
	overtake func(ctx context.Context)
}

func (q *overtakingQuotas) SetDesiredQuota(ctx context.Context, slice string, s v1.Slice) (int64, error) {
	if o := q.overtake; o != nil {
		q.overtake = nil
		o(ctx)
	}
	return q.LiveQuotas.SetDesiredQuota(ctx, slice, s)
}

// TestTheNodeAgentGetsTheSliceOfTheLastResizeRecorded: two resizes of one
// server (a user's growth, the reclaimer's shrink) where the one recorded
// first tells the node agent last; the agent must end with the slice the
// store and the pod hold, not the overtaken one.
func TestTheNodeAgentGetsTheSliceOfTheLastResizeRecorded(t *testing.T) {
	f := newResizeFixture(t, 0)
	ctx := t.Context()
	quotas := &overtakingQuotas{LiveQuotas: f.agents}
	svc := servers.New(f.Store, f.Pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now),
		servers.WithResize(servers.ResizeConfig{Store: f.Store, Quotas: quotas, Pods: f.Pods, Deadline: 30 * time.Second}))
	grow := fleet.Slice{MemoryMiB: 10240, ComputePercent: 50, ComputeLimitPercent: 60}
	shrink := fleet.Slice{MemoryMiB: 10240, ComputePercent: 10, ComputeLimitPercent: 50}
	quotas.overtake = func(ctx context.Context) {
		if _, err := svc.Resize(ctx, f.key, shrink, audit.Actor{Name: "reclaimer"}); err != nil {
			t.Errorf("the overtaking shrink: %v", err)
		}
	}
	res, err := svc.Resize(ctx, f.key, grow, serverstest.By)
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	f.checkSlice(t, shrink)
	d, err := f.agents.DesiredQuota(ctx, f.spawn)
	if err != nil {
		t.Fatal(err)
	}
	if d.Slice != shrink || res.Slice != shrink || res.Generation != d.Generation {
		t.Errorf("desired quota %+v (generation %d), answer %+v (generation %d); want %+v, the store's, in both", d.Slice, d.Generation, res.Slice, res.Generation, shrink)
	}
}

// hangingUp cancels the caller's request right after the store changed,
// as a client that hangs up mid-resize.
type hangingUp struct {
	servers.SliceAnnotator
	cancel context.CancelFunc
}

func (h hangingUp) AnnotateSliceAt(ctx context.Context, user, server, spawnID, rv string, slice v1.Slice) error {
	h.cancel()
	return h.SliceAnnotator.AnnotateSliceAt(ctx, user, server, spawnID, rv, slice)
}

// TestAResizeWhoseClientHangsUpIsFinished: once the store holds the new
// slice, the pod's record and the node agent's quota follow though the
// client hung up (before, the pod write and the undo both failed on the
// ended request, leaving the store at a slice the pod does not say).
func TestAResizeWhoseClientHangsUpIsFinished(t *testing.T) {
	f := newResizeFixture(t, 0)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	svc := servers.New(f.Store, f.Pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now),
		servers.WithResize(servers.ResizeConfig{Store: f.Store, Quotas: f.agents, Pods: hangingUp{f.Pods, cancel}, Deadline: 30 * time.Second}))
	want := fleet.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 60}
	if _, err := svc.Resize(ctx, f.key, want, serverstest.By); err != nil {
		t.Errorf("Resize whose client hung up: %v (it was recorded: pending, not an error)", err)
	}
	f.checkSlice(t, want)
	if d, err := f.agents.DesiredQuota(t.Context(), f.spawn); err != nil || d.Slice != want {
		t.Errorf("desired quota = %+v, %v; want %+v", d.Slice, err, want)
	}
}

// churnThenTwin refuses a resize's pod writes as a pod whose status
// changed; before the last one it lets a retry of the same resize run
// whole and succeed.
type churnThenTwin struct {
	servers.SliceAnnotator
	n    int
	twin func(ctx context.Context)
}

func (c *churnThenTwin) AnnotateSliceAt(ctx context.Context, user, server, spawnID, rv string, slice v1.Slice) error {
	c.n++
	if c.n == 5 {
		c.twin(ctx)
	}
	return fmt.Errorf("annotate: %w (a status update, or the twin's write)", spawner.ErrPodChanged)
}

// TestARefusedResizeDoesNotUndoItsSucceededTwin: a resize whose pod writes
// are all refused must not put the store back when the pod says the new
// slice meanwhile (a client's retry of the same resize found the store at
// it and wrote the pod): the undo would leave the store charging less than
// the pod and the agent hold.
func TestARefusedResizeDoesNotUndoItsSucceededTwin(t *testing.T) {
	f := newResizeFixture(t, 0)
	before, err := f.Store.GetServer(t.Context(), f.key)
	if err != nil {
		t.Fatal(err)
	}
	want := before.Slice
	want.ComputePercent += 20
	pods := &churnThenTwin{SliceAnnotator: f.Pods}
	pods.twin = func(ctx context.Context) {
		if _, err := f.svc.Resize(ctx, f.key, want, serverstest.By); err != nil {
			t.Errorf("the twin resize: %v", err)
		}
	}
	svc := servers.New(f.Store, f.Pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now),
		servers.WithResize(servers.ResizeConfig{Store: f.Store, Quotas: f.agents, Pods: pods, Deadline: 30 * time.Second}))
	if _, err := svc.Resize(t.Context(), f.key, want, serverstest.By); err != nil {
		t.Errorf("Resize whose twin recorded the slice: %v", err)
	}
	if pods.n < 5 {
		t.Fatalf("the twin never ran (%d writes)", pods.n)
	}
	f.checkSlice(t, want)
}
