package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestWhatANewUserMeets goes through the real broker the way a new user
// and their tools do: strict input with the problem named (415, a
// duplicate key, an unknown query parameter, an event id beyond 64 bits,
// dot segments, all JSON and never a redirect); the user's quota and its
// use; a refusal that names the limit and leaves no server; pages of
// servers; and the audit log of every lifecycle action with who did it
// (the user, the hub acting for them, an admin), filtered by server.
func TestWhatANewUserMeets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := t.Context()
	alice := e.client("alice")
	small := v1.CreateServerRequest{Profile: "small"}

	// Strict input, over HTTP, every answer a JSON Error.
	raw := func(method, path, contentType, body string, header http.Header) (int, v1.Error, http.Header) {
		t.Helper()
		r, err := http.NewRequestWithContext(ctx, method, e.broker.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			r.Header[k] = v
		}
		r.Header.Set("Authorization", "Bearer "+alice.Token)
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		c := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e v1.Error
		if resp.StatusCode >= 300 {
			if err := harnessDecode(b, &e); err != nil {
				t.Errorf("%s %s: %d with a body that is not a JSON Error: %q", method, path, resp.StatusCode, b)
			}
		}
		return resp.StatusCode, e, resp.Header
	}
	const nb = "/api/v1/users/alice/servers/nb"
	for _, tc := range []struct {
		method, path, contentType, body string
		header                          http.Header
		wantStatus                      int
		wantCode, wantIn                string
	}{
		{"PUT", nb, "text/plain", `{"profile":"small"}`, nil, 415, v1.CodeUnsupportedMediaType, "application/json"},
		{"PUT", nb, "application/json", `{"profile":"small","profile":"medium"}`, nil, 400, v1.CodeBadRequest, `field "profile" is given twice`},
		{"PUT", nb, "application/json", "{\"profile\":\"sm\xffall\"}", nil, 400, v1.CodeBadRequest, `field "profile" is not valid UTF-8`},
		{"GET", "/api/v1/servers?limt=2", "", "", nil, 400, v1.CodeBadRequest, `query parameter "limt"`},
		{"GET", nb + "/events", "", "", http.Header{"Last-Event-Id": {"18446744073709551616-0"}}, 400, v1.CodeBadRequest, "below 2^64"},
		{"GET", "/api/v1/users/alice/servers/..", "", "", nil, 400, v1.CodeBadRequest, `".." is not allowed`},
		{"GET", "/api/v1/./servers", "", "", nil, 404, v1.CodeNotFound, "no route"},
		{"POST", "/api/v1/servers", "", "", nil, 405, v1.CodeMethodNotAllowed, "not allowed"},
	} {
		status, body, hdr := raw(tc.method, tc.path, tc.contentType, tc.body, tc.header)
		if status != tc.wantStatus || body.Code != tc.wantCode || !strings.Contains(body.Message, tc.wantIn) {
			t.Errorf("%s %s: %d %+v (Location %q), want %d %s containing %q", tc.method, tc.path, status, body, hdr.Get("Location"), tc.wantStatus, tc.wantCode, tc.wantIn)
		}
	}

	// The quota and its use, before and after two servers.
	quota := func() v1.QuotaUse {
		t.Helper()
		var q v1.Quota
		if _, err := alice.Do(ctx, http.MethodGet, "/api/v1/users/alice/quota", nil, nil, &q); err != nil || len(q.Quotas) == 0 {
			t.Fatalf("quota: %+v %v", q, err)
		}
		return q.Quotas[0]
	}
	if q := quota(); q.Limit.Servers != 2 || q.Used != (v1.QuotaAmounts{}) {
		t.Errorf("quota before any server: %+v, want 2 servers and nothing in use", q)
	}
	for _, n := range []string{"nb", "nb2"} {
		if _, _, err := alice.CreateServer(ctx, "alice", n, "k-"+n, small); err != nil {
			t.Fatal(err)
		}
	}
	if q := quota(); q.Used != (v1.QuotaAmounts{Servers: 2, MemoryMiB: 16384, ComputePercent: 20}) {
		t.Errorf("quota with two small servers: %+v", q.Used)
	}
	_, _, err := alice.CreateServer(ctx, "alice", "nb3", "k-nb3", small)
	var ae *harness.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusForbidden || ae.Body.Limit == nil ||
		*ae.Body.Limit != (v1.Limit{Kind: v1.LimitQuota, Scope: "user", Name: "alice", Resource: "servers", Limit: 2, Used: 2, Want: 1}) ||
		ae.Body.Message != "user alice quota exceeded: it allows 2 servers at once, and 2 are in use" {
		t.Errorf("third server: %v (limit %+v), want 403 naming the servers quota and its use", err, ae.Body.Limit)
	}
	if _, err := alice.GetServer(ctx, "alice", "nb3"); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Errorf("the refused nb3: %v, want 404 (nothing left behind)", err)
	}

	// The hub starts one for bob; pages of every server.
	hub := &harness.Client{BaseURL: e.broker.URL, Token: e.hubToken}
	if _, _, err := hub.CreateServer(ctx, "bob", "hubnb", "hub-1", small); err != nil {
		t.Fatal(err)
	}
	var names []string
	cursor := ""
	for range 5 {
		q := url.Values{"all": {"true"}, "limit": {"2"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page v1.ServerPage
		if _, err := e.admin.Do(ctx, http.MethodGet, "/api/v1/servers?"+q.Encode(), nil, nil, &page); err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Servers {
			names = append(names, s.User+"/"+s.Name)
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	if diff := cmp.Diff([]string{"alice/nb", "alice/nb2", "bob/hubnb"}, names); diff != "" {
		t.Errorf("pages of every server (-want +got):\n%s", diff)
	}

	// An admin stops alice's nb, alice removes it; the resize of nb2.
	if _, err := e.admin.DeleteServer(ctx, "alice", "nb"); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.WaitServer(ctx, "alice", "nb", v1.StateStopped, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if status, err := alice.Do(ctx, http.MethodDelete, harness.ServerPath("alice", "nb")+"?remove=true", nil, nil, nil); err != nil || status != http.StatusNoContent {
		t.Fatalf("remove: %d %v", status, err)
	}
	if _, err := alice.WaitServer(ctx, "alice", "nb2", v1.StateRunning, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	mem := int64(12288)
	if status, err := alice.Do(ctx, http.MethodPatch, harness.ServerPath("alice", "nb2")+"/slice", v1.ResizeRequest{MemoryMiB: &mem}, nil, nil); err != nil || (status != 200 && status != 202) {
		t.Fatalf("resize: %d %v", status, err)
	}

	type row struct{ Actor, Kind, Action, Target, Outcome string }
	audit := func(q string) []row {
		t.Helper()
		var page v1.AuditPage
		if _, err := e.admin.Do(ctx, http.MethodGet, "/api/v1/admin/audit?"+q, nil, nil, &page); err != nil {
			t.Fatal(err)
		}
		var out []row
		for _, en := range page.Entries {
			out = append(out, row{en.Actor, en.ActorKind, en.Action, en.Target, en.Inputs["outcome"]})
		}
		return out
	}
	if diff := cmp.Diff([]row{
		{"alice", v1.ActorUser, "server.remove", "server:alice/nb", "done"},
		{"admin", v1.ActorAdmin, "server.stop", "server:alice/nb", "done"},
		{"alice", v1.ActorUser, "server.create", "server:alice/nb", "done"},
	}, audit("user=alice&server=nb")); diff != "" {
		t.Errorf("audit of alice/nb (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]row{{"jupyterhub", v1.ActorHub, "server.create", "server:bob/hubnb", "done"}}, audit("user=bob")); diff != "" {
		t.Errorf("audit of bob's servers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]row{{"alice", v1.ActorUser, "server.resize", "server:alice/nb2", "done"}}, audit("user=alice&action=server.resize")); diff != "" {
		t.Errorf("audit of the resize (-want +got):\n%s", diff)
	}
	if got := audit("user=alice&server=nb3"); len(got) != 1 || got[0].Outcome != "refused" {
		t.Errorf("audit of the refused create: %+v, want one refused server.create", got)
	}
}

// harnessDecode decodes an error body strictly: exactly a v1.Error.
func harnessDecode(b []byte, e *v1.Error) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(e); err != nil {
		return err
	}
	if e.Code == "" || e.Message == "" {
		return errors.New("no code or message")
	}
	return nil
}
