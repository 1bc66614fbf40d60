// Package serverstest builds the broker's lifecycle on real parts for tests:
// a real redis-server (broker/redistest), the real store, the real spawner
// Client over client-go's fake clientset, and the servers.Service, wired the
// way the composition root wires them. Pod status is driven by the test
// (SetPodRunning, SetPodWaiting), so every step is deterministic.
package serverstest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/catalog"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/spawner"
)

// Namespace holds the fixture's pods.
const Namespace = "notebooks"

// Catalog is the fixture's profiles and quotas: "small" for everyone,
// "big" for group ml only; alice may hold 2 servers and 40960 MiB.
const Catalog = `
profiles:
  - name: small
    displayName: Small
    image: example.org/notebook:1
    cpu: "1"
    memory: 2Gi
    slice: {memoryMiB: 10240, computePercent: 20, computeLimitPercent: 50}
  - name: big
    displayName: Big
    image: example.org/notebook:1
    cpu: "2"
    memory: 4Gi
    slice: {memoryMiB: 30720, computePercent: 50, computeLimitPercent: 100}
    groups: [ml]
quotas:
  defaultUser: {servers: 10}
  users:
    alice: {servers: 2, memoryMiB: 40960}
`

// GPUs are the fixture's two GPUs.
var GPUs = []fleet.GPU{
	{UUID: "gpu-a", Node: "n1", Model: "NVIDIA H200", MemoryMiB: 40960, SMCount: 132, Healthy: true},
	{UUID: "gpu-b", Node: "n2", Model: "NVIDIA H200", MemoryMiB: 40960, SMCount: 132, Healthy: true},
}

// Clock is a settable time source, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// By is the actor of the fixture's tests' lifecycle calls: a user acting
// on their own servers.
var By = audit.Actor{Name: "tester", Kind: v1.ActorUser}

// Fixture is one test's broker lifecycle.
type Fixture struct {
	Redis *redistest.Server
	Store *redisstore.Store
	// Audit is the audit log the service writes its actions to.
	Audit *redisstore.AuditLog
	// Prefix is the store's key prefix (redisschema.New(Prefix) names the
	// keys).
	Prefix  string
	Kube    *fake.Clientset
	Pods    *spawner.Client
	Service *servers.Service
	Catalog *catalog.Catalog
	Clock   *Clock
	Log     *slog.Logger
	// Releases are the ReleasePod calls of Service (it reaches Pods
	// through it).
	Releases *ReleaseLog

	mu      sync.Mutex
	handled []spawner.PodEvent // the pod events Service has handled, in order
	changed chan struct{}      // closed and replaced at each handled event
}

