package servers_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/catalog"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/spawner"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
		goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*flushDaemon).run"))
}

func TestCreateRunsToRunningAndDeleteFreesTheSlice(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "alice", Name: "lab"}

	s, created, err := f.Service.Create(ctx, serverstest.By, "alice", nil, "lab", v1.CreateServerRequest{Profile: "small"}, "k1")
	if err != nil || !created {
		t.Fatalf("Create = %v, created %v", err, created)
	}
	if s.State != v1.StateStarting || s.Allocation == nil || s.Pod != spawner.PodName("alice", "lab") {
		t.Fatalf("after create: %+v, want starting with an allocation and a pod", s)
	}
	pod := f.Pod(t, "alice", "lab")
	if pod.Spec.NodeName != s.Allocation.Node || pod.Annotations[v1.AnnotationGPUUUID] != s.Allocation.GPUUUID {
		t.Errorf("pod pinned to %s/%s, want the placed %s/%s", pod.Spec.NodeName, pod.Annotations[v1.AnnotationGPUUUID], s.Allocation.Node, s.Allocation.GPUUUID)
	}

	f.SetPodRunning(t, "alice", "lab", "10.0.0.7")
	s = f.WaitState(t, key, v1.StateRunning)
	if s.URL != "http://10.0.0.7:8888" {
		t.Errorf("URL = %q, want http://10.0.0.7:8888", s.URL)
	}
	evs, err := f.Service.Events(ctx, key, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var states []v1.ServerState
	for _, e := range evs {
		if len(states) == 0 || states[len(states)-1] != e.State {
			states = append(states, e.State)
		}
	}
	want := []v1.ServerState{v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting, v1.StateRunning}
	if diff := cmp.Diff(want, states); diff != "" {
		t.Errorf("event states (-want +got):\n%s", diff)
	}

	s, err = f.Service.Delete(ctx, serverstest.By, key)
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if s.State != v1.StateStopping && s.State != v1.StateStopped {
		t.Errorf("after delete: state %s, want stopping or stopped", s.State)
	}
	if stopped := f.WaitState(t, key, v1.StateStopped); stopped.URL != "" {
		t.Errorf("stopped server still has URL %q", stopped.URL)
	}
	allocs, err := f.Store.Allocations(ctx)
	if err != nil || len(allocs) != 0 {
		t.Errorf("allocations after stop = %v (err %v), want none", allocs, err)
	}
	if _, err := f.Service.Delete(ctx, serverstest.By, key); err != nil {
		t.Errorf("second Delete = %v, want nil (idempotent)", err)
	}
	if _, err := f.Service.Delete(ctx, serverstest.By, fleet.ServerKey{User: "alice", Name: "never"}); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("Delete of a server that never existed = %v, want ErrNotFound", err)
	}
	f.Verify(t)
}

func TestCreateIsIdempotentPerKey(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	first, _, err := f.Service.Create(ctx, serverstest.By, "bob", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "same")
	if err != nil {
		t.Fatal(err)
	}
	again, created, err := f.Service.Create(ctx, serverstest.By, "bob", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "same")
	if err != nil || created || again.SpawnID != first.SpawnID {
		t.Errorf("retry with the same key: spawn %s created %v err %v, want spawn %s, not created", again.SpawnID, created, err, first.SpawnID)
	}
	_, _, err = f.Service.Create(ctx, serverstest.By, "bob", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "other")
	if !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("create with another key while starting = %v, want ErrConflict", err)
	}
	_, _, err = f.Service.Create(ctx, serverstest.By, "bob", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "")
	if !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("create without a key while starting = %v, want ErrConflict", err)
	}
	allocs, _ := f.Store.Allocations(ctx)
	if len(allocs) != 1 {
		t.Errorf("%d allocations, want 1", len(allocs))
	}
}

func TestKeylessCreateStartsAgainAfterStop(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "bob", Name: "nb"}
	first, _, err := f.Service.Create(ctx, serverstest.By, "bob", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Service.Delete(ctx, serverstest.By, key); err != nil {
		t.Fatal(err)
	}
	f.WaitState(t, key, v1.StateStopped)
	second, created, err := f.Service.Create(ctx, serverstest.By, "bob", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "")
	if err != nil || !created || second.SpawnID == first.SpawnID {
		t.Fatalf("keyless create after stop: spawn %s created %v err %v, want a new spawn", second.SpawnID, created, err)
	}
}

