package frontend_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

var stopped = v1.Server{User: "alice", Name: "old", Profile: "small", SpawnID: "sp9", State: v1.StateStopped, Message: "stopped",
	Slice: profiles[0].Slice, CreatedAt: t0, UpdatedAt: t0}

// TestServersPageShowsTheQuota: every cap and what is in use under it,
// in the page's units.
func TestServersPageShowsTheQuota(t *testing.T) {
	a := baseAnswers()
	a["GET /api/v1/users/alice/quota"] = answer{200, v1.Quota{User: "alice", Quotas: []v1.QuotaUse{
		{Scope: "user", Name: "alice", Limit: v1.QuotaAmounts{Servers: 2, MemoryMiB: 98304, ComputePercent: 100}, Used: v1.QuotaAmounts{Servers: 2, MemoryMiB: 32768, ComputePercent: 35}},
		{Scope: "group", Name: "ml", Limit: v1.QuotaAmounts{Servers: 20}, Used: v1.QuotaAmounts{Servers: 3, MemoryMiB: 1536, ComputePercent: 5}},
	}}}
	s := newSite(t, fakeSessions{v: alice}, a)
	body := s.do(t, "GET", "/servers", nil).Body.String()
	for _, want := range []string{
		`<li class="full"><strong>Your quota:</strong> 2 of 2 servers, 32 of 96 GiB, 35 of 100 % compute</li>`,
		`<li><strong>Group ml (shared by its members):</strong> 3 of 20 servers, 1.5 GiB (no limit), 5 % compute (no limit)</li>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("servers page lacks %q", want)
		}
	}
}

// TestLaunchKeepsTheUserWhereTheyWere: a refused launch shows the form as
// typed with the problem in the page's words; a running name shows that
// server; a stopped one with another profile asks first; a refused "Start
// again" stays on the server's page.
func TestLaunchKeepsTheUserWhereTheyWere(t *testing.T) {
	quota := answer{403, v1.Error{Code: v1.CodeQuotaExceeded, Message: "user alice quota exceeded: …",
		Limit: &v1.Limit{Kind: v1.LimitQuota, Scope: "user", Name: "alice", Resource: "servers", Limit: 2, Used: 2, Want: 1}}}
	tests := []struct {
		name       string
		form       url.Values
		answers    map[string]answer
		wantStatus int
		wantTo     string // redirect
		wantPuts   []string
		wantIn     []string
	}{
		{name: "an empty name is the name's problem", form: url.Values{"name": {" "}, "profile": {"big"}},
			wantStatus: http.StatusBadRequest, wantIn: []string{`<p class="error" id="name-error">Give the server a name.</p>`,
				`value="big" aria-describedby="profile-hint p-big" checked`}},
		{name: "a quota refusal in the page's words", form: url.Values{"name": {"x"}, "profile": {"big"}},
			answers:    map[string]answer{"PUT /api/v1/users/alice/servers/x": quota},
			wantStatus: http.StatusForbidden, wantPuts: []string{"x big"},
			wantIn: []string{`id="launch-error"><p>Your quota allows 2 servers at once, and 2 are in use. Stop one to start another.</p>`,
				`id="name" name="name" value="x"`}},
		{name: "a running name shows that server", form: url.Values{"name": {"nb"}, "profile": {"big"}},
			wantStatus: http.StatusSeeOther, wantTo: "/servers/nb"},
		{name: "a stopped name with another profile asks first", form: url.Values{"name": {"old"}, "profile": {"big"}},
			answers:    map[string]answer{"GET /api/v1/users/alice/servers/old": {200, stopped}},
			wantStatus: http.StatusOK, wantIn: []string{`id="confirm"`, "old was last started with another profile.", `name="confirm" value="big"`, "Start with big"}},
		{name: "confirmed, it starts again with the new profile", form: url.Values{"name": {"old"}, "profile": {"big"}, "confirm": {"big"}},
			answers:    map[string]answer{"GET /api/v1/users/alice/servers/old": {200, stopped}, "PUT /api/v1/users/alice/servers/old": {200, stopped}},
			wantStatus: http.StatusSeeOther, wantTo: "/servers/old", wantPuts: []string{"old big"}},
		{name: "the same profile starts again without asking", form: url.Values{"name": {"old"}, "profile": {"small"}},
			answers:    map[string]answer{"GET /api/v1/users/alice/servers/old": {200, stopped}, "PUT /api/v1/users/alice/servers/old": {200, stopped}},
			wantStatus: http.StatusSeeOther, wantTo: "/servers/old", wantPuts: []string{"old small"}},
		{name: "a refused start again stays on the server's page", form: url.Values{"name": {"old"}, "profile": {"small"}, "origin": {"server"}},
			answers:    map[string]answer{"GET /api/v1/users/alice/servers/old": {200, stopped}, "PUT /api/v1/users/alice/servers/old": quota},
			wantStatus: http.StatusForbidden, wantPuts: []string{"old small"},
			wantIn: []string{"<h1>Server old</h1>", "Not started again. Your quota allows 2 servers at once, and 2 are in use.", `id="start-again"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := baseAnswers()
			for k, v := range tc.answers {
				a[k] = v
			}
			s := newSite(t, fakeSessions{v: alice}, a)
			tc.form.Set("csrf", csrf)
			rec := s.do(t, "POST", "/servers", tc.form)
			if rec.Code != tc.wantStatus || rec.Header().Get("Location") != tc.wantTo {
				t.Fatalf("status %d → %q, want %d → %q: %s", rec.Code, rec.Header().Get("Location"), tc.wantStatus, tc.wantTo, rec.Body)
			}
			var puts []string
			for _, w := range s.api.writes() {
				name := strings.TrimPrefix(w.Path, "/api/v1/users/alice/servers/")
				var body v1.CreateServerRequest
				if err := json.Unmarshal([]byte(w.Body), &body); err != nil {
					t.Fatal(err)
				}
				puts = append(puts, name+" "+body.Profile)
			}
			if diff := cmp.Diff(tc.wantPuts, puts); diff != "" {
				t.Errorf("creates (-want +got):\n%s", diff)
			}
			for _, want := range tc.wantIn {
				if !strings.Contains(rec.Body.String(), want) {
					t.Errorf("page lacks %q:\n%s", want, rec.Body)
				}
			}
		})
	}
}

