package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/api/v1/v1test"
	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/e2e/testdeps"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// The browser tests drive Debian's Chromium (headless, through chromedp)
// against a real `gpubroker serve` with its web pages on, a real
// redis-server, the kube-apiserver and kwok of the suite, and a devissuer
// doing the authorization-code flow. The broker sits behind a small reverse
// proxy whose address is known before the broker starts, because the
// issuer's registered redirect URI and the broker's --public-url need it
// (an ingress plays that part in a cluster).
//
// Every page visited is saved as a PNG under test-artifacts/screenshots/
// at the repository root (gitignored), named after the test and the page.
// Screenshots are artifacts, never verdicts: one that cannot be taken in
// time is skipped with a note in the test's log.
//
// No browser call runs without a deadline, and each test has a browser
// budget (browserBudget): a slow machine makes a test slower or, past the
// budget, fail with the page's URL and HTML, never hang.

// chromiumPath is Debian's Chromium.
const chromiumPath = "/usr/bin/chromium"

// screenshotDir is where the pages' screenshots go (the e2e tests run in
// e2e/).
var screenshotDir = filepath.Join("..", "test-artifacts", "screenshots")

// The deadlines of the browser calls. A loaded CI machine (two cores, the
// race detector, three browsers) is slow, never stuck: these are generous,
// and every call has one.
const (
	// pageTimeout bounds one wait for a page state, and one interaction
	// with an element (waiting for it to be visible included).
	pageTimeout = 30 * time.Second
	// actionTimeout bounds one browser call that does not wait for a page
	// state: a navigation, an evaluation, a key press.
	actionTimeout = 30 * time.Second
	// attemptTimeout bounds one try within a wait, so that a single stuck
	// call does not eat the whole wait.
	attemptTimeout = 10 * time.Second
	// shotTimeout bounds one screenshot, waiting for the page included.
	shotTimeout = 10 * time.Second
	// reportTimeout bounds reading the page's state when a test fails.
	reportTimeout = 15 * time.Second
	// browserBudget bounds a whole browser test from its tab's start: once
	// it is spent, every browser call fails and the test with it, saying
	// so.
	browserBudget = 3 * time.Minute
	// browserGrace is how long after the budget the browser itself is
	// stopped, the backstop for anything that ignored a deadline.
	browserGrace = time.Minute
)

// htmlTailBytes is how much of the page's HTML a failure shows.
const htmlTailBytes = 3000

// browserEnv is an env whose broker serves the web pages at public.
type browserEnv struct {
	*env
	public string
}

// newBrowserEnv starts the parts for one browser test: namespace, one node
// with one GPU, redis-server, devissuer (users alice in ml and root in the
// admin group, the broker as a confidential client), the broker with
// --public-url and --oidc-client-secret-file, and the proxy. With held, the
// node is not managed by kwok yet, so pods placed there stay pending until
// the test calls releaseNode: the test decides when a server gets to run.
func newBrowserEnv(t *testing.T, held bool, brokerArgs ...string) *browserEnv {
	t.Helper()
	return newBrowserEnvWith(t, browserOptions{held: held, brokerArgs: brokerArgs})
}

// browserOptions vary a browser env.
type browserOptions struct {
	// held: the node is not managed by kwok yet (see newBrowserEnv).
	held bool
	// notebooks: the node is a pod runner's, whose pods run as real
	// notebook servers (notebookProfiles).
	notebooks bool
	// hostMode serves notebooks in host mode under the notebook domain
	// "localhost" (Chromium sends every *.localhost name to this machine);
	// the public URL is then http://localhost:<port>. Else path mode.
	hostMode bool
	// brokerArgs are more gpubroker serve flags.
	brokerArgs []string
}

