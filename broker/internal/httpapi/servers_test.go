package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

func TestCreateIsIdempotentPerKey(t *testing.T) {
	h := newHarness(t)
	put := func(key string) (int, v1.Server, string) {
		t.Helper()
		hdr := map[string]string{}
		if key != "" {
			hdr[HeaderIdempotencyKey] = key
		}
		rec := h.do(t, req{method: "PUT", path: "/api/v1/users/alice/servers/nb", token: tokAlice, body: `{"profile":"small"}`, header: hdr})
		if rec.Code >= 300 {
			return rec.Code, v1.Server{}, rec.Header().Get("Location")
		}
		return rec.Code, decode[v1.Server](t, rec), rec.Header().Get("Location")
	}
	code, first, loc := put("k1")
	if code != http.StatusCreated || loc != "/api/v1/users/alice/servers/nb" {
		t.Fatalf("first create: %d, Location %q", code, loc)
	}
	want := v1.Server{
		User: "alice", Name: "nb", Profile: "small", SpawnID: "spawn-1", State: v1.StatePending, Message: "server requested",
		Slice:   v1.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50},
		Sharing: v1.SharingSliced, Resize: v1.ResizeInfo{Supported: true}, CreatedAt: testNow, UpdatedAt: testNow,
	}
	if diff := cmp.Diff(want, first); diff != "" {
		t.Errorf("created server (-want +got):\n%s", diff)
	}
	code, again, loc := put("k1")
	if code != http.StatusOK || loc != "/api/v1/users/alice/servers/nb" || again.SpawnID != first.SpawnID {
		t.Errorf("repeat with the same key: %d, Location %q, spawn %q (want 200, same spawn)", code, loc, again.SpawnID)
	}
	if code, _, _ := put("k2"); code != http.StatusConflict {
		t.Errorf("other key while pending: %d, want 409", code)
	}
	h.servers.advance(fleet.ServerKey{User: "alice", Name: "nb"}, v1.StateFailed, "image pull failed")
	code, restarted, _ := put("k2")
	if code != http.StatusCreated || restarted.SpawnID == first.SpawnID {
		t.Errorf("new key after failure: %d, spawn %q (want 201, a new spawn)", code, restarted.SpawnID)
	}
}

// TestServersCarryTheirBrowserAddress checks that every server answer has
// the proxy's address when the broker serves notebooks, and none otherwise.
func TestServersCarryTheirBrowserAddress(t *testing.T) {
	for _, tc := range []struct {
		name    string
		openURL func(user, name string) string
		want    string
	}{
		{"no proxy", nil, ""},
		{"proxy", func(u, n string) string { return "https://b.example/user/" + u + "/" + n + "/" }, "https://b.example/user/alice/nb/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{openURL: tc.openURL})
			rec := h.do(t, req{method: "PUT", path: "/api/v1/users/alice/servers/nb", token: tokAlice, body: `{"profile":"small"}`})
			if got := decode[v1.Server](t, rec).OpenURL; got != tc.want {
				t.Errorf("create: openUrl %q, want %q", got, tc.want)
			}
			rec = h.do(t, req{method: "GET", path: "/api/v1/servers", token: tokAlice})
			if got := decode[v1.ServerPage](t, rec).Servers; len(got) != 1 || got[0].OpenURL != tc.want {
				t.Errorf("list: %+v, want openUrl %q", got, tc.want)
			}
		})
	}
}

// TestCreateCarriesCommandAndArgs checks that the service gets the
// command and args as sent, order and empty entries kept.
func TestCreateCarriesCommandAndArgs(t *testing.T) {
	h := newHarness(t)
	body := `{"profile":"small","args":["jupyterhub-singleuser","--debug",""],"command":["tini","-g","--"]}`
	rec := h.do(t, req{method: "PUT", path: "/api/v1/users/alice/servers/nb", token: tokAlice, body: body})
	if rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	want := []v1.CreateServerRequest{{
		Profile: "small",
		Command: []string{"tini", "-g", "--"},
		Args:    []string{"jupyterhub-singleuser", "--debug", ""},
	}}
	if diff := cmp.Diff(want, h.servers.requests); diff != "" {
		t.Errorf("requests the service got (-want +got):\n%s", diff)
	}
}