// TestStoppedServerPage: a stopped server's page holds no GPU, offers
// "Start again" (one key per spawn, so a double click starts once) and
// "Remove", and follows no events; remove goes back to the list.
func TestStoppedServerPage(t *testing.T) {
	a := baseAnswers()
	a["GET /api/v1/users/alice/servers/old"] = answer{200, stopped}
	a["DELETE /api/v1/users/alice/servers/old?remove=true"] = answer{204, nil}
	s := newSite(t, fakeSessions{v: alice}, a)
	body := s.do(t, "GET", "/servers/old", nil).Body.String()
	for _, want := range []string{`<dd id="gpu">None: the slice was released</dd>`, `id="start-again"`, `name="idem" value="again-sp9"`,
		`name="profile" value="small"`, `action="/servers/old/remove"`} {
		if !strings.Contains(body, want) {
			t.Errorf("stopped server's page lacks %q", want)
		}
	}
	if strings.Contains(body, "data-events") || strings.Contains(body, `id="stop"`) {
		t.Error("a stopped server's page follows events or offers Stop")
	}
	rec := s.do(t, "POST", "/servers/old/remove", url.Values{"csrf": {csrf}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/servers" {
		t.Errorf("remove: %d → %q", rec.Code, rec.Header().Get("Location"))
	}
	if w := s.api.writes(); len(w) != 1 || w[0].Method != "DELETE" || w[0].Path != "/api/v1/users/alice/servers/old?remove=true" {
		t.Errorf("writes %+v", w)
	}
}

// TestPageFragment: with X-Gpubroker-Fragment: main a page answers the
// content of its main element alone, exactly as the whole page has it.
func TestPageFragment(t *testing.T) {
	s := newSite(t, fakeSessions{v: alice}, baseAnswers())
	whole := s.do(t, "GET", "/servers/new", nil).Body.String()
	r := s.request(t, "GET", "/servers/new", nil)
	r.Header.Set("X-Gpubroker-Fragment", "main")
	frag := s.serve(r).Body.String()
	if strings.Contains(frag, "<html") || strings.Contains(frag, "<main") {
		t.Fatalf("the fragment is a whole page:\n%s", frag)
	}
	start, end := strings.Index(whole, `<main id="main" tabindex="-1">`), strings.Index(whole, "</main>")
	if start < 0 || end < 0 || strings.TrimSpace(whole[start+len(`<main id="main" tabindex="-1">`):end]) != strings.TrimSpace(frag) {
		t.Errorf("the fragment is not the page's main content:\nfragment:\n%s\npage:\n%s", frag, whole)
	}
}
