package frontend_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/api/v1/v1test"
	"github.com/gpubroker/gpubroker/frontend"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const csrf = "csrf-token-1"

var (
	alice = frontend.Viewer{User: "alice", Groups: []string{"ml"}, CSRF: csrf}
	root  = frontend.Viewer{User: "root", Groups: []string{"admins"}, Admin: true, CSRF: csrf}
	t0    = time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
)

// fakeSessions answers one viewer, or an error.
type fakeSessions struct {
	v   frontend.Viewer
	err error
}

func (f fakeSessions) Viewer(context.Context, *http.Request) (frontend.Viewer, error) {
	return f.v, f.err
}

// call is one in-process API request the pages made.
type call struct {
	Method, Path, CSRF, Cookie, Idem string
	Body                             string
}

// fakeAPI answers canned JSON per "METHOD path" and records the calls.
type fakeAPI struct {
	mu      sync.Mutex
	answers map[string]answer
	calls   []call
}

type answer struct {
	status int
	body   any
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	ck, _ := r.Cookie("gpubroker_session")
	c := call{Method: r.Method, Path: r.URL.RequestURI(), CSRF: r.Header.Get("X-CSRF-Token"), Idem: r.Header.Get("Idempotency-Key"), Body: string(b)}
	if ck != nil {
		c.Cookie = ck.Value
	}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	a, ok := f.answers[r.Method+" "+r.URL.RequestURI()]
	f.mu.Unlock()
	if !ok {
		a = answer{404, v1.Error{Code: v1.CodeNotFound, Message: "no route"}}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	_ = json.NewEncoder(w).Encode(a.body)
}

func (f *fakeAPI) writes() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.Method != http.MethodGet {
			out = append(out, c)
		}
	}
	return out
}

var (
	profiles = []v1.Profile{
		{Name: "small", DisplayName: "Small", Description: "For exploring.", Slice: v1.Slice{MemoryMiB: 8192, ComputePercent: 10, ComputeLimitPercent: 50}},
		{Name: "big", DisplayName: "Big", Slice: v1.Slice{MemoryMiB: 40960, ComputePercent: 50, ComputeLimitPercent: 100}},
	}
	gpu     = &v1.GPURef{UUID: "GPU-1", Node: "node-a", Model: "NVIDIA H200"}
	running = v1.Server{User: "alice", Name: "nb", Profile: "small", SpawnID: "sp1", State: v1.StateRunning, Message: "the notebook is running",
		Slice: profiles[0].Slice, Sharing: v1.SharingSliced, Resize: v1.ResizeInfo{Supported: true},
		GPU: gpu, URL: "http://10.0.0.5:8888", OpenURL: "https://broker.example/user/alice/nb/", Pod: "nb-alice-1", CreatedAt: t0, UpdatedAt: t0}
	creating = v1.Server{User: "alice", Name: "new", Profile: "big", SpawnID: "sp2", State: v1.StateCreating, Message: "creating the pod",
		Slice: profiles[1].Slice, GPU: gpu, CreatedAt: t0, UpdatedAt: t0}
)

func baseAnswers() map[string]answer {
	return map[string]answer{
		"GET /api/v1/users/alice/servers?limit=1000": {200, v1.ServerPage{Servers: []v1.Server{running, creating}}},
		"GET /api/v1/users/root/servers?limit=1000":  {200, v1.ServerPage{Servers: []v1.Server{}}},
		"GET /api/v1/profiles":                       {200, profiles},
		"GET /api/v1/users/alice/servers/nb":         {200, running},
		"GET /api/v1/users/alice/servers/new":        {200, creating},
	}
}

type site struct {
	h   *frontend.Handler
	api *fakeAPI
}

