package app

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestAPIPathsNeverRedirect: with the pages mounted, an API path with "."
// or ".." segments still reaches the API as it came (its own JSON 400 or
// 404), where http.ServeMux would have cleaned it with a 301; other paths
// go to the pages' mux.
func TestAPIPathsNeverRedirect(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Header().Set("X-Path", r.URL.Path) })
	h := apiFirst(api, mux)
	for path, want := range map[string]int{
		"/api/v1/users/../servers": http.StatusOK,
		"/api/v1/./servers":        http.StatusOK,
		"/api/../servers":          http.StatusOK,
		"/healthz":                 http.StatusOK,
		"/readyz":                  http.StatusOK,
		"/servers":                 http.StatusTeapot,
		"/servers/../admin/fleet":  http.StatusTemporaryRedirect, // the pages' mux cleans its own paths
		"/apiary":                  http.StatusTeapot,
	} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.URL.Path = path
		h.ServeHTTP(rec, r)
		if rec.Code != want {
			t.Errorf("%s: %d, want %d", path, rec.Code, want)
		}
		if want == http.StatusOK && rec.Header().Get("X-Path") != path {
			t.Errorf("%s reached the API as %q", path, rec.Header().Get("X-Path"))
		}
	}
}
