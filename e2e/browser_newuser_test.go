package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// liveEqualsFresh waits until the content of the page's main element, as
// the live page shows it now, equals that of a fresh load of the same URL
// (fetched in the page, parsed apart), and fails the test with both texts
// when it does not within pageTimeout (or, when the texts agree, with the
// markup around the first place it differs).
func (b *tab) liveEqualsFresh(what string) {
	b.t.Helper()
	const compare = `(async () => {
		const norm = s => s.replace(/\s+/g, ' ').trim();
		const r = await fetch(location.pathname, {credentials: 'same-origin'});
		const fresh = new DOMParser().parseFromString(await r.text(), 'text/html').querySelector('main');
		const live = document.querySelector('main');
		const a = norm(live.innerHTML), b = norm(fresh.innerHTML);
		if (a === b) { return ''; }
		if (norm(live.innerText) !== norm(fresh.innerText)) {
			return 'live: ' + norm(live.innerText) + '\n fresh: ' + norm(fresh.innerText);
		}
		// The same text: show where the markup parts (an attribute, a
		// hidden element), which the texts cannot.
		let i = 0;
		while (i < a.length && a[i] === b[i]) { i++; }
		const at = Math.max(0, i - 120);
		return 'the same text, the markup differs at ' + i + ':\n live: ' + a.slice(at, i + 240) + '\n fresh: ' + b.slice(at, i + 240);
	})()`
	var diff string
	err := harness.Poll(b.ctx, 200*time.Millisecond, pageTimeout, func(ctx context.Context) (bool, string, error) {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		defer cancel()
		got, err := chromedp.Run(actx, chromedp.Evaluate[string](compare, chromedp.EvalAwaitPromise))
		if err != nil {
			return false, err.Error(), nil
		}
		diff = got
		return got == "", got, nil
	})
	if err != nil {
		b.fail("the live page equals a fresh load at "+what, fmt.Errorf("%w\n%s", err, diff))
	}
}