func newSite(t *testing.T, s frontend.Sessions, answers map[string]answer) *site {
	t.Helper()
	api := &fakeAPI{answers: answers}
	h, err := frontend.New(frontend.Deps{API: api, Sessions: s, Notice: "dev mode: simulated", Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	return &site{h: h, api: api}
}

func (s *site) do(t *testing.T, method, path string, form url.Values) *httptest.ResponseRecorder {
	t.Helper()
	return s.serve(s.request(t, method, path, form))
}

// request is a browser's request with the session cookie and form.
func (s *site) request(t *testing.T, method, path string, form url.Values) *http.Request {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	r := httptest.NewRequestWithContext(t.Context(), method, path, body)
	r.AddCookie(&http.Cookie{Name: "gpubroker_session", Value: "cookie-1"})
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return r
}

func (s *site) serve(r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, r)
	return rec
}

func TestAccess(t *testing.T) {
	tests := []struct {
		name       string
		sessions   frontend.Sessions
		method     string
		path       string
		form       url.Values
		wantStatus int
		wantIn     string
	}{
		{"signed out goes to the sign-in and back", fakeSessions{err: frontend.ErrSignedOut}, "GET", "/servers/nb?x=1", nil, 303, "/auth/login?next=%2Fservers%2Fnb%3Fx%3D1"},
		{"session store down is a 503 page", fakeSessions{err: errors.New("redis down")}, "GET", "/servers", nil, 503, "Signing in is unavailable"},
		{"non-admin gets 403 on reclaim", fakeSessions{v: alice}, "GET", "/admin/reclaim", nil, 403, "for administrators"},
		{"non-admin gets 403 on fleet", fakeSessions{v: alice}, "GET", "/admin/fleet", nil, 403, "for administrators"},
		{"non-admin gets 403 on audit", fakeSessions{v: alice}, "GET", "/admin/audit", nil, 403, "for administrators"},
		{"form without CSRF refused", fakeSessions{v: alice}, "POST", "/servers", url.Values{"name": {"x"}, "profile": {"small"}}, 403, "security token"},
		{"form with a wrong CSRF refused", fakeSessions{v: alice}, "POST", "/servers/nb/stop", url.Values{"csrf": {"nope"}}, 403, "security token"},
		{"unknown page", fakeSessions{v: alice}, "GET", "/nope", nil, 404, "There is no page at /nope"},
		{"root goes to my servers", fakeSessions{v: alice}, "GET", "/", nil, 302, "/servers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSite(t, tc.sessions, baseAnswers())
			rec := s.do(t, tc.method, tc.path, tc.form)
			got := rec.Body.String() + rec.Header().Get("Location")
			if rec.Code != tc.wantStatus || !strings.Contains(got, tc.wantIn) {
				t.Errorf("%d %q, want %d containing %q", rec.Code, got, tc.wantStatus, tc.wantIn)
			}
			if w := s.api.writes(); len(w) != 0 {
				t.Errorf("the API got writes %+v", w)
			}
		})
	}
}