func TestGetShowsGPUAndDeleteIsIdempotent(t *testing.T) {
	h := newHarness(t)
	seedAlice(t, h)
	k := fleet.ServerKey{User: "alice", Name: "nb"}
	h.servers.advance(k, v1.StatePlacing, "placing")
	rec := h.do(t, req{method: "GET", path: "/api/v1/users/alice/servers/nb", token: tokAlice})
	got := decode[v1.Server](t, rec)
	if diff := cmp.Diff(&v1.GPURef{UUID: "GPU-1", Node: "gpu-1"}, got.GPU); diff != "" {
		t.Errorf("gpu (-want +got):\n%s", diff)
	}
	for i, want := range []v1.ServerState{v1.StateStopping, v1.StateStopping} {
		rec := h.do(t, req{method: "DELETE", path: "/api/v1/users/alice/servers/nb", token: tokAlice})
		if rec.Code != http.StatusAccepted || decode[v1.Server](t, rec).State != want {
			t.Errorf("delete #%d: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	rec = h.do(t, req{method: "DELETE", path: "/api/v1/users/alice/servers/never", token: tokAlice})
	if rec.Code != http.StatusNotFound {
		t.Errorf("delete of a server that never existed: %d", rec.Code)
	}
}

func TestListsAreSortedAndNeverNull(t *testing.T) {
	h := newHarness(t)
	rec := h.do(t, req{method: "GET", path: "/api/v1/servers", token: tokBob})
	if strings.TrimSpace(rec.Body.String()) != `{"servers":[]}` {
		t.Errorf("empty list = %s, want {\"servers\":[]}", rec.Body)
	}
	for _, c := range []struct{ tok, path string }{
		{tokAlice, "/api/v1/users/alice/servers/b"},
		{tokAlice, "/api/v1/users/alice/servers/a"},
		{tokBob, "/api/v1/users/bob/servers/z"},
	} {
		h.do(t, req{method: "PUT", path: c.path, token: c.tok, body: `{"profile":"small"}`})
	}
	names := func(list []v1.Server) []string {
		var out []string
		for _, s := range list {
			out = append(out, s.User+"/"+s.Name)
		}
		return out
	}
	tests := []struct {
		name, path, token string
		want              []string
	}{
		{name: "own", path: "/api/v1/servers", token: tokAlice, want: []string{"alice/a", "alice/b"}},
		{name: "user route", path: "/api/v1/users/bob/servers", token: tokBob, want: []string{"bob/z"}},
		{name: "admin all", path: "/api/v1/servers?all=true", token: tokAdmin, want: []string{"alice/a", "alice/b", "bob/z"}},
		{name: "admin one user", path: "/api/v1/servers?user=bob", token: tokAdmin, want: []string{"bob/z"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := h.do(t, req{method: "GET", path: tc.path, token: tc.token})
			if diff := cmp.Diff(tc.want, names(decode[v1.ServerPage](t, rec).Servers)); diff != "" {
				t.Errorf("servers (-want +got):\n%s", diff)
			}
		})
	}
}

// TestValidation checks what the edge refuses, before the service runs.
func TestValidation(t *testing.T) {
	long := strings.Repeat("ü", 128) // 256 bytes
	tests := []struct {
		name    string
		method  string
		path    string
		body    string
		header  map[string]string
		wantMsg string
	}{
		{name: "unknown field", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `{"profile":"small","gpus":2}`,
			wantMsg: `the body has an unknown field "gpus"`},
		{name: "syntax error says where", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `{"profile":"small",}`,
			wantMsg: "the body is not valid JSON at byte 20: invalid character '}' looking for beginning of object key string"},
		{name: "wrong type says which field", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `{"profile":7}`,
			wantMsg: `field "profile" holds a JSON number where a string is expected (byte 12)`},
		{name: "wrong type in a map", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `{"profile":"small","env":{"A":1}}`,
			wantMsg: `field "env" holds a JSON number where a string is expected (byte 31)`},
		{name: "not an object", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `["small"]`,
			wantMsg: "the body holds a JSON array where an object is expected (byte 1)"},
		{name: "null", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: ` null `,
			wantMsg: "the body holds JSON null where an object is expected"},
		{name: "truncated", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `{"profile":"sm`,
			wantMsg: "the body ends before the JSON object is complete"},
		{name: "two objects", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `{"profile":"small"}{}`,
			wantMsg: "the body has more data after the JSON object"},
		{name: "no profile", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `{}`,
			wantMsg: "profile is required"},
		{name: "bad env names, all at once", method: "PUT", path: "/api/v1/users/alice/servers/nb",
			body:    `{"profile":"small","env":{"1A":"x","OK":"y","B-C":"z"},"secretEnv":{"OK":"s"}}`,
			wantMsg: `env name "1A" is not a valid environment variable name (letters, digits and _, not starting with a digit); env name "B-C" is not a valid environment variable name (letters, digits and _, not starting with a digit); OK is in both env and secretEnv`},
		{name: "command and args problems, all at once", method: "PUT", path: "/api/v1/users/alice/servers/nb",
			body:    `{"profile":"small","command":["","-v"],"args":["ok","a\u0000b","` + strings.Repeat("x", v1.MaxCommandEntryBytes+1) + `"]}`,
			wantMsg: "command[0] is empty; it names the program to run (leave command out to keep the image's entrypoint); args[1] contains a NUL byte; args[2] is 4097 bytes long, at most 4096 are allowed"},
		{name: "too many command entries", method: "PUT", path: "/api/v1/users/alice/servers/nb",
			body:    `{"profile":"small","command":["sh"],"args":[` + strings.TrimSuffix(strings.Repeat(`"a",`, v1.MaxCommandEntries), ",") + `]}`,
			wantMsg: "command and args have 257 entries together, at most 256 are allowed"},
		{name: "command is a list", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `{"profile":"small","command":"jupyterhub-singleuser"}`,
			wantMsg: `field "command" holds a JSON string where an array is expected (byte 52)`},
		{name: "slash in the server name", method: "PUT", path: "/api/v1/users/alice/servers/a%2Fb", body: `{"profile":"small"}`,
			wantMsg: `server name "a/b" contains '/'`},
		{name: "control character in the server name", method: "GET", path: "/api/v1/users/alice/servers/a%07b",
			wantMsg: `server name "a\ab" contains control characters`},
		{name: "dot-dot server name", method: "GET", path: "/api/v1/users/alice/servers/%2E%2E",
			wantMsg: `server name ".." is not allowed`},
		{name: "name too long", method: "GET", path: "/api/v1/users/alice/servers/" + long,
			wantMsg: "server name is 256 bytes long; the limit is 255"},
		{name: "bad idempotency key", method: "PUT", path: "/api/v1/users/alice/servers/nb", body: `{"profile":"small"}`,
			header:  map[string]string{HeaderIdempotencyKey: "a key with spaces"},
			wantMsg: "header Idempotency-Key must be printable ASCII without spaces"},
		{name: "bad all flag", method: "GET", path: "/api/v1/servers?all=maybe",
			wantMsg: `query parameter all must be true or false, not "maybe"`},
		{name: "bad last event id", method: "GET", path: "/api/v1/users/alice/servers/nb/events",
			header:  map[string]string{HeaderLastEventID: "1 0"},
			wantMsg: `last event id "1 0" is not an event id of this stream (<milliseconds>-<sequence>, each a number below 2^64)`},
		{name: "an event id beyond 64 bits", method: "GET", path: "/api/v1/users/alice/servers/nb/events",
			header:  map[string]string{HeaderLastEventID: "18446744073709551616-0"},
			wantMsg: `last event id "18446744073709551616-0" is not an event id of this stream (<milliseconds>-<sequence>, each a number below 2^64)`},
		{name: "malformed last event id in the query", method: "GET", path: "/api/v1/users/alice/servers/nb/events?lastEventId=zzz",
			wantMsg: `last event id "zzz" is not an event id of this stream (<milliseconds>-<sequence>, each a number below 2^64)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			seedAlice(t, h)
			rec := h.do(t, req{method: tc.method, path: tc.path, token: tokAlice, body: tc.body, header: tc.header})
			if rec.Code != http.StatusBadRequest {
				t.Errorf("status = %d, want 400", rec.Code)
			}
			want := v1.Error{Code: v1.CodeBadRequest, Message: tc.wantMsg}
			if diff := cmp.Diff(want, decode[v1.Error](t, rec)); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if len(h.servers.creates) != 1 {
				t.Errorf("the service was called %d times, want only the seed", len(h.servers.creates))
			}
		})
	}
}

func TestUnicodeNamesWork(t *testing.T) {
	h := newHarness(t)
	h.servers.servers[fleet.ServerKey{User: "jürgen@example.com", Name: "实验 1"}] = fleet.Server{
		ServerKey: fleet.ServerKey{User: "jürgen@example.com", Name: "实验 1"}, State: v1.StateRunning,
		Slice: v1.Slice{MemoryMiB: 1, ComputePercent: 1, ComputeLimitPercent: 1},
	}
	rec := h.do(t, req{method: "GET", path: "/api/v1/users/j%C3%BCrgen@example.com/servers/%E5%AE%9E%E9%AA%8C%201", token: tokAdmin})
	if rec.Code != http.StatusOK || decode[v1.Server](t, rec).Name != "实验 1" {
		t.Errorf("status %d: %s", rec.Code, rec.Body)
	}
}