func TestRefusals(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	// Fill both GPUs' memory: 3 × 10240 + 1 × 30720 would be needed; alice's
	// quota is 2 servers and 40960 MiB, so use other users.
	for i, u := range []string{"u1", "u2"} {
		if _, _, err := f.Service.Create(ctx, serverstest.By, u, []string{"ml"}, "big", v1.CreateServerRequest{Profile: "big"}, "k"); err != nil {
			t.Fatalf("fill %d: %v", i, err)
		}
	}
	tests := []struct {
		name    string
		user    string
		groups  []string
		server  string
		req     v1.CreateServerRequest
		wantErr error
		wantMsg string
	}{
		{name: "unknown profile", user: "carol", server: "a", req: v1.CreateServerRequest{Profile: "huge"},
			wantErr: fleet.ErrInvalid, wantMsg: `there is no profile "huge"`},
		{name: "profile for another group", user: "carol", server: "a", req: v1.CreateServerRequest{Profile: "big"},
			wantErr: fleet.ErrForbidden, wantMsg: `profile "big" is not offered to your groups`},
		{name: "no room on any GPU", user: "carol", groups: []string{"ml"}, server: "a", req: v1.CreateServerRequest{Profile: "big"},
			wantErr: fleet.ErrNoCapacity, wantMsg: "no GPU has 30 GiB free; the largest free block is 10 GiB on node n1"},
		{name: "reserved env", user: "carol", server: "b", req: v1.CreateServerRequest{Profile: "small", Env: map[string]string{"LD_PRELOAD": "/x.so"}},
			wantErr: fleet.ErrInvalid, wantMsg: "LD_PRELOAD is set by gpubroker"},
		// Only the hub sets JupyterHub's variables: a pod that carries them
		// passes for a hub-started notebook (its path prefix, its token).
		{name: "a user's hub env", user: "carol", server: "b", req: v1.CreateServerRequest{Profile: "small", Env: map[string]string{"JUPYTERHUB_SERVICE_PREFIX": "@attacker.example/"}},
			wantErr: fleet.ErrInvalid, wantMsg: "JUPYTERHUB_SERVICE_PREFIX is JupyterHub's to set"},
		{name: "a user's hub secret env", user: "carol", server: "b", req: v1.CreateServerRequest{Profile: "small", SecretEnv: map[string]string{"jupyterhub_api_token": "x"}},
			wantErr: fleet.ErrInvalid, wantMsg: "jupyterhub_api_token is JupyterHub's to set"},
		{name: "bad server name", user: "carol", server: "a/b", req: v1.CreateServerRequest{Profile: "small"},
			wantErr: fleet.ErrInvalid, wantMsg: `contains '/'`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := f.Service.Create(ctx, serverstest.By, tc.user, tc.groups, tc.server, tc.req, "k-"+tc.name)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if msg := fleet.Message(err); !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("message %q does not contain %q", msg, tc.wantMsg)
			}
		})
	}
	// A refused start leaves nothing behind.
	if s, err := f.Service.Get(ctx, fleet.ServerKey{User: "carol", Name: "a"}); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("refused server: %+v (err %v), want none", s, err)
	}
	f.Verify(t)
}

