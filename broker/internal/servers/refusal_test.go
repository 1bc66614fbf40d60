package servers_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
)

// TestRefusedStartLeavesNothing: whatever refuses a start (quota, room,
// the rebuild after a Redis loss, the cluster refusing the pod), no
// server, slice, pod or event of it is left, the key is not spent (the
// same-key retry runs again and succeeds once the cause is gone), and a
// stopped server of that name comes back exactly as it was.
func TestRefusedStartLeavesNothing(t *testing.T) {
	small := v1.CreateServerRequest{Profile: "small"}
	tests := []struct {
		name string
		// refuse makes the next start of alice/nb refusable; it returns
		// the undo that lets the retry pass.
		refuse  func(t *testing.T, f *serverstest.Fixture) func()
		wantErr error
		wantMsg string
	}{
		{
			name: "quota", wantErr: fleet.ErrQuotaExceeded, wantMsg: "user alice quota exceeded: you have 0 of 2 servers left (2 in use)",
			refuse: func(t *testing.T, f *serverstest.Fixture) func() {
				for _, n := range []string{"q1", "q2"} {
					if _, _, err := f.Service.Create(t.Context(), serverstest.By, "alice", nil, n, small, n); err != nil {
						t.Fatal(err)
					}
				}
				return func() {
					q1 := fleet.ServerKey{User: "alice", Name: "q1"}
					if _, err := f.Service.Delete(t.Context(), serverstest.By, q1); err != nil {
						t.Fatal(err)
					}
					f.WaitState(t, q1, v1.StateStopped)
				}
			},
		},
		{
			name: "rebuild after a Redis loss", wantErr: fleet.ErrNotReady, wantMsg: "GPU allocations are being rebuilt",
			refuse: func(t *testing.T, f *serverstest.Fixture) func() {
				if err := f.Redis.Client(t).Del(t.Context(), redisschema.New(f.Prefix).Marker()).Err(); err != nil {
					t.Fatal(err)
				}
				return func() {
					if err := f.Store.MarkReconciled(t.Context()); err != nil {
						t.Fatal(err)
					}
				}
			},
		},
		{
			name: "the cluster refuses the pod", wantErr: fleet.ErrConflict, wantMsg: "the cluster refused the notebook pod",
			refuse: func(t *testing.T, f *serverstest.Fixture) func() {
				refusing := true
				f.Kube.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
					if !refusing {
						return false, nil, nil
					}
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("exceeded quota: no-pods"))
				})
				return func() { refusing = false }
			},
		},
	}
	for _, tc := range tests {
		for _, before := range []string{"new", "stopped"} {
			t.Run(tc.name+"/"+before, func(t *testing.T) {
				f := serverstest.New(t)
				ctx := t.Context()
				key := fleet.ServerKey{User: "alice", Name: "nb"}
				var prev fleet.Server
				var prevEvents []fleet.Event
				if before == "stopped" {
					if _, _, err := f.Service.Create(ctx, serverstest.By, "alice", nil, "nb", small, "k0"); err != nil {
						t.Fatal(err)
					}
					if _, err := f.Service.Delete(ctx, serverstest.By, key); err != nil {
						t.Fatal(err)
					}
					prev = f.WaitState(t, key, v1.StateStopped)
					prevEvents, _ = f.Service.Events(ctx, key, "", 0)
				}
				undo := tc.refuse(t, f)
				allocs := mustAllocs(t, f)
				_, _, err := f.Service.Create(ctx, serverstest.By, "alice", nil, "nb", small, "k1")
				if !errors.Is(err, tc.wantErr) || !strings.Contains(fleet.Message(err), tc.wantMsg) {
					t.Fatalf("refused start: %v, want %v saying %q", err, tc.wantErr, tc.wantMsg)
				}
				got, gerr := f.Service.Get(ctx, key)
				if before == "new" && !errors.Is(gerr, fleet.ErrNotFound) {
					t.Errorf("after a refused start: %+v (%v), want no server", got, gerr)
				}
				if before == "stopped" {
					if diff := cmp.Diff(prev, got); diff != "" {
						t.Errorf("the stopped server after a refused start (-before +after):\n%s", diff)
					}
					evs, _ := f.Service.Events(ctx, key, "", 0)
					if diff := cmp.Diff(prevEvents, evs); diff != "" {
						t.Errorf("events after a refused start (-before +after):\n%s", diff)
					}
				}
				if diff := cmp.Diff(allocs, mustAllocs(t, f)); diff != "" {
					t.Errorf("allocations after the refused start (-before +after):\n%s", diff)
				}
				if p, err := f.Pods.Pods(); err == nil {
					for _, mp := range p {
						if mp.User == "alice" && mp.Server == "nb" {
							t.Errorf("pod %s left by the refused start", mp.Name)
						}
					}
				}
				f.Verify(t)

				undo()
				s, created, err := f.Service.Create(ctx, serverstest.By, "alice", nil, "nb", small, "k1")
				if err != nil || !created || s.State != v1.StateStarting {
					t.Fatalf("same-key retry after the refusal: %v, created %v, state %s; want a new start", err, created, s.State)
				}
			})
		}
	}
}

