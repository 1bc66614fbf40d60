package reconcile_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reconcile"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/spawner"
)

// These tests replay sequences of the chaos soak (e2e TestChaos) that let
// placement reopen, or a slice go, while a pod still held its GPU.

// TestAReplicaStartedAfterALossKeepsTheFence: Redis lost its data, and a
// broker replica that started after the loss (it never saw the data)
// made the first pass. Another replica may still create the pod of a
// spawn that placed on the lost data, so placement must stay shut for
// fleet.RebuildFence as on a replica that saw the loss.
func TestAReplicaStartedAfterALossKeepsTheFence(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	runningServer(t, f, "alice", "one", "10.0.0.1")
	if err := f.Redis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.RegisterGPUs(t)
	r := newReconciler(f) // a process that starts now
	rep, err := r.Once(ctx)
	if err != nil || rep.RestoredSlices != 1 {
		t.Fatalf("first pass: report %+v err %v, want the pod's slice restored", rep, err)
	}
	if rep.Complete {
		t.Fatalf("the first pass of a new replica reopened placement at once after the loss, inside the rebuild fence (%v)", fleet.RebuildFence)
	}
	f.Clock.Advance(fleet.RebuildFence)
	if rep, err := r.Once(ctx); err != nil || !rep.Complete {
		t.Fatalf("pass after the fence: report %+v err %v, want complete", rep, err)
	}
	f.Verify(t)
}

// TestAFreshInstallOpensAtOnce: a first broker on an empty Redis and a
// namespace without gpubroker's pods or Secrets has no spawn in flight
// anywhere; placement opens on its first pass.
func TestAFreshInstallOpensAtOnce(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	if err := f.Redis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.RegisterGPUs(t)
	if rep, err := newReconciler(f).Once(ctx); err != nil || !rep.Complete {
		t.Fatalf("first pass of a fresh install: report %+v err %v, want complete", rep, err)
	}
}

// laggingCache is the spawner with an informer cache that has not seen
// some pods yet (its watch broke with an API server restart and is
// backing off); ListPods reads the API server and sees them.
type laggingCache struct {
	*spawner.Client
	mu     sync.Mutex
	hidden map[string]bool // pod names
}

func (l *laggingCache) Pods() ([]spawner.ManagedPod, error) {
	pods, err := l.Client.Pods()
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.DeleteFunc(pods, func(p spawner.ManagedPod) bool { return l.hidden[p.Name] }), err
}

func (l *laggingCache) catchUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hidden = nil
}

// TestTheRebuildWaitsForPodsTheCacheMissed: after a loss, the pass after
// the fence reads pods from a cache that lags the API server. Reopening
// placement then would give away the missed pod's slice; the rebuild waits
// until the pod's slice is held.
func TestTheRebuildWaitsForPodsTheCacheMissed(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	runningServer(t, f, "alice", "one", "10.0.0.1")
	b := runningServer(t, f, "bob", "two", "10.0.0.2")
	pods := &laggingCache{Client: f.Pods, hidden: map[string]bool{spawner.PodName("bob", "two"): true}}
	r := reconcile.New(f.Store, pods, f.Service, f.Log, grace, time.Hour, f.Clock.Now)
	if _, err := r.Once(ctx); err != nil { // sees the data before it is lost
		t.Fatal(err)
	}
	if err := f.Redis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.RegisterGPUs(t)
	f.Clock.Advance(fleet.RebuildFence)
	if _, err := r.Once(ctx); err != nil { // the epoch begins
		t.Fatal(err)
	}
	f.Clock.Advance(fleet.RebuildFence)
	rep, err := r.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Complete {
		t.Fatalf("placement reopened while bob's running pod held no slice (report %+v)", rep)
	}
	pods.catchUp()
	if rep, err = r.Once(ctx); err != nil || !rep.Complete || rep.RestoredSlices != 1 {
		t.Fatalf("pass once the cache caught up: report %+v err %v, want bob's slice restored and complete", rep, err)
	}
	if _, err := f.Store.Allocation(ctx, b.SpawnID); err != nil {
		t.Errorf("bob's slice: %v", err)
	}
	f.Verify(t)
}

// TestASliceStaysWhileTheAPIServerHasItsPod: the slice of a pod whose
// record moved on (restored after a loss) is released once the pod is
// gone; a cache that has not seen the pod is no proof of that.
func TestASliceStaysWhileTheAPIServerHasItsPod(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	old := replacedAfterALoss(t, f)
	pods := &laggingCache{Client: f.Pods}
	r := reconcile.New(f.Store, pods, f.Service, f.Log, grace, time.Hour, f.Clock.Now)
	if rep, err := r.Once(ctx); err != nil || rep.RestoredSlices != 1 {
		t.Fatalf("report %+v err %v, want the old pod's slice restored", rep, err)
	}
	pods.mu.Lock()
	pods.hidden = map[string]bool{spawner.PodName("kim", "nb"): true} // a relist that is behind
	pods.mu.Unlock()
	rep, err := r.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Allocation(ctx, old.SpawnID); err != nil || rep.ReleasedSlices != 0 {
		t.Errorf("the running pod's slice after a pass with a lagging cache: %v (report %+v), want kept", err, rep)
	}
}

