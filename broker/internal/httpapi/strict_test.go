package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// TestStrictInput: every body that is not exactly what the API documents,
// and every query or header value that does not parse, is refused with
// the problem and the field named; nothing reaches the service.
func TestStrictInput(t *testing.T) {
	const create = "/api/v1/users/alice/servers/nb2"
	const slice = "/api/v1/users/alice/servers/lab/slice"
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		header     map[string]string
		wantStatus int
		wantCode   string
		wantMsg    string
		wantFields []v1.FieldProblem
	}{
		{name: "a body that is not JSON is 415", method: "PUT", path: create, body: `{"profile":"small"}`,
			header: map[string]string{"Content-Type": "text/plain"}, wantStatus: 415, wantCode: v1.CodeUnsupportedMediaType,
			wantMsg: `the body is "text/plain"; send it as application/json`},
		{name: "a body without a Content-Type is 415", method: "PUT", path: create, body: `{"profile":"small"}`,
			header: map[string]string{"Content-Type": ""}, wantStatus: 415, wantCode: v1.CodeUnsupportedMediaType,
			wantMsg: "the request has a body but no Content-Type; send it as application/json"},
		{name: "JSON in another charset is 415", method: "PUT", path: create, body: `{"profile":"small"}`,
			header: map[string]string{"Content-Type": "application/json; charset=latin1"}, wantStatus: 415, wantCode: v1.CodeUnsupportedMediaType,
			wantMsg: `the body's charset is "latin1"; JSON is UTF-8`},
		{name: "charset utf-8 is accepted", method: "PUT", path: create, body: `{"profile":"small"}`,
			header: map[string]string{"Content-Type": "application/json; charset=UTF-8"}, wantStatus: 201},
		{name: "invalid UTF-8 in a value names the field", method: "PUT", path: create, body: "{\"profile\":\"small\",\"env\":{\"A\":\"\xff\xfe\"}}",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `field "env.A" is not valid UTF-8`},
		{name: "invalid UTF-8 in an array entry names it", method: "PUT", path: create, body: "{\"profile\":\"small\",\"args\":[\"ok\",\"\xc3\"]}",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `field "args[1]" is not valid UTF-8`},
		{name: "a duplicate key names it", method: "PUT", path: create, body: `{"profile":"small","profile":"big"}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `field "profile" is given twice`},
		{name: "a duplicate key deep down names its path", method: "PUT", path: create, body: `{"profile":"small","env":{"A":"1","A":"2"}}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `field "env.A" is given twice`},
		{name: "a miscased key is not the field", method: "PUT", path: create, body: `{"Profile":"small"}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `field "Profile" is spelled "profile" in this API (names are case-sensitive)`},
		{name: "env names are case-sensitive and both fine", method: "PUT", path: create, body: `{"profile":"small","env":{"a":"1","A":"2"}}`,
			wantStatus: 201},
		{name: "a number out of range names the field", method: "PATCH", path: slice, body: `{"memoryMiB":1e30}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `field "memoryMiB" holds number 1e30, which is not a whole number in range (byte 17)`},
		{name: "a fraction is not a whole number", method: "POST", path: "/api/v1/users/alice/servers/lab/extend", body: `{"seconds":90.5}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `field "seconds" holds number 90.5, which is not a whole number in range (byte 15)`},
		{name: "a PATCH that sets nothing", method: "PATCH", path: slice, body: `{}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: "the body changes nothing; set memoryMiB, computePercent or computeLimitPercent"},
		{name: "a PATCH that changes nothing", method: "PATCH", path: slice, body: `{"memoryMiB":8192,"computePercent":20}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: "lab already has 8192 MiB and 20 % compute (up to 50 %); the body changes nothing"},
		{name: "computePercent 101 is one problem", method: "PATCH", path: slice, body: `{"computePercent":101}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: "computePercent must be 1..100, got 101",
			wantFields: []v1.FieldProblem{{Field: "computePercent", Message: "must be 1..100, got 101"}}},
		{name: "every slice problem at once, one each", method: "PATCH", path: slice, body: `{"memoryMiB":0,"computePercent":0,"computeLimitPercent":101}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: "memoryMiB must be > 0, got 0; computePercent must be 1..100, got 0; computeLimitPercent must be 1..100, got 101",
			wantFields: []v1.FieldProblem{{Field: "memoryMiB", Message: "must be > 0, got 0"}, {Field: "computePercent", Message: "must be 1..100, got 0"},
				{Field: "computeLimitPercent", Message: "must be 1..100, got 101"}}},
		{name: "extend out of range names seconds", method: "POST", path: "/api/v1/users/alice/servers/lab/extend", body: `{"seconds":5}`,
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: "seconds must be between 60 and 604800 (1 minute to 7 days)",
			wantFields: []v1.FieldProblem{{Field: "seconds", Message: "must be between 60 and 604800 (1 minute to 7 days)"}}},
		{name: "an unknown query parameter", method: "GET", path: "/api/v1/servers?limt=5",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `query parameter "limt" is not one of this route's (all, user, limit, cursor)`},
		{name: "a query parameter on a route that takes none", method: "GET", path: "/api/v1/me?verbose=1",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `query parameter "verbose" is not one of this route's; it takes none`},
		{name: "a query parameter given twice", method: "GET", path: "/api/v1/servers?limit=1&limit=2",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: "query parameter limit is given 2 times; give it once"},
		{name: "a query parameter without a value", method: "GET", path: "/api/v1/servers?limit=",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: "query parameter limit has no value"},
		{name: "a bad percent-escape in the query", method: "GET", path: "/api/v1/servers?user=%zz",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `the query string is not properly escaped: "%zz"`},
		{name: "a semicolon in the query", method: "GET", path: "/api/v1/servers?limit=1;all=true",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: "the query string is not properly escaped: invalid semicolon separator in query"},
		{name: "remove must be a boolean", method: "DELETE", path: "/api/v1/users/alice/servers/lab?remove=please",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `query parameter remove must be true or false, not "please"`},
		{name: "a page size out of range", method: "GET", path: "/api/v1/users/alice/servers?limit=1001",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: "limit must be a whole number from 1 to 1000"},
		{name: "a cursor of another list", method: "GET", path: "/api/v1/users/alice/servers?cursor=zz",
			wantStatus: 400, wantCode: v1.CodeBadRequest, wantMsg: `cursor "zz" is not one this list returned`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newResizeHarness(t, &fakeResizer{applied: true})
			rec := h.do(t, req{method: tc.method, path: tc.path, token: tokAlice, body: tc.body, header: tc.header})
			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if tc.wantCode == "" {
				return
			}
			want := v1.Error{Code: tc.wantCode, Message: tc.wantMsg, Fields: tc.wantFields}
			if diff := cmp.Diff(want, decode[v1.Error](t, rec)); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEveryRouteRefusesUnknownQueryParameters: no route ignores a
// parameter it does not take.
func TestEveryRouteRefusesUnknownQueryParameters(t *testing.T) {
	h := newHarness(t, harnessConfig{policy: fakePolicy{}, audit: fakeAudit{}, resize: &fakeResizer{}, reclaim: &fakeReclaim{}})
	for _, r := range h.e.Routes() {
		path := strings.NewReplacer(":user", "alice", ":name", "lab", ":uuid", "GPU-1").Replace(r.Path)
		rec := h.do(t, req{method: r.Method, path: path + "?zz=1", token: tokAdmin})
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `query parameter \"zz\"`) {
			t.Errorf("%s %s?zz=1 = %d %s, want 400 naming zz", r.Method, path, rec.Code, rec.Body)
		}
	}
}

// TestServerListsPage: limit and cursor page through a list without
// repeating or skipping, and the last page has no next.
func TestServerListsPage(t *testing.T) {
	h := newHarness(t)
	var want []string
	for _, n := range []string{"e", "a", "d", "b", "c"} {
		h.do(t, req{method: "PUT", path: "/api/v1/users/alice/servers/" + n, token: tokAlice, body: `{"profile":"small"}`})
	}
	want = []string{"a", "b", "c", "d", "e"}
	for _, base := range []string{"/api/v1/users/alice/servers", "/api/v1/servers", "/api/v1/servers?user=alice"} {
		t.Run(base, func(t *testing.T) {
			token := tokAlice
			if strings.Contains(base, "user=") {
				token = tokAdmin
			}
			var got []string
			cursor := ""
			for page := 0; ; page++ {
				q := url.Values{"limit": {"2"}}
				if cursor != "" {
					q.Set("cursor", cursor)
				}
				sep := "?"
				if strings.Contains(base, "?") {
					sep = "&"
				}
				rec := h.do(t, req{method: "GET", path: base + sep + q.Encode(), token: token})
				if rec.Code != http.StatusOK {
					t.Fatalf("page %d: %d %s", page, rec.Code, rec.Body)
				}
				p := decode[v1.ServerPage](t, rec)
				if len(p.Servers) > 2 {
					t.Fatalf("page %d has %d servers, limit 2", page, len(p.Servers))
				}
				for _, s := range p.Servers {
					got = append(got, s.Name)
				}
				if p.Next == "" {
					break
				}
				cursor = p.Next
				if page > 5 {
					t.Fatal("the pages do not end")
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("names over all pages (-want +got):\n%s", diff)
			}
		})
	}
}

// TestQuotaRoute: a user sees every cap that applies and what is in use
// under each; the hub and admins see a user's with the groups they send;
// another user's is hidden.
func TestQuotaRoute(t *testing.T) {
	h := newHarness(t)
	seedAlice(t, h)
	rec := h.do(t, req{method: "GET", path: "/api/v1/users/alice/quota", token: tokAlice})
	want := v1.Quota{User: "alice", Quotas: []v1.QuotaUse{
		{Scope: "user", Name: "alice", Limit: v1.QuotaAmounts{Servers: 2, MemoryMiB: 98304, ComputePercent: 100}, Used: v1.QuotaAmounts{Servers: 1, MemoryMiB: 8192, ComputePercent: 20}},
		{Scope: "group", Name: "ml", Limit: v1.QuotaAmounts{Servers: 20}},
	}}
	if diff := cmp.Diff(want, decode[v1.Quota](t, rec)); diff != "" {
		t.Errorf("alice's quota (-want +got):\n%s", diff)
	}
	rec = h.do(t, req{method: "GET", path: "/api/v1/users/alice/quota", token: tokHub, header: map[string]string{v1.HeaderGroups: "ops"}})
	if got := decode[v1.Quota](t, rec); len(got.Quotas) != 2 || got.Quotas[1].Name != "ops" {
		t.Errorf("the hub's view with X-Gpubroker-Groups: ops = %+v", got)
	}
	if rec := h.do(t, req{method: "GET", path: "/api/v1/users/alice/quota", token: tokBob}); rec.Code != http.StatusNotFound {
		t.Errorf("bob reading alice's quota: %d, want 404", rec.Code)
	}
	rec = h.do(t, req{method: "GET", path: "/api/v1/users/alice/quota", token: tokHub, header: map[string]string{v1.HeaderGroups: "ml,a\x01b"}})
	if rec.Code != http.StatusBadRequest || !strings.Contains(decode[v1.Error](t, rec).Message, "header X-Gpubroker-Groups") {
		t.Errorf("a groups header that does not parse: %d %s, want 400 naming the header", rec.Code, rec.Body)
	}
}

// TestStopAndRemove: DELETE stops (202), ?remove=true removes a stopped
// or failed server (204) and refuses a live one in words (409); every
// call reaches the service with who acted.
func TestStopAndRemove(t *testing.T) {
	h := newHarness(t)
	seedAlice(t, h)
	const p = "/api/v1/users/alice/servers/nb"
	rec := h.do(t, req{method: "DELETE", path: p + "?remove=true", token: tokAlice})
	if rec.Code != http.StatusConflict || decode[v1.Error](t, rec).Message != "nb is starting; stop it before removing it" {
		t.Errorf("remove of a live server: %d %s", rec.Code, rec.Body)
	}
	if rec := h.do(t, req{method: "DELETE", path: p, token: tokAdmin}); rec.Code != http.StatusAccepted {
		t.Fatalf("stop: %d %s", rec.Code, rec.Body)
	}
	h.servers.advance(fleet.ServerKey{User: "alice", Name: "nb"}, v1.StateStopped, "stopped")
	if rec := h.do(t, req{method: "DELETE", path: p + "?remove=true", token: tokHub}); rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
		t.Errorf("remove of a stopped server: %d %q, want 204 and no body", rec.Code, rec.Body)
	}
	if rec := h.do(t, req{method: "GET", path: p, token: tokAlice}); rec.Code != http.StatusNotFound {
		t.Errorf("after remove: %d, want 404", rec.Code)
	}
	if rec := h.do(t, req{method: "DELETE", path: p + "?remove=true", token: tokAlice}); rec.Code != http.StatusNotFound {
		t.Errorf("second remove: %d, want 404", rec.Code)
	}
	want := []string{"create user:alice", "remove user:alice", "delete admin:root", "remove hub:jupyterhub", "remove user:alice"}
	if diff := cmp.Diff(want, h.servers.actors); diff != "" {
		t.Errorf("actors reaching the service (-want +got):\n%s", diff)
	}
}

// fakePolicy and fakeAudit serve the admin routes for the route walk; they
// are never reached there.
type fakePolicy struct{}

func (fakePolicy) Get(context.Context) (reclaim.Policy, error) { return reclaim.DefaultPolicy(), nil }
func (fakePolicy) Put(_ context.Context, p reclaim.Policy, _ string) (reclaim.Policy, error) {
	return p, nil
}

type fakeAudit struct{}

func (fakeAudit) Audit(context.Context, audit.Query) ([]audit.Entry, string, error) {
	return nil, "", nil
}
