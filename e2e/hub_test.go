package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/spawner"
)

// TestJupyterHub runs Debian's JupyterHub 3.0 with GPUBrokerSpawner in
// front of a real broker whose pods are real jupyterhub-singleuser
// processes; one hub and one broker serve every sub-test in turn.
func TestJupyterHub(t *testing.T) {
	t.Parallel()
	h := newHubEnv(t, envOptions{nodes: 2, gpusPerNode: 2})
	t.Run("a user in the browser: sign in, pick a profile, progress, a cell, stop", h.browserJourney)
	t.Run("a quota refusal shows the broker's words on the spawn page", h.quotaRefusal)
	t.Run("the hub restarted while a server runs finds it again", h.restartWhileRunning)
	t.Run("the hub killed during a spawn leaves nothing behind", h.killDuringSpawn)
	t.Run("10 users spawning at once through the hub's REST API", h.manyAtOnce)
}

// signIn signs user in on the hub's login page (DummyAuthenticator takes
// any password).
func (h *hubEnv) signIn(b *tab, user string) {
	b.t.Helper()
	b.open(h.hub.URL + "/hub/login")
	b.set("#username_input", user)
	b.set("#password_input", "any")
	b.click("#login_submit")
	b.waitFor("signed in at the hub", `location.pathname.startsWith('/hub/') && !location.pathname.startsWith('/hub/login')`)
}

// browserJourney: alice signs in at the hub, picks medium on the hub's
// spawn page, the hub's progress page shows the broker's words while her
// pod waits for the node, she lands in the notebook through the hub's
// proxy and runs print(6*7); she stops the server on the hub's home page:
// her pod is gone and the slice freed.
func (h *hubEnv) browserJourney(t *testing.T) {
	ctx := t.Context()
	b := newTab(t)
	h.signIn(b, "alice")
	b.open(h.hub.URL + "/hub/spawn")
	b.waitFor("the spawn page with the broker's profiles", `document.querySelectorAll('#spawn_form input[name=profile]').length === 2`)
	if text := eval[string](b, `document.getElementById('spawn_form').innerText`); !strings.Contains(text, "24 GiB GPU memory") {
		t.Errorf("the spawn page does not describe medium's slice:\n%s", text)
	}
	b.shot("hub-spawn-form")
	// Until the node's hook is back the pod waits: the progress page shows
	// for sure.
	if err := h.hook.remove(); err != nil {
		t.Fatal(err)
	}
	b.click(`#spawn_form input[name=profile][value=medium]`)
	b.click(`#spawn_form input[type=submit]`)
	b.waitFor("the hub's progress page", `location.pathname.startsWith('/hub/spawn-pending/alice') && document.getElementById('progress-bar') !== null`)

	var waiting v1.Server
	err := harness.Poll(ctx, 100*time.Millisecond, pageTimeout, func(ctx context.Context) (bool, string, error) {
		s, ok, err := h.brokerServer(ctx, "alice")
		if err != nil || !ok {
			return false, fmt.Sprint(ok, err), nil
		}
		waiting = s
		return (s.State == v1.StateCreating || s.State == v1.StateStarting) && s.Message != "", fmt.Sprintf("%s %q", s.State, s.Message), nil
	})
	if err != nil {
		t.Fatalf("the broker's server of alice's spawn: %v", err)
	}
	b.waitFor("the broker's words in the hub's event log", `Array.from(document.querySelectorAll('#progress-log .progress-log-event')).some(e => e.textContent === `+jsString(waiting.Message)+`)`)
	if p := eval[int](b, `Number(document.getElementById('progress-bar').getAttribute('aria-valuenow'))`); p <= 0 || p >= 100 {
		t.Errorf("the progress bar stands at %d %% while the pod waits, want between 0 and 100", p)
	}
	b.shot("hub-progress")
	if err := h.hook.install(); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the notebook's own file list, through the hub's proxy", `location.pathname.startsWith('/user/alice/tree') && document.querySelector('#notebook_list') !== null`)
	if origin := eval[string](b, `location.origin`); origin != h.hub.URL {
		t.Errorf("the notebook is served at %s, want the hub's proxy %s", origin, h.hub.URL)
	}
	b.shot("hub-notebook-tree")

	created := eval[int](b, `fetch('/user/alice/api/contents/e2e.ipynb', {method: 'PUT',
		headers: {'Content-Type': 'application/json', 'X-XSRFToken': (document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || ''},
		body: JSON.stringify({type: 'notebook', content: {cells: [{cell_type: 'code', source: '', metadata: {}, outputs: [], execution_count: null}],
		metadata: {kernelspec: {name: 'python3', display_name: 'Python 3', language: 'python'}}, nbformat: 4, nbformat_minor: 5}})}).then(r => r.status)`)
	if created != 201 && created != 200 {
		t.Fatalf("create the notebook file through the hub's proxy: HTTP %d", created)
	}
	b.open(h.hub.URL + "/user/alice/notebooks/e2e.ipynb")
	b.waitFor("the kernel connected", `window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel && Jupyter.notebook.kernel.is_connected() && Jupyter.notebook.get_cell(0) !== null`)
	b.do("run print(6*7)", chromedp.Evaluate[chromedp.Void](`(function () { var c = Jupyter.notebook.get_cell(0); c.set_text('print(6*7)'); c.execute(); })()`))
	b.waitFor("42 on the page", `Array.from(document.querySelectorAll('.output_subarea')).some(e => e.innerText.trim() === '42')`)
	b.shot("hub-notebook-42")

	running, ok, err := h.brokerServer(ctx, "alice")
	if err != nil || !ok || running.State != v1.StateRunning || running.Profile != "medium" {
		t.Fatalf("alice's server at the broker: %+v %v %v, want running with medium", running, ok, err)
	}
	b.open(h.hub.URL + "/hub/home")
	// The button works once the page's script has bound it (require.js
	// loads it after the page).
	b.waitFor("the home page's script", `window.jQuery && (jQuery._data(document.getElementById('stop'), 'events') || {}).click`)
	b.click("#stop")
	b.waitFor("the home page offering a start again", `document.getElementById('stop') === null || document.getElementById('stop').offsetParent === null`)
	b.shot("hub-home-stopped")
	h.waitNoPods(t, "alice")
	h.waitNoAllocations(t, ctx)
	if s, _, err := h.brokerServer(ctx, "alice"); err != nil || s.State != v1.StateStopped {
		t.Errorf("alice's server at the broker after the stop: %s, %v", s.State, err)
	}
}

