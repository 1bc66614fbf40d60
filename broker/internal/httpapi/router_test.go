package httpapi

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// TestRouterErrorsOverHTTP: through a real HTTP server, every answer the
// router gives by itself (dot segments, unknown paths, wrong methods,
// OPTIONS, a body over the limit by Content-Length) is a JSON Error with
// its own code, and no API path redirects.
func TestRouterErrorsOverHTTP(t *testing.T) {
	h := newHarness(t)
	srv := httptest.NewServer(h.e)
	t.Cleanup(srv.Close)
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	tests := []struct {
		method, path string
		body         []byte
		wantStatus   int
		wantCode     string
	}{
		{"GET", "/api/v1/users/../servers", nil, http.StatusBadRequest, v1.CodeBadRequest},
		{"GET", "/api/v1/users/alice/servers/./events", nil, http.StatusBadRequest, v1.CodeBadRequest},
		{"GET", "/api/v1/users/alice/servers/%2e%2e", nil, http.StatusBadRequest, v1.CodeBadRequest},
		{"GET", "/api/v1/./servers", nil, http.StatusNotFound, v1.CodeNotFound},
		{"GET", "/api/v1/servers/", nil, http.StatusNotFound, v1.CodeNotFound},
		{"GET", "/api/v1//servers", nil, http.StatusNotFound, v1.CodeNotFound},
		{"POST", "/api/v1/servers", nil, http.StatusMethodNotAllowed, v1.CodeMethodNotAllowed},
		{"OPTIONS", "/api/v1/servers", nil, http.StatusMethodNotAllowed, v1.CodeMethodNotAllowed},
		{"PUT", "/api/v1/users/alice/servers/nb", bytes.Repeat([]byte("x"), DefaultBodyLimitBytes+1), http.StatusRequestEntityTooLarge, v1.CodePayloadTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r, err := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, bytes.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			r.Header.Set("Authorization", "Bearer "+tokAlice)
			r.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("status %d (Location %q), want %d: %s", resp.StatusCode, resp.Header.Get("Location"), tc.wantStatus, body)
			}
			var e v1.Error
			if err := json.Unmarshal(body, &e); err != nil || e.Code != tc.wantCode || e.Message == "" {
				t.Errorf("body %q (%v), want a JSON Error with code %s", body, err, tc.wantCode)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}
