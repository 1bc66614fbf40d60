package e2e

// The JupyterHub rig: Debian's hub and proxy in front of a broker whose
// nodes run real notebooks, and the helpers its scenarios (hub_test.go)
// and benchmarks share.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/e2e/testdeps"
	"github.com/gpubroker/gpubroker/spawner/jupyterhub/pytest"
	"github.com/gpubroker/gpubroker/spawner/runner"
)

// hubImage is the image of the hub's profiles. The pod runner plays it
// with hubImageRun.
const hubImage = "example.invalid/jupyterhub-singleuser:1"

// hubEntrypoint stands in for a notebook image's entrypoint (as
// docker-stacks' start.sh) and runs the command it is given on the pod's
// IP, since the runner's pods share this machine's network and 0.0.0.0:8888
// would be one port for all: the hub's jupyterhub-singleuser as it is; the
// broker's default command for a profile without one (start-notebook.sh
// --ServerApp.base_url=…, as a user of the broker's own API gets) as the
// classic notebook server with the options translated, taking its token
// from the server's Secret (JUPYTER_TOKEN).
const hubEntrypoint = `common="--ip=$GPUBROKER_POD_IP --port=8888 --allow-root --NotebookApp.port_retries=0"
if [ "$1" != start-notebook.sh ]; then exec "$@" $common; fi
shift
n=$#
while [ "$n" -gt 0 ]; do
  a=$1; shift; n=$((n - 1))
  case $a in --ServerApp.*) a="--NotebookApp.${a#--ServerApp.}" ;; esac
  set -- "$@" "$a"
done
exec /usr/bin/python3 -m notebook --no-browser $common --NotebookApp.allow_remote_access=True "$@"`

// hubImageRun is hubImage as the pod runner runs it. The classic notebook
// UI: jupyterhub-singleuser 3.0 wraps jupyter_server when it is installed,
// which has no UI here (JUPYTERHUB-RIG.md §3).
var hubImageRun = runner.Image{
	Entrypoint: []string{"/bin/sh", "-c", hubEntrypoint, "entrypoint"},
	Env:        []string{"JUPYTERHUB_SINGLEUSER_APP=notebook.notebookapp.NotebookApp"},
}

// hubSlices are the hub profiles' slices.
var hubSlices = map[string]v1.Slice{
	"small":  {MemoryMiB: 8192, ComputePercent: 10, ComputeLimitPercent: 50},
	"medium": {MemoryMiB: 24576, ComputePercent: 25, ComputeLimitPercent: 75},
}

// hubProfiles is the broker's catalog behind the hub: small and medium,
// two servers per user, and carol's GPU memory capped at 8 GiB (medium is
// refused to her).
var hubProfiles = `
profiles:
  - name: small
    displayName: Small
    image: ` + hubImage + `
    cpu: "1"
    memory: 1Gi
    slice: {memoryMiB: 8192, computePercent: 10, computeLimitPercent: 50}
  - name: medium
    displayName: Medium
    image: ` + hubImage + `
    cpu: "1"
    memory: 1Gi
    slice: {memoryMiB: 24576, computePercent: 25, computeLimitPercent: 75}
quotas:
  defaultUser: {servers: 2}
  users:
    carol: {memoryMiB: 8192}
`

// hubUsers are the hub's users (all in group ml); u0…u9 spawn at once,
// bench spawns in BenchmarkHubSpawn.
var hubUsers = append([]string{"alice", "bob", "carol", "dave", "bench"}, manyUsers()...)

func manyUsers() []string {
	out := make([]string, 10)
	for i := range out {
		out[i] = "u" + strconv.Itoa(i)
	}
	return out
}

// hubDefaultServer is the broker's name of a user's default hub server
// (GPUBrokerSpawner.default_server_name).
const hubDefaultServer = "(default)"

// hubEnv is an env with a real JupyterHub in front of its broker: Debian's
// jupyterhub 3.0 and configurable-http-proxy, GPUBrokerSpawner from the
// source tree, DummyAuthenticator, and a service token with admin scopes
// for the test's REST calls.
type hubEnv struct {
	*env
	hub *harness.Hub
	// service is the hub API token of the test's own service.
	service string
}

