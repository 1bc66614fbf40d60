package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// fakeServers holds server records in memory.
type fakeServers struct {
	mu sync.Mutex
	m  map[fleet.ServerKey]fleet.Server
}

func (f *fakeServers) put(s fleet.Server) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[fleet.ServerKey]fleet.Server{}
	}
	f.m[s.ServerKey] = s
}

func (f *fakeServers) GetServer(_ context.Context, k fleet.ServerKey) (fleet.Server, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.m[k]
	if !ok {
		return fleet.Server{}, fleet.ErrNotFound
	}
	return s, nil
}

func (f *fakeServers) ListServers(_ context.Context, user string) ([]fleet.Server, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fleet.Server
	for _, s := range f.m {
		if user == "" || s.User == user {
			out = append(out, s)
		}
	}
	return out, nil
}

// fakePods finds pods of running servers by their slugs, like the
// spawner's cache.
type fakePods struct{ servers *fakeServers }

func (f fakePods) PodBySlugs(us, ss string) (spawner.ManagedPod, bool, error) {
	list, _ := f.servers.ListServers(context.Background(), "")
	for _, s := range list {
		if spawner.Slug(s.User) == us && spawner.Slug(s.Name) == ss && s.State == v1.StateRunning {
			return spawner.ManagedPod{User: s.User, Server: s.Name, SpawnID: s.SpawnID}, true, nil
		}
	}
	return spawner.ManagedPod{}, false, nil
}

// fakeTokens hands out one token per spawn and counts reads.
type fakeTokens struct {
	mu    sync.Mutex
	reads int
}

func tokenOf(spawnID string) string { return "nbtoken-" + spawnID + "-secret" }

func (f *fakeTokens) NotebookToken(_ context.Context, _, _, spawnID string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return tokenOf(spawnID), nil
}

// fakeAuth is the web sessions (by cookie value) and the bearer tokens.
type fakeAuth struct {
	mu       sync.Mutex
	sessions map[string]auth.Session
	bearers  map[string]auth.Principal
}

func (f *fakeAuth) addSession(cookie string, p auth.Principal) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sessions[cookie] = auth.Session{Principal: p, CSRF: "csrf", Expires: time.Now().Add(time.Hour)}
}

func (f *fakeAuth) endSession(cookie string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sessions, cookie)
}

func (f *fakeAuth) Session(_ context.Context, r *http.Request) (auth.Session, error) {
	c, err := r.Cookie(auth.SessionCookie)
	if err != nil {
		return auth.Session{}, auth.ErrNoCredentials
	}
	if c.Value == "redis-down" {
		return auth.Session{}, errors.New("auth: session storage: dial tcp 127.0.0.1:40817: connect: connection refused")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[c.Value]
	if !ok {
		return auth.Session{}, &auth.Error{Reason: "the session ended"}
	}
	return s, nil
}

func (f *fakeAuth) Authenticate(_ context.Context, r *http.Request) (auth.Principal, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return auth.Principal{}, auth.ErrNoCredentials
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.bearers[tok]
	if !ok {
		return auth.Principal{}, &auth.Error{Reason: "token signature is invalid"}
	}
	return p, nil
}

// fakeHandoffs keeps codes and host sessions in memory, and answers for
// the web sessions of fakeAuth by digest.
type fakeHandoffs struct {
	auth  *fakeAuth
	mu    sync.Mutex
	codes map[string][]byte
	hosts map[string][]byte
}

func (f *fakeHandoffs) PutHandoff(_ context.Context, code string, v []byte, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.codes[code] = v
	return nil
}

func (f *fakeHandoffs) TakeHandoff(_ context.Context, code string) ([]byte, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.codes[code]
	delete(f.codes, code)
	return v, ok, nil
}

func (f *fakeHandoffs) PutHostSession(_ context.Context, id string, v []byte, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hosts[id] = v
	return nil
}

func (f *fakeHandoffs) HostSession(_ context.Context, id string) ([]byte, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.hosts[id]
	return v, ok, nil
}

func (f *fakeHandoffs) WebSessionAlive(_ context.Context, digest string) (bool, error) {
	f.auth.mu.Lock()
	defer f.auth.mu.Unlock()
	for cookie := range f.auth.sessions {
		if sha256Hex(cookie) == digest {
			return true, nil
		}
	}
	return false, nil
}

// fakePages renders the pages the proxy asks for. Like the frontend's,
// the notebook page is for a signed-in viewer: given auth, it reads the
// web session from the request it gets and sends a browser without one to
// the sign-in, and it refuses a request that carries the notebook's token
// (which the pages must never see).
type fakePages struct{ auth *fakeAuth }

func (f fakePages) Notebook(w http.ResponseWriter, r *http.Request, status int, user, name, problem string) {
	if strings.HasPrefix(r.Header.Get("Authorization"), "token ") {
		http.Error(w, "the page got the notebook's token", http.StatusInternalServerError)
		return
	}
	if f.auth != nil {
		if _, err := f.auth.Session(r.Context(), r); err != nil {
			http.Redirect(w, r, auth.LoginPath+"?next="+r.URL.RequestURI(), http.StatusSeeOther)
			return
		}
	}
	w.Header().Set("Content-Type", "text/html")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<p>notebook page for %s/%s: %s</p>", user, name, problem)
}

func (fakePages) Error(w http.ResponseWriter, _ *http.Request, status int, msg string) {
	w.Header().Set("Content-Type", "text/html")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<p>error page: %s</p>", msg)
}

// fakeActivity records what the proxy flushes.
type fakeActivity struct {
	mu  sync.Mutex
	got map[string]fleet.ProxyActivity
}

func (f *fakeActivity) PutActivity(_ context.Context, spawnID, _ string, a fleet.ProxyActivity, _ time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got[spawnID] = a
	return nil
}

func (f *fakeActivity) get(spawnID string) (fleet.ProxyActivity, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.got[spawnID]
	return a, ok
}