func TestSecurityHeaders(t *testing.T) {
	s := newSite(t, fakeSessions{v: alice}, baseAnswers())
	rec := s.do(t, "GET", "/servers", nil)
	for k, want := range map[string]string{
		"Content-Security-Policy": "script-src 'self'", "X-Frame-Options": "DENY",
		"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
	} {
		if got := rec.Header().Get(k); !strings.Contains(got, want) {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if strings.Contains(rec.Body.String(), "<script>") || strings.Contains(rec.Body.String(), " style=") {
		t.Error("page has inline script or style, which the CSP refuses")
	}
}

func TestLaunchCallsTheAPIAsTheBrowser(t *testing.T) {
	a := baseAnswers()
	a["PUT /api/v1/users/alice/servers/my%20nb"] = answer{201, creating}
	s := newSite(t, fakeSessions{v: alice}, a)
	rec := s.do(t, "POST", "/servers", url.Values{"csrf": {csrf}, "name": {"my nb"}, "profile": {"big"}, "idem": {"k1"}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/servers/my%20nb" {
		t.Fatalf("launch: %d %s → %s", rec.Code, rec.Body, rec.Header().Get("Location"))
	}
	want := []call{{Method: "PUT", Path: "/api/v1/users/alice/servers/my%20nb", CSRF: csrf, Cookie: "cookie-1", Idem: "k1", Body: `{"profile":"big"}`}}
	if diff := cmp.Diff(want, s.api.writes()); diff != "" {
		t.Errorf("API writes (-want +got):\n%s", diff)
	}
}

func TestLaunchShowsTheAPIsWords(t *testing.T) {
	a := baseAnswers()
	a["PUT /api/v1/users/alice/servers/x"] = answer{409, v1.Error{Code: v1.CodeNoCapacity, Message: "no GPU has 40 GiB free; the largest free slice is 8 GiB"}}
	s := newSite(t, fakeSessions{v: alice}, a)
	rec := s.do(t, "POST", "/servers", url.Values{"csrf": {csrf}, "name": {"x"}, "profile": {"big"}})
	body := rec.Body.String()
	if rec.Code != http.StatusConflict || !strings.Contains(body, `role="alert" id="launch-error"><p>No GPU has 40 GiB free; the largest free slice is 8 GiB.</p>`) {
		t.Errorf("launch refused: %d %s", rec.Code, body)
	}
	if !strings.Contains(body, `value="big" aria-describedby="profile-hint p-big" checked`) || !strings.Contains(body, `value="x"`) {
		t.Error("the form lost what the user picked")
	}
}

func TestStop(t *testing.T) {
	a := baseAnswers()
	a["DELETE /api/v1/users/alice/servers/nb"] = answer{202, running}
	s := newSite(t, fakeSessions{v: alice}, a)
	rec := s.do(t, "POST", "/servers/nb/stop", url.Values{"csrf": {csrf}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/servers/nb" {
		t.Errorf("stop: %d → %s", rec.Code, rec.Header().Get("Location"))
	}
	if w := s.api.writes(); len(w) != 1 || w[0].Method != "DELETE" || w[0].CSRF != csrf {
		t.Errorf("writes %+v", w)
	}
}

func TestServerPageIsHonestAboutMissingParts(t *testing.T) {
	s := newSite(t, fakeSessions{v: alice}, baseAnswers())
	body := s.do(t, "GET", "/servers/new", nil).Body.String()
	for _, want := range []string{
		`data-events="/api/v1/users/alice/servers/new/events"`, `data-page="/servers/new"`,
		`<progress id="progress" max="4" value="3"`,
		"No data yet: usage samples appear here once the node agent reports them",
		"Idle state</dt><dd id=\"idle-state\">Not checked: the server is not running.",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("server page lacks %q", want)
		}
	}
	body = s.do(t, "GET", "/servers/nb", nil).Body.String()
	if !strings.Contains(body, "data-events") || !strings.Contains(body, `id="open" href="https://broker.example/user/alice/nb/"`) || strings.Contains(body, "<progress") {
		t.Error("a running server's page should follow events, offer Open at its browser address and show no step bar")
	}
}

func TestServerPageNotFoundUsesAPIWords(t *testing.T) {
	s := newSite(t, fakeSessions{v: alice}, baseAnswers())
	rec := s.do(t, "GET", "/servers/ghost", nil)
	if rec.Code != 404 || !strings.Contains(rec.Body.String(), "No route.") {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
}

var policy0 = v1.ReclaimPolicy{Version: 3, Enabled: true, IdleComputePercent: 5, IdleAfterSeconds: 3600, Action: v1.ReclaimWarn, WarnSeconds: 900,
	UpdatedBy: "bob", UpdatedAt: &t0}

func policyAnswers() map[string]answer {
	a := baseAnswers()
	a["GET /api/v1/admin/reclaim-policy"] = answer{200, policy0}
	return a
}

func policyForm(fields map[string]string) url.Values {
	f := url.Values{"csrf": {csrf}, "version": {"3"}, "enabled": {"on"}, "idleComputePercent": {"5"}, "idleAfterMinutes": {"60"},
		"action": {"warn"}, "warnMinutes": {"15"}, "exemptGroups": {""}, "reason": {""}}
	for k, v := range fields {
		f.Set(k, v)
	}
	return f
}

func TestPolicyInvalidShowsInlineErrors(t *testing.T) {
	a := policyAnswers()
	a["PUT /api/v1/admin/reclaim-policy"] = answer{400, v1.Error{Code: v1.CodeBadRequest, Message: "the policy is not valid",
		Fields: []v1.FieldProblem{{Field: "idleComputePercent", Message: "must be between 0 and 100"}, {Field: "warnSeconds", Message: "must be shorter than the idle time"}}}}
	s := newSite(t, fakeSessions{v: root}, a)
	rec := s.do(t, "POST", "/admin/reclaim", policyForm(map[string]string{"idleComputePercent": "150", "warnMinutes": "90"}))
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("status %d", rec.Code)
	}
	golden(t, "reclaim-invalid.html", rec.Body.String())
	var put map[string]any
	if w := s.api.writes(); len(w) != 1 || json.Unmarshal([]byte(w[0].Body), &put) != nil || put["warnSeconds"] != 5400.0 || put["idleAfterSeconds"] != 3600.0 {
		t.Errorf("PUT body %+v, want minutes converted to seconds", w)
	}
}

// TestPolicyNotANumberIsNeverSaved: an entry that is not a number is
// refused by the form itself, in the form's words, and kept as typed; the
// rest of the policy is only validated (PUT ?validate=true), never saved.
func TestPolicyNotANumberIsNeverSaved(t *testing.T) {
	a := policyAnswers()
	a["PUT /api/v1/admin/reclaim-policy?validate=true"] = answer{200, policy0}
	s := newSite(t, fakeSessions{v: root}, a)
	rec := s.do(t, "POST", "/admin/reclaim", policyForm(map[string]string{"idleAfterMinutes": "an hour"}))
	body := rec.Body.String()
	if rec.Code != 400 || !strings.Contains(body, `<p class="error" id="idleAfterMinutes-error">enter a number of minutes</p>`) ||
		!strings.Contains(body, `value="an hour"`) {
		t.Errorf("%d %s", rec.Code, body)
	}
	for _, w := range s.api.writes() {
		if w.Path != "/api/v1/admin/reclaim-policy?validate=true" {
			t.Errorf("API write %+v, want only validation", w)
		}
	}
}

// TestPolicyShowsEveryProblemAtOnce: the form's own problem (not a number)
// and the API's validation of the other fields show together, each next to
// its field, in the form's units, with every entry kept as typed.
func TestPolicyShowsEveryProblemAtOnce(t *testing.T) {
	a := policyAnswers()
	a["PUT /api/v1/admin/reclaim-policy?validate=true"] = answer{400, v1.Error{Code: v1.CodeBadRequest, Message: "the policy is not valid",
		Fields: []v1.FieldProblem{
			{Field: "idleAfterSeconds", Message: "must be between 1 minute and 7 days"}, // the form's own message wins
			{Field: "maxAgeSeconds", Message: "must be 0 (no limit) or between 1 hour and 90 days, and longer than the warning"},
			{Field: "overrides[0].warnSeconds", Message: "must be shorter than the idle time, so that the warning comes before the action"},
		}}}
	s := newSite(t, fakeSessions{v: root}, a)
	form := policyForm(map[string]string{"idleAfterMinutes": "soon", "maxAgeHours": "0.5", "overrideRows": "3",
		"o1.kind": "group", "o1.name": "students", "o1.warnMinutes": "90", "o2.name": "", "o0.name": ""})
	rec := s.do(t, "POST", "/admin/reclaim", form)
	body := rec.Body.String()
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("status %d", rec.Code)
	}
	for _, want := range []string{
		`<p class="error" id="idleAfterMinutes-error">enter a number of minutes</p>`,
		`<p class="error" id="maxAgeHours-error">must be 0 (no limit) or between 1 hour and 90 days, and longer than the warning</p>`,
		`<p class="error" id="o1.warnMinutes-error">must be shorter than the idle time, so that the warning comes before the action</p>`,
		`value="soon"`, `value="0.5"`, `id="o1.warnMinutes" name="o1.warnMinutes" inputmode="decimal" value="90"`, `value="students"`,
		`<a href="#o1.warnMinutes">Override 2 (group students): Warning (minutes): must be shorter`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if n := strings.Count(body, `class="error"`); n != 3 {
		t.Errorf("%d error messages, want 3 (one per problem)", n)
	}
	var checked v1.ReclaimPolicy
	if w := s.api.writes(); len(w) != 1 || json.Unmarshal([]byte(w[0].Body), &checked) != nil ||
		checked.MaxAgeSeconds != 1800 || len(checked.Overrides) != 1 || checked.Overrides[0].Group != "students" || checked.Overrides[0].WarnSeconds != 5400 {
		t.Errorf("validation request %+v, want hours and minutes in seconds and the one filled override row", w)
	}
}

// TestPolicyPreviewListsEveryServerAndKeepsTheForm: the preview button
// sends the form's policy (unsaved) to the preview route and shows, per
// running server, the idle state, the actions due now and the next step;
// the form keeps what was typed.
func TestPolicyPreviewListsEveryServerAndKeepsTheForm(t *testing.T) {
	a := policyAnswers()
	since, next := t0.Add(-11*time.Minute), t0.Add(2*time.Minute)
	pol := policy0
	pol.Enabled, pol.Action, pol.IdleAfterSeconds, pol.WarnSeconds = false, v1.ReclaimStop, 600, 120
	a["POST /api/v1/admin/reclaim-policy/preview"] = answer{200, v1.ReclaimPreview{Policy: pol, At: t0, Servers: []v1.ReclaimPreviewServer{
		{User: "alice", Name: "nb", Profile: "small", Idle: v1.IdleState{Verdict: v1.IdleIdle, Since: &since, NextAction: v1.ReclaimStop, NextAt: &next},
			Actions: []v1.ReclaimPreviewAction{{Action: "warn", Message: "idle for 11 min; will stop at 15:02 UTC unless extended (your files are kept)"}}},
		{User: "bob", Name: "train", Profile: "big", Idle: v1.IdleState{Verdict: v1.IdleActive, Reason: "the GPU is busy"}, Actions: []v1.ReclaimPreviewAction{}},
	}}}
	s := newSite(t, fakeSessions{v: root}, a)
	form := policyForm(map[string]string{"op": "preview", "action": "stop", "idleAfterMinutes": "10", "warnMinutes": "2", "reason": "try"})
	form.Del("enabled")
	rec := s.do(t, "POST", "/admin/reclaim", form)
	body := rec.Body.String()
	if rec.Code != http.StatusOK {
		t.Fatalf("preview: %d %s", rec.Code, body)
	}
	row := func(server string) string { return between(body, ">"+server+"</a>", "</tr>") }
	for _, c := range []struct{ in, want string }{
		{body, "Reclaiming is off in this policy:"},
		{row("alice/nb"), "Idle for 11 min (since 14:49 UTC)."},
		{row("alice/nb"), "<strong>warn</strong>: idle for 11 min; will stop at 15:02 UTC unless extended (your files are kept)"},
		{row("alice/nb"), "If it stays idle, it stops (your files are kept) at 15:02 UTC unless extended."},
		{row("bob/train"), "Active: the GPU is busy."},
		{row("bob/train"), "<td>Nothing</td>"},
		{body, `id="idleAfterMinutes" name="idleAfterMinutes" inputmode="decimal" value="10"`},
		{body, `name="reason" value="try"`},
	} {
		if !strings.Contains(c.in, htmlText(c.want)) && !strings.Contains(c.in, c.want) {
			t.Errorf("preview page lacks %q", c.want)
		}
	}
	var sent v1.ReclaimPolicy
	if w := s.api.writes(); len(w) != 1 || w[0].Path != "/api/v1/admin/reclaim-policy/preview" || json.Unmarshal([]byte(w[0].Body), &sent) != nil ||
		sent.Enabled || sent.IdleAfterSeconds != 600 || sent.WarnSeconds != 120 || sent.Action != v1.ReclaimStop {
		t.Errorf("API writes %+v, want only the preview of the typed policy", w)
	}
}

// TestPolicyPreviewOfAnInvalidPolicyShowsTheErrors: the preview refuses
// what a save would, with the errors next to their fields.
func TestPolicyPreviewOfAnInvalidPolicyShowsTheErrors(t *testing.T) {
	a := policyAnswers()
	a["POST /api/v1/admin/reclaim-policy/preview"] = answer{400, v1.Error{Code: v1.CodeBadRequest, Message: "the policy is not valid",
		Fields: []v1.FieldProblem{{Field: "warnSeconds", Message: "must be shorter than the idle time, so that the warning comes before the action"}}}}
	s := newSite(t, fakeSessions{v: root}, a)
	rec := s.do(t, "POST", "/admin/reclaim", policyForm(map[string]string{"op": "preview", "warnMinutes": "90"}))
	body := rec.Body.String()
	if rec.Code != http.StatusBadRequest || !strings.Contains(body, `<p class="error" id="warnMinutes-error">must be shorter than the idle time`) ||
		strings.Contains(body, `id="preview"`) || !strings.Contains(body, `value="90"`) {
		t.Errorf("%d %s", rec.Code, body)
	}
}

// TestPolicyFormCarriesEveryField renders the page for a policy that sets
// every field of the wire type (checked by reflection), submits the form
// as a browser would, unchanged, and compares what the page sends with
// what it showed: a save from the page never drops a field.
func TestPolicyFormCarriesEveryField(t *testing.T) {
	full := v1test.FullReclaimPolicy()
	if z := v1test.ZeroFields(full); len(z) != 0 {
		t.Fatalf("the fixture leaves %v zero", z)
	}
	a := baseAnswers()
	a["GET /api/v1/admin/reclaim-policy"] = answer{200, full}
	saved := full
	saved.Version++
	a["PUT /api/v1/admin/reclaim-policy"] = answer{200, saved}
	s := newSite(t, fakeSessions{v: root}, a)
	page := s.do(t, "GET", "/admin/reclaim", nil).Body.String()
	form := formValues(t, page, "policy")
	form.Set("op", "save")
	rec := s.do(t, "POST", "/admin/reclaim", form)
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("save: %d %s", rec.Code, rec.Body)
	}
	w := s.api.writes()
	if len(w) != 1 || w[0].Path != "/api/v1/admin/reclaim-policy" {
		t.Fatalf("writes %+v, want one save", w)
	}
	var got v1.ReclaimPolicy
	if err := json.Unmarshal([]byte(w[0].Body), &got); err != nil {
		t.Fatal(err)
	}
	want := full
	want.UpdatedBy, want.UpdatedAt = "", nil // read-only: the server sets them
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PUT from the unchanged form (-want +got):\n%s", diff)
	}
}

func TestPolicyConflictExplained(t *testing.T) {
	a := policyAnswers()
	a["PUT /api/v1/admin/reclaim-policy"] = answer{409, v1.Error{Code: v1.CodeConflict,
		Message: "the policy changed while you edited it (you started from version 2; the current version is 3: version 3 by bob at 2026-11-29 15:00 UTC); changed: action stop → warn. Review the current policy and apply your change again"}}
	s := newSite(t, fakeSessions{v: root}, a)
	rec := s.do(t, "POST", "/admin/reclaim", policyForm(map[string]string{"version": "2", "idleComputePercent": "7"}))
	body := rec.Body.String()
	for _, want := range []string{"Not saved: someone else changed the policy.", "version 3 by bob", "<li>Idle below (% SM utilization): 7</li>", `name="version" value="3"`} {
		if !strings.Contains(body, want) {
			t.Errorf("conflict page lacks %q", want)
		}
	}
	if rec.Code != http.StatusConflict {
		t.Errorf("status %d", rec.Code)
	}
}

func TestPolicySaved(t *testing.T) {
	a := policyAnswers()
	saved := policy0
	saved.Version = 4
	a["PUT /api/v1/admin/reclaim-policy"] = answer{200, saved}
	s := newSite(t, fakeSessions{v: root}, a)
	rec := s.do(t, "POST", "/admin/reclaim", policyForm(map[string]string{"exemptGroups": " ml, ops ,", "reason": " tidy "}))
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/admin/reclaim?saved=4" {
		t.Fatalf("%d → %s %s", rec.Code, rec.Header().Get("Location"), rec.Body)
	}
	var put v1.ReclaimPolicy
	if err := json.Unmarshal([]byte(s.api.writes()[0].Body), &put); err != nil {
		t.Fatal(err)
	}
	want := v1.ReclaimPolicy{Version: 3, Enabled: true, IdleComputePercent: 5, IdleAfterSeconds: 3600, Action: "warn", WarnSeconds: 900,
		ExemptGroups: []string{"ml", "ops"}, Reason: "tidy"}
	if diff := cmp.Diff(want, put); diff != "" {
		t.Errorf("PUT (-want +got):\n%s", diff)
	}
}