func mustAllocs(t *testing.T, f *serverstest.Fixture) []fleet.Allocation {
	t.Helper()
	a, err := f.Store.Allocations(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestFailedAndStoppedServers: a failed server keeps its reason through
// a stop until the next start; stopped and failed servers hold no GPU and
// can be removed; a live one cannot, and says so in words.
func TestFailedAndStoppedServers(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "erin", Name: "nb"}
	if _, _, err := f.Service.Create(ctx, serverstest.By, "erin", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k"); err != nil {
		t.Fatal(err)
	}
	if err := f.Service.Remove(ctx, serverstest.By, key); !errors.Is(err, fleet.ErrConflict) || fleet.Message(err) != "nb is starting; stop it before removing it" {
		t.Errorf("remove while starting: %v", err)
	}
	f.SetPodWaiting(t, "erin", "nb", "CrashLoopBackOff", "back-off restarting failed container")
	f.WaitState(t, key, v1.StateFailed)
	waitPodGone(t, f, key) // a failed spawn's slice is freed once its pod is gone
	failed, err := f.Service.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if failed.Allocation != nil {
		t.Errorf("a failed server holds %+v", failed.Allocation)
	}
	after, err := f.Service.Delete(ctx, serverstest.By, key)
	if err != nil || after.State != v1.StateFailed || after.Message != failed.Message {
		t.Errorf("stop of a failed server: %s %q (%v), want it failed with %q", after.State, after.Message, err, failed.Message)
	}
	if err := f.Service.Remove(ctx, serverstest.By, key); err != nil {
		t.Fatalf("remove a failed server: %v", err)
	}
	if _, err := f.Service.Get(ctx, key); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("after remove: %v, want not found", err)
	}
	if evs, err := f.Store.Events(ctx, key, "", 0); err != nil || len(evs) != 0 {
		t.Errorf("events after remove: %v %v, want none", evs, err)
	}
	if err := f.Service.Remove(ctx, serverstest.By, key); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("second remove: %v, want not found", err)
	}

	// A stopped server holds no GPU either.
	if _, _, err := f.Service.Create(ctx, serverstest.By, "erin", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k2"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Service.Delete(ctx, serverstest.By, key); err != nil {
		t.Fatal(err)
	}
	if s := f.WaitState(t, key, v1.StateStopped); s.Allocation != nil {
		t.Errorf("a stopped server holds %+v", s.Allocation)
	}
	f.Verify(t)
}

// TestStateConflictsSpeakToTheUser: a start of a server that is still
// stopping is refused in the user's words, and leaves it stopping.
func TestStateConflictsSpeakToTheUser(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "rita", Name: "nb"}
	if _, _, err := f.Service.Create(ctx, serverstest.By, "rita", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k1"); err != nil {
		t.Fatal(err)
	}
	f.SetPodRunning(t, "rita", "nb", "10.0.0.3")
	f.WaitState(t, key, v1.StateRunning)
	// The pod lingers (a finalizer, a slow kubelet): the server stays stopping.
	f.Kube.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, nil })
	if s, err := f.Service.Delete(ctx, serverstest.By, key); err != nil || s.State != v1.StateStopping {
		t.Fatalf("stop: %s %v, want stopping", s.State, err)
	}
	_, _, err := f.Service.Create(ctx, serverstest.By, "rita", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k2")
	if got, want := fleet.Message(err), "nb is still stopping; start it again when it has stopped"; !errors.Is(err, fleet.ErrConflict) || got != want {
		t.Errorf("start while stopping: %v (%q), want %q", err, got, want)
	}
	if s, _ := f.Service.Get(ctx, key); s.State != v1.StateStopping {
		t.Errorf("state after the refused start: %s, want stopping", s.State)
	}
}