// newBrowserEnvWith is newBrowserEnv with options.
func newBrowserEnvWith(t *testing.T, o browserOptions) *browserEnv {
	t.Helper()
	c := needCluster(t)
	bin := brokerBinary(t)
	e := &env{t: t, cluster: c}
	e.ns = newNamespace(t, c)
	profiles := testProfiles
	switch {
	case o.notebooks:
		e.runner, e.nodes, e.hook = newRunnerNodes(t, c, e.ns, 1)
		profiles = notebookProfiles
	case o.held:
		e.nodes = []string{heldNode(t, c)}
	default:
		e.nodes = newNodes(t, c, 1)
	}
	e.gpus = []v1.GPU{{UUID: "GPU-" + e.ns + "-0", Node: e.nodes[0], Model: gpuModel, MemoryMiB: gpuMemoryMiB, SMCount: gpuSMs, Healthy: true}}
	e.redis = redistest.Start(t)

	proxy := httptest.NewUnstartedServer(nil)
	public := "http://" + proxy.Listener.Addr().String()
	args := []string{"--notebook-mode=path"}
	if o.hostMode {
		public = "http://localhost:" + strconv.Itoa(proxy.Listener.Addr().(*net.TCPAddr).Port)
		args = []string{"--notebook-mode=host", "--notebook-domain=localhost"}
	}
	secret := "web-" + harness.UniqueName("secret")
	e.issuer = devissuer.StartTest(t,
		devissuer.WithUsers(
			devissuer.User{Username: "alice", Email: "alice@example.org", Groups: []string{"ml"}},
			devissuer.User{Username: "root", Email: "root@example.org", Groups: []string{adminGroup}}),
		devissuer.WithClient(devissuer.Client{ID: audience, Secret: secret,
			RedirectURIs: []string{public + "/auth/callback"}, PostLogoutRedirectURIs: []string{public + "/auth/signed-out"}}))
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "client-secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := harness.StartBroker(t.Context(), harness.BrokerOptions{
		Binary: bin, Dir: dir, RedisURL: e.redis.URL(), Kubeconfig: c.BrokerKubeconfig, Namespace: e.ns,
		IssuerURL: e.issuer.URL(), Audience: audience, ProfilesYAML: profiles,
		ReconcileInterval: time.Second, OrphanGrace: 2 * time.Second,
		Args: append(append(args, "--public-url="+public, "--oidc-client-secret-file="+secretFile), o.brokerArgs...),
	})
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	e.broker = b
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("stop broker: %v", err)
		}
		if t.Failed() {
			t.Logf("--- %s, last 80 lines:\n%s", b.LogPath, b.LogTail(80))
			keepLog(t, b.LogPath)
		}
	})
	target, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The proxy has a transport of its own: every httptest.Server.Close
	// in this process (the other parallel tests' proxies, issuers)
	// calls http.DefaultTransport.CloseIdleConnections, which can cut a
	// page's response mid-body (golang/go#65796).
	transport := http.DefaultTransport.(*http.Transport).Clone()
	rp := httputil.NewSingleHostReverseProxy(target) // keeps the public Host header
	rp.Transport = transport
	proxy.Config.Handler = rp
	proxy.Start()
	t.Cleanup(transport.CloseIdleConnections)
	t.Cleanup(proxy.Close)
	e.admin = e.client("admin", adminGroup)
	e.registerGPUs()
	e.waitFirstPass(e.broker)
	return &browserEnv{env: e, public: public}
}

// heldNode creates a Node that kwok does not manage (no kwok annotation):
// a pod pinned to it stays Pending. It is deleted when t ends.
func heldNode(t *testing.T, c *harness.Cluster) string {
	t.Helper()
	name := harness.UniqueName(t.Name()) + "-held"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "gpubroker.io/e2e": "true"}}}
	if _, err := c.Client.CoreV1().Nodes().Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		if err := c.DeleteNodes(ctx, name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return name
}

// releaseNode hands the held node to kwok, which makes it Ready, and then
// touches the pods on it: kwok runs a pod when it sees the pod change on a
// node it manages, not when the node becomes managed.
func (e *browserEnv) releaseNode() {
	e.t.Helper()
	ctx := e.t.Context()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"fake"}}}`, harness.KwokNodeAnnotation)
	if _, err := e.cluster.Client.CoreV1().Nodes().Patch(ctx, e.nodes[0], types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("release node %s: %v", e.nodes[0], err)
	}
	err := harness.Poll(ctx, 100*time.Millisecond, pageTimeout, func(ctx context.Context) (bool, string, error) {
		n, err := e.cluster.Client.CoreV1().Nodes().Get(ctx, e.nodes[0], metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, "", nil
			}
		}
		return false, "not Ready", nil
	})
	if err != nil {
		e.t.Fatalf("released node %s: %v", e.nodes[0], err)
	}
	pods, err := e.pods(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods {
		if _, err := e.cluster.Client.CoreV1().Pods(e.ns).Patch(ctx, p.Name, types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"gpubroker.io/e2e-released":"true"}}}`), metav1.PatchOptions{}); err != nil {
			e.t.Fatalf("touch pod %s: %v", p.Name, err)
		}
	}
}

// tab is one headless Chromium tab of a test.
//
// Every browser call runs under a context with a deadline, derived from the
// tab's context as chromedp documents (the tab itself is started without
// one): a call ends after its own timeout, or when the test's browser budget
// is spent, whichever comes first. Nothing the browser does can hang a test.
type tab struct {
	t *testing.T
	// tabCtx is chromedp's context of the tab; it lives until t ends. Only
	// the failure report derives from it directly, so that it can still
	// read the page after the budget is spent.
	tabCtx context.Context
	// ctx is tabCtx ending with the browser budget; every call derives
	// from it.
	ctx   context.Context
	start time.Time
	n     int // screenshots taken
}

// newTab starts Chromium with a fresh profile and a 1280×900 viewport; it is
// closed when t ends. The test's browser budget starts now.
func newTab(t *testing.T) *tab {
	t.Helper()
	testdeps.Need(t, chromiumPath)
	start := time.Now()
	// The browser's own lifetime is the backstop: whatever ignored a
	// deadline, the browser is gone shortly after the budget, which ends
	// every call on it.
	life, cancelLife := context.WithDeadline(t.Context(), start.Add(browserBudget+browserGrace))
	t.Cleanup(cancelLife)
	alloc, cancelAlloc := chromedp.NewExecAllocator(life,
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	t.Cleanup(cancelAlloc) // waits for the browser to exit
	tabCtx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(cancelTab)
	// The first call starts the browser and binds it to the context it
	// gets: no timeout of its own here (chromedp.NewContext), the
	// browser's lifetime above bounds it.
	if err := chromedp.Do(tabCtx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	ctx, cancel := context.WithDeadline(tabCtx, start.Add(browserBudget))
	t.Cleanup(cancel)
	b := &tab{t: t, tabCtx: tabCtx, ctx: ctx, start: start}
	// A viewport that is set, not left to the headless window: a page
	// never lays out at zero width.
	b.viewport(1280, 900)
	// Screenshots of an earlier run of this test would mislead.
	old, _ := filepath.Glob(filepath.Join(screenshotDir, shotPrefix(t)+"-*.png"))
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			t.Logf("remove old screenshot: %v", err)
		}
	}
	return b
}