// TestBrowserNewUserMeetsLimits: refused launches leave nothing behind
// and say which limit and what is in use, in GiB; the form keeps what was
// typed; a stopped server offers to start again (another profile asks
// first) and to be removed; a running server's resize and extend forms
// show every problem next to its field in the form's units. Then the same
// pages on a 390 px phone: no control is cut off, nothing is wider than
// the screen, and UUIDs take one line.
func TestBrowserNewUserMeetsLimits(t *testing.T) {
	t.Parallel()
	e := newBrowserEnv(t, false, "--reclaim-interval=1h")
	ctx := t.Context()
	alice := e.client("alice", "ml")
	if _, _, err := alice.CreateServer(ctx, "alice", "a", "k-a", v1.CreateServerRequest{Profile: "small"}); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.WaitServer(ctx, "alice", "a", v1.StateRunning, pageTimeout); err != nil {
		t.Fatal(err)
	}
	b := newTab(t)
	e.signIn(b, "alice", "/servers")
	b.waitFor("the servers page", `document.querySelector('h1').textContent === 'My servers'`)
	if got := eval[string](b, `document.getElementById('quota').innerText`); !strings.Contains(got, "Your quota: 1 of 2 servers, 8 GiB (no limit), 10 % compute (no limit)") {
		t.Errorf("quota line %q", got)
	}

	// A second server fits; a third is refused by the quota, in words, and
	// leaves nothing.
	launch := func(name, profile string) {
		b.t.Helper()
		b.open(e.public + "/servers")
		b.click(`input[name=profile][value=` + profile + `]`)
		b.set(`#name`, name)
		b.click(`#launch button[type=submit]`)
	}
	launch("b", "medium")
	b.waitFor("b's page", `document.querySelector('h1') && document.querySelector('h1').textContent === 'Server b'`)
	launch("c", "small")
	b.waitFor("the refusal", `document.getElementById('launch-error') !== null`)
	if got := eval[string](b, `document.getElementById('launch-error').innerText + ' | ' + document.getElementById('name').value + ' | ' + document.querySelector('input[name=profile]:checked').value`); got != "Your quota allows 2 servers at once, and 2 are in use. Stop one to start another. | c | small" {
		t.Errorf("refused launch shows %q", got)
	}
	if got := eval[[]string](b, `[...document.querySelectorAll('#servers tbody th')].map(th => th.innerText)`); strings.Join(got, ",") != "a,b" {
		t.Errorf("servers listed after the refusal: %v, want a and b only", got)
	}
	b.shot("launch-refused")
	if _, err := alice.GetServer(ctx, "alice", "c"); err == nil {
		t.Error("the refused launch left a server c")
	}

	// A running server's forms: every problem at once, as typed, in GiB.
	if _, err := alice.WaitServer(ctx, "alice", "b", v1.StateRunning, pageTimeout); err != nil {
		t.Fatal(err)
	}
	b.open(e.public + "/servers/b")
	b.waitFor("b running", `document.getElementById('status').dataset.state === 'running' && document.getElementById('resize') !== null`)
	b.set(`#memoryGiB`, "lots")
	b.set(`#computePercent`, "101")
	b.click(`#resize`)
	b.waitFor("the resize problems", `document.querySelector('#resize-form [aria-invalid=true]') !== null`)
	got := eval[string](b, `['memoryGiB', 'computePercent', 'computeLimitPercent'].map(id => id + '=' + document.getElementById(id).value + ':' + (document.getElementById(id + '-error') ? document.getElementById(id + '-error').innerText : '')).join(' | ')`)
	if want := "memoryGiB=lots:Enter the GPU memory as a number of GiB above 0, for example 8 or 1.5. | computePercent=101:Enter a whole percent from 1 to 100. | computeLimitPercent=75:"; got != want {
		t.Errorf("resize form after a bad entry:\n%s\nwant\n%s", got, want)
	}
	if focused := eval[string](b, `document.activeElement.id`); focused != "memoryGiB" {
		t.Errorf("focus on %q after the refused resize, want the first problem", focused)
	}
	b.shot("resize-problems")
	// Growing past the GPU: the API's refusal next to the field, in GiB.
	b.open(e.public + "/servers/b")
	b.waitFor("b's page without problems", `document.getElementById('resize') !== null && document.getElementById('memoryGiB-error') === null`)
	b.set(`#memoryGiB`, "80")
	b.set(`#computePercent`, "25")
	b.click(`#resize`)
	b.waitFor("the room problem", `document.getElementById('memoryGiB-error') !== null`)
	if got := eval[string](b, `document.getElementById('memoryGiB-error').innerText + ' | ' + document.getElementById('memoryGiB').value`); !strings.Contains(got, "GiB") || strings.Contains(got, "MiB") || !strings.HasSuffix(got, "| 80") {
		t.Errorf("a resize past the GPU: %q, want the refusal in GiB next to the memory, 80 kept", got)
	}
	b.open(e.public + "/servers/b")
	b.waitFor("b's page", `document.getElementById('extend') !== null`)
	b.set(`#minutes`, "an hour")
	b.click(`#extend`)
	b.waitFor("the extend problem", `document.getElementById('minutes-error') !== null`)
	if got := eval[string](b, `document.getElementById('minutes-error').innerText + ' | ' + document.getElementById('minutes').value`); got != "Enter a whole number of minutes from 1 to 10080 (7 days). | an hour" {
		t.Errorf("extend problem %q", got)
	}

	// Stopped: no GPU held, Start again and Remove; another profile asks first.
	b.open(e.public + "/servers/b")
	b.click(`#stop`)
	b.waitFor("b stopped", `document.getElementById('status').dataset.state === 'stopped' && document.getElementById('start-again') !== null`)
	if got := eval[string](b, `document.getElementById('gpu').innerText`); got != "None: the slice was released" {
		t.Errorf("a stopped server's GPU: %q", got)
	}
	b.shot("stopped")
	launch("b", "small")
	b.waitFor("the question", `document.getElementById('confirm') !== null`)
	if got := eval[string](b, `document.getElementById('confirm').innerText`); !strings.Contains(got, "b was last started with another profile") || !strings.Contains(got, "Start with small") {
		t.Errorf("confirmation %q", got)
	}
	b.shot("confirm-profile")
	b.click(`#confirm-yes`)
	b.waitFor("b starting again", `document.querySelector('h1').textContent === 'Server b' && document.getElementById('status').hasAttribute('data-events')`)
	if s, err := alice.WaitServer(ctx, "alice", "b", v1.StateRunning, pageTimeout); err != nil || s.Profile != "small" {
		t.Errorf("b after the confirmed start: %+v %v, want running with small", s.Profile, err)
	}
	// Remove a stopped server.
	if _, err := alice.DeleteServer(ctx, "alice", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.WaitServer(ctx, "alice", "a", v1.StateStopped, pageTimeout); err != nil {
		t.Fatal(err)
	}
	b.open(e.public + "/servers/a")
	b.click(`#remove`)
	b.waitFor("the list without a", `location.pathname === '/servers' && ![...document.querySelectorAll('#servers tbody th')].some(th => th.innerText === 'a')`)
	if _, err := alice.GetServer(ctx, "alice", "a"); err == nil {
		t.Error("a is still there after Remove")
	}

	// The same pages on a phone, with a long name in the list.
	if _, _, err := alice.CreateServer(ctx, "alice", "ExperimentWithARatherLongNameForThePhone2026", "k-long", v1.CreateServerRequest{Profile: "small"}); err != nil {
		t.Fatal(err)
	}
	b.viewport(390, 844)
	if _, err := e.admin.Do(ctx, http.MethodPatch, harness.ServerPath("alice", "b")+"/slice", map[string]int{"computePercent": 20}, nil, nil); err != nil {
		t.Fatal(err) // so the audit log has an entry of alice's
	}
	for _, p := range []string{"/servers", "/servers/b", "/servers/b/resize-form-check"} {
		if p == "/servers/b/resize-form-check" {
			b.open(e.public + "/servers/b")
			b.set(`#memoryGiB`, "x")
			b.click(`#resize`)
			b.waitFor("the problems on a phone", `document.getElementById('memoryGiB-error') !== null`)
		} else {
			b.open(e.public + p)
		}
		b.fitsPhone(p)
	}
	// The admin pages, signed in as root in the same tab.
	b.click(`.who button[type=submit]`)
	b.waitFor("signed out", `location.pathname === '/auth/signed-out'`)
	e.signIn(b, "root", "/admin/fleet")
	for _, p := range []string{"/admin/fleet", "/admin/audit", "/admin/reclaim"} {
		b.open(e.public + p)
		b.fitsPhone(p)
	}
}

// fitsPhone checks the page as it is on a phone-sized viewport: nothing is
// wider than the screen, no control (link, button, field) is cut off by
// the screen's edge or by a box that hides its overflow, no button breaks
// its label inside a word, and a UUID takes one line.
func (b *tab) fitsPhone(page string) {
	b.t.Helper()
	b.waitFor("the page loaded", `document.querySelector('main') !== null`)
	const check = `(() => {
		const W = document.documentElement.clientWidth, out = [];
		if (document.documentElement.scrollWidth > W) { out.push('the page is ' + document.documentElement.scrollWidth + ' px wide on a ' + W + ' px screen'); }
		const controls = document.querySelectorAll('main a, main button, main input:not([type=hidden]), main select, main textarea, header a, header button');
		for (const c of controls) {
			const r = c.getBoundingClientRect();
			if (r.width === 0 && r.height === 0) { continue; } // not shown
			const name = c.tagName.toLowerCase() + (c.id ? '#' + c.id : '') + ' "' + (c.innerText || c.value || c.name || '').trim().slice(0, 30) + '"';
			if (r.left < -0.5 || r.right > W + 0.5) { out.push(name + ' reaches past the screen (' + Math.round(r.left) + '..' + Math.round(r.right) + ')'); continue; }
			if (c.matches('button, a.button')) {
				// A label is never broken inside a word: at most one line per word.
				const s = getComputedStyle(c), lh = parseFloat(s.lineHeight) || 20;
				const lines = Math.round((c.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom)) / lh);
				const shown = c.cloneNode(true);
				shown.querySelectorAll('.sr-only').forEach(e => e.remove()); // read to screen readers only
				const words = (shown.textContent || '').trim().split(/\s+/).length;
				if (lines > words) { out.push(name + ' breaks its label over ' + lines + ' lines'); }
			}
			for (let p = c.parentElement; p && p !== document.body; p = p.parentElement) {
				const s = getComputedStyle(p);
				if (s.overflowX === 'visible' && s.overflowY === 'visible') { continue; }
				const pr = p.getBoundingClientRect();
				if (r.left < pr.left - 0.5 || r.right > pr.right + 0.5) { out.push(name + ' is cut off by ' + p.tagName.toLowerCase() + '.' + p.className); break; }
			}
		}
		for (const u of document.querySelectorAll('code.uuid')) {
			const lh = parseFloat(getComputedStyle(u).lineHeight) || 20;
			if (u.getBoundingClientRect().height > 1.6 * lh) { out.push('UUID ' + u.title + ' takes ' + Math.round(u.getBoundingClientRect().height / lh) + ' lines'); }
		}
		return out;
	})()`
	if problems := eval[[]string](b, check); len(problems) > 0 {
		b.t.Errorf("%s on a 390 px phone:\n  %s", page, strings.Join(problems, "\n  "))
	}
	b.shot("phone" + strings.NewReplacer("/", "-").Replace(page))
}