func TestUserQuota(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	for _, name := range []string{"one", "two"} {
		if _, _, err := f.Service.Create(ctx, serverstest.By, "alice", nil, name, v1.CreateServerRequest{Profile: "small"}, "k"); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	_, _, err := f.Service.Create(ctx, serverstest.By, "alice", nil, "three", v1.CreateServerRequest{Profile: "small"}, "k")
	var qe *fleet.QuotaError
	if !errors.As(err, &qe) || qe.Scope != "user" || qe.Name != "alice" || qe.Resource != "servers" {
		t.Fatalf("third server: %v, want alice's servers quota", err)
	}
	allocs, _ := f.Store.Allocations(ctx)
	if len(allocs) != 2 {
		t.Errorf("%d allocations, want 2", len(allocs))
	}
}

func TestSecretEnvNeverInPodSpec(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	req := v1.CreateServerRequest{
		Profile:   "small",
		Env:       map[string]string{"JUPYTERHUB_API_TOKEN": "hub-secret-1", "JUPYTERHUB_USER": "dora"},
		SecretEnv: map[string]string{"WANDB": "wandb-secret-2"},
	}
	hub := audit.Actor{Name: "jupyterhub", Kind: v1.ActorHub}
	if _, _, err := f.Service.Create(ctx, hub, "dora", nil, "nb", req, "k"); err != nil {
		t.Fatal(err)
	}
	pod := f.Pod(t, "dora", "nb")
	spec := pod.Spec.String()
	for _, secret := range []string{"hub-secret-1", "wandb-secret-2"} {
		if strings.Contains(spec, secret) {
			t.Errorf("pod spec contains the secret value %q", secret)
		}
	}
	var plain []string
	for _, e := range pod.Spec.Containers[0].Env {
		plain = append(plain, e.Name)
	}
	if !slices.Contains(plain, "JUPYTERHUB_USER") || slices.Contains(plain, "JUPYTERHUB_API_TOKEN") {
		t.Errorf("plain env names %v: want JUPYTERHUB_USER and not JUPYTERHUB_API_TOKEN", plain)
	}
	sec, err := f.Kube.CoreV1().Secrets(serverstest.Namespace).Get(ctx, spawner.SecretName("dora", "nb"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("secret: %v", err)
	}
	got := map[string]string{}
	for k, v := range sec.Data {
		got[k] = string(v)
	}
	for k, v := range sec.StringData {
		got[k] = v
	}
	if tok := got[v1.EnvNotebookToken]; len(tok) < 26 {
		t.Errorf("notebook token %q in the Secret: want a fresh random token of at least 26 characters", tok)
	}
	delete(got, v1.EnvNotebookToken)
	want := map[string]string{"JUPYTERHUB_API_TOKEN": "hub-secret-1", "WANDB": "wandb-secret-2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("secret data (-want +got):\n%s", diff)
	}
}

// TestNotebookTokenIsFreshPerSpawn checks that every spawn gets its own
// notebook token in its Secret, and that a caller cannot choose it.
func TestNotebookTokenIsFreshPerSpawn(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "gus", Name: "nb"}
	token := func() string {
		t.Helper()
		sec, err := f.Kube.CoreV1().Secrets(serverstest.Namespace).Get(ctx, spawner.SecretName("gus", "nb"), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("secret: %v", err)
		}
		return string(sec.Data[v1.EnvNotebookToken])
	}
	if _, _, err := f.Service.Create(ctx, serverstest.By, "gus", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k1"); err != nil {
		t.Fatal(err)
	}
	first := token()
	if _, err := f.Service.Delete(ctx, serverstest.By, key); err != nil {
		t.Fatal(err)
	}
	f.WaitState(t, key, v1.StateStopped)
	if _, _, err := f.Service.Create(ctx, serverstest.By, "gus", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k2"); err != nil {
		t.Fatal(err)
	}
	if second := token(); second == first || second == "" {
		t.Errorf("second spawn's token %q, first %q: want a new one", second, first)
	}
	_, _, err := f.Service.Create(ctx, serverstest.By, "gus", nil, "other", v1.CreateServerRequest{Profile: "small", SecretEnv: map[string]string{v1.EnvNotebookToken: "mine"}}, "k3")
	if !errors.Is(err, fleet.ErrInvalid) || !strings.Contains(err.Error(), v1.EnvNotebookToken) {
		t.Errorf("create with its own %s: %v, want ErrInvalid naming it", v1.EnvNotebookToken, err)
	}
}

// TestCommandAndArgsReachThePod checks that the create request's command
// and args become the notebook container's, and that a create without them
// gets the profile's (here the docker-stacks default).
func TestCommandAndArgsReachThePod(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	hub := v1.CreateServerRequest{Profile: "small", Args: []string{"jupyterhub-singleuser", "--debug"}}
	if _, _, err := f.Service.Create(ctx, serverstest.By, "erin", nil, "hub", hub, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Service.Create(ctx, serverstest.By, "erin", nil, "plain", v1.CreateServerRequest{Profile: "small"}, "k2"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		server        string
		command, args []string
	}{
		{server: "hub", args: []string{"jupyterhub-singleuser", "--debug"}},
		{server: "plain", args: catalog.DefaultArgs()},
	}
	for _, tc := range tests {
		c := f.Pod(t, "erin", tc.server).Spec.Containers[0]
		if diff := cmp.Diff(tc.command, c.Command); diff != "" {
			t.Errorf("%s: command (-want +got):\n%s", tc.server, diff)
		}
		if diff := cmp.Diff(tc.args, c.Args); diff != "" {
			t.Errorf("%s: args (-want +got):\n%s", tc.server, diff)
		}
	}
}

func TestCrashLoopFailsTheSpawnAndReleases(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "erin", Name: "nb"}
	if _, _, err := f.Service.Create(ctx, serverstest.By, "erin", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k"); err != nil {
		t.Fatal(err)
	}
	f.SetPodWaiting(t, "erin", "nb", "CrashLoopBackOff", "back-off restarting failed container")
	s := f.WaitState(t, key, v1.StateFailed)
	if !strings.Contains(strings.ToLower(s.Message), "crash") {
		t.Errorf("failure message %q does not say it crashed", s.Message)
	}
	waitPodGone(t, f, key) // the slice is freed once the deleted pod is gone
	allocs, _ := f.Store.Allocations(ctx)
	if len(allocs) != 0 {
		t.Errorf("allocations after the failed spawn: %v, want none", allocs)
	}
	f.Verify(t)
}

func TestLateEventOfOldSpawnIsIgnored(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "finn", Name: "nb"}
	old, _, err := f.Service.Create(ctx, serverstest.By, "finn", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Service.Delete(ctx, serverstest.By, key); err != nil {
		t.Fatal(err)
	}
	f.WaitState(t, key, v1.StateStopped)
	cur, _, err := f.Service.Create(ctx, serverstest.By, "finn", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k2")
	if err != nil {
		t.Fatal(err)
	}
	for _, ph := range []spawner.Phase{spawner.PhaseRunning, spawner.PhaseFailed, spawner.PhaseGone} {
		if err := f.Service.HandlePodEvent(ctx, spawner.PodEvent{User: "finn", Server: "nb", SpawnID: old.SpawnID, Phase: ph, URL: "http://old"}); err != nil {
			t.Fatalf("old %s event: %v", ph, err)
		}
	}
	got, err := f.Service.Get(ctx, key)
	if err != nil || got.SpawnID != cur.SpawnID || got.State != v1.StateStarting {
		t.Errorf("after late events of the old spawn: %+v (err %v), want spawn %s still starting", got, err, cur.SpawnID)
	}
}

func TestPodRefusedByTheClusterIsAReadableConflict(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	f.Kube.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "nb-gina--nb",
			errors.New("exceeded quota: no-pods, requested: pods=1, used: pods=0, limited: pods=0"))
	})
	_, _, err := f.Service.Create(ctx, serverstest.By, "gina", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k")
	if !errors.Is(err, fleet.ErrConflict) {
		t.Fatalf("Create = %v, want ErrConflict", err)
	}
	want := `the cluster refused the notebook pod: pods "nb-gina--nb" is forbidden: exceeded quota: no-pods`
	if msg := fleet.Message(err); !strings.HasPrefix(msg, want) {
		t.Errorf("message %q, want it to start with %q", msg, want)
	}
	if s, err := f.Service.Get(ctx, fleet.ServerKey{User: "gina", Name: "nb"}); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("server %s %q (%v), want none: a refused start leaves nothing behind", s.State, s.Message, err)
	}
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 0 {
		t.Errorf("allocations %v, want the slice released", allocs)
	}
}