// run runs one browser action under a context that ends after d, or with
// the budget.
func run[T any](b *tab, d time.Duration, a chromedp.Action[T]) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, d)
	defer cancel()
	return chromedp.Run(ctx, a)
}

// do runs actions within actionTimeout, failing the test with the page's
// state on error.
func (b *tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if _, err := run(b, actionTimeout, chromedp.Steps(actions...)); err != nil {
		b.fail(what, err)
	}
}

// open navigates to u and waits for the page to load.
func (b *tab) open(u string) { b.t.Helper(); b.do("open "+u, chromedp.Navigate(u)) }

// openResponse navigates to u, waits for the page to load and returns the
// HTTP response of its document.
func (b *tab) openResponse(u string) *network.Response {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, actionTimeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Navigate(u))
	if err != nil {
		b.fail("open "+u, err)
	}
	return resp
}

// viewport sets the page's viewport in CSS pixels (kept across
// navigations).
func (b *tab) viewport(width, height int64) {
	b.t.Helper()
	b.do(fmt.Sprintf("set the viewport to %d×%d", width, height), chromedp.EmulateViewport(width, height))
}

func (b *tab) click(css string) {
	b.t.Helper()
	b.act("click "+css, css, chromedp.Click(chromedp.CSS(css)))
}

func (b *tab) set(css, value string) {
	b.t.Helper()
	b.act("set "+css, css, chromedp.SetValue(chromedp.CSS(css), value))
}

func (b *tab) focus(css string) {
	b.t.Helper()
	b.act("focus "+css, css, chromedp.Focus(chromedp.CSS(css)))
}

// act waits until the element css selects (DOM.querySelector) is visible
// and then runs a on it, all within pageTimeout. A page that replaces its
// document meanwhile (a navigation, a reload) leaves the query with a node
// the browser no longer knows ("Could not find node with given id"): act
// then runs the query and a again on the new document, until the deadline.
// Other errors fail at once.
func (b *tab) act(what, css string, a chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	err := harness.Poll(b.ctx, 100*time.Millisecond, pageTimeout, func(ctx context.Context) (bool, string, error) {
		err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(css)), a)
		switch {
		case err == nil:
			return true, "", nil
		case ctx.Err() != nil: // Poll reports the deadline
			return false, "not visible: " + err.Error(), nil
		case stale(err):
			return false, err.Error(), nil
		}
		return false, "", err
	})
	if err != nil {
		b.fail(what, err)
	}
}

// staleMessages are the browser's answers about a node or a script context
// of a document that a navigation has replaced.
var staleMessages = []string{
	"Could not find node with given id",
	"No node with given id found",
	"Node with given id does not belong to the document",
	"Cannot find context with specified id",
	"Execution context was destroyed",
	"Inspected target navigated or closed",
}

// stale reports whether err says that the document changed under the call,
// so that the same call on the new document may well succeed.
func stale(err error) bool {
	if errors.Is(err, chromedp.ErrInvalidDimensions) { // not laid out yet
		return true
	}
	var e *cdproto.Error
	if !errors.As(err, &e) {
		return false
	}
	for _, m := range staleMessages {
		if strings.Contains(e.Message, m) {
			return true
		}
	}
	return false
}

