package servers_test

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/spawner"
)

// heldCreate is the spawner with a pod create that waits, once entered,
// until proceed is closed: a create in flight at the API server.
type heldCreate struct {
	servers.Pods
	entered, proceed chan struct{}
}

func (p *heldCreate) CreatePod(ctx context.Context, s spawner.Spec) error {
	close(p.entered)
	select {
	case <-p.proceed:
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.Pods.CreatePod(ctx, s)
}

// createHeld starts server key (profile small) with svc in the background
// and returns once entered is closed (the start reached a held step); the
// channel gets Create's error.
func createHeld(t *testing.T, svc *servers.Service, key fleet.ServerKey, entered chan struct{}) chan error {
	t.Helper()
	created := make(chan error, 1)
	go func() {
		_, _, err := svc.Create(t.Context(), serverstest.By, key.User, nil, key.Name, v1.CreateServerRequest{Profile: "small"}, "k")
		created <- err
	}()
	select {
	case <-entered:
	case err := <-created:
		t.Fatalf("Create returned %v before reaching the held step", err)
	}
	return created
}

// TestAStopWhileItsPodIsBeingCreatedKeepsTheSlice: a stop that finds no
// pod while the spawn is still creating it does not free the slice (the
// pod is about to run on it), nor does a second stop; the spawn deletes the pod it then makes, and
// the pod's end frees the slice and records the stop.
func TestAStopWhileItsPodIsBeingCreatedKeepsTheSlice(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	pods := &heldCreate{Pods: f.Releases, entered: make(chan struct{}), proceed: make(chan struct{})}
	svc := servers.New(f.Store, pods, f.Catalog, f.Log, servers.WithClock(f.Clock.Now))
	key := fleet.ServerKey{User: "ivy", Name: "nb"}
	created := createHeld(t, svc, key, pods.entered)

	s, err := svc.Delete(ctx, serverstest.By, key)
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if s.State != v1.StateStopping {
		t.Errorf("a stop while the pod is being created: state %s, want stopping", s.State)
	}
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 1 {
		t.Errorf("allocations while the pod may still be created = %v, want the slice kept", allocs)
	}
	// A retried stop (a client that got no answer) finds the record
	// stopping and still no pod: the spawn may still make it.
	if s, err := svc.Delete(ctx, serverstest.By, key); err != nil || s.State != v1.StateStopping {
		t.Errorf("a second stop while the pod is being created = %s, %v; want stopping", s.State, err)
	}
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 1 {
		t.Errorf("allocations after a second stop while the pod may still be created = %v, want the slice kept", allocs)
	}

	close(pods.proceed)
	if err := <-created; !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("Create = %v, want ErrConflict (stopped while it was starting)", err)
	}
	f.WaitState(t, key, v1.StateStopped)
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 0 {
		t.Errorf("allocations after the pod is gone = %v, want none", allocs)
	}
	if _, err := f.Kube.CoreV1().Pods(serverstest.Namespace).Get(ctx, spawner.PodName(key.User, key.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod made after the stop: %v, want it deleted", err)
	}
	f.Verify(t)
}

// heldPlace is the store with a placement that waits, once entered, until
// proceed is closed: a place script in flight at Redis.
type heldPlace struct {
	servers.Store
	entered, proceed chan struct{}
}

func (s *heldPlace) Place(ctx context.Context, req fleet.PlaceRequest) (fleet.Allocation, error) {
	close(s.entered)
	select {
	case <-s.proceed:
	case <-ctx.Done():
		return fleet.Allocation{}, ctx.Err()
	}
	return s.Store.Place(ctx, req)
}

// TestAStopWhileItsSliceIsBeingPlacedFreesTheSlice: a stop that settles
// a start while its placement is in flight (the stop's release finds
// nothing yet) leaves the spawn to release the slice it then places; it is
// not left charged until a reconcile pass.
func TestAStopWhileItsSliceIsBeingPlacedFreesTheSlice(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	store := &heldPlace{Store: f.Store, entered: make(chan struct{}), proceed: make(chan struct{})}
	svc := servers.New(store, f.Releases, f.Catalog, f.Log, servers.WithClock(f.Clock.Now))
	key := fleet.ServerKey{User: "ivy", Name: "nb"}
	created := createHeld(t, svc, key, store.entered)
	s, err := svc.Delete(ctx, serverstest.By, key)
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if s.State != v1.StateStopped {
		t.Fatalf("a stop while placing: state %s, want stopped (no pod can exist)", s.State)
	}

	close(store.proceed)
	if err := <-created; !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("Create = %v, want ErrConflict (stopped while it was starting)", err)
	}
	if allocs, _ := f.Store.Allocations(ctx); len(allocs) != 0 {
		t.Errorf("allocations after the start ended = %v, want none", allocs)
	}
	f.Verify(t)
}
