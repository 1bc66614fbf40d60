package httpapi

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// seedAlice creates alice's server "nb" through the API.
func seedAlice(t *testing.T, h *harness) {
	t.Helper()
	rec := h.do(t, req{method: http.MethodPut, path: "/api/v1/users/alice/servers/nb", token: tokAlice, body: `{"profile":"small"}`})
	if rec.Code != http.StatusCreated {
		t.Fatalf("seed: status %d: %s", rec.Code, rec.Body)
	}
}

func TestAccessMatrix(t *testing.T) {
	const (
		hidden     = `user "alice" has no server named "nb"`
		ghost      = `user "alice" has no server named "ghost"`
		hiddenList = `user "alice" has no servers you can see`
	)
	tests := []struct {
		name       string
		method     string
		path       string
		token      string
		body       string
		header     map[string]string
		wantStatus int
		wantCode   string // for errors
		wantMsg    string // for errors; "" = do not check
	}{
		// One server, every kind of caller.
		{name: "owner reads", method: "GET", path: "/api/v1/users/alice/servers/nb", token: tokAlice, wantStatus: 200},
		{name: "admin reads", method: "GET", path: "/api/v1/users/alice/servers/nb", token: tokAdmin, wantStatus: 200},
		{name: "hub reads for the user", method: "GET", path: "/api/v1/users/alice/servers/nb", token: tokHub, wantStatus: 200},
		{name: "other user gets 404 as if it did not exist", method: "GET", path: "/api/v1/users/alice/servers/nb", token: tokBob,
			wantStatus: 404, wantCode: v1.CodeNotFound, wantMsg: hidden},
		{name: "a server that does not exist reads the same", method: "GET", path: "/api/v1/users/alice/servers/ghost", token: tokAdmin,
			wantStatus: 404, wantCode: v1.CodeNotFound, wantMsg: ghost},
		{name: "other user sees a missing server the same way", method: "GET", path: "/api/v1/users/alice/servers/ghost", token: tokBob,
			wantStatus: 404, wantCode: v1.CodeNotFound, wantMsg: ghost},
		{name: "other user cannot delete", method: "DELETE", path: "/api/v1/users/alice/servers/nb", token: tokBob,
			wantStatus: 404, wantCode: v1.CodeNotFound, wantMsg: hidden},
		{name: "other user cannot create", method: "PUT", path: "/api/v1/users/alice/servers/nb2", token: tokBob, body: `{"profile":"small"}`,
			wantStatus: 404, wantCode: v1.CodeNotFound, wantMsg: `user "alice" has no server named "nb2"`},
		{name: "other user cannot follow events", method: "GET", path: "/api/v1/users/alice/servers/nb/events", token: tokBob,
			wantStatus: 404, wantCode: v1.CodeNotFound, wantMsg: hidden},
		{name: "no credentials", method: "GET", path: "/api/v1/users/alice/servers/nb",
			wantStatus: 401, wantCode: v1.CodeUnauthorized, wantMsg: "the request carries no credentials; send an Authorization: Bearer <token> header"},
		{name: "expired token gives its reason", method: "GET", path: "/api/v1/users/alice/servers/nb", token: tokExpired,
			wantStatus: 401, wantCode: v1.CodeUnauthorized, wantMsg: "token expired at 2026-11-29T15:04:05Z"},
		{name: "forged token", method: "GET", path: "/api/v1/me", token: "forged",
			wantStatus: 401, wantCode: v1.CodeUnauthorized, wantMsg: "token signature is invalid"},
		{name: "identity provider down is 503, not 401", method: "GET", path: "/api/v1/me", token: tokIdPDown,
			wantStatus: 503, wantCode: v1.CodeUnavailable, wantMsg: "the identity provider cannot be reached; try again shortly"},

		// Lists.
		{name: "owner lists", method: "GET", path: "/api/v1/users/alice/servers", token: tokAlice, wantStatus: 200},
		{name: "admin lists a user", method: "GET", path: "/api/v1/users/alice/servers", token: tokAdmin, wantStatus: 200},
		{name: "hub lists a user", method: "GET", path: "/api/v1/users/alice/servers", token: tokHub, wantStatus: 200},
		{name: "other user cannot list", method: "GET", path: "/api/v1/users/alice/servers", token: tokBob,
			wantStatus: 404, wantCode: v1.CodeNotFound, wantMsg: hiddenList},
		{name: "other user cannot list by query", method: "GET", path: "/api/v1/servers?user=alice", token: tokBob,
			wantStatus: 404, wantCode: v1.CodeNotFound, wantMsg: hiddenList},
		{name: "user lists own by query", method: "GET", path: "/api/v1/servers?user=alice", token: tokAlice, wantStatus: 200},
		{name: "all is for admins", method: "GET", path: "/api/v1/servers?all=true", token: tokAlice,
			wantStatus: 403, wantCode: v1.CodeForbidden, wantMsg: "only administrators may list every server"},
		{name: "hub is not admin", method: "GET", path: "/api/v1/servers?all=true", token: tokHub,
			wantStatus: 403, wantCode: v1.CodeForbidden, wantMsg: "only administrators may list every server"},
		{name: "admin lists all", method: "GET", path: "/api/v1/servers?all=true", token: tokAdmin, wantStatus: 200},
		{name: "hub lists a user by query", method: "GET", path: "/api/v1/servers?user=alice", token: tokHub, wantStatus: 200},

		// Admin routes.
		{name: "admin route refuses users", method: "GET", path: "/api/v1/admin/gpus", token: tokAlice,
			wantStatus: 403, wantCode: v1.CodeForbidden, wantMsg: "this route is for administrators (members of the admin group)"},
		{name: "admin route refuses the hub", method: "GET", path: "/api/v1/admin/gpus", token: tokHub,
			wantStatus: 403, wantCode: v1.CodeForbidden},
		{name: "admin route needs credentials first", method: "GET", path: "/api/v1/admin/gpus",
			wantStatus: 401, wantCode: v1.CodeUnauthorized},
		{name: "admin route admits admins", method: "GET", path: "/api/v1/admin/gpus", token: tokAdmin, wantStatus: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			seedAlice(t, h)
			before := h.servers.events[fleet.ServerKey{User: "alice", Name: "nb"}]
			rec := h.do(t, req{method: tc.method, path: tc.path, token: tc.token, body: tc.body, header: tc.header})
			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if tc.wantCode != "" {
				got := decode[v1.Error](t, rec)
				if got.Code != tc.wantCode || (tc.wantMsg != "" && got.Message != tc.wantMsg) {
					t.Errorf("error = %+v, want code %q message %q", got, tc.wantCode, tc.wantMsg)
				}
				// A refused call changes nothing.
				after := h.servers.events[fleet.ServerKey{User: "alice", Name: "nb"}]
				if diff := cmp.Diff(before, after); diff != "" {
					t.Errorf("refused call changed alice/nb's events (-before +after):\n%s", diff)
				}
				if len(h.servers.servers) != 1 || len(h.servers.creates) != 1 {
					t.Errorf("refused call reached the service: %d servers, %d creates, want 1 and 1", len(h.servers.servers), len(h.servers.creates))
				}
			}
			if tc.wantStatus == 401 {
				if got := rec.Header().Get("WWW-Authenticate"); got == "" {
					t.Error("401 without WWW-Authenticate")
				}
			}
		})
	}
}