func TestFleetByNode(t *testing.T) {
	a := baseAnswers()
	a["GET /api/v1/admin/gpus"] = answer{200, []map[string]any{
		{"uuid": "GPU-2", "node": "node-b", "model": "NVIDIA H200", "memoryMiB": 143771, "smCount": 132, "healthy": true,
			"mode": "exclusive", "pendingMode": "mps"},
		{"uuid": "GPU-1", "node": "node-a", "model": "NVIDIA H200", "memoryMiB": 143771, "smCount": 132, "healthy": true,
			"allocatedMemoryMiB": 49152, "allocatedComputePercent": 60, "slices": 2, "mode": "sliced",
			"guarantee": map[string]any{"percent": 50, "windowSeconds": 3600, "wantedSeconds": 1000, "metSeconds": 620, "slice": "sp2", "tenants": 2}},
	}}
	a["GET /api/v1/servers?all=true&limit=1000"] = answer{200, v1.ServerPage{Servers: []v1.Server{running, creating}}}
	s := newSite(t, fakeSessions{v: root}, a)
	rec := s.do(t, "GET", "/admin/fleet", nil)
	// A GPU whose tenants miss their guarantees stands out.
	for _, want := range []string{"<small>sharing: sliced</small>", "<small>becomes mps once it holds no server</small>",
		`<span class="guarantee state state-failed">Worst tenant got its 50 % guarantee 62.0 % of the time it asked for it over the last hour</span>`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("fleet page lacks %q", want)
		}
	}
	golden(t, "fleet.html", rec.Body.String())
}