// TestACreatingSpawnIsNotAbandonedWhileItMayCreateItsPod: with a grace
// period shorter than fleet.PodCreateWindow (the soak runs with 2 s), a
// spawn still creating its pod (the API server is slow to take it) was
// taken for an interrupted one and its slice released; the pod came a
// moment later onto room given away. A creating record is abandoned only
// after the pod create's deadline has passed.
func TestACreatingSpawnIsNotAbandonedWhileItMayCreateItsPod(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "dan", Name: "nb"}
	creatingSpawn(t, f, key, "s1")
	short := 2 * time.Second
	r := reconcile.New(f.Store, f.Pods, f.Service, f.Log, short, time.Hour, f.Clock.Now)
	f.Clock.Advance(fleet.PodCreateWindow - time.Second)
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if s, _ := f.Service.Get(ctx, key); s.State != v1.StateCreating {
		t.Errorf("inside the pod create window: state %s (%s), want creating untouched", s.State, s.Message)
	}
	if _, err := f.Store.Allocation(ctx, "s1"); err != nil {
		t.Errorf("inside the pod create window: %v, want the slice held", err)
	}
	f.Clock.Advance(fleet.RebuildFence)
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if s, _ := f.Service.Get(ctx, key); s.State != v1.StateFailed {
		t.Errorf("after the window: state %s, want failed as interrupted", s.State)
	}
	f.Verify(t)
}

// failingRestores is the store with RestoreServer failing while failing
// is set, as when Redis stops answering in the middle of a pass.
type failingRestores struct {
	*redisstore.Store
	failing atomic.Bool
}

func (f *failingRestores) RestoreServer(ctx context.Context, s fleet.Server) (bool, error) {
	if f.failing.Load() {
		return false, errors.New("connection reset by peer")
	}
	return f.Store.RestoreServer(ctx, s)
}

// TestTheRebuildWaitsForTheServersOfItsPods: a rebuild that restored a
// pod's slice but not its server record must not reopen: a create of that
// name would then record a new spawn and make the running pod look like a
// replaced spawn's, which the next pass deletes (the server lost).
func TestTheRebuildWaitsForTheServersOfItsPods(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	old := runningServer(t, f, "alice", "one", "10.0.0.1")
	if err := f.Redis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.RegisterGPUs(t)
	store := &failingRestores{Store: f.Store}
	store.failing.Store(true)
	r := reconcile.New(store, f.Pods, f.Service, f.Log, grace, time.Hour, f.Clock.Now)
	if _, err := r.Once(ctx); err == nil {
		t.Fatal("a pass whose restore failed reported no error")
	}
	f.Clock.Advance(fleet.RebuildFence)
	rep, err := r.Once(ctx)
	if err == nil || rep.Complete {
		t.Fatalf("pass after the fence with the record not restored: report %+v err %v, want incomplete", rep, err)
	}
	store.failing.Store(false)
	if rep, err = r.Once(ctx); err != nil || !rep.Complete || rep.RestoredServers != 1 {
		t.Fatalf("pass once restores work: report %+v err %v, want alice/one restored and complete", rep, err)
	}
	if got, err := f.Store.GetServer(ctx, old.ServerKey); err != nil || got.SpawnID != old.SpawnID {
		t.Errorf("alice/one after the rebuild: %+v, %v; want spawn %s", got, err, old.SpawnID)
	}
	f.Verify(t)
}

// TestARecordIsNotSettledWhileItsPodHasUnreadableAnnotations: a stopping
// server's pod, still terminating, whose slice annotation was overwritten
// with garbage (kubectl annotate, or another build's format) is still the
// server's pod: a pass must not take the record for one whose pod is gone
// and free its slice while the pod runs.
func TestARecordIsNotSettledWhileItsPodHasUnreadableAnnotations(t *testing.T) {
	f := serverstest.New(t)
	f.KeepDeletedPods(t)
	ctx := t.Context()
	rec := runningServer(t, f, "lena", "nb", "10.0.0.5")
	if s, err := f.Service.Delete(ctx, serverstest.By, rec.ServerKey); err != nil || s.State != v1.StateStopping {
		t.Fatalf("Delete = %s, %v; want stopping while the pod terminates", s.State, err)
	}
	pod := f.Pod(t, "lena", "nb")
	pod.Annotations[v1.AnnotationMemoryMiB] = "lots"
	if _, err := f.Kube.CoreV1().Pods(serverstest.Namespace).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.Clock.Advance(grace + time.Second)
	if _, err := newReconciler(f).Once(ctx); err != nil {
		t.Logf("pass: %v", err)
	}
	if _, err := f.Store.Allocation(ctx, rec.SpawnID); err != nil {
		t.Errorf("the slice of a terminating pod with unreadable annotations after a pass: %v, want kept", err)
	}
	if s, err := f.Service.Get(ctx, rec.ServerKey); err != nil || s.State != v1.StateStopping {
		t.Errorf("server %s (%v), want still stopping", s.State, err)
	}
}