// eagerPods is the spawner with a pod watcher that wins the race: the pod's
// running event is applied before Create returns to the service.
type eagerPods struct {
	inner servers.Pods
	svc   *servers.Service
}

func (p *eagerPods) Delete(ctx context.Context, user, server, spawnID string) error {
	return p.inner.Delete(ctx, user, server, spawnID)
}

func (p *eagerPods) HasPod(ctx context.Context, user, server, spawnID string) (bool, error) {
	return p.inner.HasPod(ctx, user, server, spawnID)
}

func (p *eagerPods) PutSecret(ctx context.Context, s spawner.Spec, secret map[string]string) error {
	return p.inner.PutSecret(ctx, s, secret)
}

func (p *eagerPods) CreatePod(ctx context.Context, s spawner.Spec) error {
	if err := p.inner.CreatePod(ctx, s); err != nil {
		return err
	}
	return p.svc.HandlePodEvent(ctx, spawner.PodEvent{User: s.User, Server: s.Server, SpawnID: s.SpawnID,
		Pod: spawner.PodName(s.User, s.Server), Phase: spawner.PhaseRunning, URL: "http://10.0.0.9:8888"})
}

func TestCreateSucceedsWhenPodEventsOvertakeIt(t *testing.T) {
	f := serverstest.New(t)
	pods := &eagerPods{inner: f.Pods}
	svc := servers.New(f.Store, pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now))
	pods.svc = svc
	s, created, err := svc.Create(t.Context(), serverstest.By, "hana", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k")
	if err != nil || !created {
		t.Fatalf("Create = %v (created %v), want success although the pod ran first", err, created)
	}
	if s.State != v1.StateRunning || s.URL != "http://10.0.0.9:8888" {
		t.Errorf("answer %s %q, want the server as it is now: running at http://10.0.0.9:8888", s.State, s.URL)
	}
}