func TestAuditFilterAndPaging(t *testing.T) {
	a := baseAnswers()
	a["GET /api/v1/admin/audit?actor=bob&limit=50"] = answer{200, v1.AuditPage{Next: "17-0,+", Entries: []v1.AuditEntry{{
		ID: "18-0", Time: t0, Source: v1.AuditSourceReclaim, Actor: "bob", ActorKind: v1.ActorAdmin, Action: "reclaim-policy.update",
		Target: "reclaim-policy", PolicyVersion: 3, Reason: "save money", Inputs: map[string]string{"action": "warn → stop"},
	}}}}
	a["GET /api/v1/admin/audit?limit=50&source=agent"] = answer{200, v1.AuditPage{Entries: []v1.AuditEntry{{
		ID: "19-0", Time: t0, Source: v1.AuditSourceAgent, Actor: "gpubroker-agent@n1", ActorKind: v1.ActorAgent, Action: "agent.kill",
		Target: "pod:notebooks/nb-alice", Reason: "over-memory", Inputs: map[string]string{"memoryUsedMiB": "9000"},
	}}}}
	s := newSite(t, fakeSessions{v: root}, a)
	body := s.do(t, "GET", "/admin/audit?actor=bob", nil).Body.String()
	for _, want := range []string{`<td data-label="Actor">bob <span class="muted">(admin)</span></td>`, `<td data-label="Source">reclaim</td>`, `<code>action</code>: warn → stop`,
		`href="/admin/audit?actor=bob&amp;before=17-0%2C%2B">Older entries`, `id="f-actor" name="actor" value="bob"`} {
		if !strings.Contains(body, want) {
			t.Errorf("audit page lacks %q", want)
		}
	}
	body = s.do(t, "GET", "/admin/audit?source=agent", nil).Body.String()
	for _, want := range []string{`<td data-label="Source">agent</td><td data-label="Actor">gpubroker-agent@n1 <span class="muted">(agent)</span></td><td data-label="Action"><code>agent.kill</code></td><td data-label="Target">pod:notebooks/nb-alice</td>`,
		`<option value="agent" selected>`} {
		if !strings.Contains(body, want) {
			t.Errorf("agents' audit page lacks %q", want)
		}
	}
}