// New starts a fixture with two 40960 MiB GPUs, gpu-a on node n1 and gpu-b
// on node n2, and the allocations marked as rebuilt. Pod events reach the
// service as in the broker; everything stops in t.Cleanup. opts go to the
// service after the fixture's own (clock, spawn ids, audit).
func New(t testing.TB, opts ...servers.Option) *Fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rs := redistest.Start(t)
	clock := &Clock{now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	log := slog.New(slog.DiscardHandler)
	client := rs.Client(t)
	client.AddHook(redisstore.OutageHook{})
	prefix := rs.Prefix(t)
	store := redisstore.New(client, prefix, redisstore.WithClock(clock.Now))
	auditLog := redisstore.NewAuditLog(client, prefix, nil)
	cat, err := catalog.Parse([]byte(Catalog))
	if err != nil {
		t.Fatalf("catalog: %v", err)
	}
	kube := fake.NewClientset()
	// The fake API server stamps nothing; give created objects the creation
	// time and UID a real one would, from the fixture's clock.
	uids := 0
	kube.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if obj, ok := action.(k8stesting.CreateAction).GetObject().(metav1.Object); ok {
			uids++
			obj.SetCreationTimestamp(metav1.NewTime(clock.Now()))
			obj.SetUID(types.UID(fmt.Sprintf("uid-%d", uids)))
		}
		return false, nil, nil
	})
	// A patch the fake cannot apply (a failed JSON patch test) is answered
	// as the API server answers it, 422, not with the fake's bare error.
	apply := k8stesting.ObjectReaction(kube.Tracker())
	kube.PrependReactor("patch", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		handled, obj, err := apply(action)
		var st apierrors.APIStatus
		if err != nil && !errors.As(err, &st) {
			err = apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", err.Error(), 0, false)
		}
		return handled, obj, err
	})
	pods := spawner.New(kube, spawner.Config{Namespace: Namespace}.WithDefaults(), log, spawner.WithClock(clock.Now))
	releases := &ReleaseLog{Pods: pods, Store: store}
	ids := 0
	var idsMu sync.Mutex
	svc := servers.New(store, releases, cat, log, append([]servers.Option{servers.WithClock(clock.Now), servers.WithSpawnIDs(func() string {
		idsMu.Lock()
		defer idsMu.Unlock()
		ids++
		return fmt.Sprintf("spawn%03d", ids)
	}), servers.WithAudit(auditLog)}, opts...)...)
	f := &Fixture{Redis: rs, Store: store, Audit: auditLog, Prefix: prefix, Kube: kube, Pods: pods, Service: svc, Catalog: cat, Clock: clock, Log: log,
		Releases: releases, changed: make(chan struct{})}

	var wg sync.WaitGroup
	wg.Go(func() { _ = pods.Run(ctx) })
	events := make(chan spawner.PodEvent, 256)
	pods.Subscribe(ctx, func(ev spawner.PodEvent) {
		select {
		case events <- ev:
		case <-ctx.Done():
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-events:
				_ = svc.HandlePodEvent(ctx, ev)
				f.mu.Lock()
				f.handled = append(f.handled, ev)
				close(f.changed)
				f.changed = make(chan struct{})
				f.mu.Unlock()
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	if err := pods.WaitSynced(ctx); err != nil {
		t.Fatalf("spawner sync: %v", err)
	}
	f.RegisterGPUs(t)
	if err := store.MarkReconciled(ctx); err != nil {
		t.Fatalf("mark reconciled: %v", err)
	}
	return f
}

// Pod returns the current pod of a server from the API server.
func (f *Fixture) Pod(t testing.TB, user, server string) *corev1.Pod {
	t.Helper()
	p, err := f.Kube.CoreV1().Pods(Namespace).Get(t.Context(), spawner.PodName(user, server), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod of %s/%s: %v", user, server, err)
	}
	return p
}

// EndPod makes a server's pod ended as the API server keeps it when the
// final delete (grace period 0) came while it held gpubroker's finalizer
// (the fake clientset would remove it at once), and waits until the
// spawner's cache has seen it so (its gone event).
func (f *Fixture) EndPod(t testing.TB, user, server string) {
	t.Helper()
	p := f.Pod(t, user, server).DeepCopy()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	seen := make(chan struct{})
	var once sync.Once
	f.Pods.Subscribe(ctx, func(ev spawner.PodEvent) {
		if ev.Pod == p.Name && ev.Phase == spawner.PhaseGone && ev.Held {
			once.Do(func() { close(seen) })
		}
	})
	now, zero := metav1.NewTime(f.Clock.Now()), int64(0)
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, &zero
	if _, err := f.Kube.CoreV1().Pods(Namespace).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("end pod %s: %v", p.Name, err)
	}
	select {
	case <-seen:
	case <-ctx.Done():
		t.Fatalf("the spawner did not see pod %s end within 10s", p.Name)
	}
}

// SetPodRunning makes a server's pod Ready with the given IP, as a kubelet would.
func (f *Fixture) SetPodRunning(t testing.TB, user, server, ip string) {
	t.Helper()
	p := f.Pod(t, user, server).DeepCopy()
	now := metav1.NewTime(f.Clock.Now())
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
		},
		ContainerStatuses: []corev1.ContainerStatus{{Name: spawner.ContainerName, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
	}
	f.updateStatus(t, p)
}

// SetPodWaiting puts a server's pod's container in a waiting state with the
// given reason (for example CrashLoopBackOff).
func (f *Fixture) SetPodWaiting(t testing.TB, user, server, reason, message string) {
	t.Helper()
	p := f.Pod(t, user, server).DeepCopy()
	p.Status = corev1.PodStatus{
		Phase:      corev1.PodPending,
		Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: spawner.ContainerName, RestartCount: 5,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}}},
	}
	f.updateStatus(t, p)
}

func (f *Fixture) updateStatus(t testing.TB, p *corev1.Pod) {
	t.Helper()
	if _, err := f.Kube.CoreV1().Pods(Namespace).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status of %s: %v", p.Name, err)
	}
}

// WaitState waits until the server's state is want, blocking on its event
// stream between looks; it fails the test after a deadline with the last
// state seen.
func (f *Fixture) WaitState(t testing.TB, key fleet.ServerKey, want fleet.State) fleet.Server {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last fleet.Server
	lastID := ""
	for time.Now().Before(deadline) {
		s, err := f.Service.Get(t.Context(), key)
		if err == nil && s.State == want {
			return s
		}
		last = s
		evs, err := f.Service.Events(t.Context(), key, lastID, 200*time.Millisecond)
		if err == nil && len(evs) > 0 {
			lastID = evs[len(evs)-1].ID
		}
	}
	t.Fatalf("server %s/%s: state %q (%s), want %q", key.User, key.Name, last.State, last.Message, want)
	return last
}

