package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reconcile"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/spawner"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
		goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*flushDaemon).run"))
}

const grace = time.Minute

func newReconciler(f *serverstest.Fixture) *reconcile.Reconciler {
	return reconcile.New(f.Store, f.Pods, f.Service, f.Log, grace, time.Hour, f.Clock.Now)
}

// runningServer creates a server and drives its pod to running.
func runningServer(t *testing.T, f *serverstest.Fixture, user, name, ip string) fleet.Server {
	t.Helper()
	if _, _, err := f.Service.Create(t.Context(), serverstest.By, user, nil, name, v1.CreateServerRequest{Profile: "small"}, "k"); err != nil {
		t.Fatalf("create %s/%s: %v", user, name, err)
	}
	f.SetPodRunning(t, user, name, ip)
	return f.WaitState(t, fleet.ServerKey{User: user, Name: name}, v1.StateRunning)
}

func TestRebuildsAllocationsAndServersAfterRedisLostItsData(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	a := runningServer(t, f, "alice", "one", "10.0.0.1")
	b := runningServer(t, f, "bob", "two", "10.0.0.2")

	r := newReconciler(f)
	if _, err := r.Once(ctx); err != nil { // sees the data before it is lost
		t.Fatal(err)
	}
	if err := f.Redis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	_, _, err := f.Service.Create(ctx, serverstest.By, "carol", nil, "three", v1.CreateServerRequest{Profile: "small"}, "k")
	if !errors.Is(err, fleet.ErrNotReady) {
		t.Fatalf("create before the rebuild = %v, want ErrNotReady", err)
	}
	// Without inventory the slices cannot be restored, and placement stays shut.
	rep, err := r.Once(ctx)
	if err == nil || rep.Complete {
		t.Fatalf("pass without GPUs: report %+v err %v, want an error and not complete", rep, err)
	}
	f.RegisterGPUs(t)
	rep, err = r.Once(ctx)
	if err != nil {
		t.Fatalf("Once: %v", err)
	}
	if rep.Complete || rep.RestoredServers != 2 || rep.RestoredSlices != 2 {
		t.Errorf("report %+v, want 2 servers and 2 slices restored, not complete within the rebuild fence", rep)
	}
	// A spawn that placed on the lost data may still create its pod for
	// fleet.PodCreateWindow: placement reopens only after the fence.
	f.Clock.Advance(fleet.RebuildFence)
	if rep, err = r.Once(ctx); err != nil || !rep.Complete {
		t.Fatalf("pass after the fence: report %+v err %v, want complete", rep, err)
	}
	for _, want := range []fleet.Server{a, b} {
		got, err := f.Service.Get(ctx, want.ServerKey)
		if err != nil {
			t.Fatalf("get %v: %v", want.ServerKey, err)
		}
		if got.SpawnID != want.SpawnID || got.State != v1.StateRunning || got.URL != want.URL ||
			got.Allocation == nil || got.Allocation.GPUUUID != want.Allocation.GPUUUID {
			t.Errorf("restored %+v, want spawn %s running at %s on %s", got, want.SpawnID, want.URL, want.Allocation.GPUUUID)
		}
		// The rebuilt event stream starts at running and never steps back
		// to starting (a live page would show a progress bar again).
		evs, err := f.Service.Events(ctx, want.ServerKey, "", 0)
		if err != nil || len(evs) == 0 {
			t.Fatalf("events of %v after the rebuild: %v %v", want.ServerKey, evs, err)
		}
		for _, ev := range evs {
			if ev.State != v1.StateRunning {
				t.Errorf("event of %v after the rebuild: %s %q, want only running", want.ServerKey, ev.State, ev.Message)
			}
		}
	}
	f.Verify(t)

	// Placement resumes and counts the restored slices: binpack put both
	// small slices (10240 MiB each) on gpu-a, so one 30720 MiB slice fits
	// (on gpu-b) and a second does not.
	if _, _, err := f.Service.Create(ctx, serverstest.By, "u1", []string{"ml"}, "big", v1.CreateServerRequest{Profile: "big"}, "k"); err != nil {
		t.Fatalf("big slice after rebuild: %v", err)
	}
	_, _, err = f.Service.Create(ctx, serverstest.By, "u2", []string{"ml"}, "big", v1.CreateServerRequest{Profile: "big"}, "k")
	if !errors.Is(err, fleet.ErrNoCapacity) || !strings.Contains(err.Error(), "largest free block is 20 GiB") {
		t.Errorf("a second big slice = %v, want no capacity with 20480 MiB left on gpu-a", err)
	}
	f.Verify(t)
}