// eval returns a JavaScript expression's value, awaiting a promise. An
// evaluation that a navigation interrupts runs again on the new page, within
// pageTimeout.
func eval[T any](b *tab, expr string) T {
	b.t.Helper()
	var v T
	err := harness.Poll(b.ctx, 100*time.Millisecond, pageTimeout, func(ctx context.Context) (bool, string, error) {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		defer cancel()
		got, err := chromedp.Run(actx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
		switch {
		case err == nil:
			v = got
			return true, "", nil
		case stale(err), actx.Err() != nil:
			return false, err.Error(), nil
		}
		return false, "", err
	})
	if err != nil {
		b.fail("evaluate "+expr, err)
	}
	return v
}

// waitFor waits until the JavaScript expression is true on the current
// page; pages that are loading or navigating count as false. A page counts
// once it has loaded: an element near the top of a page that is still
// arriving is not the page (its later fields and its script's focus are
// missing).
func (b *tab) waitFor(what, expr string) {
	b.t.Helper()
	err := harness.Poll(b.ctx, 100*time.Millisecond, pageTimeout, func(ctx context.Context) (bool, string, error) {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		defer cancel()
		ok, err := chromedp.Run(actx, chromedp.Evaluate[bool]("document.readyState === 'complete' && Boolean("+expr+")"))
		if err != nil {
			return false, err.Error(), nil
		}
		return ok, "false", nil
	})
	if err != nil {
		b.fail(what, err)
	}
}

// text is the visible text of the page's main element.
func (b *tab) text() string {
	b.t.Helper()
	return eval[string](b, `(document.querySelector('main') || document.body).innerText`)
}

// shot saves a full-page PNG screenshot as <test>-<nn>-<name>.png. A
// screenshot is an artifact, never a verdict: one that cannot be taken
// within shotTimeout (a page still at zero width, a page being replaced, a
// spent budget) is skipped with a note in the log.
func (b *tab) shot(name string) {
	b.t.Helper()
	b.shotFrom(b.ctx, name)
}

// shotFrom is shot under parent, a context derived from the tab's.
func (b *tab) shotFrom(parent context.Context, name string) {
	b.t.Helper()
	b.n++
	png, err := capture(parent)
	if err != nil {
		b.t.Logf("screenshot %s skipped: %v", name, err)
		return
	}
	if err := os.MkdirAll(screenshotDir, 0o755); err != nil {
		b.t.Logf("screenshot %s skipped: %v", name, err)
		return
	}
	file := filepath.Join(screenshotDir, fmt.Sprintf("%s-%02d-%s.png", shotPrefix(b.t), b.n, name))
	if err := os.WriteFile(file, png, 0o644); err != nil {
		b.t.Logf("screenshot %s skipped: %v", name, err)
	}
}

// capture takes a full-page PNG once the body is visible and the page is
// loaded and laid out at a width above zero, all within shotTimeout.
func capture(parent context.Context) ([]byte, error) {
	var png []byte
	err := harness.Poll(parent, 100*time.Millisecond, shotTimeout, func(ctx context.Context) (bool, string, error) {
		if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("body"))); err != nil {
			return false, "body not visible: " + err.Error(), nil
		}
		width, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.readyState === 'complete' ? document.documentElement.scrollWidth : 0`))
		switch {
		case err != nil:
			return false, err.Error(), nil
		case width == 0:
			return false, "the page is loading or has zero width", nil
		}
		shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			return false, err.Error(), nil
		}
		png = shot
		return true, "", nil
	})
	return png, err
}

// shotPrefix starts the names of t's screenshots.
func shotPrefix(t *testing.T) string { return strings.ReplaceAll(t.Name(), "/", "_") }

// fail ends the test with what failed, why, and where the page was: its URL
// and the tail of its HTML, read under a deadline of their own (the budget
// may be what is spent).
func (b *tab) fail(what string, err error) {
	b.t.Helper()
	if b.ctx.Err() != nil {
		what = fmt.Sprintf("%s: the browser test ran past its budget of %s (started %s)",
			what, browserBudget, b.start.UTC().Format(time.TimeOnly))
	}
	ctx, cancel := context.WithTimeout(b.tabCtx, reportTimeout)
	defer cancel()
	at, html := b.location(ctx), b.htmlTail(ctx)
	b.shotFrom(ctx, "failure") // with what is left of reportTimeout
	b.t.Fatalf("%s: %v\nat %s\npage HTML, last %d bytes:\n%s", what, err, at, htmlTailBytes, html)
}

// location is the page's URL.
func (b *tab) location(ctx context.Context) string {
	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	u, err := chromedp.Run(actx, chromedp.Location())
	if err != nil {
		return "(unknown: " + err.Error() + ")"
	}
	return u
}

// htmlTail is the end of the page's HTML, where the main content and the
// scripts' changes are.
func (b *tab) htmlTail(ctx context.Context) string {
	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	html, err := chromedp.Run(actx, chromedp.Evaluate[string](`document.documentElement ? document.documentElement.outerHTML : ''`))
	if err != nil {
		return "(unknown: " + err.Error() + ")"
	}
	if len(html) > htmlTailBytes {
		html = "…" + html[len(html)-htmlTailBytes:]
	}
	return html
}

// signIn signs in as user through the issuer's form, starting at path.
func (e *browserEnv) signIn(b *tab, user, path string) {
	b.t.Helper()
	b.open(e.public + path)
	b.waitFor("the issuer's sign-in form", `location.href.startsWith(`+jsString(e.issuer.URL()+devissuer.AuthorizePath)+`) && document.querySelector('button[value="`+user+`"]')`)
	b.shot("issuer-form")
	b.click(`button[value="` + user + `"]`)
	b.waitFor("back on "+path+" signed in", `location.href === `+jsString(e.public+path)+` && document.querySelector('.who strong') && document.querySelector('.who strong').textContent === `+jsString(user))
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestBrowserUserJourney: alice signs in, launches a server, watches the
// page follow it to running, a resize and a stop made elsewhere, and after
// every one of these transitions the live page equals a fresh load of its
// URL (no step bar once running, the resize and extend forms, the idle
// state, Start again once stopped); she sees an honest empty usage chart
// and then the chart of the samples the node agent reports; admin pages
// refuse her; a form post without the CSRF token is refused; logout ends
// the session.
func TestBrowserUserJourney(t *testing.T) {
	t.Parallel()
	// No reclaim cycle after the first: the idle state stays as rendered,
	// so the live page and a fresh load can only differ by the events.
	e := newBrowserEnv(t, true, "--reclaim-interval=1h")
	b := newTab(t)
	e.signIn(b, "alice", "/servers")
	b.waitFor("the servers page", `document.querySelector('h1').textContent === 'My servers'`)
	if got := eval[[]string](b, `[...document.querySelectorAll('input[name=profile]')].map(i => i.value)`); strings.Join(got, ",") != "small,medium" {
		t.Errorf("profiles offered %v, want small,medium", got)
	}
	b.shot("servers-empty")

	// The keyboard alone: the first Tab reaches the skip link; the launch
	// form submits with Enter from the name field (profile small is the
	// preselected radio).
	b.open(e.public + "/servers")
	b.do("press Tab", chromedp.KeyEvent("\t"))
	if got := eval[string](b, `document.activeElement.className + ' ' + document.activeElement.getAttribute('href')`); got != "skip #main" {
		t.Errorf("first Tab focuses %q, want the skip link to #main", got)
	}
	if !eval[bool](b, `document.querySelector('input[name=profile][value=small]').checked && document.querySelector('label[for=name]') !== null`) {
		t.Error("the first profile is not preselected, or the name field has no label")
	}
	b.do("clear the name field", chromedp.Evaluate[chromedp.Void](`document.getElementById('name').value = ''`))
	b.focus(`#name`)
	b.do("type the name and press Enter", chromedp.KeyEvent("nb1\r"))
	b.waitFor("the server page", `document.querySelector('h1') && document.querySelector('h1').textContent === 'Server nb1'`)
	// The node is held: the pod waits, the page follows the event stream.
	b.waitFor("the progress bar at starting", `document.getElementById('status').dataset.state === 'starting' && document.getElementById('progress').value === 4`)
	if !eval[bool](b, `document.getElementById('status').hasAttribute('data-events') && document.getElementById('open') === null`) {
		t.Error("a starting server's page does not follow its events, or offers Open already")
	}
	b.liveEqualsFresh("starting")
	b.shot("server-starting")
	// Mark the page: a reload would lose the mark, so the page can only
	// reach running through the event stream.
	b.do("mark the page", chromedp.Evaluate[chromedp.Void](`window.e2eMark = true`))
	e.releaseNode()
	b.waitFor("the page at running, live", `window.e2eMark && document.getElementById('status').dataset.state === 'running'`)
	b.liveEqualsFresh("running")
	b.waitFor("the Open link from the event stream", `window.e2eMark && document.getElementById('open') && document.getElementById('open').href.startsWith('http://')`)
	if !eval[bool](b, `window.e2eMark && document.getElementById('progress') === null && document.getElementById('resize') !== null && document.getElementById('extend') !== null`) {
		t.Error("the live page at running has a step bar, or lacks the resize and extend forms")
	}
	if got := eval[string](b, `document.getElementById('message').textContent + ' | ' + document.getElementById('idle-state').textContent`); !strings.Contains(got, "running") || strings.Contains(got, "not running") {
		t.Errorf("live page at running says %q, want the API's running message and an idle state of a running server", got)
	}
	// A resize through the API (no node agent here: pending) reaches the
	// live page too.
	mem := int64(16384)
	if _, err := e.client("alice", "ml").Do(t.Context(), http.MethodPatch, harness.ServerPath("alice", "nb1")+"/slice", v1.ResizeRequest{MemoryMiB: &mem}, nil, nil); err != nil {
		t.Fatalf("resize: %v", err)
	}
	b.waitFor("the resize on the live page", `window.e2eMark && document.getElementById('message').textContent.includes('resized to 16384 MiB')`)
	b.liveEqualsFresh("resized")
	text := b.text()
	for _, want := range []string{"No data yet", "Reclaim countdown"} {
		if !strings.Contains(text, want) {
			t.Errorf("server page lacks %q:\n%s", want, text)
		}
	}
	b.shot("server-running")

	// The node agent reports samples (written here as the agent writes
	// them, through its store); the page charts them.
	srv, err := e.client("alice", "ml").GetServer(t.Context(), "alice", "nb1")
	if err != nil {
		t.Fatal(err)
	}
	agents := agentstore.New(e.redis.Client(t), "gpubroker:")
	var samples []agentstore.Sample
	for i, sm := range []int{5, 40, 85, 60} {
		mem := int64(1024 * (i + 1))
		samples = append(samples, agentstore.Sample{Slice: srv.SpawnID, At: time.Now().Add(time.Duration(i-3) * 10 * time.Second),
			Interval: 10 * time.Second, SMPercent: &sm, MemoryUsedMiB: &mem, MemoryLimitMiB: 8192})
	}
	if err := agents.AddSamples(t.Context(), samples); err != nil {
		t.Fatalf("write samples: %v", err)
	}
	b.open(e.public + "/servers/nb1")
	b.waitFor("the usage chart", `document.querySelector('#usage-chart svg.chart') !== null`)
	if desc := eval[string](b, `document.getElementById('chart-desc').textContent`); !strings.Contains(desc, "4 samples") || !strings.Contains(desc, "peaked at 85 %") {
		t.Errorf("chart description %q, want 4 samples peaking at 85 %%", desc)
	}
	// Rendered as running, the page offers resizing and extending.
	if !eval[bool](b, `document.getElementById('resize') !== null && document.getElementById('extend') !== null`) {
		t.Error("a running server's page offers no resize or extend form")
	}
	b.shot("server-usage-chart")

	// Stopped elsewhere (the API, another tab): the live page follows to
	// stopped, where it offers to start again and holds no GPU.
	b.waitFor("the page following its events", `document.getElementById('status').hasAttribute('data-events')`)
	b.do("mark the page", chromedp.Evaluate[chromedp.Void](`window.e2eMark = true`))
	if _, err := e.client("alice", "ml").DeleteServer(t.Context(), "alice", "nb1"); err != nil {
		t.Fatalf("stop: %v", err)
	}
	b.waitFor("the stopped page, live", `window.e2eMark && document.getElementById('status').dataset.state === 'stopped' && !document.getElementById('status').hasAttribute('data-events')`)
	b.liveEqualsFresh("stopped")
	if got := eval[string](b, `document.getElementById('gpu').textContent + ' | ' + !!document.getElementById('start-again') + ' ' + !!document.getElementById('remove') + ' ' + !!document.getElementById('stop')`); got != "None: the slice was released | true true false" {
		t.Errorf("the stopped page: %q, want no GPU, Start again and Remove, no Stop", got)
	}
	b.shot("server-stopped")

	// Admin pages are not hers.
	for _, p := range []string{"/admin/reclaim", "/admin/fleet", "/admin/audit"} {
		resp := b.openResponse(e.public + p)
		if resp.Status != http.StatusForbidden || !strings.Contains(b.text(), "for administrators") {
			t.Errorf("%s: status %d, text %q; want 403", p, resp.Status, b.text())
		}
	}
	b.shot("admin-forbidden")
	if strings.Contains(eval[string](b, `document.querySelector('nav').innerText`), "Fleet") {
		t.Error("the navigation offers admin pages to a non-admin")
	}

	// A form posted without the CSRF token (as another site would) is
	// refused and starts nothing.
	b.open(e.public + "/servers")
	b.do("post a form without the CSRF token", chromedp.Evaluate[chromedp.Void](`(() => {
		const f = document.createElement('form');
		f.method = 'post'; f.action = '/servers';
		for (const [k, v] of [['name', 'forged'], ['profile', 'small']]) {
			const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v; f.appendChild(i);
		}
		document.body.appendChild(f); f.submit();
	})()`))
	b.waitFor("the CSRF refusal", `document.querySelector('h1') && document.querySelector('h1').textContent === 'Not allowed'`)
	if !strings.Contains(b.text(), "security token") {
		t.Errorf("CSRF refusal text: %q", b.text())
	}
	b.shot("csrf-refused")
	if _, err := e.client("alice", "ml").GetServer(t.Context(), "alice", "forged"); err == nil {
		t.Error("a form without the CSRF token created a server")
	}
	// The API refuses a cookie-authenticated write without the header too.
	status := eval[int](b, `fetch('/api/v1/users/alice/servers/forged2', {method: 'PUT', headers: {'Content-Type': 'application/json'}, body: '{"profile":"small"}'}).then(r => r.status)`)
	if status != http.StatusForbidden {
		t.Errorf("API PUT with the cookie but no CSRF header: %d, want 403", status)
	}

	// Logout ends the session, here and at the issuer.
	b.open(e.public + "/servers")
	b.click(`.who button[type=submit]`)
	b.waitFor("the signed-out page", `location.href === `+jsString(e.public+"/auth/signed-out")+` && document.querySelector('h1').textContent === 'You are signed out'`)
	b.shot("signed-out")
	b.open(e.public + "/servers")
	b.waitFor("a fresh sign-in", `location.href.startsWith(`+jsString(e.issuer.URL()+devissuer.AuthorizePath)+`)`)
}

// TestBrowserAdminPolicy: an admin enters an invalid policy (errors shown
// inline, nothing saved), then a valid one (saved and audited); the fleet
// page shows the GPU; pages fit a phone's width.
func TestBrowserAdminPolicy(t *testing.T) {
	t.Parallel()
	e := newBrowserEnv(t, false)
	b := newTab(t)
	e.signIn(b, "root", "/admin/reclaim")
	b.waitFor("the policy page", `document.querySelector('h1').textContent === 'Idle reclaim settings'`)
	if text := b.text(); strings.Contains(text, "not available yet") || strings.Contains(text, "not running in this version") {
		t.Errorf("the policy page still says a part is missing:\n%s", text)
	}
	b.shot("reclaim-defaults")

	b.set(`#idleComputePercent`, "150")
	b.set(`#warnMinutes`, "600")
	b.click(`#save`)
	b.waitFor("the error summary", `document.getElementById('error-summary') !== null`)
	invalid := eval[[]string](b, `[...document.querySelectorAll('[aria-invalid=true]')].map(e => e.id)`)
	if strings.Join(invalid, ",") != "idleComputePercent,warnMinutes" {
		t.Errorf("fields marked invalid %v, want idleComputePercent and warnMinutes", invalid)
	}
	if focused := eval[string](b, `document.activeElement.id`); focused != "error-summary" {
		t.Errorf("focus on %q after a refused save, want the error summary", focused)
	}
	b.shot("reclaim-invalid")
	var p v1.ReclaimPolicy
	if _, err := e.admin.Do(t.Context(), http.MethodGet, "/api/v1/admin/reclaim-policy", nil, nil, &p); err != nil || p.Version != 0 {
		t.Fatalf("policy after the invalid save: version %d, %v; want 0 (nothing saved)", p.Version, err)
	}

	b.set(`#idleComputePercent`, "10")
	b.set(`#warnMinutes`, "10")
	b.set(`#reason`, "e2e: night shift")
	b.click(`input[name=action][value=stop]`)
	b.click(`#save`)
	b.waitFor("the saved notice", `document.querySelector('.ok') !== null`)
	b.shot("reclaim-saved")
	if _, err := e.admin.Do(t.Context(), http.MethodGet, "/api/v1/admin/reclaim-policy", nil, nil, &p); err != nil ||
		p.Version != 1 || p.IdleComputePercent != 10 || p.Action != v1.ReclaimStop || p.WarnSeconds != 600 || p.UpdatedBy != "root" {
		t.Errorf("saved policy %+v, %v", p, err)
	}

	b.open(e.public + "/admin/audit")
	b.waitFor("the audit entry", `document.querySelector('#audit tbody tr') !== null`)
	row := eval[string](b, `document.querySelector('#audit tbody tr').innerText`)
	for _, want := range []string{"root", "reclaim-policy.update", "e2e: night shift", "action", "warn → stop"} {
		if !strings.Contains(row, want) {
			t.Errorf("audit row %q lacks %q", row, want)
		}
	}
	b.shot("audit")
	b.set(`#f-actor`, "nobody")
	b.click(`form.filters button[type=submit]`)
	b.waitFor("the filtered audit log", `location.search.includes('actor=nobody') && document.body.innerText.includes('No entries match')`)

	alice := e.client("alice", "ml")
	if _, _, err := alice.CreateServer(t.Context(), "alice", "on-gpu", "k1", v1.CreateServerRequest{Profile: "small"}); err != nil {
		t.Fatalf("create a server for the fleet page: %v", err)
	}
	if _, err := alice.WaitServer(t.Context(), "alice", "on-gpu", v1.StateRunning, pageTimeout); err != nil {
		t.Fatal(err)
	}
	b.open(e.public + "/admin/fleet")
	b.waitFor("the fleet page", `document.querySelector('h1').textContent === 'Fleet'`)
	text := b.text()
	for _, want := range []string{e.nodes[0], e.gpus[0].UUID, "alice/on-gpu: 8 GiB, 10 %", "8 GiB of 79.6 GiB", "No data yet"} {
		if !strings.Contains(text, want) {
			t.Errorf("fleet page lacks %q:\n%s", want, text)
		}
	}
	b.shot("fleet")

	// A phone: nothing may be wider than the screen except inside the
	// scrolling table wrappers.
	b.viewport(390, 844)
	for _, p := range []string{"/servers", "/admin/reclaim"} {
		b.open(e.public + p)
		if w := eval[int](b, `document.documentElement.scrollWidth`); w > 390 {
			t.Errorf("%s is %d px wide on a 390 px phone", p, w)
		}
		b.shot("phone" + strings.ReplaceAll(p, "/", "-"))
	}
}

// TestBrowserReclaimSettings: the settings page edits the whole policy.
// A policy that sets every field (saved through the API) survives an edit
// of one field and a save from the page; an invalid save shows every
// problem at once, the form's own and the API's, next to its field, keeps
// the input and saves nothing; the preview lists, per running server,
// what the reclaimer would do now under the edited, unsaved policy.
func TestBrowserReclaimSettings(t *testing.T) {
	t.Parallel()
	e := newBrowserEnv(t, false)
	ctx := t.Context()
	full := v1test.FullReclaimPolicy()
	if z := v1test.ZeroFields(full); len(z) != 0 {
		t.Fatalf("the fixture leaves %v zero", z)
	}
	full.Version = 0
	var saved v1.ReclaimPolicy
	if status, err := e.admin.Do(ctx, http.MethodPut, "/api/v1/admin/reclaim-policy", full, nil, &saved); err != nil || status != http.StatusOK {
		t.Fatalf("save the full policy: %d %v", status, err)
	}
	alice := e.client("alice", "ml")
	if _, _, err := alice.CreateServer(ctx, "alice", "nb", "k1", v1.CreateServerRequest{Profile: "small"}); err != nil {
		t.Fatal(err)
	}
	srv, err := alice.WaitServer(ctx, "alice", "nb", v1.StateRunning, pageTimeout)
	if err != nil {
		t.Fatal(err)
	}
	policy := func() v1.ReclaimPolicy {
		t.Helper()
		var p v1.ReclaimPolicy
		if _, err := e.admin.Do(ctx, http.MethodGet, "/api/v1/admin/reclaim-policy", nil, nil, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	b := newTab(t)
	e.signIn(b, "root", "/admin/reclaim")
	b.waitFor("the policy page", `document.querySelector('h1').textContent === 'Idle reclaim settings'`)
	if got := eval[string](b, `document.querySelector('[name="o0.name"]').value + ' ' + document.querySelector('[name="o1.name"]').value`); got != "large research" {
		t.Errorf("override rows show %q, want large and research", got)
	}
	b.shot("reclaim-full")

	// Edit one field and save: every other field is kept.
	b.set(`#reason`, "e2e: fix a typo")
	b.click(`#save`)
	b.waitFor("the saved notice", `document.querySelector('.ok') !== null`)
	want := saved
	want.Version, want.Reason, want.UpdatedBy = saved.Version+1, "e2e: fix a typo", "root"
	got := policy()
	want.UpdatedAt = got.UpdatedAt
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("policy after an edit of the reason (-want +got):\n%s", diff)
	}

	// An invalid save: the form's own problem and the API's, at once.
	b.set(`#idleAfterMinutes`, "soon")
	b.set(`#maxAgeHours`, "0.5")
	b.set(`[id="o0.warnMinutes"]`, "40") // the large profile idles after 30 min
	b.click(`#save`)
	b.waitFor("the error summary", `document.getElementById('error-summary') !== null`)
	invalid := eval[[]string](b, `[...document.querySelectorAll('input[aria-invalid=true]')].map(e => e.id)`)
	if diff := cmp.Diff([]string{"idleAfterMinutes", "maxAgeHours", "o0.warnMinutes"}, invalid); diff != "" {
		t.Errorf("fields marked invalid (-want +got):\n%s", diff)
	}
	if got := eval[int](b, `document.querySelectorAll('#error-summary li').length`); got != 3 {
		t.Errorf("%d problems in the summary, want 3", got)
	}
	kept := eval[string](b, `['idleAfterMinutes', 'maxAgeHours', 'o0.warnMinutes', 'reason'].map(id => document.getElementById(id).value).join('|')`)
	if kept != "soon|0.5|40|e2e: fix a typo" {
		t.Errorf("the form kept %q", kept)
	}
	if text := eval[string](b, `document.getElementById('idleAfterMinutes-error').textContent`); !strings.Contains(text, "enter a number of minutes") {
		t.Errorf("idle time error %q, want the form's units", text)
	}
	b.shot("reclaim-all-errors")
	if p := policy(); p.Version != want.Version {
		t.Errorf("an invalid save saved version %d", p.Version)
	}

	// The preview: the running server, and the edited policy's maximum
	// age (1 hour, with 59.99 minutes' notice) calls for a warning once the
	// server is a second old.
	if err := harness.Poll(ctx, 100*time.Millisecond, pageTimeout, func(context.Context) (bool, string, error) {
		return time.Since(srv.CreatedAt) > 2*time.Second, "the server is younger than 2 s", nil
	}); err != nil {
		t.Fatal(err)
	}
	b.open(e.public + "/admin/reclaim")
	b.waitFor("the policy page", `document.getElementById('enabled') !== null`)
	b.do("untick reclaiming", chromedp.Evaluate[chromedp.Void](`document.getElementById('enabled').checked = false`))
	b.set(`#idleAfterMinutes`, "60")
	b.set(`#warnMinutes`, "59.99")
	b.set(`#maxAgeHours`, "1")
	b.click(`#preview-button`)
	b.waitFor("the preview", `document.getElementById('preview-table') !== null`)
	row := eval[string](b, `[...document.querySelectorAll('#preview-table tbody tr')].map(r => r.innerText).join('\n')`)
	for _, want := range []string{"alice/nb", "warn", "the maximum running time is 1 h", "Unknown: the node agent has reported no GPU samples"} {
		if !strings.Contains(row, want) {
			t.Errorf("preview row %q lacks %q", row, want)
		}
	}
	if !strings.Contains(b.text(), "Reclaiming is off in this policy") {
		t.Error("the preview does not say that reclaiming is off in the edited policy")
	}
	if kept := eval[string](b, `document.getElementById('warnMinutes').value + '|' + document.getElementById('maxAgeHours').value`); kept != "59.99|1" {
		t.Errorf("the form kept %q after the preview", kept)
	}
	b.shot("reclaim-preview")
	if p := policy(); p.Version != want.Version || p.WarnSeconds != want.WarnSeconds {
		t.Errorf("the preview saved the policy: %+v", p)
	}
	var page v1.AuditPage
	if _, err := e.admin.Do(ctx, http.MethodGet, "/api/v1/admin/audit?actor=reclaimer", nil, nil, &page); err != nil || len(page.Entries) != 0 {
		t.Errorf("the preview wrote audit entries: %+v %v", page.Entries, err)
	}
}

// TestBrowserLoginEdgeCases: a forged callback (state mismatch) and a lost
// session both lead to a clean new sign-in, never an error page with 500.
func TestBrowserLoginEdgeCases(t *testing.T) {
	t.Parallel()
	e := newBrowserEnv(t, false)
	b := newTab(t)

	resp := b.openResponse(e.public + "/auth/callback?code=stolen&state=forged")
	if resp.Status != http.StatusBadRequest || !strings.Contains(b.text(), "state mismatch") {
		t.Errorf("forged callback: %d %q, want 400 naming the state mismatch", resp.Status, b.text())
	}
	b.shot("login-failed")
	b.click(`a.button[href="/auth/login"]`)
	b.waitFor("the issuer's form", `location.href.startsWith(`+jsString(e.issuer.URL()+devissuer.AuthorizePath)+`)`)
	b.click(`button[value="alice"]`)
	b.waitFor("signed in after the failure", `document.querySelector('.who strong') && document.querySelector('.who strong').textContent === 'alice'`)

	// The session disappears from Redis (expired, or Redis lost it): the
	// next page starts a clean sign-in.
	rdb := e.redis.Client(t)
	keys, err := rdb.Keys(t.Context(), "*:session").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("session keys %v, %v; want one", keys, err)
	}
	if err := rdb.Del(t.Context(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
	b.open(e.public + "/servers/nb?tab=usage")
	b.waitFor("a fresh sign-in", `location.href.startsWith(`+jsString(e.issuer.URL()+devissuer.AuthorizePath)+`)`)
	b.click(`button[value="alice"]`)
	// She has no server nb: the page is the API's not-found answer.
	b.waitFor("back where she was going", `location.pathname === '/servers/nb' && location.search === '?tab=usage' && document.querySelector('h1') && document.querySelector('h1').textContent === 'Not found'`)
	b.shot("not-found-after-sign-in")
}