// TestActingGroups checks which groups a create is charged to.
func TestActingGroups(t *testing.T) {
	tests := []struct {
		name   string
		token  string
		user   string
		groups string // X-Gpubroker-Groups
		want   createCall
	}{
		{name: "user: groups from the token, header ignored", token: tokAlice, user: "alice", groups: "gpubroker-admins",
			want: createCall{User: "alice", Groups: []string{"ml"}}},
		{name: "hub: groups from the header, trimmed, deduplicated, sorted", token: tokHub, user: "alice", groups: "research, ml,ml , ",
			want: createCall{User: "alice", Groups: []string{"ml", "research"}}},
		{name: "hub without header: no groups", token: tokHub, user: "alice",
			want: createCall{User: "alice"}},
		{name: "admin for another user: groups from the header only", token: tokAdmin, user: "bob", groups: "ml",
			want: createCall{User: "bob", Groups: []string{"ml"}}},
		{name: "admin for themself: groups from the token", token: tokAdmin, user: "root", groups: "ml",
			want: createCall{User: "root", Groups: []string{"gpubroker-admins"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			hdr := map[string]string{}
			if tc.groups != "" {
				hdr[v1.HeaderGroups] = tc.groups
			}
			rec := h.do(t, req{method: "PUT", path: "/api/v1/users/" + tc.user + "/servers/nb", token: tc.token, body: `{"profile":"small"}`, header: hdr})
			if rec.Code != http.StatusCreated {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if diff := cmp.Diff([]createCall{tc.want}, h.servers.creates); diff != "" {
				t.Errorf("Create calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestProfilesFilteredByGroups(t *testing.T) {
	tests := []struct {
		name   string
		token  string
		groups string
		want   []string
	}{
		{name: "member of ml sees both", token: tokAlice, want: []string{"small", "big"}},
		{name: "no groups: only open profiles", token: tokBob, want: []string{"small"}},
		{name: "hub with the user's groups", token: tokHub, groups: "ml", want: []string{"small", "big"}},
		{name: "hub without groups", token: tokHub, want: []string{"small"}},
		{name: "user cannot widen with the header", token: tokBob, groups: "ml", want: []string{"small"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			hdr := map[string]string{}
			if tc.groups != "" {
				hdr[v1.HeaderGroups] = tc.groups
			}
			rec := h.do(t, req{method: "GET", path: "/api/v1/profiles", token: tc.token, header: hdr})
			var got []string
			for _, p := range decode[[]v1.Profile](t, rec) {
				got = append(got, p.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("profiles (-want +got):\n%s", diff)
			}
		})
	}
}