func TestIdempotencyKeyReusedForAnotherProfileIsAConflict(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	if _, _, err := f.Service.Create(ctx, serverstest.By, "ivy", []string{"ml"}, "nb", v1.CreateServerRequest{Profile: "small"}, "k1"); err != nil {
		t.Fatal(err)
	}
	_, _, err := f.Service.Create(ctx, serverstest.By, "ivy", []string{"ml"}, "nb", v1.CreateServerRequest{Profile: "big"}, "k1")
	if !errors.Is(err, fleet.ErrConflict) || !strings.Contains(fleet.Message(err), `already used for a create with profile "small"`) {
		t.Errorf("reuse with another profile = %v, want a conflict naming the first profile", err)
	}
}

// TestIdempotencyKeyReusedForAnotherRequestIsAConflict checks that a
// same-key create asking for other env, secret names, command or args is
// refused rather than answered with the first spawn (which runs without
// them), while a real retry, secret values included, still finds it.
func TestIdempotencyKeyReusedForAnotherRequestIsAConflict(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	first := v1.CreateServerRequest{Profile: "small", Env: map[string]string{"A": "1", "HF_TOKEN": "s1"}, SecretEnv: map[string]string{"DB_PASS": "p1"}}
	s, _, err := f.Service.Create(ctx, serverstest.By, "ivy", nil, "nb", first, "k1")
	if err != nil {
		t.Fatal(err)
	}
	retry := first
	retry.Env = map[string]string{"HF_TOKEN": "s2", "A": "1"} // a secret's value is not compared
	if again, created, err := f.Service.Create(ctx, serverstest.By, "ivy", nil, "nb", retry, "k1"); err != nil || created || again.SpawnID != s.SpawnID {
		t.Fatalf("same-key retry = spawn %s created %v err %v, want spawn %s", again.SpawnID, created, err, s.SpawnID)
	}
	for name, req := range map[string]v1.CreateServerRequest{
		"env value":     {Profile: "small", Env: map[string]string{"A": "2", "HF_TOKEN": "s1"}, SecretEnv: first.SecretEnv},
		"env added":     {Profile: "small", Env: map[string]string{"A": "1", "B": "1", "HF_TOKEN": "s1"}, SecretEnv: first.SecretEnv},
		"secret name":   {Profile: "small", Env: map[string]string{"A": "1"}, SecretEnv: first.SecretEnv},
		"args":          {Profile: "small", Env: first.Env, SecretEnv: first.SecretEnv, Args: []string{"start.sh"}},
		"empty command": {Profile: "small", Env: first.Env, SecretEnv: first.SecretEnv, Command: []string{}},
	} {
		_, _, err := f.Service.Create(ctx, serverstest.By, "ivy", nil, "nb", req, "k1")
		if !errors.Is(err, fleet.ErrConflict) || !strings.Contains(fleet.Message(err), `Idempotency-Key "k1" was already used for a create with other env`) {
			t.Errorf("%s: reuse = %v, want a conflict saying the key was used for another request", name, err)
		}
	}
	if got, err := f.Store.GetServer(ctx, fleet.ServerKey{User: "ivy", Name: "nb"}); err != nil || got.SpawnID != s.SpawnID {
		t.Errorf("after the refused reuses the record is %+v (%v), want spawn %s untouched", got, err, s.SpawnID)
	}
}