// RegisterGPUs registers the fixture's GPUs again, as the node agents'
// heartbeats would after Redis lost its data.
func (f *Fixture) RegisterGPUs(t testing.TB) {
	t.Helper()
	for _, g := range GPUs {
		if err := f.Store.RegisterGPU(t.Context(), g); err != nil {
			t.Fatalf("register %s: %v", g.UUID, err)
		}
	}
}

// Verify fails the test if any store invariant is broken.
func (f *Fixture) Verify(t testing.TB) {
	t.Helper()
	if err := f.Store.Verify(t.Context()); err != nil {
		t.Fatalf("store invariants: %v", err)
	}
}

// WaitHandled waits until Service has handled a pod event that match
// accepts (HandlePodEvent returned), failing the test after a deadline.
func (f *Fixture) WaitHandled(t testing.TB, what string, match func(spawner.PodEvent) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		f.mu.Lock()
		changed := f.changed
		found := slices.ContainsFunc(f.handled, match)
		f.mu.Unlock()
		if found {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("the fixture's replica did not handle %s within 10s", what)
		}
	}
}

// KeepDeletedPods makes the fake API server delete a pod as the real one
// does while the pod holds finalizers: the pod stays, marked for deletion
// with the grace period asked for (30 s by default: terminating, not
// ended), and only a pod without finalizers is removed at once. (The fake
// clientset removes every deleted object at once.)
func (f *Fixture) KeepDeletedPods(t testing.TB) {
	t.Helper()
	f.Kube.PrependReactor("delete", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		del := action.(k8stesting.DeleteAction)
		obj, err := f.Kube.Tracker().Get(action.GetResource(), action.GetNamespace(), del.GetName())
		if err != nil {
			return false, nil, nil // the fake answers as it does
		}
		p := obj.(*corev1.Pod).DeepCopy()
		if len(p.Finalizers) == 0 || p.DeletionTimestamp != nil {
			return p.DeletionTimestamp != nil, nil, nil
		}
		grace := int64(30)
		if g := del.GetDeleteOptions().GracePeriodSeconds; g != nil {
			grace = *g
		}
		now := metav1.NewTime(f.Clock.Now())
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, &grace
		return true, nil, f.Kube.Tracker().Update(action.GetResource(), p, action.GetNamespace())
	})
}

// ReleaseLog is a servers.Pods that notes each ReleasePod call before it
// passes it on, with the state of the record of the released spawn in
// Store at that moment.
type ReleaseLog struct {
	servers.Pods
	// Store is where the state of the released spawn's record is read;
	// nil: not read.
	Store servers.Store

	mu    sync.Mutex
	calls []Release
}

// Release is one ReleasePod call that a ReleaseLog saw.
type Release struct {
	Pod, SpawnID string
	// State is the state of the spawn's record when the call came, ""
	// when there was none or the log has no Store.
	State fleet.State
}

// ReleasePod notes the call, then passes it on.
func (l *ReleaseLog) ReleasePod(ctx context.Context, name, spawnID string) error {
	r := Release{Pod: name, SpawnID: spawnID}
	if l.Store != nil {
		recs, err := l.Store.ListServers(ctx, "")
		if err != nil {
			return err
		}
		if i := slices.IndexFunc(recs, func(s fleet.Server) bool { return s.SpawnID == spawnID }); i >= 0 {
			r.State = recs[i].State
		}
	}
	l.mu.Lock()
	l.calls = append(l.calls, r)
	l.mu.Unlock()
	return l.Pods.ReleasePod(ctx, name, spawnID)
}

// Calls returns the calls noted so far, in order.
func (l *ReleaseLog) Calls() []Release {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// RecordStopped records rec's spawn stopping and then stopped, without its
// slice, in the store alone: what the replica that records a stop writes
// before it releases the pod, as if it died right after.
func (f *Fixture) RecordStopped(t testing.TB, rec fleet.Server) {
	t.Helper()
	for _, to := range []fleet.State{v1.StateStopping, v1.StateStopped} {
		if _, err := f.Store.Transition(t.Context(), rec.ServerKey, rec.SpawnID, to, string(to), fleet.ServerPatch{DropAllocation: to == v1.StateStopped}); err != nil {
			t.Fatalf("record %s/%s %s: %v", rec.User, rec.Name, to, err)
		}
	}
}
