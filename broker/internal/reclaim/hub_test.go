package reclaim_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// hubServer records JupyterHub activity posts; it answers 204 like the hub
// for a valid token and 403 otherwise.
type hubServer struct {
	mu    sync.Mutex
	posts []hubPost
	srv   *httptest.Server
}

type hubPost struct {
	Path string
	Body map[string]any
}

func newHubServer(t *testing.T) *hubServer {
	t.Helper()
	h := &hubServer{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Authorization") != "token hub-secret" {
			http.Error(w, `{"status":403,"message":"Forbidden"}`, http.StatusForbidden)
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.posts = append(h.posts, hubPost{r.URL.EscapedPath(), body})
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func TestHubActivity(t *testing.T) {
	h := newHubServer(t)
	hub, err := reclaim.NewHub(h.srv.URL+"/jhub/", "hub-secret", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := hub.Activity(t.Context(), "ada lovelace/x", "gpu", t0); err != nil {
		t.Fatal(err)
	}
	want := []hubPost{{"/jhub/hub/api/users/ada%20lovelace%2Fx/activity", map[string]any{
		"last_activity": "2026-11-29T15:00:00.000Z",
		"servers":       map[string]any{"gpu": map[string]any{"last_activity": "2026-11-29T15:00:00.000Z"}},
	}}}
	if diff := cmp.Diff(want, h.posts); diff != "" {
		t.Errorf("posts (-want +got):\n%s", diff)
	}
	bad, err := reclaim.NewHub(h.srv.URL, "wrong", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Activity(t.Context(), "ada", "", t0); err == nil {
		t.Error("a refused post is not an error")
	}
	for _, u := range []string{"", "hub:8081", "ftp://hub/"} {
		if _, err := reclaim.NewHub(u, "t", nil); err == nil {
			t.Errorf("NewHub(%q) accepted", u)
		}
	}
}

// TestCyclePostsActivityOnlyForGPUBusyServers: the hub hears about a
// server whose GPU is busy, and not about one that is busy only in the
// browser or idle (the hub sees that traffic itself).
func TestCyclePostsActivityOnlyForGPUBusyServers(t *testing.T) {
	f := newFixture(t)
	h := newHubServer(t)
	hub, err := reclaim.NewHub(h.srv.URL, "hub-secret", nil)
	if err != nil {
		t.Fatal(err)
	}
	f.rec = f.reclaimer(hub)
	busy := newNotebook(t, t0.Add(-time.Hour))
	browser := newNotebook(t, t0)
	f.server("gpu", "spawn-gpu", busy)
	f.server("browser", "spawn-browser", browser)
	f.sample("spawn-browser", 0)
	f.run(interval, "spawn-gpu", constSM(90))
	var paths []string
	for _, p := range h.posts {
		paths = append(paths, p.Path+" "+mapKeys(p.Body["servers"]))
	}
	if diff := cmp.Diff([]string{"/hub/api/users/ada/activity gpu"}, paths); diff != "" {
		t.Errorf("hub posts (-want +got):\n%s", diff)
	}
}

func mapKeys(v any) string {
	m, _ := v.(map[string]any)
	out := ""
	for k := range m {
		out += k
	}
	return out
}