func TestLoginPages(t *testing.T) {
	s := newSite(t, fakeSessions{err: frontend.ErrSignedOut}, nil)
	rec := httptest.NewRecorder()
	s.h.LoginFailed(rec, httptest.NewRequest("GET", "/auth/callback", nil), 400, "this sign-in expired or was already used")
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "This sign-in expired or was already used.") || !strings.Contains(rec.Body.String(), `href="/auth/login">Sign in again`) {
		t.Errorf("login failed page: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	s.h.SignedOut(rec, httptest.NewRequest("GET", "/auth/signed-out", nil))
	if !strings.Contains(rec.Body.String(), "You are signed out") || strings.Contains(rec.Body.String(), "Sign out</button>") {
		t.Errorf("signed out page: %s", rec.Body)
	}
}

func TestStaticAssets(t *testing.T) {
	s := newSite(t, fakeSessions{err: frontend.ErrSignedOut}, nil)
	for path, ctype := range map[string]string{"/static/app.css": "text/css", "/static/app.js": "javascript"} {
		rec := s.do(t, "GET", path, nil)
		if rec.Code != 200 || !strings.Contains(rec.Header().Get("Content-Type"), ctype) {
			t.Errorf("%s: %d %s", path, rec.Code, rec.Header().Get("Content-Type"))
		}
	}
}

func TestChart(t *testing.T) {
	var samples []frontend.Sample
	for i := range 7 {
		samples = append(samples, frontend.Sample{Time: t0.Add(time.Duration(i) * 5 * time.Minute), SMPercent: float64(i * 15), MemoryMiB: int64(i) * 1024})
	}
	golden(t, "chart.svg", string(frontend.Chart(samples, 8192)))
	if frontend.Chart(nil, 8192) != "" {
		t.Error("a chart without samples is not empty")
	}
}

func TestNewNeedsAPIAndSessions(t *testing.T) {
	if _, err := frontend.New(frontend.Deps{}); err == nil || !strings.Contains(err.Error(), "API") || !strings.Contains(err.Error(), "Sessions") {
		t.Errorf("New(Deps{}) = %v", err)
	}
}

// idemRE hides the per-render idempotency key in golden files.
var idemRE = regexp.MustCompile(`name="idem" value="[A-Z0-9]+"`)

// golden compares got with testdata/name, rewriting it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	got = idemRE.ReplaceAllString(got, `name="idem" value="IDEM"`)
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./frontend -update)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", name, diff)
	}
}