// quotaRefusal: carol may hold 8 GiB of GPU memory and picks medium (24
// GiB): the spawn page shows the broker's refusal in its words; nothing
// is left at the broker, in the cluster or in the hub.
func (h *hubEnv) quotaRefusal(t *testing.T) {
	ctx := t.Context()
	// The broker's own words for this refusal, asked the way the class
	// asks (the hub's token, for carol).
	_, _, err := h.client("carol", "ml").CreateServer(ctx, "carol", "probe", "k-probe", v1.CreateServerRequest{Profile: "medium"})
	var ae *harness.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusForbidden || ae.Body.Message == "" {
		t.Fatalf("the broker's answer to carol asking for medium: %v, want a 403 refusal", err)
	}
	want := ae.Body.Message

	b := newTab(t)
	h.signIn(b, "carol")
	b.open(h.hub.URL + "/hub/spawn")
	b.click(`#spawn_form input[name=profile][value=medium]`)
	b.click(`#spawn_form input[type=submit]`)
	b.waitFor("the refusal on the page", `document.body.innerText.includes(`+jsString(want)+`)`)
	b.shot("hub-quota-refused")
	if text := b.text(); strings.Contains(text, "Traceback") || strings.Contains(text, "Internal Server Error") {
		t.Errorf("the refusal page reads like a crash:\n%s", text)
	}

	if s, ok, err := h.brokerServer(ctx, "carol"); err != nil || (ok && s.State != v1.StateFailed && s.State != v1.StateStopped) {
		t.Errorf("carol's server at the broker after the refusal: %+v (exists %v), %v", s, ok, err)
	}
	pods, err := h.userPods(ctx, "carol")
	if err != nil || len(pods) != 0 {
		t.Errorf("carol's pods after the refusal: %d, %v", len(pods), err)
	}
	if use := h.allocated(t); len(use) != 0 {
		t.Errorf("slices allocated after the refusal: %+v", use)
	}
	srv, err := h.hubServers(ctx, "carol")
	if err != nil || len(srv) != 0 {
		t.Errorf("the hub's servers of carol after the refusal: %+v, %v; want none", srv, err)
	}
	// And she can start what her quota allows.
	if _, err := h.spawn(ctx, "carol", "small"); err != nil {
		t.Fatal(err)
	}
	if err := h.waitHubReady(ctx, "carol", 2*time.Minute); err != nil {
		t.Fatalf("carol's small server: %v", err)
	}
	h.stopHub(t, "carol")
}

