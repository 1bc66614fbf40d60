package servers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/spawner"
)

// placeGate is the store with a placement that waits until gate is closed
// (or gives up after wait, failing the test).
type placeGate struct {
	servers.Store
	t    *testing.T
	gate <-chan struct{}
	wait time.Duration
}

func (s *placeGate) Place(ctx context.Context, req fleet.PlaceRequest) (fleet.Allocation, error) {
	select {
	case <-s.gate:
	case <-time.After(s.wait):
		s.t.Errorf("placement of %s waited %s for the Secret write to begin; it must not wait on the placement", req.SliceID, s.wait)
	}
	return s.Store.Place(ctx, req)
}

// secretWatch is the spawner, telling when a Secret write begins and
// checking that each pod is created after its Secret exists.
type secretWatch struct {
	servers.Pods
	f       *serverstest.Fixture
	t       *testing.T
	began   chan struct{} // closed by the first PutSecret
	deleted chan string   // the spawn id of each Delete that returned
}

func (p *secretWatch) PutSecret(ctx context.Context, s spawner.Spec, env map[string]string) error {
	select {
	case <-p.began:
	default:
		close(p.began)
	}
	return p.Pods.PutSecret(ctx, s, env)
}

func (p *secretWatch) CreatePod(ctx context.Context, s spawner.Spec) error {
	if _, err := p.f.Kube.CoreV1().Secrets(serverstest.Namespace).Get(ctx, spawner.SecretName(s.User, s.Server), metav1.GetOptions{}); err != nil {
		p.t.Errorf("pod of %s/%s created before its Secret: %v", s.User, s.Server, err)
	}
	return p.Pods.CreatePod(ctx, s)
}

func (p *secretWatch) Delete(ctx context.Context, user, server, spawnID string) error {
	err := p.Pods.Delete(ctx, user, server, spawnID)
	if err == nil {
		p.deleted <- spawnID
	}
	return err
}

func newSecretWatch(t *testing.T, f *serverstest.Fixture) *secretWatch {
	return &secretWatch{Pods: f.Pods, f: f, t: t, began: make(chan struct{}), deleted: make(chan string, 16)}
}

// TestSecretIsWrittenWhileTheSliceIsPlaced: the Secret write begins before
// the placement ends (the placement here waits for it), and the pod is
// created only once the Secret exists.
func TestSecretIsWrittenWhileTheSliceIsPlaced(t *testing.T) {
	f := serverstest.New(t)
	pods := newSecretWatch(t, f)
	store := &placeGate{Store: f.Store, t: t, gate: pods.began, wait: 10 * time.Second}
	svc := servers.New(store, pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now))
	s, created, err := svc.Create(t.Context(), serverstest.By, "ann", nil, "nb", v1.CreateServerRequest{Profile: "small"}, "k")
	if err != nil || !created || s.State != v1.StateStarting {
		t.Fatalf("Create = %s, created %v, %v; want a starting server", s.State, created, err)
	}
	sec, err := f.Kube.CoreV1().Secrets(serverstest.Namespace).Get(t.Context(), spawner.SecretName("ann", "nb"), metav1.GetOptions{})
	if err != nil || sec.Annotations[v1.AnnotationSpawnID] != s.SpawnID || len(sec.Data[v1.EnvNotebookToken]) == 0 {
		t.Fatalf("Secret %v (err %v), want spawn %s's with a notebook token", sec.GetAnnotations(), err, s.SpawnID)
	}
	f.Pod(t, "ann", "nb")
}

// TestRefusedStartDeletesItsSecret: a start refused by placement (no room,
// over quota) wrote its Secret side by side with the placement; the Secret
// is deleted again, so a refusal leaves nothing behind in the cluster
// either.
func TestRefusedStartDeletesItsSecret(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	pods := newSecretWatch(t, f)
	svc := servers.New(f.Store, pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now))
	for _, name := range []string{"one", "two"} {
		if _, _, err := svc.Create(ctx, serverstest.By, "alice", nil, name, v1.CreateServerRequest{Profile: "small"}, "k"); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	for _, tc := range []struct {
		user, profile string
		groups        []string
		want          error
	}{
		{user: "alice", profile: "small", want: fleet.ErrQuotaExceeded},
		{user: "bob", profile: "big", groups: []string{"ml"}},
		{user: "carl", profile: "big", groups: []string{"ml"}, want: fleet.ErrNoCapacity},
	} {
		_, _, err := svc.Create(ctx, serverstest.By, tc.user, tc.groups, "x", v1.CreateServerRequest{Profile: tc.profile}, "k")
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Fatalf("%s's create: %v, want %v", tc.user, err, tc.want)
		}
		if tc.want == nil {
			continue
		}
		select {
		case <-pods.deleted:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s's refused start: its Secret was not deleted within 10 s", tc.user)
		}
		if _, err := f.Kube.CoreV1().Secrets(serverstest.Namespace).Get(ctx, spawner.SecretName(tc.user, "x"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s's refused start left its Secret (err %v)", tc.user, err)
		}
	}
	// The servers that started keep theirs.
	for _, k := range []fleet.ServerKey{{User: "alice", Name: "one"}, {User: "alice", Name: "two"}, {User: "bob", Name: "x"}} {
		if _, err := f.Kube.CoreV1().Secrets(serverstest.Namespace).Get(ctx, spawner.SecretName(k.User, k.Name), metav1.GetOptions{}); err != nil {
			t.Errorf("Secret of %s/%s: %v, want it kept", k.User, k.Name, err)
		}
	}
	select {
	case id := <-pods.deleted:
		t.Errorf("spawn %s deleted although it started", id)
	default:
	}
}
