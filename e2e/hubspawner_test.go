package e2e

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/spawner/jupyterhub/pytest"
)

// TestHubSpawnerClassAgainstTheBroker runs the JupyterHub spawner class's
// contract tests (spawner/jupyterhub/tests, marked "contract") against a
// real broker on the real API server with kwok, with the hub service token:
// start to running, stop, quota and capacity refusals, a left-over server
// stopped and created again, named and default servers, load_state after a
// hub restart, progress of one spawn only. Meanwhile it watches every
// notebook pod and Secret the class made the broker create: each pod runs
// the hub's command as args (the image's entrypoint kept) and carries no
// credential in its plain env; the hub's API token is in the Secret.
//
// No real hub or notebook process runs here; TestJupyterHub (hub_test.go)
// runs both.
func TestHubSpawnerClassAgainstTheBroker(t *testing.T) {
	t.Parallel()
	py := pytest.Python(t)
	e := newEnv(t, envOptions{})
	tokenFile := filepath.Join(t.TempDir(), "hub-token")
	if err := os.WriteFile(tokenFile, []byte(e.hubToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	seen := watchNotebooks(t, e)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := pytest.Run(ctx, py, []string{
		"GPUBROKER_TEST_URL=" + e.broker.URL,
		"GPUBROKER_TEST_HUB_TOKEN_FILE=" + tokenFile,
	}, "-m", "contract")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("pytest against the broker: %s", strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]))

	pods, secrets := seen.stop()
	if len(pods) < 10 {
		t.Fatalf("saw %d notebook pods, want one per started spawn (at least 10)", len(pods))
	}
	for spawn, c := range pods {
		if len(c.Command) != 0 || !slices.Equal(c.Args, []string{"jupyterhub-singleuser"}) {
			t.Errorf("spawn %s: command %q args %q, want no command and args [jupyterhub-singleuser]", spawn, c.Command, c.Args)
		}
		env := map[string]string{}
		for _, ev := range c.Env {
			env[ev.Name] = ev.Value
		}
		for _, name := range []string{"JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN"} {
			if _, ok := env[name]; ok {
				t.Errorf("spawn %s: %s is in the pod's plain env", spawn, name)
			}
		}
		if !strings.HasPrefix(env["JUPYTERHUB_SERVICE_URL"], "http://0.0.0.0:8888/user/") || env["JUPYTERHUB_USER"] == "" {
			t.Errorf("spawn %s: JUPYTERHUB_SERVICE_URL %q, JUPYTERHUB_USER %q", spawn, env["JUPYTERHUB_SERVICE_URL"], env["JUPYTERHUB_USER"])
		}
		data, ok := secrets[spawn]
		if !ok {
			t.Errorf("spawn %s: no Secret seen", spawn)
			continue
		}
		tok := string(data["JUPYTERHUB_API_TOKEN"])
		if tok == "" || string(data["JPY_API_TOKEN"]) != tok {
			t.Errorf("spawn %s: Secret keys %v: want JUPYTERHUB_API_TOKEN and an equal JPY_API_TOKEN", spawn, slices.Sorted(maps.Keys(data)))
		}
		for name, value := range env {
			if tok != "" && strings.Contains(value, tok) {
				t.Errorf("spawn %s: plain env %s holds the hub's API token", spawn, name)
			}
		}
	}
}

// notebookWatch records the notebook container of every pod and the data
// of every Secret the broker creates in one namespace, by spawn id.
type notebookWatch struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	pods    map[string]corev1.Container
	secrets map[string]map[string][]byte
}

// watchNotebooks starts watching e's namespace; stop ends the watches
// (also at t's end) and returns what they saw.
func watchNotebooks(t *testing.T, e *env) *notebookWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := &notebookWatch{cancel: cancel, pods: map[string]corev1.Container{}, secrets: map[string]map[string][]byte{}}
	opts := metav1.ListOptions{LabelSelector: v1.LabelManagedBy + "=" + v1.ManagedByValue}
	pw, err := e.cluster.Client.CoreV1().Pods(e.ns).Watch(ctx, opts)
	if err != nil {
		cancel()
		t.Fatalf("watch pods: %v", err)
	}
	sw, err := e.cluster.Client.CoreV1().Secrets(e.ns).Watch(ctx, opts)
	if err != nil {
		pw.Stop()
		cancel()
		t.Fatalf("watch secrets: %v", err)
	}
	w.wg.Add(2)
	go w.follow(ctx, pw, func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && len(p.Spec.Containers) > 0 {
			w.pods[p.Labels[v1.LabelSpawnID]] = *p.Spec.Containers[0].DeepCopy()
		}
	})
	go w.follow(ctx, sw, func(obj any) {
		if s, ok := obj.(*corev1.Secret); ok {
			w.secrets[s.Labels[v1.LabelSpawnID]] = s.DeepCopy().Data
		}
	})
	t.Cleanup(func() { w.stop() })
	return w
}

// follow records the added objects of one watch until ctx ends.
func (w *notebookWatch) follow(ctx context.Context, wi watch.Interface, record func(any)) {
	defer w.wg.Done()
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return
			}
			if ev.Type == watch.Added {
				w.mu.Lock()
				record(ev.Object)
				w.mu.Unlock()
			}
		}
	}
}

// stop ends the watches, waits for them and returns the pods' notebook
// containers and the Secrets' data, by spawn id. Safe to call twice.
func (w *notebookWatch) stop() (map[string]corev1.Container, map[string]map[string][]byte) {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pods, w.secrets
}