// restartWhileRunning: bob's server runs; the hub stops and starts again:
// its poll() finds the server, the hub routes /user/bob/ to it again, and
// there is still one pod, of the same spawn.
func (h *hubEnv) restartWhileRunning(t *testing.T) {
	ctx := t.Context()
	if _, err := h.spawn(ctx, "bob", "small"); err != nil {
		t.Fatal(err)
	}
	if err := h.waitHubReady(ctx, "bob", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	before, ok, err := h.brokerServer(ctx, "bob")
	if err != nil || !ok || before.State != v1.StateRunning {
		t.Fatalf("bob's server at the broker: %+v %v %v", before, ok, err)
	}
	if err := h.hub.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := h.hub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.waitHubReady(ctx, "bob", time.Minute); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	// Through the new proxy, once the hub has put bob's route back: the
	// notebook's own API with a token allowed to access servers.
	err = harness.Poll(ctx, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
		status, body, err := h.hubGet(ctx, "/user/bob/api/status")
		if err != nil {
			return false, err.Error(), nil
		}
		return status == http.StatusOK && strings.Contains(string(body), "kernels"), fmt.Sprintf("%d %.200s", status, body), nil
	})
	if err != nil {
		t.Fatalf("bob's notebook through the restarted hub's proxy: %v", err)
	}
	// The token the broker's reclaimer probes a hub notebook with: the one
	// the hub gave that server (in its Secret), never the hub's own.
	sec, err := h.cluster.Client.CoreV1().Secrets(h.ns).Get(ctx, spawner.SecretName("bob", before.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own := string(sec.Data[spawner.EnvHubAPIToken])
	if own == "" {
		t.Fatalf("bob's Secret holds no %s", spawner.EnvHubAPIToken)
	}
	status, body, err := h.hubCallAs(ctx, own, http.MethodGet, "/user/bob/api/status?no_track_activity=1", nil)
	if err != nil || status != http.StatusOK || !strings.Contains(string(body), "kernels") {
		t.Errorf("bob's notebook with its own server token: %d %.200s %v; want its status (the reclaimer's probe of hub notebooks needs it)", status, body, err)
	}
	pods, err := h.userPods(ctx, "bob")
	if err != nil || len(pods) != 1 || pods[0].Labels[v1.LabelSpawnID] != before.SpawnID {
		t.Fatalf("bob's pods after the restart: %d (%v), want one, of spawn %s", len(pods), err, before.SpawnID)
	}
	if after, _, err := h.brokerServer(ctx, "bob"); err != nil || after.SpawnID != before.SpawnID || after.State != v1.StateRunning {
		t.Errorf("bob's server after the restart: %+v %v, want spawn %s running", after, err, before.SpawnID)
	}
	h.stopHub(t, "bob")
}

// killDuringSpawn: the hub is killed (SIGKILL, its proxy with it) while
// dave's pod waits for the node; the restarted hub finds a server it never
// saved: it stops it at the broker, so no pod or slice is left, and dave's
// next start works.
func (h *hubEnv) killDuringSpawn(t *testing.T) {
	ctx := t.Context()
	if err := h.hook.remove(); err != nil {
		t.Fatal(err)
	}
	installed := false
	defer func() {
		if !installed {
			_ = h.hook.install()
		}
	}()
	// The POST waits for the spawn (slow_spawn_timeout); the kill ends it.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = h.spawn(ctx, "dave", "small")
	}()
	err := harness.Poll(ctx, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
		pods, err := h.userPods(ctx, "dave")
		if err != nil {
			return false, err.Error(), nil
		}
		return len(pods) == 1, fmt.Sprintf("%d pods", len(pods)), nil
	})
	if err != nil {
		t.Fatalf("dave's pod: %v", err)
	}
	if err := h.hub.Kill(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := h.hub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h.waitNoPods(t, "dave")
	h.waitNoAllocations(t, ctx)
	if s, ok, err := h.brokerServer(ctx, "dave"); err != nil || (ok && s.State != v1.StateStopped) {
		t.Errorf("dave's server at the broker after the restart: %+v (exists %v), %v; want stopped", s, ok, err)
	}
	if srv, err := h.hubServers(ctx, "dave"); err != nil || len(srv) != 0 {
		t.Errorf("the restarted hub's servers of dave: %+v, %v; want none", srv, err)
	}

	if err := h.hook.install(); err != nil {
		t.Fatal(err)
	}
	installed = true
	if _, err := h.spawn(ctx, "dave", "small"); err != nil {
		t.Fatal(err)
	}
	if err := h.waitHubReady(ctx, "dave", 2*time.Minute); err != nil {
		t.Fatalf("dave's next start: %v", err)
	}
	if pods, err := h.userPods(ctx, "dave"); err != nil || len(pods) != 1 {
		t.Errorf("dave's pods after the next start: %d, %v; want one", len(pods), err)
	}
	h.stopHub(t, "dave")
	h.waitNoAllocations(t, ctx)
}

// manyAtOnce: u0…u9 ask the hub for a server at the same moment, small
// and medium in turn; all get ready, each pod carries its profile's slice,
// and no GPU holds more memory or compute than it has.
func (h *hubEnv) manyAtOnce(t *testing.T) {
	ctx := t.Context()
	users := manyUsers()
	profile := func(i int) string { return []string{"small", "medium"}[i%2] }
	start := time.Now()
	errs := make([]error, len(users))
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Go(func() {
			_, errs[i] = h.spawn(ctx, u, profile(i))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("spawns: %v", err)
	}
	if err := h.waitSpawnsReady(ctx, users); err != nil {
		t.Fatalf("spawns: %v", err)
	}
	t.Logf("10 hub spawns ready in %s", time.Since(start).Round(time.Millisecond))
	defer func() {
		for _, u := range users {
			h.stopHub(t, u)
		}
		h.waitNoAllocations(t, ctx)
	}()

	pods, err := h.pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != len(users) {
		t.Fatalf("%d notebook pods, want %d", len(pods), len(users))
	}
	type use struct {
		mem     int64
		compute int
	}
	perGPU := map[string]use{}
	for i, u := range users {
		var pod *corev1.Pod
		for j := range pods {
			if pods[j].Labels[v1.LabelUser] == u {
				pod = &pods[j]
			}
		}
		if pod == nil {
			t.Errorf("%s has no pod", u)
			continue
		}
		want := hubSlices[profile(i)]
		a := pod.Annotations
		got := fmt.Sprintf("%s %s/%s/%s", a[v1.AnnotationProfile], a[v1.AnnotationMemoryMiB], a[v1.AnnotationComputePercent], a[v1.AnnotationComputeLimitPercent])
		if w := fmt.Sprintf("%s %d/%d/%d", profile(i), want.MemoryMiB, want.ComputePercent, want.ComputeLimitPercent); got != w {
			t.Errorf("%s's pod carries %q, want %q", u, got, w)
		}
		g := perGPU[a[v1.AnnotationGPUUUID]]
		g.mem += want.MemoryMiB
		g.compute += want.ComputePercent
		perGPU[a[v1.AnnotationGPUUUID]] = g
	}
	alloc := h.allocated(t)
	for uuid, g := range perGPU {
		if _, ok := h.gpuByUUID(uuid); !ok {
			t.Errorf("pods placed on unknown GPU %q", uuid)
		}
		if g.mem > gpuMemoryMiB || g.compute > 100 {
			t.Errorf("GPU %s overcommitted: %d MiB of %d, %d %% compute", uuid, g.mem, gpuMemoryMiB, g.compute)
		}
		if a := alloc[uuid]; a.memoryMiB != g.mem || a.computePercent != g.compute {
			t.Errorf("GPU %s: the broker counts %+v, the pods hold %d MiB and %d %%", uuid, a, g.mem, g.compute)
		}
	}
	t.Logf("placement per GPU: %+v", perGPU)
}
