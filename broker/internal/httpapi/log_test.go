package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRequestLogLine checks the one line per request: per-request fields,
// request id handling, and the level.
func TestRequestLogLine(t *testing.T) {
	tests := []struct {
		name      string
		r         req
		sentID    string
		keepID    bool // the answer echoes sentID
		wantLevel string
		wantRoute string
		wantUser  any // nil: no user field
		wantCode  int
	}{
		{name: "authenticated request", r: req{method: "GET", path: "/api/v1/me", token: tokAlice}, sentID: "abc-123.X_y", keepID: true,
			wantLevel: "INFO", wantRoute: "/api/v1/me", wantUser: "alice", wantCode: 200},
		{name: "forged request id is replaced", r: req{method: "GET", path: "/api/v1/me", token: tokBob}, sentID: "x\" level=ERROR",
			wantLevel: "INFO", wantRoute: "/api/v1/me", wantUser: "bob", wantCode: 200},
		{name: "too long request id is replaced", r: req{method: "GET", path: "/api/v1/me", token: tokBob}, sentID: strings.Repeat("a", 65),
			wantLevel: "INFO", wantRoute: "/api/v1/me", wantUser: "bob", wantCode: 200},
		{name: "refused request has no user", r: req{method: "GET", path: "/api/v1/me", token: tokExpired},
			wantLevel: "INFO", wantRoute: "/api/v1/me", wantCode: 401},
		{name: "passing probe is debug", r: req{method: "GET", path: "/healthz"},
			wantLevel: "DEBUG", wantRoute: "/healthz", wantCode: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			if tc.sentID != "" {
				tc.r.header = map[string]string{"X-Request-ID": tc.sentID}
			}
			rec := h.do(t, tc.r)
			if rec.Code != tc.wantCode {
				t.Fatalf("status %d, want %d", rec.Code, tc.wantCode)
			}
			id := rec.Header().Get("X-Request-ID")
			if (id == tc.sentID) != tc.keepID || !validRequestID(id) {
				t.Errorf("answer request id %q (sent %q, keep %v)", id, tc.sentID, tc.keepID)
			}
			lines := h.logs.lines(t)
			if len(lines) != 1 {
				t.Fatalf("%d log lines, want 1: %v", len(lines), lines)
			}
			l := lines[0]
			if l["level"] != tc.wantLevel || l["msg"] != "request" || l["request_id"] != id || l["route"] != tc.wantRoute ||
				l["user"] != tc.wantUser || l["status"] != float64(tc.wantCode) || l["method"] != "GET" || l["path"] != tc.r.path {
				t.Errorf("log line %v", l)
			}
		})
	}
}

func TestBodyLimitOption(t *testing.T) {
	h := newHarness(t, harnessConfig{opts: []Option{WithBodyLimitBytes(64)}})
	rec := h.do(t, req{method: http.MethodPut, path: "/api/v1/users/alice/servers/nb", token: tokAlice,
		body: `{"profile":"small","env":{"A":"` + strings.Repeat("x", 64) + `"}}`})
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("declared length: status %d, want 413: %s", rec.Code, rec.Body)
	}

	// Without a declared length the limit applies while reading.
	body := `{"profile":"small","env":{"A":"` + strings.Repeat("x", 64) + `"}}`
	r := httptest.NewRequest(http.MethodPut, "/api/v1/users/alice/servers/nb", io.NopCloser(strings.NewReader(body)))
	r.ContentLength = -1
	r.Header.Set("Authorization", "Bearer "+tokAlice)
	w := httptest.NewRecorder()
	h.e.ServeHTTP(w, r)
	checkContract(t, r, w.Code, w.Header(), w.Body.Bytes())
	if w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), "larger than 64 bytes") {
		t.Errorf("streamed body: status %d, want 413: %s", w.Code, w.Body)
	}
}
