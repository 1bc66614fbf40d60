package spawner

// The notebook's token and path prefix as the proxy and the reclaimer
// read them from a spawn's Secret and cached pod.

import (
	"errors"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// TestNotebookTokenAndPrefix reads a spawn's token (once, then from the
// cache), refuses another spawn's, and finds the notebook's path prefix
// and pod from the cache: the broker's base URL, or the hub's prefix for a
// hub-started notebook.
func TestNotebookTokenAndPrefix(t *testing.T) {
	h := startClient(t)
	ctx := t.Context()
	spec := testSpec()
	spec.Server = "nb"
	if err := h.client.Create(ctx, spec, map[string]string{v1.EnvNotebookToken: "tok-1"}); err != nil {
		t.Fatal(err)
	}
	reads := 0
	h.cs.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		reads++
		return false, nil, nil
	})
	for range 3 {
		if tok, err := h.client.NotebookToken(ctx, spec.User, spec.Server, spec.SpawnID); err != nil || tok != "tok-1" {
			t.Fatalf("NotebookToken = %q, %v", tok, err)
		}
	}
	if reads != 1 {
		t.Errorf("the Secret was read %d times for one spawn, want once", reads)
	}
	if _, err := h.client.NotebookToken(ctx, spec.User, spec.Server, "another-spawn"); !errors.Is(err, ErrNoToken) {
		t.Errorf("another spawn's token: %v, want ErrNoToken", err)
	}
	if _, err := h.client.NotebookToken(ctx, spec.User, "missing", spec.SpawnID); !errors.Is(err, ErrNoToken) {
		t.Errorf("no Secret: %v, want ErrNoToken", err)
	}

	h.waitEvent(t, "the pod is cached", func(ev PodEvent) bool { return ev.SpawnID == spec.SpawnID })
	if prefix, hub, ok := h.client.NotebookPrefix(spec.User, spec.Server, spec.SpawnID); !ok || hub || prefix != "/user/alice/nb/" {
		t.Errorf("prefix %q hub %t ok %t, want the broker's base URL", prefix, hub, ok)
	}
	if _, _, ok := h.client.NotebookPrefix(spec.User, spec.Server, "old-spawn"); ok {
		t.Error("a prefix for another spawn")
	}
	mp, ok, err := h.client.PodBySlugs("alice", "nb")
	if err != nil || !ok || mp.User != "alice" || mp.Server != "nb" {
		t.Errorf("PodBySlugs = %+v %t %v", mp, ok, err)
	}
	if _, ok, _ := h.client.PodBySlugs("alice", "other"); ok {
		t.Error("PodBySlugs found a pod for another server")
	}
	if ok, err := h.client.HasPod(ctx, spec.User, spec.Server, spec.SpawnID); err != nil || !ok {
		t.Errorf("HasPod of the cached spawn = %t %v, want true", ok, err)
	}
	for _, other := range [][3]string{{spec.User, spec.Server, "old-spawn"}, {spec.User, "other", spec.SpawnID}, {"bob", spec.Server, spec.SpawnID}} {
		if ok, err := h.client.HasPod(ctx, other[0], other[1], other[2]); err != nil || ok {
			t.Errorf("HasPod%v = %t %v, want false", other, ok, err)
		}
	}

	hubSpec := testSpec()
	hubSpec.Server, hubSpec.SpawnID = "hub", "hub-spawn"
	hubSpec.Env = map[string]string{"JUPYTERHUB_SERVICE_PREFIX": "/user/alice/hub/"}
	hubSpec.SecretEnv = true
	if err := h.client.Create(ctx, hubSpec, map[string]string{EnvHubAPIToken: "the-server-token", v1.EnvNotebookToken: "nb-token"}); err != nil {
		t.Fatal(err)
	}
	if tok, err := h.client.HubServerToken(ctx, "alice", "hub", "hub-spawn"); err != nil || tok != "the-server-token" {
		t.Errorf("HubServerToken = %q, %v; want the server's own hub token", tok, err)
	}
	if tok, err := h.client.NotebookToken(ctx, "alice", "hub", "hub-spawn"); err != nil || tok != "nb-token" {
		t.Errorf("NotebookToken of the hub server = %q, %v; want its notebook token (a separate cache entry)", tok, err)
	}
	h.waitEvent(t, "the hub's pod is cached", func(ev PodEvent) bool { return ev.SpawnID == hubSpec.SpawnID })
	if prefix, hub, ok := h.client.NotebookPrefix("alice", "hub", "hub-spawn"); !ok || !hub || prefix != "/user/alice/hub/" {
		t.Errorf("hub notebook: prefix %q hub %t ok %t, want the hub's prefix", prefix, hub, ok)
	}

	// A prefix that is not a plain path would move the probe, and the
	// token it carries, to another host.
	for i, bad := range []string{"@attacker.example/", "//attacker.example/", "/x@attacker.example/", "user/a/", "/a?b", `/a\b`} {
		spec := testSpec()
		spec.Server, spec.SpawnID = fmt.Sprintf("bad%d", i), fmt.Sprintf("bad-spawn-%d", i)
		spec.Env = map[string]string{"JUPYTERHUB_SERVICE_PREFIX": bad}
		if err := h.client.Create(ctx, spec, nil); err != nil {
			t.Fatal(err)
		}
		h.waitEvent(t, "the pod with a bad prefix is cached", func(ev PodEvent) bool { return ev.SpawnID == spec.SpawnID })
		if prefix, _, ok := h.client.NotebookPrefix(spec.User, spec.Server, spec.SpawnID); ok {
			t.Errorf("prefix %q: NotebookPrefix = %q, ok; want refused", bad, prefix)
		}
	}
}