// newHubEnv starts the broker (its nodes under a pod runner, so notebooks
// are real jupyterhub-singleuser processes) and the hub in front of it;
// the hub stops first when t ends.
func newHubEnv(t testing.TB, o envOptions) *hubEnv {
	t.Helper()
	o.notebooks, o.profiles = true, hubProfiles
	e := newEnv(t, o)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "broker-hub-token")
	if err := os.WriteFile(tokenFile, []byte(e.hubToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &hubEnv{env: e}
	h.hub, h.service = startHub(t, e.broker.URL, tokenFile)
	return h
}

// The test hub's own limits on a spawn (Spawner.start_timeout: for
// start(), here until the broker reports the server running;
// Spawner.http_timeout: then for the server's first answer). When one
// passes, the hub gives the spawn up and drops the server.
const (
	hubStartTimeout = 300 * time.Second
	hubHTTPTimeout  = 120 * time.Second
)

// startHub starts Debian's JupyterHub with GPUBrokerSpawner (from the
// source tree) in front of the broker at brokerURL, which accepts the
// token in tokenFile, with DummyAuthenticator, the users hubUsers in group
// ml, and a service whose returned token has admin scopes. The hub stops
// when t ends, printing its log if t failed.
func startHub(t testing.TB, brokerURL, tokenFile string) (*harness.Hub, string) {
	t.Helper()
	pytest.Python(t) // Debian's jupyterhub, aiohttp
	testdeps.Need(t, "/usr/bin/configurable-http-proxy")
	testdeps.Need(t, "/usr/bin/jupyterhub-singleuser")
	service := "svc-" + harness.UniqueName("token")
	py := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	cfg := fmt.Sprintf(`
c.JupyterHub.authenticator_class = "jupyterhub.auth.DummyAuthenticator"
c.JupyterHub.spawner_class = "gpubroker_jupyterhub.GPUBrokerSpawner"
c.GPUBrokerSpawner.broker_url = %s
c.GPUBrokerSpawner.hub_token_file = %s
c.JupyterHub.allow_named_servers = True
# 3.0 counts every failed spawn, refusals included (deploy/jupyterhub).
c.JupyterHub.consecutive_failure_limit = 0
# Two shared cores, ten notebooks starting at once, the race detector.
c.Spawner.start_timeout = %d
c.Spawner.http_timeout = %d
c.JupyterHub.load_groups = {"ml": %s}
c.JupyterHub.services = [{"name": "e2e", "api_token": %s}]
c.JupyterHub.load_roles = [{"name": "e2e", "services": ["e2e"],
    "scopes": ["admin:users", "admin:servers", "access:servers", "read:users"]}]
`, py(brokerURL), py(tokenFile), int(hubStartTimeout/time.Second), int(hubHTTPTimeout/time.Second), py(hubUsers), py(service))
	hub, err := harness.StartHub(t.Context(), harness.HubOptions{
		Dir: filepath.Join(t.TempDir(), "hub"), Config: cfg,
		Env: []string{"PYTHONPATH=" + pytest.Dir()},
	})
	if err != nil {
		t.Fatalf("start the hub: %v", err)
	}
	t.Cleanup(func() {
		if err := hub.Stop(); err != nil {
			t.Errorf("stop the hub: %v", err)
		}
		if t.Failed() {
			t.Logf("--- %s, last 120 lines:\n%s", hub.LogPath, hub.LogTail(120))
			keepLog(t, hub.LogPath)
		}
	})
	return hub, service
}

// hubAPI calls the hub's REST API with the service token; it returns the
// status and the body.
func (h *hubEnv) hubAPI(ctx context.Context, method, path string, body any) (int, []byte, error) {
	return h.hubCall(ctx, method, "/hub/api"+path, body)
}

// hubGet GETs path (for example /user/bob/api/status) through the hub's
// proxy with the service token.
func (h *hubEnv) hubGet(ctx context.Context, path string) (int, []byte, error) {
	return h.hubCall(ctx, http.MethodGet, path, nil)
}

// hubCall sends a request to the hub's public URL with the service token.
func (h *hubEnv) hubCall(ctx context.Context, method, path string, body any) (int, []byte, error) {
	return h.hubCallAs(ctx, h.service, method, path, body)
}

// hubCallAs is hubCall with token.
func (h *hubEnv) hubCallAs(ctx context.Context, token, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.hub.URL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "token "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hubHTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

// hubHTTP has a transport of its own (see newBrowserEnvWith) and a timeout
// above the hub's slow_spawn_timeout (10 s), which a POST of a server
// waits for.
var hubHTTP = &http.Client{Timeout: 60 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()}

// hubServer is the part of the hub's model of a server the tests read.
type hubServer struct {
	Ready   bool   `json:"ready"`
	Pending string `json:"pending"`
	URL     string `json:"url"`
}

// hubServers returns user's servers as the hub sees them.
func (h *hubEnv) hubServers(ctx context.Context, user string) (map[string]hubServer, error) {
	status, b, err := h.hubAPI(ctx, http.MethodGet, "/users/"+user, nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET /hub/api/users/%s: %d %s", user, status, b)
	}
	var u struct {
		Servers map[string]hubServer `json:"servers"`
	}
	if err := json.Unmarshal(b, &u); err != nil {
		return nil, fmt.Errorf("GET /hub/api/users/%s: %w: %s", user, err, b)
	}
	return u.Servers, nil
}

// spawn asks the hub for user's default server with profile; it returns
// the hub's status: 201 when it got ready within the hub's
// slow_spawn_timeout, 202 when it is still starting.
func (h *hubEnv) spawn(ctx context.Context, user, profile string) (int, error) {
	status, b, err := h.hubAPI(ctx, http.MethodPost, "/users/"+user+"/server", map[string]string{"profile": profile})
	if err != nil {
		return 0, fmt.Errorf("POST /hub/api/users/%s/server: %w", user, err)
	}
	if status != http.StatusCreated && status != http.StatusAccepted {
		return status, fmt.Errorf("POST /hub/api/users/%s/server: %d %s", user, status, b)
	}
	return status, nil
}

// waitHubReady waits until the hub reports user's default server ready.
func (h *hubEnv) waitHubReady(ctx context.Context, user string, timeout time.Duration) error {
	return harness.Poll(ctx, 50*time.Millisecond, timeout, func(ctx context.Context) (bool, string, error) {
		s, err := h.hubServers(ctx, user)
		if err != nil {
			return false, err.Error(), nil
		}
		d, ok := s[""]
		return ok && d.Ready, fmt.Sprintf("%+v", s), nil
	})
}

// waitSpawnsReady waits until the hub reports the default server of every
// user ready, each spawn having been asked for. It has no deadline of its
// own: it fails when a spawn failed (the hub dropped the server, or the
// broker reports it failed or stopped), or when no spawn made progress
// (see spawnStage) for hubStartTimeout + hubHTTPTimeout: by then the hub
// itself has either got a spawn ready or given it up, so a longer stall
// means the hub or the broker hangs. The error names each spawn not yet
// ready with its stage.
func (h *hubEnv) waitSpawnsReady(ctx context.Context, users []string) error {
	return harness.PollProgress(ctx, 250*time.Millisecond, hubStartTimeout+hubHTTPTimeout, func(ctx context.Context) (bool, string, error) {
		pods, err := h.pods(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		var waiting []string
		for _, u := range users {
			stage, ready, err := h.spawnStage(ctx, u, pods)
			if err != nil {
				return false, "", fmt.Errorf("%s's spawn: %w (%s)", u, err, stage)
			}
			if !ready {
				waiting = append(waiting, u+": "+stage)
			}
		}
		return len(waiting) == 0, fmt.Sprintf("%d of %d not ready: %s", len(waiting), len(users), strings.Join(waiting, "; ")), nil
	})
}

// spawnStage describes where user's spawn of the default server stands:
// what the hub says of it (pending or ready), what the broker says of its
// server (state and message) and its pod's phase and readiness. Any
// change of it is progress. ready is true once the hub reports it ready;
// err is set when the spawn has failed: the hub no longer has the server,
// or the broker's server failed or stopped. A part that could not be read
// is described by its error (a failed read is not a failure).
func (h *hubEnv) spawnStage(ctx context.Context, user string, pods []corev1.Pod) (stage string, ready bool, err error) {
	at := "the hub: unread"
	hs, herr := h.hubServers(ctx, user)
	d, listed := hs[""]
	switch {
	case herr != nil:
		at = "the hub: " + herr.Error()
	case d.Ready:
		return "ready", true, nil
	case listed:
		at = "the hub: pending " + d.Pending
	default:
		at = "the hub: no server"
	}
	bs, ok, berr := h.brokerServer(ctx, user)
	switch {
	case berr != nil:
		at += ", the broker: " + berr.Error()
	case !ok:
		at += ", the broker: no server"
	default:
		at += fmt.Sprintf(", the broker: %s %q", bs.State, bs.Message)
	}
	for _, p := range pods {
		if p.Labels[v1.LabelUser] != user {
			continue
		}
		var restarts int32
		podReady := false
		for _, cs := range p.Status.ContainerStatuses {
			restarts += cs.RestartCount
			podReady = cs.Ready
		}
		at += fmt.Sprintf(", pod %s %s ready=%v restarts=%d", p.Name, p.Status.Phase, podReady, restarts)
	}
	switch {
	case herr == nil && !listed:
		return at, false, errors.New("the hub gave it up")
	case berr == nil && ok && (bs.State == v1.StateFailed || bs.State == v1.StateStopped):
		return at, false, errors.New("the broker's server " + string(bs.State))
	}
	return at, false, nil
}

// stopHub stops user's default server through the hub's REST API and
// waits until the hub has no server for user and no pod of user's is left.
func (h *hubEnv) stopHub(t testing.TB, user string) {
	t.Helper()
	h.stopAtHub(t, user)
	h.waitNoPods(t, user)
}

// stopAtHub stops user's default server through the hub's REST API and
// waits until the hub has no server for user.
func (h *hubEnv) stopAtHub(t testing.TB, user string) {
	t.Helper()
	ctx := t.Context()
	status, b, err := h.hubAPI(ctx, http.MethodDelete, "/users/"+user+"/server", nil)
	if err != nil || (status != http.StatusNoContent && status != http.StatusAccepted) {
		t.Fatalf("DELETE /hub/api/users/%s/server: %d %s %v", user, status, b, err)
	}
	err = harness.Poll(ctx, 100*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		s, err := h.hubServers(ctx, user)
		if err != nil {
			return false, err.Error(), nil
		}
		return len(s) == 0, fmt.Sprintf("%+v", s), nil
	})
	if err != nil {
		t.Fatalf("the hub still has %s's server: %v", user, err)
	}
}

// userPods lists the notebook pods of user.
func (e *env) userPods(ctx context.Context, user string) ([]corev1.Pod, error) {
	l, err := e.cluster.Client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{
		LabelSelector: v1.LabelManagedBy + "=" + v1.ManagedByValue + "," + v1.LabelUser + "=" + user,
	})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// waitNoPods waits until user has no notebook pod.
func (e *env) waitNoPods(t testing.TB, user string) {
	t.Helper()
	err := harness.Poll(t.Context(), 100*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		pods, err := e.userPods(ctx, user)
		if err != nil {
			return false, err.Error(), nil
		}
		return len(pods) == 0, fmt.Sprintf("%d pods", len(pods)), nil
	})
	if err != nil {
		t.Fatalf("%s's pods are still there: %v", user, err)
	}
}

// brokerServer is user's default hub server as the broker reports it, read
// with the hub's token acting for user; ok is false when there is none.
func (h *hubEnv) brokerServer(ctx context.Context, user string) (v1.Server, bool, error) {
	s, err := h.client(user, "ml").GetServer(ctx, user, hubDefaultServer)
	var ae *harness.APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return v1.Server{}, false, nil
	}
	return s, err == nil, err
}