// fakeUsage returns fixed samples for one spawn.
type fakeUsage struct {
	spawn   string
	samples []frontend.Sample
}

func (f fakeUsage) Samples(_ context.Context, _, _, spawnID string) ([]frontend.Sample, error) {
	if spawnID != f.spawn {
		return nil, nil
	}
	return f.samples, nil
}

func (f fakeUsage) Current(_ context.Context, _, _, spawnID string) (frontend.Sample, bool, error) {
	if spawnID != f.spawn || len(f.samples) == 0 {
		return frontend.Sample{}, false, nil
	}
	return f.samples[len(f.samples)-1], true, nil
}

// TestFleetRealUse: the sum of fresh samples, or unknown when a slice has
// none.
func TestFleetRealUse(t *testing.T) {
	a := baseAnswers()
	a["GET /api/v1/admin/gpus"] = answer{200, []map[string]any{
		{"uuid": "GPU-1", "node": "node-a", "model": "NVIDIA H200", "memoryMiB": 143771, "smCount": 132, "healthy": true},
	}}
	sample := []frontend.Sample{{Time: t0, SMPercent: 37, MemoryMiB: 2560}}
	tests := []struct {
		name    string
		servers []v1.Server
		want    string
	}{
		{"every slice reports", []v1.Server{running}, `<td data-label="Real use">SM 37 % · 2.5 GiB in use</td>`},
		{"one slice silent", []v1.Server{running, creating}, `<td data-label="Real use" class="muted">Unknown: 1 of 2 slices report no fresh sample</td>`},
		{"no slices", nil, `<td data-label="Real use" class="muted">No slices</td>`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a["GET /api/v1/servers?all=true&limit=1000"] = answer{200, v1.ServerPage{Servers: tc.servers}}
			h, err := frontend.New(frontend.Deps{API: &fakeAPI{answers: a}, Sessions: fakeSessions{v: root}, Usage: fakeUsage{spawn: "sp1", samples: sample}})
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", "/admin/fleet", nil))
			if !strings.Contains(rec.Body.String(), tc.want) {
				t.Errorf("fleet page lacks %s:\n%s", tc.want, rec.Body)
			}
		})
	}
}