// TestStoppedServerKeepsWhyItEnded checks that a running server whose
// notebook ended by itself says so once stopped, while a stop that was
// asked for just says stopped.
func TestStoppedServerKeepsWhyItEnded(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	for _, name := range []string{"asked", "crashed"} {
		if _, _, err := f.Service.Create(ctx, serverstest.By, "ivy", nil, name, v1.CreateServerRequest{Profile: "small"}, "k-"+name); err != nil {
			t.Fatal(err)
		}
		f.SetPodRunning(t, "ivy", name, "10.0.0.9")
		f.WaitState(t, fleet.ServerKey{User: "ivy", Name: name}, v1.StateRunning)
	}
	if _, err := f.Service.Delete(ctx, serverstest.By, fleet.ServerKey{User: "ivy", Name: "asked"}); err != nil {
		t.Fatal(err)
	}
	if s := f.WaitState(t, fleet.ServerKey{User: "ivy", Name: "asked"}, v1.StateStopped); s.Message != "stopped" {
		t.Errorf("asked stop: %q, want stopped", s.Message)
	}
	f.SetPodWaiting(t, "ivy", "crashed", "CrashLoopBackOff", "back-off 10s restarting failed container")
	s := f.WaitState(t, fleet.ServerKey{User: "ivy", Name: "crashed"}, v1.StateStopped)
	if !strings.HasPrefix(s.Message, "the notebook stopped: ") || !strings.Contains(s.Message, "crashing") {
		t.Errorf("crashed server's stop message %q: want why it stopped", s.Message)
	}
}

