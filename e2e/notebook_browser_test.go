package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/gpubroker/gpubroker/spawner"
)

// TestNotebookInTheBrowser drives Chromium through the whole way into a
// real notebook, in path mode and in host mode: alice signs in, launches a
// server, opens its address while it starts (the page follows the spawn
// and enters the notebook by itself), the notebook's own UI loads through
// the broker's proxy, a cell runs print(6*7) on a kernel over the
// WebSocket and the page shows 42; the notebook's token is nowhere the
// browser can read it; she stops the server and its address shows the
// stopped page; another user (an admin, without admin access) gets 404.
func TestNotebookInTheBrowser(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		host bool
	}{{"path mode", false}, {"host mode", true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			e := newBrowserEnvWith(t, browserOptions{notebooks: true, hostMode: mode.host})
			b := newTab(t)
			e.signIn(b, "alice", "/servers")
			// Until the node's hook is back, the pod waits: the start page
			// shows for sure.
			if err := e.hook.remove(); err != nil {
				t.Fatal(err)
			}
			b.do("pick the jupyter profile", chromedp.Evaluate[chromedp.Void](`document.querySelector('input[name=profile][value=jupyter]').checked = true`))
			b.set("#name", "nb")
			b.click(`form[action="/servers"] button[type=submit]`)
			b.waitFor("the server page", `document.querySelector('h1') && document.querySelector('h1').textContent === 'Server nb'`)

			// The notebook's address while it starts: the page follows the
			// spawn and enters the notebook once it runs.
			open := e.public + "/user/alice/nb/tree"
			b.open(open)
			b.waitFor("the start page following the spawn", `document.getElementById('status') && document.getElementById('status').dataset.enter === 'true' && document.getElementById('status').dataset.state === 'starting'`)
			b.shot("notebook-starting")
			if err := e.hook.install(); err != nil {
				t.Fatal(err)
			}
			b.waitFor("the notebook's own file list, entered by the start page", `document.querySelector('#notebook_list') !== null`)
			origin := eval[string](b, `location.origin`)
			wantOrigin := e.public
			if mode.host {
				wantOrigin = "http://" + spawner.PodName("alice", "nb") + ".localhost:" + strings.TrimPrefix(e.public, "http://localhost:")
			}
			if origin != wantOrigin {
				t.Errorf("the notebook is served at %s, want %s", origin, wantOrigin)
			}
			b.shot("notebook-tree")

			// A notebook file, created through the notebook's API from its
			// own page, then opened in the notebook UI.
			created := eval[int](b, `fetch('/user/alice/nb/api/contents/e2e.ipynb', {method: 'PUT', headers: {'Content-Type': 'application/json'},
				body: JSON.stringify({type: 'notebook', content: {cells: [{cell_type: 'code', source: '', metadata: {}, outputs: [], execution_count: null}],
				metadata: {kernelspec: {name: 'python3', display_name: 'Python 3', language: 'python'}}, nbformat: 4, nbformat_minor: 5}})}).then(r => r.status)`)
			if created != 201 && created != 200 {
				t.Fatalf("create the notebook file through the proxy: HTTP %d", created)
			}
			b.open(origin + "/user/alice/nb/notebooks/e2e.ipynb")
			b.waitFor("the kernel connected", `window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel && Jupyter.notebook.kernel.is_connected() && Jupyter.notebook.get_cell(0) !== null`)
			b.do("run print(6*7)", chromedp.Evaluate[chromedp.Void](`(function () { var c = Jupyter.notebook.get_cell(0); c.set_text('print(6*7)'); c.execute(); })()`))
			b.waitFor("42 on the page", `Array.from(document.querySelectorAll('.output_subarea')).some(e => e.innerText.trim() === '42')`)
			b.shot("notebook-42")

			token := e.notebookToken(t.Context(), "alice", "nb")
			leak := eval[string](b, `(function (t) {
				var h = document.documentElement.outerHTML, i = h.indexOf(t);
				if (i >= 0) return 'page source: ' + h.slice(Math.max(0, i - 200), i + 40);
				if (document.cookie.includes(t)) return 'cookies';
				if (location.href.includes(t)) return 'URL';
				if (performance.getEntries().some(x => x.name.includes(t))) return 'a loaded URL';
				return '';
			})(`+jsString(token)+`)`)
			if leak != "" {
				t.Errorf("the notebook token is in the %s", leak)
			}
			cctx, cancel := context.WithTimeout(b.ctx, actionTimeout)
			all, err := chromedp.Call(cctx, network.GetCookies, network.GetCookiesParams{URLs: []string{origin + "/", e.public + "/"}})
			cancel()
			if err != nil {
				t.Fatalf("read the browser's cookies: %v", err)
			}
			for _, c := range all.Cookies {
				if strings.Contains(c.Value, token) {
					t.Errorf("cookie %s (%s) holds the notebook token", c.Name, c.Domain)
				}
				if nbHost := spawner.PodName("alice", "nb") + ".localhost"; mode.host && c.Name == "gpubroker_nb" && (!c.HTTPOnly || c.Domain != nbHost) {
					t.Errorf("the notebook host's cookie %+v: want HttpOnly and only for that host", c)
				}
			}

			// Stop it on the broker's page; the notebook's address says so.
			b.open(e.public + "/servers/nb")
			b.click("#stop")
			b.waitFor("stopped", `document.getElementById('status') && document.getElementById('status').dataset.state === 'stopped'`)
			b.open(origin + "/user/alice/nb/tree")
			b.waitFor("the stopped page", `document.getElementById('stopped') !== null && document.getElementById('start') !== null`)
			b.shot("notebook-stopped")

			// Another user's session gets 404, not alice's notebook.
			b.click(`.who button`)
			b.waitFor("signed out", `document.body.innerText.includes('signed out') || document.body.innerText.includes('Signed out')`)
			e.signIn(b, "root", "/servers")
			resp := b.openResponse(open)
			if resp.Status != 404 || !strings.Contains(b.text(), "not yours") {
				t.Errorf("root opening alice's notebook: %d %q, want 404", resp.Status, b.text())
			}
		})
	}
}