// TestServerPageChartsSamples: once a Usage source is wired, the page
// draws the chart instead of "no data yet".
func TestServerPageChartsSamples(t *testing.T) {
	api := &fakeAPI{answers: baseAnswers()}
	usage := fakeUsage{spawn: "sp1", samples: []frontend.Sample{
		{Time: t0, SMPercent: 40, MemoryMiB: 2048}, {Time: t0.Add(time.Minute), SMPercent: 80, MemoryMiB: 4096},
	}}
	h, err := frontend.New(frontend.Deps{API: api, Sessions: fakeSessions{v: alice}, Usage: usage})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, want, notWant string
	}{
		{"/servers/nb", `<svg class="chart"`, "No data yet"},
		{"/servers/new", "No data yet: no usage sample has been reported for this slice so far.", "<svg"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", tc.path, nil))
		if body := rec.Body.String(); !strings.Contains(body, tc.want) || strings.Contains(body, tc.notWant) {
			t.Errorf("%s: want %q and not %q in\n%s", tc.path, tc.want, tc.notWant, body)
		}
	}
}

// TestNotebookPages checks the pages the notebook proxy shows for a
// notebook that cannot be opened now: a stopped one offers a start that
// comes back to the notebook's address, a starting one follows its events
// and enters the notebook, and another user gets no start button.
func TestNotebookPages(t *testing.T) {
	stopped := v1.Server{User: "alice", Name: "old", Profile: "small", SpawnID: "sp0", State: v1.StateStopped, Message: "stopped",
		Slice: profiles[0].Slice, CreatedAt: t0, UpdatedAt: t0}
	answers := baseAnswers()
	answers["GET /api/v1/users/alice/servers/old"] = answer{200, stopped}
	answers["PUT /api/v1/users/alice/servers/old"] = answer{201, creating}
	s := newSite(t, fakeSessions{v: alice}, answers)
	page := func(user, name, path, problem string) (int, string) {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, path, nil)
		rec := httptest.NewRecorder()
		s.h.Notebook(rec, r, http.StatusOK, user, name, problem)
		return rec.Code, rec.Body.String()
	}
	_, body := page("alice", "old", "/user/alice/old/tree", "")
	for _, want := range []string{`id="stopped"`, `id="start"`, `name="next" value="/user/alice/old/tree"`, `name="profile" value="small"`} {
		if !strings.Contains(body, want) {
			t.Errorf("stopped page lacks %q", want)
		}
	}
	_, body = page("alice", "new", "/user/alice/new/", "")
	if !strings.Contains(body, `data-enter="true"`) || !strings.Contains(body, `data-events="/api/v1/users/alice/servers/new/events"`) || strings.Contains(body, `id="start"`) {
		t.Errorf("starting page: want it to follow the events and enter, without a start button:\n%s", body)
	}
	code, body := page("alice", "nb", "/user/alice/nb/", "The notebook is not answering.")
	if code != 200 || !strings.Contains(body, "The notebook is not answering.") || strings.Contains(body, "data-enter") {
		t.Errorf("running but not answering: %d, want the problem and no automatic reload:\n%s", code, body)
	}
	form := url.Values{"csrf": {csrf}, "name": {"old"}, "profile": {"small"}, "idem": {"i1"}, "next": {"/user/alice/old/tree"}}
	rec := s.do(t, "POST", "/servers", form)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/user/alice/old/tree" {
		t.Errorf("start from the notebook page: %d → %s, want back to the notebook", rec.Code, rec.Header().Get("Location"))
	}
	form.Set("next", "//evil.example/user/x")
	if rec := s.do(t, "POST", "/servers", form); rec.Header().Get("Location") != "/servers/old" {
		t.Errorf("a foreign next: → %s, want the server's page", rec.Header().Get("Location"))
	}
	rec = httptest.NewRecorder()
	s.h.Error(rec, httptest.NewRequest(http.MethodGet, "/user/bob/x/", nil), http.StatusNotFound, "There is no notebook server at this address, or it is not yours.")
	if rec.Code != 404 || !strings.Contains(rec.Body.String(), "not yours") {
		t.Errorf("error page: %d %s", rec.Code, rec.Body)
	}
}