func TestSettlesSpawnsInterruptedBeforeTheirPod(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "dan", Name: "nb"}
	// A broker died after placing but before creating the pod.
	creatingSpawn(t, f, key, "s1")
	r := newReconciler(f)

	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if s, _ := f.Service.Get(ctx, key); s.State != v1.StateCreating {
		t.Fatalf("within the grace period: state %s, want creating untouched", s.State)
	}
	f.Clock.Advance(grace + time.Second)
	rep, err := r.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := f.Service.Get(ctx, key)
	if s.State != v1.StateFailed || !strings.Contains(s.Message, "interrupted") || rep.Settled != 1 {
		t.Errorf("after the grace period: %s %q (report %+v), want failed as interrupted", s.State, s.Message, rep)
	}
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 0 {
		t.Errorf("allocations %v, want the interrupted slice released", allocs)
	}
	f.Verify(t)
}

// creatingSpawn records server key's spawn as a create leaves it between
// placing its slice and creating its pod: a record in creating with its
// allocation, and no pod.
func creatingSpawn(t *testing.T, f *serverstest.Fixture, key fleet.ServerKey, spawn string) {
	t.Helper()
	ctx := t.Context()
	now := f.Clock.Now()
	if _, _, err := f.Store.CreateServer(ctx, fleet.Server{ServerKey: key, Profile: "small", SpawnID: spawn,
		IdempotencyKey: "k", State: v1.StatePending, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Transition(ctx, key, spawn, v1.StatePlacing, "placing", fleet.ServerPatch{}); err != nil {
		t.Fatal(err)
	}
	alloc, err := f.Store.Place(ctx, fleet.PlaceRequest{SliceID: spawn, User: key.User,
		Slice: fleet.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Transition(ctx, key, spawn, v1.StateCreating, "creating", fleet.ServerPatch{Allocation: &alloc}); err != nil {
		t.Fatal(err)
	}
}

func TestReleasesSlicesThatNoSpawnHolds(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	if _, err := f.Store.Place(ctx, fleet.PlaceRequest{SliceID: "ghost", User: "nobody",
		Slice: fleet.Slice{MemoryMiB: 2048, ComputePercent: 5, ComputeLimitPercent: 5}}); err != nil {
		t.Fatal(err)
	}
	rep, err := newReconciler(f).Once(ctx)
	if err != nil || rep.ReleasedSlices != 1 {
		t.Fatalf("report %+v err %v, want 1 slice released", rep, err)
	}
	f.Verify(t)
}

func TestDeletesPodsOfFinishedSpawnsAfterGrace(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	s := runningServer(t, f, "eve", "nb", "10.0.0.5")
	// The record finished but its pod stayed (a delete that never reached
	// the API server).
	if _, err := f.Store.Transition(ctx, s.ServerKey, s.SpawnID, v1.StateStopping, "stopping", fleet.ServerPatch{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Transition(ctx, s.ServerKey, s.SpawnID, v1.StateStopped, "stopped", fleet.ServerPatch{}); err != nil {
		t.Fatal(err)
	}
	r := newReconciler(f)
	if rep, err := r.Once(ctx); err != nil || rep.DeletedPods != 0 {
		t.Fatalf("within grace: report %+v err %v, want no pod deleted", rep, err)
	}
	// The slice stays held while the pod exists.
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 1 {
		t.Fatalf("allocations %v, want the pod's slice kept", allocs)
	}
	f.Clock.Advance(grace + time.Second)
	if rep, err := r.Once(ctx); err != nil || rep.DeletedPods != 1 {
		t.Fatalf("after grace: report %+v err %v, want 1 pod deleted", rep, err)
	}
	if _, err := f.Kube.CoreV1().Pods(serverstest.Namespace).Get(ctx, spawner.PodName("eve", "nb"), metav1.GetOptions{}); err == nil {
		t.Error("orphan pod still exists")
	}
}

func TestSettlesRunningServerWhosePodVanishedUnseen(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "gus", Name: "nb"}
	// A record that says running, with its slice, but no pod: the pod went
	// away while no broker was watching.
	now := f.Clock.Now()
	if _, _, err := f.Store.CreateServer(ctx, fleet.Server{ServerKey: key, Profile: "small", SpawnID: "s9",
		IdempotencyKey: "k", State: v1.StatePending, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	alloc, err := f.Store.Place(ctx, fleet.PlaceRequest{SliceID: "s9", User: "gus",
		Slice: fleet.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10}})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []v1.ServerState{v1.StatePlacing, v1.StateCreating, v1.StateStarting, v1.StateRunning} {
		if _, err := f.Store.Transition(ctx, key, "s9", st, string(st), fleet.ServerPatch{Allocation: &alloc}); err != nil {
			t.Fatal(err)
		}
	}
	f.Clock.Advance(grace + time.Second)
	if _, err := newReconciler(f).Once(ctx); err != nil {
		t.Fatal(err)
	}
	s, _ := f.Service.Get(ctx, key)
	if s.State != v1.StateStopped {
		t.Errorf("state %s (%s), want stopped", s.State, s.Message)
	}
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 0 {
		t.Errorf("allocations %v, want released", allocs)
	}
}

func TestNothingHappensBeforeThePodCacheSynced(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	if _, err := f.Store.Place(ctx, fleet.PlaceRequest{SliceID: "s1", User: "x",
		Slice: fleet.Slice{MemoryMiB: 1024, ComputePercent: 1, ComputeLimitPercent: 1}}); err != nil {
		t.Fatal(err)
	}
	unsynced := spawner.New(fake.NewClientset(), spawner.Config{Namespace: "x"}.WithDefaults(), slog.New(slog.DiscardHandler))
	r := reconcile.New(f.Store, unsynced, f.Service, f.Log, grace, time.Hour, f.Clock.Now)
	if _, err := r.Once(ctx); !errors.Is(err, spawner.ErrNotSynced) {
		t.Fatalf("Once = %v, want ErrNotSynced", err)
	}
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 1 {
		t.Errorf("allocations %v, want untouched", allocs)
	}
}

func TestRunStopsWithItsContext(t *testing.T) {
	f := serverstest.New(t)
	ctx, cancel := context.WithCancel(t.Context())
	r := newReconciler(f)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	r.Trigger()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestFinishesAStopWhosePodDeletionNeverHappened(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "hal", Name: "nb"}
	if _, _, err := f.Service.Create(ctx, serverstest.By, key.User, nil, key.Name, v1.CreateServerRequest{Profile: "small", SecretEnv: map[string]string{"TOKEN": "t"}}, "k"); err != nil {
		t.Fatal(err)
	}
	f.SetPodRunning(t, key.User, key.Name, "10.0.0.8")
	s := f.WaitState(t, key, v1.StateRunning)
	// The stop was recorded, but its pod deletion never reached the API
	// server (it was restarting, or the broker died in between).
	if _, err := f.Store.Transition(ctx, key, s.SpawnID, v1.StateStopping, "stopping: deleting the pod", fleet.ServerPatch{}); err != nil {
		t.Fatal(err)
	}
	rep, err := newReconciler(f).Once(ctx)
	if err != nil || rep.DeletedPods != 1 {
		t.Fatalf("report %+v err %v, want the stopping server's pod deleted", rep, err)
	}
	f.WaitState(t, key, v1.StateStopped)
	if _, err := f.Kube.CoreV1().Secrets(serverstest.Namespace).Get(ctx, spawner.SecretName(key.User, key.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("secret after the stop: err %v, want not found", err)
	}
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 0 {
		t.Errorf("allocations %v, want released", allocs)
	}
}

func TestDeletesSecretsNoSpawnHoldsAfterGrace(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	keep := fleet.ServerKey{User: "ivy", Name: "nb"}
	if _, _, err := f.Service.Create(ctx, serverstest.By, keep.User, nil, keep.Name, v1.CreateServerRequest{Profile: "small", SecretEnv: map[string]string{"TOKEN": "t"}}, "k"); err != nil {
		t.Fatal(err)
	}
	// A Secret whose server Redis no longer has and whose pod is gone, as
	// after a FLUSHALL that took a stopped server's record.
	orphan := spawner.Secret(spawner.Config{Namespace: serverstest.Namespace}.WithDefaults(),
		spawner.Spec{User: "joe", Server: "gone", SpawnID: "s-old"}, map[string]string{"TOKEN": "t"})
	if _, err := f.Kube.CoreV1().Secrets(serverstest.Namespace).Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := newReconciler(f)
	if rep, err := r.Once(ctx); err != nil || rep.DeletedSecrets != 0 {
		t.Fatalf("within grace: report %+v err %v, want no secret deleted", rep, err)
	}
	f.Clock.Advance(grace + time.Second)
	if rep, err := r.Once(ctx); err != nil || rep.DeletedSecrets != 1 {
		t.Fatalf("after grace: report %+v err %v, want 1 secret deleted", rep, err)
	}
	secrets := f.Kube.CoreV1().Secrets(serverstest.Namespace)
	if _, err := secrets.Get(ctx, orphan.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("orphan secret: err %v, want not found", err)
	}
	if _, err := secrets.Get(ctx, spawner.SecretName(keep.User, keep.Name), metav1.GetOptions{}); err != nil {
		t.Errorf("the live server's secret: %v, want kept", err)
	}
}

// recordingMetrics records ObserveReconcile calls.
type recordingMetrics struct{ passes []map[string]int }

func (m *recordingMetrics) ObserveReconcile(_ time.Duration, repairs map[string]int, _ bool) {
	m.passes = append(m.passes, repairs)
}

// TestResumesARecordThatFellBehindItsPod: after a Redis failover lost the
// writes that followed a confirmed placement, a running server's record
// is back at placing while its pod runs. A pass moves it on to running
// again with its slice, and reports the repair.
func TestResumesARecordThatFellBehindItsPod(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	want := runningServer(t, f, "alice", "one", "10.0.0.1")
	rdb := f.Redis.Client(t)
	keys, err := rdb.Keys(ctx, "*}:srv:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("server record keys %v (err %v), want one", keys, err)
	}
	if err := rdb.HSet(ctx, keys[0], "state", string(v1.StatePlacing), "alloc", "", "pod", "", "url", "").Err(); err != nil {
		t.Fatal(err)
	}
	r := newReconciler(f)
	m := &recordingMetrics{}
	r.SetMetrics(m)
	rep, err := r.Once(ctx)
	if err != nil {
		t.Fatalf("Once: %v", err)
	}
	if rep.ResumedServers != 1 {
		t.Errorf("report %+v, want one resumed server", rep)
	}
	got, err := f.Service.Get(ctx, want.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != v1.StateRunning || got.SpawnID != want.SpawnID || got.URL != want.URL ||
		got.Allocation == nil || got.Allocation.GPUUUID != want.Allocation.GPUUUID {
		t.Errorf("after the pass %+v, want spawn %s running at %s on %s", got, want.SpawnID, want.URL, want.Allocation.GPUUUID)
	}
	if len(m.passes) != 1 || m.passes[0]["resumed_server"] != 1 {
		t.Errorf("measured passes %v, want one with resumed_server 1", m.passes)
	}
	// A second pass has nothing left to do.
	if rep, err := r.Once(ctx); err != nil || rep.ResumedServers != 0 {
		t.Errorf("second pass: report %+v, err %v; want nothing resumed", rep, err)
	}
}

// TestSteadyPassReadsEachRecordOnce: at a fleet's steady state (every pod
// running, every record running) a pass reads the records in its one
// listing and replays nothing, so its Redis reads do not grow by a round
// trip per server, and it reads of each record only the fields it decides
// on (one HMGET), never the whole hash (Redis INFO commandstats counts the
// HGETALLs and HMGETs).
func TestSteadyPassReadsEachRecordOnce(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	const n = 5
	for i := range n {
		runningServer(t, f, fmt.Sprintf("user%d", i), "nb", fmt.Sprintf("10.0.0.%d", i+1))
	}
	r := newReconciler(f)
	if _, err := r.Once(ctx); err != nil { // the first pass may still catch up
		t.Fatal(err)
	}
	rdb := f.Redis.Client(t)
	calls := func(cmd string) int {
		t.Helper()
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
				calls, _, _ := strings.Cut(rest, ",")
				v, err := strconv.Atoi(calls)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
		return 0
	}
	hgetall, hmget := calls("hgetall"), calls("hmget")
	rep, err := r.Once(ctx)
	if err != nil || !rep.Complete || rep.Servers != n {
		t.Fatalf("steady pass: %+v %v, want %d servers, complete", rep, err, n)
	}
	// At most the allocations hash whole; each record's fields once.
	if got := calls("hgetall") - hgetall; got > 1 {
		t.Errorf("a steady pass over %d running servers sent %d HGETALLs, want at most 1 (the allocations; no whole record, no read per pod)", n, got)
	}
	if got := calls("hmget") - hmget; got != n {
		t.Errorf("a steady pass over %d running servers sent %d HMGETs, want %d (each record's fields once)", n, got, n)
	}
	f.Verify(t)
}

// replacedAfterALoss runs kim/nb, then Redis loses its data and a start of
// the same server gets a record of its own (and fails) before any pass
// restored the old one from its pod, which still runs: the pod belongs to
// no current spawn. CreateServer refuses a new spawn while the marker is
// missing (so a broker of today does not get here; one that recorded
// starts during a rebuild did), so the start is recorded under a marker
// set for it and removed again. It returns the old server.
func replacedAfterALoss(t *testing.T, f *serverstest.Fixture) fleet.Server {
	t.Helper()
	ctx := t.Context()
	old := runningServer(t, f, "kim", "nb", "10.0.0.9")
	rdb := f.Redis.Client(t)
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.RegisterGPUs(t)
	if err := f.Store.MarkReconciled(ctx); err != nil {
		t.Fatal(err)
	}
	now := f.Clock.Now()
	key := old.ServerKey
	if _, _, err := f.Store.CreateServer(ctx, fleet.Server{ServerKey: key, Profile: "small", SpawnID: "s-new",
		IdempotencyKey: "k2", State: v1.StatePending, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Transition(ctx, key, "s-new", v1.StateFailed, "refused", fleet.ServerPatch{}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, redisschema.New(f.Prefix).Marker()).Err(); err != nil {
		t.Fatal(err)
	}
	return old
}

func TestRebuildCountsThePodOfAnEarlierSpawnWhileItRuns(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	old := replacedAfterALoss(t, f)
	r := newReconciler(f)
	rep, err := r.Once(ctx)
	if err != nil || rep.RestoredSlices != 1 {
		t.Fatalf("report %+v err %v, want the old pod's slice restored", rep, err)
	}
	f.Clock.Advance(fleet.RebuildFence)
	if rep, err = r.Once(ctx); err != nil || !rep.Complete {
		t.Fatalf("pass after the fence: report %+v err %v, want the rebuild complete", rep, err)
	}
	allocs, err := f.Store.Allocations(ctx)
	if err != nil || len(allocs) != 1 || allocs[0].SliceID != old.SpawnID {
		t.Errorf("allocations %v (err %v), want the running pod's slice %s", allocs, err, old.SpawnID)
	}
}

// passCounter counts the passes a Reconciler reports (reconcile.Metrics)
// and signals each on passed (a buffer of one: a waiter rereads n).
type passCounter struct {
	n      atomic.Int64
	passed chan struct{}
}

func newPassCounter() *passCounter { return &passCounter{passed: make(chan struct{}, 1)} }

func (c *passCounter) ObserveReconcile(time.Duration, map[string]int, bool) {
	c.n.Add(1)
	select {
	case c.passed <- struct{}{}:
	default:
	}
}

// TestOnlyTheLeaderPassesPeriodically runs two reconcilers of one fleet
// side by side on the same short interval: while one leads, the other
// makes no periodic pass, only the one asked for with Trigger; when the
// leader is gone and the other takes the lead over, it passes at once and
// then every interval.
func TestOnlyTheLeaderPassesPeriodically(t *testing.T) {
	f := serverstest.New(t)
	runningServer(t, f, "ada", "nb", "10.0.0.1")
	start := func(leading bool) (*reconcile.Reconciler, *passCounter, context.CancelFunc) {
		r := reconcile.New(f.Store, f.Pods, f.Service, f.Log, grace, 5*time.Millisecond, f.Clock.Now)
		c := newPassCounter()
		r.SetMetrics(c)
		r.SetLeading(leading)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			<-done
		})
		return r, c, cancel
	}
	waitPasses := func(what string, c *passCounter, n int64) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for c.n.Load() < n {
			select {
			case <-c.passed:
			case <-deadline:
				t.Fatalf("%s made %d passes within 10 s, want %d", what, c.n.Load(), n)
			}
		}
	}
	_, leaderPasses, stopLeader := start(true)
	follower, followerPasses, _ := start(false)

	waitPasses("the leader", leaderPasses, 5)
	if n := followerPasses.n.Load(); n != 0 {
		t.Fatalf("the follower made %d passes while the leader made 5, want none", n)
	}
	follower.Trigger()
	waitPasses("the follower, asked", followerPasses, 1)
	waitPasses("the leader", leaderPasses, leaderPasses.n.Load()+5)
	if n := followerPasses.n.Load(); n != 1 {
		t.Fatalf("the follower made %d passes, want only the one asked for", n)
	}

	// The leader dies; the next holder of the Lease takes the lead over.
	stopLeader()
	follower.SetLeading(true)
	waitPasses("the new leader", followerPasses, 5)
}