// TestLifecycleActionsAreAudited: create, stop, resize and remove each
// write one entry naming the actor, its kind, the server and the inputs;
// a refused create is audited as refused, with the reason.
func TestLifecycleActionsAreAudited(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "alice", Name: "nb"}
	hub := audit.Actor{Name: "jupyterhub", Kind: v1.ActorHub}
	admin := audit.Actor{Name: "root", Kind: v1.ActorAdmin}
	s, _, err := f.Service.Create(ctx, hub, "alice", nil, "nb", v1.CreateServerRequest{Profile: "small", Env: map[string]string{"B": "2", "A": "1"}}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Service.Create(ctx, hub, "alice", nil, "x", v1.CreateServerRequest{Profile: "small"}, "k2"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Service.Create(ctx, hub, "alice", nil, "y", v1.CreateServerRequest{Profile: "small"}, "k3"); !errors.Is(err, fleet.ErrQuotaExceeded) {
		t.Fatalf("create past the servers quota: %v", err)
	}
	if _, err := f.Service.Delete(ctx, admin, key); err != nil {
		t.Fatal(err)
	}
	f.WaitState(t, key, v1.StateStopped)
	if err := f.Service.Remove(ctx, serverstest.By, key); err != nil {
		t.Fatal(err)
	}
	entries, _, err := f.Audit.Audit(ctx, audit.Query{Source: v1.AuditSourceServers, User: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ Actor, Kind, Action, Target, Reason, Outcome, Profile, Env, Spawn string }
	var got []row
	for _, e := range entries {
		got = append(got, row{e.Actor, e.ActorKind, e.Action, e.Target, e.Reason, e.Inputs["outcome"], e.Inputs["profile"], e.Inputs["env"], e.Inputs["spawnId"]})
	}
	want := []row{ // newest first
		{"tester", v1.ActorUser, "server.remove", "server:alice/nb", "", "done", "small", "", s.SpawnID},
		{"root", v1.ActorAdmin, "server.stop", "server:alice/nb", "", "done", "", "", s.SpawnID},
		{"jupyterhub", v1.ActorHub, "server.create", "server:alice/y", "user alice quota exceeded: you have 0 of 2 servers left (2 in use)", "refused", "small", "", "spawn003"},
		{"jupyterhub", v1.ActorHub, "server.create", "server:alice/x", "", "done", "small", "", "spawn002"},
		{"jupyterhub", v1.ActorHub, "server.create", "server:alice/nb", "", "done", "small", "A,B", s.SpawnID},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("audit entries (-want +got):\n%s", diff)
	}
	if len(entries) > 0 && (entries[len(entries)-1].Inputs["memoryMiB"] != "10240" || entries[len(entries)-1].Source != v1.AuditSourceServers) {
		t.Errorf("create entry %+v, want the slice and source servers", entries[len(entries)-1])
	}
}

// TestOutageMidStartIsNotAFailure: when the Kubernetes API server or Redis
// stops answering, the answer names it and says the outcome is unknown;
// the start is not recorded as failed, and the same-key retry carries it
// on from where it stopped.
func TestOutageMidStartIsNotAFailure(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "olga", Name: "nb"}
	down := true
	f.Kube.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down {
			return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
		}
		return false, nil, nil
	})
	_, _, err := f.Service.Create(ctx, serverstest.By, "olga", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k1")
	var ue *fleet.UnavailableError
	if !errors.As(err, &ue) || ue.Part != fleet.PartKubernetes || ue.Unknown == "" {
		t.Fatalf("create while the API server is down: %v, want an outage of the Kubernetes API server with an unknown outcome", err)
	}
	if s, err := f.Service.Get(ctx, key); err != nil || s.State != v1.StateCreating || s.Allocation == nil {
		t.Fatalf("after the outage: %s (%v), want still creating with its slice", s.State, err)
	}
	down = false
	s, created, err := f.Service.Create(ctx, serverstest.By, "olga", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k1")
	if err != nil || created || s.State != v1.StateStarting {
		t.Fatalf("same-key retry: %v, created %v, state %s; want the start carried on to starting", err, created, s.State)
	}
	f.Pod(t, "olga", "nb")
	f.Verify(t)

	// Redis gone: every answer names it, and nothing claims to have failed.
	f.Redis.Stop()
	_, _, err = f.Service.Create(ctx, serverstest.By, "olga", nil, "nb2", v1.CreateServerRequest{Profile: "small"}, "k2")
	if !errors.As(err, &ue) || ue.Part != fleet.PartRedis {
		t.Errorf("create with Redis down: %v, want an outage of Redis", err)
	}
	if _, err = f.Service.Delete(ctx, serverstest.By, key); !errors.As(err, &ue) || ue.Part != fleet.PartRedis {
		t.Errorf("stop with Redis down: %v, want an outage of Redis", err)
	}
}

// TestACreateRefusedDuringARebuildAsksForAPass: a create refused because
// the data is being rebuilt (the marker is missing) asks the reconciler
// for a pass, so the rebuild does not wait for the Lease holder's next
// periodic one.
func TestACreateRefusedDuringARebuildAsksForAPass(t *testing.T) {
	kicks := 0
	f := serverstest.New(t, servers.WithReconcileTrigger(func() { kicks++ }))
	ctx := t.Context()
	if err := f.Redis.Client(t).Del(ctx, redisschema.New(f.Prefix).Marker()).Err(); err != nil {
		t.Fatal(err)
	}
	_, _, err := f.Service.Create(ctx, serverstest.By, "alice", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k1")
	if !errors.Is(err, fleet.ErrNotReady) {
		t.Fatalf("create during a rebuild: %v, want fleet.ErrNotReady", err)
	}
	if kicks != 1 {
		t.Errorf("the refused create asked for %d passes, want 1", kicks)
	}
}
