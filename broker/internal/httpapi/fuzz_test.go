package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// FuzzCreateServer sends arbitrary names, bodies and headers to the create
// route: whatever comes in, the answer is one openapi.yaml allows and never
// a 500 (the fake service does not fail).
func FuzzCreateServer(f *testing.F) {
	f.Add("nb", `{"profile":"small"}`, "k1", "ml")
	f.Add("实验", `{"profile":"small","env":{"A":"1"},"secretEnv":{"T":"s"}}`, "", "")
	f.Add("a\x00b", `{"profile":`, "key with space", ",,,")
	f.Add("..", `[]`, "\xff", "a,b,c")
	f.Add("x", `{"profile":"small","env":{"1":2}}`, "", "")
	f.Fuzz(func(t *testing.T, name, body, key, groups string) {
		h := newHarness(t)
		rec := h.do(t, req{
			method: http.MethodPut, path: "/api/v1/users/alice/servers/" + url.PathEscape(name), token: tokHub, body: body,
			header: map[string]string{HeaderIdempotencyKey: key, v1.HeaderGroups: groups},
		})
		if rec.Code >= 500 {
			t.Errorf("status %d: %s", rec.Code, rec.Body)
		}
	})
}

// FuzzRoutes sends arbitrary methods, paths, query strings, content types
// and bodies through the router: the answer is one openapi.yaml allows,
// never a redirect or a 500. `go test` runs the seeds and the corpus in
// testdata; `go tool task fuzz` (part of `go tool task test`) explores
// both fuzz targets for a bounded time, next to TestRandomizedRequests.
func FuzzRoutes(f *testing.F) {
	f.Add("PUT", "/api/v1/users/alice/servers/nb", "", "application/json", `{"profile":"small","profile":"x"}`)
	f.Add("PATCH", "/api/v1/users/alice/servers/nb/slice", "zz=1", "application/json", `{"memoryMiB":1e999}`)
	f.Add("GET", "/api/v1/users/alice/servers/nb/events", "lastEventId=99999999999999999999-0", "", "")
	f.Add("GET", "/api/v1/users/../servers", "", "", "")
	f.Add("DELETE", "/api/v1/users/alice/servers/nb", "remove=true", "", "")
	f.Add("POST", "/api/v1/admin/reclaim-policy/preview", "", "text/plain", "{\"version\":\xff}")
	f.Fuzz(func(t *testing.T, method, path, query, contentType, body string) {
		u, err := url.ParseRequestURI(path)
		if err != nil || !strings.HasPrefix(u.Path, "/") || !isToken(method) {
			t.Skip("not a request net/http would pass on")
		}
		u.RawQuery = query
		h := newHarness(t, harnessConfig{opts: []Option{WithEventsBlock(time.Millisecond)}})
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		hr := httptest.NewRequestWithContext(ctx, method, "/", strings.NewReader(body))
		hr.URL, hr.RequestURI = u, u.RequestURI()
		hr.Header.Set("Authorization", "Bearer "+tokAlice)
		hr.Header.Set("Content-Type", contentType)
		rec := httptest.NewRecorder()
		h.e.ServeHTTP(rec, hr)
		if rec.Code >= 500 || (rec.Code >= 300 && rec.Code < 400) {
			t.Errorf("%s %s: %d %s", method, u, rec.Code, rec.Body)
		}
	})
}

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2), as
// a request method must be: visible ASCII without separators.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