// TestCreateRetryKeepsTheNotebookToken: the first attempt of a create
// makes the Secret and the pod, but the API server's answer to the pod is
// lost (a timeout), so the start stays in creating; the same-key retry
// finds the pod of its spawn and returns the same server. The Secret must
// still hold the token the pod was started with: the notebook reads it at
// start, and the broker's proxy reads it from the Secret.
func TestCreateRetryKeepsTheNotebookToken(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	// Every answer to a pod create is lost until the first attempt has
	// given up (the spawner retries a server timeout as transient until
	// the attempt's context ends).
	var losing atomic.Bool
	losing.Store(true)
	f.Kube.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !losing.Load() {
			return false, nil, nil
		}
		obj := a.(k8stesting.CreateAction).GetObject()
		if err := f.Kube.Tracker().Create(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, obj, serverstest.Namespace); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Errorf("tracker create: %v", err)
		}
		return true, nil, apierrors.NewServerTimeout(schema.GroupResource{Resource: "pods"}, "create", 1)
	})
	attempt, cancel := context.WithTimeout(ctx, time.Second)
	first, _, err := f.Service.Create(attempt, serverstest.By, "jo", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k")
	cancel()
	losing.Store(false)
	if err == nil {
		t.Fatalf("first attempt = %+v, want the lost answer's error", first)
	}
	secret := func() string {
		t.Helper()
		s, err := f.Kube.CoreV1().Secrets(serverstest.Namespace).Get(ctx, spawner.SecretName("jo", "nb"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(s.Data[v1.EnvNotebookToken])
	}
	started := secret() // what the pod's container reads at start
	if started == "" {
		t.Fatal("the Secret has no notebook token")
	}
	again, created, err := f.Service.Create(ctx, serverstest.By, "jo", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k")
	if err != nil || created {
		t.Fatalf("retry = %v (created %v), want the same server", err, created)
	}
	if got := f.Pod(t, "jo", "nb").Annotations[v1.AnnotationSpawnID]; got != again.SpawnID {
		t.Errorf("retry answered spawn %s, the pod is spawn %s", again.SpawnID, got)
	}
	if got := secret(); got != started {
		t.Errorf("the retry rewrote the Secret's notebook token: the pod started with %q, the Secret now holds %q", started, got)
	}
	tok, err := f.Pods.NotebookToken(ctx, "jo", "nb", again.SpawnID)
	if err != nil || tok != started {
		t.Errorf("the broker's token for the spawn %q (%v), want the pod's %q", tok, err, started)
	}
}

func TestAFailedSpawnWhosePodCouldNotBeDeletedKeepsItsSlice(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	s, _, err := f.Service.Create(ctx, serverstest.By, "ivan", nil, "lab", v1.CreateServerRequest{Profile: "small"}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	// The API server does not take the deletion.
	f.Kube.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewBadRequest("not now")
	})
	f.Service.Abandon(ctx, s, "the spawn was interrupted")
	got, err := f.Service.Get(ctx, s.ServerKey)
	if err != nil || got.State != v1.StateFailed {
		t.Fatalf("server %+v (err %v), want failed", got, err)
	}
	allocs, err := f.Store.Allocations(ctx)
	if err != nil || len(allocs) != 1 || allocs[0].SliceID != s.SpawnID {
		t.Errorf("allocations %v (err %v), want the slice of the pod still there held", allocs, err)
	}
}

// flushingPods deletes pods for real and then empties Redis, as a FLUSHALL
// landing in the middle of a stop (the chaos soak); its cache has caught
// up with the deletion.
type flushingPods struct {
	inner *spawner.Client
	flush func()
	gone  atomic.Bool
}

func (p *flushingPods) PutSecret(ctx context.Context, s spawner.Spec, secret map[string]string) error {
	return p.inner.PutSecret(ctx, s, secret)
}

func (p *flushingPods) CreatePod(ctx context.Context, s spawner.Spec) error {
	return p.inner.CreatePod(ctx, s)
}

func (p *flushingPods) Delete(ctx context.Context, user, server, spawnID string) error {
	if err := p.inner.Delete(ctx, user, server, spawnID); err != nil {
		return err
	}
	p.gone.Store(true)
	p.flush()
	return nil
}

func (p *flushingPods) HasPod(ctx context.Context, user, server, spawnID string) (bool, error) {
	if p.gone.Load() {
		return false, nil
	}
	return p.inner.HasPod(ctx, user, server, spawnID)
}

// TestAStopThatRedisLostMidwayAnswersStopped: Redis lost its data after the
// stop deleted the pod. The stop is done (no pod, no slice left), so the
// owner is told so, not that the server never existed.
func TestAStopThatRedisLostMidwayAnswersStopped(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key := fleet.ServerKey{User: "ivy", Name: "nb"}
	if _, _, err := f.Service.Create(ctx, serverstest.By, "ivy", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k"); err != nil {
		t.Fatal(err)
	}
	f.SetPodRunning(t, "ivy", "nb", "10.0.0.4")
	f.WaitState(t, key, v1.StateRunning)
	pods := &flushingPods{inner: f.Pods, flush: func() {
		if err := f.Redis.Client(t).FlushAll(ctx).Err(); err != nil {
			t.Error(err)
		}
	}}
	svc := servers.New(f.Store, pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now))
	s, err := svc.Delete(ctx, serverstest.By, key)
	if err != nil || s.State != v1.StateStopped || s.Allocation != nil || s.URL != "" {
		t.Fatalf("Delete = %s %q (allocation %v, url %q), %v; want stopped", s.State, s.Message, s.Allocation, s.URL, err)
	}
	if _, err := f.Kube.CoreV1().Pods(serverstest.Namespace).Get(ctx, spawner.PodName("ivy", "nb"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod after the stop: %v, want gone", err)
	}
}

func (p *eagerPods) ReleasePod(ctx context.Context, name, spawnID string) error {
	return p.inner.ReleasePod(ctx, name, spawnID)
}

func (p *flushingPods) ReleasePod(ctx context.Context, name, spawnID string) error {
	return p.inner.ReleasePod(ctx, name, spawnID)
}

// waitPodGone waits until the fixture's replica has handled the gone event
// of the pod of server key.
func waitPodGone(t *testing.T, f *serverstest.Fixture, key fleet.ServerKey) {
	t.Helper()
	pod := spawner.PodName(key.User, key.Name)
	f.WaitHandled(t, "the pod's end", func(e spawner.PodEvent) bool { return e.Pod == pod && e.Phase == spawner.PhaseGone })
}
